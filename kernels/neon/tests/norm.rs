//! `layer_norm` and `rms_norm` of every table variant against the generic kernels, on random
//! rows with ragged widths `d` (not multiples of the 4-lane width) and shifted means.
//!
//! Both compute their statistics in f64; only the summation order differs (four lanes vs
//! sequential), so the f64 statistics agree to ~1e-16 relative and an output may differ by one
//! f32 rounding: bound `|neon − generic| ≤ 2⁻²² · |generic| + 1e-7` (two ulps, plus an absolute
//! floor near zero where a rounding of the mean subtraction shows).

use edge_kernels_neon::variants;

/// xorshift64* in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize, scale: f32, shift: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale + shift).collect()
    }
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = w.abs() * f32::EPSILON * 2.0 + 1e-7;
        assert!(
            (g - w).abs() <= tol,
            "{what} [{i}]: {g} vs generic {w} (tol {tol})"
        );
    }
}

#[test]
fn layer_norm_matches_generic() {
    let g = edge_kernels::generic();
    let mut rng = Rng(11);
    for (m, d) in [(1, 1), (3, 3), (5, 7), (17, 64), (33, 100), (2, 1153)] {
        let x = rng.vec(m * d, 3.0, 1.5);
        let w = rng.vec(d, 1.0, 1.0);
        let b = rng.vec(d, 0.5, 0.0);
        for (wo, bo) in [
            (Some(&w[..]), Some(&b[..])),
            (None, None),
            (Some(&w[..]), None),
        ] {
            let mut want = vec![0.0f32; m * d];
            (g.layer_norm.run)(&x, m, d, 1e-6, wo, bo, &mut want);
            for (label, t) in variants() {
                let mut got = vec![f32::NAN; m * d];
                (t.layer_norm.run)(&x, m, d, 1e-6, wo, bo, &mut got);
                close(
                    &format!("{label} {} m={m} d={d}", t.layer_norm.name),
                    &got,
                    &want,
                );
            }
        }
    }
}

#[test]
fn rms_norm_matches_generic() {
    let g = edge_kernels::generic();
    let mut rng = Rng(12);
    for (m, d) in [(1, 1), (3, 3), (5, 7), (17, 64), (33, 100), (2, 1153)] {
        let x = rng.vec(m * d, 3.0, 0.5);
        let w = rng.vec(d, 1.0, 1.0);
        let mut want = vec![0.0f32; m * d];
        (g.rms_norm.run)(&x, m, d, 1e-6, &w, &mut want);
        for (label, t) in variants() {
            let mut got = vec![f32::NAN; m * d];
            (t.rms_norm.run)(&x, m, d, 1e-6, &w, &mut got);
            close(
                &format!("{label} {} m={m} d={d}", t.rms_norm.name),
                &got,
                &want,
            );
        }
    }
}
