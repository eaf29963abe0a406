//! Peak-throughput microbenchmarks of this core, for `edgerun bench`'s "share of peak": long
//! chains of independent register operations with no memory traffic.

use std::arch::x86_64::*;
use std::time::Instant;

use edge_kernels::cpu::Features;

use crate::Peak;

/// [`crate::peak`] on x86-64.
pub(crate) fn measure(features: &Features, iters: usize) -> Peak {
    let mut p = Peak::default();
    if features.avx2 && features.fma && !features.avx512f {
        // SAFETY: AVX2 and FMA were detected.
        unsafe {
            p.f32_ops = Some(f32_chain_avx2::<false>(iters));
            p.f32_fma_ops = Some(f32_chain_avx2::<true>(iters));
            p.int8_ops = Some(int8_dot_avx2(iters));
        }
        return p;
    }
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
    } else if features.avx2 {
        // SAFETY: AVX2 was detected (the `avx512` table's quantized tile is the AVX2 one).
        p.int8_ops = Some(unsafe { int8_dot_avx2(iters) });
    }
    if features.avx512f && features.avx512bf16 {
        // SAFETY: AVX-512F and AVX512_BF16 were detected.
        p.bf16_ops = Some(unsafe { bf16_dot(iters) });
    }
    if features.amxint8 && super::amx_granted() {
        // SAFETY: AMX-TILE and AMX-INT8 were detected and Linux granted the tile data.
        p.amx_int8_ops = Some(unsafe { amx_int8_dot(iters) });
    }
    p
}

/// AMX `tdpbssd` on full tiles (16 × 64 bytes): int8 multiply-adds ×2 per second on this
/// thread, four independent accumulator tiles (16·16·64 multiply-adds per instruction).
///
/// # Safety
/// AMX-TILE and AMX-INT8 present and the tile data granted to this process.
unsafe fn amx_int8_dot(iters: usize) -> f64 {
    #[repr(C, align(64))]
    struct Config([u8; 64]);
    let mut cfg = Config([0; 64]);
    cfg.0[0] = 1;
    for t in 0..8 {
        cfg.0[16 + 2 * t] = 64;
        cfg.0[48 + t] = 16;
    }
    let loops = (iters / 32).max(1);
    // SAFETY: a valid palette-1 configuration (8 tiles of 16 rows × 64 bytes); the tile
    // instructions touch no memory besides the configuration.
    let s = unsafe {
        std::arch::asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            options(nostack, nomem),
        );
        let t = Instant::now();
        for _ in 0..loops {
            std::arch::asm!(
                "tdpbssd tmm0, tmm4, tmm6",
                "tdpbssd tmm1, tmm4, tmm7",
                "tdpbssd tmm2, tmm5, tmm6",
                "tdpbssd tmm3, tmm5, tmm7",
                options(nostack, nomem),
            );
        }
        let s = t.elapsed().as_secs_f64();
        std::arch::asm!("tilerelease", options(nostack, nomem));
        s
    };
    (loops * 4 * 16 * 16 * 64 * 2) as f64 / s
}

/// `vdpbf16ps` on zmm: bf16 multiply-adds ×2 per second on this thread (32 per instruction).
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_dot(iters: usize) -> f64 {
    // SAFETY: 64 bytes of lanes either way; 0x3f80 pairs are bf16 ones.
    let x = unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3f80_3f80)) };
    let mut acc = [_mm512_setzero_ps(); ACC];
    let t = Instant::now();
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_dpbf16_ps(*a, x, x);
        }
    }
    let s = t.elapsed().as_secs_f64();
    let mut total = _mm512_setzero_ps();
    for a in acc {
        total = _mm512_add_ps(total, a);
    }
    std::hint::black_box(_mm512_reduce_add_ps(total));
    (iters * ACC * 32 * 2) as f64 / s
}

/// Independent accumulators per chain (enough to cover the add and dot latencies).
const ACC: usize = 12;

/// f32 operations per second on this thread (2 per lane and iteration) of `a = a·x + x` on zmm:
/// unfused `vmulps` + `vaddps` (the element-wise kernels' arithmetic) or, with `FUSED`,
/// `vfmadd` (the matmul, convolution and attention kernels': the generic order fuses their
/// multiply-adds).
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

/// [`f32_chain`] on ymm (AVX2 CPUs without AVX-512).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_chain_avx2<const FUSED: bool>(iters: usize) -> f64 {
    let x = _mm256_set1_ps(1.000_000_1);
    let mut acc = [_mm256_set1_ps(0.5); ACC];
    let t = Instant::now();
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = if FUSED {
                _mm256_fmadd_ps(*a, x, x)
            } else {
                _mm256_add_ps(_mm256_mul_ps(*a, x), x)
            };
        }
    }
    let s = t.elapsed().as_secs_f64();
    let mut total = [0f32; 8];
    let mut sum = _mm256_setzero_ps();
    for a in acc {
        sum = _mm256_add_ps(sum, a);
    }
    // SAFETY: `total` holds 8 f32.
    unsafe { _mm256_storeu_ps(total.as_mut_ptr(), sum) };
    std::hint::black_box(total);
    (iters * ACC * 8 * 2) as f64 / s
}

/// The AVX2 int8 dot of the quantized tile (`qgemm_avx2`): `vpmaddubsw` (32 u8 × i8 products
/// added in pairs), `vpmaddwd` with ones, `vpaddd` into i32 sums — int8 multiply-adds ×2 per
/// second on this thread (the tile's `vpsignb` and `vpabsb` come on top). Each chain's sum is
/// its next signed operand, so nothing is hoisted out of the loop.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn int8_dot_avx2(iters: usize) -> f64 {
    let a = std::hint::black_box(_mm256_set1_epi8(3));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); ACC];
    for (i, c) in acc.iter_mut().enumerate() {
        *c = _mm256_set1_epi8(i as i8 - 6);
    }
    let t = Instant::now();
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm256_add_epi32(*c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, *c), ones));
        }
    }
    let s = t.elapsed().as_secs_f64();
    let mut total = _mm256_setzero_si256();
    for c in acc {
        total = _mm256_add_epi32(total, c);
    }
    let mut out = [0i32; 8];
    // SAFETY: `out` holds 8 i32.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, total) };
    std::hint::black_box(out);
    (iters * ACC * 32 * 2) as f64 / s
}
