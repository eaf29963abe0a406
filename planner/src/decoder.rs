//! Planning the VAE decode of one image size: whole, in exact tiles (GroupNorm statistics of
//! the whole image, see `edge_schema::tiles`), or in blended tiles; choosing the tile for a
//! budget; lowering the stages.

use edge_graph::Graph;
use edge_models::config::VaeConfig;
use edge_models::vae::{build_vae_decoder, build_vae_decoder_head, build_vae_decoder_tail};
use edge_schema::plan::{GroupNormSync, Stage, StageKind, VaeTiling};
use edge_schema::{tiles, DType};

use crate::error::{PlanError, Result};
use crate::lower::{lower, skeleton_stage, TensorTable, WeightResolver};
use crate::pack::PackPolicy;
use crate::tiling::{TileMode, TileRequest, MIN_TILE_LATENT};

/// What the decode of one size needs besides the tile stage's own arena and weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExactFacts {
    /// Context around a window's core, latent pixels.
    pub halo: u32,
    /// The tail stage's GroupNorm steps.
    pub sync_steps: Vec<u32>,
    /// The most bytes of whole-image activations held at once between intervals.
    pub held_bytes: u64,
}

/// The halo, sync steps and held bytes of an exact decode of a `lw × lh` latent in windows of
/// `tw × th` latent pixels (computed on the tail's graph, no weights read).
pub fn exact_facts(cfg: &VaeConfig, lw: u32, lh: u32, tw: u32, th: u32) -> Result<ExactFacts> {
    let g = build_vae_decoder_tail(cfg, th as usize, tw as usize)?;
    let st = skeleton_stage(&g, StageKind::VaeDecoderTail, DType::F32)?;
    facts_of(&st, lw, lh, tw, th)
}

fn facts_of(st: &Stage, lw: u32, lh: u32, tw: u32, th: u32) -> Result<ExactFacts> {
    let sync_steps: Vec<u32> = st
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s.op, edge_schema::op::Op::GroupNorm { .. }))
        .map(|(i, _)| i as u32)
        .collect();
    let schedule = tiles::sync_schedule(st, &sync_steps);
    let internal = |what: &str| PlanError::Internal(format!("exact VAE tiles: {what}"));
    let halo = tiles::required_halo(st, &schedule, th as usize, tw as usize)
        .ok_or_else(|| internal("the decoder tail holds a non-local operation"))?;
    let held_bytes = tiles::peak_held_bytes(
        st,
        &schedule,
        (th as usize, tw as usize),
        lh as usize,
        lw as usize,
    )
    .ok_or_else(|| internal("held tensors overflow"))?;
    Ok(ExactFacts {
        halo: halo as u32,
        sync_steps,
        held_bytes,
    })
}

/// Whether a window of `win` latent pixels leaves a core along an axis of `len` for `halo`.
fn window_ok(len: u32, win: u32, halo: u32) -> bool {
    win == len || (win < len && 2 * halo < win)
}

/// The smallest window that covers an axis of `len` with as many windows as `win` does
/// (`edge_schema::tiles::window_count`): less memory and less work on the halos.
fn tighten(len: u32, win: u32, halo: u32) -> u32 {
    if win >= len || 2 * halo >= win {
        return win;
    }
    let n = tiles::window_count(len as usize, win as usize, halo as usize) as u32;
    // n windows cover n·win − 2·halo·(n − 1) pixels.
    (len + 2 * halo * (n - 1))
        .div_ceil(n)
        .clamp(2 * halo + 1, win)
}

/// Bytes a decoder graph needs resident, weights counted as f32 (conservative).
fn need_of(g: &Graph) -> Result<u64> {
    let weights: u64 = g
        .values
        .iter()
        .filter(|v| matches!(v.source, edge_graph::Source::Weight(_)))
        .map(|v| v.shape.iter().product::<u64>() * 4)
        .sum();
    Ok(weights + crate::lower::arena_estimate(g, DType::F32)?)
}

