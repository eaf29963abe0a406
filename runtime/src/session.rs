//! A session: one plan, one arena allocated once, and the kernel table; runs stages step by
//! step, matching on each step's [`Op`] and calling kernel slots.
//!
//! Borrowing: at every step the output slot and the scratch slot are carved out of the arena
//! as the only mutable pieces; the verifier proved that no input overlaps them, so inputs are
//! read from the remaining immutable pieces (an input that is not found whole in one of them
//! is refused, never read).

use edge_kernels::{Call, KernelTable, WeightRef};
use edge_schema::op::{Epilogue, Op};
use edge_schema::plan::{ArenaSlice, PackLayout, Stage, Storage};
use edge_schema::DType;
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{Error, Result};
pub use crate::executor::StageInput;
use crate::plan::Plan;

/// One plan bound to an arena and a kernel table.
pub struct Session<'p> {
    pub(crate) plan: &'p Plan,
    /// Anonymous, page-aligned memory: pages become resident when first written, and those
    /// above a stage's arena size are released when a smaller stage starts.
    pub(crate) arena: memmap2::MmapMut,
    /// Bytes of the arena that may be resident (the largest stage arena since the last
    /// release).
    touched: u64,
    kernels: KernelTable,
    /// Every step of every stage decoded once ([`decode_stage`]), indexed like the plan's.
    pub(crate) decoded: Vec<Vec<Decoded>>,
    streamer: crate::stream::Streamer,
    profile: Option<crate::profile::Profile>,
    spill_dir: Option<std::path::PathBuf>,
    /// Check every f32 step output for NaN and infinity ([`Session::check_output`]).
    check_finite: bool,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("arena_bytes", &self.arena.len())
            .finish()
    }
}

/// Arena pages above the running stage's size are released only when at least this many bytes
/// would go (smaller differences are not worth a system call and the faults after it).
const RELEASE_MIN: u64 = 1 << 20;

/// The host buffers of `plan`'s largest image size ([`edge_schema::memory::host_bytes`]).
pub fn max_host_bytes(plan: &Plan) -> u64 {
    let meta = plan.meta();
    meta.sizes
        .iter()
        .map(|z| edge_schema::memory::host_bytes(meta, z))
        .max()
        .unwrap_or(0)
}

/// The largest arena any stage of `plan` needs, in bytes.
pub fn arena_bytes(plan: &Plan) -> u64 {
    plan.meta()
        .stages
        .iter()
        .map(|s| s.arena_size)
        .max()
        .unwrap_or(0)
}

struct Carved<'a> {
    pieces: [(usize, &'a [u8]); 3],
    out: &'a mut [u8],
    scratch: &'a mut [u8],
}

fn carve<'a>(
    arena: &'a mut [u8],
    out: &ArenaSlice,
    scratch: Option<&ArenaSlice>,
) -> Result<Carved<'a>> {
    let bad = || {
        Error::Plan(edge_schema::Error::Invalid(
            "arena slot outside the arena".into(),
        ))
    };
    let r = |s: &ArenaSlice| -> Result<(usize, usize)> {
        let start = usize::try_from(s.offset).map_err(|_| bad())?;
        let end = usize::try_from(s.end().ok_or_else(bad)?).map_err(|_| bad())?;
        Ok((start, end))
    };
    let (o0, o1) = r(out)?;
    let (s0, s1) = match scratch {
        Some(s) if s.len > 0 => r(s)?,
        _ => (o1, o1),
    };
    if o1 > arena.len() || s1 > arena.len() || (s0 < o1 && o0 < s1 && s0 != s1) {
        return Err(bad());
    }
    // Order the two mutable ranges, then split the arena into five pieces.
    let out_first = o0 <= s0;
    let ((a0, a1), (b0, b1)) = if out_first {
        ((o0, o1), (s0, s1))
    } else {
        ((s0, s1), (o0, o1))
    };
    let (p0, rest) = arena.split_at_mut(a0);
    let (ma, rest) = rest.split_at_mut(a1 - a0);
    let (p1, rest) = rest.split_at_mut(b0 - a1);
    let (mb, p2) = rest.split_at_mut(b1 - b0);
    let (out, scratch) = if out_first { (ma, mb) } else { (mb, ma) };
    Ok(Carved {
        pieces: [(0, &*p0), (a1, &*p1), (b1, &*p2)],
        out,
        scratch,
    })
}

