//! `neon_layer_norm_f64x2`, `neon_rms_norm_f64x2`, `neon_group_norm_stats_f64x2` and
//! `neon_group_norm_apply_f64x2`: the norms with NEON
//! f64 statistics.
//!
//! As the generic kernels (`edge_kernels::{layer_norm, rms_norm}`: torch `nn.LayerNorm`,
//! transformers `T5LayerNorm`), the statistics are computed in f64: the f32 inputs are widened
//! (`fcvtl`/`fcvtl2`) and summed in four f64 lanes (two `float64x2_t` accumulators, combined in
//! a fixed order, then the `d % 4` tail in order; squares unfused): the order of the generic
//! [`edge_kernels::lane_sum`], so statistics and outputs are bit-identical. LayerNorm normalizes
//! in f64 and rounds once; RMSNorm computes `weight · (x · r)` in f32 as torch does. Every row
//! is computed by one task in a fixed order: results do not depend on the thread count.
//!
//! GroupNorm (torch `nn.GroupNorm`, generic twin `edge_kernels::group_norm`): each group's
//! `c/groups · hw` values are contiguous; its mean and biased variance are two-pass f64 sums in
//! the same four lanes (one task per group, fixed order), and each output is
//! `((x − mean) · rstd) · weight + bias` in f64 in the generic kernel's operation order, rounded
//! once: bit-identical to the generic kernel. The normalization (`group_norm_apply`) is parallel
//! over channels.

use std::arch::aarch64::{
    float64x2_t, vaddq_f64, vaddvq_f64, vcvt_f32_f64, vcvt_f64_f32, vcvt_high_f32_f64,
    vcvt_high_f64_f32, vdupq_n_f32, vdupq_n_f64, vget_low_f32, vld1q_f32, vmulq_f32, vmulq_f64,
    vst1q_f32, vsubq_f64,
};

use rayon::prelude::*;

/// Rows per task (as the generic kernels).
const ROWS_PER_TASK: usize = 16;
/// Elements per GroupNorm normalization task, at least.
const GROUP_NORM_TASK: usize = 4096;

/// Four f32 values at the start of `c` (exactly 4 long) widened to two f64 pairs.
#[inline]
#[target_feature(enable = "neon")]
fn widen(c: &[f32]) -> (float64x2_t, float64x2_t) {
    assert_eq!(c.len(), 4);
    // SAFETY: `c` holds 4 f32 values (asserted).
    let v = unsafe { vld1q_f32(c.as_ptr()) };
    (vcvt_f64_f32(vget_low_f32(v)), vcvt_high_f64_f32(v))
}

/// `Σ (x[i] − shift)^p` in f64 for `p` = 1 (`SQUARE` false) or 2, four lanes then the tail.
#[target_feature(enable = "neon")]
fn lane_sum<const SQUARE: bool>(x: &[f32], shift: f64) -> f64 {
    let (mut a0, mut a1) = (vdupq_n_f64(0.0), vdupq_n_f64(0.0));
    let s = vdupq_n_f64(shift);
    let mut chunks = x.chunks_exact(4);
    for c in &mut chunks {
        let (lo, hi) = widen(c);
        let (lo, hi) = (vsubq_f64(lo, s), vsubq_f64(hi, s));
        if SQUARE {
            a0 = vaddq_f64(a0, vmulq_f64(lo, lo));
            a1 = vaddq_f64(a1, vmulq_f64(hi, hi));
        } else {
            a0 = vaddq_f64(a0, lo);
            a1 = vaddq_f64(a1, hi);
        }
    }
    let mut sum = vaddvq_f64(vaddq_f64(a0, a1));
    for &v in chunks.remainder() {
        let t = f64::from(v) - shift;
        sum += if SQUARE { t * t } else { t };
    }
    sum
}

