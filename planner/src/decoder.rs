//! Planning the VAE decode of one image size: whole, in exact tiles (GroupNorm statistics of
//! the whole image, see `edge_schema::tiles`), or in blended tiles; choosing the tile for a
//! budget; lowering the stages.

use edge_graph::Graph;
use edge_models::config::VaeConfig;
use edge_models::vae::{build_vae_decoder, build_vae_decoder_head, build_vae_decoder_tail};
use edge_schema::plan::{GroupNormSync, HeldIn, Stage, StageKind, StatsEstimate, VaeTiling};
use edge_schema::{tiles, DType};

use crate::error::{PlanError, Result};
use crate::lower::{lower, skeleton_stage, TensorTable, WeightResolver};
use crate::pack::PackPolicy;
use crate::tiling::{TileHold, TileMode, TileRequest, MAX_ESTIMATE_FACTOR, MIN_TILE_LATENT};

/// What an exact decode of one size in windows of one size needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExactFacts {
    /// Context around a window's core, latent pixels (does not depend on the window).
    pub halo: u32,
    /// The tail stage's GroupNorm steps.
    pub sync_steps: Vec<u32>,
    /// The most bytes of whole-image activations held at once between intervals (does not
    /// depend on the window).
    pub held_bytes: u64,
    /// Host bytes when they are held in a file instead (band and group buffers).
    pub spill_bytes: u64,
    /// The tail stage's weights (as f32) and arena.
    pub tail_need: u64,
}

/// The facts of an exact decode of a `lw × lh` latent in windows of `tw × th` latent pixels
/// (computed on the tail's graph, no weights read).
pub fn exact_facts(cfg: &VaeConfig, lw: u32, lh: u32, tw: u32, th: u32) -> Result<ExactFacts> {
    let g = build_vae_decoder_tail(cfg, th as usize, tw as usize)?;
    let st = skeleton_stage(&g, StageKind::VaeDecoderTail, DType::F32)?;
    let mut f = facts_of(&st, lw, lh, tw, th)?;
    f.tail_need = weights_of(&g) + st.arena_size;
    Ok(f)
}

pub(crate) fn facts_of(st: &Stage, lw: u32, lh: u32, tw: u32, th: u32) -> Result<ExactFacts> {
    let sync_steps: Vec<u32> = st
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s.op, edge_schema::op::Op::GroupNorm { .. }))
        .map(|(i, _)| i as u32)
        .collect();
    let schedule = tiles::sync_schedule(st, &sync_steps);
    let internal = |what: &str| PlanError::Internal(format!("exact VAE tiles: {what}"));
    let win = (th as usize, tw as usize);
    let (lh, lw) = (lh as usize, lw as usize);
    let halo = tiles::required_halo(st, &schedule, win.0, win.1)
        .ok_or_else(|| internal("the windowed stage holds a non-local operation"))?;
    let held_bytes = tiles::peak_held_bytes(st, &schedule, win, lh, lw)
        .ok_or_else(|| internal("held tensors overflow"))?;
    let spill_bytes = tiles::spill_buffer_bytes(st, &schedule, &sync_steps, win, lh, lw)
        .ok_or_else(|| internal("spill buffers overflow"))?;
    Ok(ExactFacts {
        halo: halo as u32,
        sync_steps,
        held_bytes,
        spill_bytes,
        tail_need: 0,
    })
}

/// Refuses an explicit exact `what` (`tile`, `encoder tile`) of `tw × th` latent pixels that
/// leaves no core inside `halo` along an axis of the `lw × lh` latent; `hint` ends the message.
pub(crate) fn check_core(
    (lw, lh): (u32, u32),
    (tw, th): (u32, u32),
    halo: u32,
    ds: u32,
    what: &str,
    hint: &str,
) -> Result<()> {
    let (aw, ah) = align_window((lw, lh), (tw, th));
    if window_ok(lw, aw, halo) && window_ok(lh, ah, halo) {
        return Ok(());
    }
    let taken = if (aw, ah) == (tw, th) {
        String::new()
    } else {
        format!(
            " (taken as {}x{}: exact windows start at even latent pixels)",
            aw * ds,
            ah * ds
        )
    };
    Err(PlanError::Invalid(format!(
        "--vae-tile-size: an exact {what} of {}x{} image pixels{taken} leaves no core inside a halo of {halo} latent pixels ({} image pixels) on each side; use at least {} image pixels{hint}",
        tw * ds,
        th * ds,
        halo * ds,
        (2 * halo + 2) * ds
    )))
}

