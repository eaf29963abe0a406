//! Exact tiled VAE decoding with GroupNorm statistics shared across tiles: the geometry and the
//! schedule, computed by one set of functions that the planner (to size what is held), the
//! verifier (to check a plan) and the runtime (to run it) all call.
//!
//! The decoder's tail (the up blocks and the output head, stage kind
//! [`crate::plan::StageKind::VaeDecoderTail`]) holds only local operations and GroupNorms. Its steps are
//! split at every GroupNorm (the **sync steps**) into intervals. Every activation that crosses
//! an interval boundary is **held** as a whole-image tensor. An interval runs window by window:
//! each window's inputs are cut from the held tensors (the window's core plus a **halo** of
//! context), the interval's steps run on the window, and the core of every value the interval
//! produces for later intervals is written back into its held tensor. Before an interval
//! starts, its leading GroupNorm's statistics are computed over the whole held input, so every
//! window is normalised with the whole image's statistics. With a halo at least as wide as the
//! context the convolutions of one interval consume, every core value equals the whole-image
//! decode's, bit for bit on the CPU (every kernel's arithmetic per output element is
//! independent of the tensor's extent).
//!
//! Windows have one static size. Along an axis of `len` latent pixels the cores partition the
//! axis: the first and last windows lie against the image border (where the convolutions' zero
//! padding is the whole image's own) and need context on their inner side only, the windows
//! between are their cores widened by the halo on both sides.

use crate::op::Op;
use crate::plan::{HeldIn, ImageSize, PlanMeta, Stage, Storage};
use crate::DType;

/// One window along an axis, in latent pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisWindow {
    /// First latent pixel of the core this window writes.
    pub core_start: usize,
    /// Core length.
    pub core_len: usize,
    /// First latent pixel of the window (its length is the stage's window size).
    pub win_start: usize,
}

/// Whether windows of `win` latent pixels with a halo of `halo` can cover an axis of `len`:
/// one window of the whole axis, or smaller windows at least `2·halo + 2` long whose starts
/// are all even ([`axis_windows`]), so `len − win` must be even. Even starts: the CPU's
/// Winograd convolutions (`edge_kernels::winograd_applies`) anchor their 2×2 output tiles at a
/// window's origin, and a window gives the whole image's bits only where those tiles are the
/// whole image's.
pub fn window_ok(len: usize, win: usize, halo: usize) -> bool {
    win == len || (win < len && win >= 2 * halo + 2 && (len - win).is_multiple_of(2))
}

/// The largest window of at most `win` latent pixels that an axis of `len` can take as far as
/// parity goes: `win`, or `win − 1` when `len − win` is odd.
pub fn align_window(len: usize, win: usize) -> usize {
    if win < len && !(len - win).is_multiple_of(2) {
        win - 1
    } else {
        win
    }
}

/// The windows covering an axis of `len` latent pixels with windows of `win` pixels and a halo
/// of `halo` pixels: one window when `win == len`, else `None` unless [`window_ok`].
pub fn axis_windows(len: usize, win: usize, halo: usize) -> Option<Vec<AxisWindow>> {
    if win == 0 || !window_ok(len, win, halo) {
        return None;
    }
    if win == len {
        return Some(vec![AxisWindow {
            core_start: 0,
            core_len: len,
            win_start: 0,
        }]);
    }
    // The first and last windows need context on one side only; the windows between are their
    // cores widened by the halo on both sides. Windows start `step` apart (`win − 2·halo`
    // rounded down to even), so every start is even: 0, step, 2·step, …, and `len − win`.
    let step = (win - 2 * halo) & !1;
    let mut out = vec![AxisWindow {
        core_start: 0,
        core_len: step + halo,
        win_start: 0,
    }];
    let mut start = step + halo;
    while len - start > win - halo {
        out.push(AxisWindow {
            core_start: start,
            core_len: step,
            win_start: start - halo,
        });
        start += step;
    }
    out.push(AxisWindow {
        core_start: start,
        core_len: len - start,
        win_start: len - win,
    });
    Some(out)
}

