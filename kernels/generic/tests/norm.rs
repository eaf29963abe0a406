//! Normalizations against f64 references written from the torch / transformers formulas.

mod common;

use common::*;
use edge_kernels::{group_norm, layer_norm, rms_norm};

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (
        mean,
        v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n,
    )
}

#[test]
fn group_norm_matches_reference() {
    let mut rng = Rng::new(20);
    for (c, hw, groups) in [
        (4, 1, 2),
        (32, 17, 32),
        (64, 33, 32),
        (6, 100, 3),
        (12, 5, 1),
    ] {
        // An offset makes a naive one-pass variance lose digits.
        let x: Vec<f32> = rng.vec(c * hw, 2.0).iter().map(|v| v + 30.0).collect();
        let w = rng.vec(c, 1.0);
        let b = rng.vec(c, 1.0);
        let eps = 1e-6;
        let mut out = vec![0.0; c * hw];
        group_norm(&x, c, hw, groups, eps, &w, &b, &mut out);
        let cg = c / groups;
        let mut want = vec![0.0; c * hw];
        for g in 0..groups {
            let vals: Vec<f64> = x[g * cg * hw..(g + 1) * cg * hw]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let (mean, var) = mean_var(&vals);
            for ch in g * cg..(g + 1) * cg {
                for p in 0..hw {
                    let v = f64::from(x[ch * hw + p]);
                    want[ch * hw + p] = (v - mean) / (var + f64::from(eps)).sqrt()
                        * f64::from(w[ch])
                        + f64::from(b[ch]);
                }
            }
        }
        assert_close(&format!("c={c} hw={hw} g={groups}"), &out, &want, |i| {
            1e-5 * want[i].abs().max(1.0)
        });
        assert_thread_invariant("group_norm", || {
            let mut o = vec![0.0; c * hw];
            group_norm(&x, c, hw, groups, eps, &w, &b, &mut o);
            o
        });
    }
}

#[test]
fn layer_norm_matches_reference_with_and_without_affine() {
    let mut rng = Rng::new(21);
    for &m in &SIZES {
        for d in [1, 7, 64, 100] {
            let x = rng.vec(m * d, 3.0);
            let w = rng.vec(d, 1.0);
            let b = rng.vec(d, 1.0);
            for affine in [false, true] {
                let (wo, bo) = if affine {
                    (Some(w.as_slice()), Some(b.as_slice()))
                } else {
                    (None, None)
                };
                let mut out = vec![0.0; m * d];
                layer_norm(&x, m, d, 1e-6, wo, bo, &mut out);
                let mut want = vec![0.0; m * d];
                for i in 0..m {
                    let vals: Vec<f64> = x[i * d..(i + 1) * d]
                        .iter()
                        .map(|&v| f64::from(v))
                        .collect();
                    let (mean, var) = mean_var(&vals);
                    for j in 0..d {
                        let mut y = (vals[j] - mean) / (var + 1e-6).sqrt();
                        if affine {
                            y = y * f64::from(w[j]) + f64::from(b[j]);
                        }
                        want[i * d + j] = y;
                    }
                }
                assert_close(&format!("m={m} d={d} affine={affine}"), &out, &want, |i| {
                    1e-5 * want[i].abs().max(1.0)
                });
            }
        }
    }
}

#[test]
fn rms_norm_matches_t5_layer_norm() {
    let mut rng = Rng::new(22);
    for &m in &SIZES {
        for d in [1, 32, 64, 100] {
            let x = rng.vec(m * d, 3.0);
            let w = rng.vec(d, 1.0);
            let mut out = vec![0.0; m * d];
            rms_norm(&x, m, d, 1e-6, &w, &mut out);
            let mut want = vec![0.0; m * d];
            for i in 0..m {
                let row = &x[i * d..(i + 1) * d];
                let ms = row
                    .iter()
                    .map(|&v| f64::from(v) * f64::from(v))
                    .sum::<f64>()
                    / d as f64;
                for j in 0..d {
                    want[i * d + j] = f64::from(w[j]) * f64::from(row[j]) / (ms + 1e-6).sqrt();
                }
            }
            assert_close(&format!("m={m} d={d}"), &out, &want, |i| {
                1e-5 * want[i].abs().max(1.0)
            });
        }
    }
}

#[test]
#[should_panic(expected = "do not divide")]
fn group_norm_rejects_indivisible_groups() {
    let mut out = vec![0.0; 6];
    group_norm(&[0.0; 6], 3, 2, 2, 1e-6, &[1.0; 3], &[0.0; 3], &mut out);
}

