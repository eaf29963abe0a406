//! The T5 v1.1 encoder (transformers 5 `T5EncoderModel`: `T5Stack`, `T5Block`,
//! `T5LayerSelfAttention`, `T5LayerFF` with `T5DenseGatedActDense`).
//!
//! Numerics that differ from a textbook transformer: RMSNorm without mean or bias
//! (`T5LayerNorm`); attention scores are **not** scaled by `1/sqrt(d_kv)`; the relative position
//! bias is computed once from block 0's table and reused by every block; padded keys get
//! `finfo(float32).min` added to their scores; the FF is `wo(gelu_tanh(wi_0 x) · wi_1 x)`.

use edge_graph::schema::op::Op;
use edge_graph::schema::DType;
use edge_graph::{Graph, WeightKind};

use crate::config::T5Config;
use crate::util::{linear, linear_fused, linear_gelu};
use crate::ModelError;

const MODEL: &str = "T5EncoderModel";

/// Builds the T5 encoder for a fixed sequence length (batch 1).
///
/// Inputs, in order: `ids [seq_len]` (I32 token ids, `< vocab_size`), `mask [seq_len]` (F32,
/// 1 = token, 0 = padding). Output: `hidden [seq_len, d_model]`, the final-norm states
/// (`last_hidden_state`; padded rows are computed, not zeroed).
///
/// Weights use the transformers checkpoint names (`shared.weight`,
/// `encoder.block.N.layer.0.SelfAttention.{q,k,v,o}.weight`, …); q, k and v are fused into
/// one row-concatenated matrix. Cuts: `encoder.block.N` before each block, `encoder.final`
/// before the final norm.
///
/// Errors: [`ModelError::Size`] for `seq_len == 0`; graph errors for inconsistent sizes.
pub fn build_t5_encoder(cfg: &T5Config, seq_len: usize) -> Result<Graph, ModelError> {
    if seq_len == 0 {
        return Err(ModelError::Size {
            model: MODEL,
            msg: "sequence length must be at least 1".into(),
        });
    }
    let d = cfg.d_model;
    let inner = cfg.inner_dim();
    let heads = cfg.num_heads;
    let eps = cfg.layer_norm_epsilon;
    let mut g = Graph::new("t5_encoder");
    let ids = g.input("ids", &[seq_len], DType::I32);
    let mask = g.input("mask", &[seq_len], DType::F32);

    let table = g.weight("shared.weight", &[cfg.vocab_size, d], WeightKind::Embedding)?;
    let mut x = g.op("embed_tokens", Op::Embedding, &[table, ids])?;
    let rel = g.weight(
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        &[cfg.relative_attention_num_buckets, heads],
        WeightKind::Table,
    )?;
    let position_bias = g.op_shaped(
        "position_bias",
        Op::T5PositionBias {
            num_buckets: cfg.relative_attention_num_buckets as u32,
            max_distance: cfg.relative_attention_max_distance as u32,
            bidirectional: true,
        },
        &[rel],
        &[heads, seq_len, seq_len],
    )?;

    for n in 0..cfg.num_layers {
        let p = format!("encoder.block.{n}");
        g.cut(p.clone());

        let sa = format!("{p}.layer.0.SelfAttention");
        let nw = g.weight(
            &format!("{p}.layer.0.layer_norm.weight"),
            &[d],
            WeightKind::Vector,
        )?;
        let h = g.op(
            &format!("{p}.layer.0.layer_norm"),
            Op::RmsNorm { eps },
            &[x, nw],
        )?;
        let qkv_parts = ["q", "k", "v"].map(|s| format!("{sa}.{s}"));
        let qkv = linear_fused(&mut g, h, &format!("{sa}.qkv"), &qkv_parts, inner, d, false)?;
        let attn = g.op(
            &format!("{sa}.attention"),
            Op::Attention {
                heads: heads as u32,
                head_dim: cfg.d_kv as u32,
                scale: 1.0,
                q_offset: 0,
                k_offset: inner as u32,
                v_offset: 2 * inner as u32,
                has_mask: true,
                masked_value: f32::MIN,
                has_bias: true,
                bf16_products: false,
            },
            &[qkv, qkv, mask, position_bias],
        )?;
        let o = linear(&mut g, attn, &format!("{sa}.o"), d, inner, false)?;
        x = g.op(&format!("{p}.layer.0.residual"), Op::Add, &[x, o])?;

        // A finer cut between the attention and the feed-forward halves: a segment is then at
        // most one half of a block (T5-XXL q8_0: ~70 MB attention, ~135 MB feed-forward), so a
        // tight budget streams halves instead of whole 205 MB blocks.
        g.cut(format!("{p}.layer.1"));
        let ff = format!("{p}.layer.1.DenseReluDense");
        let nw = g.weight(
            &format!("{p}.layer.1.layer_norm.weight"),
            &[d],
            WeightKind::Vector,
        )?;
        let h = g.op(
            &format!("{p}.layer.1.layer_norm"),
            Op::RmsNorm { eps },
            &[x, nw],
        )?;
        let gate = linear_gelu(
            &mut g,
            h,
            &format!("{ff}.wi_0"),
            &format!("{ff}.wi_0+act"),
            cfg.d_ff,
            d,
            false,
        )?;
        let lin = linear(&mut g, h, &format!("{ff}.wi_1"), cfg.d_ff, d, false)?;
        let prod = g.op(&format!("{ff}.gated"), Op::Mul, &[gate, lin])?;
        let out = linear(&mut g, prod, &format!("{ff}.wo"), d, cfg.d_ff, false)?;
        x = g.op(&format!("{p}.layer.1.residual"), Op::Add, &[x, out])?;
    }

    g.cut("encoder.final");
    let nw = g.weight("encoder.final_layer_norm.weight", &[d], WeightKind::Vector)?;
    let hidden = g.op("hidden", Op::RmsNorm { eps }, &[x, nw])?;
    g.output(hidden);
    Ok(g)
}