/// The number of windows [`axis_windows`] places along an axis of `len` for `win` and `halo`
/// (1 when `win ≥ len`, else `ceil((len − win) / step) + 1` with `step` = `win − 2·halo`
/// rounded down to even, at least 2).
pub fn window_count(len: usize, win: usize, halo: usize) -> usize {
    if win >= len {
        return 1;
    }
    let step = (win.saturating_sub(2 * halo) & !1).max(1);
    ((len - win).div_ceil(step) + 1).max(2)
}

/// The run of steps `first..end` and what crosses its boundaries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interval {
    /// First step (a sync step, except for a first interval before the first sync step).
    pub first: usize,
    /// One past the last step.
    pub end: usize,
    /// Values defined before `first` (stage inputs or earlier steps' outputs) that this
    /// interval's steps read: cut from their held tensors into each window.
    pub restore: Vec<u32>,
    /// Values this interval defines that a later interval reads or that are stage outputs:
    /// each window's core is written into their held tensors.
    pub save: Vec<u32>,
    /// Held values no interval after this one reads (released after it).
    pub release: Vec<u32>,
}

/// The intervals of a synced tail stage, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncSchedule {
    pub intervals: Vec<Interval>,
}

fn is_activation(stage: &Stage, id: u32) -> bool {
    stage
        .values
        .get(id as usize)
        .is_some_and(|v| matches!(v.storage, Storage::Arena(_)))
}

/// Splits `stage`'s steps at `sync_steps` (ascending, in range; checked by the verifier) into
/// intervals and computes what each restores, saves and releases. Stage outputs are saved by
/// the interval that defines them and never released.
pub fn sync_schedule(stage: &Stage, sync_steps: &[u32]) -> SyncSchedule {
    let n = stage.steps.len();
    let mut bounds: Vec<usize> = Vec::with_capacity(sync_steps.len() + 2);
    bounds.push(0);
    bounds.extend(sync_steps.iter().map(|&s| s as usize).filter(|&s| s > 0));
    bounds.push(n);
    let intervals_n = bounds.len() - 1;
    // Interval that defines each value (None: a stage input) and the last interval reading it.
    let mut def: Vec<Option<usize>> = vec![None; stage.values.len()];
    let mut last_use: Vec<Option<usize>> = vec![None; stage.values.len()];
    for i in 0..intervals_n {
        for step in stage.steps.get(bounds[i]..bounds[i + 1]).unwrap_or(&[]) {
            for &v in &step.inputs {
                if let Some(l) = last_use.get_mut(v as usize) {
                    *l = Some(i);
                }
            }
            for &v in &step.outputs {
                if let Some(d) = def.get_mut(v as usize) {
                    *d = Some(i);
                }
            }
        }
    }
    let mut intervals: Vec<Interval> = (0..intervals_n)
        .map(|i| Interval {
            first: bounds[i],
            end: bounds[i + 1],
            ..Interval::default()
        })
        .collect();
    for (i, iv) in intervals.iter_mut().enumerate() {
        let mut restore = Vec::new();
        for step in stage.steps.get(iv.first..iv.end).unwrap_or(&[]) {
            for &v in &step.inputs {
                let before = def.get(v as usize).is_some_and(|d| d.is_none_or(|d| d < i));
                if before && is_activation(stage, v) && !restore.contains(&v) {
                    restore.push(v);
                }
            }
        }
        iv.restore = restore;
    }
    for (v, d) in def.iter().enumerate() {
        let v = v as u32;
        if !is_activation(stage, v) {
            continue;
        }
        let output = stage.outputs.contains(&v);
        let used_later = |d: usize| last_use[v as usize].is_some_and(|l| l > d);
        match *d {
            Some(d) if output || used_later(d) => intervals[d].save.push(v),
            _ => {}
        }
        let held = match *d {
            Some(d) => output || used_later(d),
            None => stage.inputs.contains(&v),
        };
        if held && !output {
            if let Some(l) = last_use[v as usize] {
                intervals[l].release.push(v);
            }
        }
    }
    SyncSchedule { intervals }
}

