//! The plan verifier: everything the runtime checks before it trusts a plan.
//!
//! Like a flatbuffers verifier, it walks every table: tensor ranges inside their sections,
//! sections inside the weight region, value shapes against their storage, every step's op
//! against its inputs and outputs (by re-running shape inference), arena slices inside the
//! arena, no two simultaneously live values overlapping, segments covering the steps in
//! order, and the stage kinds' input/output contracts. After `verify_meta` succeeds, kernels
//! can index the slices the runtime gives them without further checks.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::header::{SECTION_ALIGN, TENSOR_ALIGN};
use crate::op::{numel, Op, MAX_RANK};
use crate::plan::{ArenaSlice, PackLayout, PlanMeta, Stage, StageKind, Storage};

mod pipeline;

fn invalid(msg: String) -> Error {
    Error::Invalid(msg)
}

/// Verifies `meta` against a weight region of `weights_len` bytes: first the file's integrity
/// ([`verify_file`]: sections, tensors, every stage's values, steps, arena and segments), then
/// the rules of the pipeline the runtime runs ([`pipeline::verify_pipeline`]). Does not hash
/// sections (see [`verify_section_digest`]).
pub fn verify_meta(meta: &PlanMeta, weights_len: u64) -> Result<()> {
    verify_file(meta, weights_len)?;
    pipeline::verify_pipeline(meta)
}

/// The integrity of a plan's metadata, whatever pipeline it serves: every weight section lies
/// inside the `weights_len`-byte weight region, every tensor inside its section with the byte
/// length its type and shape imply, and every stage is well formed ([`verify_stage`]: values,
/// op arity and shapes, arena slots and liveness, segments).
pub fn verify_file(meta: &PlanMeta, weights_len: u64) -> Result<()> {
    for (i, s) in meta.sections.iter().enumerate() {
        let end = s.offset.checked_add(s.len);
        if s.offset % SECTION_ALIGN != 0 || end.is_none_or(|e| e > weights_len) {
            return Err(Error::Truncated {
                what: format!("weight section {i}"),
                start: s.offset,
                end: end.unwrap_or(u64::MAX),
                len: weights_len,
            });
        }
    }
    for (i, t) in meta.tensors.iter().enumerate() {
        let sec = meta.sections.get(t.section as usize).ok_or_else(|| {
            invalid(format!(
                "tensor {i} ({}) names missing section {}",
                t.name, t.section
            ))
        })?;
        let n = numel(&t.shape).ok_or_else(|| {
            invalid(format!(
                "tensor {i} ({}) has invalid shape {:?}",
                t.name, t.shape
            ))
        })?;
        let row = t.shape.last().copied().unwrap_or(1);
        let bytes = t
            .dtype
            .bytes_for(n)
            .filter(|_| row % t.dtype.block_size() as u64 == 0);
        if bytes != Some(t.len) {
            return Err(invalid(format!(
                "tensor {i} ({}) of {} {:?} has {} bytes (expected {:?})",
                t.name, t.dtype, t.shape, t.len, bytes
            )));
        }
        if t.layout == PackLayout::Interleaved4x8
            && (!matches!(t.dtype, DType::Q8_0 | DType::Q4_0) || t.shape.len() != 2)
        {
            return Err(invalid(format!(
                "tensor {i} ({}) of {} {:?} is in layout Interleaved4x8, which holds only \
                 2-D Q8_0/Q4_0 matrices",
                t.name, t.dtype, t.shape
            )));
        }
        if matches!(
            t.layout,
            PackLayout::Interleaved16x4 | PackLayout::Interleaved8x4A7
        ) && (t.dtype != DType::Q8_0 || t.shape.len() != 2)
        {
            return Err(invalid(format!(
                "tensor {i} ({}) of {} {:?} is in layout {:?}, which holds only 2-D Q8_0 \
                 matrices",
                t.name, t.dtype, t.shape, t.layout
            )));
        }
        if t.layout == PackLayout::Bf16Pairs16
            && (t.dtype != DType::BF16 || t.shape.len() != 2 || t.shape[1] % 2 != 0)
        {
            return Err(invalid(format!(
                "tensor {i} ({}) of {} {:?} is in layout Bf16Pairs16, which holds only \
                 2-D BF16 matrices of an even number of columns",
                t.name, t.dtype, t.shape
            )));
        }
        let end = t.offset.checked_add(t.len);
        if t.offset % TENSOR_ALIGN != 0 || end.is_none_or(|e| e > sec.len) {
            return Err(Error::Truncated {
                what: format!("tensor {i} ({}) in section {}", t.name, t.section),
                start: t.offset,
                end: end.unwrap_or(u64::MAX),
                len: sec.len,
            });
        }
    }
    for (i, s) in meta.stages.iter().enumerate() {
        verify_stage(meta, s).map_err(|e| match e {
            Error::Invalid(m) => invalid(format!("stage {i} ({}): {m}", s.name)),
            other => other,
        })?;
    }
    Ok(())
}

