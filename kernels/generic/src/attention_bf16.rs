//! `generic_attention_bf16_pairs`: attention whose two products (`q·k` and the weights times
//! the values) take the bf16-pair arithmetic of x86-64 `vdpbf16ps` ([`crate::bf16dot`]), which
//! this module defines for every CPU; a plan asks for it per attention op
//! (`Op::Attention::bf16_products`, `edgeplan compile --attention-products bf16`).
//!
//! **The arithmetic** (the f32 step of [`crate::generic_row_tile`] with two products
//! replaced; everything else, scores, maximum, `exp`, the running sum and the final division,
//! is the f32 one):
//! - `dot_j`: the query row and key `j` rounded to bf16 ([`round_bf16_daz`]: as the
//!   instruction that converts them, `vcvtneps2bf16`, a subnormal f32 reads as zero) and
//!   taken as channel pairs `(2s, 2s + 1)` (an odd `head_dim`'s last pair has a zero high half);
//!   from `+0.0`, one [`pair_step`] per pair `s` in increasing order.
//! - `acc ·= c` as in f32, then a subnormal result becomes a zero of its sign
//!   ([`flush_subnormal`]): `vdpbf16ps` reads a subnormal accumulator as zero (probed:
//!   `edge_kernels_x86`'s `vdpbf16ps_reads_a_subnormal_accumulator_as_zero`), where
//!   [`pair_step`] would add it exactly.
//! - For the tile's keys in pairs `(2t, 2t + 1)` from its first key (an odd tile's last pair
//!   has a zero second weight and value): the f32 weights `w_2t, w_2t+1` rounded to bf16 and,
//!   per head channel `d`, `acc[d] = pair_step(acc[d], (w_2t, w_2t+1), (v_2t[d], v_2t+1[d]))`
//!   (the values rounded to bf16). The running sum adds the f32 weights (unrounded), as
//!   FlashAttention-2 does.
//!
//! For finite, normal-range data each product is exact and each sum rounded once, as the f32
//! step's fused multiply-adds, of bf16-rounded operands (8 significant bits): the error is
//! that of rounding q, k, v and the weights, about 2⁻⁹ relative per operand, averaged over the
//! head (the tests bound it against the f32 step and diffusers). PyTorch's BF16 attention
//! rounds its inputs and outputs the same way and accumulates in f32.

use crate::attention::{
    attention_with, softmax_step, AttentionOps, BlockState, KeyTile, QueryBlock, RowState, KEY_TILE,
};
use crate::bf16dot::{pair_step, round_bf16};
use crate::params::AttentionParams;

/// The portable bf16 step: [`generic_row_tile_bf16`] for each row of the block, keys and values
/// packed in pairs.
pub const GENERIC_ATTENTION_BF16: AttentionOps = AttentionOps {
    name: "generic_attention_bf16_pairs",
    block_tile: generic_block_tile_bf16,
    block_tile_small: generic_block_tile_bf16,
    pack_keys: pack_key_pairs,
    pack_values: pack_value_pairs,
    phases_small: None,
};

/// [`crate::attention`]'s shapes and checks, with the products of the module doc (scalar:
/// slow; `edge_kernels_x86` has the `vdpbf16ps` twin).
pub fn attention_bf16(
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    attention_with(
        &GENERIC_ATTENTION_BF16,
        p,
        q_src,
        kv_src,
        key_mask,
        bias,
        out,
    )
}

/// `x` rounded to bf16 as `vcvtneps2bf16` / `vcvtne2ps2bf16` (AVX512_BF16) round it: a
/// subnormal f32 becomes a zero of its sign, anything else [`round_bf16`] (to nearest, ties to
/// even; NaN quiet). Probed against the instruction on random f32 of every exponent
/// (`edge_kernels_x86`'s `vcvtne2ps2bf16_is_round_bf16_daz`).
#[inline]
pub fn round_bf16_daz(x: f32) -> u16 {
    round_bf16(flush_subnormal(x))
}

/// `lo` and `hi` rounded by [`round_bf16_daz`] into one `u32`: `lo` in the low 16 bits (the
/// even element of a `vdpbf16ps` pair), `hi` in the high 16.
#[inline]
pub fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(round_bf16_daz(lo)) | (u32::from(round_bf16_daz(hi)) << 16)
}