/// Spatial factor of value `id` relative to a window of `win_h × win_w` latent pixels: `f`
/// when its shape is `[c, f·win_h, f·win_w]` with `f ≥ 1`, else `None`.
pub fn spatial_factor(stage: &Stage, id: u32, win_h: usize, win_w: usize) -> Option<usize> {
    let v = stage.values.get(id as usize)?;
    let [_, h, w] = v.shape[..] else {
        return None;
    };
    let (h, w) = (usize::try_from(h).ok()?, usize::try_from(w).ok()?);
    if win_h == 0 || win_w == 0 || h % win_h != 0 || w % win_w != 0 {
        return None;
    }
    let f = h / win_h;
    (f >= 1 && f * win_w == w && v.dtype == DType::F32).then_some(f)
}

/// Bytes of the whole-image tensor held for value `id` of a window stage, for an image of
/// `latent_h × latent_w` latent pixels.
pub fn held_bytes_of(
    stage: &Stage,
    id: u32,
    win: (usize, usize),
    latent_h: usize,
    latent_w: usize,
) -> Option<u64> {
    let f = spatial_factor(stage, id, win.0, win.1)?;
    let c = stage.values.get(id as usize)?.shape[0];
    c.checked_mul((latent_h * f) as u64)?
        .checked_mul((latent_w * f) as u64)?
        .checked_mul(4)
}

/// The most bytes held at once by a synced decode: over intervals, the held tensors alive
/// while the interval runs (those restored or passing through it, and those it saves).
pub fn peak_held_bytes(
    stage: &Stage,
    schedule: &SyncSchedule,
    win: (usize, usize),
    latent_h: usize,
    latent_w: usize,
) -> Option<u64> {
    let mut live: Vec<u32> = stage.inputs.clone();
    let mut peak = 0u64;
    for iv in &schedule.intervals {
        for &v in &iv.save {
            if !live.contains(&v) {
                live.push(v);
            }
        }
        let mut sum = 0u64;
        for &v in &live {
            sum = sum.checked_add(held_bytes_of(stage, v, win, latent_h, latent_w)?)?;
        }
        peak = peak.max(sum);
        live.retain(|v| !iv.release.contains(v));
    }
    Some(peak)
}

/// Input pixels of context a convolution reads beyond an output pixel's own footprint on
/// either side: `max(pad_lo, k − 1 − pad_lo − (s − 1))` per axis (for a stride-1 `k = 2p + 1`
/// convolution, `p`). Stride 2 (the VAE encoder's `Downsample2D`) is local on windows whose
/// input factor `f` is even and whose output factor is `f/2`: window starts, in input pixels,
/// are then even, so a window's outputs are the image's outputs at the same place. `None` for
/// other strides or factors and a kernel of another shape.
fn conv_context(
    stage: &Stage,
    step: &crate::plan::Step,
    stride: [u32; 2],
    pad: [u32; 4],
    f: usize,
    out: usize,
) -> Option<usize> {
    let s = match stride {
        [1, 1] if out == f => 1usize,
        [2, 2] if f.is_multiple_of(2) && out * 2 == f => 2,
        _ => return None,
    };
    let w = stage.values.get(*step.inputs.get(1)? as usize)?;
    let [_, _, kh, kw] = w.shape[..] else {
        return None;
    };
    let mut ctx = 0usize;
    for (k, lo) in [(kh, pad[0]), (kw, pad[2])] {
        let (k, lo) = (usize::try_from(k).ok()?, lo as usize);
        let hi = (k.checked_sub(1)?).checked_sub(s - 1)?.saturating_sub(lo);
        ctx = ctx.max(lo).max(hi);
    }
    Some(ctx)
}