/// Reads the metadata of a whole plan `file` whose header is `h` (already read with
/// [`crate::header::Header::read`], which bounds its ranges): checks the metadata digest,
/// decodes it and verifies it ([`verify_meta`]). The one way the planner (`inspect`) and the
/// runtime read a plan's metadata.
pub fn read_meta(file: &[u8], h: &crate::header::Header) -> Result<PlanMeta> {
    let start = h.meta_offset.get() as usize;
    let meta_bytes = file
        .get(start..start.saturating_add(h.meta_len.get() as usize))
        .ok_or_else(|| Error::Truncated {
            what: "metadata".into(),
            start: start as u64,
            end: start as u64 + h.meta_len.get(),
            len: file.len() as u64,
        })?;
    if blake3::hash(meta_bytes).as_bytes() != &h.meta_digest {
        return Err(Error::ChecksumMismatch {
            what: "metadata".into(),
        });
    }
    let meta = PlanMeta::decode(meta_bytes)?;
    verify_meta(&meta, h.weights_len.get())?;
    Ok(meta)
}

/// Checks an exact (GroupNorm-synced) tiling: the head stage decodes the whole latent into what
/// the tail stage takes window by window; the sync steps are exactly the tail's GroupNorms; the
/// tail holds only local operations; the halo covers what one interval's convolutions consume
/// and fits the window; every held value is a `[c, f·h, f·w]` window of a whole-image tensor.
/// Checks a statistics estimate (`crate::plan::StatsEstimate`): a whole decoder for the
/// reduced latent whose GroupNorms pair one to one (same groups and channels) with the tile
/// decoder's, on blended tiles only.
fn verify_estimate(
    meta: &PlanMeta,
    sz: &crate::plan::ImageSize,
    t: &crate::plan::VaeTiling,
    e: &crate::plan::StatsEstimate,
) -> Result<()> {
    use crate::tiles;
    if t.sync.is_some() {
        return Err(invalid(
            "exact tiles cannot also estimate their statistics".into(),
        ));
    }
    if !(2..=64).contains(&e.factor) {
        return Err(invalid(format!(
            "reduction factor {} is not in 2…64",
            e.factor
        )));
    }
    let ds = meta.vae.downscale.max(1);
    let (lw, lh) = (sz.width / ds, sz.height / ds);
    let (rw, rh) = (
        tiles::reduced_len(lw, e.factor),
        tiles::reduced_len(lh, e.factor),
    );
    let probe = meta
        .stages
        .get(e.stage as usize)
        .filter(|p| {
            p.kind == StageKind::VaeDecoder
                && u64::from(p.width) == u64::from(rw) * u64::from(ds)
                && u64::from(p.height) == u64::from(rh) * u64::from(ds)
        })
        .ok_or_else(|| {
            invalid(format!(
                "stage {} is not a VAE decoder for the {rw}x{rh} reduced latent",
                e.stage
            ))
        })?;
    let tile = &meta.stages[t.stage as usize];
    let (a, b) = (tiles::group_norms(probe), tiles::group_norms(tile));
    let pair = |x: &(u32, u32, u64), y: &(u32, u32, u64)| x.1 == y.1 && x.2 == y.2 && x.1 > 0;
    if a.len() != b.len() || !a.iter().zip(&b).all(|(x, y)| pair(x, y)) {
        return Err(invalid(format!(
            "the estimate's {} GroupNorms do not pair with the tile decoder's {}",
            a.len(),
            b.len()
        )));
    }
    Ok(())
}

