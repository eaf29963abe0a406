//! The tensor table of a plan under construction: every weight the stages use, deduplicated
//! across stages, converted to its pack type, assigned to a section, and (for an aarch64
//! target) repacked into the NEON kernels' layout.

use std::collections::HashMap;

use edge_graph::WeightSpec;
use edge_schema::op::Op;
use edge_schema::plan::{Isa, PackLayout, Stage, StageKind, Storage, Target, TensorEntry};
use edge_schema::DType;

use crate::error::Result;
use crate::pack::{self, Fallback, PackPolicy};

/// A weight as a checkpoint provides it (parts already concatenated).
pub struct LoadedWeight {
    /// The type of `bytes`.
    pub dtype: DType,
    /// Shape, outermost-first.
    pub shape: Vec<u64>,
    pub bytes: Vec<u8>,
    /// The checkpoint's type, which the pack policy keeps when no type is asked for; differs
    /// from `dtype` when the planner changed the values (a LoRA merged in f32).
    pub checkpoint_dtype: DType,
}

/// Resolves graph weights to checkpoint data.
pub trait WeightResolver {
    /// The tensor for `spec`, which the graph expects to have `shape`. Errors name the tensor
    /// and the expected shape.
    fn resolve(&self, spec: &WeightSpec, shape: &[u64]) -> Result<LoadedWeight>;
}

/// The tensor table and weight sections shared by all stages of a plan under construction.
#[derive(Default)]
pub struct TensorTable {
    pub entries: Vec<TensorEntry>,
    pub data: Vec<Vec<u8>>,
    /// Tensor ids per section, in storage order.
    pub sections: Vec<Vec<u32>>,
    pub fallbacks: Vec<Fallback>,
    /// Indices of the [`PackPolicy::rules`] that chose the type of at least one matrix.
    pub rules_applied: std::collections::BTreeSet<usize>,
    dedup: HashMap<(Vec<String>, DType), u32>,
    /// Section of each tensor once assigned.
    section_of: Vec<Option<u32>>,
}

impl TensorTable {
    pub(crate) fn add(
        &mut self,
        name: String,
        dtype: DType,
        shape: Vec<u64>,
        bytes: Vec<u8>,
    ) -> u32 {
        self.entries.push(TensorEntry {
            name,
            dtype,
            shape,
            layout: PackLayout::RowMajor,
            section: 0,
            offset: 0,
            len: bytes.len() as u64,
        });
        self.data.push(bytes);
        self.section_of.push(None);
        (self.entries.len() - 1) as u32
    }

    pub(crate) fn weight(
        &mut self,
        spec: &WeightSpec,
        shape: &[u64],
        resolver: &dyn WeightResolver,
        policy: &PackPolicy,
    ) -> Result<u32> {
        let loaded = resolver.resolve(spec, shape)?;
        let name = spec.parts.join("+");
        let row = shape.last().copied().unwrap_or(1);
        let (dtype, fb) = policy.choose(&name, spec.kind, loaded.checkpoint_dtype, row);
        if let Some(r) = policy.rule_for(&name, spec.kind) {
            self.rules_applied.insert(r);
        }
        if let Some(&id) = self.dedup.get(&(spec.parts.clone(), dtype)) {
            return Ok(id);
        }
        if let Some(fb) = fb {
            self.fallbacks.push(fb);
        }
        let n: u64 = shape.iter().product();
        let bytes = pack::convert(&loaded.bytes, loaded.dtype, dtype, n as usize);
        let id = self.add(name, dtype, shape.to_vec(), bytes);
        self.dedup.insert((spec.parts.clone(), dtype), id);
        Ok(id)
    }

    pub(crate) fn constant(&mut self, name: String, shape: &[u64], data: &[f32]) -> u32 {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add(name, DType::F32, shape.to_vec(), bytes)
    }

    pub(crate) fn assign_section(&mut self, tensors: &[u32]) -> Option<u32> {
        let fresh: Vec<u32> = tensors
            .iter()
            .copied()
            .filter(|&t| self.section_of[t as usize].is_none())
            .collect();
        if fresh.is_empty() {
            return tensors.first().and_then(|&t| self.section_of[t as usize]);
        }
        let sec = self.sections.len() as u32;
        for &t in &fresh {
            self.section_of[t as usize] = Some(sec);
            self.entries[t as usize].section = sec;
        }
        self.sections.push(fresh);
        Some(sec)
    }

