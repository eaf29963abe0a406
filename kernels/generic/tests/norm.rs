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
