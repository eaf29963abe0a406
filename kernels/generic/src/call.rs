//! The one place where a plan step's [`Op`] and its value shapes become kernel parameters.
//!
//! [`Call::decode`] turns an op, the shapes and types of its inputs and the shape of its output
//! into a [`Call`]: the kernel to run with every size it needs. The runtime decodes each step
//! of a plan once, when a session is created, and the hot loop only dispatches; the planner
//! sizes each step's scratch with [`Call::scratch_bytes`] of the same decoding, so the two can
//! never disagree. A CUDA or other executor dispatches on the same [`Call`]s.
//!
//! Shapes are outermost-first (PyTorch order), as the plan stores them. Decoding assumes the
//! schema verifier's shape checks passed; it still refuses (never panics on) a shape that is
//! too short for the op, naming the op.

use edge_schema::op::{Epilogue, Op};
use edge_schema::DType;

use crate::{AttentionParams, Conv2dParams, MAX_RANK};

/// A shape or permutation of rank ≤ [`MAX_RANK`] held inline, so that a decoded step owns no
/// heap memory for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axes {
    d: [usize; MAX_RANK],
    n: usize,
}

impl Axes {
    /// `values` as an inline list; `None` when there are more than [`MAX_RANK`].
    pub fn new(values: impl IntoIterator<Item = usize>) -> Option<Self> {
        let mut d = [0usize; MAX_RANK];
        let mut n = 0;
        for v in values {
            *d.get_mut(n)? = v;
            n += 1;
        }
        Some(Axes { d, n })
    }
}

impl std::ops::Deref for Axes {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.d[..self.n]
    }
}

/// One step's kernel call: which kernel, with every size and option it takes.
///
/// Operands are the step's inputs in the op's order ([`Op::arity`]); the output is written
/// whole. Sizes are in elements unless a field says bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// Rows of an embedding table `[rows, dim]` gathered by the ids of input 1.
    Embedding {
        rows: usize,
        dim: usize,
    },
    /// `out[m, n] = epilogue(x[m, k] · wᵀ (+ bias))`, `w` `[n, k]` of type `weight`.
    Linear {
        m: usize,
        k: usize,
        n: usize,
        weight: DType,
        bias: bool,
        epilogue: Epilogue,
    },
    /// RMS norm of `rows` rows of `dim`.
    RmsNorm {
        rows: usize,
        dim: usize,
        eps: f32,
    },
    /// Layer norm of `rows` rows of `dim`, with weight and bias when `affine`.
    LayerNorm {
        rows: usize,
        dim: usize,
        eps: f32,
        affine: bool,
    },
    /// Group norm of `[channels, hw]` in `groups` groups.
    GroupNorm {
        channels: usize,
        hw: usize,
        groups: usize,
        eps: f32,
    },
    /// `x·(1 + scale) + shift` with the rows `shift_row`, `scale_row` of input 1 (`dim` wide).
    Modulate {
        rows: usize,
        dim: usize,
        shift_row: usize,
        scale_row: usize,
    },
    /// `x + gate ⊙ y` with row `gate_row` of input 2 as the gate.
    GatedResidual {
        rows: usize,
        dim: usize,
        gate_row: usize,
    },
    Add,
    Mul,
    Scale {
        factor: f32,
    },
    Silu,
    Relu,
    Tanh,
    GeluTanh,
    /// Multi-head attention; input 2 is the key mask when `mask`, the next one the bias when
    /// `bias`; products in bf16 pairs when `bf16` (the table's `attention_bf16` slot).
    Attention {
        p: AttentionParams,
        mask: bool,
        bias: bool,
        bf16: bool,
    },
    /// 2-D convolution, weights of type `weight`.
    Conv2d {
        p: Conv2dParams,
        weight: DType,
        bias: bool,
    },
    /// `[channels, h, w]` → `[channels, 2h, 2w]`.
    UpsampleNearest2x {
        channels: usize,
        h: usize,
        w: usize,
    },
    /// `x.permute(perm)` of `x` with `shape`.
    Permute {
        shape: Axes,
        perm: Axes,
    },
    /// The input's bytes copied unchanged (a reshape into a slot of its own).
    Copy,
    /// `x.narrow(axis, start, len)` of `x` with `shape`.
    Slice {
        shape: Axes,
        axis: usize,
        start: usize,
        len: usize,
    },
    /// Concatenation as byte copies: the output is `outer` rows, each the inputs' chunks one
    /// after the other; `chunks[i]` is input `i`'s chunk in bytes (any element type).
    Concat {
        outer: usize,
        chunks: Vec<usize>,
    },
    /// An f32 row quantized (or converted) to `dtype`, written as bytes.
    Quantize {
        dtype: DType,
    },
    /// Rows `start..start + len` of a `[rows, …]` table of `dtype` (`row_bytes` each) widened
    /// to f32.
    Rows {
        dtype: DType,
        row_bytes: usize,
        start: usize,
        len: usize,
    },
    /// Sinusoidal embeddings of `dim` per timestep.
    TimestepEmbedding {
        dim: usize,
        flip_sin_to_cos: bool,
        downscale_freq_shift: f32,
        max_period: f32,
    },
    /// T5 relative position bias `[heads, lq, lk]` from a `[buckets, heads]` table.
    T5PositionBias {
        heads: usize,
        lq: usize,
        lk: usize,
        num_buckets: usize,
        max_distance: usize,
        bidirectional: bool,
    },
}

