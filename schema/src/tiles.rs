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

/// The windows covering an axis of `len` latent pixels with windows of `win` pixels and a halo
/// of `halo` pixels: one window when `win == len`, else `None` unless `2·halo < win < len`.
pub fn axis_windows(len: usize, win: usize, halo: usize) -> Option<Vec<AxisWindow>> {
    if win == 0 || win > len || (win < len && 2 * halo >= win) {
        return None;
    }
    if win == len {
        return Some(vec![AxisWindow {
            core_start: 0,
            core_len: len,
            win_start: 0,
        }]);
    }
    // The first and last windows need context on one side only: their cores are `win − halo`
    // long; the cores between are `win − 2·halo`, each window centred on its core.
    let core = win - 2 * halo;
    let mut out = vec![AxisWindow {
        core_start: 0,
        core_len: win - halo,
        win_start: 0,
    }];
    let mut start = win - halo;
    while len - start > win - halo {
        out.push(AxisWindow {
            core_start: start,
            core_len: core,
            win_start: start - halo,
        });
        start += core;
    }
    out.push(AxisWindow {
        core_start: start,
        core_len: len - start,
        win_start: len - win,
    });
    Some(out)
}

/// The number of windows [`axis_windows`] places along an axis of `len` for `win` and `halo`
/// (1 when `win == len`, else `ceil((len − 2·halo) / (win − 2·halo))`, at least 2).
pub fn window_count(len: usize, win: usize, halo: usize) -> usize {
    if win >= len {
        return 1;
    }
    (len - 2 * halo).div_ceil(win - 2 * halo).max(2)
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

/// The halo (latent pixels) a window needs so that one interval's convolutions never reach a
/// core value through the window's edge: over intervals, the sum of each convolution's
/// largest padding divided by its spatial factor, rounded up. `None` when the stage holds an
/// operation that is not local (or a strided convolution), so that windows cannot reproduce
/// the whole image.
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
                    if stride != &[1, 1] {
                        return None;
                    }
                    let f = spatial_factor(stage, *step.inputs.first()?, win_h, win_w)?;
                    if f > UNIT {
                        return None;
                    }
                    let p = *pad.iter().max()? as usize;
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

/// What an exact decode of `size` holds on the host: the held tensors in
/// [`crate::plan::HeldIn::Memory`] mode, the spill buffers in `File` mode; 0 for other
/// decodes or a plan whose tiling does not verify.
pub fn host_bytes(meta: &PlanMeta, size: &ImageSize) -> u64 {
    let Some(t) = &size.decoder_tiling else {
        return 0;
    };
    let Some(sync) = &t.sync else { return 0 };
    let Some(tail) = meta.stages.get(t.stage as usize) else {
        return 0;
    };
    let ds = meta.vae.downscale.max(1) as usize;
    let schedule = sync_schedule(tail, &sync.sync_steps);
    let win = (t.tile_latent_h as usize, t.tile_latent_w as usize);
    let (lh, lw) = (size.height as usize / ds, size.width as usize / ds);
    match sync.held {
        HeldIn::Memory => peak_held_bytes(tail, &schedule, win, lh, lw),
        HeldIn::File => spill_buffer_bytes(tail, &schedule, &sync.sync_steps, win, lh, lw),
    }
    .unwrap_or(0)
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
    let (Some(sync), Some(tail)) = (&t.sync, meta.stages.get(t.stage as usize)) else {
        return 0;
    };
    let ds = meta.vae.downscale.max(1) as usize;
    peak_held_bytes(
        tail,
        &sync_schedule(tail, &sync.sync_steps),
        (t.tile_latent_h as usize, t.tile_latent_w as usize),
        size.height as usize / ds,
        size.width as usize / ds,
    )
    .unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn windows_partition_the_axis_with_cores_inside_windows() {
        for len in 1usize..60 {
            for win in 1..=len {
                for halo in 0..win.div_ceil(2) {
                    let Some(ws) = axis_windows(len, win, halo) else {
                        assert!(2 * halo >= win && win < len);
                        continue;
                    };
                    let mut next = 0;
                    for w in &ws {
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
    }
}
