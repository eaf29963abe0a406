//! f32 register tiles of the shared GEMM driver ([`edge_kernels::F32Tile`]): eight unfused
//! lanes per output element, exactly the generic order.
//!
//! `vmulps` then `vaddps` per lane (never `vfmadd`), so each lane computes
//! `acc[l] = acc[l] + x[8i + l] · w[8i + l]` with the product rounded, as the generic tile does.
//! The lanes are reduced as `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))` with in-register
//! shuffles (each addition keeps the generic operand order), and the `k mod 8` tail is added
//! one product at a time, in scalar code shared by both tiles.

use std::arch::x86_64::*;

use edge_kernels::F32Tile;

/// AVX2: 4 rows × 3 columns of ymm accumulators (12 of the 16 registers).
pub(crate) const AVX2: F32Tile = F32Tile {
    name: "avx2_f32_4x3",
    rows: 4,
    cols: 3,
    run: avx2_tile,
};

/// AVX-512: 6 rows × 8 columns, two columns per zmm accumulator (low half column `2p`, high half
/// column `2p + 1`): 24 accumulators, the `x` chunk broadcast to both halves.
pub(crate) const AVX512: F32Tile = F32Tile {
    name: "avx512_f32_6x8",
    rows: 6,
    cols: 8,
    run: avx512_tile,
};

/// `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))` of the 8 lanes, each sum with its
/// operands in that order (lane 0 of each step adds the lane to its right).
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8_avx2(v: __m256) -> f32 {
    let t1 = _mm256_add_ps(v, _mm256_permute_ps::<0b10_11_00_01>(v));
    let t2 = _mm256_add_ps(t1, _mm256_permute_ps::<0b01_00_11_10>(t1));
    let t3 = _mm256_add_ps(t2, _mm256_permute2f128_ps::<0x01>(t2, t2));
    _mm256_cvtss_f32(t3)
}

/// The same reduction for each 256-bit half of `v`: the result is in lanes 0 and 8.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce8x2_avx512(v: __m512) -> __m512 {
    let t1 = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
    let t2 = _mm512_add_ps(t1, _mm512_permute_ps::<0b01_00_11_10>(t1));
    _mm512_add_ps(t2, _mm512_shuffle_f32x4::<0b10_11_00_01>(t2, t2))
}

/// The scalar tail after the lane reduction: `s + Σ_{t ≥ full} x[t]·w[t]`, in increasing `t`.
#[inline(always)]
fn tail(mut s: f32, x: &[f32], w: &[f32], full: usize, k: usize) -> f32 {
    for t in full..k {
        s += x[t] * w[t];
    }
    s
}

fn avx2_tile(xs: &[&[f32]], ws: &[&[f32]], k: usize, out: &mut [f32]) {
    assert!(ws.len() == 3 && (xs.len() == 4 || xs.len() == 1) && out.len() >= xs.len() * 3);
    assert!(xs.iter().chain(ws).all(|s| s.len() >= k));
    // SAFETY: AVX2 is the only feature these functions enable; this tile is put in a kernel
    // table only by `crate::x86_64` after `edge_kernels::cpu::features()` reported AVX2. Every
    // slice holds at least `k` elements (asserted above) and the loads stay below `k`.
    unsafe {
        if xs.len() == 4 {
            avx2_rc::<4>(xs, ws, k, out)
        } else {
            avx2_rc::<1>(xs, ws, k, out)
        }
    }
}

#[target_feature(enable = "avx2")]
pub(crate) unsafe fn avx2_rc<const R: usize>(
    xs: &[&[f32]],
    ws: &[&[f32]],
    k: usize,
    out: &mut [f32],
) {
    const C: usize = 3;
    let full = k - k % 8;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let xp: [*const f32; R] = std::array::from_fn(|r| xs[r].as_ptr());
    let wp: [*const f32; C] = std::array::from_fn(|c| ws[c].as_ptr());
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full <= k` and every row holds at least `k` elements.
        unsafe {
            let mut wv = [_mm256_setzero_ps(); C];
            for c in 0..C {
                wv[c] = _mm256_loadu_ps(wp[c].add(i));
            }
            for r in 0..R {
                let xv = _mm256_loadu_ps(xp[r].add(i));
                for c in 0..C {
                    acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(xv, wv[c]));
                }
            }
        }
        i += 8;
    }
    for r in 0..R {
        for c in 0..C {
            out[r * C + c] = tail(reduce8_avx2(acc[r][c]), xs[r], ws[c], full, k);
        }
    }
}

fn avx512_tile(xs: &[&[f32]], ws: &[&[f32]], k: usize, out: &mut [f32]) {
    assert!(ws.len() == 8 && (xs.len() == 6 || xs.len() == 1) && out.len() >= xs.len() * 8);
    assert!(xs.iter().chain(ws).all(|s| s.len() >= k));
    // SAFETY: AVX-512F is the only feature these functions enable; this tile is put in a kernel
    // table only by `crate::x86_64` after `edge_kernels::cpu::features()` reported AVX-512F.
    // Every slice holds at least `k` elements (asserted above) and the loads stay below `k`.
    unsafe {
        if xs.len() == 6 {
            avx512_rc::<6>(xs, ws, k, out)
        } else {
            avx512_rc::<1>(xs, ws, k, out)
        }
    }
}

#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn avx512_rc<const R: usize>(
    xs: &[&[f32]],
    ws: &[&[f32]],
    k: usize,
    out: &mut [f32],
) {
    const P: usize = 4;
    let full = k - k % 8;
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    let xp: [*const f32; R] = std::array::from_fn(|r| xs[r].as_ptr());
    let wp: [*const f32; 2 * P] = std::array::from_fn(|c| ws[c].as_ptr());
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full <= k` and every row holds at least `k` elements.
        unsafe {
            let mut wv = [_mm512_setzero_ps(); P];
            for p in 0..P {
                let lo = _mm256_castps_pd(_mm256_loadu_ps(wp[2 * p].add(i)));
                let hi = _mm256_castps_pd(_mm256_loadu_ps(wp[2 * p + 1].add(i)));
                wv[p] = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(lo), hi));
            }
            for r in 0..R {
                let x8 = _mm256_castps_pd(_mm256_loadu_ps(xp[r].add(i)));
                let xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(x8));
                for p in 0..P {
                    acc[r][p] = _mm512_add_ps(acc[r][p], _mm512_mul_ps(xv, wv[p]));
                }
            }
        }
        i += 8;
    }
    let mut lanes = [0f32; 16];
    for r in 0..R {
        for p in 0..P {
            // SAFETY: `lanes` holds 16 f32.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), reduce8x2_avx512(acc[r][p])) };
            for h in 0..2 {
                let c = 2 * p + h;
                out[r * 2 * P + c] = tail(lanes[8 * h], xs[r], ws[c], full, k);
            }
        }
    }
}