impl Call {
    /// Decodes `op` with inputs of `ins` (shape, type) and an output of shape `out`.
    ///
    /// # Errors
    /// A message naming the op when a shape is shorter than the op needs, a dimension is zero
    /// where it divides, or a rank exceeds [`MAX_RANK`]; the schema verifier refuses such
    /// plans first.
    pub fn decode(op: &Op, ins: &[(&[u64], DType)], out: &[u64]) -> Result<Call, String> {
        let name = op.name();
        let bad = |what: &str| format!("{name} step: {what}");
        let input = |i: usize| -> Result<(&[u64], DType), String> {
            ins.get(i)
                .copied()
                .ok_or_else(|| bad(&format!("input {i} missing")))
        };
        let dim = |s: &[u64], a: usize| -> Result<usize, String> {
            s.get(a)
                .map(|&v| v as usize)
                .ok_or_else(|| bad(&format!("shape {s:?} has no axis {a}")))
        };
        let last = |s: &[u64]| s.last().copied().unwrap_or(1) as usize;
        let numel = |s: &[u64]| s.iter().product::<u64>() as usize;
        // `rows` of a `[…, d]` value; `d` must not be zero.
        let rows_of = |s: &[u64]| -> Result<(usize, usize), String> {
            let d = last(s);
            if d == 0 {
                return Err(bad("last axis is empty"));
            }
            Ok((numel(s) / d, d))
        };
        let axes = |s: &[u64]| {
            Axes::new(s.iter().map(|&v| v as usize))
                .ok_or_else(|| bad(&format!("rank {} exceeds {MAX_RANK}", s.len())))
        };
        Ok(match op {
            Op::Embedding => {
                let (table, _) = input(0)?;
                Call::Embedding {
                    rows: dim(table, 0)?,
                    dim: last(table),
                }
            }
            Op::Linear { has_bias, epilogue } => {
                let (x, _) = input(0)?;
                let (w, weight) = input(1)?;
                let (m, k) = rows_of(x)?;
                Call::Linear {
                    m,
                    k,
                    n: dim(w, 0)?,
                    weight,
                    bias: *has_bias,
                    epilogue: *epilogue,
                }
            }
            Op::RmsNorm { eps } => {
                let (rows, dim) = rows_of(input(0)?.0)?;
                Call::RmsNorm {
                    rows,
                    dim,
                    eps: *eps,
                }
            }
            Op::LayerNorm { eps, affine } => {
                let (rows, dim) = rows_of(input(0)?.0)?;
                Call::LayerNorm {
                    rows,
                    dim,
                    eps: *eps,
                    affine: *affine,
                }
            }
            Op::GroupNorm { groups, eps } => {
                let x = input(0)?.0;
                Call::GroupNorm {
                    channels: dim(x, 0)?,
                    hw: dim(x, 1)? * dim(x, 2)?,
                    groups: *groups as usize,
                    eps: *eps,
                }
            }
            Op::Modulate {
                shift_row,
                scale_row,
            } => {
                let (rows, dim) = rows_of(input(0)?.0)?;
                Call::Modulate {
                    rows,
                    dim,
                    shift_row: *shift_row as usize,
                    scale_row: *scale_row as usize,
                }
            }
            Op::GatedResidual { gate_row } => {
                let (rows, dim) = rows_of(input(0)?.0)?;
                Call::GatedResidual {
                    rows,
                    dim,
                    gate_row: *gate_row as usize,
                }
            }
            Op::Add => Call::Add,
            Op::Mul => Call::Mul,
            Op::Scale { factor } => Call::Scale { factor: *factor },
            Op::Silu => Call::Silu,
            Op::Relu => Call::Relu,
            Op::Tanh => Call::Tanh,
            Op::GeluTanh => Call::GeluTanh,
            Op::Attention {
                heads,
                head_dim,
                scale,
                q_offset,
                k_offset,
                v_offset,
                has_mask,
                masked_value,
                has_bias,
                bf16_products,
            } => {
                let (q, kv) = (input(0)?.0, input(1)?.0);
                Call::Attention {
                    p: AttentionParams {
                        lq: dim(q, 0)?,
                        lk: dim(kv, 0)?,
                        heads: *heads as usize,
                        head_dim: *head_dim as usize,
                        scale: *scale,
                        q_stride: dim(q, 1)?,
                        q_offset: *q_offset as usize,
                        kv_stride: dim(kv, 1)?,
                        k_offset: *k_offset as usize,
                        v_offset: *v_offset as usize,
                        masked_value: *masked_value,
                    },
                    mask: *has_mask,
                    bias: *has_bias,
                    bf16: *bf16_products,
                }
            }
            Op::Conv2d {
                stride,
                pad,
                has_bias,
            } => {
                let x = input(0)?.0;
                let (w, weight) = input(1)?;
                Call::Conv2d {
                    p: Conv2dParams {
                        cin: dim(x, 0)?,
                        h: dim(x, 1)?,
                        w: dim(x, 2)?,
                        cout: dim(w, 0)?,
                        kh: dim(w, 2)?,
                        kw: dim(w, 3)?,
                        stride_h: stride[0] as usize,
                        stride_w: stride[1] as usize,
                        pad_top: pad[0] as usize,
                        pad_bottom: pad[1] as usize,
                        pad_left: pad[2] as usize,
                        pad_right: pad[3] as usize,
                    },
                    weight,
                    bias: *has_bias,
                }
            }
            Op::UpsampleNearest2x => {
                let x = input(0)?.0;
                Call::UpsampleNearest2x {
                    channels: dim(x, 0)?,
                    h: dim(x, 1)?,
                    w: dim(x, 2)?,
                }
            }
            Op::Permute { perm } => Call::Permute {
                shape: axes(input(0)?.0)?,
                perm: Axes::new(perm.iter().map(|&a| usize::from(a)))
                    .ok_or_else(|| bad("permutation too long"))?,
            },
            Op::Reshape => Call::Copy,
            Op::Slice { axis, start, len } => Call::Slice {
                shape: axes(input(0)?.0)?,
                axis: usize::from(*axis),
                start: *start as usize,
                len: *len as usize,
            },
            Op::Concat { axis } => {
                let a = usize::from(*axis);
                let (first, _) = input(0)?;
                if a >= first.len() {
                    return Err(bad(&format!("axis {a} of a rank-{} value", first.len())));
                }
                let outer = numel(&first[..a]);
                let chunks = ins
                    .iter()
                    .map(|&(s, d)| {
                        let elems = numel(s.get(a..).unwrap_or(&[]));
                        d.bytes_for(elems as u64)
                            .map(|b| b as usize)
                            .ok_or_else(|| bad(&format!("{elems} values of {d:?}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Call::Concat { outer, chunks }
            }
            Op::Quantize { dtype } => Call::Quantize { dtype: *dtype },
            Op::Rows { start, len } => {
                let (table, dtype) = input(0)?;
                let row_bytes = dtype
                    .bytes_for(dim(table, 1)? as u64)
                    .ok_or_else(|| bad("row size"))? as usize;
                Call::Rows {
                    dtype,
                    row_bytes,
                    start: *start as usize,
                    len: *len as usize,
                }
            }
            Op::TimestepEmbedding {
                flip_sin_to_cos,
                downscale_freq_shift,
                max_period,
            } => Call::TimestepEmbedding {
                dim: last(out),
                flip_sin_to_cos: *flip_sin_to_cos,
                downscale_freq_shift: *downscale_freq_shift,
                max_period: *max_period,
            },
            Op::T5PositionBias {
                num_buckets,
                max_distance,
                bidirectional,
            } => Call::T5PositionBias {
                heads: dim(out, 0)?,
                lq: dim(out, 1)?,
                lk: dim(out, 2)?,
                num_buckets: *num_buckets as usize,
                max_distance: *max_distance as usize,
                bidirectional: *bidirectional,
            },
        })
    }

    /// Bytes of arena scratch the generic kernel of this call needs (every twin needs at most
    /// as much): [`crate::linear_scratch_bytes`], [`crate::conv2d_scratch_bytes`], else 0.
    pub fn scratch_bytes(&self) -> usize {
        match self {
            Call::Linear { m, k, weight, .. } => crate::linear_scratch_bytes(*weight, *m, *k),
            Call::Conv2d { p, weight, .. } => crate::conv2d_scratch_bytes(p, *weight),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_rows_and_scratch_come_from_the_shapes() {
        let x: &[u64] = &[2, 3, 64];
        let w: &[u64] = &[10, 64];
        let c = Call::decode(
            &Op::Linear {
                has_bias: false,
                epilogue: Epilogue::GeluTanh,
            },
            &[(x, DType::F32), (w, DType::Q8_0)],
            &[2, 3, 10],
        )
        .unwrap();
        assert_eq!(
            c,
            Call::Linear {
                m: 6,
                k: 64,
                n: 10,
                weight: DType::Q8_0,
                bias: false,
                epilogue: Epilogue::GeluTanh,
            }
        );
        assert_eq!(
            c.scratch_bytes(),
            crate::linear_scratch_bytes(DType::Q8_0, 6, 64)
        );
    }

    #[test]
    fn concat_chunks_are_bytes_per_outer_row() {
        let a: &[u64] = &[2, 3, 4];
        let b: &[u64] = &[2, 5, 4];
        let c = Call::decode(
            &Op::Concat { axis: 1 },
            &[(a, DType::F32), (b, DType::F32)],
            &[2, 8, 4],
        )
        .unwrap();
        assert_eq!(
            c,
            Call::Concat {
                outer: 2,
                chunks: vec![48, 80]
            }
        );
    }

    #[test]
    fn short_shapes_are_refused_by_name() {
        let x: &[u64] = &[4];
        let e = Call::decode(
            &Op::GroupNorm {
                groups: 2,
                eps: 1e-6,
            },
            &[(x, DType::F32)],
            x,
        )
        .unwrap_err();
        assert!(e.contains("group_norm") && e.contains("axis 1"), "{e}");
        let long: &[u64] = &[1; 7];
        let e = Call::decode(
            &Op::Permute { perm: vec![0; 7] },
            &[(long, DType::F32)],
            long,
        )
        .unwrap_err();
        assert!(e.contains("rank 7"), "{e}");
    }
}
