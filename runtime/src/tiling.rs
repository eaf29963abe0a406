//! Tiled VAE decoding, in two modes.
//!
//! **Exact** ([`decode_exact`], plans with [`GroupNormSync`]): the decoder head runs on the
//! whole latent; the tail runs window by window, interval by interval between its GroupNorms,
//! each GroupNorm normalising with the statistics of the whole image held between intervals
//! (the scheme and its proof obligations are in [`edge_schema::tiles`]). The image equals the
//! whole-image decode's bit for bit.
//!
//! **Blend** ([`decode_tiled`]): decode overlapping latent tiles with a tile-sized decoder
//! stage and blend them into the full image.
//!
//! Tiles along an axis of `len` latent pixels start every `tile − overlap` pixels; the last
//! tile is aligned to the end, so every tile is whole. Each decoded tile is weighted by a
//! linear ramp across the overlap it shares with a neighbour (weight 1 in its interior, never
//! 0), and the image is the weighted sum divided by the sum of weights. Where tiles do not
//! overlap the tile is copied as is. The VAE's group norms and mid-block attention see only
//! their tile, so a tiled decode differs from the whole-image decode by more than rounding;
//! the blending hides seams (as in stable-diffusion.cpp's `sd_tiling` and diffusers'
//! `AutoencoderKL.tiled_decode`).

use edge_schema::plan::{GroupNormSync, HeldIn, StageKind, StatsEstimate, VaeTiling};
use edge_schema::tiles::{self, AxisWindow};

use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::held::{Dims, Held};
use crate::session::StageInput;

/// What an exact tiled decode did, for `edgerun -v`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExactReport {
    /// Windows per interval.
    pub windows: usize,
    /// Intervals (GroupNorm synchronisation points + 1).
    pub intervals: usize,
    /// The most bytes of whole-image activations held at once.
    pub held_bytes: u64,
    /// Whether they were held in a spill file rather than in memory.
    pub in_file: bool,
    /// Pixels the windows cover divided by the image's pixels (the work beside the
    /// whole-image decode, from the halos).
    pub work_factor: f64,
}

/// What a tiled decode with estimated GroupNorm statistics did, for `edgerun -v`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EstimateReport {
    /// Latent pixels per reduced pixel.
    pub factor: u32,
    /// The reduced latent the statistics were estimated on, latent pixels.
    pub reduced_w: usize,
    pub reduced_h: usize,
    /// GroupNorms given the estimate (all of the tile decoder's).
    pub norms: usize,
    /// Bytes held for the estimate: the reduced latent and the statistics.
    pub held_bytes: u64,
    /// Blended tiles decoded.
    pub tiles: usize,
    /// Seconds the estimate pass took (part of the decode).
    pub estimate_secs: f64,
    /// Pixels the tiles cover divided by the image's pixels (the work beside the whole-image
    /// decode, from the overlaps; the estimate pass adds `1/factor²`).
    pub work_factor: f64,
}

/// What a tiled VAE decode did, for `edgerun -v`.
#[derive(Clone, Debug, PartialEq)]
pub enum TileReport {
    Exact(ExactReport),
    Estimate(EstimateReport),
}

