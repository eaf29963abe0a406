//! Flash-style attention against a materialized f64 softmax.

mod common;

use common::*;
use edge_kernels::{attention, visited_keys, AttentionParams};

fn reference(
    p: &AttentionParams,
    q: &[f32],
    kv: &[f32],
    mask: Option<&[f32]>,
    bias: Option<&[f32]>,
) -> Vec<f64> {
    let hd = p.head_dim;
    let mut out = vec![0.0; p.lq * p.heads * hd];
    for h in 0..p.heads {
        for i in 0..p.lq {
            let qi = &q[i * p.q_stride + p.q_offset + h * hd..][..hd];
            let mut s = vec![0.0f64; p.lk];
            for (j, sj) in s.iter_mut().enumerate() {
                let kj = &kv[j * p.kv_stride + p.k_offset + h * hd..][..hd];
                let dotp: f64 = qi
                    .iter()
                    .zip(kj)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                *sj = f64::from(p.scale) * dotp;
                if let Some(b) = bias {
                    *sj += f64::from(b[(h * p.lq + i) * p.lk + j]);
                }
                if let Some(m) = mask {
                    *sj += (1.0 - f64::from(m[j])) * f64::from(p.masked_value);
                }
            }
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let mut acc = 0.0;
                for j in 0..p.lk {
                    acc += e[j] / z * f64::from(kv[j * p.kv_stride + p.v_offset + h * hd + d]);
                }
                out[i * p.heads * hd + h * hd + d] = acc;
            }
        }
    }
    out
}

fn run(
    p: &AttentionParams,
    q: &[f32],
    kv: &[f32],
    mask: Option<&[f32]>,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; p.lq * p.heads * p.head_dim];
    attention(p, q, kv, mask, bias, &mut out);
    out
}

/// Separate q and fused kv `[lk, 2D]` (PixArt cross-attention layout).
fn cross_params(lq: usize, lk: usize, heads: usize, hd: usize) -> AttentionParams {
    let d = heads * hd;
    AttentionParams {
        lq,
        lk,
        heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        q_stride: d,
        q_offset: 0,
        kv_stride: 2 * d,
        k_offset: 0,
        v_offset: d,
        masked_value: -10000.0,
    }
}

#[test]
fn matches_materialized_softmax_on_ragged_sizes() {
    let mut rng = Rng::new(40);
    for hd in [1, 7, 16, 72] {
        for (lq, lk) in [(1, 1), (5, 3), (17, 65), (64, 64), (33, 130), (3, 300)] {
            let heads = if hd == 72 { 2 } else { 3 };
            let p = cross_params(lq, lk, heads, hd);
            let q = rng.vec(lq * heads * hd, 2.0);
            let kv = rng.vec(lk * 2 * heads * hd, 2.0);
            let mask: Vec<f32> = (0..lk)
                .map(|j| if j == 0 || rng.below(3) > 0 { 1.0 } else { 0.0 })
                .collect();
            let bias = rng.vec(heads * lq * lk, 1.0);
            for (m, b) in [
                (None, None),
                (Some(mask.as_slice()), None),
                (Some(mask.as_slice()), Some(bias.as_slice())),
            ] {
                let got = run(&p, &q, &kv, m, b);
                let want = reference(&p, &q, &kv, m, b);
                assert_close(
                    &format!(
                        "hd={hd} lq={lq} lk={lk} mask={} bias={}",
                        m.is_some(),
                        b.is_some()
                    ),
                    &got,
                    &want,
                    |_| 2e-5,
                );
            }
        }
    }
}

#[test]
fn fused_qkv_self_attention_in_place() {
    // [L, 3D] buffer: q at 0, k at D, v at 2D (one fused projection).
    let mut rng = Rng::new(41);
    let (l, heads, hd) = (70, 3, 16);
    let d = heads * hd;
    let qkv = rng.vec(l * 3 * d, 2.0);
    let p = AttentionParams {
        lq: l,
        lk: l,
        heads,
        head_dim: hd,
        scale: 0.25,
        q_stride: 3 * d,
        q_offset: 0,
        kv_stride: 3 * d,
        k_offset: d,
        v_offset: 2 * d,
        masked_value: 0.0,
    };
    let got = run(&p, &qkv, &qkv, None, None);
    assert_close(
        "fused qkv",
        &got,
        &reference(&p, &qkv, &qkv, None, None),
        |_| 2e-5,
    );
}

