//! Normalizations: `generic_group_norm_f32`, `generic_layer_norm_f32`, `generic_rms_norm_f32`.
//!
//! Statistics are computed in f64 with two passes (mean, then the mean of squared deviations),
//! which is at least as accurate as torch's f32 Welford and independent of any work split. Every
//! sum has the fixed order of [`lane_sum`] (four f64 lanes, then the tail), which the SIMD twins
//! (NEON's two `float64x2_t` accumulators) reproduce bit for bit.

use rayon::prelude::*;

/// Rows per task for the row-wise norms.
const ROWS_PER_TASK: usize = 16;

/// `Σ tᵢ` (or `Σ tᵢ·tᵢ` with `square`) for `tᵢ = f64(x[i]) − shift`, in the one order of the
/// norms' statistics: four f64 lanes `a[l]` take `i ≡ l (mod 4)` over the whole 4-element chunks
/// in increasing `i` (`a[l] = a[l] + t` or `a[l] + t·t`, unfused), combined as
/// `(a[0] + a[2]) + (a[1] + a[3])`, then the `len mod 4` tail added one term at a time.
#[inline]
pub fn lane_sum(x: &[f32], shift: f64, square: bool) -> f64 {
    let term = |v: f32| {
        let t = f64::from(v) - shift;
        if square {
            t * t
        } else {
            t
        }
    };
    let mut a = [0f64; 4];
    let mut chunks = x.chunks_exact(4);
    for c in &mut chunks {
        for l in 0..4 {
            a[l] += term(c[l]);
        }
    }
    let mut sum = (a[0] + a[2]) + (a[1] + a[3]);
    for &v in chunks.remainder() {
        sum += term(v);
    }
    sum
}

/// One LayerNorm output from its row's statistics: `((v − mean) · rstd) · weight + bias` in f64
/// (an absent weight or bias skipped), rounded once to f32: the step every twin's tail shares.
#[inline]
pub fn layer_norm_value(
    v: f32,
    mean: f64,
    rstd: f64,
    weight: Option<f32>,
    bias: Option<f32>,
) -> f32 {
    let mut y = (f64::from(v) - mean) * rstd;
    if let Some(w) = weight {
        y *= f64::from(w);
    }
    if let Some(b) = bias {
        y += f64::from(b);
    }
    y as f32
}

/// Mean and biased variance of `x` in f64, two passes of [`lane_sum`].
fn moments(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = lane_sum(x, 0.0, false) / n;
    let var = lane_sum(x, mean, true) / n;
    (mean, var)
}

/// Mean and reciprocal standard deviation of one GroupNorm group, in f64 (`rstd =
/// 1 / sqrt(var + eps)` with the biased variance).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupStats {
    /// Mean of the group's values.
    pub mean: f64,
    /// `1 / sqrt(var + eps)`.
    pub rstd: f64,
}

/// `generic_group_norm_stats_f64`: the statistics half of torch `nn.GroupNorm(groups, c, eps)`.
///
/// Shapes: `x` `[c, hw]`, `stats` `[groups]`; channels `g·c/groups .. (g+1)·c/groups` form group
/// `g`, whose `c/groups · hw` values are contiguous. Each group's mean and biased variance are
/// two-pass sequential f64 sums (one task per group, so independent of the thread count).
/// Panics if `groups` does not divide `c` or a length does not match.
pub fn group_norm_stats(
    x: &[f32],
    c: usize,
    hw: usize,
    groups: usize,
    eps: f32,
    stats: &mut [GroupStats],
) {
    crate::contract::group_norm_stats(x, c, hw, groups, stats);
    let cg = c / groups;
    if cg * hw == 0 {
        return;
    }
    stats
        .par_iter_mut()
        .zip(x.par_chunks(cg * hw))
        .for_each(|(s, xg)| {
            let (mean, var) = moments(xg);
            *s = GroupStats {
                mean,
                rstd: 1.0 / (var + f64::from(eps)).sqrt(),
            };
        });
}

/// `generic_group_norm_apply_f32`: the normalization half of torch `nn.GroupNorm` with given
/// statistics: `out = ((x − mean_g) · rstd_g) · weight[ch] + bias[ch]` in f64 in that order,
/// rounded once to f32.
///
/// Shapes: `x`, `out` `[c, hw]`; `stats` `[groups]`; `weight`, `bias` `[c]`. The statistics
/// may come from a larger tensor than `x` (tiled VAE decoding normalises each tile with the
/// whole image's statistics). Parallel over groups. Panics as [`group_norm_stats`].
#[allow(clippy::too_many_arguments)]
pub fn group_norm_apply(
    x: &[f32],
    c: usize,
    hw: usize,
    groups: usize,
    stats: &[GroupStats],
    weight: &[f32],
    bias: &[f32],
    out: &mut [f32],
) {
    crate::contract::group_norm(x, c, hw, groups, weight, bias, out);
    crate::contract::group_norm_stats(x, c, hw, groups, stats);
    let cg = c / groups;
    if cg * hw == 0 {
        return;
    }
    out.par_chunks_mut(cg * hw)
        .zip(x.par_chunks(cg * hw))
        .zip(stats.par_iter())
        .enumerate()
        .for_each(|(g, ((og, xg), s))| {
            for (ci, (orow, xrow)) in og.chunks_mut(hw).zip(xg.chunks(hw)).enumerate() {
                let ch = g * cg + ci;
                let (wc, bc) = (f64::from(weight[ch]), f64::from(bias[ch]));
                for (o, &v) in orow.iter_mut().zip(xrow) {
                    *o = ((f64::from(v) - s.mean) * s.rstd * wc + bc) as f32;
                }
            }
        });
}

