//! `add`, `mul`, `modulate` and `gated_residual` of every table variant against the generic
//! kernels.
//!
//! Bound: bit-identical (`to_bits` equality). The NEON kernels perform the generic kernels'
//! single f32 operations per element in the same order and unfused (`a + b`, `a · b`,
//! `x · (1 + scale) + shift`, `x + gate · y`), so every result is the same correctly rounded
//! value. Inputs include ±0, infinities, subnormals and values whose products overflow. Shapes
//! cover every broadcast the generic kernels accept (`b` of any length dividing `a`'s,
//! `b` = `a`, empty), ragged row lengths and sizes spanning several rayon tasks; mismatched
//! shapes must panic with the generic kernels' messages.

use std::panic::{catch_unwind, AssertUnwindSafe};

mod common;
use common::best;

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

    /// Mostly uniform values of varying magnitude, with a sprinkling of special values.
    fn vec(&mut self, n: usize) -> Vec<f32> {
        const SPECIAL: [f32; 8] = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-40,
            -3e-39,
            3.0e38,
            -1.0,
        ];
        (0..n)
            .map(|i| {
                let u = self.next_f32();
                if i % 97 == 13 {
                    SPECIAL[(i / 97) % SPECIAL.len()]
                } else {
                    u * [1.0, 1e3, 1e-3, 1e20][i % 4]
                }
            })
            .collect()
    }
}

/// Row lengths: the brief's ragged set, vector-width multiples and the periodic widths 1, 2, 4.
const DS: [usize; 9] = [1, 2, 3, 4, 5, 8, 17, 72, 1031];
/// Row counts, including 0 and counts whose total spans several 2¹⁴-element tasks.
const MS: [usize; 6] = [0, 1, 3, 5, 17, 40];

fn rows_for(d: usize, m: usize) -> usize {
    // Make the largest case exceed a task (2¹⁴ elements) for every d.
    if m == 40 {
        (40_000 / d).max(40)
    } else {
        m
    }
}

fn assert_bits(label: &str, name: &str, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{label} {name} {what} at {i}: {g} vs generic {w}"
        );
    }
}

#[test]
fn add_mul_match_generic_bitwise() {
    let g = edge_kernels::generic();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut shapes: Vec<(usize, usize)> = vec![(0, 0)];
    for d in DS {
        for m in MS {
            shapes.push((rows_for(d, m), d));
        }
    }
    for (m, d) in shapes {
        let a = rng.vec(m * d);
        let b = rng.vec(d);
        for mul in [false, true] {
            let gk = if mul { g.mul } else { g.add };
            let mut want = vec![0.0f32; m * d];
            (gk.run)(&a, &b, &mut want);
            for (label, t) in variants() {
                let k = if mul { t.mul } else { t.add };
                let mut got = vec![f32::NAN; m * d];
                (k.run)(&a, &b, &mut got);
                assert_bits(label, k.name, &format!("[{m}, {d}]"), &got, &want);
            }
        }
    }
}

#[test]
fn add_without_broadcast_matches_generic_bitwise() {
    let g = edge_kernels::generic();
    let mut rng = Rng(0x0bad_cafe_f00d_0001);
    for n in [1, 3, 5, 17, 1031, 20_000] {
        let a = rng.vec(n);
        let b = rng.vec(n);
        let mut want = vec![0.0f32; n];
        (g.add.run)(&a, &b, &mut want);
        for (label, t) in variants() {
            let mut got = vec![f32::NAN; n];
            (t.add.run)(&a, &b, &mut got);
            assert_bits(label, t.add.name, &format!("[{n}] + [{n}]"), &got, &want);
        }
    }
}

