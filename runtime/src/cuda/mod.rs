//! The CUDA executor (feature `cuda`): the plan's stages run on an NVIDIA GPU, step by step,
//! with the same decoded calls, arena layout, segments and pipeline as the CPU
//! [`Session`](crate::Session).
//!
//! - **One device arena** of the plan's largest stage arena, allocated once; every value keeps
//!   the byte offset the planner gave it, so liveness and in-place steps mean on the GPU what
//!   they mean on the CPU.
//! - **Weights** are uploaded on first use and stay on the device (the whole plan must fit:
//!   [`CudaSession::new`] refuses one that does not, naming both sizes; streaming under a
//!   `--max-vram` is not built yet). Stage inputs read in place (the T5 states, the
//!   cross-attention K/V cache) are uploaded once per stage run.
//! - **Steps** whose call has a CUDA kernel ([`gpu_runs`]) run on the GPU: matrix products
//!   from F32, F16, BF16 and Q8_0 row-major packs (Q8_0 activations quantized on the device),
//!   layer/RMS/group norm, the element-wise ops, attention with head dim ≤ 128, 2× upsampling,
//!   copies. Every other step (convolutions, embeddings, permutes, slices, concatenations that
//!   are not in place, timestep embeddings, T5 position bias, interleaved packs, GroupNorm with
//!   statistics given by exact VAE tiles) runs on the host with the CPU kernels, its inputs
//!   copied back from the device first. Each value records where its current bytes are
//!   (device, host or both), so a value crosses PCIe only when the other side reads it.
//!
//! Arithmetic: the element-wise kernels and the matrix products give the CPU's bits; norms and
//! attention agree within 1e-5 of the largest value (`kernels/cuda/tests/twins.rs`), so a plan's
//! latents on the GPU are within a bound of the CPU's, not identical.

use edge_kernels::{Call, KernelTable};
use edge_kernels_cuda::gpu::{Arg, DeviceBuffer, Gpu};
use edge_schema::plan::Storage;
use edge_schema::DType;
use zerocopy::IntoBytes;

use crate::error::{Error, Result};
use crate::executor::{Executor, StageInput};
use crate::plan::Plan;
use crate::residency::{Move, Residency};
use crate::session::{Operand, Session};

mod launch;
use launch::{blocks, gpu_runs};

/// How the GPU computes matrix products from F16 and BF16 weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CudaMath {
    /// The CPU's arithmetic (f32 fused multiply-adds in the generic order): the same bits.
    Exact,
    /// Tensor cores in the denoiser of a plan whose matrices are F16, BF16 or quantized (an f32
    /// plan stays exact): F16/BF16 products with the activations rounded to the
    /// weights' type (f32 sums; within 2⁻¹¹ (F16) or 2⁻⁸ (BF16) of the exact product per
    /// input) and attention with head dim ≤ 80 in F16 (within 2e-3 of the largest output, see
    /// `kernels/cuda/tests/twins.rs`); T5 and the VAE stay exact (both overflow F16).
    #[default]
    Fast,
}

/// Threads per block of the element-wise and norm kernels.
const THREADS: u32 = 256;

/// Counters of one [`CudaSession`] since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCounts {
    /// Steps run by CUDA kernels.
    pub gpu_steps: u64,
    /// Steps run on the host with the CPU kernels.
    pub host_steps: u64,
    /// Bytes of activations and stage inputs copied to the device.
    pub uploaded: u64,
    /// Bytes of activations copied back to the host.
    pub downloaded: u64,
    /// Bytes of weights resident on the device.
    pub weight_bytes: u64,
}