/// The bytes of `s`, if they lie whole inside one of the immutable `pieces`.
fn read<'a>(pieces: &[(usize, &'a [u8]); 3], s: &ArenaSlice) -> Result<&'a [u8]> {
    {
        let start = s.offset as usize;
        let end = start + s.len as usize;
        for (base, piece) in pieces {
            if start >= *base && end <= base + piece.len() {
                return Ok(&piece[start - base..end - base]);
            }
        }
        Err(Error::Plan(edge_schema::Error::Invalid(format!(
            "input slot {start}..{end} overlaps the step's output or scratch"
        ))))
    }
}

fn as_f32(b: &[u8]) -> Result<&[f32]> {
    <[f32]>::ref_from_bytes(b)
        .map_err(|_| Error::Plan(edge_schema::Error::Invalid("misaligned f32 tensor".into())))
}

fn as_f32_mut(b: &mut [u8]) -> Result<&mut [f32]> {
    <[f32]>::mut_from_bytes(b)
        .map_err(|_| Error::Plan(edge_schema::Error::Invalid("misaligned f32 tensor".into())))
}

/// Where a decoded step reads one input.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operand {
    Arena(ArenaSlice),
    Weight {
        tensor: u32,
        dtype: DType,
        layout: PackLayout,
    },
    /// A stage input read in place from what [`Session::run_stage`] was given.
    Input(u32),
}

/// One plan step decoded when the session is created: the kernel call with its parameters
/// ([`Call::decode`], the function the planner sizes scratch with), where its operands live,
/// and whether it has anything to do. The step loop only dispatches on it.
#[derive(Clone, Debug)]
pub(crate) struct Decoded {
    pub(crate) call: Call,
    pub(crate) out: ArenaSlice,
    /// The output's type: f32, or a cache type written as bytes.
    pub(crate) out_dtype: DType,
    scratch: Option<ArenaSlice>,
    pub(crate) ins: Vec<Operand>,
    /// A reshape into its input's own slot, or a concatenation whose inputs the planner placed
    /// inside its output.
    pub(crate) noop: bool,
}

/// An upper bound of the heap bytes [`decode_stage`] allocates for `meta`'s stages (the
/// allocator's per-block overhead counted as 32 bytes), so that the memory policy can count
/// them before the session exists ([`crate::budget::resolve`]).
pub fn decoded_bytes(meta: &edge_schema::plan::PlanMeta) -> u64 {
    let per_vec = 32u64;
    meta.stages
        .iter()
        .map(|st| {
            per_vec
                + st.steps
                    .iter()
                    .map(|step| {
                        let chunks = if matches!(step.op, Op::Concat { .. }) {
                            per_vec + 8 * step.inputs.len() as u64
                        } else {
                            0
                        };
                        std::mem::size_of::<Decoded>() as u64
                            + per_vec
                            + (std::mem::size_of::<Operand>() * step.inputs.len()) as u64
                            + chunks
                    })
                    .sum::<u64>()
        })
        .sum::<u64>()
        + per_vec
}

