//! The memory model every component shares: what a stage costs resident, so that the
//! planner's budget check, `edgeplan compile`'s prediction, the runtime's weight streamer and
//! `edgerun -v`'s comparison use one definition (issue 17).
//!
//! A run's resident bytes at stage `k` are: the process itself (code, metadata, heap: measured
//! at run time, covered by the planner's headroom), the host buffers of one image
//! ([`host_bytes`]: T5 states and cross-attention K/V of both conditions, the image, exact VAE
//! tiles' held tensors), stage `k`'s own arena (the runtime releases the arena pages above a
//! stage's size when it enters a smaller stage, so a small stage does not pay for the VAE's
//! arena), and the weight pages resident: every weight is charged its bytes
//! ([`tensor_charges`]), except a table only ever read by embedding lookups, which is charged
//! the pages its looked-up rows touch (the rows are gathered from the mapping; the rest of
//! the table is never read).

use crate::op::Op;
use crate::plan::{ImageSize, PlanMeta, Stage, Storage, TensorEntry};

/// Page size the charges round to, in bytes.
pub const PAGE: u64 = 4096;

/// Per tensor of `tensors`: the bytes it makes resident when `stages` use it. A tensor read
/// only as the table (input 0) of [`Op::Embedding`] steps is charged `rows ×
/// (round_up(row bytes, PAGE) + PAGE)` (a row can straddle one more page), `rows` the most ids
/// one lookup reads, at most its length; every other tensor its length.
pub fn tensor_charges(stages: &[Stage], tensors: &[TensorEntry]) -> Vec<u64> {
    let n = tensors.len();
    let mut gathered_rows: Vec<Option<u64>> = vec![Some(0); n];
    for st in stages {
        for step in &st.steps {
            for (k, &i) in step.inputs.iter().enumerate() {
                let Some(Storage::Weight(t)) = st.values.get(i as usize).map(|v| &v.storage) else {
                    continue;
                };
                let Some(slot) = gathered_rows.get_mut(*t as usize) else {
                    continue;
                };
                let ids = step
                    .inputs
                    .get(1)
                    .and_then(|&id| st.values.get(id as usize))
                    .map(|v| v.shape.iter().product::<u64>());
                *slot = match (&step.op, k, ids, *slot) {
                    (Op::Embedding, 0, Some(rows), Some(r)) => Some(r.max(rows)),
                    _ => None,
                };
            }
        }
    }
    tensors
        .iter()
        .zip(&gathered_rows)
        .map(|(t, rows)| match (rows, t.shape.first()) {
            (Some(rows), Some(&table_rows)) if *rows > 0 && table_rows > 0 => {
                let row_bytes = t.len / table_rows;
                let per_row = row_bytes.div_ceil(PAGE) * PAGE + PAGE;
                t.len.min(rows.saturating_mul(per_row))
            }
            _ => t.len,
        })
        .collect()
}

/// Per section: the sum of its tensors' charges (the bytes it makes resident when used).
pub fn section_charges(meta: &PlanMeta) -> Vec<u64> {
    let charges = tensor_charges(&meta.stages, &meta.tensors);
    let mut out = vec![0u64; meta.sections.len()];
    for (t, c) in meta.tensors.iter().zip(&charges) {
        if let Some(s) = out.get_mut(t.section as usize) {
            *s += c;
        }
    }
    out
}

/// The weight tensors steps `first..end` of `stage` read, each once, in first-use order.
pub fn tensors_of(stage: &Stage, first: usize, end: usize) -> Vec<u32> {
    step_tensors(stage.steps.get(first..end).unwrap_or(&[]), &stage.values)
}

/// The weight tensors `steps` read (value ids index `values`), each once, in first-use order:
/// the one walk from steps to weights, used for segment sections (planner), charges (memory
/// model) and streaming (runtime).
pub fn step_tensors(steps: &[crate::plan::Step], values: &[crate::plan::ValueEntry]) -> Vec<u32> {
    let mut ts = Vec::new();
    for step in steps {
        for &i in &step.inputs {
            if let Some(Storage::Weight(t)) = values.get(i as usize).map(|v| &v.storage) {
                if !ts.contains(t) {
                    ts.push(*t);
                }
            }
        }
    }
    ts
}