fn verify_sync(
    meta: &PlanMeta,
    sz: &crate::plan::ImageSize,
    t: &crate::plan::VaeTiling,
    sync: &crate::plan::GroupNormSync,
) -> Result<()> {
    let ds = u64::from(meta.vae.downscale);
    let (lw, lh) = (
        u64::from(sz.width) / ds.max(1),
        u64::from(sz.height) / ds.max(1),
    );
    let tail = &meta.stages[t.stage as usize];
    let head = meta
        .stages
        .get(sync.head_stage as usize)
        .filter(|h| {
            h.kind == StageKind::VaeDecoderHead && h.width == sz.width && h.height == sz.height
        })
        .ok_or_else(|| {
            invalid(format!(
                "head stage {} is not a decoder head for the whole image",
                sync.head_stage
            ))
        })?;
    let shape = |st: &Stage, id: u32| st.values.get(id as usize).map(|v| v.shape.clone());
    let hidden = shape(head, head.outputs[0]).unwrap_or_default();
    let window = shape(tail, tail.inputs[0]).unwrap_or_default();
    let (th, tw) = (u64::from(t.tile_latent_h), u64::from(t.tile_latent_w));
    if hidden.len() != 3
        || hidden[1..] != [lh, lw]
        || window != [hidden[0], th, tw]
        || shape(head, head.inputs[0]).is_none_or(|s| s[1..] != [lh, lw])
    {
        return Err(invalid(format!(
            "head output {hidden:?} and tail input {window:?} do not match a {lw}x{lh} latent in {tw}x{th} windows"
        )));
    }
    if t.overlap_latent_w != 0 || t.overlap_latent_h != 0 {
        return Err(invalid("overlaps must be 0 (nothing is blended)".into()));
    }
    windows_ok(
        tail,
        &sync.sync_steps,
        sync.halo_latent as usize,
        (th as usize, tw as usize),
        (lh as usize, lw as usize),
        ds as usize,
    )
}

/// Checks an exact tiled encode ([`crate::plan::EncoderTiling`]): a front for the windows
/// from `[3, ds·th, ds·tw]` to `[C, th, tw]`, a back for the whole latent from `[C, lh, lw]`
/// to `[2c, lh, lw]`, and the windows' geometry ([`windows_ok`]).
fn verify_encoder_tiling(
    meta: &PlanMeta,
    sz: &crate::plan::ImageSize,
    et: &crate::plan::EncoderTiling,
) -> Result<()> {
    let ds = u64::from(meta.vae.downscale.max(1));
    let (lw, lh) = (u64::from(sz.width) / ds, u64::from(sz.height) / ds);
    let (th, tw) = (u64::from(et.tile_latent_h), u64::from(et.tile_latent_w));
    if th == 0 || tw == 0 || th > lh || tw > lw {
        return Err(invalid(format!(
            "{tw}x{th} windows do not fit a {lw}x{lh} latent"
        )));
    }
    let stage = |i: u32, kind: StageKind, w: u64, h: u64| {
        meta.stages
            .get(i as usize)
            .filter(|s| s.kind == kind && u64::from(s.width) == w && u64::from(s.height) == h)
    };
    let down =
        stage(et.down_stage, StageKind::VaeEncoderDown, tw * ds, th * ds).ok_or_else(|| {
            invalid(format!(
                "stage {} is not the windows' encoder front",
                et.down_stage
            ))
        })?;
    let mid = stage(
        et.mid_stage,
        StageKind::VaeEncoderMid,
        u64::from(sz.width),
        u64::from(sz.height),
    )
    .ok_or_else(|| {
        invalid(format!(
            "stage {} is not the whole image's encoder back",
            et.mid_stage
        ))
    })?;
    let shape = |st: &Stage, id: Option<&u32>| {
        id.and_then(|&i| st.values.get(i as usize))
            .map(|v| v.shape.clone())
    };
    let hidden = shape(down, down.outputs.first()).unwrap_or_default();
    let c2 = 2 * u64::from(meta.vae.latent_channels);
    if shape(down, down.inputs.first()) != Some(vec![3, th * ds, tw * ds])
        || hidden.len() != 3
        || hidden[1..] != [th, tw]
        || shape(mid, mid.inputs.first()) != Some(vec![hidden[0], lh, lw])
        || shape(mid, mid.outputs.first()) != Some(vec![c2, lh, lw])
    {
        return Err(invalid(format!(
            "front {:?} → {hidden:?} and back {:?} → {:?} do not encode a {}x{} image in {tw}x{th}-latent-pixel windows",
            shape(down, down.inputs.first()),
            shape(mid, mid.inputs.first()),
            shape(mid, mid.outputs.first()),
            sz.width,
            sz.height
        )));
    }
    windows_ok(
        down,
        &et.sync_steps,
        et.halo_latent as usize,
        (th as usize, tw as usize),
        (lh as usize, lw as usize),
        1,
    )
}