/// `generic_group_norm_f32`: torch `nn.GroupNorm(groups, c, eps, affine=True)` on one sample:
/// [`group_norm_stats`] then [`group_norm_apply`] (so a tile normalised with the statistics of
/// the whole tensor gets exactly the whole tensor's values).
///
/// Shapes: `x`, `out` `[c, hw]`; `weight`, `bias` `[c]`. Channels `g·c/groups .. (g+1)·c/groups`
/// form group `g`; `out = (x − mean_g) / sqrt(var_g + eps) · weight[ch] + bias[ch]` with the
/// biased variance over the group's `c/groups · hw` values. Statistics and the normalization are
/// computed in f64, the result rounded once to f32. Parallel over groups. Panics if `groups`
/// does not divide `c` or a length does not match.
#[allow(clippy::too_many_arguments)]
pub fn group_norm(
    x: &[f32],
    c: usize,
    hw: usize,
    groups: usize,
    eps: f32,
    weight: &[f32],
    bias: &[f32],
    out: &mut [f32],
) {
    crate::generic().group_norm(x, c, hw, groups, eps, weight, bias, out);
}

/// Groups whose statistics fit on the stack in [`with_group_stats`].
const STACK_GROUPS: usize = 256;

/// Calls `f` with a zeroed `[groups]` statistics buffer (on the stack up to 256 groups, so a
/// GroupNorm step allocates nothing).
pub(crate) fn with_group_stats<R>(groups: usize, f: impl FnOnce(&mut [GroupStats]) -> R) -> R {
    if groups <= STACK_GROUPS {
        let mut buf = [GroupStats::default(); STACK_GROUPS];
        f(&mut buf[..groups])
    } else {
        f(&mut vec![GroupStats::default(); groups])
    }
}

/// `generic_layer_norm_f32`: torch `nn.LayerNorm(d, eps, elementwise_affine)` over the last axis.
///
/// Shapes: `x`, `out` `[m, d]`; `weight`, `bias` `[d]` or `None` (no affine, as PixArt's
/// `LayerNorm(elementwise_affine=False, eps=1e-6)`). `out = (x − mean) / sqrt(var + eps) ·
/// weight + bias` with the biased variance of each row, computed in f64 and rounded once to f32.
pub fn layer_norm(
    x: &[f32],
    m: usize,
    d: usize,
    eps: f32,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    crate::contract::layer_norm(x, m, d, weight, bias, out);
    if m * d == 0 {
        return;
    }
    out.par_chunks_mut(ROWS_PER_TASK * d)
        .zip(x.par_chunks(ROWS_PER_TASK * d))
        .for_each(|(ob, xb)| {
            for (o, xr) in ob.chunks_mut(d).zip(xb.chunks(d)) {
                let (mean, var) = moments(xr);
                let rstd = 1.0 / (var + f64::from(eps)).sqrt();
                for (j, (oj, &v)) in o.iter_mut().zip(xr).enumerate() {
                    *oj = layer_norm_value(v, mean, rstd, weight.map(|w| w[j]), bias.map(|b| b[j]));
                }
            }
        });
}

/// `generic_rms_norm_f32`: transformers `T5LayerNorm` (modeling_t5.py):
/// `variance = mean(x², -1)` (f32 in torch), `out = weight · (x · rsqrt(variance + eps))`.
///
/// Shapes: `x`, `out` `[m, d]`, `weight` `[d]`. The mean of squares is summed in f64 and rounded
/// to f32 (the value torch's f32 reduction approximates); the rest is f32 in torch's order.
pub fn rms_norm(x: &[f32], m: usize, d: usize, eps: f32, weight: &[f32], out: &mut [f32]) {
    crate::contract::rms_norm(x, m, d, weight, out);
    if m * d == 0 {
        return;
    }
    out.par_chunks_mut(ROWS_PER_TASK * d)
        .zip(x.par_chunks(ROWS_PER_TASK * d))
        .for_each(|(ob, xb)| {
            for (o, xr) in ob.chunks_mut(d).zip(xb.chunks(d)) {
                let ss = lane_sum(xr, 0.0, true);
                let var = (ss / d as f64) as f32;
                let r = 1.0 / (var + eps).sqrt();
                for ((oj, &v), &w) in o.iter_mut().zip(xr).zip(weight) {
                    *oj = w * (v * r);
                }
            }
        });
}