/// An explicit exact window `(tw, th)` (latent pixels) over a `lw × lh` latent as the planner
/// takes it: each side one latent pixel shorter where its parity would leave a window starting
/// at an odd pixel ([`tiles::align_window`]).
pub(crate) fn align_window((lw, lh): (u32, u32), (tw, th): (u32, u32)) -> (u32, u32) {
    (
        tiles::align_window(lw as usize, tw as usize) as u32,
        tiles::align_window(lh as usize, th as usize) as u32,
    )
}

/// The note for an explicit `what` (`tile`, `encoder tile`) that [`align_window`] shortened.
pub(crate) fn aligned_note(
    latent: (u32, u32),
    (tw, th): (u32, u32),
    ds: u32,
    what: &str,
) -> Option<String> {
    let (aw, ah) = align_window(latent, (tw, th));
    ((aw, ah) != (tw, th)).then(|| {
        format!(
            "--vae-tile-size {}x{}: the exact {what}s are {}x{} image pixels (exact windows start at even latent pixels, for the 2x2 output tiles of the Winograd convolutions)",
            tw * ds,
            th * ds,
            aw * ds,
            ah * ds
        )
    })
}

/// The holds `--vae-tile-hold` allows, in the order they are tried.
pub(crate) fn holds_for(h: TileHold) -> &'static [HeldIn] {
    match h {
        TileHold::Memory => &[HeldIn::Memory],
        TileHold::File => &[HeldIn::File],
        TileHold::Auto => &[HeldIn::Memory, HeldIn::File],
    }
}

/// The window (latent pixels `(w, h)`) and hold of an exact tiled stage over a `lw × lh` latent:
/// for the first of `holds` under which `fits(w, h, hold)`, the `explicit` window, or without
/// one the largest window that fits; windows that leave no core inside `halo` never fit.
/// `None` when nothing fits.
pub(crate) fn choose_window(
    lw: u32,
    lh: u32,
    halo: u32,
    explicit: Option<(u32, u32)>,
    holds: &[HeldIn],
    fits: impl Fn(u32, u32, HeldIn) -> Result<bool>,
) -> Result<Option<(u32, u32, HeldIn)>> {
    let ok = |tw: u32, th: u32| window_ok(lw, tw, halo) && window_ok(lh, th, halo);
    let align = |tw: u32, th: u32| align_window((lw, lh), (tw, th));
    for &held in holds {
        let window = match explicit {
            Some((tw, th)) => {
                let (tw, th) = align(tw, th);
                (ok(tw, th) && fits(tw, th, held)?).then_some((tw, th))
            }
            None => crate::tiling::largest_fitting(lw, lh, 0.0, |tw, th| {
                let (tw, th) = align(tw, th);
                Ok(ok(tw, th) && fits(tw, th, held)?)
            })?
            .map(|t| align(t.tile_latent_w, t.tile_latent_h)),
        };
        if let Some((tw, th)) = window {
            return Ok(Some((tw, th, held)));
        }
    }
    Ok(None)
}

/// Whether a window of `win` latent pixels can cover an axis of `len` for `halo`
/// ([`tiles::window_ok`]: a core inside the halo, and even window starts).
pub(crate) fn window_ok(len: u32, win: u32, halo: u32) -> bool {
    tiles::window_ok(len as usize, win as usize, halo as usize)
}

/// The smallest window that covers an axis of `len` with as many windows as `win` does
/// (`edge_schema::tiles::window_count`): less memory and less work on the halos.
pub(crate) fn tighten(len: u32, win: u32, halo: u32) -> u32 {
    if win >= len || !window_ok(len, win, halo) {
        return win;
    }
    let n = tiles::window_count(len as usize, win as usize, halo as usize);
    (2 * halo + 2..win)
        .find(|&w| {
            window_ok(len, w, halo)
                && tiles::window_count(len as usize, w as usize, halo as usize) <= n
        })
        .unwrap_or(win)
}