/// The checks an exact tiled stage (decoder tail or encoder front) shares: its sync steps are
/// all its GroupNorms, windows of `win` (latent pixels, `(h, w)`) with `halo` cover the
/// `latent` image and leave a core, the halo covers the convolutions' context, every held value
/// is a window of the stage, the output is a window of factor `out_factor`, and the held bytes
/// are computable.
fn windows_ok(
    tail: &Stage,
    sync_steps: &[u32],
    halo: usize,
    (th, tw): (usize, usize),
    (lh, lw): (usize, usize),
    out_factor: usize,
) -> Result<()> {
    use crate::tiles;
    let shape = |st: &Stage, id: u32| st.values.get(id as usize).map(|v| v.shape.clone());
    let norms: Vec<u32> = tail
        .steps
        .iter()
        .enumerate()
        .filter(|(_, st)| matches!(st.op, Op::GroupNorm { .. }))
        .map(|(i, _)| i as u32)
        .collect();
    if sync_steps != norms.as_slice() {
        return Err(invalid(format!(
            "sync steps {:?} are not the tail's GroupNorm steps {norms:?}",
            sync_steps
        )));
    }
    if tiles::axis_windows(lh, th, halo).is_none() || tiles::axis_windows(lw, tw, halo).is_none() {
        return Err(invalid(format!(
            "windows of {tw}x{th} latent pixels with a halo of {halo} leave no core or cannot cover the {lw}x{lh} latent (each needs a core inside the halo and every window an even first row and column; plans from before 2026-12-05 may have odd ones: compile the plan again)"
        )));
    }
    let schedule = tiles::sync_schedule(tail, sync_steps);
    let need = tiles::required_halo(tail, &schedule, th, tw).ok_or_else(|| {
        invalid("the tail holds an operation that is not local or a strided convolution".into())
    })?;
    if need > halo {
        return Err(invalid(format!(
            "halo {halo} is narrower than the {need} latent pixels the convolutions consume"
        )));
    }
    for iv in &schedule.intervals {
        for &v in iv.restore.iter().chain(&iv.save) {
            if tiles::spatial_factor(tail, v, th, tw).is_none() {
                return Err(invalid(format!(
                    "held value {v} {:?} is not an f32 [c, f·{th}, f·{tw}] window",
                    shape(tail, v)
                )));
            }
        }
    }
    if tiles::spatial_factor(tail, tail.outputs[0], th, tw) != Some(out_factor) {
        return Err(invalid("the output is not a window of the stage".into()));
    }
    tiles::peak_held_bytes(tail, &schedule, (th, tw), lh, lw)
        .and_then(|_| tiles::spill_buffer_bytes(tail, &schedule, sync_steps, (th, tw), lh, lw))
        .ok_or_else(|| invalid("held tensors overflow".into()))?;
    Ok(())
}

/// Checks one section's digest against `bytes` (the section's bytes).
pub fn verify_section_digest(meta: &PlanMeta, section: usize, bytes: &[u8]) -> Result<()> {
    let s = meta
        .sections
        .get(section)
        .ok_or_else(|| invalid(format!("no section {section}")))?;
    if blake3::hash(bytes).as_bytes() != &s.digest {
        return Err(Error::ChecksumMismatch {
            what: format!("weight section {section}"),
        });
    }
    Ok(())
}

fn expected_io(kind: StageKind) -> (usize, usize) {
    match kind {
        StageKind::TextEncoder => (2, 1),
        StageKind::CrossKv => (1, 1),
        StageKind::Denoiser => (4, 1),
        StageKind::VaeDecoder => (1, 1),
        StageKind::VaeEncoder => (1, 1),
        StageKind::VaeDecoderHead => (1, 1),
        StageKind::VaeDecoderTail => (1, 1),
        StageKind::TinyDecoder => (1, 1),
        StageKind::VaeEncoderDown => (1, 1),
        StageKind::VaeEncoderMid => (1, 1),
    }
}