/// The halo (latent pixels) a window needs so that one interval's convolutions never reach a
/// core value through the window's edge: over intervals, the sum of each convolution's
/// context ([`conv_context`]) divided by its input's spatial factor, rounded up. `None` when
/// the stage holds an operation that is not local (or a convolution of another stride), so
/// that windows cannot reproduce the whole image.
pub fn required_halo(
    stage: &Stage,
    schedule: &SyncSchedule,
    win_h: usize,
    win_w: usize,
) -> Option<usize> {
    let mut halo = 0usize;
    for iv in &schedule.intervals {
        // Sum of pad/f in units of 1/lcm, with factors powers of two up to 2^16.
        const UNIT: usize = 1 << 16;
        let mut need = 0usize;
        for step in stage.steps.get(iv.first..iv.end)? {
            match &step.op {
                Op::Conv2d { stride, pad, .. } => {
                    let f = spatial_factor(stage, *step.inputs.first()?, win_h, win_w)?;
                    let out = spatial_factor(stage, *step.outputs.first()?, win_h, win_w)?;
                    if f > UNIT {
                        return None;
                    }
                    let p = conv_context(stage, step, *stride, *pad, f, out)?;
                    need = need.checked_add(p.checked_mul(UNIT / f)?)?;
                }
                Op::GroupNorm { .. }
                | Op::Silu
                | Op::Relu
                | Op::Tanh
                | Op::Add
                | Op::Mul
                | Op::Scale { .. }
                | Op::UpsampleNearest2x => {}
                _ => return None,
            }
        }
        halo = halo.max(need.div_ceil(UNIT));
    }
    Some(halo)
}

/// Host bytes a [`crate::plan::HeldIn::File`] decode needs instead of the held tensors: a band
/// of one channel's rows across the whole width for the tallest window of any held value plus
/// one GroupNorm group of the largest GroupNorm input (statistics are computed a group at a
/// time, each group's values being contiguous), or the stage input before it is written, if
/// larger.
pub fn spill_buffer_bytes(
    stage: &Stage,
    schedule: &SyncSchedule,
    sync_steps: &[u32],
    win: (usize, usize),
    latent_h: usize,
    latent_w: usize,
) -> Option<u64> {
    let mut band = 0u64;
    for iv in &schedule.intervals {
        for &v in iv.restore.iter().chain(&iv.save) {
            let f = spatial_factor(stage, v, win.0, win.1)? as u64;
            band = band.max((win.0 as u64 * f).checked_mul(latent_w as u64 * f)?);
        }
    }
    let mut group = 0u64;
    for &s in sync_steps {
        let step = stage.steps.get(s as usize)?;
        let Op::GroupNorm { groups, .. } = step.op else {
            return None;
        };
        let bytes = held_bytes_of(stage, *step.inputs.first()?, win, latent_h, latent_w)?;
        group = group.max(bytes / 4 / u64::from(groups.max(1)));
    }
    // The stage input (the head's output) is in memory before it is written to the file.
    let mut input = 0u64;
    for &v in &stage.inputs {
        input = input.max(held_bytes_of(stage, v, win, latent_h, latent_w)? / 4);
    }
    band.checked_add(group)?.max(input).checked_mul(4)
}

/// What a tiled decode of `size` holds on the host besides the image: for exact tiles the held
/// tensors in [`crate::plan::HeldIn::Memory`] mode, the spill buffers in `File` mode; for
/// blended tiles [`blend_bytes`] (and, with estimated statistics, [`estimate_bytes`]); 0 for a
/// whole-image decode or a plan whose tiling does not verify.
pub fn host_bytes(meta: &PlanMeta, size: &ImageSize) -> u64 {
    let Some(t) = &size.decoder_tiling else {
        return 0;
    };
    let Some(sync) = &t.sync else {
        let c = u64::from(meta.vae.latent_channels);
        let ds = meta.vae.downscale.max(1);
        let blend = blend_bytes(
            c,
            (size.width, size.height),
            (t.tile_latent_w, t.tile_latent_h),
            ds,
        );
        let est = t.estimate.as_ref().map_or(0, |e| {
            meta.stages.get(e.stage as usize).map_or(0, |st| {
                estimate_bytes(
                    group_count(st),
                    c,
                    size.width / ds,
                    size.height / ds,
                    e.factor,
                )
            })
        });
        return blend + est;
    };
    let tile = (t.tile_latent_w, t.tile_latent_h);
    windowed_bytes(meta, size, t.stage, &sync.sync_steps, tile, sync.held)
}