/// One LayerNorm row: `out = (x − mean) · rstd · weight + bias` in f64, rounded once.
#[target_feature(enable = "neon")]
fn layer_norm_row(
    x: &[f32],
    eps: f32,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let d = x.len();
    let n = d as f64;
    let mean = lane_sum::<false>(x, 0.0) / n;
    let var = lane_sum::<true>(x, mean) / n;
    let rstd = 1.0 / (var + f64::from(eps)).sqrt();
    let (vm, vr) = (vdupq_n_f64(mean), vdupq_n_f64(rstd));
    let full = d - d % 4;
    for j in (0..full).step_by(4) {
        let (lo, hi) = widen(&x[j..j + 4]);
        let mut lo = vmulq_f64(vsubq_f64(lo, vm), vr);
        let mut hi = vmulq_f64(vsubq_f64(hi, vm), vr);
        if let Some(w) = weight {
            let (wl, wh) = widen(&w[j..j + 4]);
            lo = vmulq_f64(lo, wl);
            hi = vmulq_f64(hi, wh);
        }
        if let Some(b) = bias {
            let (bl, bh) = widen(&b[j..j + 4]);
            lo = vaddq_f64(lo, bl);
            hi = vaddq_f64(hi, bh);
        }
        let o = &mut out[j..j + 4];
        // SAFETY: `o` holds 4 f32 values.
        unsafe { vst1q_f32(o.as_mut_ptr(), vcvt_high_f32_f64(vcvt_f32_f64(lo), hi)) };
    }
    for j in full..d {
        out[j] = edge_kernels::layer_norm_value(
            x[j],
            mean,
            rstd,
            weight.map(|w| w[j]),
            bias.map(|b| b[j]),
        );
    }
}

/// One RMSNorm row: `r = 1/sqrt(f32(Σx²/d) + eps)`, `out = weight · (x · r)` in f32.
#[target_feature(enable = "neon")]
fn rms_norm_row(x: &[f32], eps: f32, weight: &[f32], out: &mut [f32]) {
    let d = x.len();
    let var = (lane_sum::<true>(x, 0.0) / d as f64) as f32;
    let r = 1.0 / (var + eps).sqrt();
    let vr = vdupq_n_f32(r);
    let full = d - d % 4;
    for j in (0..full).step_by(4) {
        let (xs, ws, o) = (&x[j..j + 4], &weight[j..j + 4], &mut out[j..j + 4]);
        // SAFETY: `xs`, `ws` and `o` hold 4 f32 values each.
        unsafe {
            let v = vmulq_f32(
                vld1q_f32(ws.as_ptr()),
                vmulq_f32(vld1q_f32(xs.as_ptr()), vr),
            );
            vst1q_f32(o.as_mut_ptr(), v);
        }
    }
    for j in full..d {
        out[j] = weight[j] * (x[j] * r);
    }
}

/// `neon_layer_norm_f64x2`: the contract of [`edge_kernels::layer_norm`] (torch
/// `nn.LayerNorm` over the last axis of `x` `[m, d]`; `weight`, `bias` `[d]` or absent).
pub(super) fn layer_norm(
    x: &[f32],
    m: usize,
    d: usize,
    eps: f32,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    edge_kernels::contract::layer_norm(x, m, d, weight, bias, out);
    if m * d == 0 {
        return;
    }
    out.par_chunks_mut(ROWS_PER_TASK * d)
        .zip(x.par_chunks(ROWS_PER_TASK * d))
        .for_each(|(ob, xb)| {
            for (o, xr) in ob.chunks_mut(d).zip(xb.chunks(d)) {
                // SAFETY: NEON is part of the aarch64 baseline.
                unsafe { layer_norm_row(xr, eps, weight, bias, o) };
            }
        });
}

/// `neon_rms_norm_f64x2`: the contract of [`edge_kernels::rms_norm`] (transformers
/// `T5LayerNorm` over the last axis of `x` `[m, d]`; `weight` `[d]`).
pub(super) fn rms_norm(x: &[f32], m: usize, d: usize, eps: f32, weight: &[f32], out: &mut [f32]) {
    edge_kernels::contract::rms_norm(x, m, d, weight, out);
    if m * d == 0 {
        return;
    }
    out.par_chunks_mut(ROWS_PER_TASK * d)
        .zip(x.par_chunks(ROWS_PER_TASK * d))
        .for_each(|(ob, xb)| {
            for (o, xr) in ob.chunks_mut(d).zip(xb.chunks(d)) {
                // SAFETY: NEON is part of the aarch64 baseline.
                unsafe { rms_norm_row(xr, eps, weight, o) };
            }
        });
}