fn verify_stage(meta: &PlanMeta, s: &Stage) -> Result<()> {
    // Values: shapes, storage ranges.
    for (i, v) in s.values.iter().enumerate() {
        if v.shape.len() > MAX_RANK {
            return Err(invalid(format!("value {i} has rank {}", v.shape.len())));
        }
        let n = numel(&v.shape)
            .ok_or_else(|| invalid(format!("value {i} has invalid shape {:?}", v.shape)))?;
        match &v.storage {
            Storage::Arena(a) => {
                if !(crate::op::is_cache_type(v.dtype) || v.dtype == DType::I32) {
                    return Err(invalid(format!("arena value {i} has dtype {}", v.dtype)));
                }
                let bytes = v.dtype.bytes_for(n);
                if bytes != Some(a.len) {
                    return Err(invalid(format!(
                        "value {i} {:?} needs {bytes:?} bytes, its slot has {}",
                        v.shape, a.len
                    )));
                }
                check_slice(a, s.arena_size, &format!("value {i}"))?;
            }
            Storage::Input(k) => {
                if s.inputs.get(*k as usize) != Some(&(i as u32)) {
                    return Err(invalid(format!(
                        "value {i} claims to be stage input {k}, which it is not"
                    )));
                }
                if !(crate::op::is_cache_type(v.dtype) || v.dtype == DType::I32) {
                    return Err(invalid(format!("input value {i} has dtype {}", v.dtype)));
                }
            }
            Storage::Weight(t) => {
                let t = meta
                    .tensors
                    .get(*t as usize)
                    .ok_or_else(|| invalid(format!("value {i} names missing tensor {t}")))?;
                if t.shape != v.shape || t.dtype != v.dtype {
                    return Err(invalid(format!(
                        "value {i} ({} {:?}) does not match tensor {} ({} {:?})",
                        v.dtype, v.shape, t.name, t.dtype, t.shape
                    )));
                }
            }
        }
    }
    let arena_of = |id: u32| arena_slot(s, id);
    let (ni, no) = expected_io(s.kind);
    if s.inputs.len() != ni || s.outputs.len() != no {
        return Err(invalid(format!(
            "{:?} stage must have {ni} inputs and {no} outputs",
            s.kind
        )));
    }
    for (k, &id) in s.inputs.iter().enumerate() {
        let bound =
            s.values.get(id as usize).map(|v| &v.storage) == Some(&Storage::Input(k as u32));
        if arena_of(id).is_none() && !bound {
            return Err(invalid(format!(
                "stage input {id} is neither an arena value nor bound input {k}"
            )));
        }
    }
    for &id in &s.outputs {
        if arena_of(id).is_none() {
            return Err(invalid(format!("stage output {id} is not an arena value")));
        }
    }
    // Steps: ids, op shapes, scratch, aliasing.
    let mut produced = vec![false; s.values.len()];
    for &id in &s.inputs {
        produced[id as usize] = true;
    }
    for (k, step) in s.steps.iter().enumerate() {
        let fail = |m: String| invalid(format!("step {k} ({}): {m}", step.op.name()));
        if step.outputs.len() != 1 {
            return Err(fail("must have exactly one output".into()));
        }
        let mut ins = Vec::with_capacity(step.inputs.len());
        for (slot, &id) in step.inputs.iter().enumerate() {
            let v = s
                .values
                .get(id as usize)
                .ok_or_else(|| fail(format!("input {id} out of range")))?;
            // Repacked weights are read only by the linear kernels, as their weight operand.
            if let Storage::Weight(t) = v.storage {
                let repacked = meta
                    .tensors
                    .get(t as usize)
                    .map(|t| t.layout)
                    .filter(|l| *l != PackLayout::RowMajor);
                let linear_weight = matches!(step.op, Op::Linear { .. }) && slot == 1;
                if let Some(l) = repacked.filter(|_| !linear_weight) {
                    return Err(fail(format!(
                        "input {slot} is tensor {t} in layout {l:?}, which only a linear \
                         weight may use"
                    )));
                }
            }
            if matches!(v.storage, Storage::Arena(_)) && !produced[id as usize] {
                return Err(fail(format!("input {id} is read before it is written")));
            }
            ins.push((v.shape.as_slice(), v.dtype));
        }
        let out_id = step.outputs[0];
        let out = s
            .values
            .get(out_id as usize)
            .ok_or_else(|| fail(format!("output {out_id} out of range")))?;
        let out_slice =
            arena_of(out_id).ok_or_else(|| fail("output is not an arena value".into()))?;
        let (shape, dtype) = step.op.infer(&ins, Some(&out.shape)).map_err(fail)?;
        if shape != out.shape || dtype != out.dtype {
            return Err(fail(format!(
                "output is {} {:?}, op gives {dtype} {shape:?}",
                out.dtype, out.shape
            )));
        }
        if let Op::Embedding = step.op {
            if s.values[step.inputs[0] as usize].shape[0] < u64::from(meta.text.vocab_rows) {
                return Err(fail(
                    "embedding table has fewer rows than the text info says".into(),
                ));
            }
        }
        let in_place = in_place_concat(s, step);
        for &id in &step.inputs {
            if let Some(a) = arena_of(id) {
                let alias_ok = (matches!(step.op, Op::Reshape) && a == out_slice) || in_place;
                if a.overlaps(&out_slice) && !alias_ok {
                    return Err(fail(format!("input {id} overlaps the output in the arena")));
                }
            }
        }
        if let Some(sc) = &step.scratch {
            check_slice(sc, s.arena_size, &format!("step {k} scratch"))?;
        }
        produced[out_id as usize] = true;
    }
    for &id in &s.outputs {
        if !produced[id as usize] {
            return Err(invalid(format!("output {id} is never written")));
        }
    }
    verify_liveness(s)?;
    // Segments: contiguous, in order, covering all steps.
    let mut next = 0u32;
    for (j, seg) in s.segments.iter().enumerate() {
        if seg.first_step != next || seg.end_step < seg.first_step {
            return Err(invalid(format!(
                "segment {j} covers steps {}..{} (expected to start at {next})",
                seg.first_step, seg.end_step
            )));
        }
        if let Some(sec) = seg.section {
            if sec as usize >= meta.sections.len() {
                return Err(invalid(format!("segment {j} names missing section {sec}")));
            }
        }
        next = seg.end_step;
    }
    if next as usize != s.steps.len() {
        return Err(invalid(format!(
            "segments cover {next} of {} steps",
            s.steps.len()
        )));
    }
    if s.live_lower_bound > s.arena_size {
        return Err(invalid("live lower bound exceeds the arena size".into()));
    }
    Ok(())
}

