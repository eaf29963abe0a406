//! Element-wise kernels against their f64 formulas.

mod common;

use common::*;
use edge_kernels::{add, gated_residual, gelu_tanh, modulate, mul, scale, silu};

#[test]
fn silu_and_gelu_tanh_match_formulas() {
    let mut rng = Rng::new(30);
    let mut x = rng.vec(40_000, 8.0);
    x.extend([0.0, -0.0, 100.0, -100.0, 1e-8, -30.0, 30.0]);
    let mut out = vec![0.0; x.len()];
    silu(&x, &mut out);
    let want: Vec<f64> = x
        .iter()
        .map(|&v| f64::from(v) / (1.0 + (-f64::from(v)).exp()))
        .collect();
    assert_close("silu", &out, &want, |i| 2e-6 * want[i].abs() + 1e-30);

    gelu_tanh(&x, &mut out);
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let want: Vec<f64> = x
        .iter()
        .map(|&v| {
            let v = f64::from(v);
            0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
        })
        .collect();
    // tanh near −1 cancels: bound the error by the magnitude of x times a few ulps.
    assert_close("gelu_tanh", &out, &want, |i| {
        4e-7 * f64::from(x[i]).abs() + 1e-30
    });
}

#[test]
fn broadcast_add_mul_scale() {
    let mut rng = Rng::new(31);
    for (rows, d) in [(1, 1), (3, 5), (100, 17), (2000, 33)] {
        let a = rng.vec(rows * d, 1.0);
        let b = rng.vec(d, 1.0);
        let mut out = vec![0.0; rows * d];
        add(&a, &b, &mut out);
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, a[i] + b[i % d]);
        }
        mul(&a, &b, &mut out);
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, a[i] * b[i % d]);
        }
        scale(&a, 0.3, &mut out);
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, a[i] * 0.3);
        }
    }
    // A full-size b is an element-wise op.
    let a = rng.vec(50, 1.0);
    let b = rng.vec(50, 1.0);
    let mut out = vec![0.0; 50];
    add(&a, &b, &mut out);
    assert!(out.iter().enumerate().all(|(i, o)| *o == a[i] + b[i]));
}

#[test]
#[should_panic(expected = "does not divide")]
fn add_rejects_non_suffix_shape() {
    let mut out = vec![0.0; 6];
    add(&[0.0; 6], &[0.0; 4], &mut out);
}

#[test]
fn modulate_and_gated_residual() {
    let mut rng = Rng::new(32);
    for &m in &SIZES {
        let d = 72;
        let x = rng.vec(m * d, 2.0);
        let y = rng.vec(m * d, 2.0);
        let shift = rng.vec(d, 1.0);
        let sc = rng.vec(d, 1.0);
        let mut out = vec![0.0; m * d];
        modulate(&x, m, d, &shift, &sc, &mut out);
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, x[i] * (1.0 + sc[i % d]) + shift[i % d], "modulate {i}");
        }
        gated_residual(&x, &y, m, d, &sc, &mut out);
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, x[i] + sc[i % d] * y[i], "gated_residual {i}");
        }
    }
}
