//! `attention` of every table variant against the generic kernel [`edge_kernels::attention`].
//!
//! The NEON step plugs into the generic online-softmax driver and keeps every operation of the
//! generic step in lanes (`q·k` and `acc = fma(w, v, acc)` in order, the generic `exp`
//! polynomial, `tile_sum`), so the outputs must be bit-identical; the tolerance model below is
//! kept as a second, weaker check of the reference's own accuracy.
//!
//! Bound (both kernels against each other, per output element `(i, h, t)`, `u = 2⁻²⁴`, `p` the
//! exact softmax of the row, `V = max |v|`):
//! `|neon − generic| ≤ V · (2·Σ_j p_j·ε_j + (5·lk + 8·tiles + 8)·u) + 1e-30` with
//! `ε_j = Δs_j + 2u·|s_j − max s| + 16u + 4u·tiles`.

mod common;
use common::{best, Rng};

use std::panic::{catch_unwind, AssertUnwindSafe};

use edge_kernels::{AttentionParams, KernelTable};
use edge_kernels_neon::variants;

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Key masks: none, random keep/drop, every key dropped; with PixArt's −10000 or T5's
/// `f32::MIN`.
#[derive(Clone, Copy, Debug)]
enum MaskKind {
    None,
    Random(f32),
    AllMasked(f32),
}

/// One test problem: parameters and buffers.
struct Problem {
    p: AttentionParams,
    q_src: Vec<f32>,
    kv_src: Vec<f32>,
    mask: Option<Vec<f32>>,
    bias: Option<Vec<f32>>,
}