/// Bytes of the buffers the pipeline keeps outside the arena for one image of `size` while
/// stage `stage` runs: before decoding, per condition (2 with guidance) the T5 states and the
/// cross-attention K/V cache, plus while encoding an init image that image as f32 planes and
/// its moments; while decoding (the conditions are freed first), the decoded
/// image as f32 planes (3 × W × H × 4 bytes) and what exact VAE tiles hold
/// ([`crate::tiles::host_bytes`]).
pub fn host_bytes_at(meta: &PlanMeta, size: &ImageSize, stage: &Stage) -> u64 {
    use crate::plan::StageKind;
    match stage.kind {
        StageKind::VaeDecoder | StageKind::VaeDecoderHead | StageKind::VaeDecoderTail => {
            image_bytes(size.width, size.height) + crate::tiles::host_bytes(meta, size)
        }
        // Image to image: the conditions, the input image as f32 planes and the moments.
        StageKind::VaeEncoder => {
            let moments = stage
                .outputs
                .first()
                .and_then(|&o| stage.values.get(o as usize))
                .and_then(|v| v.byte_len())
                .unwrap_or(0);
            conditions_bytes(meta) + image_bytes(size.width, size.height) + moments
        }
        // Exact encoder tiles: the image planes move into the held tensors (or the spill
        // file), which hold the front's output at the end.
        StageKind::VaeEncoderDown => {
            conditions_bytes(meta) + crate::tiles::encoder_host_bytes(meta, size)
        }
        // The back: the front's output and the moments.
        StageKind::VaeEncoderMid => {
            let io = |ids: &[u32]| -> u64 {
                ids.first()
                    .and_then(|&o| stage.values.get(o as usize))
                    .and_then(|v| v.byte_len())
                    .unwrap_or(0)
            };
            conditions_bytes(meta) + io(&stage.inputs) + io(&stage.outputs)
        }
        // Previews decode while the conditions are held.
        StageKind::TinyDecoder => conditions_bytes(meta) + image_bytes(size.width, size.height),
        _ => conditions_bytes(meta),
    }
}

/// Bytes of the two conditions (prompt and negative prompt): T5 states and, when the plan has
/// the stage, the cross-attention K/V cache of each.
fn conditions_bytes(meta: &PlanMeta) -> u64 {
    let out_bytes = |stage: u32| -> u64 {
        meta.stages
            .get(stage as usize)
            .and_then(|st| st.outputs.first().map(|&o| &st.values[o as usize]))
            .and_then(|v| v.byte_len())
            .unwrap_or(0)
    };
    2 * (out_bytes(meta.text_stage) + meta.cross_kv_stage.map_or(0, out_bytes))
}

/// Bytes of a decoded `width × height` image on the host: 3 f32 planes.
pub fn image_bytes(width: u32, height: u32) -> u64 {
    3 * u64::from(width) * u64::from(height) * 4
}

/// The most host bytes any stage of `size`'s run holds ([`host_bytes_at`]).
pub fn host_bytes(meta: &PlanMeta, size: &ImageSize) -> u64 {
    run_order(meta, size)
        .iter()
        .filter_map(|&i| meta.stages.get(i as usize))
        .map(|st| host_bytes_at(meta, size, st))
        .max()
        .unwrap_or(0)
}

/// One stage's predicted residency, in bytes (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagePeak {
    /// Index of the stage.
    pub stage: u32,
    /// The stage's arena.
    pub arena: u64,
    /// Charges of the weights the stage must hold at once: all its weights when it runs whole
    /// (no budget, monolithic), the largest segment plus the next (prefetched) one otherwise.
    pub needed_weights: u64,
    /// Charges of every weight used by the run up to and including this stage (what stays
    /// resident when nothing has to be released).
    pub touched_weights: u64,
    /// Host buffers while this stage runs ([`host_bytes_at`]).
    pub host: u64,
    /// `host + arena + touched weights`, capped at the budget when one is given (the
    /// streamer releases finished sections down to it), never below `host + arena + needed`.
    pub peak: u64,
}

/// The stages one image of `size` runs, in order: the text encoder (the full-length one),
/// the cross-attention K/V stage, the VAE encoder when the plan has one for the size (an
/// image-to-image run; counted for every run, so a prediction covers both kinds), the
/// denoiser, the tiny decoder when the plan has one (previews, `--decoder tae`), the decoder
/// (head, then tail, for exact tiles; the reduced whole-image decoder, then the tile decoder,
/// for estimated statistics).
pub fn run_order(meta: &PlanMeta, size: &ImageSize) -> Vec<u32> {
    let mut order = vec![meta.text_stage];
    order.extend(meta.cross_kv_stage);
    order.extend(size.encoder_stage);
    order.extend(size.encoder_tiling.as_ref().map(|t| t.mid_stage));
    order.push(size.denoiser_stage);
    order.extend(size.tiny_decoder_stage);
    if let Some(sync) = size.decoder_tiling.as_ref().and_then(|t| t.sync.as_ref()) {
        order.push(sync.head_stage);
    }
    if let Some(e) = size
        .decoder_tiling
        .as_ref()
        .and_then(|t| t.estimate.as_ref())
    {
        order.push(e.stage);
    }
    order.push(size.decoder_stage);
    order.dedup();
    order
}

