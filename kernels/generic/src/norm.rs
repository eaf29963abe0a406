//! Normalizations: `generic_group_norm_f32`, `generic_layer_norm_f32`, `generic_rms_norm_f32`.
//!
//! Statistics are computed in f64 with two passes (mean, then the mean of squared deviations),
//! which is at least as accurate as torch's f32 Welford and independent of any work split.

use rayon::prelude::*;

/// Rows per task for the row-wise norms.
const ROWS_PER_TASK: usize = 16;

/// Mean and biased variance of `x` in f64, two passes.
fn moments(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    (mean, var)
}

/// `generic_group_norm_f32`: torch `nn.GroupNorm(groups, c, eps, affine=True)` on one sample.
///
/// Shapes: `x`, `out` `[c, hw]`; `weight`, `bias` `[c]`. Channels `g·c/groups .. (g+1)·c/groups`
/// form group `g`; `out = (x − mean_g) / sqrt(var_g + eps) · weight[ch] + bias[ch]` with the
/// biased variance over the group's `c/groups · hw` values. Statistics and the normalization are
/// computed in f64, the result rounded once to f32. Parallel over groups. Panics if `groups`
/// does not divide `c` or a length does not match.
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
    crate::contract::group_norm(x, c, hw, groups, weight, bias, out);
    let cg = c / groups;
    if cg * hw == 0 {
        return;
    }
    out.par_chunks_mut(cg * hw)
        .zip(x.par_chunks(cg * hw))
        .enumerate()
        .for_each(|(g, (og, xg))| {
            let (mean, var) = moments(xg);
            let rstd = 1.0 / (var + f64::from(eps)).sqrt();
            for (ci, (orow, xrow)) in og.chunks_mut(hw).zip(xg.chunks(hw)).enumerate() {
                let ch = g * cg + ci;
                let (wc, bc) = (f64::from(weight[ch]), f64::from(bias[ch]));
                for (o, &v) in orow.iter_mut().zip(xrow) {
                    *o = ((f64::from(v) - mean) * rstd * wc + bc) as f32;
                }
            }
        });
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
                    let mut y = (f64::from(v) - mean) * rstd;
                    if let Some(w) = weight {
                        y *= f64::from(w[j]);
                    }
                    if let Some(b) = bias {
                        y += f64::from(b[j]);
                    }
                    *oj = y as f32;
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
                let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                let var = (ss / d as f64) as f32;
                let r = 1.0 / (var + eps).sqrt();
                for ((oj, &v), &w) in o.iter_mut().zip(xr).zip(weight) {
                    *oj = w * (v * r);
                }
            }
        });
}
