//! A session: one plan, one arena allocated once, and the kernel table; runs stages step by
//! step, matching on each step's [`Op`] and calling kernel slots.
//!
//! Borrowing: at every step the output slot and the scratch slot are carved out of the arena
//! as the only mutable pieces; the verifier proved that no input overlaps them, so inputs are
//! read from the remaining immutable pieces (an input that is not found whole in one of them
//! is refused, never read).

use edge_kernels::{AttentionParams, Conv2dParams, KernelTable, WeightRef};
use edge_schema::op::Op;
use edge_schema::plan::{ArenaSlice, PackLayout, Stage, Storage};
use edge_schema::DType;
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{Error, Result};
use crate::plan::Plan;

/// A stage input handed to [`Session::run_stage`].
#[derive(Clone, Copy, Debug)]
pub enum StageInput<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    /// The bytes of an input of a cache type (F16, Q8_0; or F32), as an earlier stage's
    /// [`Session::run_stage_bytes`] wrote them.
    Bytes(&'a [u8]),
}

/// One plan bound to an arena and a kernel table.
pub struct Session<'p> {
    plan: &'p Plan,
    /// Anonymous, page-aligned memory: pages become resident when first written, and those
    /// above a stage's arena size are released when a smaller stage starts.
    arena: memmap2::MmapMut,
    /// Bytes of the arena that may be resident (the largest stage arena since the last
    /// release).
    touched: u64,
    kernels: KernelTable,
    streamer: crate::stream::Streamer,
    profile: Option<crate::profile::Profile>,
    spill_dir: Option<std::path::PathBuf>,
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

/// Refuses a step whose planned scratch slot is smaller than its kernel needs (the schema
/// verifier does not know kernel scratch sizes; a short scratch would make the kernel panic).
/// Plans from a release whose kernels needed less scratch are refused here, by name.
fn check_scratch(op: &Op, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error::Plan(edge_schema::Error::Invalid(format!(
            "{} step has {have} bytes of scratch, its kernel needs {need} (the plan was sized for \
             other kernels: compile it again with the edgeplan of this release)",
            op.name()
        ))));
    }
    Ok(())
}

/// A shape (rank ≤ 6, verified) as `usize`s on the stack: no allocation in the step loop.
struct Dims {
    d: [usize; edge_schema::op::MAX_RANK],
    n: usize,
}

impl std::ops::Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.d[..self.n]
    }
}