/// The predicted residency of each stage of `size`'s run ([`run_order`]) under `limit` bytes
/// (the budget the process may use beyond its own baseline), from `tensors` and their
/// `charges` ([`tensor_charges`]); `segmented` says how each stage runs (by stage index).
pub fn stage_peaks(
    meta: &PlanMeta,
    tensors: &[TensorEntry],
    charges: &[u64],
    size: &ImageSize,
    limit: Option<u64>,
) -> Vec<StagePeak> {
    let mut touched: Vec<bool> = vec![false; tensors.len()];
    let mut out = Vec::new();
    for idx in run_order(meta, size) {
        let Some(st) = meta.stages.get(idx as usize) else {
            continue;
        };
        for t in tensors_of(st, 0, st.steps.len()) {
            if let Some(x) = touched.get_mut(t as usize) {
                *x = true;
            }
        }
        let charge = |ts: &[u32]| -> u64 {
            ts.iter()
                .map(|&t| charges.get(t as usize).copied().unwrap_or(0))
                .sum()
        };
        let needed_weights = needed_weights(st, limit.is_some() || st.segmented, &charge);
        let host = host_bytes_at(meta, size, st);
        let touched_weights: u64 = touched
            .iter()
            .zip(charges)
            .filter(|(t, _)| **t)
            .map(|(_, c)| c)
            .sum();
        let floor = host + st.arena_size + needed_weights;
        let all = host + st.arena_size + touched_weights;
        let peak = match limit {
            Some(l) => all.min(l).max(floor),
            None => all,
        };
        out.push(StagePeak {
            stage: idx,
            arena: st.arena_size,
            needed_weights,
            touched_weights,
            host,
            peak,
        });
    }
    out
}

/// The charges a stage must hold at once: all its weights when run whole (`by_segments`
/// false), else the largest pair of consecutive segments (the running one and the prefetched
/// next). The streamer works segment by segment under any budget, so a run under a budget
/// needs only the pair even for a stage the planner marked monolithic.
pub fn needed_weights(st: &Stage, by_segments: bool, charge: &dyn Fn(&[u32]) -> u64) -> u64 {
    if !by_segments {
        return charge(&tensors_of(st, 0, st.steps.len()));
    }
    let seg: Vec<u64> = st
        .segments
        .iter()
        .map(|g| charge(&tensors_of(st, g.first_step as usize, g.end_step as usize)))
        .collect();
    (0..seg.len())
        .map(|j| seg[j] + seg.get(j + 1).copied().unwrap_or(0))
        .max()
        .unwrap_or(0)
}

/// Device bytes the stages outside `host` need: the weights they read (Q8_0 ones held split,
/// 36 bytes per 34-byte block), the largest of their arenas, and the Q8_0 activation buffer of
/// their largest Q8_0 product (`m·k` quants and `m·k/32` f32 scales), as the CUDA executor
/// allocates them (`runtime/src/cuda/mod.rs`); the planner places stages with it
/// (`planner/src/cuda_place.rs`).
pub fn cuda_device_bytes(meta: &crate::plan::PlanMeta, host: &[u32]) -> u64 {
    let mut tensors: Vec<u32> = Vec::new();
    let (mut arena, mut qx) = (0u64, 0u64);
    for (i, st) in meta.stages.iter().enumerate() {
        if host.contains(&(i as u32)) {
            continue;
        }
        arena = arena.max(st.arena_size);
        for t in step_tensors(&st.steps, &st.values) {
            if !tensors.contains(&t) {
                tensors.push(t);
            }
        }
        for step in &st.steps {
            let (crate::op::Op::Linear { .. }, Some(&x), Some(&w)) =
                (&step.op, step.inputs.first(), step.inputs.get(1))
            else {
                continue;
            };
            let (Some(x), Some(w)) = (st.values.get(x as usize), st.values.get(w as usize)) else {
                continue;
            };
            if w.dtype != crate::DType::Q8_0 {
                continue;
            }
            let n: u64 = x.shape.iter().product();
            qx = qx.max(n + n / 32 * 4);
        }
    }
    let weights: u64 = tensors
        .iter()
        .filter_map(|&t| meta.tensors.get(t as usize))
        .map(|e| {
            e.len
                + if e.dtype == crate::DType::Q8_0 {
                    e.len / 17
                } else {
                    0
                }
        })
        .sum();
    weights + arena + qx
}
