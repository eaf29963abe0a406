//! `generic_attention_f32`: multi-head scaled-dot-product attention, flash-attention style.

use rayon::prelude::*;

use crate::expf::exp_f32;
use crate::gemm::{F32Tile, GENERIC_TILE, MAX_TILE};

/// Largest supported `head_dim` (the stack accumulator size). The VAE mid-block attention is
/// single-head with `head_dim = channels` (512 in the SD VAE used by PixArt).
pub const MAX_HEAD_DIM: usize = 512;
/// Keys per tile of the online softmax.
pub const KEY_TILE: usize = 64;
/// Query rows per task (they share each key/value tile while it is in cache).
const QUERY_TILE: usize = 4;

/// Where queries, keys and values lie in their source buffers, and the score formula.
///
/// Query of head `h` at row `i`: `q_src[i·q_stride + q_offset + h·head_dim ..][..head_dim]`;
/// key of row `j`: `kv_src[j·kv_stride + k_offset + h·head_dim ..]`; value likewise with
/// `v_offset`. A fused qkv projection `[L, 3D]` is read in place with strides `3D` and offsets
/// `0, D, 2D`; a fused kv projection `[L, 2D]` with stride `2D` and offsets `0, D`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query rows.
    pub lq: usize,
    /// Key/value rows (≥ 1).
    pub lk: usize,
    /// Heads.
    pub heads: usize,
    /// Elements per head (1..=[`MAX_HEAD_DIM`]).
    pub head_dim: usize,
    /// Multiplier of `q·k` (`1/√head_dim` for PixArt and the VAE, 1.0 for T5).
    pub scale: f32,
    /// Elements between consecutive query rows of `q_src`.
    pub q_stride: usize,
    /// Offset of head 0 within a query row.
    pub q_offset: usize,
    /// Elements between consecutive rows of `kv_src`.
    pub kv_stride: usize,
    /// Offset of head 0's key within a `kv_src` row.
    pub k_offset: usize,
    /// Offset of head 0's value within a `kv_src` row.
    pub v_offset: usize,
    /// Added to the score of a dropped key, times `1 − mask[j]` (−10000 in PixArt's cross
    /// attention, `f32::MIN` in T5).
    pub masked_value: f32,
}

/// `generic_attention_f32`: for every head `h` and query row `i`,
/// `s_j = scale·(q·k_j) + bias[h, i, j] + (1 − key_mask[j])·masked_value`,
/// `out[i, h·head_dim ..][..head_dim] = Σ_j softmax(s)_j · v_j` (torch
/// `scaled_dot_product_attention` with an additive mask; T5Attention with its position bias).
///
/// Shapes: `key_mask` `[lk]` (1 keep, 0 drop), `bias` `[heads, lq, lk]`, `out`
/// `[lq, heads·head_dim]`; `q_src`/`kv_src` as described by [`AttentionParams`].
///
/// Keys are visited in tiles of 64 with an online softmax (running maximum and sum, rescaled
/// when the maximum grows; Milakov & Gimelshein 2018, FlashAttention): the `[lq, lk]` score
/// matrix is never stored and nothing is allocated. `q·k` is the crate's fixed-order dot
/// product ([`F32Tile`]) and `exp` is [`crate::expf::exp_f32`], so SIMD twins can match it bit
/// for bit. The order of every sum is fixed by the
/// tile size, so the result is identical for any thread count. Parallel over blocks of 4 query
/// rows (all heads of a row are in the same task because `out` rows interleave heads).
pub fn attention(
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    attention_with(&GENERIC_ATTENTION, p, q_src, kv_src, key_mask, bias, out)
}

/// The per-ISA pieces of the attention driver; the online softmax, its tiling and the order
/// of every scalar step stay in [`attention_with`]. Each piece must give exactly the bits of
/// the generic one (the SIMD twins are tested for it).
#[derive(Clone, Copy, Debug)]
pub struct AttentionOps {
    /// Name for logs.
    pub name: &'static str,
    /// `q·k` of one query row against `cols` keys, in the [`F32Tile`] order (called with a
    /// single row of `x`).
    pub scores: F32Tile,
    /// `s[j] = exp_f32(s[j])` in place ([`crate::expf::exp_f32`]).
    pub exp: fn(&mut [f32]),
    /// `acc[d] = acc[d] + w · v[d]` (unfused) for every `d`; equal lengths.
    pub axpy: fn(&mut [f32], f32, &[f32]),
    /// `acc[d] = acc[d] · c` for every `d`.
    pub scale: fn(&mut [f32], f32),
}