/// Decodes every step of `stage` (a verified stage of `plan`), refusing by name a step whose
/// planned scratch slot is smaller than its kernel needs (the schema verifier does not know
/// kernel scratch sizes; plans from a release whose kernels needed less are refused here).
fn decode_stage(plan: &Plan, stage: &Stage) -> Result<Vec<Decoded>> {
    let invalid = |i: usize, what: String| {
        Error::Plan(edge_schema::Error::Invalid(format!(
            "stage {}: step {i}: {what}",
            stage.name
        )))
    };
    let value = |i: usize, id: u32| {
        stage
            .values
            .get(id as usize)
            .ok_or_else(|| invalid(i, format!("no value {id}")))
    };
    stage
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let out_id = *step
                .outputs
                .first()
                .ok_or_else(|| invalid(i, "no output".into()))?;
            let out_v = value(i, out_id)?;
            let Storage::Arena(out) = out_v.storage else {
                return Err(invalid(i, "output is not in the arena".into()));
            };
            let mut ins = Vec::with_capacity(step.inputs.len());
            let mut shapes = Vec::with_capacity(step.inputs.len());
            for &id in &step.inputs {
                let v = value(i, id)?;
                ins.push(match v.storage {
                    Storage::Arena(a) => Operand::Arena(a),
                    Storage::Input(k) => Operand::Input(k),
                    Storage::Weight(t) => Operand::Weight {
                        tensor: t,
                        dtype: v.dtype,
                        layout: plan
                            .meta()
                            .tensors
                            .get(t as usize)
                            .map_or(PackLayout::RowMajor, |e| e.layout),
                    },
                });
                shapes.push((v.shape.as_slice(), v.dtype));
            }
            let call = Call::decode(&step.op, &shapes, &out_v.shape).map_err(|e| invalid(i, e))?;
            let need = call.scratch_bytes();
            let have = step.scratch.map_or(0, |s| s.len) as usize;
            if have < need {
                return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                    "{} step has {have} bytes of scratch, its kernel needs {need} (the plan was \
                     sized for other kernels: compile it again with the edgeplan of this release)",
                    step.op.name()
                ))));
            }
            if let Call::Concat { outer, chunks } = &call {
                let total: usize = chunks.iter().sum();
                if outer.checked_mul(total) != Some(out.len as usize) {
                    return Err(invalid(
                        i,
                        format!("concatenation of {outer}×{total} bytes into {}", out.len),
                    ));
                }
            }
            let noop = (matches!(step.op, Op::Reshape)
                && ins
                    .first()
                    .is_some_and(|o| matches!(o, Operand::Arena(a) if *a == out)))
                || edge_schema::verify::in_place_concat(stage, step);
            Ok(Decoded {
                call,
                out,
                out_dtype: out_v.dtype,
                scratch: step.scratch,
                ins,
                noop,
            })
        })
        .collect()
}

impl<'p> Session<'p> {
    /// Binds `plan` to a fresh arena sized for its largest stage. With `max_arena_bytes`, a plan
    /// whose arena exceeds it is refused before anything is allocated.
    pub fn new(plan: &'p Plan, kernels: KernelTable, max_arena_bytes: Option<u64>) -> Result<Self> {
        let needed = arena_bytes(plan);
        if let Some(limit) = max_arena_bytes {
            if needed > limit {
                return Err(Error::ArenaTooLarge { needed, limit });
            }
        }
        let bytes = usize::try_from(needed).map_err(|_| Error::ArenaTooLarge {
            needed,
            limit: usize::MAX as u64,
        })?;
        let arena = memmap2::MmapMut::map_anon(bytes.max(1)).map_err(|source| Error::Io {
            path: format!("the {needed}-byte arena (anonymous memory)"),
            source,
        })?;
        let decoded = plan
            .meta()
            .stages
            .iter()
            .map(|st| decode_stage(plan, st))
            .collect::<Result<Vec<_>>>()?;
        Ok(Session {
            plan,
            arena,
            touched: 0,
            kernels,
            decoded,
            streamer: crate::stream::Streamer::new(
                plan.meta(),
                plan.meta()
                    .budget
                    .map(|b| b.saturating_sub(max_host_bytes(plan))),
            ),
            profile: None,
            spill_dir: None,
            check_finite: false,
        })
    }