/// `x`, or a zero of its sign where `x` is subnormal.
#[inline]
pub fn flush_subnormal(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// Element `i` of `v`, 0 past its end (the zero high half of an odd pair).
#[inline]
fn at(v: &[f32], i: usize) -> f32 {
    v.get(i).copied().unwrap_or(0.0)
}

/// Packs keys `j0 .. j0 + nk` of head `h` as bf16 channel pairs side by side:
/// `dst[s·KEY_TILE + c]` holds, as the bits of an f32 slot, [`pair`]`(k[2s], k[2s + 1])` of key
/// `j0 + c` for `s < ⌈head_dim/2⌉` (`k[head_dim] = 0`); lanes `nk..KEY_TILE` are zero.
/// `dst` holds at least `⌈head_dim/2⌉ · KEY_TILE` slots.
pub fn pack_key_pairs(
    p: &AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let hd = p.head_dim;
    let hp = hd.div_ceil(2);
    let dst = &mut dst[..hp * KEY_TILE];
    if nk < KEY_TILE {
        dst.fill(0.0);
    }
    for c in 0..nk {
        let key = p.key_row(kv_src, h, j0 + c);
        for s in 0..hp {
            dst[s * KEY_TILE + c] = f32::from_bits(pair(key[2 * s], at(key, 2 * s + 1)));
        }
    }
}

/// Packs the values of keys `j0 .. j0 + nk` of head `h` in key pairs: `dst[t·head_dim + d]`
/// holds, as the bits of an f32 slot, [`pair`]`(v_{j0+2t}[d], v_{j0+2t+1}[d])` for
/// `t < ⌈nk/2⌉` (the second value 0 past the tile), `[⌈nk/2⌉, head_dim]` outermost first.
pub fn pack_value_pairs(
    p: &AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let hd = p.head_dim;
    let value = |c: usize| p.value_row(kv_src, h, j0 + c);
    for (t, row) in dst[..nk.div_ceil(2) * hd].chunks_exact_mut(hd).enumerate() {
        let lo = value(2 * t);
        let hi = (2 * t + 1 < nk).then(|| value(2 * t + 1));
        for (d, o) in row.iter_mut().enumerate() {
            *o = f32::from_bits(pair(lo[d], hi.map_or(0.0, |v| v[d])));
        }
    }
}

fn generic_block_tile_bf16<const D: usize>(
    b: &QueryBlock<'_>,
    keys: &[f32],
    st: &mut BlockState<D>,
) {
    b.check_step(keys, st);
    for r in 0..b.nq {
        let t = b.row(r);
        let (mut row, scores) = st.row(r, b.p.head_dim);
        generic_row_tile_bf16(&t, keys, &mut row, scores);
    }
}

/// The step that defines the bf16 arithmetic (module doc), for one row: `keys` packed by
/// [`pack_key_pairs`], `t.values` by [`pack_value_pairs`].
pub fn generic_row_tile_bf16(
    t: &KeyTile<'_>,
    keys: &[f32],
    st: &mut RowState<'_>,
    scores: &mut [f32],
) {
    let hd = t.p.head_dim;
    let nk = t.nk;
    let mut dots = [0.0f32; KEY_TILE];
    for s in 0..hd.div_ceil(2) {
        let q = pair(t.q[2 * s], at(t.q, 2 * s + 1));
        for (a, k) in dots.iter_mut().zip(&keys[s * KEY_TILE..][..nk]) {
            *a = pair_step(*a, q, k.to_bits());
        }
    }
    let correction = softmax_step(t, &dots[..nk], st, scores);
    if correction != 1.0 {
        for x in st.acc.iter_mut() {
            *x = flush_subnormal(*x * correction);
        }
    }
    let w = &scores[..nk];
    for tp in 0..nk.div_ceil(2) {
        let wp = pair(w[2 * tp], at(w, 2 * tp + 1));
        for (x, v) in st.acc.iter_mut().zip(&t.values[tp * hd..][..hd]) {
            *x = pair_step(*x, wp, v.to_bits());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(lq: usize, lk: usize, heads: usize, hd: usize) -> AttentionParams {
        AttentionParams {
            lq,
            lk,
            heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            q_stride: heads * hd,
            q_offset: 0,
            kv_stride: 2 * heads * hd,
            k_offset: 0,
            v_offset: heads * hd,
            masked_value: -10000.0,
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// Against the f32 attention on ragged shapes (odd head dims and tiles, a mask): close, as
    /// bf16 operands allow, and not equal (the products are not the f32 ones).
    #[test]
    fn bf16_products_are_close_to_f32_and_differ() {
        for (lq, lk, heads, hd) in [(5, 1, 1, 3), (9, 65, 2, 72), (4, 130, 3, 8), (17, 64, 1, 9)] {
            let p = params(lq, lk, heads, hd);
            let q = values(lq * heads * hd, 1);
            let kv = values(lk * 2 * heads * hd, 2);
            let mask: Vec<f32> = (0..lk).map(|j| f32::from(j % 5 != 3)).collect();
            let mut a = vec![0f32; lq * heads * hd];
            let mut b = a.clone();
            crate::attention(&p, &q, &kv, Some(&mask), None, &mut a);
            attention_bf16(&p, &q, &kv, Some(&mask), None, &mut b);
            let num: f32 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
            let den: f32 = a.iter().map(|x| x * x).sum();
            let rel = (num / den).sqrt();
            assert!(rel < 2e-2, "{lq}x{lk}x{heads}x{hd}: relative L2 {rel:e}");
            assert!(
                a != b,
                "{lq}x{lk}x{heads}x{hd}: bf16 products gave the f32 bits"
            );
        }
    }

    /// Operands exact in bf16 whose products and sums are exact (multiples of 1/8 up to 1):
    /// the bf16 step's weights, maximum and sum are the f32 step's bit for bit, so its pairs
    /// take the channels of the right keys in the right order (an odd head and tile included).
    #[test]
    fn exact_operands_give_the_f32_weights() {
        for (hd, lk) in [(7, 61), (72, 64), (1, 3)] {
            let p = params(1, lk, 1, hd);
            let ints = |n: usize, seed: u32| -> Vec<f32> {
                values(n, seed)
                    .iter()
                    .map(|v| (v * 4.0).round() / 8.0)
                    .collect()
            };
            let q = ints(hd, 3);
            let kv = ints(lk * 2 * hd, 4);
            let run = |bf16: bool| {
                let mut keys = vec![0f32; hd * KEY_TILE];
                let mut vals = vec![0f32; lk * hd];
                let mut st: BlockState = BlockState::new();
                st.reset(hd);
                if bf16 {
                    pack_key_pairs(&p, &kv, 0, 0, lk, &mut keys);
                    pack_value_pairs(&p, &kv, 0, 0, lk, &mut vals);
                } else {
                    crate::pack_keys(&p, &kv, 0, 0, lk, &mut keys);
                    crate::pack_values(&p, &kv, 0, 0, lk, &mut vals);
                }
                let t = KeyTile {
                    p: &p,
                    q: &q,
                    kv_src: &kv,
                    values: &vals,
                    h: 0,
                    j0: 0,
                    nk: lk,
                    bias: None,
                    key_mask: None,
                };
                let (mut row, scores) = st.row(0, hd);
                if bf16 {
                    generic_row_tile_bf16(&t, &keys, &mut row, scores);
                } else {
                    crate::generic_row_tile(&t, &keys, &mut row, scores);
                }
                (st.scores[0], st.run_max[0], st.run_sum[0])
            };
            let (a, b) = (run(false), run(true));
            assert_eq!(
                a.0.map(f32::to_bits),
                b.0.map(f32::to_bits),
                "hd {hd}, lk {lk}"
            );
            assert_eq!((a.1, a.2), (b.1, b.2), "hd {hd}, lk {lk}");
        }
    }

    #[test]
    fn flush_subnormal_keeps_sign_and_normals() {
        let tiny = f32::from_bits(1);
        assert_eq!(flush_subnormal(tiny).to_bits(), 0);
        assert_eq!(flush_subnormal(-tiny).to_bits(), 0x8000_0000);
        assert_eq!(flush_subnormal(f32::MIN_POSITIVE), f32::MIN_POSITIVE);
        assert_eq!(flush_subnormal(-0.0).to_bits(), 0x8000_0000);
        assert!(flush_subnormal(f32::NAN).is_nan());
    }
}
