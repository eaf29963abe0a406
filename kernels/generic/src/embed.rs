//! Embedding tables and position encodings: timestep sinusoids, T5 relative position bias and
//! token embedding lookup.

use edge_schema::DType;
use rayon::prelude::*;

use edge_schema::plan::PackLayout;

use crate::weights::{convert_row, row_bytes, WeightRef};

/// `generic_timestep_embedding_f32`: diffusers `get_timestep_embedding` (embeddings.py) with
/// `scale = 1`, evaluated in f32 in torch's order:
/// `exponent_k = (−ln(max_period) as f32 · k) / (half − downscale_freq_shift)` for
/// `k < half = dim / 2`, `f_k = exp(exponent_k)`, `e = t · f_k`, row `= [sin e, cos e]`, or
/// `[cos e, sin e]` when `flip_sin_to_cos`, and one zero appended when `dim` is odd.
///
/// Shapes: `t` `[n]` (raw timesteps, e.g. 0…999), `out` `[n, dim]`.
pub fn timestep_embedding(
    t: &[f32],
    dim: usize,
    flip_sin_to_cos: bool,
    downscale_freq_shift: f32,
    max_period: f32,
    out: &mut [f32],
) {
    assert_eq!(
        out.len(),
        t.len() * dim,
        "timestep_embedding: out has {} elements, expected [{}, {dim}]",
        out.len(),
        t.len()
    );
    let half = dim / 2;
    // torch multiplies the f32 arange by the Python float −ln(max_period), converted to f32.
    let neg_log = -(f64::from(max_period).ln()) as f32;
    let denom = half as f32 - downscale_freq_shift;
    for (row, &tv) in out.chunks_mut(dim.max(1)).zip(t) {
        for k in 0..half {
            let exponent = (neg_log * k as f32) / denom;
            let e = tv * exponent.exp();
            let (s, c) = (e.sin(), e.cos());
            if flip_sin_to_cos {
                row[k] = c;
                row[half + k] = s;
            } else {
                row[k] = s;
                row[half + k] = c;
            }
        }
        if dim % 2 == 1 {
            row[dim - 1] = 0.0;
        }
    }
}

/// transformers `T5Attention._relative_position_bucket` (modeling_t5.py) for one relative
/// position `memory_position − query_position`.
///
/// Bidirectional: half of the buckets for positive offsets. Offsets below `max_exact =
/// num_buckets / 2` (of the halved count) get their own bucket; larger ones
/// `max_exact + trunc(ln(rel / max_exact) / ln(max_distance / max_exact) · (num_buckets −
/// max_exact))`, computed in f32 exactly as torch does (`ln(max_distance / max_exact)` is a
/// Python float rounded to f32), capped at `num_buckets − 1`.
pub fn t5_relative_position_bucket(
    relative_position: i32,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let mut nb = num_buckets as i64;
    let mut bucket: i64 = 0;
    let mut rel = i64::from(relative_position);
    if bidirectional {
        nb /= 2;
        if rel > 0 {
            bucket += nb;
        }
        rel = rel.abs();
    } else {
        rel = -rel.min(0);
    }
    let max_exact = nb / 2;
    if rel < max_exact {
        bucket += rel;
    } else {
        let log_ratio = ((max_distance as f64) / (max_exact as f64)).ln() as f32;
        let v = ((rel as f32) / (max_exact as f32)).ln() / log_ratio * ((nb - max_exact) as f32);
        // `.to(torch.long)` truncates toward zero.
        let large = (max_exact + v as i64).min(nb - 1);
        bucket += large;
    }
    bucket as usize
}

/// transformers `T5Attention.compute_bias(lq, lk)` without the batch axis:
/// `out[h, i, j] = table[bucket(j − i), h]`.
///
/// Shapes: `table` `[num_buckets, heads]` (the `relative_attention_bias` Embedding weight),
/// `out` `[heads, lq, lk]`.
pub fn t5_position_bias(
    table: &[f32],
    heads: usize,
    lq: usize,
    lk: usize,
    num_buckets: usize,
    max_distance: usize,
    bidirectional: bool,
    out: &mut [f32],
) {
    assert_eq!(
        table.len(),
        num_buckets * heads,
        "t5_position_bias: table has {} elements, expected [{num_buckets}, {heads}]",
        table.len()
    );
    assert_eq!(
        out.len(),
        heads * lq * lk,
        "t5_position_bias: out has {} elements, expected [{heads}, {lq}, {lk}]",
        out.len()
    );
    if out.is_empty() {
        return;
    }
    out.par_chunks_mut(lk).enumerate().for_each(|(hi, row)| {
        let (h, i) = (hi / lq, hi % lq);
        for (j, o) in row.iter_mut().enumerate() {
            let rel = j as i64 - i as i64;
            let rel = i32::try_from(rel).unwrap_or(if rel < 0 { i32::MIN } else { i32::MAX });
            let b = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance);
            *o = table[b * heads + h];
        }
    });
}

/// `generic_embedding_f32`: torch `nn.Embedding` lookup, `out[t, ..] = table[ids[t], ..]`.
///
/// Shapes: `table` `[v, d]` of type `F32`, `F16` or `BF16`; `ids` `[len]`; `out` `[len, d]`.
/// Panics with a message on an id outside `0..v` (the runtime validates ids before calling).
pub fn embedding(table: WeightRef<'_>, ids: &[i32], d: usize, out: &mut [f32]) {
    assert!(
        matches!(table.dtype, DType::F32 | DType::F16 | DType::BF16),
        "embedding: table of type {:?} is not supported (F32, F16, BF16)",
        table.dtype
    );
    assert_eq!(
        out.len(),
        ids.len() * d,
        "embedding: out has {} elements, expected [{}, {d}]",
        out.len(),
        ids.len()
    );
    assert_eq!(
        table.layout,
        PackLayout::RowMajor,
        "embedding: the table must be row-major"
    );
    let rb = row_bytes(table.dtype, d, "embedding table");
    if rb == 0 || ids.is_empty() {
        return;
    }
    assert_eq!(
        table.bytes.len() % rb,
        0,
        "embedding: table has {} bytes, not a whole number of rows of {d} {:?}",
        table.bytes.len(),
        table.dtype
    );
    let v = table.bytes.len() / rb;
    for (t, &id) in ids.iter().enumerate() {
        assert!(
            id >= 0 && (id as usize) < v,
            "embedding: id {id} at position {t} outside the vocabulary 0..{v}"
        );
    }
    for (row, &id) in out.chunks_mut(d).zip(ids) {
        let id = id as usize;
        convert_row(table.dtype, &table.bytes[id * rb..(id + 1) * rb], row);
    }
}