/// Host bytes of the exact tiled stage `stage` of `size` in windows of `tile` latent pixels
/// `(w, h)`, synchronised at `sync_steps`, with its activations held in `held`: the held
/// tensors ([`peak_held_bytes`]) in memory, [`spill_buffer_bytes`] for a file; 0 for a stage
/// that does not verify.
fn windowed_bytes(
    meta: &PlanMeta,
    size: &ImageSize,
    stage: u32,
    sync_steps: &[u32],
    tile: (u32, u32),
    held: HeldIn,
) -> u64 {
    let Some(st) = meta.stages.get(stage as usize) else {
        return 0;
    };
    let ds = meta.vae.downscale.max(1) as usize;
    let schedule = sync_schedule(st, sync_steps);
    let win = (tile.1 as usize, tile.0 as usize);
    let (lh, lw) = (size.height as usize / ds, size.width as usize / ds);
    match held {
        HeldIn::Memory => peak_held_bytes(st, &schedule, win, lh, lw),
        HeldIn::File => spill_buffer_bytes(st, &schedule, sync_steps, win, lh, lw),
    }
    .unwrap_or(0)
}

/// What an exact tiled encode of `size` holds on the host while its front runs: the held
/// tensors (the image planes among them) in [`crate::plan::HeldIn::Memory`] mode, the spill
/// buffers in `File` mode; 0 without encoder tiles or for a plan whose tiling does not verify.
pub fn encoder_host_bytes(meta: &PlanMeta, size: &ImageSize) -> u64 {
    size.encoder_tiling.as_ref().map_or(0, |t| {
        let tile = (t.tile_latent_w, t.tile_latent_h);
        windowed_bytes(meta, size, t.down_stage, &t.sync_steps, tile, t.held)
    })
}

/// The bytes `size`'s exact encode holds in a spill file, when its plan holds them in one.
pub fn encoder_spilled_bytes(meta: &PlanMeta, size: &ImageSize) -> Option<u64> {
    let t = size
        .encoder_tiling
        .as_ref()
        .filter(|t| t.held == HeldIn::File)?;
    let tile = (t.tile_latent_w, t.tile_latent_h);
    Some(windowed_bytes(
        meta,
        size,
        t.down_stage,
        &t.sync_steps,
        tile,
        HeldIn::Memory,
    ))
}

/// The bytes `size`'s exact decode holds in a spill file, when its plan holds them in one
/// (`HeldIn::File`); `None` when the decode spills nothing.
pub fn spilled_bytes(meta: &PlanMeta, size: &ImageSize) -> Option<u64> {
    let spills = size
        .decoder_tiling
        .as_ref()
        .and_then(|t| t.sync.as_ref())
        .is_some_and(|s| s.held == HeldIn::File);
    spills.then(|| held_bytes(meta, size))
}

/// [`peak_held_bytes`] of `size`'s exact decode, wherever it holds them (0 for other decodes).
pub fn held_bytes(meta: &PlanMeta, size: &ImageSize) -> u64 {
    let Some(t) = &size.decoder_tiling else {
        return 0;
    };
    t.sync.as_ref().map_or(0, |sync| {
        let tile = (t.tile_latent_w, t.tile_latent_h);
        windowed_bytes(meta, size, t.stage, &sync.sync_steps, tile, HeldIn::Memory)
    })
}

/// Host bytes a blended tiled decode of a `width × height` image holds beside the image: the
/// blend weight plane (`W·H` f32), one tile of latents (`c·tw·th` f32) and one decoded tile
/// (`3 × tw·ds × th·ds` f32), for tiles of `tw × th` latent pixels.
pub fn blend_bytes(c: u64, (width, height): (u32, u32), (tw, th): (u32, u32), ds: u32) -> u64 {
    let (tw, th, ds) = (u64::from(tw), u64::from(th), u64::from(ds));
    4 * (u64::from(width) * u64::from(height) + c * tw * th + 3 * tw * ds * th * ds)
}

/// Latent pixels of the reduced latent along an axis of `len` for `factor`: `⌈len/factor⌉`.
pub fn reduced_len(len: u32, factor: u32) -> u32 {
    len.div_ceil(factor.max(1))
}

