//! Peak-throughput microbenchmarks of this core, for `edgerun bench`'s "share of peak": long
//! chains of independent register operations with no memory traffic.

use std::arch::x86_64::*;
use std::time::Instant;

use edge_kernels::cpu::Features;

use crate::Peak;

/// [`crate::peak`] on x86-64.
pub(crate) fn measure(features: &Features, iters: usize) -> Peak {
    let mut p = Peak::default();
    if features.avx512f {
        // SAFETY: AVX-512F was detected.
        p.f32_ops = Some(unsafe { f32_chain::<false>(iters) });
    }
    if features.avx512f && features.fma {
        // SAFETY: AVX-512F (whose `vfmadd` forms are part of the foundation) was detected.
        p.f32_fma_ops = Some(unsafe { f32_chain::<true>(iters) });
    }
    if features.avx512f && features.avx512vnni {
        // SAFETY: AVX-512F and VNNI were detected.
        p.int8_ops = Some(unsafe { int8_dot(iters) });
    }
    p
}

/// Independent accumulators per chain (enough to cover the add and dot latencies).
const ACC: usize = 12;

/// f32 operations per second on this thread (2 per lane and iteration) of `a = a·x + x` on zmm:
/// unfused `vmulps` + `vaddps` (the kernels' arithmetic) or, with `FUSED`, `vfmadd` (what the
/// kernels do not use: the generic order rounds products).
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn f32_chain<const FUSED: bool>(iters: usize) -> f64 {
    let x = _mm512_set1_ps(1.000_000_1);
    let mut acc = [_mm512_set1_ps(0.5); ACC];
    let t = Instant::now();
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = if FUSED {
                _mm512_fmadd_ps(*a, x, x)
            } else {
                _mm512_add_ps(_mm512_mul_ps(*a, x), x)
            };
        }
    }
    let s = t.elapsed().as_secs_f64();
    let mut total = _mm512_setzero_ps();
    for a in acc {
        total = _mm512_add_ps(total, a);
    }
    std::hint::black_box(_mm512_reduce_add_ps(total));
    (iters * ACC * 16 * 2) as f64 / s
}

/// `vpdpbusd` on zmm: int8 multiply-adds ×2 per second on this thread.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_dot(iters: usize) -> f64 {
    let a = _mm512_set1_epi8(3);
    let b = _mm512_set1_epi8(-2);
    let mut acc = [_mm512_setzero_si512(); ACC];
    let t = Instant::now();
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm512_dpbusd_epi32(*c, a, b);
        }
    }
    let s = t.elapsed().as_secs_f64();
    let mut total = _mm512_setzero_si512();
    for c in acc {
        total = _mm512_add_epi32(total, c);
    }
    std::hint::black_box(_mm512_reduce_add_epi32(total));
    (iters * ACC * 64 * 2) as f64 / s
}