/// A plan bound to a GPU: a device arena, the weights uploaded on first use, and a CPU
/// [`Session`] for the steps that have no CUDA kernel.
pub struct CudaSession<'p> {
    host: Session<'p>,
    gpu: Gpu,
    arena: DeviceBuffer,
    /// Q8_0 activations of the largest Q8_0 matrix product (`m·k/32` blocks of 34 bytes).
    qx: DeviceBuffer,
    /// Device copies of the plan's tensors, by tensor index.
    weights: Vec<Option<DeviceBuffer>>,
    /// Q8_0 tensors in the tensor-core kernel's split layout (quants `[n, k]`, then the
    /// scales `[n, k/32]` as f32), by tensor index.
    split: Vec<Option<DeviceBuffer>>,
    /// Stage inputs read in place, uploaded for the running stage.
    bound: Vec<Option<DeviceBuffer>>,
    at: Residency,
    counts: CudaCounts,
    /// Per-op times when profiling (each step synchronised).
    profile: Option<crate::profile::Profile>,
    /// Copy every f32 step output back and check it for NaN and infinity.
    check_finite: bool,
    math: CudaMath,
    /// Tensor-core kernels exist for this GPU (sm_80 and later).
    mma: bool,
    /// Stages the plan runs on the CPU cores (its `CudaModules::host_stages`).
    host_stages: Vec<u32>,
    /// Per stage: its matrix products read F16, BF16 or quantized weights (a plan kept in f32
    /// keeps f32 attention too).
    reduced: Vec<bool>,
}

impl std::fmt::Debug for CudaSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSession")
            .field("gpu", &self.gpu.label)
            .field("arena_bytes", &self.arena.len())
            .field("counts", &self.counts)
            .finish()
    }
}

fn gpu_err(e: String) -> Error {
    Error::Gpu(e)
}