    /// Starts (`true`, with an empty table) or stops timing every step per stage kind and op.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(crate::profile::Profile::default);
    }

    /// Puts `p` in place of the per-op table (`None`: stop profiling) and returns the table
    /// collected so far, e.g. to leave a run out of it.
    pub fn replace_profile(
        &mut self,
        p: Option<crate::profile::Profile>,
    ) -> Option<crate::profile::Profile> {
        std::mem::replace(&mut self.profile, p)
    }

    /// The per-op table collected since [`Session::set_profiling`]`(true)`, if profiling.
    pub fn profile(&self) -> Option<&crate::profile::Profile> {
        self.profile.as_ref()
    }

    /// Lowers (never raises) the budget the session streams weights under: bytes for the
    /// arena, the resident weights and the host buffers of one image
    /// ([`edge_schema::memory::host_bytes`], the largest size's, taken off before streaming).
    pub fn limit_budget(&mut self, budget: u64) {
        let b = self.plan.meta().budget.map_or(budget, |p| p.min(budget));
        self.streamer = crate::stream::Streamer::new(
            self.plan.meta(),
            Some(b.saturating_sub(max_host_bytes(self.plan))),
        );
    }

    /// Bytes of the arena that may be resident now: the running (or last) stage's arena size;
    /// the pages above it were released when that stage started (if at least 1 MiB).
    pub fn resident_arena_bytes(&self) -> u64 {
        self.touched
    }

    /// Sets the folder where exact tiled VAE decodes whose plan holds activations in a file
    /// create their (unlinked) spill file; the default is the system's temporary folder.
    pub fn set_spill_dir(&mut self, dir: std::path::PathBuf) {
        self.spill_dir = Some(dir);
    }

    /// The kernel table this session calls.
    pub fn kernels(&self) -> &KernelTable {
        &self.kernels
    }

    /// Checks `inputs` against stage `index` (arity, types, sizes, token ids) and copies those
    /// stored in the arena into their slots; those read in place are only checked.
    pub(crate) fn load_inputs(
        &mut self,
        index: u32,
        inputs: &[StageInput<'_>],
        outputs: usize,
    ) -> Result<()> {
        let plan = self.plan;
        let stage = &plan.meta().stages[index as usize];
        let arena = self.arena.as_mut_bytes();
        if inputs.len() != stage.inputs.len() || outputs != stage.outputs.len() {
            return Err(Error::StageArity {
                stage: stage.name.clone(),
                inputs: inputs.len(),
                outputs,
                want_inputs: stage.inputs.len(),
                want_outputs: stage.outputs.len(),
            });
        }
        for (i, (&vid, input)) in stage.inputs.iter().zip(inputs).enumerate() {
            let v = &stage.values[vid as usize];
            // An arena input is copied into its slot; a bound one is read in place by the
            // steps, so only its type and size are checked here.
            let (slot, want) = match v.storage {
                Storage::Arena(slot) => (Some(slot), slot.len as usize),
                Storage::Input(_) => (None, v.byte_len().unwrap_or(0) as usize),
                Storage::Weight(_) => continue,
            };
            let src: Option<&[u8]> = match (input, v.dtype) {
                (StageInput::F32(x), DType::F32) => Some(x.as_bytes()),
                (StageInput::I32(x), DType::I32) => {
                    for &id in x.iter() {
                        if id < 0 || id as u32 >= plan.meta().text.vocab_rows {
                            return Err(Error::TokenId {
                                id: i64::from(id),
                                rows: plan.meta().text.vocab_rows,
                            });
                        }
                    }
                    Some(x.as_bytes())
                }
                (StageInput::Bytes(b), d) if d != DType::I32 => Some(b),
                _ => None,
            };
            // Sizes in elements for typed slices, in bytes for `Bytes`.
            let per = if matches!(input, StageInput::Bytes(_)) {
                1
            } else {
                4
            };
            let Some(src) = src.filter(|b| b.len() == want) else {
                return Err(Error::InputSize {
                    stage: stage.name.clone(),
                    index: i,
                    got: src.map_or(usize::MAX, |b| b.len() / per),
                    expected: want / per,
                    shape: v.shape.clone(),
                });
            };
            if let Some(slot) = slot {
                arena[slot.offset as usize..(slot.offset + slot.len) as usize].copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// Copies the outputs of stage `index` from the arena into `outputs` (each exactly the
    /// output's byte size).
    pub(crate) fn store_outputs(&self, index: u32, outputs: &mut [&mut [u8]]) -> Result<()> {
        let stage = &self.plan.meta().stages[index as usize];
        let arena = self.arena.as_bytes();
        for (i, (&vid, out)) in stage.outputs.iter().zip(outputs.iter_mut()).enumerate() {
            let v = &stage.values[vid as usize];
            let Storage::Arena(slot) = v.storage else {
                continue;
            };
            let src = &arena[slot.offset as usize..(slot.offset + slot.len) as usize];
            if src.len() != out.len() {
                let per = if v.dtype == DType::F32 { 4 } else { 1 };
                return Err(Error::InputSize {
                    stage: stage.name.clone(),
                    index: i,
                    got: out.len() / per,
                    expected: src.len() / per,
                    shape: v.shape.clone(),
                });
            }
            out.copy_from_slice(src);
        }
        Ok(())
    }

    /// [`Executor::run_steps`](crate::Executor::run_steps) with the stage's inputs, which values stored as
    /// [`Storage::Input`] are read from.
    fn run_steps_bound(
        &mut self,
        index: u32,
        first: usize,
        end: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
        bound: &[StageInput<'_>],
    ) -> Result<()> {
        // The steps run on a thread of the kernels' pool, so that each kernel forks and joins
        // from inside it (`edge_kernels::on_pool`).
        if rayon::current_thread_index().is_none() {
            return edge_kernels::on_pool(|| self.run_steps_bound(index, first, end, stats, bound));
        }
        let plan = self.plan;
        let stage = &plan.meta().stages[index as usize];
        if first > end || end > stage.steps.len() {
            return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "stage {}: steps {first}..{end} out of range",
                stage.name
            ))));
        }
        // A smaller stage than the last does not keep the larger one's arena pages resident.
        let need = stage.arena_size;
        if self.touched >= need + RELEASE_MIN {
            crate::plan::release_anon_above(&mut self.arena, need as usize);
        }
        self.touched = need;
        // Segments cover the steps in order (checked by `verify_meta`); a segment's weight
        // section is hashed before its first step runs (tensor reads check it again, cheaply).
        for (j, seg) in stage.segments.iter().enumerate() {
            let (a, b) = (
                (seg.first_step as usize).max(first),
                (seg.end_step as usize).min(end),
            );
            if a >= b {
                continue;
            }
            self.enter_segment(index as usize, j)?;
            for i in a..b {
                let given = if i == first { stats } else { None };
                if self.profile.is_some() {
                    let t = std::time::Instant::now();
                    self.run_step(index as usize, i, given, bound)?;
                    if let Some(p) = self.profile.as_mut() {
                        p.record(
                            stage,
                            &stage.steps[i],
                            &self.plan.meta().tensors,
                            t.elapsed(),
                        );
                    }
                } else {
                    self.run_step(index as usize, i, given, bound)?;
                }
                if self.check_finite {
                    self.check_output(index as usize, i)?;
                }
            }
        }
        Ok(())
    }

    /// Pages segment `j` of stage `index` in (prefetching the next) and checks its weight
    /// section's digest before its first step runs (tensor reads check it again, cheaply).
    pub(crate) fn enter_segment(&mut self, index: usize, j: usize) -> Result<()> {
        let plan = self.plan;
        let stage = &plan.meta().stages[index];
        let seg = &stage.segments[j];
        let next = (j + 1 < stage.segments.len()).then_some(j + 1);
        self.streamer.before_segment(plan, index, j, next);
        if let Some(sec) = seg.section.map(|s| s as usize) {
            // A section read whole was just populated by the streamer: hash it in place.
            if self.streamer.is_gathered(sec) {
                plan.section_checked(sec)?;
            } else {
                plan.section_checked_resident(sec)?;
            }
        }
        Ok(())
    }

    /// [`crate::Error::NonFinite`] when the f32 output of step `i` of stage `index` (as it is
    /// now in the host arena) holds NaN or infinity.
    pub(crate) fn check_output(&self, index: usize, i: usize) -> Result<()> {
        let stage = &self.plan.meta().stages[index];
        let d = &self.decoded[index][i];
        if d.out_dtype != DType::F32 {
            return Ok(());
        }
        let (o, l) = (d.out.offset as usize, d.out.len as usize);
        let out = as_f32(&self.arena.as_bytes()[o..o + l])?;
        match out.iter().position(|v| !v.is_finite()) {
            None => Ok(()),
            Some(at) => Err(Error::NonFinite {
                stage: stage.name.clone(),
                step: i,
                op: stage.steps[i].op.name().to_string(),
                what: format!(
                    "{} at element {at} of {}",
                    if out[at].is_nan() { "NaN" } else { "infinity" },
                    out.len()
                ),
            }),
        }
    }

    fn slot(&self, index: u32, id: u32) -> Result<(usize, usize)> {
        let stage = &self.plan.meta().stages[index as usize];
        match stage.values.get(id as usize).map(|v| (&v.storage, v.dtype)) {
            Some((Storage::Arena(a), DType::F32)) => Ok((a.offset as usize, a.len as usize)),
            _ => Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "stage {}: value {id} is not an f32 arena value",
                stage.name
            )))),
        }
    }

    /// The f32 arena value `id` of stage `index` as it is now (verified in bounds).
    pub fn value(&self, index: u32, id: u32) -> Result<&[f32]> {
        let (o, l) = self.slot(index, id)?;
        as_f32(&self.arena.as_bytes()[o..o + l])
    }

    /// The f32 arena value `id` of stage `index`, to write before [`Session::run_steps`].
    pub fn value_mut(&mut self, index: u32, id: u32) -> Result<&mut [f32]> {
        let (o, l) = self.slot(index, id)?;
        as_f32_mut(&mut self.arena.as_mut_bytes()[o..o + l])
    }

    /// Runs step `i` of stage `index` as decoded at session creation. With `stats`, the step
    /// must be a GroupNorm, which normalises with them.
    pub(crate) fn run_step(
        &mut self,
        index: usize,
        i: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
        bound: &[StageInput<'_>],
    ) -> Result<()> {
        debug_assert!(
            rayon::current_thread_index().is_some(),
            "a step runs on a thread of the kernels' pool (edge_kernels::on_pool)"
        );
        let plan = self.plan;
        let stage = &plan.meta().stages[index];
        let d = &self.decoded[index][i];
        if d.noop {
            return Ok(());
        }
        let k = &self.kernels;
        if stats.is_some() && !matches!(d.call, Call::GroupNorm { .. }) {
            return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "stage {}: group statistics given to a {} step",
                stage.name,
                stage.steps[i].op.name()
            ))));
        }
        let arena = self.arena.as_mut_bytes();
        let Carved {
            pieces,
            out,
            scratch,
        } = carve(arena, &d.out, d.scratch.as_ref())?;
        let bytes_of = |j: usize| -> Result<&[u8]> {
            match d.ins[j] {
                Operand::Arena(s) => read(&pieces, &s),
                Operand::Weight { tensor, .. } => plan.tensor_bytes(tensor),
                Operand::Input(n) => match bound.get(n as usize) {
                    Some(StageInput::F32(x)) => Ok(x.as_bytes()),
                    Some(StageInput::I32(x)) => Ok(x.as_bytes()),
                    Some(StageInput::Bytes(b)) => Ok(b),
                    None => Err(Error::Plan(edge_schema::Error::Invalid(format!(
                        "stage {}: input {n} is read in place and only run_stage gives it",
                        stage.name
                    )))),
                },
            }
        };
        let f = |j: usize| -> Result<&[f32]> { as_f32(bytes_of(j)?) };
        let w = |j: usize| -> Result<WeightRef<'_>> {
            let (dtype, layout) = match d.ins[j] {
                Operand::Weight { dtype, layout, .. } => (dtype, layout),
                Operand::Arena(_) | Operand::Input(_) => (DType::F32, PackLayout::RowMajor),
            };
            Ok(WeightRef {
                dtype,
                bytes: bytes_of(j)?,
                layout,
            })
        };
        // Steps writing a cache type write bytes; every other step writes f32.
        match &d.call {
            Call::Quantize { dtype } => {
                edge_kernels::quant::quantize_row(*dtype, f(0)?, out);
                return Ok(());
            }
            Call::Concat { outer, chunks } => {
                let total: usize = chunks.iter().sum();
                let mut at = 0;
                for (j, &chunk) in chunks.iter().enumerate() {
                    let part = bytes_of(j)?;
                    if part.len() != outer * chunk {
                        return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                            "stage {}: concat input {j} has {} bytes, expected {}",
                            stage.name,
                            part.len(),
                            outer * chunk
                        ))));
                    }
                    edge_kernels::concat_part(part, *outer, at, total, out);
                    at += chunk;
                }
                return Ok(());
            }
            Call::Copy => {
                out.copy_from_slice(bytes_of(0)?);
                return Ok(());
            }
            _ => {}
        }
        if d.out_dtype != DType::F32 {
            return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "stage {}: a {} step writes {:?}",
                stage.name,
                stage.steps[i].op.name(),
                d.out_dtype
            ))));
        }
        let out = as_f32_mut(out)?;
        match &d.call {
            Call::Embedding { rows, dim } => {
                let ids = <[i32]>::ref_from_bytes(bytes_of(1)?).map_err(|_| {
                    Error::Plan(edge_schema::Error::Invalid("misaligned ids".into()))
                })?;
                if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i as usize >= *rows) {
                    return Err(Error::TokenId {
                        id: i64::from(bad),
                        rows: *rows as u32,
                    });
                }
                edge_kernels::embedding(w(0)?, ids, *dim, out);
            }
            &Call::Linear {
                m,
                k: kdim,
                n,
                bias,
                epilogue,
                ..
            } => {
                let b = if bias { Some(f(2)?) } else { None };
                let e = match epilogue {
                    Epilogue::None => None,
                    Epilogue::GeluTanh => Some(k.gelu_tanh_in_place.run),
                };
                (k.linear.run)(f(0)?, w(1)?, b, out, m, kdim, n, scratch, e);
            }
            &Call::RmsNorm { rows, dim, eps } => {
                (k.rms_norm.run)(f(0)?, rows, dim, eps, f(1)?, out);
            }
            &Call::LayerNorm {
                rows,
                dim,
                eps,
                affine,
            } => {
                let (wt, b) = if affine {
                    (Some(f(1)?), Some(f(2)?))
                } else {
                    (None, None)
                };
                (k.layer_norm.run)(f(0)?, rows, dim, eps, wt, b, out);
            }
            &Call::GroupNorm {
                channels,
                hw,
                groups,
                eps,
            } => {
                let x = f(0)?;
                match stats {
                    Some(st) if st.len() == groups => {
                        (k.group_norm_apply.run)(x, channels, hw, groups, st, f(1)?, f(2)?, out)
                    }
                    Some(st) => {
                        return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                            "stage {}: {} group statistics for a GroupNorm of {groups} groups",
                            stage.name,
                            st.len()
                        ))))
                    }
                    None => k.group_norm(x, channels, hw, groups, eps, f(1)?, f(2)?, out),
                }
            }
            &Call::Modulate {
                rows,
                dim,
                shift_row,
                scale_row,
            } => {
                let t = f(1)?;
                let row = |r: usize| &t[r * dim..(r + 1) * dim];
                (k.modulate.run)(f(0)?, rows, dim, row(shift_row), row(scale_row), out);
            }
            &Call::GatedResidual {
                rows,
                dim,
                gate_row,
            } => {
                let t = f(2)?;
                let g = &t[gate_row * dim..(gate_row + 1) * dim];
                (k.gated_residual.run)(f(0)?, f(1)?, rows, dim, g, out);
            }
            Call::Add => (k.add.run)(f(0)?, f(1)?, out),
            Call::Mul => (k.mul.run)(f(0)?, f(1)?, out),
            &Call::Scale { factor } => edge_kernels::scale(f(0)?, factor, out),
            Call::Silu => (k.silu.run)(f(0)?, out),
            Call::Relu => (k.relu.run)(f(0)?, out),
            Call::Tanh => (k.tanh.run)(f(0)?, out),
            Call::GeluTanh => (k.gelu_tanh.run)(f(0)?, out),
            Call::Attention {
                p,
                mask,
                bias,
                bf16,
            } => {
                let m = if *mask { Some(f(2)?) } else { None };
                let b = if *bias {
                    Some(f(2 + usize::from(*mask))?)
                } else {
                    None
                };
                let kernel = if *bf16 { k.attention_bf16 } else { k.attention };
                (kernel.run)(p, f(0)?, f(1)?, m, b, out);
            }
            Call::Conv2d { p, bias, .. } => {
                let b = if *bias { Some(f(2)?) } else { None };
                (k.conv2d.run)(p, f(0)?, w(1)?, b, out, scratch);
            }
            &Call::UpsampleNearest2x { channels, h, w } => {
                (k.upsample_nearest2x.run)(f(0)?, channels, h, w, out);
            }
            Call::Permute { shape, perm } => edge_kernels::permute(f(0)?, shape, perm, out),
            Call::Slice {
                shape,
                axis,
                start,
                len,
            } => edge_kernels::slice_axis(f(0)?, shape, *axis, *start, *len, out),
            &Call::Rows {
                dtype,
                row_bytes,
                start,
                len,
            } => {
                let rows = bytes_of(0)?
                    .get(start * row_bytes..(start + len) * row_bytes)
                    .ok_or_else(|| {
                        Error::Plan(edge_schema::Error::Invalid(format!(
                            "stage {}: rows {start}..{} outside their table",
                            stage.name,
                            start + len
                        )))
                    })?;
                edge_kernels::quant::dequantize_row(dtype, rows, out);
            }
            &Call::TimestepEmbedding {
                dim,
                flip_sin_to_cos,
                downscale_freq_shift,
                max_period,
            } => edge_kernels::timestep_embedding(
                f(0)?,
                dim,
                flip_sin_to_cos,
                downscale_freq_shift,
                max_period,
                out,
            ),
            &Call::T5PositionBias {
                heads,
                lq,
                lk,
                num_buckets,
                max_distance,
                bidirectional,
            } => edge_kernels::t5_position_bias(
                f(0)?,
                heads,
                lq,
                lk,
                num_buckets,
                max_distance,
                bidirectional,
                out,
            ),
            // Written as bytes above.
            Call::Quantize { .. } | Call::Concat { .. } | Call::Copy => {}
        }
        Ok(())
    }
}

