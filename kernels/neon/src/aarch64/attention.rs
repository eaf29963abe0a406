//! `neon_attention_f32_x4`: multi-head scaled-dot-product attention with the flash-style
//! online softmax of [`edge_kernels::attention`] (Milakov & Gimelshein 2018, FlashAttention),
//! its `q·k`, `exp` and `acc += w·v` loops in four f32 lanes.
//!
//! The structure is the generic kernel's: keys in tiles of 64, a task per 4 query rows (every
//! head of those rows), per row and tile the running maximum `m`, the correction `exp(m_old −
//! m_new)` (libm, as generic) applied to the accumulator and the running sum, then
//! `w_j = exp(s_j − m_new)`, `sum += w_j` in key order and `acc += w_j · v_j`; at the end
//! `out = acc / sum`. Nothing is allocated and the score matrix is never stored.
//!
//! Arithmetic per element, in an order fixed by the tile sizes alone (so the result does not
//! depend on the thread count):
//! - `q·k`: four lane accumulators `fma(q[4c + l], k[4c + l])` over the whole 4-element
//!   chunks of `head_dim` in increasing `c`, the lanes summed with `faddv` (`vaddvq_f32`), the
//!   `head_dim % 4` tail fused in one by one; computed in register tiles of up to 4 query rows
//!   × 4 keys, which does not change the order. Then `s = scale·(q·k)`, `+ bias`,
//!   `+ (1 − mask)·masked_value`, as generic.
//! - `exp(s − m)`: the range-reduced polynomial `exp4` of `elementwise.rs` (a few ulps), flushed
//!   to 0 below −87.3 (where the true value is under 2⁻¹²⁶, against a largest weight of 1), so
//!   keys with score `−∞` get weight 0 as with libm.
//! - `acc += w·v`: fused multiply-add per lane, keys in increasing order.
//!
//! The generic kernel sums `q·k` in eight unfused lanes, uses libm `exp` and unfused `acc +=
//! w·v`, so the two differ by f32 rounding: per output element by at most about
//! `2·max|v|·(Σ_j p_j·|Δs_j| + ε_exp + ε_acc)` with `p` the softmax, `Δs_j` the rounding of the
//! scores (`hd·u·scale·Σ|q·k|` plus an ulp of `|s_j|`), `ε_exp` a few ulps and `ε_acc` the
//! rounding of the `lk`-term weighted sums. `tests/attention.rs` checks that bound and the
//! plain `1e-5·max|v|` on rows that are not fully masked.

use std::arch::aarch64::{
    float32x4_t, vaddvq_f32, vbslq_f32, vcltq_f32, vdivq_f32, vdupq_n_f32, vfmaq_f32, vfmaq_n_f32,
    vld1q_f32, vmaxnmq_f32, vmaxnmvq_f32, vmulq_n_f32, vst1q_f32, vsubq_f32,
};

use edge_kernels::{AttentionParams, MAX_HEAD_DIM};
use rayon::prelude::*;

use super::elementwise::exp4;

/// Keys per tile of the online softmax (as generic).
const KEY_TILE: usize = 64;
/// Query rows per task (as generic).
const QUERY_TILE: usize = 4;
/// Keys per register tile of the score loop.
const KEY_REG: usize = 4;

/// `neon_attention_f32_x4`: the contract of [`edge_kernels::attention`]. For every head `h`
/// and query row `i`, `s_j = scale·(q·k_j) + bias[h, i, j] + (1 − key_mask[j])·masked_value`
/// and `out[i, h·head_dim ..][..head_dim] = Σ_j softmax(s)_j · v_j` (torch
/// `scaled_dot_product_attention` with an additive mask; T5Attention with its position bias).
///
/// Shapes: `key_mask` `[lk]`, `bias` `[heads, lq, lk]`, `out` `[lq, heads·head_dim]`;
/// `q_src`/`kv_src` as described by [`AttentionParams`]. Panics with the generic kernel's
/// messages on the same violated preconditions.
pub(super) fn attention(
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    let width = p.heads * hd;
    edge_kernels::contract::attention(p, q_src, kv_src, key_mask, bias, out);
    if p.lq == 0 || width == 0 {
        return;
    }
    out.par_chunks_mut(QUERY_TILE * width)
        .enumerate()
        .for_each(|(t, rows)| {
            let i0 = t * QUERY_TILE;
            for h in 0..p.heads {
                // SAFETY: NEON is part of the aarch64 baseline, so the target feature is
                // present.
                unsafe { attend_rows(p, q_src, kv_src, key_mask, bias, h, i0, rows) };
            }
        });
}