impl<'p> CudaSession<'p> {
    /// Binds `host` (a CPU session of the plan, which keeps the decoded steps, the streaming
    /// policy and the host arena for steps without a CUDA kernel) to `gpu`.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the device arena, the Q8_0 activation buffer and every weight do not
    /// fit in the GPU's free memory (both sizes named), or an allocation fails.
    pub fn new(host: Session<'p>, gpu: Gpu) -> Result<Self> {
        let plan = host.plan;
        // Stages the plan places on the CPU cores (the text encoder under a tight
        // --max-vram) never touch the device.
        let host_stages: Vec<u32> = plan
            .meta()
            .cuda
            .as_ref()
            .map(|c| c.host_stages.clone())
            .unwrap_or_default();
        let on_gpu = |i: usize| !host_stages.contains(&(i as u32));
        let arena_bytes = plan
            .meta()
            .stages
            .iter()
            .enumerate()
            .filter(|&(i, _)| on_gpu(i))
            .map(|(_, s)| s.arena_size)
            .max()
            .unwrap_or(0) as usize;
        let qx_bytes = host
            .decoded
            .iter()
            .enumerate()
            .filter(|&(i, _)| on_gpu(i))
            .flat_map(|(_, steps)| steps)
            .map(|d| match d.call {
                Call::Linear {
                    m,
                    k,
                    weight: DType::Q8_0,
                    ..
                } if gpu_runs(d) => m * k + m * (k / 32) * 4,
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        // Weights (Q8_0 held split), the arena and the Q8_0 activations of the GPU's stages,
        // as the planner counted them (`--max-vram`).
        let need = edge_schema::memory::cuda_device_bytes(plan.meta(), &host_stages);
        let (free, _) = gpu.memory().map_err(gpu_err)?;
        if need > free as u64 {
            return Err(Error::Gpu(format!(
                "{}: the plan needs {need} bytes of device memory (arena {arena_bytes}, Q8_0 \
                 activations {qx_bytes}, the rest weights); {free} bytes are free (edgeplan \
                 --max-vram places the text encoder on the CPU cores when it does not fit)",
                gpu.label
            )));
        }
        let gpu_mma = gpu.arch != edge_kernels_cuda::Arch::Sm72;
        let reduced = host
            .decoded
            .iter()
            .map(|steps| {
                steps
                    .iter()
                    .any(|d| matches!(d.call, Call::Linear { weight, .. } if weight != DType::F32))
            })
            .collect();
        let arena = gpu.alloc(arena_bytes).map_err(gpu_err)?;
        let qx = gpu.alloc(qx_bytes).map_err(gpu_err)?;
        let tensors = plan.meta().tensors.len();
        Ok(CudaSession {
            host,
            gpu,
            arena,
            qx,
            weights: (0..tensors).map(|_| None).collect(),
            split: (0..tensors).map(|_| None).collect(),
            bound: Vec::new(),
            at: Residency::default(),
            counts: CudaCounts::default(),
            profile: None,
            check_finite: false,
            math: CudaMath::default(),
            mma: gpu_mma,
            reduced,
            host_stages,
        })
    }

    /// Sets how products from F16 and BF16 weights are computed (Q8_0 products are always
    /// the CPU's bits, on tensor cores where the GPU has them).
    pub fn set_math(&mut self, math: CudaMath) {
        self.math = math;
    }

    /// The GPU's name and architecture, e.g. `NVIDIA H200 (sm_90)`.
    pub fn device(&self) -> &str {
        &self.gpu.label
    }

    /// Steps and bytes moved so far.
    pub fn counts(&self) -> CudaCounts {
        self.counts
    }

    /// Starts tracking the values of stage `index` (nothing current on either side) unless it
    /// is the stage already tracked and not `fresh`.
    fn track(&mut self, index: u32, fresh: bool) {
        let n = self.host.plan.meta().stages[index as usize].values.len();
        self.at.track(index, n, fresh);
    }

    /// Makes the arena value `id` of the tracked stage current on the GPU (`to_gpu`) or on the
    /// host, copying it across when only the other side holds it.
    fn sync(&mut self, index: u32, id: u32, to_gpu: bool) -> Result<()> {
        let plan = self.host.plan;
        let v = &plan.meta().stages[index as usize].values[id as usize];
        let Storage::Arena(s) = v.storage else {
            return Ok(());
        };
        let (o, l) = (s.offset as usize, s.len as usize);
        let m = self.at.need(id, to_gpu);
        match m {
            Move::ToDevice => {
                self.gpu
                    .write(&mut self.arena, o, &self.host.arena[o..o + l])
                    .map_err(gpu_err)?;
                self.counts.uploaded += l as u64;
            }
            Move::ToHost => {
                self.gpu
                    .read(&self.arena, o, &mut self.host.arena[o..o + l])
                    .map_err(gpu_err)?;
                self.counts.downloaded += l as u64;
            }
            Move::None => {}
        }
        self.at.moved(id, m);
        Ok(())
    }

    /// The device address of operand `j` of step `i` of stage `index`, uploading a weight or a
    /// bound stage input on first use.
    fn operand(&mut self, index: u32, i: usize, j: usize, bound: &[StageInput<'_>]) -> Result<u64> {
        let plan = self.host.plan;
        let d = &self.host.decoded[index as usize][i];
        match d.ins.get(j).copied() {
            Some(Operand::Arena(s)) => Ok(self.arena.ptr() + s.offset),
            Some(Operand::Weight { tensor, .. }) => {
                let t = tensor as usize;
                if self.weights.get(t).is_some_and(Option::is_none) {
                    let bytes = plan.tensor_bytes(tensor)?;
                    let buf = self.upload(bytes)?;
                    self.counts.weight_bytes += bytes.len() as u64;
                    self.weights[t] = Some(buf);
                }
                self.weights
                    .get(t)
                    .and_then(Option::as_ref)
                    .map(DeviceBuffer::ptr)
                    .ok_or_else(|| Error::Gpu(format!("no weight tensor {tensor}")))
            }
            Some(Operand::Input(n)) => {
                let n = n as usize;
                if self.bound.len() <= n {
                    self.bound.resize_with(n + 1, || None);
                }
                if self.bound[n].is_none() {
                    let bytes: &[u8] = match bound.get(n) {
                        Some(StageInput::F32(x)) => x.as_bytes(),
                        Some(StageInput::I32(x)) => x.as_bytes(),
                        Some(StageInput::Bytes(b)) => b,
                        None => {
                            return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                                "stage input {n} is read in place and only run_stage gives it"
                            ))))
                        }
                    };
                    let mut buf = self.gpu.alloc(bytes.len()).map_err(gpu_err)?;
                    self.gpu.write(&mut buf, 0, bytes).map_err(gpu_err)?;
                    self.counts.uploaded += bytes.len() as u64;
                    self.bound[n] = Some(buf);
                }
                self.bound[n]
                    .as_ref()
                    .map(DeviceBuffer::ptr)
                    .ok_or_else(|| Error::Gpu(format!("stage input {n} not uploaded")))
            }
            None => Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "step {i}: operand {j} missing"
            )))),
        }
    }

    /// A device copy of `bytes`.
    fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer> {
        let mut buf = self.gpu.alloc(bytes.len()).map_err(gpu_err)?;
        self.gpu.write(&mut buf, 0, bytes).map_err(gpu_err)?;
        Ok(buf)
    }

    /// The device address of Q8_0 tensor `tensor` (`rows` × `k`) in the split layout, made
    /// from the plan's blocks on first use (uploaded, then split by `edge_q8_0_split`).
    #[allow(unsafe_code)]
    fn split_weight(&mut self, tensor: u32, rows: usize, k: usize) -> Result<u64> {
        let t = tensor as usize;
        if self.split.get(t).is_some_and(Option::is_none) {
            let bytes = self.host.plan.tensor_bytes(tensor)?;
            let nblocks = rows * (k / 32);
            if bytes.len() != nblocks * 34 {
                return Err(Error::Gpu(format!(
                    "Q8_0 tensor {tensor}: {} bytes for {rows}×{k}",
                    bytes.len()
                )));
            }
            let raw = self.upload(bytes)?;
            let buf = self.gpu.alloc(rows * k + 4 * nblocks).map_err(gpu_err)?;
            let (qs, d) = (buf.ptr(), buf.ptr() + (rows * k) as u64);
            // SAFETY: (src, qs, d, blocks): raw holds `nblocks` blocks of 34 bytes, buf
            // rows·k quants then `nblocks` f32 scales (4-aligned: rows·k is a multiple of 32).
            unsafe {
                self.gpu.launch("edge_q8_0_split").map_err(gpu_err)?.run(
                    (blocks(nblocks), 1),
                    THREADS,
                    &[
                        Arg::Ptr(raw.ptr()),
                        Arg::Ptr(qs),
                        Arg::Ptr(d),
                        Arg::U64(nblocks as u64),
                    ],
                )
            }
            .map_err(gpu_err)?;
            // `raw` is freed when dropped; the driver orders the free after the split.
            self.gpu.synchronize().map_err(gpu_err)?;
            self.counts.weight_bytes += (rows * k + 4 * nblocks) as u64;
            self.split[t] = Some(buf);
        }
        self.split
            .get(t)
            .and_then(Option::as_ref)
            .map(DeviceBuffer::ptr)
            .ok_or_else(|| Error::Gpu(format!("no weight tensor {tensor}")))
    }

    /// Runs steps `first..end` of stage `index`, segment by segment, each on the GPU or on the
    /// host ([`gpu_runs`]).
    fn run_range(
        &mut self,
        index: u32,
        first: usize,
        end: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
        bound: &[StageInput<'_>],
    ) -> Result<()> {
        let plan = self.host.plan;
        let stage = &plan.meta().stages[index as usize];
        if first > end || end > stage.steps.len() {
            return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "stage {}: steps {first}..{end} out of range",
                stage.name
            ))));
        }
        self.track(index, false);
        for (j, seg) in stage.segments.iter().enumerate() {
            let (a, b) = (
                (seg.first_step as usize).max(first),
                (seg.end_step as usize).min(end),
            );
            if a >= b {
                continue;
            }
            self.host.enter_segment(index as usize, j)?;
            for i in a..b {
                let given = if i == first { stats } else { None };
                if self.profile.is_some() {
                    let t = std::time::Instant::now();
                    self.run_one(index, i, given, bound)?;
                    self.gpu.synchronize().map_err(gpu_err)?;
                    if let Some(p) = self.profile.as_mut() {
                        p.record(
                            stage,
                            &stage.steps[i],
                            &self.host.plan.meta().tensors,
                            t.elapsed(),
                        );
                    }
                } else {
                    self.run_one(index, i, given, bound)?;
                }
            }
        }
        Ok(())
    }

    /// Runs step `i` of stage `index` where its kernel is, moving its inputs there first.
    fn run_one(
        &mut self,
        index: u32,
        i: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
        bound: &[StageInput<'_>],
    ) -> Result<()> {
        let plan = self.host.plan;
        let step = &plan.meta().stages[index as usize].steps[i];
        let d = &self.host.decoded[index as usize][i];
        let out = step.outputs[0];
        if d.noop {
            // A reshape in place or a concatenation whose inputs were written inside its
            // output: the output is where all its inputs are (on the host unless all are on
            // the GPU).
            if !self.at.all_on_device(&step.inputs) {
                for &v in &step.inputs {
                    self.sync(index, v, false)?;
                }
            }
            self.at.in_place(&step.inputs, out);
            return Ok(());
        }
        let on_gpu = stats.is_none() && gpu_runs(d);
        for &v in &step.inputs {
            self.sync(index, v, on_gpu)?;
        }
        if on_gpu {
            self.launch(index, i, bound)?;
            self.counts.gpu_steps += 1;
        } else {
            // On the kernels' pool, as the CPU session's steps run (`edge_kernels::on_pool`),
            // step by step: the loop itself stays on the caller's thread, where the GPU work
            // is issued.
            let host = &mut self.host;
            edge_kernels::on_pool(|| host.run_step(index as usize, i, stats, bound))?;
            self.counts.host_steps += 1;
        }
        self.at.written(out, on_gpu);
        if self.check_finite {
            self.sync(index, out, false)?;
            self.host.check_output(index as usize, i)?;
        }
        Ok(())
    }
}