impl<'p> crate::executor::Executor<'p> for Session<'p> {
    fn plan(&self) -> &'p Plan {
        self.plan
    }

    fn run_stage_bytes(
        &mut self,
        index: u32,
        inputs: &[StageInput<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<()> {
        self.load_inputs(index, inputs, outputs.len())?;
        let steps = self.plan.meta().stages[index as usize].steps.len();
        self.run_steps_bound(index, 0, steps, None, inputs)?;
        self.store_outputs(index, outputs)
    }

    fn run_steps(
        &mut self,
        stage: u32,
        first: usize,
        end: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
    ) -> Result<()> {
        self.run_steps_bound(stage, first, end, stats, &[])
    }

    fn with_value(
        &self,
        stage: u32,
        id: u32,
        f: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<()> {
        f(self.value(stage, id)?)
    }

    fn with_value_mut(
        &mut self,
        stage: u32,
        id: u32,
        f: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        f(self.value_mut(stage, id)?)
    }

    fn streamer(&self) -> &crate::stream::Streamer {
        &self.streamer
    }

    fn spill_dir(&self) -> std::path::PathBuf {
        self.spill_dir.clone().unwrap_or_else(std::env::temp_dir)
    }

    fn host_kernels(&self) -> &KernelTable {
        &self.kernels
    }

    fn set_profiling(&mut self, on: bool) {
        Session::set_profiling(self, on);
    }

    fn replace_profile(
        &mut self,
        p: Option<crate::profile::Profile>,
    ) -> Option<crate::profile::Profile> {
        Session::replace_profile(self, p)
    }

    fn profile(&self) -> Option<&crate::profile::Profile> {
        Session::profile(self)
    }

    fn set_check_finite(&mut self, on: bool) {
        self.check_finite = on;
    }
}