/// The portable pieces.
pub const GENERIC_ATTENTION: AttentionOps = AttentionOps {
    name: "generic_attention_f32",
    scores: GENERIC_TILE,
    exp: exp_slice,
    axpy,
    scale: scale_slice,
};

fn exp_slice(s: &mut [f32]) {
    for v in s {
        *v = exp_f32(*v);
    }
}

fn axpy(acc: &mut [f32], w: f32, v: &[f32]) {
    for (x, &vv) in acc.iter_mut().zip(v) {
        *x += w * vv;
    }
}

fn scale_slice(acc: &mut [f32], c: f32) {
    for x in acc {
        *x *= c;
    }
}

/// [`attention`] with the per-ISA pieces `ops`: same shapes, checks and bits for any `ops` that
/// honours the [`AttentionOps`] contract.
pub fn attention_with(
    ops: &AttentionOps,
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    assert!(
        (1..=MAX_TILE).contains(&ops.scores.cols),
        "attention: score tile {} has {} columns, outside 1..={MAX_TILE}",
        ops.scores.name,
        ops.scores.cols
    );
    crate::contract::attention(p, q_src, kv_src, key_mask, bias, out);
    let width = p.heads * p.head_dim;
    if p.lq == 0 || width == 0 {
        return;
    }
    out.par_chunks_mut(QUERY_TILE * width)
        .enumerate()
        .for_each(|(t, rows)| {
            let i0 = t * QUERY_TILE;
            for h in 0..p.heads {
                attend_rows(ops, p, q_src, kv_src, key_mask, bias, h, i0, rows);
            }
        });
}

/// Computes head `h` of the query rows `i0 .. i0 + rows.len() / width` into `rows`.
fn attend_rows(
    ops: &AttentionOps,
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    h: usize,
    i0: usize,
    rows: &mut [f32],
) {
    let hd = p.head_dim;
    let width = p.heads * hd;
    let nq = rows.len() / width;
    let mut acc = [[0.0f32; MAX_HEAD_DIM]; QUERY_TILE];
    let mut run_max = [f32::NEG_INFINITY; QUERY_TILE];
    let mut run_sum = [0.0f32; QUERY_TILE];
    let mut scores = [0.0f32; KEY_TILE];
    let q_at = |i: usize| &q_src[i * p.q_stride + p.q_offset + h * hd..][..hd];
    let k_at = |j: usize| &kv_src[j * p.kv_stride + p.k_offset + h * hd..][..hd];
    let v_at = |j: usize| &kv_src[j * p.kv_stride + p.v_offset + h * hd..][..hd];

    let tc = ops.scores.cols;
    let mut dots = [0.0f32; MAX_TILE];
    for j0 in (0..p.lk).step_by(KEY_TILE) {
        let nk = KEY_TILE.min(p.lk - j0);
        for r in 0..nq {
            let i = i0 + r;
            let q = [q_at(i)];
            let s = &mut scores[..nk];
            for c0 in (0..nk).step_by(tc) {
                let ks: [&[f32]; MAX_TILE] =
                    std::array::from_fn(|c| k_at(j0 + (c0 + c).min(nk - 1)));
                (ops.scores.run)(&q, &ks[..tc], hd, &mut dots[..tc]);
                for (c, sj) in s[c0..nk.min(c0 + tc)].iter_mut().enumerate() {
                    let j = j0 + c0 + c;
                    let mut v = p.scale * dots[c];
                    if let Some(b) = bias {
                        v += b[(h * p.lq + i) * p.lk + j];
                    }
                    if let Some(m) = key_mask {
                        v += (1.0 - m[j]) * p.masked_value;
                    }
                    *sj = v;
                }
            }
            let tile_max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let new_max = run_max[r].max(tile_max);
            let correction = exp_f32(run_max[r] - new_max);
            let a = &mut acc[r][..hd];
            if correction != 1.0 {
                (ops.scale)(a, correction);
            }
            let mut sum = run_sum[r] * correction;
            for sj in s.iter_mut() {
                *sj -= new_max;
            }
            (ops.exp)(s);
            for (jj, &w) in s.iter().enumerate() {
                sum += w;
                (ops.axpy)(a, w, v_at(j0 + jj));
            }
            run_sum[r] = sum;
            run_max[r] = new_max;
        }
    }
    for r in 0..nq {
        let inv = run_sum[r];
        let dst = &mut rows[r * width + h * hd..][..hd];
        for (o, &a) in dst.iter_mut().zip(&acc[r][..hd]) {
            *o = a / inv;
        }
    }
}