#[test]
fn modulate_and_gated_residual_match_generic_bitwise() {
    let g = edge_kernels::generic();
    let mut rng = Rng(0x5eed_0000_0000_0042);
    let mut shapes: Vec<(usize, usize)> = vec![(0, 0), (3, 0)];
    for d in DS {
        for m in MS {
            shapes.push((rows_for(d, m), d));
        }
    }
    for (m, d) in shapes {
        let x = rng.vec(m * d);
        let y = rng.vec(m * d);
        let shift = rng.vec(d);
        let scale = rng.vec(d);
        let mut want = vec![0.0f32; m * d];
        (g.modulate.run)(&x, m, d, &shift, &scale, &mut want);
        let mut want_g = vec![0.0f32; m * d];
        (g.gated_residual.run)(&x, &y, m, d, &scale, &mut want_g);
        for (label, t) in variants() {
            let mut got = vec![f32::NAN; m * d];
            (t.modulate.run)(&x, m, d, &shift, &scale, &mut got);
            assert_bits(label, t.modulate.name, &format!("[{m}, {d}]"), &got, &want);
            let mut got = vec![f32::NAN; m * d];
            (t.gated_residual.run)(&x, &y, m, d, &scale, &mut got);
            assert_bits(
                label,
                t.gated_residual.name,
                &format!("[{m}, {d}]"),
                &got,
                &want_g,
            );
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let t = best();
    let mut rng = Rng(0x7777_0000_1111_2222);
    let (m, d) = (300, 77);
    let x = rng.vec(m * d);
    let y = rng.vec(m * d);
    let b = rng.vec(d);
    let run_all = || {
        let mut o = vec![vec![0.0f32; m * d]; 4];
        (t.add.run)(&x, &b, &mut o[0]);
        (t.mul.run)(&x, &b, &mut o[1]);
        (t.modulate.run)(&x, m, d, &b, &y[..d], &mut o[2]);
        (t.gated_residual.run)(&x, &y, m, d, &b, &mut o[3]);
        o
    };
    let many = run_all();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool")
        .install(run_all);
    for (a, b) in many.iter().zip(&one) {
        assert_bits("best", "binary ops", "1 thread vs pool", a, b);
    }
}

/// The panic message of `f`, if it panics.
fn panic_message(f: impl FnOnce()) -> Option<String> {
    let err = catch_unwind(AssertUnwindSafe(f)).err()?;
    Some(match err.downcast::<String>() {
        Ok(s) => *s,
        Err(e) => e
            .downcast::<&str>()
            .map(|s| s.to_string())
            .unwrap_or_default(),
    })
}

#[test]
fn bad_shapes_panic_like_generic() {
    type Case = Box<dyn Fn(&edge_kernels::KernelTable)>;
    let cases: Vec<(&str, Case)> = vec![
        (
            "add b not dividing",
            Box::new(|t| (t.add.run)(&[0.0; 10], &[0.0; 3], &mut [0.0; 10])),
        ),
        (
            "add out length",
            Box::new(|t| (t.add.run)(&[0.0; 10], &[0.0; 5], &mut [0.0; 9])),
        ),
        (
            "mul empty b",
            Box::new(|t| (t.mul.run)(&[0.0; 4], &[], &mut [0.0; 4])),
        ),
        (
            "mul b longer than a",
            Box::new(|t| (t.mul.run)(&[0.0; 4], &[0.0; 8], &mut [0.0; 4])),
        ),
        (
            "modulate x",
            Box::new(|t| (t.modulate.run)(&[0.0; 11], 3, 4, &[0.0; 4], &[0.0; 4], &mut [0.0; 12])),
        ),
        (
            "modulate out",
            Box::new(|t| (t.modulate.run)(&[0.0; 12], 3, 4, &[0.0; 4], &[0.0; 4], &mut [0.0; 13])),
        ),
        (
            "modulate shift",
            Box::new(|t| (t.modulate.run)(&[0.0; 12], 3, 4, &[0.0; 3], &[0.0; 4], &mut [0.0; 12])),
        ),
        (
            "modulate scale",
            Box::new(|t| (t.modulate.run)(&[0.0; 12], 3, 4, &[0.0; 4], &[0.0; 5], &mut [0.0; 12])),
        ),
        (
            "gated_residual y",
            Box::new(|t| {
                (t.gated_residual.run)(&[0.0; 12], &[0.0; 10], 3, 4, &[0.0; 4], &mut [0.0; 12])
            }),
        ),
        (
            "gated_residual gate",
            Box::new(|t| {
                (t.gated_residual.run)(&[0.0; 12], &[0.0; 12], 3, 4, &[0.0; 1], &mut [0.0; 12])
            }),
        ),
    ];
    let g = edge_kernels::generic();
    for (what, case) in &cases {
        let want = panic_message(|| case(&g));
        assert!(want.is_some(), "generic accepts the bad case {what}");
        for (label, t) in variants() {
            let got = panic_message(|| case(&t));
            assert_eq!(got, want, "{label}: {what}");
        }
    }
}

#[test]
#[should_panic(
    expected = "add: b has 3 elements, which does not divide a's 10 (b must be a suffix of a's shape)"
)]
fn add_rejects_non_suffix_b() {
    let t = best();
    (t.add.run)(&[0.0; 10], &[0.0; 3], &mut [0.0; 10]);
}

#[test]
#[should_panic(expected = "gated_residual: gate has 2 elements, expected 4")]
fn gated_residual_rejects_wrong_gate() {
    let t = best();
    (t.gated_residual.run)(&[0.0; 8], &[0.0; 8], 2, 4, &[0.0; 2], &mut [0.0; 8]);
}