fn dims(s: &[u64]) -> Dims {
    let mut d = [0usize; edge_schema::op::MAX_RANK];
    let n = s.len().min(d.len());
    for (o, &x) in d.iter_mut().zip(s) {
        *o = x as usize;
    }
    Dims { d, n }
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
        Ok(Session {
            plan,
            arena,
            touched: 0,
            kernels,
            streamer: crate::stream::Streamer::new(
                plan.meta(),
                plan.meta()
                    .budget
                    .map(|b| b.saturating_sub(max_host_bytes(plan))),
            ),
            profile: None,
            spill_dir: None,
        })
    }

    /// Starts (`true`, with an empty table) or stops timing every step per stage kind and op.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(crate::profile::Profile::default);
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

    /// Weight streaming figures so far.
    pub fn streamer(&self) -> &crate::stream::Streamer {
        &self.streamer
    }

    /// The plan this session runs.
    pub fn plan(&self) -> &'p Plan {
        self.plan
    }

    /// Runs stage `index` with `inputs` (in the order [`edge_schema::plan::StageKind`]
    /// documents) and copies its outputs into `outputs` (each exactly the output's size).
    pub fn run_stage(
        &mut self,
        index: u32,
        inputs: &[StageInput<'_>],
        outputs: &mut [&mut [f32]],
    ) -> Result<()> {
        let mut raw: Vec<&mut [u8]> = outputs.iter_mut().map(|o| o.as_mut_bytes()).collect();
        self.run_stage_bytes(index, inputs, &mut raw)
    }

    /// [`Session::run_stage`] with the outputs as bytes (each exactly the output's byte size:
    /// `4·n` for f32, [`DType::bytes_for`] for a cache type).
    pub fn run_stage_bytes(
        &mut self,
        index: u32,
        inputs: &[StageInput<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<()> {
        let plan = self.plan;
        let stage = &plan.meta().stages[index as usize];
        let arena = self.arena.as_mut_bytes();
        if inputs.len() != stage.inputs.len() || outputs.len() != stage.outputs.len() {
            return Err(Error::StageArity {
                stage: stage.name.clone(),
                inputs: inputs.len(),
                outputs: outputs.len(),
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
        self.run_steps_bound(index, 0, stage.steps.len(), None, inputs)?;
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

    /// Sets the folder where exact tiled VAE decodes whose plan holds activations in a file
    /// create their (unlinked) spill file; the default is the system's temporary folder.
    pub fn set_spill_dir(&mut self, dir: std::path::PathBuf) {
        self.spill_dir = Some(dir);
    }

    /// The folder for spill files ([`Session::set_spill_dir`], else `std::env::temp_dir()`).
    pub fn spill_dir(&self) -> std::path::PathBuf {
        self.spill_dir.clone().unwrap_or_else(std::env::temp_dir)
    }

    /// The kernel table this session calls.
    pub fn kernels(&self) -> &KernelTable {
        &self.kernels
    }

    /// Runs steps `first..end` of stage `index` on what the arena holds (values written by
    /// [`Session::value_mut`] or by earlier steps), paging each segment those steps belong to.
    /// With `stats`, the step at `first` must be a GroupNorm and normalises with them instead
    /// of its input's own statistics (tiled VAE decoding with whole-image statistics).
    pub fn run_steps(
        &mut self,
        index: u32,
        first: usize,
        end: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
    ) -> Result<()> {
        self.run_steps_bound(index, first, end, stats, &[])
    }

    /// [`Session::run_steps`] with the stage's inputs, which values stored as
    /// [`Storage::Input`] are read from.
    fn run_steps_bound(
        &mut self,
        index: u32,
        first: usize,
        end: usize,
        stats: Option<&[edge_kernels::GroupStats]>,
        bound: &[StageInput<'_>],
    ) -> Result<()> {
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
            let next = (j + 1 < stage.segments.len()).then_some(j + 1);
            self.streamer.before_segment(plan, index as usize, j, next);
            if let Some(sec) = seg.section {
                plan.section_checked(sec as usize)?;
            }
            for (i, step) in stage.steps[a..b].iter().enumerate() {
                let given = if a + i == first { stats } else { None };
                if self.profile.is_some() {
                    let t = std::time::Instant::now();
                    self.run_step(stage, step, given, bound)?;
                    if let Some(p) = self.profile.as_mut() {
                        p.record(stage, step, t.elapsed());
                    }
                } else {
                    self.run_step(stage, step, given, bound)?;
                }
            }
        }
        Ok(())
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

    fn run_step(
        &mut self,
        stage: &Stage,
        step: &edge_schema::plan::Step,
        stats: Option<&[edge_kernels::GroupStats]>,
        bound: &[StageInput<'_>],
    ) -> Result<()> {
        let plan = self.plan;
        let k = &self.kernels;
        let out_v = &stage.values[step.outputs[0] as usize];
        let Storage::Arena(out_slot) = out_v.storage else {
            return Err(Error::Plan(edge_schema::Error::Invalid(
                "output is a weight".into(),
            )));
        };
        // A reshape whose output shares its input's slot is a no-op, and so is a concatenation
        // whose inputs the planner placed inside its output.
        if let Op::Reshape = step.op {
            if stage.values[step.inputs[0] as usize].storage == Storage::Arena(out_slot) {
                return Ok(());
            }
        }
        if edge_schema::verify::in_place_concat(stage, step) {
            return Ok(());
        }
        if stats.is_some() && !matches!(step.op, Op::GroupNorm { .. }) {
            return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "stage {}: group statistics given to a {} step",
                stage.name,
                step.op.name()
            ))));
        }
        let arena = self.arena.as_mut_bytes();
        let Carved {
            pieces,
            out,
            scratch,
        } = carve(arena, &out_slot, step.scratch.as_ref())?;
        let bytes_of = |id: u32| -> Result<&[u8]> {
            match &stage.values[id as usize].storage {
                Storage::Arena(s) => read(&pieces, s),
                Storage::Weight(t) => plan.tensor_bytes(*t),
                Storage::Input(i) => match bound.get(*i as usize) {
                    Some(StageInput::F32(x)) => Ok(x.as_bytes()),
                    Some(StageInput::I32(x)) => Ok(x.as_bytes()),
                    Some(StageInput::Bytes(b)) => Ok(b),
                    None => Err(Error::Plan(edge_schema::Error::Invalid(format!(
                        "stage {}: input {i} is read in place and only run_stage gives it",
                        stage.name
                    )))),
                },
            }
        };
        let f = |id: u32| -> Result<&[f32]> { as_f32(bytes_of(id)?) };
        let w = |id: u32| -> Result<WeightRef<'_>> {
            let layout = match &stage.values[id as usize].storage {
                Storage::Weight(t) => plan
                    .meta()
                    .tensors
                    .get(*t as usize)
                    .map_or(PackLayout::RowMajor, |e| e.layout),
                Storage::Arena(_) | Storage::Input(_) => PackLayout::RowMajor,
            };
            Ok(WeightRef {
                dtype: stage.values[id as usize].dtype,
                bytes: bytes_of(id)?,
                layout,
            })
        };
        let shape = |id: u32| -> &[u64] { &stage.values[id as usize].shape };
        let ins = &step.inputs;
        // Steps writing a cache type write bytes; every other step writes f32.
        match &step.op {
            Op::Quantize { dtype } => {
                edge_kernels::quant::quantize_row(*dtype, f(ins[0])?, out);
                return Ok(());
            }
            Op::Concat { .. } if out_v.dtype != DType::F32 => {
                // Along axis 0 (verified): each input's bytes after the previous one's.
                let mut at = 0;
                for &i in ins.iter() {
                    let b = bytes_of(i)?;
                    out[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
                return Ok(());
            }
            _ => {}
        }
        let out = as_f32_mut(out)?;
        let last = |s: &[u64]| s.last().copied().unwrap_or(1) as usize;
        match &step.op {
            Op::Embedding => {
                let ids = <[i32]>::ref_from_bytes(bytes_of(ins[1])?).map_err(|_| {
                    Error::Plan(edge_schema::Error::Invalid("misaligned ids".into()))
                })?;
                let rows = shape(ins[0])[0];
                if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i as u64 >= rows) {
                    return Err(Error::TokenId {
                        id: i64::from(bad),
                        rows: rows as u32,
                    });
                }
                edge_kernels::embedding(w(ins[0])?, ids, last(shape(ins[0])), out);
            }
            Op::Linear { has_bias } => {
                let x = f(ins[0])?;
                let kdim = last(shape(ins[0]));
                let n = shape(ins[1])[0] as usize;
                let bias = if *has_bias { Some(f(ins[2])?) } else { None };
                let wd = stage.values[ins[1] as usize].dtype;
                let m = x.len() / kdim;
                let need = edge_kernels::linear_scratch_bytes(wd, m, kdim);
                check_scratch(&step.op, scratch.len(), need)?;
                (k.linear.run)(x, w(ins[1])?, bias, out, m, kdim, n, scratch);
            }
            Op::RmsNorm { eps } => {
                let x = f(ins[0])?;
                let d = last(shape(ins[0]));
                (k.rms_norm.run)(x, x.len() / d, d, *eps, f(ins[1])?, out);
            }
            Op::LayerNorm { eps, affine } => {
                let x = f(ins[0])?;
                let d = last(shape(ins[0]));
                let (wt, b) = if *affine {
                    (Some(f(ins[1])?), Some(f(ins[2])?))
                } else {
                    (None, None)
                };
                (k.layer_norm.run)(x, x.len() / d, d, *eps, wt, b, out);
            }
            Op::GroupNorm { groups, eps } => {
                let s = shape(ins[0]);
                let (c0, hw) = (s[0] as usize, (s[1] * s[2]) as usize);
                let (x, g) = (f(ins[0])?, *groups as usize);
                match stats {
                    Some(st) if st.len() == g => {
                        (k.group_norm_apply.run)(x, c0, hw, g, st, f(ins[1])?, f(ins[2])?, out)
                    }
                    Some(st) => {
                        return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                            "stage {}: {} group statistics for a GroupNorm of {g} groups",
                            stage.name,
                            st.len()
                        ))))
                    }
                    None => k.group_norm(x, c0, hw, g, *eps, f(ins[1])?, f(ins[2])?, out),
                }
            }
            Op::Modulate {
                shift_row,
                scale_row,
            } => {
                let x = f(ins[0])?;
                let d = last(shape(ins[0]));
                let t = f(ins[1])?;
                let row = |r: u32| &t[r as usize * d..(r as usize + 1) * d];
                (k.modulate.run)(x, x.len() / d, d, row(*shift_row), row(*scale_row), out);
            }
            Op::GatedResidual { gate_row } => {
                let x = f(ins[0])?;
                let d = last(shape(ins[0]));
                let t = f(ins[2])?;
                let g = &t[*gate_row as usize * d..(*gate_row as usize + 1) * d];
                (k.gated_residual.run)(x, f(ins[1])?, x.len() / d, d, g, out);
            }
            Op::Add => (k.add.run)(f(ins[0])?, f(ins[1])?, out),
            Op::Mul => (k.mul.run)(f(ins[0])?, f(ins[1])?, out),
            Op::Scale { factor } => edge_kernels::scale(f(ins[0])?, *factor, out),
            Op::Silu => (k.silu.run)(f(ins[0])?, out),
            Op::Relu => (k.relu.run)(f(ins[0])?, out),
            Op::Tanh => (k.tanh.run)(f(ins[0])?, out),
            Op::GeluTanh => (k.gelu_tanh.run)(f(ins[0])?, out),
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
            } => {
                let (qs, kvs) = (shape(ins[0]), shape(ins[1]));
                let p = AttentionParams {
                    lq: qs[0] as usize,
                    lk: kvs[0] as usize,
                    heads: *heads as usize,
                    head_dim: *head_dim as usize,
                    scale: *scale,
                    q_stride: qs[1] as usize,
                    q_offset: *q_offset as usize,
                    kv_stride: kvs[1] as usize,
                    k_offset: *k_offset as usize,
                    v_offset: *v_offset as usize,
                    masked_value: *masked_value,
                };
                let mut next = 2;
                let mask = if *has_mask {
                    next += 1;
                    Some(f(ins[2])?)
                } else {
                    None
                };
                let bias = if *has_bias { Some(f(ins[next])?) } else { None };
                (k.attention.run)(&p, f(ins[0])?, f(ins[1])?, mask, bias, out);
            }
            Op::Conv2d {
                stride,
                pad,
                has_bias,
            } => {
                let (xs, ws) = (shape(ins[0]), shape(ins[1]));
                let p = Conv2dParams {
                    cin: xs[0] as usize,
                    h: xs[1] as usize,
                    w: xs[2] as usize,
                    cout: ws[0] as usize,
                    kh: ws[2] as usize,
                    kw: ws[3] as usize,
                    stride_h: stride[0] as usize,
                    stride_w: stride[1] as usize,
                    pad_top: pad[0] as usize,
                    pad_bottom: pad[1] as usize,
                    pad_left: pad[2] as usize,
                    pad_right: pad[3] as usize,
                };
                let bias = if *has_bias { Some(f(ins[2])?) } else { None };
                let wd = stage.values[ins[1] as usize].dtype;
                let need = edge_kernels::conv2d_scratch_bytes(&p, wd);
                check_scratch(&step.op, scratch.len(), need)?;
                (k.conv2d.run)(&p, f(ins[0])?, w(ins[1])?, bias, out, scratch);
            }
            Op::UpsampleNearest2x => {
                let s = shape(ins[0]);
                (k.upsample_nearest2x.run)(
                    f(ins[0])?,
                    s[0] as usize,
                    s[1] as usize,
                    s[2] as usize,
                    out,
                );
            }
            Op::Permute { perm } => {
                let mut p = [0usize; edge_schema::op::MAX_RANK];
                for (o, &x) in p.iter_mut().zip(perm) {
                    *o = usize::from(x);
                }
                edge_kernels::permute(f(ins[0])?, &dims(shape(ins[0])), &p[..perm.len()], out);
            }
            Op::Reshape => out.copy_from_slice(f(ins[0])?),
            Op::Slice { axis, start, len } => {
                edge_kernels::slice_axis(
                    f(ins[0])?,
                    &dims(shape(ins[0])),
                    usize::from(*axis),
                    *start as usize,
                    *len as usize,
                    out,
                );
            }
            Op::Rows { start, len } => {
                let x = bytes_of(ins[0])?;
                let dt = stage.values[ins[0] as usize].dtype;
                let row = dt
                    .bytes_for(shape(ins[0])[1])
                    .ok_or_else(|| Error::Plan(edge_schema::Error::Invalid("rows".into())))?
                    as usize;
                let (a, n) = (*start as usize, *len as usize);
                edge_kernels::quant::dequantize_row(dt, &x[a * row..(a + n) * row], out);
            }
            Op::Quantize { .. } => {} // written as bytes above
            Op::Concat { axis } => {
                let parts: Vec<&[f32]> = ins.iter().map(|&i| f(i)).collect::<Result<_>>()?;
                let shapes: Vec<Dims> = ins.iter().map(|&i| dims(shape(i))).collect();
                let shape_refs: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
                edge_kernels::concat_axis(&parts, &shape_refs, usize::from(*axis), out);
            }
            Op::TimestepEmbedding {
                flip_sin_to_cos,
                downscale_freq_shift,
                max_period,
            } => {
                let dim = last(&out_v.shape);
                edge_kernels::timestep_embedding(
                    f(ins[0])?,
                    dim,
                    *flip_sin_to_cos,
                    *downscale_freq_shift,
                    *max_period,
                    out,
                );
            }
            Op::T5PositionBias {
                num_buckets,
                max_distance,
                bidirectional,
            } => {
                let o = &out_v.shape;
                edge_kernels::t5_position_bias(
                    f(ins[0])?,
                    o[0] as usize,
                    o[1] as usize,
                    o[2] as usize,
                    *num_buckets as usize,
                    *max_distance as usize,
                    *bidirectional,
                    out,
                );
            }
        }
        Ok(())
    }
}