/// The VAE tiling for a `w × h` image: the explicit request, else (under a budget) the largest
/// tile that fits when the whole-image decoder does not, else none. In exact mode the tile is
/// the window (core plus halo, shrunk to the smallest window giving the same number of
/// windows) and what is held between GroupNorms counts against the budget;
/// when even the smallest exact window does not fit, the tiles are blended and
/// `notes` says so. The returned tiling's stage indices are left 0.
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
    let exact = |t: VaeTiling| -> Result<VaeTiling> {
        let halo = exact_facts(cfg, lw, lh, t.tile_latent_w, t.tile_latent_h)?.halo;
        let t = VaeTiling {
            tile_latent_w: tighten(lw, t.tile_latent_w, halo),
            tile_latent_h: tighten(lh, t.tile_latent_h, halo),
            ..t
        };
        let f = exact_facts(cfg, lw, lh, t.tile_latent_w, t.tile_latent_h)?;
        Ok(VaeTiling {
            overlap_latent_w: 0,
            overlap_latent_h: 0,
            sync: Some(GroupNormSync {
                head_stage: 0,
                halo_latent: f.halo,
                sync_steps: f.sync_steps,
            }),
            ..t
        })
    };
    if let Some(t) = crate::tiling::explicit_tiling(w, h, ds, req)? {
        if req.mode == TileMode::Blend {
            return Ok(Some(t));
        }
        if t.tile_latent_w == lw && t.tile_latent_h == lh {
            return Ok(None);
        }
        let halo = exact_facts(cfg, lw, lh, t.tile_latent_w, t.tile_latent_h)?.halo;
        if !window_ok(lw, t.tile_latent_w, halo) || !window_ok(lh, t.tile_latent_h, halo) {
            return Err(PlanError::Invalid(format!(
                "--vae-tile-size: an exact tile of {}x{} image pixels leaves no core inside a halo of {halo} latent pixels ({} image pixels) on each side; use at least {} image pixels, or --vae-tile-mode blend",
                t.tile_latent_w * ds,
                t.tile_latent_h * ds,
                halo * ds,
                (2 * halo + 1) * ds
            )));
        }
        return exact(t).map(Some);
    }
    let Some(limit) = budget_left else {
        return Ok(None);
    };
    let overlap =
        crate::tiling::validate_overlap(req.overlap.unwrap_or(crate::tiling::DEFAULT_OVERLAP))?;
    let blend_need = |tw: u32, th: u32| -> Result<u64> {
        need_of(&build_vae_decoder(cfg, th as usize, tw as usize)?)
    };
    if blend_need(lw, lh)? <= limit {
        return Ok(None);
    }
    if req.mode == TileMode::Exact {
        let head = need_of(&build_vae_decoder_head(cfg, lh as usize, lw as usize)?)?;
        // Held bytes do not depend on the window (they are whole-image tensors).
        let probe = exact_facts(cfg, lw, lh, lw.min(64), lh.min(64))?;
        let need = |tw: u32, th: u32| -> Result<u64> {
            let tail = need_of(&build_vae_decoder_tail(cfg, th as usize, tw as usize)?)?;
            Ok(head.max(tail) + probe.held_bytes)
        };
        let fits = |tw: u32, th: u32| -> Result<bool> {
            Ok(window_ok(lw, tw, probe.halo)
                && window_ok(lh, th, probe.halo)
                && need(tw, th)? <= limit)
        };
        if let Some(t) = crate::tiling::largest_fitting(lw, lh, 0.0, fits)? {
            return exact(t).map(Some);
        }
        notes.push(format!(
            "size {w}x{h}: exact VAE tiles hold {} bytes of activations between GroupNorms, more than the budget leaves; the tiles are decoded alone and blended (colours can shift)",
            probe.held_bytes
        ));
    }
    match crate::tiling::largest_fitting(lw, lh, overlap, |tw, th| {
        Ok(blend_need(tw, th)? <= limit)
    })? {
        Some(t) => Ok(Some(t)),
        None => Err(PlanError::Invalid(format!(
            "--max-ram: even the smallest VAE tile ({m}x{m} latent pixels) needs {} bytes, more than the {limit} bytes the budget leaves",
            blend_need(MIN_TILE_LATENT.min(lw), MIN_TILE_LATENT.min(lh))?,
            m = MIN_TILE_LATENT
        ))),
    }
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
        if f.sync_steps != sync.sync_steps || f.halo != sync.halo_latent {
            return Err(PlanError::Internal(
                "the lowered decoder tail does not match its plan".into(),
            ));
        }
        t.stage = tail;
    } else {
        t.stage = push(
            build_vae_decoder(cfg, th as usize, tw as usize)?,
            StageKind::VaeDecoder,
            tw * ds,
            th * ds,
        )?;
    }
    Ok((t.stage, Some(t)))
}