impl Problem {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rng: &mut Rng,
        lq: usize,
        lk: usize,
        heads: usize,
        hd: usize,
        fused: bool,
        t5_scale: bool,
        mask: MaskKind,
        with_bias: bool,
    ) -> Problem {
        let width = heads * hd;
        // Scores up to about ±30: with scale 1/√hd and |q|, |k| ≤ 5.5 the scaled dot products
        // have a standard deviation of 10; the T5 case (scale 1) uses |q|, |k| ≤ 5.5/hd^¼.
        let (scale, amp) = if t5_scale {
            (1.0, 5.5 / (hd as f32).powf(0.25))
        } else {
            (1.0 / (hd as f32).sqrt(), 5.5)
        };
        let masked_value = match mask {
            MaskKind::None => -10000.0,
            MaskKind::Random(v) | MaskKind::AllMasked(v) => v,
        };
        let (p, q_src, kv_src) = if fused {
            let rows = lq.max(lk);
            let mut buf = vec![0.0f32; rows * 3 * width];
            for row in buf.chunks_mut(3 * width) {
                row[..2 * width].copy_from_slice(&rng.vec(2 * width, amp));
                row[2 * width..].copy_from_slice(&rng.vec(width, 2.0));
            }
            let p = AttentionParams {
                lq,
                lk,
                heads,
                head_dim: hd,
                scale,
                q_stride: 3 * width,
                q_offset: 0,
                kv_stride: 3 * width,
                k_offset: width,
                v_offset: 2 * width,
                masked_value,
            };
            (p, buf.clone(), buf)
        } else {
            // Separate sources with padding; values before keys in the kv rows.
            let q_stride = width + 5;
            let kv_stride = 2 * width + 3;
            let q_src = rng.vec((lq.max(1) - 1) * q_stride + 2 + width, amp);
            let mut kv_src = vec![0.0f32; lk * kv_stride];
            for row in kv_src.chunks_mut(kv_stride) {
                row[1..1 + width].copy_from_slice(&rng.vec(width, 2.0));
                row[width + 2..2 * width + 2].copy_from_slice(&rng.vec(width, amp));
            }
            let p = AttentionParams {
                lq,
                lk,
                heads,
                head_dim: hd,
                scale,
                q_stride,
                q_offset: 2,
                kv_stride,
                k_offset: width + 2,
                v_offset: 1,
                masked_value,
            };
            (p, q_src, kv_src)
        };
        let mask = match mask {
            MaskKind::None => None,
            MaskKind::Random(_) => Some(
                (0..lk)
                    .map(|_| if rng.next_f32() < 0.4 { 1.0 } else { 0.0 })
                    .collect(),
            ),
            MaskKind::AllMasked(_) => Some(vec![0.0; lk]),
        };
        let bias = with_bias.then(|| rng.vec(heads * lq * lk, 8.0));
        Problem {
            p,
            q_src,
            kv_src,
            mask,
            bias,
        }
    }

    fn run(&self, t: &KernelTable) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.p.lq * self.p.heads * self.p.head_dim];
        (t.attention.run)(
            &self.p,
            &self.q_src,
            &self.kv_src,
            self.mask.as_deref(),
            self.bias.as_deref(),
            &mut out,
        );
        out
    }

    fn q(&self, i: usize, h: usize) -> &[f32] {
        let p = &self.p;
        &self.q_src[i * p.q_stride + p.q_offset + h * p.head_dim..][..p.head_dim]
    }

    fn k(&self, j: usize, h: usize) -> &[f32] {
        let p = &self.p;
        &self.kv_src[j * p.kv_stride + p.k_offset + h * p.head_dim..][..p.head_dim]
    }

    fn v(&self, j: usize, h: usize) -> &[f32] {
        let p = &self.p;
        &self.kv_src[j * p.kv_stride + p.v_offset + h * p.head_dim..][..p.head_dim]
    }

    /// `(tolerance, fully masked)` for row `i`, head `h` (see the module doc).
    fn tolerance(&self, i: usize, h: usize) -> (f64, bool) {
        let p = &self.p;
        let hd = p.head_dim;
        let q = self.q(i, h);
        let scale = p.scale as f64;
        let mut s = vec![0.0f64; p.lk];
        let mut ds = vec![0.0f64; p.lk];
        let mut fully_masked = self.mask.is_some();
        for j in 0..p.lk {
            let k = self.k(j, h);
            let dot: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
            let abs: f64 = q
                .iter()
                .zip(k)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let x1 = scale * dot;
            let b = self
                .bias
                .as_ref()
                .map_or(0.0, |b| b[(h * p.lq + i) * p.lk + j] as f64);
            let x2 = x1 + b;
            let keep = self.mask.as_ref().map_or(1.0, |m| m[j] as f64);
            let x3 = x2 + (1.0 - keep) * p.masked_value as f64;
            if keep != 0.0 {
                fully_masked = false;
            }
            s[j] = x3;
            ds[j] = if keep == 0.0 && p.masked_value == f32::MIN {
                0.0
            } else {
                2.0 * (hd as f64 + 3.0) * U * scale * abs
                    + 2.0 * U * (x1.abs() + x2.abs() + x3.abs())
            };
        }
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
        let total: f64 = w.iter().sum();
        let tiles = p.lk.div_ceil(64) as f64;
        let mut weighted = 0.0;
        for j in 0..p.lk {
            let eps = ds[j] + 2.0 * U * (s[j] - m).abs() + 16.0 * U + 4.0 * U * tiles;
            weighted += w[j] / total * eps;
        }
        let vmax = (0..p.lk)
            .flat_map(|j| self.v(j, h).iter())
            .fold(0.0f64, |a, &x| a.max(x.abs() as f64));
        let tol = vmax * (2.0 * weighted + (5.0 * p.lk as f64 + 8.0 * tiles + 8.0) * U) + 1e-30;
        (tol, fully_masked)
    }

    fn vmax(&self, h: usize) -> f64 {
        (0..self.p.lk)
            .flat_map(|j| self.v(j, h).iter())
            .fold(0.0f64, |a, &x| a.max(x.abs() as f64))
    }
}

/// Largest `|neon − generic| / max|v|` seen, over rows not fully masked and fully masked.
#[derive(Default)]
struct Worst {
    partial: f64,
    full: f64,
    /// Largest `|neon − generic| / tol`.
    of_tol: f64,
}