/// One GroupNorm channel row: `out = ((x − mean) · rstd) · weight + bias` in f64, rounded once
/// (the generic kernel's operation order, unfused).
#[target_feature(enable = "neon")]
fn group_norm_row(x: &[f32], mean: f64, rstd: f64, weight: f32, bias: f32, out: &mut [f32]) {
    let hw = x.len();
    let (wc, bc) = (f64::from(weight), f64::from(bias));
    let (vm, vr) = (vdupq_n_f64(mean), vdupq_n_f64(rstd));
    let (vw, vb) = (vdupq_n_f64(wc), vdupq_n_f64(bc));
    let full = hw - hw % 4;
    for j in (0..full).step_by(4) {
        let (lo, hi) = widen(&x[j..j + 4]);
        let lo = vaddq_f64(vmulq_f64(vmulq_f64(vsubq_f64(lo, vm), vr), vw), vb);
        let hi = vaddq_f64(vmulq_f64(vmulq_f64(vsubq_f64(hi, vm), vr), vw), vb);
        let o = &mut out[j..j + 4];
        // SAFETY: `o` holds 4 f32 values.
        unsafe { vst1q_f32(o.as_mut_ptr(), vcvt_high_f32_f64(vcvt_f32_f64(lo), hi)) };
    }
    for j in full..hw {
        out[j] = ((f64::from(x[j]) - mean) * rstd * wc + bc) as f32;
    }
}

/// `neon_group_norm_stats_f64x2`: the contract of [`edge_kernels::group_norm_stats`] (`x`
/// `[c, hw]`, `stats` `[groups]`): each group's mean and biased variance as two-pass f64 sums
/// in four lanes, one task per group.
pub(super) fn group_norm_stats(
    x: &[f32],
    c: usize,
    hw: usize,
    groups: usize,
    eps: f32,
    stats: &mut [edge_kernels::GroupStats],
) {
    edge_kernels::contract::group_norm_stats(x, c, hw, groups, stats);
    let cg = c / groups;
    if cg * hw == 0 {
        return;
    }
    stats
        .par_iter_mut()
        .zip(x.par_chunks(cg * hw))
        .for_each(|(s, xg)| {
            let n = xg.len() as f64;
            // SAFETY: NEON is part of the aarch64 baseline.
            let mean = unsafe { lane_sum::<false>(xg, 0.0) } / n;
            // SAFETY: as above.
            let var = unsafe { lane_sum::<true>(xg, mean) } / n;
            *s = edge_kernels::GroupStats {
                mean,
                rstd: 1.0 / (var + f64::from(eps)).sqrt(),
            };
        });
}

/// `neon_group_norm_apply_f64x2`: the contract of [`edge_kernels::group_norm_apply`] (`x`,
/// `out` `[c, hw]`; `stats` `[groups]`; `weight`, `bias` `[c]`), bit-identical to it: each
/// output is `((x − mean) · rstd) · weight + bias` in f64, rounded once. Parallel over channels.
#[allow(clippy::too_many_arguments)]
pub(super) fn group_norm_apply(
    x: &[f32],
    c: usize,
    hw: usize,
    groups: usize,
    stats: &[edge_kernels::GroupStats],
    weight: &[f32],
    bias: &[f32],
    out: &mut [f32],
) {
    edge_kernels::contract::group_norm(x, c, hw, groups, weight, bias, out);
    edge_kernels::contract::group_norm_stats(x, c, hw, groups, stats);
    let cg = c / groups;
    if cg * hw == 0 {
        return;
    }
    out.par_chunks_mut(hw)
        .zip(x.par_chunks(hw))
        .with_min_len(GROUP_NORM_TASK.div_ceil(hw))
        .enumerate()
        .for_each(|(ch, (orow, xrow))| {
            let s = stats[ch / cg];
            // SAFETY: NEON is part of the aarch64 baseline.
            unsafe { group_norm_row(xrow, s.mean, s.rstd, weight[ch], bias[ch], orow) };
        });
}