/// The statistics estimate's host bytes: the reduced latent (`c` channels) and the statistics
/// of the estimate stage's GroupNorms, `groups` in all (two f64 each, [`group_count`]).
pub fn estimate_bytes(groups: u64, c: u64, lw: u32, lh: u32, factor: u32) -> u64 {
    4 * c * u64::from(reduced_len(lw, factor)) * u64::from(reduced_len(lh, factor)) + 16 * groups
}

/// The groups of all of `stage`'s GroupNorms.
pub fn group_count(stage: &Stage) -> u64 {
    group_norms(stage).iter().map(|g| u64::from(g.1)).sum()
}

/// The bounds an estimated-statistics decode was measured within, against the whole-image
/// decode of the same latents, on the demo model `pixart-shapes-64`: 128×128, 192×128 and
/// 256×256 images, tiles of 48…128 image pixels, overlaps 0.25 and 0.5, factors 2, 4 and 8
/// (reduced latents of 4…16 latent pixels a side), from 4-step latents
/// (`tests/tests/exact_tiles.rs` `demo_estimated_statistics_stay_close_to_the_whole_decode`
/// holds every case to them) and 20-step latents (`scripts/bench-tiles`, BENCHMARKS.md). Rows
/// `(largest factor, mean difference in levels of 255, largest difference in levels)`; the
/// worst cases measured were 10.0 / 114 (factor 2) and 12.9 / 149 (factors 4 and 8), against
/// 10…70 / 73…231 for the same tiles normalised alone. The largest differences are few pixels
/// (the mid-block attention still sees one tile); the mean is the figure to plan with.
pub const ESTIMATE_BOUND_LEVELS: [(u32, f64, u8); 2] = [(2, 11.0, 120), (8, 14.0, 160)];

/// The measured bound of an estimate with `factor`, in words (for `inspect`).
pub fn estimate_error(factor: u32) -> String {
    match ESTIMATE_BOUND_LEVELS.iter().find(|b| factor <= b.0) {
        Some(&(f, mean, max)) => format!(
            "on the demo model's text-to-image latents measured within {mean} levels of 255 on average and {max} at most of the whole-image decode up to 1/{f}; not a bound for other latents"
        ),
        None => format!(
            "not measured beyond 1/{}: the estimate coarsens with the factor",
            ESTIMATE_BOUND_LEVELS[ESTIMATE_BOUND_LEVELS.len() - 1].0
        ),
    }
}

/// The GroupNorm steps of `stage`, in order: `(step, groups, channels)`.
pub fn group_norms(stage: &Stage) -> Vec<(u32, u32, u64)> {
    stage
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s.op {
            Op::GroupNorm { groups, .. } => {
                let c = s
                    .inputs
                    .first()
                    .and_then(|&x| stage.values.get(x as usize))
                    .and_then(|v| v.shape.first().copied())
                    .unwrap_or(0);
                Some((i as u32, groups, c))
            }
            _ => None,
        })
        .collect()
}

