//! Per-op time and work of the steps a session runs, for `edgerun bench`.
//!
//! When enabled ([`crate::Session::set_profiling`]), every step is timed with a monotonic clock
//! and charged to its stage kind and op name, with the arithmetic it performs (multiply-adds
//! ×2 for `linear`, `conv2d` and `attention`, from the step's static shapes). Nothing is
//! allocated per step: the table holds one row per (stage kind, op) pair, found by a short
//! linear search.

use std::time::Duration;

use edge_kernels::{Call, Conv2dParams};
use edge_schema::op::Op;
use edge_schema::plan::{PackLayout, Stage, StageKind, Step, Storage, TensorEntry};
use edge_schema::DType;

/// One (stage kind, op) row.
#[derive(Clone, Debug)]
pub struct OpStat {
    /// The stage kind the steps ran in.
    pub stage: StageKind,
    /// The op's name ([`Op::name`]; `conv2d winograd` for the Winograd convolutions).
    pub op: &'static str,
    /// For `linear` and `conv2d`: the weight type.
    pub weights: Option<DType>,
    /// `linear` steps whose `BF16` weight is in `PackLayout::Bf16Pairs16`, and `attention`
    /// steps marked `bf16_products`: bf16 products (`vdpbf16ps`'s arithmetic), a row apart from
    /// the same op's f32 products.
    pub bf16_products: bool,
    /// Steps run.
    pub calls: u64,
    /// Time spent in them.
    pub time: Duration,
    /// Floating-point (or integer multiply-add) operations, 2 per multiply-add; 0 for ops
    /// counted by bytes only.
    pub flops: f64,
    /// Bytes of output written.
    pub bytes_out: f64,
}

/// The table of [`OpStat`]s of a session.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Rows in first-seen order.
    pub rows: Vec<OpStat>,
}

fn shape(stage: &Stage, v: u32) -> &[u64] {
    &stage.values[v as usize].shape
}

fn numel(s: &[u64]) -> f64 {
    s.iter().product::<u64>() as f64
}

/// Operations (2 per multiply-add) of one step, from its static shapes.
pub fn step_flops(stage: &Stage, step: &Step) -> f64 {
    let ins = &step.inputs;
    match &step.op {
        Op::Linear { .. } => {
            let x = shape(stage, ins[0]);
            let w = shape(stage, ins[1]);
            2.0 * numel(x) * w[0] as f64
        }
        Op::Conv2d { .. } => {
            let w = shape(stage, ins[1]);
            let out = shape(stage, step.outputs[0]);
            match winograd(stage, step) {
                // 16 multiply-adds per 2×2 output tile and channel pair.
                Some(p) => {
                    let (oh, ow) = p.out_hw();
                    2.0 * 16.0 * (p.cout * p.cin * oh.div_ceil(2) * ow.div_ceil(2)) as f64
                }
                None => 2.0 * numel(out) * (w[1] * w[2] * w[3]) as f64,
            }
        }
        Op::Attention { .. } => {
            let out = shape(stage, step.outputs[0]);
            let kv = shape(stage, ins[1]);
            // q·k and w·v: 2 multiply-adds per (query, key, channel).
            4.0 * numel(out) * kv[0] as f64
        }
        _ => 0.0,
    }
}

/// The geometry of a `conv2d` step that the CPU kernels compute by Winograd F(2×2, 3×3)
/// ([`edge_kernels::winograd_applies`]), as the session decodes it ([`Call::decode`]).
fn winograd(stage: &Stage, step: &Step) -> Option<Conv2dParams> {
    if !matches!(step.op, Op::Conv2d { .. }) {
        return None;
    }
    let value = |&v: &u32| {
        let v = stage.values.get(v as usize)?;
        Some((v.shape.as_slice(), v.dtype))
    };
    // x, weight, bias: on the stack (nothing is allocated per step).
    let mut ins: [(&[u64], DType); 3] = [(&[], DType::F32); 3];
    for (slot, v) in ins.iter_mut().zip(&step.inputs) {
        *slot = value(v)?;
    }
    let n = step.inputs.len().min(3);
    let out = value(step.outputs.first()?)?.0;
    match Call::decode(&step.op, &ins[..n], out).ok()? {
        Call::Conv2d { p, .. } if edge_kernels::winograd_applies(&p) => Some(p),
        _ => None,
    }
}

impl Profile {
    /// Charges one step that took `time`. Winograd convolutions are a row of their own,
    /// `conv2d winograd`, their work the multiply-adds they do (16 per 2×2 output tile and
    /// channel pair, not the direct form's 36); so are products with a fused epilogue,
    /// `linear+gelu_tanh` (their work the product's, their time the epilogue's too).
    ///
    /// `tensors` are the plan's (for the layout of a step's weight).
    pub fn record(&mut self, stage: &Stage, step: &Step, tensors: &[TensorEntry], time: Duration) {
        let name = match winograd(stage, step) {
            Some(_) => "conv2d winograd",
            None => step.op.label(),
        };
        let weights: Option<DType> = match step.op {
            Op::Linear { .. } | Op::Conv2d { .. } => {
                Some(stage.values[step.inputs[1] as usize].dtype)
            }
            _ => None,
        };
        let bf16_pairs = matches!(step.op, Op::Linear { .. })
            && step
                .inputs
                .get(1)
                .and_then(|&v| stage.values.get(v as usize))
                .and_then(|v| match v.storage {
                    Storage::Weight(t) => tensors.get(t as usize),
                    _ => None,
                })
                .is_some_and(|t| t.layout == PackLayout::Bf16Pairs16);
        let bf16_products = bf16_pairs
            || matches!(
                step.op,
                Op::Attention {
                    bf16_products: true,
                    ..
                }
            );
        let bytes = numel(shape(stage, step.outputs[0])) * 4.0;
        let flops = step_flops(stage, step);
        match self.rows.iter_mut().find(|r| {
            r.op == name
                && r.stage == stage.kind
                && r.weights == weights
                && r.bf16_products == bf16_products
        }) {
            Some(r) => {
                r.calls += 1;
                r.time += time;
                r.flops += flops;
                r.bytes_out += bytes;
            }
            None => self.rows.push(OpStat {
                stage: stage.kind,
                op: name,
                weights,
                bf16_products,
                calls: 1,
                time,
                flops,
                bytes_out: bytes,
            }),
        }
    }
}