/// Decodes `latents` `[c, latent_h, latent_w]` into `image` `[3, H, W]` in blended tiles whose
/// GroupNorms normalise with statistics estimated on the reduced latent (see
/// [`edge_schema::plan::StatsEstimate`]): the estimate stage runs on
/// [`tiles::reduce_latent`]'s output up to its last GroupNorm, the statistics of every
/// GroupNorm's input are taken as it goes, and each tile then runs interval by interval between
/// its GroupNorms with the statistics of the same rank.
///
/// # Errors
/// A plan error when the stages do not pair (the verifier checks it first), the executor's own.
pub fn decode_estimated(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    t: &VaeTiling,
    e: &StatsEstimate,
    latents: &[f32],
    image: &mut [f32],
) -> Result<EstimateReport> {
    let meta = session.plan().meta();
    let ds = meta.vae.downscale.max(1) as usize;
    let c = meta.vae.latent_channels as usize;
    let (lw, lh) = (size.width as usize / ds, size.height as usize / ds);
    let bad = |what: String| plan_error("estimated VAE tile statistics", what);
    let reduced = tiles::reduce_latent(latents, c, lh, lw, e.factor as usize).ok_or_else(|| {
        Error::Argument {
            flag: "latents",
            reason: format!("{} values for a {lw}x{lh} latent", latents.len()),
        }
    })?;
    let (probe, tile) = (
        &meta.stages[e.stage as usize],
        &meta.stages[t.stage as usize],
    );
    let (pn, tn) = (tiles::group_norms(probe), tiles::group_norms(tile));
    if pn.len() != tn.len() {
        return Err(bad(format!("{} and {} GroupNorms", pn.len(), tn.len())));
    }
    let started = std::time::Instant::now();
    session.with_value_mut(e.stage, probe.inputs[0], &mut |v| {
        if v.len() != reduced.len() {
            return Err(bad(format!("estimate input of {} values", v.len())));
        }
        v.copy_from_slice(&reduced);
        Ok(())
    })?;
    let kernels = *session.host_kernels();
    let mut stats: Vec<Vec<edge_kernels::GroupStats>> = Vec::with_capacity(pn.len());
    let mut at = 0usize;
    for &(step, groups, ch) in &pn {
        let step = step as usize;
        session.run_steps(e.stage, at, step, None)?;
        let s = &probe.steps[step];
        let edge_schema::op::Op::GroupNorm { eps, .. } = s.op else {
            return Err(bad(format!("step {step} is not a GroupNorm")));
        };
        let (groups, ch) = (groups as usize, ch as usize);
        let mut st = vec![edge_kernels::GroupStats::default(); groups];
        session.with_value(e.stage, s.inputs[0], &mut |x| {
            if groups == 0 || ch == 0 || ch % groups != 0 || x.len() % ch != 0 {
                return Err(bad(format!("{groups} groups over {ch} channels")));
            }
            (kernels.group_norm_stats.run)(x, ch, x.len() / ch, groups, eps, &mut st);
            Ok(())
        })?;
        stats.push(st);
        at = step;
    }
    let estimate_secs = started.elapsed().as_secs_f64();
    let grid = TileGrid {
        channels: c,
        latent_h: lh,
        latent_w: lw,
        tile_h: t.tile_latent_h as usize,
        tile_w: t.tile_latent_w as usize,
        overlap_h: t.overlap_latent_h as usize,
        overlap_w: t.overlap_latent_w as usize,
        scale: ds,
    };
    let mut count = 0usize;
    let (stage, input, output) = (t.stage, tile.inputs[0], tile.outputs[0]);
    let bounds: Vec<usize> = tn.iter().map(|g| g.0 as usize).collect();
    let n = tile.steps.len();
    decode_tiled(&grid, latents, image, |lat, out| {
        count += 1;
        session.with_value_mut(stage, input, &mut |v| {
            if v.len() != lat.len() {
                return Err(bad(format!("tile input of {} values", v.len())));
            }
            v.copy_from_slice(lat);
            Ok(())
        })?;
        // Up to the first GroupNorm alone, then from each GroupNorm to the next with its
        // estimated statistics.
        session.run_steps(stage, 0, bounds.first().copied().unwrap_or(n), None)?;
        for (k, &b) in bounds.iter().enumerate() {
            let end = bounds.get(k + 1).copied().unwrap_or(n);
            session.run_steps(stage, b, end, Some(&stats[k]))?;
        }
        session.with_value(stage, output, &mut |v| {
            if v.len() != out.len() {
                return Err(bad(format!("tile output of {} values", v.len())));
            }
            out.copy_from_slice(v);
            Ok(())
        })
    })?;
    let groups: u64 = pn.iter().map(|g| u64::from(g.1)).sum();
    Ok(EstimateReport {
        factor: e.factor,
        reduced_w: tiles::reduced_len(lw as u32, e.factor) as usize,
        reduced_h: tiles::reduced_len(lh as u32, e.factor) as usize,
        norms: pn.len(),
        held_bytes: tiles::estimate_bytes(groups, c as u64, lw as u32, lh as u32, e.factor),
        tiles: count,
        estimate_secs,
        work_factor: (count * grid.tile_h * grid.tile_w) as f64 / (lh * lw) as f64,
    })
}

