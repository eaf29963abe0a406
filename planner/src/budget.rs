//! Planning under a memory budget: monolithic or segmented execution per stage, and the
//! predicted peak.
//!
//! A stage's monolithic peak is the charges of all the weights it reads (an embedding table
//! is charged only the rows a lookup gathers, see [`edge_schema::memory`]) plus its own arena
//! (the runtime releases the arena pages above a stage's size on entering it) plus the host
//! buffers of the largest image. If it fits the budget minus [`HEADROOM`], the stage runs
//! monolithic; otherwise it runs segment by segment, and every segment together with the next
//! one (which the runtime prefetches) plus the arena and host buffers must fit, or compiling
//! fails and names the segment and what it needs.

use edge_schema::memory;
use edge_schema::plan::{PlanMeta, TensorEntry};

use crate::error::{PlanError, Result};

/// Planning headroom kept free under the budget for the process itself (code, stacks, host
/// buffers, allocator slack), in bytes.
pub const HEADROOM: u64 = 128 << 20;

/// `--segments`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SegmentMode {
    /// Monolithic when the stage fits the budget with headroom, segmented otherwise.
    #[default]
    Auto,
    /// Always monolithic (compiling fails if a stage does not fit).
    Monolithic,
    /// One segment per cut marker whatever the budget.
    EveryCut,
}

impl std::str::FromStr for SegmentMode {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(SegmentMode::Auto),
            "monolithic" => Ok(SegmentMode::Monolithic),
            "every-cut" => Ok(SegmentMode::EveryCut),
            other => Err(PlanError::Invalid(format!(
                "--segments `{other}`: expected auto, monolithic or every-cut"
            ))),
        }
    }
}

/// Memory figures of one stage, in bytes (charges as [`edge_schema::memory`] defines them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageMemory {
    /// Charges of all the stage's weights.
    pub weights: u64,
    /// The stage's own arena.
    pub arena: u64,
    /// Host buffers while the stage runs (the largest image size's).
    pub host: u64,
    /// Weights + arena + host.
    pub monolithic_peak: u64,
    /// The largest (segment + next segment) weights + arena + host.
    pub segmented_peak: u64,
    pub segmented: bool,
}

/// Decides monolithic or segmented execution for every stage of `meta` (whose tensor table is
/// filled) and records it in each stage. Returns the figures per stage.
pub fn apply(
    meta: &mut PlanMeta,
    tensors: &[TensorEntry],
    budget: Option<u64>,
    mode: SegmentMode,
    headroom: u64,
) -> Result<Vec<StageMemory>> {
    let charges = memory::tensor_charges(&meta.stages, tensors);
    let charge = |ts: &[u32]| -> u64 {
        ts.iter()
            .map(|&t| charges.get(t as usize).copied().unwrap_or(0))
            .sum()
    };
    // Host buffers per stage: the most any image size holds while the stage runs.
    let hosts: Vec<u64> = meta
        .stages
        .iter()
        .map(|st| {
            meta.sizes
                .iter()
                .map(|z| memory::host_bytes_at(meta, z, st))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let limit = budget.map(|b| b.saturating_sub(headroom));
    // An f32 K/V cache is most of the host buffers before decoding: a refusal says what q8_0
    // would save.
    let f32_cache = meta
        .cross_kv_stage
        .and_then(|k| meta.stages.get(k as usize))
        .and_then(|st| st.outputs.first().map(|&o| &st.values[o as usize]))
        .filter(|v| v.dtype == edge_schema::DType::F32)
        .and_then(|v| v.byte_len());
    let mut out = Vec::with_capacity(meta.stages.len());
    for (st, &host) in meta.stages.iter_mut().zip(&hosts) {
        let arena = st.arena_size;
        let weights = charge(&memory::tensors_of(st, 0, st.steps.len()));
        let seg_w: Vec<u64> = st
            .segments
            .iter()
            .map(|g| {
                charge(&memory::tensors_of(
                    st,
                    g.first_step as usize,
                    g.end_step as usize,
                ))
            })
            .collect();
        let mut worst = (0u64, 0usize);
        for j in 0..seg_w.len() {
            let pair = seg_w[j] + seg_w.get(j + 1).copied().unwrap_or(0);
            if pair > worst.0 {
                worst = (pair, j);
            }
        }
        let monolithic_peak = weights + arena + host;
        let segmented_peak = worst.0 + arena + host;
        let segmented = match mode {
            SegmentMode::EveryCut => true,
            SegmentMode::Monolithic => false,
            SegmentMode::Auto => limit.is_some_and(|l| monolithic_peak > l),
        };
        if let Some(l) = limit {
            let need = if segmented {
                segmented_peak
            } else {
                monolithic_peak
            };
            if need > l {
                let what = if segmented {
                    let seg = &st.segments[worst.1];
                    format!(
                        "segment {} ({}) with the next one prefetched needs {} bytes of weights + {arena} of arena + {host} of host buffers",
                        worst.1, seg.label, worst.0
                    )
                } else {
                    format!(
                        "running it monolithic needs {weights} bytes of weights + {arena} of arena + {host} of host buffers"
                    )
                };
                // Both prompts' caches are in the host buffers of every stage before decoding.
                let hint = match f32_cache {
                    Some(c) if host >= 2 * c && c > 0 => format!(
                        "; the host buffers hold two f32 K/V caches of {c} bytes: `--kv-cache-type q8_0` stores them in {} bytes each",
                        edge_schema::DType::Q8_0.bytes_for(c / 4).unwrap_or(c)
                    ),
                    _ => String::new(),
                };
                return Err(PlanError::Invalid(format!(
                    "--max-ram: stage {} does not fit: {what} = {need} bytes, but the budget leaves {l} bytes ({} minus {headroom} of headroom){hint}",
                    st.name,
                    budget.unwrap_or(0)
                )));
            }
        }
        st.segmented = segmented;
        out.push(StageMemory {
            weights,
            arena,
            host,
            monolithic_peak,
            segmented_peak,
            segmented,
        });
    }
    meta.budget = budget;
    Ok(out)
}
