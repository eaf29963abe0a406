//! `avx2_layer_norm_f64x4` and `avx2_rms_norm_f64x4`: the row norms with AVX2 f64 statistics,
//! bit-identical to the generic kernels ([`edge_kernels::layer_norm`]: torch `nn.LayerNorm`;
//! [`edge_kernels::rms_norm`]: transformers `T5LayerNorm`).
//!
//! The generic statistics are two-pass f64 sums in four lanes ([`edge_kernels::lane_sum`]:
//! lane `l` takes the elements `i ≡ l (mod 4)` of the whole 4-element chunks, unfused squares,
//! combined as `(a₀ + a₂) + (a₁ + a₃)`, then the tail in order): one `__m256d` accumulator is
//! exactly those four lanes. Each lane is one chain of dependent additions, so a single row's
//! sum waits on the `vaddpd` latency at every chunk; [`ROWS`] rows are summed together, their
//! chains interleaved (the order inside each row is unchanged). The normalization runs four
//! elements per register in the generic kernel's operation order (LayerNorm: `((x − mean) ·
//! rstd) · weight + bias` in f64, rounded once; RMSNorm: `weight · (x · r)` in f32). Rows are
//! split into tasks as the generic kernels split them; every row's bits are independent of the
//! split.

use std::arch::x86_64::*;

use rayon::prelude::*;

/// Rows per task (as the generic kernels).
const ROWS_PER_TASK: usize = 16;
/// Rows whose statistics are summed together.
const ROWS: usize = 4;

/// For each of the `N` rows (all of one length `d`), `Σ tᵢ` (or `Σ tᵢ²` with `SQUARE`) for
/// `tᵢ = f64(x[i]) − shift[r]`: [`edge_kernels::lane_sum`]'s value for every row.
///
/// # Safety
/// AVX2 must be present.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lane_sums<const SQUARE: bool, const N: usize>(
    rows: &[&[f32]; N],
    shift: [f64; N],
) -> [f64; N] {
    let d = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == d));
    let full = d - d % 4;
    let s: [__m256d; N] = std::array::from_fn(|r| _mm256_set1_pd(shift[r]));
    let mut acc = [_mm256_setzero_pd(); N];
    for j in (0..full).step_by(4) {
        for r in 0..N {
            // SAFETY: `j + 4 ≤ full ≤ d`, inside row `r` (asserted above).
            let v = _mm256_cvtps_pd(unsafe { _mm_loadu_ps(rows[r].as_ptr().add(j)) });
            let t = _mm256_sub_pd(v, s[r]);
            let t = if SQUARE { _mm256_mul_pd(t, t) } else { t };
            acc[r] = _mm256_add_pd(acc[r], t);
        }
    }
    std::array::from_fn(|r| {
        // (a₀ + a₂), (a₁ + a₃), then their sum.
        let p = _mm_add_pd(
            _mm256_castpd256_pd128(acc[r]),
            _mm256_extractf128_pd::<1>(acc[r]),
        );
        let mut sum = _mm_cvtsd_f64(p) + _mm_cvtsd_f64(_mm_unpackhi_pd(p, p));
        for &v in &rows[r][full..] {
            let t = f64::from(v) - shift[r];
            sum += if SQUARE { t * t } else { t };
        }
        sum
    })
}