    /// Repacks every matrix `[n, k]` that the plan uses only as a `Linear` weight into the layout
    /// its target's kernels read (`edge_kernels::pack`), and records the layout in its entry:
    /// for an aarch64 target, `Q8_0`/`Q4_0` with `n ≥ 4` into [`PackLayout::Interleaved4x8`]
    /// (the NEON kernels read 4 rows at a time); for an x86-64 target that names `avx512vnni`
    /// (`--target x86_64-avx512`), `Q8_0` with `n ≥ 16` into [`PackLayout::Interleaved16x4`]
    /// (the VNNI kernels' `vpdpbusd` operands, read in place instead of repacked at every call).
    /// Other targets keep [`PackLayout::RowMajor`]. The generic kernels read every layout with
    /// bit-identical results, so a repacked plan still runs (and is checked) on the workstation.
    /// Returns the number of tensors repacked. Must run before sections and digests are built.
    pub fn repack_for_target(&mut self, stages: &[Stage], target: &Target) -> usize {
        let layouts = target_layouts(target);
        if layouts.is_empty() {
            return 0;
        }
        let linear_only = self.linear_weights_only(stages, |_| true);
        let mut repacked = 0;
        for (t, (entry, data)) in self.entries.iter_mut().zip(&mut self.data).enumerate() {
            let [n, k] = entry.shape[..] else { continue };
            let Some(&(_, layout)) = layouts.iter().find(|(d, _)| *d == entry.dtype) else {
                continue;
            };
            if linear_only[t] != Some(true)
                || n < edge_kernels::pack::group_rows(layout) as u64
                || (layout == PackLayout::Bf16Pairs16 && k % 2 != 0)
                || entry.layout != PackLayout::RowMajor
            {
                continue;
            }
            repack_entry(entry, data, layout, n as usize, k as usize);
            repacked += 1;
        }
        repacked
    }
}

impl TensorTable {
    /// Per tensor: `Some(true)` if every use of it is the weight operand of a `Linear` step of
    /// a stage that `stage_ok` accepts, `Some(false)` if some use is not, `None` if unused.
    fn linear_weights_only(
        &self,
        stages: &[Stage],
        stage_ok: impl Fn(&Stage) -> bool,
    ) -> Vec<Option<bool>> {
        let mut only: Vec<Option<bool>> = vec![None; self.entries.len()];
        for stage in stages {
            for step in &stage.steps {
                for (slot, &id) in step.inputs.iter().enumerate() {
                    if let Some(Storage::Weight(t)) =
                        stage.values.get(id as usize).map(|v| &v.storage)
                    {
                        let ok =
                            stage_ok(stage) && matches!(step.op, Op::Linear { .. }) && slot == 1;
                        if let Some(u) = only.get_mut(*t as usize) {
                            *u = Some(u.unwrap_or(true) && ok);
                        }
                    }
                }
            }
        }
        only
    }

    /// `--activation-bits 7`: repacks every row-major `Q8_0` matrix `[n, k]` with `n ≥ 8` that
    /// the plan uses only as a `Linear` weight of denoiser steps into
    /// [`PackLayout::Interleaved8x4A7`] (whose activations are quantized to 7 bits). Returns
    /// the number of tensors repacked. Must run before [`TensorTable::repack_for_target`] (which
    /// leaves them as they are), sections and digests.
    pub fn repack_a7(&mut self, stages: &[Stage]) -> usize {
        let layout = PackLayout::Interleaved8x4A7;
        let denoiser_linear = self.linear_weights_only(stages, |s| s.kind == StageKind::Denoiser);
        let mut repacked = 0;
        for (t, (entry, data)) in self.entries.iter_mut().zip(&mut self.data).enumerate() {
            let [n, k] = entry.shape[..] else { continue };
            if denoiser_linear[t] != Some(true)
                || entry.dtype != DType::Q8_0
                || entry.layout != PackLayout::RowMajor
                || n < edge_kernels::pack::group_rows(layout) as u64
            {
                continue;
            }
            repack_entry(entry, data, layout, n as usize, k as usize);
            repacked += 1;
        }
        repacked
    }
}

/// Repacks one row-major `[n, k]` tensor's bytes into `layout` and records it in its entry.
fn repack_entry(
    entry: &mut TensorEntry,
    data: &mut Vec<u8>,
    layout: PackLayout,
    n: usize,
    k: usize,
) {
    let mut out = vec![0u8; data.len()];
    edge_kernels::pack::repack(layout, entry.dtype, data, n, k, &mut out);
    *data = out;
    entry.layout = layout;
}

/// The layouts [`TensorTable::repack_for_target`] stores `target`'s linear weights in, each
/// with the weight type it holds: [`PackLayout::Interleaved4x8`] (`Q8_0`, `Q4_0`) for aarch64;
/// for an x86-64 target, [`PackLayout::Interleaved16x4`] (`Q8_0`) where it names `avx512vnni`
/// and [`PackLayout::Bf16Pairs16`] (`BF16`, with bf16 products) where it names `avx512bf16`.
/// Empty where weights stay row-major.
pub fn target_layouts(target: &Target) -> Vec<(DType, PackLayout)> {
    let has = |f: &str| target.features.iter().any(|g| g == f);
    match target.isa {
        Isa::Aarch64 => vec![
            (DType::Q8_0, PackLayout::Interleaved4x8),
            (DType::Q4_0, PackLayout::Interleaved4x8),
        ],
        Isa::X86_64 => {
            let mut v = Vec::new();
            if has("avx512vnni") {
                v.push((DType::Q8_0, PackLayout::Interleaved16x4));
            }
            if has("avx512bf16") {
                v.push((DType::BF16, PackLayout::Bf16Pairs16));
            }
            v
        }
        Isa::Generic => vec![],
    }
}