fn check_slice(a: &ArenaSlice, arena_size: u64, what: &str) -> Result<()> {
    if a.arena != 0 {
        return Err(invalid(format!(
            "{what} is in arena {} (only arena 0 exists)",
            a.arena
        )));
    }
    match a.end() {
        Some(e) if e <= arena_size => Ok(()),
        e => Err(invalid(format!(
            "{what} spans {}..{:?} outside the arena of {arena_size} bytes",
            a.offset, e
        ))),
    }
}

/// Checks that no two arena values (or step scratch slices) that are live at the same step
/// overlap. A value is live from the step that writes it (or stage start, for inputs) to its
/// last read (or stage end, for outputs). A reshape's output may share its input's slot.
fn verify_liveness(s: &Stage) -> Result<()> {
    let n = s.steps.len();
    let mut first = vec![usize::MAX; s.values.len()];
    let mut last = vec![0usize; s.values.len()];
    for &id in &s.inputs {
        first[id as usize] = 0;
    }
    for (k, step) in s.steps.iter().enumerate() {
        for &id in &step.inputs {
            last[id as usize] = last[id as usize].max(k);
        }
        let o = step.outputs[0] as usize;
        first[o] = first[o].min(k);
        last[o] = last[o].max(k);
    }
    for &id in &s.outputs {
        last[id as usize] = n;
    }
    // Intervals: (start, end, slice, tag); tag distinguishes values from scratch.
    let mut iv: Vec<(usize, usize, ArenaSlice, usize)> = Vec::new();
    for (i, v) in s.values.iter().enumerate() {
        if let Storage::Arena(a) = v.storage {
            if first[i] != usize::MAX {
                iv.push((first[i], last[i].max(first[i]), a, i));
            }
        }
    }
    for (k, step) in s.steps.iter().enumerate() {
        if let Some(sc) = step.scratch {
            iv.push((k, k, sc, usize::MAX - k));
        }
    }
    iv.sort_by_key(|x| (x.0, x.1));
    let group = alias_groups(s);
    let aliased =
        |a: usize, b: usize| a < group.len() && b < group.len() && a != b && group[a] == group[b];
    // Sweep: for each interval, compare against active intervals overlapping in time.
    let mut active: Vec<(usize, usize, ArenaSlice, usize)> = Vec::new();
    for cur in iv {
        active.retain(|a| a.1 >= cur.0);
        for a in &active {
            if a.2.overlaps(&cur.2) && !aliased(a.3, cur.3) {
                return Err(invalid(format!(
                    "arena slots of {} and {} overlap while both are live",
                    tag_name(a.3),
                    tag_name(cur.3)
                )));
            }
        }
        active.push(cur);
    }
    Ok(())
}

