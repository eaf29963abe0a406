//! The executor seam: what the shared pipeline (prompt encoding, sampling, decoding, exact VAE
//! tiles) asks of a backend that runs plan stages.
//!
//! [`crate::Session`] is the CPU executor: one host arena, the CPU kernel table, weights read
//! in place from the mapped plan and paged by [`crate::stream::Streamer`]. A GPU executor
//! implements the same trait with a device arena and its own kernels; the sampler, pipeline,
//! budget and streaming policy stay shared. Values cross the seam only as stage inputs and
//! outputs ([`Executor::run_stage_bytes`]) and, for exact tiled decoding, as windows of one
//! stage value ([`Executor::with_value`], [`Executor::with_value_mut`]), so an executor keeps
//! everything else (arena, K/V cache, T5 states handed in as [`StageInput::Bytes`]) where it
//! runs.

use std::path::PathBuf;

use edge_kernels::{GroupStats, KernelTable};
use zerocopy::IntoBytes;

use crate::error::Result;
use crate::plan::Plan;

/// A stage input handed to [`Executor::run_stage`].
#[derive(Clone, Copy, Debug)]
pub enum StageInput<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    /// The bytes of an input of a cache type (F16, Q8_0; or F32), as an earlier stage's
    /// [`Executor::run_stage_bytes`] wrote them.
    Bytes(&'a [u8]),
}

/// A backend that runs the stages of one plan, step by step, paging each step's segment.
///
/// `'p` is the plan's lifetime: [`Executor::plan`] returns a borrow that outlives the borrow of
/// the executor, so callers can read the plan's metadata while running stages.
pub trait Executor<'p> {
    /// The plan this executor runs.
    fn plan(&self) -> &'p Plan;

    /// Runs stage `stage` with `inputs` (in the order [`edge_schema::plan::StageKind`]
    /// documents) and copies its outputs into `outputs`, each exactly the output's byte size
    /// (`4·n` for f32, [`edge_schema::DType::bytes_for`] for a cache type).
    ///
    /// # Errors
    /// [`crate::Error::StageArity`] for the wrong number of inputs or outputs,
    /// [`crate::Error::InputSize`] for a wrong size, [`crate::Error::TokenId`] for an id outside
    /// the vocabulary; the backend's own failures.
    fn run_stage_bytes(
        &mut self,
        stage: u32,
        inputs: &[StageInput<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<()>;

    /// [`Executor::run_stage_bytes`] with f32 outputs (each exactly the output's size).
    fn run_stage(
        &mut self,
        stage: u32,
        inputs: &[StageInput<'_>],
        outputs: &mut [&mut [f32]],
    ) -> Result<()> {
        let mut raw: Vec<&mut [u8]> = outputs.iter_mut().map(|o| o.as_mut_bytes()).collect();
        self.run_stage_bytes(stage, inputs, &mut raw)
    }

    /// Runs steps `first..end` of stage `stage` on the values the executor holds (written by
    /// [`Executor::with_value_mut`] or by earlier steps). With `stats`, the step at `first` must
    /// be a GroupNorm and normalises with them instead of its input's own statistics.
    fn run_steps(
        &mut self,
        stage: u32,
        first: usize,
        end: usize,
        stats: Option<&[GroupStats]>,
    ) -> Result<()>;

    /// Calls `f` with the f32 value `id` of stage `stage` as it is now.
    fn with_value(
        &self,
        stage: u32,
        id: u32,
        f: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<()>;

    /// Calls `f` to write the f32 value `id` of stage `stage` before [`Executor::run_steps`].
    fn with_value_mut(
        &mut self,
        stage: u32,
        id: u32,
        f: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<()>;

    /// Weight streaming figures so far.
    fn streamer(&self) -> &crate::stream::Streamer;

    /// The folder where exact tiled decodes create their spill files.
    fn spill_dir(&self) -> PathBuf;

    /// Starts (`true`, with an empty table) or stops timing every step per stage kind and op
    /// (a GPU executor waits for each step to finish).
    fn set_profiling(&mut self, on: bool);

    /// Puts `p` in place of the per-op table (`None`: stop profiling) and returns the table
    /// collected so far.
    fn replace_profile(
        &mut self,
        p: Option<crate::profile::Profile>,
    ) -> Option<crate::profile::Profile>;

    /// The per-op table collected since profiling started, if profiling.
    fn profile(&self) -> Option<&crate::profile::Profile>;

    /// Checks (`true`) every f32 step output for NaN and infinity, failing the run at the
    /// first with [`crate::Error::NonFinite`] naming the stage, step and op (`edgerun generate
    /// --check-finite`; a GPU executor copies each output back to look).
    fn set_check_finite(&mut self, on: bool);

    /// One line on the device that ran the steps and what crossed to it (a GPU executor's
    /// steps on each side and bytes copied); `None` for the CPU session.
    fn device_summary(&self) -> Option<String> {
        None
    }

    /// The CPU kernels the pipeline uses for work it does on the host (the whole-image GroupNorm
    /// statistics of exact VAE tiles).
    fn host_kernels(&self) -> &KernelTable;
}