fn hold_name(h: HeldIn) -> &'static str {
    match h {
        HeldIn::Memory => "memory",
        HeldIn::File => "a file",
    }
}

/// Bytes of a graph's weights, counted as f32 (conservative).
pub(crate) fn weights_of(g: &Graph) -> u64 {
    g.values
        .iter()
        .filter(|v| matches!(v.source, edge_graph::Source::Weight(_)))
        .map(|v| v.shape.iter().product::<u64>() * 4)
        .sum()
}

/// Bytes a decoder graph needs resident: weights as f32 and its arena.
fn need_of(g: &Graph) -> Result<u64> {
    Ok(weights_of(g) + crate::lower::arena_estimate(g, DType::F32)?)
}

/// The VAE tiling for a `w × h` image: the explicit request, else (under a budget) the largest
/// tile that fits when the whole-image decoder does not, else none.
///
/// In exact mode the tile is the window (core plus halo, shrunk to the smallest window giving
/// the same number of windows). The activations held between GroupNorms stay in memory when
/// they fit the budget with the head or tail stage (or `--vae-tile-hold memory`), else in a
/// file, whose band and group buffers then count instead; when not even that fits, the tiles
/// are blended with estimated GroupNorm statistics ([`TileMode::Estimate`]), and when those do
/// not fit either, blended alone; `notes` says which. The returned tiling's stage indices are
/// left 0.
pub fn plan_tiling(
    cfg: &VaeConfig,
    w: u32,
    h: u32,
    ds: u32,
    req: &TileRequest,
    budget_left: Option<u64>,
    notes: &mut Vec<String>,
) -> Result<Option<VaeTiling>> {
    let (lw, lh) = (w / ds, h / ds);
    let explicit = crate::tiling::explicit_tiling(w, h, ds, req)?;
    if req.mode == TileMode::Blend && req.estimate_factor.is_some() {
        return Err(PlanError::Invalid(
            "--vae-estimate-factor: blended tiles estimate no statistics; use --vae-tile-mode estimate (or exact, whose fallback uses it)".into(),
        ));
    }
    if req.mode == TileMode::Blend && explicit.is_some() {
        return Ok(explicit);
    }
    let c = cfg.latent_channels as u64;
    // A tile decoder and the blend's buffers beside the image.
    let blend_need = |tw: u32, th: u32| -> Result<u64> {
        Ok(need_of(&build_vae_decoder(cfg, th as usize, tw as usize)?)?
            + tiles::blend_bytes(c, (w, h), (tw, th), ds))
    };
    if explicit.is_none() {
        let whole = match budget_left {
            None => true,
            Some(l) => blend_need(lw, lh)? <= l,
        };
        if whole {
            if req.mode != TileMode::Exact {
                notes.push(format!(
                    "size {w}x{h}: --vae-tile-mode {} has nothing to tile: the whole-image decoder fits{}, so the image is decoded at once (--vae-tile-size tiles it anyway)",
                    req.mode.name(),
                    if budget_left.is_some() { " the budget" } else { " (no --max-ram)" }
                ));
            }
            return Ok(None);
        }
    }
    if req.mode == TileMode::Exact {
        // Halo, sync steps and held bytes do not depend on the window.
        let probe = exact_facts(cfg, lw, lh, lw.min(64), lh.min(64))?;
        let head = need_of(&build_vae_decoder_head(cfg, lh as usize, lw as usize)?)?;
        let halo = probe.halo;
        let need = |tw: u32, th: u32, held: HeldIn| -> Result<u64> {
            let f = exact_facts(cfg, lw, lh, tw, th)?;
            Ok(head.max(f.tail_need)
                + match held {
                    HeldIn::Memory => f.held_bytes,
                    HeldIn::File => f.spill_bytes,
                })
        };
        let fits = |tw: u32, th: u32, held: HeldIn| -> Result<bool> {
            Ok(match budget_left {
                None => true,
                Some(l) => need(tw, th, held)? <= l,
            })
        };
        let holds = holds_for(req.hold);
        let explicit_window = explicit
            .as_ref()
            .map(|t| (t.tile_latent_w, t.tile_latent_h));
        if let Some((tw, th)) = explicit_window {
            if tw == lw && th == lh {
                return Ok(None);
            }
            check_core(
                (lw, lh),
                (tw, th),
                halo,
                ds,
                "tile",
                ", or --vae-tile-mode blend",
            )?;
        }
        let chosen = choose_window(lw, lh, halo, explicit_window, holds, fits)?;
        if let (Some(t), Some(_)) = (explicit_window, chosen) {
            notes.extend(aligned_note((lw, lh), t, ds, "tile"));
        }
        if let (Some((tw, th)), None) = (explicit_window, chosen) {
            // An explicit window is kept; the budget only decides where the held tensors go,
            // and a window that fits nowhere the flags allow is an error.
            let hd = holds[holds.len() - 1];
            return Err(PlanError::Invalid(format!(
                "--max-ram: exact VAE tiles of {}x{} image pixels with the activations held in {} need {} bytes, more than the {} bytes the budget leaves; use a smaller --vae-tile-size{}, or --vae-tile-mode blend",
                tw * ds,
                th * ds,
                hold_name(hd),
                need(tw, th, hd)?,
                budget_left.unwrap_or(0),
                if hd == HeldIn::Memory { ", --vae-tile-hold auto|file" } else { "" }
            )));
        }
        if let Some((tw, th, held)) = chosen {
            let (tw, th) = (tighten(lw, tw, halo), tighten(lh, th, halo));
            return Ok(Some(VaeTiling {
                stage: 0,
                tile_latent_w: tw,
                tile_latent_h: th,
                overlap_latent_w: 0,
                overlap_latent_h: 0,
                sync: Some(GroupNormSync {
                    head_stage: 0,
                    halo_latent: halo,
                    sync_steps: probe.sync_steps,
                    held,
                }),
                estimate: None,
            }));
        }
        if req.hold != TileHold::Auto {
            let hd = holds[0];
            let m = 2 * halo + 2;
            return Err(PlanError::Invalid(format!(
                "--max-ram: exact VAE tiles with the activations held in {} do not fit: even {m}x{m}-latent-pixel windows need {} bytes, more than the {} bytes the budget leaves; use --vae-tile-hold auto{}, or --vae-tile-mode blend",
                hold_name(hd),
                need(m.min(lw), m.min(lh), hd)?,
                budget_left.unwrap_or(0),
                if hd == HeldIn::Memory { " or file" } else { "" }
            )));
        }
        if let Some(t) = plan_estimate(cfg, w, h, ds, req, explicit.as_ref(), budget_left)? {
            notes.push(format!(
                "size {w}x{h}: exact VAE tiles do not fit the budget even with their {} bytes of activations held in a file; the tiles are blended with GroupNorm statistics estimated from a whole-image decode at 1/{} resolution",
                probe.held_bytes,
                t.estimate.as_ref().map_or(0, |e| e.factor)
            ));
            return Ok(Some(t));
        }
        notes.push(format!(
            "size {w}x{h}: neither exact VAE tiles (even with their {} bytes of activations held in a file) nor estimated statistics fit the budget; the tiles are decoded alone and blended (colours can shift)",
            probe.held_bytes
        ));
    }
    if req.mode == TileMode::Estimate {
        if explicit
            .as_ref()
            .is_some_and(|t| t.tile_latent_w == lw && t.tile_latent_h == lh)
        {
            return Ok(None);
        }
        return match plan_estimate(cfg, w, h, ds, req, explicit.as_ref(), budget_left)? {
            Some(t) => Ok(Some(t)),
            None => Err(PlanError::Invalid(format!(
                "--max-ram: VAE tiles with estimated statistics do not fit the {} bytes the budget leaves (a tile decoder, and a whole-image decoder of the latent reduced to no less than {MIN_TILE_LATENT} latent pixels on a side); use --vae-tile-mode blend or a larger --max-ram",
                budget_left.unwrap_or(0)
            ))),
        };
    }
    let Some(limit) = budget_left else {
        return Ok(explicit);
    };
    let overlap =
        crate::tiling::validate_overlap(req.overlap.unwrap_or(crate::tiling::DEFAULT_OVERLAP))?;
    match crate::tiling::largest_fitting(lw, lh, overlap, |tw, th| {
        Ok(blend_need(tw, th)? <= limit)
    })? {
        Some(t) => Ok(Some(t)),
        None => Err(PlanError::Invalid(format!(
            "--max-ram: even the smallest VAE tile ({m}x{m} latent pixels) needs {} bytes, more than the {limit} bytes the budget leaves once the planning headroom and the decoded image are taken off it",
            blend_need(MIN_TILE_LATENT.min(lw), MIN_TILE_LATENT.min(lh))?,
            m = MIN_TILE_LATENT
        ))),
    }
}