fn tag_name(tag: usize) -> String {
    if tag > usize::MAX / 2 {
        format!("scratch of step {}", usize::MAX - tag)
    } else {
        format!("value {tag}")
    }
}

/// The arena slot of value `id` of `s`, if it has one.
fn arena_slot(s: &Stage, id: u32) -> Option<ArenaSlice> {
    match s.values.get(id as usize).map(|v| &v.storage) {
        Some(Storage::Arena(a)) => Some(*a),
        _ => None,
    }
}

/// Whether `step` is a concatenation whose every input lies in place inside its output's
/// slot (back to back, in order, along an axis with only unit axes before it, no input twice):
/// such a step copies nothing. Allocates nothing (the runtime asks at every step).
pub fn in_place_concat(s: &Stage, step: &crate::plan::Step) -> bool {
    let Op::Concat { axis } = step.op else {
        return false;
    };
    let slot = |id: u32| arena_slot(s, id);
    let Some(&out_id) = step.outputs.first() else {
        return false;
    };
    let (Some(out_v), Some(out)) = (s.values.get(out_id as usize), slot(out_id)) else {
        return false;
    };
    let unit_prefix = out_v
        .shape
        .get(..usize::from(axis))
        .is_some_and(|p| p.iter().all(|&d| d == 1));
    if !unit_prefix {
        return false;
    }
    let mut at = out.offset;
    for (j, &id) in step.inputs.iter().enumerate() {
        let Some(a) = slot(id) else {
            return false;
        };
        if a.arena != out.arena || a.offset != at || step.inputs[..j].contains(&id) {
            return false;
        }
        match at.checked_add(a.len) {
            Some(e) => at = e,
            None => return false,
        }
    }
    Some(at) == out.end()
}

/// Groups of values that may share arena bytes while live: a reshape's output with its input
/// when they have one slot, and an in-place concatenation's inputs with its output (an input
/// placed into more than one concatenation joins only the first). Returns a group id per
/// value.
fn alias_groups(s: &Stage) -> Vec<usize> {
    let mut parent: Vec<usize> = (0..s.values.len()).collect();
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    let slot = |id: u32| arena_slot(s, id);
    let mut placed = vec![false; s.values.len()];
    for step in &s.steps {
        let Some(&out) = step.outputs.first() else {
            continue;
        };
        if out as usize >= parent.len() {
            continue;
        }
        let join = |p: &mut Vec<usize>, a: u32, b: u32| {
            let (ra, rb) = (find(p, a as usize), find(p, b as usize));
            p[ra] = rb;
        };
        match step.op {
            Op::Reshape => {
                if let Some(&src) = step.inputs.first() {
                    if (src as usize) < parent.len()
                        && slot(src).is_some()
                        && slot(src) == slot(out)
                    {
                        join(&mut parent, src, out);
                    }
                }
            }
            Op::Concat { .. }
                if in_place_concat(s, step)
                    && step
                        .inputs
                        .iter()
                        .all(|&i| !placed.get(i as usize).copied().unwrap_or(true)) =>
            {
                for &i in &step.inputs {
                    placed[i as usize] = true;
                    join(&mut parent, i, out);
                }
            }
            _ => {}
        }
    }
    (0..parent.len()).map(|i| find(&mut parent, i)).collect()
}