#[test]
fn t5_style_min_mask_with_bias_and_no_scale() {
    let mut rng = Rng::new(42);
    let (lq, lk, heads, hd) = (20, 20, 4, 8);
    let mut p = cross_params(lq, lk, heads, hd);
    p.scale = 1.0;
    p.masked_value = f32::MIN;
    let q = rng.vec(lq * heads * hd, 2.0);
    let kv = rng.vec(lk * 2 * heads * hd, 2.0);
    let mask: Vec<f32> = (0..lk).map(|j| if j < 7 { 1.0 } else { 0.0 }).collect();
    let bias = rng.vec(heads * lq * lk, 3.0);
    let got = run(&p, &q, &kv, Some(&mask), Some(&bias));
    assert_close(
        "t5",
        &got,
        &reference(&p, &q, &kv, Some(&mask), Some(&bias)),
        |_| 2e-5,
    );
    // Every key dropped: torch gives a softmax over equal (finite) scores, not NaN.
    let none = vec![0.0; lk];
    let got = run(&p, &q, &kv, Some(&none), None);
    assert!(got.iter().all(|v| v.is_finite()));
}

#[test]
fn keys_after_the_last_kept_one_are_not_visited() {
    assert_eq!(visited_keys(5, None), 5);
    assert_eq!(visited_keys(5, Some(&[1.0, 0.0, 1.0, 0.0, 0.0])), 3);
    assert_eq!(
        visited_keys(5, Some(&[0.0; 5])),
        5,
        "no key kept: all visited"
    );
    assert_eq!(visited_keys(3, Some(&[0.0, 0.0, 0.5, 0.0])), 3);
    // A 16-token prompt in a 300-token context (PixArt's cross-attention): the 284 padding
    // keys hold NaN here. Not visited, they cannot reach the output, which is bit for bit that
    // of the attention over the 16 prompt keys alone (their K/V rows only).
    let mut rng = Rng::new(44);
    let (lq, heads, hd, kept) = (9, 2, 72, 16);
    for lk in [16, 17, 64, 65, 300] {
        let p = cross_params(lq, lk, heads, hd);
        let q = rng.vec(lq * heads * hd, 2.0);
        let mut kv = rng.vec(lk * 2 * heads * hd, 2.0);
        kv[kept * 2 * heads * hd..].fill(f32::NAN);
        let mask: Vec<f32> = (0..lk).map(|j| f32::from(u8::from(j < kept))).collect();
        let got = run(&p, &q, &kv, Some(&mask), None);
        let short = cross_params(lq, kept, heads, hd);
        let want = run(&short, &q, &kv[..kept * 2 * heads * hd], None, None);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "lk={lk}: trailing masked keys changed the output"
        );
    }
}

#[test]
fn identical_for_any_thread_count() {
    let mut rng = Rng::new(43);
    let p = cross_params(37, 150, 3, 24);
    let q = rng.vec(37 * 72, 2.0);
    let kv = rng.vec(150 * 144, 2.0);
    let mask: Vec<f32> = (0..150).map(|j| (j % 5 != 0) as u8 as f32).collect();
    assert_thread_invariant("attention", || run(&p, &q, &kv, Some(&mask), None));
}

/// More query rows than one task of the compact state holds (512) on one thread, and uneven
/// shares on 2 and 3: every split gives the same bits.
#[test]
fn identical_for_any_thread_count_past_one_task() {
    let mut rng = Rng::new(47);
    let p = cross_params(1100, 70, 2, 12);
    let q = rng.vec(1100 * 24, 2.0);
    let kv = rng.vec(70 * 48, 2.0);
    assert_thread_invariant("attention", || run(&p, &q, &kv, None, None));
}

#[test]
#[should_panic(expected = "head_dim")]
fn rejects_too_large_head_dim() {
    let p = cross_params(1, 1, 1, 513);
    run(&p, &[0.0; 513], &[0.0; 1026], None, None);
}