/// The latent a statistics estimate decodes: `latents` `[c, lh, lw]` (outermost first) reduced
/// by `factor` to `[c, ⌈lh/factor⌉, ⌈lw/factor⌉]`, each pixel the mean of its `factor × factor`
/// box (a box cut by the border: of the pixels it holds), then each channel shifted and scaled
/// so that its mean and standard deviation are the full latent's (averaging narrows the
/// spread, and the decoder's first GroupNorms see the latent's spread directly). Sums in f64,
/// sequential. `None` when the length does not match or `factor` is 0.
pub fn reduce_latent(
    latents: &[f32],
    c: usize,
    lh: usize,
    lw: usize,
    factor: usize,
) -> Option<Vec<f32>> {
    if factor == 0 || latents.len() != c.checked_mul(lh)?.checked_mul(lw)? {
        return None;
    }
    let (rh, rw) = (lh.div_ceil(factor), lw.div_ceil(factor));
    let mut out = vec![0f32; c * rh * rw];
    let moments = |x: &[f32]| -> (f64, f64) {
        let n = x.len().max(1) as f64;
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    };
    for ch in 0..c {
        let plane = &latents[ch * lh * lw..(ch + 1) * lh * lw];
        let dst = &mut out[ch * rh * rw..(ch + 1) * rh * rw];
        for y in 0..rh {
            for x in 0..rw {
                let (y0, x0) = (y * factor, x * factor);
                let (y1, x1) = ((y0 + factor).min(lh), (x0 + factor).min(lw));
                let mut sum = 0f64;
                for row in plane[y0 * lw..y1 * lw].chunks_exact(lw) {
                    sum += row[x0..x1].iter().map(|&v| f64::from(v)).sum::<f64>();
                }
                dst[y * rw + x] = (sum / ((y1 - y0) * (x1 - x0)) as f64) as f32;
            }
        }
        let (m0, s0) = moments(plane);
        let (m1, s1) = moments(dst);
        let scale = if s1 > 0.0 { s0 / s1 } else { 1.0 };
        for v in dst.iter_mut() {
            *v = ((f64::from(*v) - m1) * scale + m0) as f32;
        }
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reduced_latent_averages_boxes_and_keeps_each_channels_spread() {
        // One channel, 3x5, factor 2: boxes of 2x2, 2x1 at the right, 1x2 at the bottom.
        let x: Vec<f32> = (0..15).map(|i| i as f32).collect();
        let r = reduce_latent(&x, 1, 3, 5, 2).unwrap();
        assert_eq!(r.len(), 2 * 3);
        // Box means before the re-spread: 3, 5, 6.5 / 10.5, 12.5, 14 — order is kept.
        assert!(r.windows(2).take(2).all(|w| w[0] < w[1]), "{r:?}");
        let mean = |v: &[f32]| v.iter().map(|&a| f64::from(a)).sum::<f64>() / v.len() as f64;
        let sd = |v: &[f32]| {
            let m = mean(v);
            (v.iter().map(|&a| (f64::from(a) - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
        };
        assert!((mean(&r) - mean(&x)).abs() < 1e-5);
        assert!((sd(&r) - sd(&x)).abs() < 1e-5);
        // A constant channel stays constant; bad lengths and factor 0 are refused.
        let k = reduce_latent(&[2.5; 12], 1, 3, 4, 3).unwrap();
        assert!(k.iter().all(|&v| v == 2.5));
        assert!(reduce_latent(&x, 1, 3, 4, 2).is_none());
        assert!(reduce_latent(&x, 1, 3, 5, 0).is_none());
    }

    #[test]
    fn windows_partition_the_axis_with_cores_inside_windows() {
        for len in 1usize..60 {
            for win in 1..=len {
                for halo in 0..win.div_ceil(2) {
                    let Some(ws) = axis_windows(len, win, halo) else {
                        assert!(!window_ok(len, win, halo) && win < len);
                        assert!(2 * halo + 2 > win || (len - win) % 2 == 1);
                        continue;
                    };
                    let mut next = 0;
                    for w in &ws {
                        // Winograd's 2×2 output tiles: every window starts at an even pixel.
                        assert_eq!(w.win_start % 2, 0, "{len} {win} {halo}");
                        assert_eq!(w.core_start, next, "{len} {win} {halo}");
                        next += w.core_len;
                        assert!(w.win_start + win <= len);
                        // The core lies inside the window, with the halo on every interior side.
                        assert!(w.win_start <= w.core_start);
                        assert!(w.core_start + w.core_len <= w.win_start + win);
                        if w.core_start > 0 {
                            assert!(w.core_start - w.win_start >= halo, "{len} {win} {halo}");
                        }
                        if w.core_start + w.core_len < len {
                            assert!(w.win_start + win - (w.core_start + w.core_len) >= halo);
                        }
                    }
                    assert_eq!(next, len);
                    assert_eq!(ws.len(), window_count(len, win, halo), "{len} {win} {halo}");
                }
            }
        }
        assert_eq!(axis_windows(8, 9, 1), None);
        assert_eq!(axis_windows(8, 4, 2), None);
        // Odd `len − win`, and an odd window with one pixel to step.
        assert_eq!(axis_windows(64, 31, 2), None);
        assert_eq!(axis_windows(65, 5, 2), None);
        assert!(axis_windows(65, 7, 2).is_some());
        assert_eq!(
            (
                align_window(64, 31),
                align_window(64, 30),
                align_window(64, 64)
            ),
            (30, 30, 64)
        );
    }
}
