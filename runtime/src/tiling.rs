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

use edge_schema::plan::{GroupNormSync, HeldIn, StageKind, VaeTiling};
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

/// Creates (and at once removes) a spill file in `dir`, so that a run whose decode spills finds
/// out before any work that the folder is missing or not writable; the error names it.
pub fn check_spill_dir(dir: &std::path::Path) -> Result<()> {
    Held::new(0, Some(dir)).map(drop)
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
    let plan = session.plan();
    let meta = plan.meta();
    let ds = meta.vae.downscale.max(1) as usize;
    let (lh, lw) = (size.height as usize / ds, size.width as usize / ds);
    let (th, tw) = (t.tile_latent_h as usize, t.tile_latent_w as usize);
    let tail = &meta.stages[t.stage as usize];
    let head = &meta.stages[sync.head_stage as usize];
    let bad = |what: String| {
        Error::Plan(edge_schema::Error::Invalid(format!(
            "exact VAE tiles: {what}"
        )))
    };
    if tail.kind != StageKind::VaeDecoderTail || head.kind != StageKind::VaeDecoderHead {
        return Err(bad("stages of the wrong kind".into()));
    }
    let halo = sync.halo_latent as usize;
    let (ys, xs) = match (
        tiles::axis_windows(lh, th, halo),
        tiles::axis_windows(lw, tw, halo),
    ) {
        (Some(y), Some(x)) => (y, x),
        _ => {
            return Err(bad(format!(
                "{tw}x{th} windows with halo {halo} do not cover {lw}x{lh}"
            )))
        }
    };
    let schedule = tiles::sync_schedule(tail, &sync.sync_steps);
    // Geometry of a held value: (channels, spatial factor).
    let geo = |id: u32| -> Result<(usize, usize)> {
        let f = tiles::spatial_factor(tail, id, th, tw)
            .ok_or_else(|| bad(format!("value {id} is not a window")))?;
        Ok((tail.values[id as usize].shape[0] as usize, f))
    };
    let spill_dir = match sync.held {
        HeldIn::Memory => None,
        HeldIn::File => Some(session.spill_dir()),
    };
    let mut held = Held::new(tail.values.len(), spill_dir.as_deref())?;
    let whole = |c: usize, f: usize| Dims {
        c,
        h: lh * f,
        w: lw * f,
    };
    let hidden_id = tail.inputs[0];
    let (hc, _) = geo(hidden_id)?;
    let mut hidden = vec![0f32; hc * lh * lw];
    session.run_stage(
        sync.head_stage,
        &[StageInput::F32(latents)],
        &mut [&mut hidden],
    )?;
    held.put(hidden_id, whole(hc, 1), hidden)?;
    let report = ExactReport {
        windows: ys.len() * xs.len(),
        intervals: schedule.intervals.len(),
        held_bytes: tiles::peak_held_bytes(tail, &schedule, (th, tw), lh, lw).unwrap_or(0),
        in_file: sync.held == HeldIn::File,
        work_factor: (ys.len() * th * xs.len() * tw) as f64 / (lh * lw) as f64,
    };
    let kernels = *session.host_kernels();
    for iv in &schedule.intervals {
        // The leading GroupNorm's statistics over the whole held input.
        let stats = match tail.steps.get(iv.first).map(|s| (&s.op, s.inputs.first())) {
            Some((edge_schema::op::Op::GroupNorm { groups, eps }, Some(&x)))
                if sync.sync_steps.contains(&(iv.first as u32)) =>
            {
                let mut st = vec![edge_kernels::GroupStats::default(); *groups as usize];
                held.stats(x, &kernels, *groups as usize, *eps, &mut st)?;
                Some(st)
            }
            _ => None,
        };
        for &v in &iv.save {
            let (c, f) = geo(v)?;
            held.alloc(v, whole(c, f))?;
        }
        for wy in &ys {
            for wx in &xs {
                for &v in &iv.restore {
                    let (_, f) = geo(v)?;
                    session.with_value_mut(t.stage, v, &mut |win| {
                        held.crop(
                            v,
                            (wy.win_start * f, wx.win_start * f),
                            (th * f, tw * f),
                            win,
                        )
                    })?;
                }
                session.run_steps(t.stage, iv.first, iv.end, stats.as_deref())?;
                for &v in &iv.save {
                    let (_, f) = geo(v)?;
                    session.with_value(t.stage, v, &mut |win| {
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
    // Straight into the caller's image, not through a second image-sized buffer that the memory
    // model does not count.
    held.take_into(tail.outputs[0], image)?;
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