/// Four f32 at `s[i..i + 4]`.
///
/// # Safety
/// `i + 4 <= s.len()`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load4(s: &[f32], i: usize) -> float32x4_t {
    debug_assert!(i + 4 <= s.len());
    // SAFETY: the caller guarantees `i + 4 <= s.len()`; `ld1` reads unaligned.
    unsafe { vld1q_f32(s.as_ptr().add(i)) }
}

/// Stores four f32 at `s[i..i + 4]`.
///
/// # Safety
/// `i + 4 <= s.len()`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn store4(s: &mut [f32], i: usize, v: float32x4_t) {
    debug_assert!(i + 4 <= s.len());
    // SAFETY: the caller guarantees `i + 4 <= s.len()`; `st1` writes unaligned.
    unsafe { vst1q_f32(s.as_mut_ptr().add(i), v) }
}

/// `out[r][c] = qs[r] · ks[c]` over `hd` elements in the order of the module doc.
#[inline]
#[target_feature(enable = "neon")]
fn dots<const R: usize, const C: usize>(
    qs: &[&[f32]; R],
    ks: &[&[f32]; C],
    hd: usize,
) -> [[f32; C]; R] {
    for s in qs.iter().chain(ks) {
        assert!(s.len() >= hd);
    }
    let full = hd - hd % 4;
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[zero; C]; R];
    let mut base = 0;
    while base < full {
        let mut qv = [zero; R];
        let mut kv = [zero; C];
        for r in 0..R {
            // SAFETY: base + 4 <= full <= hd <= qs[r].len() (asserted above).
            qv[r] = unsafe { load4(qs[r], base) };
        }
        for c in 0..C {
            // SAFETY: base + 4 <= full <= hd <= ks[c].len() (asserted above).
            kv[c] = unsafe { load4(ks[c], base) };
        }
        for r in 0..R {
            for c in 0..C {
                acc[r][c] = vfmaq_f32(acc[r][c], qv[r], kv[c]);
            }
        }
        base += 4;
    }
    let mut out = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut s = vaddvq_f32(acc[r][c]);
            for t in full..hd {
                s = qs[r][t].mul_add(ks[c][t], s);
            }
            out[r][c] = s;
        }
    }
    out
}

/// `scores[r][jj] = q_r · k_{j0 + jj}` for the `R` query rows `qs` and the `nk` keys `ks`.
#[inline]
#[target_feature(enable = "neon")]
fn tile_dots<const R: usize>(
    qs: &[&[f32]; R],
    ks: &[&[f32]],
    hd: usize,
    scores: &mut [[f32; KEY_TILE]; QUERY_TILE],
) {
    let nk = ks.len();
    let full = nk - nk % KEY_REG;
    for c0 in (0..full).step_by(KEY_REG) {
        let kk: [&[f32]; KEY_REG] = std::array::from_fn(|c| ks[c0 + c]);
        let d = dots::<R, KEY_REG>(qs, &kk, hd);
        for r in 0..R {
            scores[r][c0..c0 + KEY_REG].copy_from_slice(&d[r]);
        }
    }
    for c in full..nk {
        let d = dots::<R, 1>(qs, &[ks[c]], hd);
        for r in 0..R {
            scores[r][c] = d[r][0];
        }
    }
}