/// One LayerNorm row from its statistics: `out = ((x − mean) · rstd) · weight + bias` in f64,
/// rounded once to f32.
///
/// # Safety
/// AVX2 must be present.
#[target_feature(enable = "avx2")]
unsafe fn layer_norm_apply(
    x: &[f32],
    mean: f64,
    rstd: f64,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let d = x.len();
    assert!(
        out.len() == d && weight.is_none_or(|w| w.len() == d) && bias.is_none_or(|b| b.len() == d)
    );
    let (vm, vr) = (_mm256_set1_pd(mean), _mm256_set1_pd(rstd));
    let full = d - d % 4;
    let widen = |s: &[f32], j: usize| {
        let c: &[f32; 4] = s[j..j + 4].try_into().expect("4 values");
        // SAFETY: `c` holds 4 f32.
        _mm256_cvtps_pd(unsafe { _mm_loadu_ps(c.as_ptr()) })
    };
    for j in (0..full).step_by(4) {
        let mut y = _mm256_mul_pd(_mm256_sub_pd(widen(x, j), vm), vr);
        if let Some(w) = weight {
            y = _mm256_mul_pd(y, widen(w, j));
        }
        if let Some(b) = bias {
            y = _mm256_add_pd(y, widen(b, j));
        }
        // SAFETY: `j + 4 ≤ full ≤ d = out.len()` (asserted above).
        unsafe { _mm_storeu_ps(out.as_mut_ptr().add(j), _mm256_cvtpd_ps(y)) };
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

/// `N` LayerNorm rows: statistics summed together, then each row normalized.
///
/// # Safety
/// AVX2 must be present.
#[target_feature(enable = "avx2")]
unsafe fn layer_norm_rows<const N: usize>(
    xs: &[&[f32]; N],
    outs: [&mut [f32]; N],
    eps: f32,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
) {
    let n = xs[0].len() as f64;
    // SAFETY: AVX2 is present (this function's contract).
    let means = unsafe { lane_sums::<false, N>(xs, [0.0; N]) }.map(|s| s / n);
    // SAFETY: as above.
    let vars = unsafe { lane_sums::<true, N>(xs, means) }.map(|s| s / n);
    for (r, o) in outs.into_iter().enumerate() {
        let rstd = 1.0 / (vars[r] + f64::from(eps)).sqrt();
        // SAFETY: as above.
        unsafe { layer_norm_apply(xs[r], means[r], rstd, weight, bias, o) };
    }
}

/// `avx2_layer_norm_f64x4`: the contract and bits of [`edge_kernels::layer_norm`] (torch
/// `nn.LayerNorm` over the last axis of `x` `[m, d]`, outermost-first; `weight`, `bias` `[d]`
/// or absent; statistics in f64).
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
    by_rows(
        x,
        d,
        out,
        // SAFETY: the tables holding this kernel exist only where AVX2 was detected (every
        // `*_table` of `super` checks it).
        |xs, os| unsafe { layer_norm_rows(&xs, os, eps, weight, bias) },
        // SAFETY: as above.
        |x, o| unsafe { layer_norm_rows(&[x], [o], eps, weight, bias) },
    );
}

/// The row loop of both norms: `x` and `out` (`[m, d]`) in tasks of [`ROWS_PER_TASK`] rows (as
/// the generic kernels split them), each task's rows [`ROWS`] at a time through `rows`, the last
/// `< ROWS` one at a time through `row`.
fn by_rows(
    x: &[f32],
    d: usize,
    out: &mut [f32],
    rows: impl Fn([&[f32]; ROWS], [&mut [f32]; ROWS]) + Sync,
    row: impl Fn(&[f32], &mut [f32]) + Sync,
) {
    if x.is_empty() || d == 0 {
        return;
    }
    out.par_chunks_mut(ROWS_PER_TASK * d)
        .zip(x.par_chunks(ROWS_PER_TASK * d))
        .for_each(|(ob, xb)| {
            let mut orows = ob.chunks_mut(d);
            let mut xrows = xb.chunks(d);
            while xrows.len() >= ROWS {
                let xs: [&[f32]; ROWS] = std::array::from_fn(|_| xrows.next().expect("rows"));
                let os: [&mut [f32]; ROWS] = std::array::from_fn(|_| orows.next().expect("rows"));
                rows(xs, os);
            }
            for (o, xr) in orows.zip(xrows) {
                row(xr, o);
            }
        });
}

/// One RMSNorm row: `out = weight · (x · r)` in f32.
///
/// # Safety
/// AVX2 must be present.
#[target_feature(enable = "avx2")]
unsafe fn rms_norm_apply(x: &[f32], r: f32, weight: &[f32], out: &mut [f32]) {
    let d = x.len();
    assert!(out.len() == d && weight.len() == d);
    let vr = _mm256_set1_ps(r);
    let full = d - d % 8;
    for j in (0..full).step_by(8) {
        // SAFETY: `j + 8 ≤ full ≤ d`, the length of `x`, `weight` and `out` (asserted).
        unsafe {
            let v = _mm256_mul_ps(
                _mm256_loadu_ps(weight.as_ptr().add(j)),
                _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(j)), vr),
            );
            _mm256_storeu_ps(out.as_mut_ptr().add(j), v);
        }
    }
    for j in full..d {
        out[j] = weight[j] * (x[j] * r);
    }
}

/// `N` RMSNorm rows: `r = 1 / sqrt(f32(Σx² / d) + eps)` from sums taken together.
///
/// # Safety
/// AVX2 must be present.
#[target_feature(enable = "avx2")]
unsafe fn rms_norm_rows<const N: usize>(
    xs: &[&[f32]; N],
    outs: [&mut [f32]; N],
    eps: f32,
    weight: &[f32],
) {
    let d = xs[0].len() as f64;
    // SAFETY: AVX2 is present (this function's contract).
    let sums = unsafe { lane_sums::<true, N>(xs, [0.0; N]) };
    for (r, o) in outs.into_iter().enumerate() {
        let var = (sums[r] / d) as f32;
        // SAFETY: as above.
        unsafe { rms_norm_apply(xs[r], 1.0 / (var + eps).sqrt(), weight, o) };
    }
}

/// `avx2_rms_norm_f64x4`: the contract and bits of [`edge_kernels::rms_norm`] (transformers
/// `T5LayerNorm` over the last axis of `x` `[m, d]`, outermost-first; `weight` `[d]`).
pub(super) fn rms_norm(x: &[f32], m: usize, d: usize, eps: f32, weight: &[f32], out: &mut [f32]) {
    edge_kernels::contract::rms_norm(x, m, d, weight, out);
    by_rows(
        x,
        d,
        out,
        // SAFETY: as in [`layer_norm`], AVX2 is present.
        |xs, os| unsafe { rms_norm_rows(&xs, os, eps, weight) },
        // SAFETY: as above.
        |x, o| unsafe { rms_norm_rows(&[x], [o], eps, weight) },
    );
}