fn compare(label: &str, t: &KernelTable, pr: &Problem, want: &[f32], worst: &mut Worst) {
    let got = pr.run(t);
    let p = &pr.p;
    let hd = p.head_dim;
    let width = p.heads * hd;
    for i in 0..p.lq {
        for h in 0..p.heads {
            let (tol, fully_masked) = pr.tolerance(i, h);
            let vmax = pr.vmax(h);
            for e in 0..hd {
                let idx = i * width + h * hd + e;
                let (g, w) = (got[idx], want[idx]);
                assert!(
                    !g.is_nan() || w.is_nan(),
                    "{label} {}: NaN at row {i} head {h} elem {e} for {p:?}",
                    t.attention.name
                );
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{label} {}: row {i} head {h} elem {e}: {g} vs generic {w} for {p:?}",
                    t.attention.name
                );
                let diff = (g as f64 - w as f64).abs();
                let rel = diff / vmax.max(1e-30);
                if fully_masked {
                    worst.full = worst.full.max(rel);
                } else {
                    worst.partial = worst.partial.max(rel);
                    assert!(
                        rel <= 1e-5,
                        "{label} {}: row {i} head {h} elem {e}: {g} vs generic {w}, \
                         {rel:e}·max|v| > 1e-5 for {p:?}",
                        t.attention.name
                    );
                }
                worst.of_tol = worst.of_tol.max(diff / tol);
                assert!(
                    diff <= tol,
                    "{label} {}: row {i} head {h} elem {e}: {g} vs generic {w}, diff {diff:e} > \
                     tol {tol:e} for {p:?}",
                    t.attention.name
                );
            }
        }
    }
}