/// Largest of `s` with `f32::max` semantics (NaN ignored; `−∞` for no elements).
#[target_feature(enable = "neon")]
fn max_of(s: &[f32]) -> f32 {
    let full = s.len() - s.len() % 4;
    let mut m = f32::NEG_INFINITY;
    if full > 0 {
        let mut mv = vdupq_n_f32(f32::NEG_INFINITY);
        for i in (0..full).step_by(4) {
            // SAFETY: i + 4 <= full <= s.len().
            mv = vmaxnmq_f32(mv, unsafe { load4(s, i) });
        }
        m = vmaxnmvq_f32(mv);
    }
    s[full..].iter().copied().fold(m, f32::max)
}

/// `exp(y)` per lane with `exp4`, 0 where `y < −87.3` (`exp4` clamps there).
#[inline]
#[target_feature(enable = "neon")]
fn exp4_flush(y: float32x4_t) -> float32x4_t {
    let under = vcltq_f32(y, vdupq_n_f32(-87.3));
    vbslq_f32(under, vdupq_n_f32(0.0), exp4(y))
}

/// `s[j] = exp(s[j] − max)` in place.
#[target_feature(enable = "neon")]
fn exp_shifted(s: &mut [f32], max: f32) {
    let mv = vdupq_n_f32(max);
    let full = s.len() - s.len() % 4;
    for i in (0..full).step_by(4) {
        // SAFETY: i + 4 <= full <= s.len().
        let y = vsubq_f32(unsafe { load4(s, i) }, mv);
        // SAFETY: as above.
        unsafe { store4(s, i, exp4_flush(y)) };
    }
    if full < s.len() {
        let n = s.len() - full;
        let mut buf = [0.0f32; 4];
        buf[..n].copy_from_slice(&s[full..]);
        // SAFETY: `buf` has 4 elements.
        let y = vsubq_f32(unsafe { load4(&buf, 0) }, mv);
        // SAFETY: as above.
        unsafe { store4(&mut buf, 0, exp4_flush(y)) };
        s[full..].copy_from_slice(&buf[..n]);
    }
}

/// `a *= c` element-wise.
#[target_feature(enable = "neon")]
fn scale_in_place(a: &mut [f32], c: f32) {
    let full = a.len() - a.len() % 4;
    for i in (0..full).step_by(4) {
        // SAFETY: i + 4 <= full <= a.len().
        let v = vmulq_n_f32(unsafe { load4(a, i) }, c);
        // SAFETY: as above.
        unsafe { store4(a, i, v) };
    }
    for x in &mut a[full..] {
        *x *= c;
    }
}

/// `a += Σ_jj w[jj] · vs[jj]`, keys in increasing `jj`, each step one fused multiply-add per
/// element; `a` is held in registers for 16 elements at a time.
#[target_feature(enable = "neon")]
fn accumulate(a: &mut [f32], w: &[f32], vs: &[&[f32]]) {
    let hd = a.len();
    for v in vs {
        assert!(v.len() >= hd);
    }
    let full16 = hd - hd % 16;
    let full4 = hd - hd % 4;
    for base in (0..full16).step_by(16) {
        // SAFETY: base + 16 <= full16 <= hd = a.len().
        let mut r: [float32x4_t; 4] = std::array::from_fn(|k| unsafe { load4(a, base + 4 * k) });
        for (&wj, v) in w.iter().zip(vs) {
            for k in 0..4 {
                // SAFETY: base + 4k + 4 <= full16 <= hd <= v.len() (asserted above).
                r[k] = vfmaq_n_f32(r[k], unsafe { load4(v, base + 4 * k) }, wj);
            }
        }
        for k in 0..4 {
            // SAFETY: as the load above.
            unsafe { store4(a, base + 4 * k, r[k]) };
        }
    }
    for base in (full16..full4).step_by(4) {
        // SAFETY: base + 4 <= full4 <= hd = a.len().
        let mut r = unsafe { load4(a, base) };
        for (&wj, v) in w.iter().zip(vs) {
            // SAFETY: base + 4 <= hd <= v.len().
            r = vfmaq_n_f32(r, unsafe { load4(v, base) }, wj);
        }
        // SAFETY: as the load above.
        unsafe { store4(a, base, r) };
    }
    for t in full4..hd {
        let mut x = a[t];
        for (&wj, v) in w.iter().zip(vs) {
            x = wj.mul_add(v[t], x);
        }
        a[t] = x;
    }
}