/// The two halves tiled VAE decoding uses: statistics of the whole tensor, then the
/// normalization of any window of its positions, give exactly the whole GroupNorm's values
/// there; the table's `group_norm` is the same composition.
#[test]
fn group_norm_of_a_window_with_whole_statistics_equals_the_whole() {
    let mut rng = Rng::new(21);
    for (c, h, w, groups) in [(8, 9, 7, 4), (32, 5, 11, 32), (6, 16, 16, 1)] {
        let hw = h * w;
        let x: Vec<f32> = rng.vec(c * hw, 3.0).iter().map(|v| v - 5.0).collect();
        let (wt, b) = (rng.vec(c, 1.0), rng.vec(c, 1.0));
        let mut whole = vec![0.0; c * hw];
        group_norm(&x, c, hw, groups, 1e-6, &wt, &b, &mut whole);
        let mut via_table = vec![0.0; c * hw];
        edge_kernels::generic().group_norm(&x, c, hw, groups, 1e-6, &wt, &b, &mut via_table);
        assert_eq!(whole, via_table);
        let mut stats = vec![edge_kernels::GroupStats::default(); groups];
        edge_kernels::group_norm_stats(&x, c, hw, groups, 1e-6, &mut stats);
        // A 3×4 window at (2, 1).
        let (y0, x0, wh, ww) = (2, 1, 3, 4);
        let mut win = vec![0.0; c * wh * ww];
        for ch in 0..c {
            for y in 0..wh {
                for xx in 0..ww {
                    win[(ch * wh + y) * ww + xx] = x[(ch * h + y0 + y) * w + x0 + xx];
                }
            }
        }
        let mut out = vec![0.0; win.len()];
        edge_kernels::group_norm_apply(&win, c, wh * ww, groups, &stats, &wt, &b, &mut out);
        for ch in 0..c {
            for y in 0..wh {
                for xx in 0..ww {
                    assert_eq!(
                        out[(ch * wh + y) * ww + xx].to_bits(),
                        whole[(ch * h + y0 + y) * w + x0 + xx].to_bits()
                    );
                }
            }
        }
    }
}

/// Rows whose variance is at or below `eps` (near-constant activations: padding tokens, flat
/// image regions) tell `1/sqrt(var + eps)` from `1/(sqrt(var) + eps)` and from dropping eps:
/// layer, group and RMS norm against the torch formula on such rows.
#[test]
fn norms_of_near_constant_rows_use_eps_inside_the_root() {
    let eps = 1e-5f32;
    let d = 64;
    // Constant rows (variance 0), and rows with variance ≈ eps/10, ≈ eps and ≈ 10·eps.
    let mut rows: Vec<Vec<f32>> = vec![vec![0.25; d], vec![-3.0; d]];
    for (k, scale) in [(1usize, 1e-3f32), (2, 3.2e-3), (3, 1e-2)] {
        rows.push(
            (0..d)
                .map(|j| 1.5 + scale * if (j * 7 + k) % 2 == 0 { 1.0 } else { -1.0 })
                .collect(),
        );
    }
    let m = rows.len();
    let x: Vec<f32> = rows.concat();
    let mut out = vec![0.0; m * d];
    layer_norm(&x, m, d, eps, None, None, &mut out);
    let mut want = vec![0.0f64; m * d];
    for (r, row) in rows.iter().enumerate() {
        let v: Vec<f64> = row.iter().map(|&a| f64::from(a)).collect();
        let (mean, var) = mean_var(&v);
        for j in 0..d {
            want[r * d + j] = (v[j] - mean) / (var + f64::from(eps)).sqrt();
        }
    }
    assert_close("layer_norm near-constant rows", &out, &want, |i| {
        1e-5 * want[i].abs().max(1e-3)
    });

    // GroupNorm: one group per near-constant row (channels of 8 pixels).
    let (c, hw) = (m * 8, d / 8);
    let w = vec![1.0; c];
    let b = vec![0.0; c];
    let mut out = vec![0.0; c * hw];
    group_norm(&x, c, hw, m, eps, &w, &b, &mut out);
    assert_close("group_norm near-constant groups", &out, &want, |i| {
        1e-5 * want[i].abs().max(1e-3)
    });

    // RMS norm of tiny rows: mean of squares at or below eps.
    let tiny: Vec<f32> = x.iter().map(|v| v * 1e-3).collect();
    let ones = vec![1.0; d];
    let mut out = vec![0.0; m * d];
    rms_norm(&tiny, m, d, eps, &ones, &mut out);
    let mut want = vec![0.0f64; m * d];
    for r in 0..m {
        let row = &tiny[r * d..(r + 1) * d];
        let ms = row
            .iter()
            .map(|&a| f64::from(a) * f64::from(a))
            .sum::<f64>()
            / d as f64;
        for j in 0..d {
            want[r * d + j] = f64::from(row[j]) / (ms + f64::from(eps)).sqrt();
        }
    }
    assert_close("rms_norm tiny rows", &out, &want, |i| {
        1e-5 * want[i].abs().max(1e-3)
    });
}
