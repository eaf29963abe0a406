//! Planning the VAE encode of one size (image to image): the whole-image encoder when it fits
//! the budget, else exact tiles (the front window by window with GroupNorm statistics of the
//! whole image, the back on the whole latent; `edge_schema::plan::EncoderTiling`), else none.

use edge_models::config::VaeConfig;
use edge_models::vae::{build_vae_encoder, build_vae_encoder_down, build_vae_encoder_mid};
use edge_schema::plan::{EncoderTiling, HeldIn, Stage, StageKind};
use edge_schema::DType;

use crate::decoder::{
    aligned_note, check_core, choose_window, facts_of, holds_for, tighten, weights_of,
};
use crate::error::{PlanError, Result};
use crate::lower::{arena_estimate, lower, skeleton_stage, TensorTable, WeightResolver};
use crate::pack::PackPolicy;
use crate::tiling::{TileMode, TileRequest};

/// How one size is encoded.
#[derive(Clone, Debug, PartialEq)]
pub enum EncoderPlan {
    /// The whole-image encoder.
    Whole,
    /// Exact tiles (stage indices left 0).
    Tiled(EncoderTiling),
}

/// Chooses how a `w × h` image is encoded under `budget` (bytes the process may use, already
/// less the headroom; `None`: no budget): the whole encoder when its arena, the image and the
/// moments fit; else exact tiles in the largest window that fits with the activations between
/// GroupNorms held in memory, else in a file, beside `conditions` (the prompts' states and K/V
/// caches, held while an init image is encoded) and each stage's weights counted as f32; else
/// `None` (a note says so). An explicit exact `--vae-tile-size` tiles the encoder too, in the
/// window asked for where it leaves a core.
#[allow(clippy::too_many_arguments)]
pub fn plan_encoder(
    cfg: &VaeConfig,
    w: u32,
    h: u32,
    ds: u32,
    req: &TileRequest,
    budget: Option<u64>,
    conditions: u64,
    notes: &mut Vec<String>,
) -> Result<Option<EncoderPlan>> {
    let (lw, lh) = (w / ds, h / ds);
    let image = edge_schema::memory::image_bytes(w, h);
    let moments = 2 * cfg.latent_channels as u64 * u64::from(lw) * u64::from(lh) * 4;
    let whole = arena_estimate(&build_vae_encoder(cfg, h as usize, w as usize)?, DType::F32)?
        + image
        + moments;
    let explicit = match (req.mode, req.size) {
        (TileMode::Exact, Some((tw, th))) => Some(((tw / ds).min(lw), (th / ds).min(lh))),
        _ => None,
    };
    let fits = |need: u64| budget.is_none_or(|b| need <= b);
    if explicit.is_none_or(|(tw, th)| tw == lw && th == lh) && fits(whole) {
        return Ok(Some(EncoderPlan::Whole));
    }
    // The back, on the whole latent: its arena, its input and the moments.
    let top = cfg.block_out_channels.last().copied().unwrap_or(0) as u64;
    let mid_graph = build_vae_encoder_mid(cfg, lh as usize, lw as usize)?;
    let mid = conditions
        + weights_of(&mid_graph)
        + arena_estimate(&mid_graph, DType::F32)?
        + top * u64::from(lw) * u64::from(lh) * 4
        + moments;
    let facts = |tw: u32, th: u32| -> Result<(crate::decoder::ExactFacts, u64)> {
        let g = build_vae_encoder_down(cfg, th as usize, tw as usize)?;
        let st = skeleton_stage(&g, StageKind::VaeEncoderDown, DType::F32)?;
        Ok((
            facts_of(&st, lw, lh, tw, th)?,
            conditions + weights_of(&g) + st.arena_size,
        ))
    };
    let probe = facts(lw.min(64), lh.min(64))?.0;
    let halo = probe.halo;
    let need = |tw: u32, th: u32, held: HeldIn| -> Result<u64> {
        let (f, arena) = facts(tw, th)?;
        Ok(mid.max(
            arena
                + match held {
                    HeldIn::Memory => f.held_bytes,
                    HeldIn::File => f.spill_bytes,
                },
        ))
    };
    if let Some(t) = explicit {
        check_core((lw, lh), t, halo, ds, "encoder tile", "")?;
    }
    let chosen = choose_window(lw, lh, halo, explicit, holds_for(req.hold), |tw, th, hd| {
        Ok(fits(need(tw, th, hd)?))
    })?;
    if let (Some(t), Some(_)) = (explicit, chosen) {
        notes.extend(aligned_note((lw, lh), t, ds, "encoder tile"));
    }
    let Some((tw, th, held)) = chosen else {
        notes.push(format!(
            "no VAE encoder for {w}x{h}: neither the whole-image encoder ({} MiB of arena and buffers) nor exact encoder tiles{} fit --max-ram; image to image is unavailable at this size",
            whole.div_ceil(1 << 20),
            match req.hold {
                crate::tiling::TileHold::Memory => " with their activations held in memory (--vae-tile-hold memory; auto or file would spill them)",
                crate::tiling::TileHold::File => " with their activations held in a file",
                crate::tiling::TileHold::Auto => "",
            }
        ));
        return Ok(None);
    };
    Ok(Some(EncoderPlan::Tiled(EncoderTiling {
        down_stage: 0,
        mid_stage: 0,
        tile_latent_w: tighten(lw, tw, halo),
        tile_latent_h: tighten(lh, th, halo),
        halo_latent: halo,
        sync_steps: probe.sync_steps,
        held,
    })))
}

/// Lowers the encoder stages `plan` asks for and appends them to `stages`: returns the size's
/// `encoder_stage` and its tiling with stage indices filled in.
#[allow(clippy::too_many_arguments)]
pub fn lower_encoder(
    cfg: &VaeConfig,
    w: u32,
    h: u32,
    ds: u32,
    plan: EncoderPlan,
    stages: &mut Vec<Stage>,
    table: &mut TensorTable,
    src: &dyn WeightResolver,
    policy: &PackPolicy,
) -> Result<(u32, Option<EncoderTiling>)> {
    let mut push = |g: edge_graph::Graph, kind: StageKind, sw: u32, sh: u32| -> Result<u32> {
        stages.push(lower(&g, kind, sw, sh, table, src, policy)?);
        Ok(stages.len() as u32 - 1)
    };
    match plan {
        EncoderPlan::Whole => Ok((
            push(
                build_vae_encoder(cfg, h as usize, w as usize)?,
                StageKind::VaeEncoder,
                w,
                h,
            )?,
            None,
        )),
        EncoderPlan::Tiled(mut t) => {
            let (tw, th) = (t.tile_latent_w, t.tile_latent_h);
            t.down_stage = push(
                build_vae_encoder_down(cfg, th as usize, tw as usize)?,
                StageKind::VaeEncoderDown,
                tw * ds,
                th * ds,
            )?;
            t.mid_stage = push(
                build_vae_encoder_mid(cfg, (h / ds) as usize, (w / ds) as usize)?,
                StageKind::VaeEncoderMid,
                w,
                h,
            )?;
            let f = facts_of(&stages[t.down_stage as usize], w / ds, h / ds, tw, th)?;
            if f.sync_steps != t.sync_steps || f.halo > t.halo_latent {
                return Err(PlanError::Internal(
                    "the lowered encoder front does not match its plan".into(),
                ));
            }
            Ok((t.down_stage, Some(t)))
        }
    }
}