impl<'p> Executor<'p> for CudaSession<'p> {
    fn plan(&self) -> &'p Plan {
        self.host.plan
    }

    fn run_stage_bytes(
        &mut self,
        index: u32,
        inputs: &[StageInput<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<()> {
        if self.host_stages.contains(&index) {
            // Placed on the CPU cores: the host session runs it whole; the host arena it
            // writes is no longer what any tracked value's host side holds.
            self.at = Residency::default();
            self.counts.host_steps +=
                self.host.plan.meta().stages[index as usize].steps.len() as u64;
            return self.host.run_stage_bytes(index, inputs, outputs);
        }
        self.host.load_inputs(index, inputs, outputs.len())?;
        // A new run: every arena value is stale except the inputs just written to the host.
        self.track(index, true);
        self.bound.clear();
        let plan = self.host.plan;
        let stage = &plan.meta().stages[index as usize];
        for &v in &stage.inputs {
            self.at.written(v, false);
        }
        let r = self.run_range(index, 0, stage.steps.len(), None, inputs);
        self.bound.clear();
        r?;
        for &v in &stage.outputs {
            self.sync(index, v, false)?;
        }
        self.host.store_outputs(index, outputs)
    }

    fn run_steps(
        &mut self,
        stage: u32,
        first: usize,
        end: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
    ) -> Result<()> {
        self.run_range(stage, first, end, stats, &[])
    }

    fn with_value(
        &self,
        stage: u32,
        id: u32,
        f: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<()> {
        // Read-only: a value that lives only on the device is read through a copy.
        let on_gpu_only = self.at.stage() == Some(stage) && self.at.device_only(id);
        if !on_gpu_only {
            return f(self.host.value(stage, id)?);
        }
        let len = self.host.value(stage, id)?.len();
        let v = &self.host.plan.meta().stages[stage as usize].values[id as usize];
        let Storage::Arena(s) = v.storage else {
            return Err(Error::Gpu(format!("value {id} is not in the arena")));
        };
        let mut tmp = vec![0f32; len];
        self.gpu
            .read(&self.arena, s.offset as usize, tmp.as_mut_bytes())
            .map_err(gpu_err)?;
        f(&tmp)
    }

    fn with_value_mut(
        &mut self,
        stage: u32,
        id: u32,
        f: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        self.track(stage, false);
        self.sync(stage, id, false)?;
        f(self.host.value_mut(stage, id)?)?;
        self.at.written(id, false);
        Ok(())
    }

    fn streamer(&self) -> &crate::stream::Streamer {
        self.host.streamer()
    }

    fn spill_dir(&self) -> std::path::PathBuf {
        self.host.spill_dir()
    }

    fn host_kernels(&self) -> &KernelTable {
        self.host.kernels()
    }

    fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(crate::profile::Profile::default);
    }

    fn replace_profile(
        &mut self,
        p: Option<crate::profile::Profile>,
    ) -> Option<crate::profile::Profile> {
        std::mem::replace(&mut self.profile, p)
    }

    fn profile(&self) -> Option<&crate::profile::Profile> {
        self.profile.as_ref()
    }

    fn set_check_finite(&mut self, on: bool) {
        self.check_finite = on;
        // Stages placed on the CPU cores run in the host session's own loop.
        self.host.set_check_finite(on);
    }

    fn device_summary(&self) -> Option<String> {
        let c = self.counts;
        Some(format!(
            "device {}: {} steps on the GPU, {} on the host (CPU kernels); weights on the GPU {} bytes; copied to the GPU {} bytes, back {} bytes",
            self.gpu.label, c.gpu_steps, c.host_steps, c.weight_bytes, c.uploaded, c.downloaded
        ))
    }
}