/// A plan error whose message starts with `what`.
fn plan_error(what: &str, detail: String) -> Error {
    Error::Plan(edge_schema::Error::Invalid(format!("{what}: {detail}")))
}

/// Creates (and at once removes) a spill file in `dir`, so that a run whose decode spills finds
/// out before any work that the folder is missing or not writable; the error names it.
pub fn check_spill_dir(dir: &std::path::Path) -> Result<()> {
    Held::new(0, Some(dir)).map(drop)
}

/// One exact tiled stage's run: the stage run window by window, interval by interval between
/// its GroupNorms, on tensors held whole (the scheme of [`edge_schema::tiles`]).
struct Windows<'a> {
    stage: u32,
    st: &'a edge_schema::plan::Stage,
    sync_steps: &'a [u32],
    /// Window size and the whole latent, latent pixels `(h, w)`.
    win: (usize, usize),
    latent: (usize, usize),
    ys: Vec<AxisWindow>,
    xs: Vec<AxisWindow>,
    schedule: tiles::SyncSchedule,
}

impl<'a> Windows<'a> {
    /// The windows of stage `stage` for `size`: windows of `tile` latent pixels `(h, w)` with
    /// `halo`, synchronised at `sync_steps`.
    fn for_size(
        meta: &'a edge_schema::plan::PlanMeta,
        size: &edge_schema::plan::ImageSize,
        stage: u32,
        sync_steps: &'a [u32],
        halo: u32,
        win: (usize, usize),
    ) -> Result<Self> {
        let ds = meta.vae.downscale.max(1) as usize;
        let latent = (size.height as usize / ds, size.width as usize / ds);
        let halo = halo as usize;
        let bad = |what: String| plan_error("exact VAE tiles", what);
        let st = meta
            .stages
            .get(stage as usize)
            .ok_or_else(|| bad(format!("no stage {stage}")))?;
        let (ys, xs) = match (
            tiles::axis_windows(latent.0, win.0, halo),
            tiles::axis_windows(latent.1, win.1, halo),
        ) {
            (Some(y), Some(x)) => (y, x),
            _ => {
                return Err(bad(format!(
                    "{}x{} windows with halo {halo} do not cover {}x{}",
                    win.1, win.0, latent.1, latent.0
                )))
            }
        };
        let schedule = tiles::sync_schedule(st, sync_steps);
        Ok(Windows {
            stage,
            st,
            sync_steps,
            win,
            latent,
            ys,
            xs,
            schedule,
        })
    }

    /// The held tensors of this stage, in memory or in a spill file in the executor's folder.
    fn held(&self, session: &dyn Executor<'_>, held: HeldIn) -> Result<Held> {
        let spill_dir = match held {
            HeldIn::Memory => None,
            HeldIn::File => Some(session.spill_dir()),
        };
        Held::new(self.st.values.len(), spill_dir.as_deref())
    }

    /// Channels and spatial factor of held value `id`.
    fn geo(&self, id: u32, bad: &dyn Fn(String) -> Error) -> Result<(usize, usize)> {
        let f = tiles::spatial_factor(self.st, id, self.win.0, self.win.1)
            .ok_or_else(|| bad(format!("value {id} is not a window")))?;
        Ok((self.st.values[id as usize].shape[0] as usize, f))
    }

    /// Whole-image dimensions of a held value of `c` channels and factor `f`.
    fn whole(&self, c: usize, f: usize) -> Dims {
        Dims {
            c,
            h: self.latent.0 * f,
            w: self.latent.1 * f,
        }
    }

    fn report(&self, in_file: bool) -> ExactReport {
        let (th, tw) = self.win;
        let (lh, lw) = self.latent;
        ExactReport {
            windows: self.ys.len() * self.xs.len(),
            intervals: self.schedule.intervals.len(),
            held_bytes: tiles::peak_held_bytes(self.st, &self.schedule, self.win, lh, lw)
                .unwrap_or(0),
            in_file,
            work_factor: (self.ys.len() * th * self.xs.len() * tw) as f64 / (lh * lw) as f64,
        }
    }