#[test]
fn attention_matches_generic_on_ragged_shapes() {
    let g = edge_kernels::generic();
    let vars = variants();
    let mut rng = Rng(0xa77e_4710_0000_0001);
    let masks = [
        MaskKind::None,
        MaskKind::Random(-10000.0),
        MaskKind::Random(f32::MIN),
        MaskKind::AllMasked(-10000.0),
        MaskKind::AllMasked(f32::MIN),
    ];
    let mut worst = Worst::default();
    let mut case = 0usize;
    for hd in [1, 3, 8, 17, 64, 72] {
        for lq in [1, 3, 5, 9] {
            for lk in [1, 7, 64, 65, 130] {
                for heads in [1, 2, 3] {
                    case += 1;
                    let fused = case.is_multiple_of(2);
                    let t5_scale = case.is_multiple_of(3);
                    for (mi, &mask) in masks.iter().enumerate() {
                        for with_bias in [false, true] {
                            // Keep the run time reasonable under qemu: every mask kind with
                            // and without bias on a rotating subset of the shapes.
                            if !(case + mi + with_bias as usize).is_multiple_of(3) && mi != 0 {
                                continue;
                            }
                            let pr = Problem::new(
                                &mut rng, lq, lk, heads, hd, fused, t5_scale, mask, with_bias,
                            );
                            let want = pr.run(&g);
                            for (label, t) in &vars {
                                compare(label, t, &pr, &want, &mut worst);
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "attention: largest |neon − generic| / max|v|: {:e} (rows with a kept key), {:e} (fully \
         masked rows); largest fraction of the bound used: {:.3}",
        worst.partial, worst.full, worst.of_tol
    );
}

#[test]
fn attention_pixart_shapes_match_generic() {
    // Self-attention on a fused qkv of 16 heads × 72 and cross-attention with −10000 masking,
    // enough rows for several tasks and keys for several tiles.
    let g = edge_kernels::generic();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut worst = Worst::default();
    for (lq, lk, heads, hd, fused, mask) in [
        (37, 200, 4, 72, true, MaskKind::None),
        (37, 120, 4, 72, false, MaskKind::Random(-10000.0)),
        (21, 300, 2, 64, false, MaskKind::Random(f32::MIN)),
    ] {
        let pr = Problem::new(&mut rng, lq, lk, heads, hd, fused, false, mask, false);
        let want = pr.run(&g);
        for (label, t) in variants() {
            compare(label, &t, &pr, &want, &mut worst);
        }
    }
    eprintln!(
        "attention (PixArt shapes): largest |neon − generic| / max|v|: {:e}; largest fraction \
         of the bound used: {:.3}",
        worst.partial, worst.of_tol
    );
}

#[test]
fn attention_is_independent_of_thread_count() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let pr = Problem::new(
        &mut rng,
        23,
        150,
        3,
        17,
        true,
        false,
        MaskKind::Random(-10000.0),
        true,
    );
    for (label, t) in variants() {
        let many = pr.run(&t);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool")
            .install(|| pr.run(&t));
        for (a, b) in many.iter().zip(&one) {
            assert_eq!(a.to_bits(), b.to_bits(), "{label}: 1 thread vs pool");
        }
    }
}

#[test]
fn attention_empty_shapes() {
    let mut rng = Rng(5);
    for (label, t) in variants() {
        // lq = 0 and heads = 0: nothing to compute, out is empty.
        for (lq, heads) in [(0, 2), (3, 0)] {
            let pr = Problem::new(
                &mut rng,
                lq,
                5,
                heads,
                8,
                false,
                false,
                MaskKind::None,
                true,
            );
            assert!(pr.run(&t).is_empty(), "{label}");
        }
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
fn attention_bad_arguments_panic_like_generic() {
    let mut rng = Rng(77);
    // Separate sources: q_src is exactly as long as needed, kv_src one element longer.
    let base = Problem::new(&mut rng, 3, 5, 2, 8, false, false, MaskKind::None, false);
    let out_len = 3 * 16;
    type Mutate = fn(&mut AttentionParams, &mut Vec<f32>, &mut Vec<f32>, &mut usize);
    let cases: [(&str, Mutate, Option<usize>, Option<usize>); 8] = [
        ("head_dim 0", |p, _, _, _| p.head_dim = 0, None, None),
        (
            "head_dim too large",
            |p, _, _, _| p.head_dim = edge_kernels::MAX_HEAD_DIM + 1,
            None,
            None,
        ),
        ("lk 0", |p, _, _, _| p.lk = 0, None, None),
        ("out", |_, _, _, n| *n += 1, None, None),
        ("q_src", |_, q, _, _| q.truncate(q.len() - 1), None, None),
        (
            "kv_src",
            |_, _, kv, _| kv.truncate(kv.len() - 2),
            None,
            None,
        ),
        ("mask", |_, _, _, _| {}, Some(4), None),
        ("bias", |_, _, _, _| {}, None, Some(29)),
    ];
    let g = edge_kernels::generic();
    for (what, mutate, mask_len, bias_len) in cases {
        let mut p = base.p;
        let mut q = base.q_src.clone();
        let mut kv = base.kv_src.clone();
        let mut n = out_len;
        mutate(&mut p, &mut q, &mut kv, &mut n);
        let mask = mask_len.map(|l| vec![1.0f32; l]);
        let bias = bias_len.map(|l| vec![0.0f32; l]);
        let call = |t: &KernelTable| {
            let mut out = vec![0.0f32; n];
            (t.attention.run)(&p, &q, &kv, mask.as_deref(), bias.as_deref(), &mut out);
        };
        let want = panic_message(|| call(&g));
        assert!(want.is_some(), "generic accepts {what}");
        for (label, t) in variants() {
            assert_eq!(panic_message(|| call(&t)), want, "{label}: {what}");
        }
    }
}

#[test]
#[should_panic(expected = "attention: key_mask has 4 elements, expected lk = 5")]
fn attention_rejects_wrong_mask_length() {
    let mut rng = Rng(78);
    let pr = Problem::new(&mut rng, 2, 5, 1, 8, false, false, MaskKind::None, false);
    let mut out = vec![0.0f32; 2 * 8];
    (best().attention.run)(
        &pr.p,
        &pr.q_src,
        &pr.kv_src,
        Some(&[1.0; 4]),
        None,
        &mut out,
    );
}