/// Blended tiles with estimated GroupNorm statistics for a `w × h` image (see
/// `edge_schema::plan::StatsEstimate`): the explicit tile (or the largest that fits) and the
/// requested reduction (or the smallest power of two whose whole-image decoder fits beside
/// nothing else: the two decoders run one after the other). `None` when no tile or no
/// reduction fits; an explicit tile or factor that does not fit is an error.
fn plan_estimate(
    cfg: &VaeConfig,
    w: u32,
    h: u32,
    ds: u32,
    req: &TileRequest,
    explicit: Option<&VaeTiling>,
    budget_left: Option<u64>,
) -> Result<Option<VaeTiling>> {
    let (lw, lh) = (w / ds, h / ds);
    let c = cfg.latent_channels as u64;
    let probe_need = |f: u32| -> Result<u64> {
        let g = build_vae_decoder(
            cfg,
            tiles::reduced_len(lh, f) as usize,
            tiles::reduced_len(lw, f) as usize,
        )?;
        let groups: u64 = g
            .nodes
            .iter()
            .map(|n| match n.op {
                edge_schema::op::Op::GroupNorm { groups, .. } => u64::from(groups),
                _ => 0,
            })
            .sum();
        Ok(need_of(&g)? + tiles::estimate_bytes(groups, c, lw, lh, f))
    };
    // The estimate's buffers are small; they are counted with the tile decoder too.
    let est_host = |f: u32| tiles::estimate_bytes(0, c, lw, lh, f);
    let tile_need = |tw: u32, th: u32, f: u32| -> Result<u64> {
        Ok(need_of(&build_vae_decoder(cfg, th as usize, tw as usize)?)?
            + tiles::blend_bytes(c, (w, h), (tw, th), ds)
            + est_host(f))
    };
    let fits = |need: u64| budget_left.is_none_or(|l| need <= l);
    // A reduced latent below the smallest tile estimates worse than the tiles' own statistics
    // (measured on the demo model: 2x2 latent pixels, 22 levels of 255 on average against 14
    // for tiles alone).
    let coarse =
        |f: u32| tiles::reduced_len(lw, f).min(tiles::reduced_len(lh, f)) < MIN_TILE_LATENT;
    let factor = match req.estimate_factor {
        Some(f) => {
            let f = crate::tiling::validate_estimate_factor(f)?;
            if coarse(f) {
                return Err(PlanError::Invalid(format!(
                    "--vae-estimate-factor {f}: a {lw}x{lh} latent reduced 1/{f} is {}x{}, below {MIN_TILE_LATENT} latent pixels on a side, where the estimate is worse than none; use a smaller factor or --vae-tile-mode blend",
                    tiles::reduced_len(lw, f),
                    tiles::reduced_len(lh, f)
                )));
            }
            let need = probe_need(f)?;
            if !fits(need) {
                return Err(PlanError::Invalid(format!(
                    "--vae-estimate-factor {f}: the whole-image decoder at 1/{f} resolution needs {need} bytes, more than the {} bytes the budget leaves; use a larger factor",
                    budget_left.unwrap_or(0)
                )));
            }
            f
        }
        None => {
            let mut f = 2;
            loop {
                if coarse(f) {
                    return Ok(None);
                }
                if fits(probe_need(f)?) {
                    break f;
                }
                if f >= MAX_ESTIMATE_FACTOR {
                    return Ok(None);
                }
                f *= 2;
            }
        }
    };
    let mut t = match explicit {
        Some(t) => {
            let need = tile_need(t.tile_latent_w, t.tile_latent_h, factor)?;
            if !fits(need) {
                return Err(PlanError::Invalid(format!(
                    "--max-ram: VAE tiles of {}x{} image pixels with estimated statistics need {need} bytes, more than the {} bytes the budget leaves; use a smaller --vae-tile-size",
                    t.tile_latent_w * ds,
                    t.tile_latent_h * ds,
                    budget_left.unwrap_or(0)
                )));
            }
            t.clone()
        }
        None => {
            let overlap = crate::tiling::validate_overlap(
                req.overlap.unwrap_or(crate::tiling::DEFAULT_OVERLAP),
            )?;
            match crate::tiling::largest_fitting(lw, lh, overlap, |tw, th| {
                Ok(fits(tile_need(tw, th, factor)?))
            })? {
                Some(t) => t,
                None => return Ok(None),
            }
        }
    };
    t.estimate = Some(StatsEstimate { stage: 0, factor });
    Ok(Some(t))
}