    /// Runs every interval over every window; the stage input must be in `held`, the stage
    /// output is there afterwards.
    fn run(
        &self,
        session: &mut dyn Executor<'_>,
        held: &mut Held,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<()> {
        let (th, tw) = self.win;
        let kernels = *session.host_kernels();
        for iv in &self.schedule.intervals {
            // The leading GroupNorm's statistics over the whole held input.
            let stats = match self
                .st
                .steps
                .get(iv.first)
                .map(|s| (&s.op, s.inputs.first()))
            {
                Some((edge_schema::op::Op::GroupNorm { groups, eps }, Some(&x)))
                    if self.sync_steps.contains(&(iv.first as u32)) =>
                {
                    let mut st = vec![edge_kernels::GroupStats::default(); *groups as usize];
                    held.stats(x, &kernels, *groups as usize, *eps, &mut st)?;
                    Some(st)
                }
                _ => None,
            };
            for &v in &iv.save {
                let (c, f) = self.geo(v, bad)?;
                held.alloc(v, self.whole(c, f))?;
            }
            for wy in &self.ys {
                for wx in &self.xs {
                    for &v in &iv.restore {
                        let (_, f) = self.geo(v, bad)?;
                        session.with_value_mut(self.stage, v, &mut |win| {
                            held.crop(
                                v,
                                (wy.win_start * f, wx.win_start * f),
                                (th * f, tw * f),
                                win,
                            )
                        })?;
                    }
                    session.run_steps(self.stage, iv.first, iv.end, stats.as_deref())?;
                    for &v in &iv.save {
                        let (_, f) = self.geo(v, bad)?;
                        session.with_value(self.stage, v, &mut |win| {
                            held.paste(
                                v,
                                win,
                                (th * f, tw * f),
                                core_of(wy, wx, f),
                                (wy.win_start * f, wx.win_start * f),
                            )
                        })?;
                    }
                }
            }
            for &v in &iv.release {
                held.release(v);
            }
        }
        Ok(())
    }
}

/// Decodes `latents` `[c, latent_h, latent_w]` into `image` `[3, H, W]` exactly: the head
/// stage on the whole latent, then the tail stage's intervals window by window with the whole
/// image's GroupNorm statistics (see the module doc). Errors name the stage when the plan's
/// geometry does not hold (the verifier checks it first).
pub fn decode_exact(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    t: &VaeTiling,
    sync: &GroupNormSync,
    latents: &[f32],
    image: &mut [f32],
) -> Result<ExactReport> {
    let meta = session.plan().meta();
    let bad = |what: String| plan_error("exact VAE tiles", what);
    let tile = (t.tile_latent_h as usize, t.tile_latent_w as usize);
    let w = Windows::for_size(
        meta,
        size,
        t.stage,
        &sync.sync_steps,
        sync.halo_latent,
        tile,
    )?;
    let (lh, lw) = w.latent;
    let head = meta
        .stages
        .get(sync.head_stage as usize)
        .ok_or_else(|| bad(format!("no stage {}", sync.head_stage)))?;
    if w.st.kind != StageKind::VaeDecoderTail || head.kind != StageKind::VaeDecoderHead {
        return Err(bad("stages of the wrong kind".into()));
    }
    let mut held = w.held(session, sync.held)?;
    let hidden_id = w.st.inputs[0];
    let (hc, _) = w.geo(hidden_id, &bad)?;
    let mut hidden = vec![0f32; hc * lh * lw];
    session.run_stage(
        sync.head_stage,
        &[StageInput::F32(latents)],
        &mut [&mut hidden],
    )?;
    held.put(hidden_id, w.whole(hc, 1), hidden)?;
    let report = w.report(sync.held == HeldIn::File);
    w.run(session, &mut held, &bad)?;
    // Straight into the caller's image, not through a second image-sized buffer that the memory
    // model does not count.
    held.take_into(w.st.outputs[0], image)?;
    Ok(report)
}

/// Encodes `image` `[3, H, W]` (f32 planes in −1…1, moved into the held tensors) into
/// `moments` `[2c, h, w]` exactly ([`edge_schema::plan::EncoderTiling`]): the front's
/// intervals window by window with the whole image's GroupNorm statistics, then the back on
/// the whole latent. Errors name the plan's geometry when it does not hold (the verifier
/// checks it first).
pub fn encode_exact(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    t: &edge_schema::plan::EncoderTiling,
    image: Vec<f32>,
    moments: &mut [f32],
) -> Result<ExactReport> {
    let meta = session.plan().meta();
    let bad = |what: String| plan_error("exact VAE encoder tiles", what);
    let tile = (t.tile_latent_h as usize, t.tile_latent_w as usize);
    let w = Windows::for_size(meta, size, t.down_stage, &t.sync_steps, t.halo_latent, tile)?;
    let (lh, lw) = w.latent;
    let ds = meta.vae.downscale.max(1) as usize;
    let mid = meta
        .stages
        .get(t.mid_stage as usize)
        .ok_or_else(|| bad(format!("no stage {}", t.mid_stage)))?;
    if w.st.kind != StageKind::VaeEncoderDown || mid.kind != StageKind::VaeEncoderMid {
        return Err(bad("stages of the wrong kind".into()));
    }
    let mut held = w.held(session, t.held)?;
    let image_id = w.st.inputs[0];
    let (ic, f) = w.geo(image_id, &bad)?;
    if f != ds || image.len() != ic * lh * ds * lw * ds {
        return Err(bad(format!("an image of {} values", image.len())));
    }
    held.put(image_id, w.whole(ic, ds), image)?;
    let report = w.report(t.held == HeldIn::File);
    w.run(session, &mut held, &bad)?;
    let out = w.st.outputs[0];
    let (hc, _) = w.geo(out, &bad)?;
    let mut hidden = vec![0f32; hc * lh * lw];
    held.take_into(out, &mut hidden)?;
    drop(held);
    session.run_stage(t.mid_stage, &[StageInput::F32(&hidden)], &mut [moments])?;
    Ok(report)
}

/// The core of window `(wy, wx)` inside it, in a value's pixels of factor `f`:
/// `[top, height, left, width]`.
fn core_of(wy: &AxisWindow, wx: &AxisWindow, f: usize) -> [usize; 4] {
    [
        (wy.core_start - wy.win_start) * f,
        wy.core_len * f,
        (wx.core_start - wx.win_start) * f,
        wx.core_len * f,
    ]
}

/// Start offsets (latent pixels) of the tiles covering `len` with tiles of `tile` overlapping
/// by `overlap` (`overlap < tile ≤ len`).
pub fn tile_starts(len: usize, tile: usize, overlap: usize) -> Vec<usize> {
    if tile >= len {
        return vec![0];
    }
    let stride = (tile - overlap).max(1);
    let mut starts = Vec::new();
    let mut s = 0;
    loop {
        if s + tile >= len {
            starts.push(len - tile);
            break;
        }
        starts.push(s);
        s += stride;
    }
    starts.dedup();
    starts
}

/// Blend weight of position `i` (image pixels) inside a tile of `n` pixels whose left edge
/// borders a neighbour over `left` pixels and whose right edge over `right` pixels.
fn ramp(i: usize, n: usize, left: usize, right: usize) -> f32 {
    let mut w = 1.0f32;
    if left > 0 && i < left {
        w = w.min((i as f32 + 0.5) / left as f32);
    }
    if right > 0 && i >= n - right {
        w = w.min(((n - i) as f32 - 0.5) / right as f32);
    }
    w
}

/// Geometry of a tiled decode.
#[derive(Clone, Copy, Debug)]
pub struct TileGrid {
    /// Latent channels.
    pub channels: usize,
    /// Latent height and width.
    pub latent_h: usize,
    pub latent_w: usize,
    /// Tile height and width, latent pixels.
    pub tile_h: usize,
    pub tile_w: usize,
    /// Overlap, latent pixels.
    pub overlap_h: usize,
    pub overlap_w: usize,
    /// Image pixels per latent pixel.
    pub scale: usize,
}

/// Decodes `latents` (`[c, latent_h, latent_w]`) tile by tile: `decode(tile_latents, out)`
/// decodes a `[c, tile_h, tile_w]` tile into `[3, tile_h·scale, tile_w·scale]`. Writes the
/// blended image `[3, latent_h·scale, latent_w·scale]` into `image`.
pub fn decode_tiled<E>(
    g: &TileGrid,
    latents: &[f32],
    image: &mut [f32],
    mut decode: impl FnMut(&[f32], &mut [f32]) -> Result<(), E>,
) -> Result<(), E> {
    let (ih, iw) = (g.latent_h * g.scale, g.latent_w * g.scale);
    let (th, tw) = (g.tile_h * g.scale, g.tile_w * g.scale);
    let ys = tile_starts(g.latent_h, g.tile_h, g.overlap_h);
    let xs = tile_starts(g.latent_w, g.tile_w, g.overlap_w);
    let mut tile_in = vec![0f32; g.channels * g.tile_h * g.tile_w];
    let mut tile_out = vec![0f32; 3 * th * tw];
    let mut weight = vec![0f32; ih * iw];
    image.iter_mut().for_each(|v| *v = 0.0);
    for (yi, &y0) in ys.iter().enumerate() {
        for (xi, &x0) in xs.iter().enumerate() {
            for c in 0..g.channels {
                for y in 0..g.tile_h {
                    let src = (c * g.latent_h + y0 + y) * g.latent_w + x0;
                    let dst = (c * g.tile_h + y) * g.tile_w;
                    tile_in[dst..dst + g.tile_w].copy_from_slice(&latents[src..src + g.tile_w]);
                }
            }
            decode(&tile_in, &mut tile_out)?;
            // Overlap with the previous / next tile along each axis, in image pixels.
            let olap = |starts: &[usize], i: usize, tile: usize| -> (usize, usize) {
                let before = if i > 0 {
                    (starts[i - 1] + tile).saturating_sub(starts[i])
                } else {
                    0
                };
                let after = if i + 1 < starts.len() {
                    (starts[i] + tile).saturating_sub(starts[i + 1])
                } else {
                    0
                };
                (before * g.scale, after * g.scale)
            };
            let (top, bottom) = olap(&ys, yi, g.tile_h);
            let (left, right) = olap(&xs, xi, g.tile_w);
            let (py, px) = (y0 * g.scale, x0 * g.scale);
            for y in 0..th {
                let wy = ramp(y, th, top, bottom);
                for x in 0..tw {
                    let w = wy * ramp(x, tw, left, right);
                    let o = (py + y) * iw + px + x;
                    weight[o] += w;
                    for c in 0..3 {
                        image[c * ih * iw + o] += w * tile_out[(c * th + y) * tw + x];
                    }
                }
            }
        }
    }
    for c in 0..3 {
        for (v, &w) in image[c * ih * iw..(c + 1) * ih * iw]
            .iter_mut()
            .zip(&weight)
        {
            *v /= w;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn starts_cover_the_axis_with_whole_tiles() {
        assert_eq!(tile_starts(8, 8, 0), vec![0]);
        assert_eq!(tile_starts(8, 4, 2), vec![0, 2, 4]);
        assert_eq!(tile_starts(10, 4, 2), vec![0, 2, 4, 6]);
        assert_eq!(tile_starts(9, 4, 0), vec![0, 4, 5]);
        for len in 1..40 {
            for tile in 1..=len {
                for overlap in 0..tile {
                    let s = tile_starts(len, tile, overlap);
                    assert_eq!(s[0], 0);
                    assert_eq!(*s.last().unwrap() + tile, len);
                    for w in s.windows(2) {
                        assert!(
                            w[1] > w[0] && w[1] <= w[0] + tile,
                            "{len} {tile} {overlap} {s:?}"
                        );
                    }
                }
            }
        }
    }

    /// A "decoder" that is pointwise (each latent pixel becomes a constant scale×scale block)
    /// must give exactly the untiled result whatever the tiling.
    #[test]
    fn pointwise_decoder_is_tiling_invariant() {
        let (c, h, w, scale) = (2, 7, 11, 2);
        let lat: Vec<f32> = (0..c * h * w).map(|i| (i as f32 * 0.37).sin()).collect();
        let dec = |th: usize, tw: usize| {
            move |t: &[f32], out: &mut [f32]| -> Result<(), ()> {
                for y in 0..th * scale {
                    for x in 0..tw * scale {
                        let v = t[(y / scale) * tw + x / scale]
                            - t[th * tw + (y / scale) * tw + x / scale];
                        for ch in 0..3 {
                            out[(ch * th * scale + y) * tw * scale + x] = v * (ch as f32 + 1.0);
                        }
                    }
                }
                Ok(())
            }
        };
        let full_grid = TileGrid {
            channels: c,
            latent_h: h,
            latent_w: w,
            tile_h: h,
            tile_w: w,
            overlap_h: 0,
            overlap_w: 0,
            scale,
        };
        let mut full = vec![0f32; 3 * h * w * scale * scale];
        decode_tiled(&full_grid, &lat, &mut full, dec(h, w)).unwrap();
        for (th, tw, oh, ow) in [(4, 4, 2, 2), (3, 5, 1, 2), (7, 4, 0, 3), (2, 2, 1, 1)] {
            let g = TileGrid {
                tile_h: th,
                tile_w: tw,
                overlap_h: oh,
                overlap_w: ow,
                ..full_grid
            };
            let mut tiled = vec![0f32; full.len()];
            decode_tiled(&g, &lat, &mut tiled, dec(th, tw)).unwrap();
            for (a, b) in tiled.iter().zip(&full) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{th}x{tw}: {a} vs {b}"
                );
            }
        }
    }

    /// The blend weights themselves: each tile decodes to one constant (its first latent
    /// value, here its start position), so across an overlap of `ov` image pixels the result
    /// must ramp linearly from the earlier tile's value to the later one's,
    /// `a + (b − a)·(j + ½)/ov` at overlap pixel `j`, and equal a tile's value where only it
    /// covers the image. A reversed or one-sided ramp fails this at once (a pointwise decoder
    /// cannot see blend weights: every tile agrees there).
    #[test]
    fn overlaps_ramp_linearly_from_one_tile_to_the_next() {
        for vertical in [false, true] {
            let (len, tile, overlap, scale) = (12usize, 6usize, 3usize, 2usize);
            let (h, w) = if vertical { (len, 4) } else { (4, len) };
            // Latent value = position along the tiled axis, so a tile's first value is its start.
            let lat: Vec<f32> = (0..h * w)
                .map(|i| {
                    if vertical {
                        (i / w) as f32
                    } else {
                        (i % w) as f32
                    }
                })
                .collect();
            let (th, tw) = if vertical { (tile, w) } else { (h, tile) };
            let g = TileGrid {
                channels: 1,
                latent_h: h,
                latent_w: w,
                tile_h: th,
                tile_w: tw,
                overlap_h: if vertical { overlap } else { 0 },
                overlap_w: if vertical { 0 } else { overlap },
                scale,
            };
            let mut img = vec![0f32; 3 * h * w * scale * scale];
            decode_tiled(
                &g,
                &lat,
                &mut img,
                |t: &[f32], out: &mut [f32]| -> Result<(), ()> {
                    out.iter_mut().for_each(|o| *o = t[0]);
                    Ok(())
                },
            )
            .unwrap();
            let starts = tile_starts(len, tile, overlap);
            assert!(starts.len() >= 3, "{starts:?}");
            // Expected value at image position p along the axis.
            let want = |p: usize| -> f32 {
                let cover: Vec<usize> = starts
                    .iter()
                    .copied()
                    .filter(|&s0| p >= s0 * scale && p < (s0 + tile) * scale)
                    .collect();
                match cover.as_slice() {
                    [only] => *only as f32,
                    [a, b] => {
                        let ov = (a + tile - b) * scale;
                        let j = p - b * scale;
                        *a as f32 + (*b as f32 - *a as f32) * (j as f32 + 0.5) / ov as f32
                    }
                    other => panic!("position {p} covered by {other:?}"),
                }
            };
            let iw = w * scale;
            for y in 0..h * scale {
                for x in 0..iw {
                    let p = if vertical { y } else { x };
                    let got = img[y * iw + x];
                    assert!(
                        (got - want(p)).abs() <= 1e-5,
                        "vertical {vertical}, pixel ({y}, {x}): {got} vs {}",
                        want(p)
                    );
                }
            }
        }
    }
}
