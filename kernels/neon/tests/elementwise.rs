//! `silu`, `gelu_tanh`, `relu` and `tanh` of every table variant against the generic kernels,
//! bit for bit (NaN for NaN): the NEON lanes perform the generic formulas' operations in order
//! over the generic `exp` polynomial.

use edge_kernels_neon::variants;

/// Inputs: a dense sweep of [−12, 12], extremes, and the lengths 0..9 for the vector tail.
fn inputs() -> Vec<f32> {
    let mut v: Vec<f32> = (0..=24_000).map(|i| -12.0 + i as f32 * 1e-3).collect();
    v.extend([
        0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 20.0, -20.0, 50.0, -50.0, 87.0, -87.0, 89.0, -89.0,
        100.0, -100.0, 1e4, -1e4, 3.0e38, -3.0e38,
    ]);
    v.extend([0.5; 3]);
    v
}

fn check(slot: &str) {
    let xs = inputs();
    let g = edge_kernels::generic();
    for len in [0, 1, 2, 3, 4, 5, 7, 9, xs.len()] {
        let x = &xs[xs.len() - len..];
        let mut want = vec![0.0f32; len];
        let pick = |t: &edge_kernels::KernelTable| match slot {
            "silu" => t.silu,
            "gelu_tanh" => t.gelu_tanh,
            "relu" => t.relu,
            _ => t.tanh,
        };
        let f = pick(&g);
        (f.run)(x, &mut want);
        for (label, t) in variants() {
            let k = pick(&t);
            let mut got = vec![f32::NAN; len];
            (k.run)(x, &mut got);
            for i in 0..len {
                assert!(
                    got[i].to_bits() == want[i].to_bits() || (got[i].is_nan() && want[i].is_nan()),
                    "{label} {} x={}: {} vs generic {}",
                    k.name,
                    x[i],
                    got[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
fn silu_matches_generic() {
    check("silu");
}

#[test]
fn gelu_tanh_matches_generic() {
    check("gelu_tanh");
}

#[test]
fn relu_matches_generic_bit_for_bit() {
    check("relu");
}

#[test]
fn tanh_matches_generic() {
    check("tanh");
    let x = [f32::NAN, -0.0, f32::INFINITY, f32::NEG_INFINITY];
    for (label, t) in variants() {
        let mut got = [0.0f32; 4];
        (t.tanh.run)(&x, &mut got);
        assert!(got[0].is_nan(), "{label}");
        assert_eq!(got[1].to_bits(), (-0.0f32).to_bits(), "{label}");
        assert_eq!((got[2], got[3]), (1.0, -1.0), "{label}");
    }
}