/// The stages that decode one size, lowered and appended to `stages`. Returns the size's
/// `decoder_stage` and its tiling with stage indices filled in. `adjust` is applied to every
/// decoder graph before lowering (the `--vae-scale-factor` override).
#[allow(clippy::too_many_arguments)]
pub fn lower_decoder(
    cfg: &VaeConfig,
    w: u32,
    h: u32,
    ds: u32,
    tiling: Option<VaeTiling>,
    adjust: &dyn Fn(&mut Graph),
    stages: &mut Vec<Stage>,
    table: &mut TensorTable,
    src: &dyn WeightResolver,
    policy: &PackPolicy,
) -> Result<(u32, Option<VaeTiling>)> {
    let (lw, lh) = ((w / ds) as usize, (h / ds) as usize);
    let mut push = |mut g: Graph, kind: StageKind, sw: u32, sh: u32| -> Result<u32> {
        adjust(&mut g);
        stages.push(lower(&g, kind, sw, sh, table, src, policy)?);
        Ok(stages.len() as u32 - 1)
    };
    let Some(mut t) = tiling else {
        let s = push(build_vae_decoder(cfg, lh, lw)?, StageKind::VaeDecoder, w, h)?;
        return Ok((s, None));
    };
    let (tw, th) = (t.tile_latent_w, t.tile_latent_h);
    if let Some(sync) = &mut t.sync {
        sync.head_stage = push(
            build_vae_decoder_head(cfg, lh, lw)?,
            StageKind::VaeDecoderHead,
            w,
            h,
        )?;
        let tail = push(
            build_vae_decoder_tail(cfg, th as usize, tw as usize)?,
            StageKind::VaeDecoderTail,
            tw * ds,
            th * ds,
        )?;
        let f = facts_of(&stages[tail as usize], lw as u32, lh as u32, tw, th)?;
        // (halo and sync steps are the same for every window: checked on the lowered stage.)
        if f.sync_steps != sync.sync_steps || f.halo != sync.halo_latent {
            return Err(PlanError::Internal(
                "the lowered decoder tail does not match its plan".into(),
            ));
        }
        t.stage = tail;
    } else {
        if let Some(e) = &mut t.estimate {
            let (rw, rh) = (
                tiles::reduced_len(lw as u32, e.factor),
                tiles::reduced_len(lh as u32, e.factor),
            );
            let mut g = build_vae_decoder(cfg, rh as usize, rw as usize)?;
            g.name = "vae_decoder_estimate".into();
            e.stage = push(g, StageKind::VaeDecoder, rw * ds, rh * ds)?;
        }
        t.stage = push(
            build_vae_decoder(cfg, th as usize, tw as usize)?,
            StageKind::VaeDecoder,
            tw * ds,
            th * ds,
        )?;
    }
    Ok((t.stage, Some(t)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A VAE whose coarsest level is wide (256 channels at latent resolution) and the rest
    /// narrow: its whole-latent head costs far more than a tile decoder of the smallest tile and
    /// a whole decoder of the reduced latent, so as the budget shrinks the planner goes from the
    /// whole decoder to exact tiles, then to estimated statistics (and says so), then to an
    /// error naming `--max-ram`; estimate mode can be asked for where exact tiles fit, takes
    /// the smallest factor that fits, and refuses a factor that leaves under 4 latent pixels.
    #[test]
    fn exact_tiles_fall_back_to_estimated_statistics_then_to_blending() {
        let cfg = VaeConfig {
            in_channels: 3,
            out_channels: 3,
            block_out_channels: vec![8, 8, 8, 256],
            layers_per_block: 1,
            latent_channels: 4,
            norm_num_groups: 8,
            scaling_factor: 0.13025,
            use_quant_conv: true,
            use_post_quant_conv: true,
            mid_block_add_attention: true,
        };
        let (w, h, ds) = (1024, 1024, 8);
        let plan = |mode: TileMode, budget: u64, notes: &mut Vec<String>| {
            let req = TileRequest {
                mode,
                ..Default::default()
            };
            plan_tiling(&cfg, w, h, ds, &req, Some(budget), notes).unwrap()
        };
        // The mode chosen under budgets shrinking by 5 % from the whole decoder's need.
        let whole = need_of(&build_vae_decoder(&cfg, 128, 128).unwrap()).unwrap();
        let mut modes = Vec::new();
        let mut b = whole;
        while b > 1 << 20 {
            let mut notes = Vec::new();
            let req = TileRequest::default();
            let m = match plan_tiling(&cfg, w, h, ds, &req, Some(b), &mut notes) {
                Ok(None) => "whole",
                Ok(Some(t)) if t.sync.is_some() => "exact",
                Ok(Some(t)) if t.estimate.is_some() => "estimate",
                Ok(Some(_)) => "blend",
                Err(_) => "none",
            };
            modes.push((b, m, notes));
            b = b / 20 * 19;
        }
        let order: Vec<&str> = modes.iter().map(|m| m.1).collect();
        eprintln!("{order:?}");
        // Whole, then exact, then estimate, then blend, then nothing, as the budget shrinks.
        let rank = |m: &str| {
            ["whole", "exact", "estimate", "blend", "none"]
                .iter()
                .position(|x| *x == m)
        };
        assert!(
            order.windows(2).all(|p| rank(p[0]) <= rank(p[1])),
            "{order:?}"
        );
        assert!(order.contains(&"exact"), "{order:?}");
        let (estimate, _, notes) = modes
            .iter()
            .find(|m| m.1 == "estimate")
            .expect("a budget where estimated statistics are chosen");
        let estimate = *estimate;
        let t = plan(TileMode::Exact, estimate, &mut Vec::new()).unwrap();
        let e = t.estimate.expect("estimated statistics");
        assert!(t.sync.is_none() && (2..=16).contains(&e.factor), "{e:?}");
        assert!(
            notes
                .iter()
                .any(|n| n.contains("estimated") && n.contains("1/")),
            "{notes:?}"
        );
        // Below the least budget the estimate fits, nothing fits: exact mode's error names the
        // budget, and so does estimate mode's.
        let i = modes.iter().rposition(|m| m.1 == "estimate").unwrap();
        let below = modes.get(i + 1).expect("a budget below the estimate's").0;
        for mode in [TileMode::Exact, TileMode::Estimate] {
            let req = TileRequest {
                mode,
                ..Default::default()
            };
            let err = plan_tiling(&cfg, w, h, ds, &req, Some(below), &mut Vec::new())
                .unwrap_err()
                .to_string();
            assert!(err.contains("--max-ram"), "{mode:?}: {err}");
        }
        // Where exact tiles fit, estimate mode is still chosen when asked for.
        let t = plan(TileMode::Estimate, modes[0].0, &mut Vec::new()).unwrap();
        assert!(t.sync.is_none() && t.estimate.is_some());
        // With room to spare the estimate uses the finest reduction.
        let mut notes = Vec::new();
        let t = plan(TileMode::Estimate, 64 << 30, &mut notes);
        assert_eq!(t, None, "the whole decoder fits: no tiles");
        assert!(
            notes.iter().any(|n| n.contains("nothing to tile")),
            "{notes:?}"
        );
        let req = TileRequest {
            mode: TileMode::Estimate,
            size: Some((256, 256)),
            ..Default::default()
        };
        let t = plan_tiling(&cfg, w, h, ds, &req, None, &mut Vec::new())
            .unwrap()
            .unwrap();
        assert_eq!(t.estimate.map(|e| e.factor), Some(2));
        // A factor whose reduced latent is below the smallest tile is refused.
        let req = TileRequest {
            estimate_factor: Some(64),
            ..req
        };
        let err = plan_tiling(&cfg, w, h, ds, &req, None, &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--vae-estimate-factor 64"), "{err}");
    }
}