/// `a / d` element-wise into `dst`.
#[target_feature(enable = "neon")]
fn divide_into(dst: &mut [f32], a: &[f32], d: f32) {
    let n = dst.len();
    assert!(a.len() >= n);
    let dv = vdupq_n_f32(d);
    let full = n - n % 4;
    for i in (0..full).step_by(4) {
        // SAFETY: i + 4 <= full <= n <= a.len(), dst.len().
        let v = vdivq_f32(unsafe { load4(a, i) }, dv);
        // SAFETY: as above.
        unsafe { store4(dst, i, v) };
    }
    for i in full..n {
        dst[i] = a[i] / d;
    }
}

/// Computes head `h` of the query rows `i0 .. i0 + rows.len() / width` into `rows`.
#[target_feature(enable = "neon")]
fn attend_rows(
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    h: usize,
    i0: usize,
    rows: &mut [f32],
) {
    let hd = p.head_dim;
    let width = p.heads * hd;
    let nq = rows.len() / width;
    let mut acc = [[0.0f32; MAX_HEAD_DIM]; QUERY_TILE];
    let mut run_max = [f32::NEG_INFINITY; QUERY_TILE];
    let mut run_sum = [0.0f32; QUERY_TILE];
    let mut scores = [[0.0f32; KEY_TILE]; QUERY_TILE];
    let q_at = |i: usize| &q_src[i * p.q_stride + p.q_offset + h * hd..][..hd];
    let k_at = |j: usize| &kv_src[j * p.kv_stride + p.k_offset + h * hd..][..hd];
    let v_at = |j: usize| &kv_src[j * p.kv_stride + p.v_offset + h * hd..][..hd];
    let qs: [&[f32]; QUERY_TILE] = std::array::from_fn(|r| q_at(i0 + r.min(nq - 1)));
    let mut ks: [&[f32]; KEY_TILE] = [&[]; KEY_TILE];
    let mut vs: [&[f32]; KEY_TILE] = [&[]; KEY_TILE];

    for j0 in (0..p.lk).step_by(KEY_TILE) {
        let nk = KEY_TILE.min(p.lk - j0);
        for jj in 0..nk {
            ks[jj] = k_at(j0 + jj);
            vs[jj] = v_at(j0 + jj);
        }
        match nq {
            1 => tile_dots::<1>(&[qs[0]], &ks[..nk], hd, &mut scores),
            2 => tile_dots::<2>(&[qs[0], qs[1]], &ks[..nk], hd, &mut scores),
            3 => tile_dots::<3>(&[qs[0], qs[1], qs[2]], &ks[..nk], hd, &mut scores),
            _ => tile_dots::<4>(&qs, &ks[..nk], hd, &mut scores),
        }
        for r in 0..nq {
            let i = i0 + r;
            let s = &mut scores[r][..nk];
            for (jj, sj) in s.iter_mut().enumerate() {
                let j = j0 + jj;
                let mut v = p.scale * *sj;
                if let Some(b) = bias {
                    v += b[(h * p.lq + i) * p.lk + j];
                }
                if let Some(m) = key_mask {
                    v += (1.0 - m[j]) * p.masked_value;
                }
                *sj = v;
            }
            let new_max = run_max[r].max(max_of(s));
            let correction = (run_max[r] - new_max).exp();
            let a = &mut acc[r][..hd];
            if correction != 1.0 {
                scale_in_place(a, correction);
            }
            exp_shifted(s, new_max);
            let mut sum = run_sum[r] * correction;
            for &w in s.iter() {
                sum += w;
            }
            accumulate(a, s, &vs[..nk]);
            run_sum[r] = sum;
            run_max[r] = new_max;
        }
    }
    for r in 0..nq {
        divide_into(
            &mut rows[r * width + h * hd..][..hd],
            &acc[r][..hd],
            run_sum[r],
        );
    }
}
