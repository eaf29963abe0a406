//! Text-to-image generation over a plan: tokenize, encode the prompt and the negative prompt,
//! run the sampler loop over the denoiser with classifier-free guidance, decode the latents.
//!
//! Follows diffusers' `PixArtSigmaPipeline` / `PixArtAlphaPipeline.__call__`: the prompt is
//! lower-cased and stripped, padded to the plan's maximum sequence length; guidance is
//! `uncond + g · (cond − uncond)` when `g > 1` (otherwise the conditional prediction alone);
//! the initial latents are unit noise times the scheduler's `init_noise_sigma`. The
//! unconditional and conditional predictions are two batch-1 denoiser runs.

use edge_schema::plan::{PlanMeta, Stage};

use zerocopy::IntoBytes;

pub use crate::host::HostBytes;

use crate::error::{Error, Result};
use crate::executor::Executor;
pub use crate::rng::NoiseRng;
use crate::sampler::{Sampler, SamplingMethod};
use crate::session::StageInput;
use crate::tokenizer::Tokenizer;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub prompt: String,
    pub negative_prompt: String,
    /// Number of denoising steps (≥ 1).
    pub steps: usize,
    /// Classifier-free guidance scale; ≤ 1 disables guidance.
    pub cfg_scale: f32,
    pub method: SamplingMethod,
    /// Seed of the initial noise (ignored with `init_latents`).
    pub seed: u64,
    /// The generator the seed feeds ([`NoiseRng::TorchCpu`] by default: diffusers' noise).
    pub rng: NoiseRng,
    /// Karras sigmas (`Some(true)`), the discrete schedule (`Some(false)`), or what the plan's
    /// scheduler config says (`None`).
    pub karras: Option<bool>,
    /// Image width in pixels (must be one of the plan's sizes).
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// Unit-variance initial noise `[c, h/8, w/8]` to use instead of the seeded noise (for
    /// image to image: the noise added to the encoded image).
    pub init_latents: Option<Vec<f32>>,
    /// Image to image: the image to start from and how much of the schedule to run.
    pub init_image: Option<InitImage>,
    /// The decoder of the final image ([`Decoder::Vae`] by default).
    pub decoder: Decoder,
    /// Previews while sampling (given to [`generate_previewing`]'s callback); none by default.
    pub preview: Option<PreviewSpec>,
}

/// Which decoder turns latents into an image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Decoder {
    /// The pipeline's `AutoencoderKL` (as planned: whole or in tiles).
    #[default]
    Vae,
    /// The plan's tiny decoder (TAESD / TAESDXL, `edgeplan compile --taesd`): a fraction of
    /// the VAE's time and memory, an approximate image.
    Tiny,
}

/// What to preview while sampling (stable-diffusion.cpp's `--preview`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreviewSpec {
    /// The decoder of the previews.
    pub decoder: Decoder,
    /// A preview after every `interval`-th step (≥ 1) and after the last.
    pub interval: usize,
    /// Preview the latents after the step instead of the denoiser's clean estimate
    /// ([`crate::sampler::Sampler::denoised`]).
    pub noisy: bool,
}

/// The start of an image-to-image run (diffusers' `StableDiffusionImg2ImgPipeline` steps,
/// with PixArt's components): the image is VAE-encoded (the latent distribution's mode, times
/// the VAE scale), noised with `scheduler.add_noise` to the level of step `t_start`, and the
/// sampler runs from there (see [`crate::sampler::img2img_begin`]).
#[derive(Clone, Debug)]
pub struct InitImage {
    /// RGB bytes `[height, width, 3]` at the run's width and height.
    pub rgb: Vec<u8>,
    /// How much of the schedule runs, in (0, 1]: 1 runs every step from the image noised to
    /// the first step's level (nearly pure noise), small values keep more of the image.
    pub strength: f64,
}

/// What [`generate`] produced.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Final denoised latents `[c, h/8, w/8]` (before VAE decoding).
    pub latents: Vec<f32>,
    /// RGB bytes `[height, width, 3]`.
    pub rgb: Vec<u8>,
    /// Whether the prompt (or the negative prompt) was cut to the maximum sequence length.
    pub truncated: bool,
    /// Weight bytes made resident (first loads and re-reads) during each sampler step.
    pub streamed_per_step: Vec<u64>,
    /// What the tiled VAE decode did, when the plan decodes this size in exact tiles or in
    /// tiles with estimated statistics.
    pub tiles: Option<crate::tiling::TileReport>,
    /// What the exact tiled VAE encode of the init image did, when the plan encodes this size
    /// in exact tiles.
    pub encoder_tiles: Option<crate::tiling::ExactReport>,
}

/// Progress events reported while generating.
#[derive(Clone, Copy, Debug)]
pub enum Progress {
    /// Text encoding finished.
    Encoded,
    /// Image to image: the init image was encoded.
    ImageEncoded,
    /// Sampler step `done` of `total` finished.
    Step { done: usize, total: usize },
    /// VAE decoding finished.
    Decoded,
}

fn numel(s: &Stage, value: u32) -> usize {
    s.values[value as usize].shape.iter().product::<u64>() as usize
}

/// Encodes `text` with the plan's text-encoder stage: returns `(hidden [l, d], mask [l], truncated)`.
pub fn encode_text(
    session: &mut dyn Executor<'_>,
    tokenizer: &Tokenizer,
    text: &str,
) -> Result<(Vec<f32>, Vec<f32>, bool)> {
    let meta = session.plan().meta();
    let l = meta.text.max_sequence_length as usize;
    let enc = tokenizer.encode_padded(text, l);
    let full = &meta.stages[meta.text_stage as usize];
    let d = full.values[full.outputs[0] as usize]
        .shape
        .last()
        .copied()
        .unwrap_or(0) as usize;
    let real = enc.mask.iter().filter(|&&m| m > 0.0).count();
    let (len, stage) = meta
        .text_buckets
        .iter()
        .map(|&(n, s)| (n as usize, s))
        .find(|&(n, _)| n >= real)
        .unwrap_or((l, meta.text_stage));
    let mut hidden = vec![0f32; l * d];
    session.run_stage(
        stage,
        &[
            StageInput::I32(&enc.ids[..len]),
            StageInput::F32(&enc.mask[..len]),
        ],
        &mut [&mut hidden[..len * d]],
    )?;
    Ok((hidden, enc.mask, enc.truncated))
}

/// A prompt prepared for the denoiser: its cross-attention input (the K/V cache, in the plan's
/// cache type, when the plan has a cross-KV stage: computed once here instead of at every
/// step; else the f32 T5 states) and its mask `[l]`.
#[derive(Clone, Debug)]
pub struct Condition {
    pub context: HostBytes,
    pub mask: Vec<f32>,
}

/// Turns T5 states `[l, d]` and their mask into a [`Condition`].
pub fn condition(
    session: &mut dyn Executor<'_>,
    hidden: Vec<f32>,
    mask: Vec<f32>,
) -> Result<Condition> {
    let meta = session.plan().meta();
    let Some(k) = meta.cross_kv_stage else {
        return Ok(Condition {
            context: HostBytes::copy_of(hidden.as_bytes()),
            mask,
        });
    };
    let stage = &meta.stages[k as usize];
    let out = &stage.values[stage.outputs[0] as usize];
    let bytes = out.byte_len().ok_or_else(|| {
        Error::Plan(edge_schema::Error::Invalid(
            "cross-K/V output size overflows".into(),
        ))
    })?;
    let mut kv = HostBytes::zeroed(bytes as usize);
    session.run_stage_bytes(k, &[StageInput::F32(&hidden)], &mut [kv.as_mut_bytes()])?;
    Ok(Condition { context: kv, mask })
}

/// One denoiser forward for `size`: `latent [c, h, w]` at timestep `t` → `eps` (same shape).
pub fn denoise(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    latent: &[f32],
    t: f32,
    cond: &Condition,
    eps: &mut [f32],
) -> Result<()> {
    let tt = [t];
    session.run_stage(
        size.denoiser_stage,
        &[
            StageInput::F32(latent),
            StageInput::F32(&tt),
            StageInput::Bytes(cond.context.as_bytes()),
            StageInput::F32(&cond.mask),
        ],
        &mut [eps],
    )
}

/// Lists the plan's sizes as `WxH, WxH`.
pub fn available_sizes(meta: &PlanMeta) -> String {
    meta.sizes
        .iter()
        .map(|s| format!("{}x{}", s.width, s.height))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decodes final latents `[c, h, w]` into an image `[3, H, W]` with the size's VAE decoder,
/// tile by tile when the plan says so.
pub fn decode_latents(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    latents: &[f32],
) -> Result<Vec<f32>> {
    Ok(decode_latents_reported(session, size, latents)?.0)
}

/// [`decode_latents`], also returning what an exact tiled decode did.
pub fn decode_latents_reported(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    latents: &[f32],
) -> Result<(Vec<f32>, Option<crate::tiling::TileReport>)> {
    let mut report = None;
    let meta = session.plan().meta();
    let ds = meta.vae.downscale as usize;
    let (w, h) = (size.width as usize, size.height as usize);
    let mut image = vec![0f32; 3 * w * h];
    match &size.decoder_tiling {
        None => {
            session.run_stage(
                size.decoder_stage,
                &[StageInput::F32(latents)],
                &mut [&mut image],
            )?;
        }
        Some(
            t @ edge_schema::plan::VaeTiling {
                sync: Some(sync), ..
            },
        ) => {
            report = Some(crate::tiling::TileReport::Exact(
                crate::tiling::decode_exact(session, size, t, sync, latents, &mut image)?,
            ));
        }
        Some(
            t @ edge_schema::plan::VaeTiling {
                estimate: Some(e), ..
            },
        ) => {
            report = Some(crate::tiling::TileReport::Estimate(
                crate::tiling::decode_estimated(session, size, t, e, latents, &mut image)?,
            ));
        }
        Some(t) => {
            let grid = crate::tiling::TileGrid {
                channels: meta.vae.latent_channels as usize,
                latent_h: h / ds,
                latent_w: w / ds,
                tile_h: t.tile_latent_h as usize,
                tile_w: t.tile_latent_w as usize,
                overlap_h: t.overlap_latent_h as usize,
                overlap_w: t.overlap_latent_w as usize,
                scale: ds,
            };
            if latents.len() != grid.channels * grid.latent_h * grid.latent_w {
                return Err(Error::Argument {
                    flag: "latents",
                    reason: format!("{} values for a {w}x{h} image", latents.len()),
                });
            }
            let stage = t.stage;
            crate::tiling::decode_tiled(&grid, latents, &mut image, |tile, out| {
                session.run_stage(stage, &[StageInput::F32(tile)], &mut [out])
            })?;
        }
    }
    Ok((image, report))
}

/// The VAE encoder stage of `size`, checking that `rgb` holds `[h, w, 3]` bytes.
///
/// # Errors
/// [`Error::Argument`] (`init-img`) when the plan has no encoder for `size` or the length is
/// wrong.
fn encoder_of(size: &edge_schema::plan::ImageSize, rgb: &[u8]) -> Result<u32> {
    let (w, h) = (size.width as usize, size.height as usize);
    let stage = size.encoder_stage.ok_or_else(|| Error::Argument {
        flag: "init-img",
        reason: format!(
            "the plan has no VAE encoder for {w}x{h} (compiled with --no-vae-encoder, or the encoder did not fit its --max-ram); compile it with one for image to image"
        ),
    })?;
    if rgb.len() != 3 * w * h {
        return Err(Error::Argument {
            flag: "init-img",
            reason: format!(
                "{} bytes of RGB for a {w}x{h} image, expected {}",
                rgb.len(),
                3 * w * h
            ),
        });
    }
    Ok(stage)
}

/// Encodes an init image (RGB bytes `[h, w, 3]` of `size`) with the size's VAE encoder into
/// the clean latents `[c, h/8, w/8]` image to image starts from: the mean half of the moments
/// (the distribution's mode, as the img2img reference takes it) times the VAE scale.
///
/// # Errors
/// [`Error::Argument`] when the plan has no encoder for `size` or `rgb` has the wrong length;
/// the session's errors.
pub fn encode_image(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    rgb: &[u8],
) -> Result<Vec<f32>> {
    Ok(encode_image_reported(session, size, rgb)?.0)
}

/// [`encode_image`], also returning what an exact tiled encode did.
pub fn encode_image_reported(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    rgb: &[u8],
) -> Result<(Vec<f32>, Option<crate::tiling::ExactReport>)> {
    let (w, h) = (size.width as usize, size.height as usize);
    let stage = encoder_of(size, rgb)?;
    let meta = session.plan().meta();
    let (c, ds) = (
        meta.vae.latent_channels as usize,
        meta.vae.downscale.max(1) as usize,
    );
    let scale = meta.vae.scaling_factor;
    let image = crate::image::rgb8_to_vae_input(rgb, w, h);
    let mut moments = vec![0f32; 2 * c * (h / ds) * (w / ds)];
    let report = match &size.encoder_tiling {
        Some(t) => Some(crate::tiling::encode_exact(
            session,
            size,
            t,
            image,
            &mut moments,
        )?),
        None => {
            session.run_stage(stage, &[StageInput::F32(&image)], &mut [&mut moments])?;
            None
        }
    };
    moments.truncate(c * (h / ds) * (w / ds));
    for m in moments.iter_mut() {
        *m *= scale;
    }
    Ok((moments, report))
}

/// What a [`generate_with`] progress callback asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on.
    Continue,
    /// Stop now: [`generate_with`] returns [`Error::Interrupted`] and no image.
    Stop,
}

/// Decodes latents `[c, h, w]` with the plan's tiny decoder for `size` into an image `[3, H, W]`.
///
/// # Errors
/// [`Error::Argument`] (`decoder`) when the plan has no tiny decoder; the session's errors.
pub fn decode_tiny(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    latents: &[f32],
) -> Result<Vec<f32>> {
    let stage = size.tiny_decoder_stage.ok_or_else(|| Error::Argument {
        flag: "decoder",
        reason: format!(
            "the plan has no tiny decoder for {}x{}; compile it with `edgeplan compile --taesd DIR_OR_FILE`",
            size.width, size.height
        ),
    })?;
    let mut image = vec![0f32; 3 * size.width as usize * size.height as usize];
    session.run_stage(stage, &[StageInput::F32(latents)], &mut [&mut image])?;
    Ok(image)
}

/// Decodes `latents` with `decoder`.
fn decode_with(
    session: &mut dyn Executor<'_>,
    size: &edge_schema::plan::ImageSize,
    decoder: Decoder,
    latents: &[f32],
) -> Result<(Vec<f32>, Option<crate::tiling::TileReport>)> {
    match decoder {
        Decoder::Vae => decode_latents_reported(session, size, latents),
        Decoder::Tiny => Ok((decode_tiny(session, size, latents)?, None)),
    }
}

/// Runs the whole pipeline. `progress` is called after each phase and step.
pub fn generate(
    session: &mut dyn Executor<'_>,
    params: &GenerateParams,
    progress: &mut dyn FnMut(Progress),
) -> Result<Generated> {
    generate_with(session, params, &mut |p| {
        progress(p);
        Flow::Continue
    })
}

/// [`generate`] whose callback may stop the run: after the prompt encode, after any sampler
/// step and after the decode, a [`Flow::Stop`] ends it with [`Error::Interrupted`] naming the
/// phase (a request's time limit, an interrupt). A phase already running is not cut short.
///
/// # Errors
/// Those of [`generate`], and [`Error::Interrupted`].
pub fn generate_with(
    session: &mut dyn Executor<'_>,
    params: &GenerateParams,
    progress: &mut dyn FnMut(Progress) -> Flow,
) -> Result<Generated> {
    generate_previewing(session, params, progress, &mut |_| Ok(()))
}

/// A preview image handed to [`generate_previewing`]'s callback.
#[derive(Clone, Copy, Debug)]
pub struct Preview<'a> {
    /// Steps done when it was made, of `total`.
    pub step: usize,
    pub total: usize,
    /// RGB bytes `[height, width, 3]`.
    pub rgb: &'a [u8],
}

/// [`generate_with`] that also decodes previews as `params.preview` asks and hands each to
/// `preview` (which may fail the run, e.g. when the preview file cannot be written).
///
/// # Errors
/// Those of [`generate_with`]; [`Error::Argument`] (`preview`) for an interval of 0 or a
/// decoder the plan lacks; `preview`'s.
pub fn generate_previewing(
    session: &mut dyn Executor<'_>,
    params: &GenerateParams,
    progress: &mut dyn FnMut(Progress) -> Flow,
    preview: &mut dyn FnMut(Preview<'_>) -> Result<()>,
) -> Result<Generated> {
    let mut report = |p: Progress| match progress(p) {
        Flow::Continue => Ok(()),
        Flow::Stop => Err(Error::Interrupted {
            after: match p {
                Progress::Encoded => "the prompt encode".to_string(),
                Progress::ImageEncoded => "the init image encode".to_string(),
                Progress::Step { done, total } => format!("step {done}/{total}"),
                Progress::Decoded => "the decode".to_string(),
            },
        }),
    };
    let meta = session.plan().meta();
    let size = meta
        .size(params.width, params.height)
        .ok_or_else(|| Error::SizeNotInPlan {
            width: params.width,
            height: params.height,
            available: available_sizes(meta),
        })?
        .clone();
    if params.steps == 0 {
        return Err(Error::Argument {
            flag: "steps",
            reason: "must be at least 1".into(),
        });
    }
    if !params.cfg_scale.is_finite() {
        return Err(Error::Argument {
            flag: "cfg-scale",
            reason: format!("{} is not a finite number", params.cfg_scale),
        });
    }
    let needs_tiny = params.decoder == Decoder::Tiny
        || params.preview.is_some_and(|p| p.decoder == Decoder::Tiny);
    if needs_tiny && size.tiny_decoder_stage.is_none() {
        return Err(Error::Argument {
            flag: "decoder",
            reason: format!(
                "the plan has no tiny decoder (TAESD) for {}x{}; compile it with `edgeplan compile --taesd DIR_OR_FILE`",
                params.width, params.height
            ),
        });
    }
    if params.preview.is_some_and(|p| p.interval == 0) {
        return Err(Error::Argument {
            flag: "preview-interval",
            reason: "must be at least 1".into(),
        });
    }
    // The sampler first: a schedule that cannot run is refused before any work.
    let den = &meta.stages[size.denoiser_stage as usize];
    let latent_len = numel(den, den.inputs[0]);
    let mut scheduler = meta.scheduler.clone();
    if let Some(k) = params.karras {
        scheduler.use_karras_sigmas = k;
    }
    let mut sampler = Sampler::new(&scheduler, params.method, params.steps, latent_len)?;
    if let Some(init) = &params.init_image {
        // Refused before any work; `encode_image` would refuse the same later.
        encoder_of(&size, &init.rgb)?;
        if let Some(bytes) = edge_schema::tiles::encoder_spilled_bytes(meta, &size) {
            let dir = session.spill_dir();
            crate::tiling::check_spill_dir(&dir).map_err(|e| Error::Argument {
                flag: "spill-dir",
                reason: format!(
                    "{}: this plan's VAE encode of the init image at {}x{} holds {bytes} bytes in a spill file there: {e}",
                    dir.display(),
                    size.width,
                    size.height
                ),
            })?;
        }
        let begin = crate::sampler::img2img_begin(params.steps, init.strength, params.method)?;
        sampler.begin_at(begin)?;
    }
    let tokenizer = Tokenizer::new(&meta.tokenizer).map_err(|e| Error::Tokenizer(e.to_string()))?;
    let guided = params.cfg_scale > 1.0;
    let (ctx_c, mask_c, trunc_c) = encode_text(session, &tokenizer, &params.prompt)?;
    let cond = condition(session, ctx_c, mask_c)?;
    let mut truncated = trunc_c;
    let uncond = if guided {
        let (ctx_u, mask_u, trunc_u) = encode_text(session, &tokenizer, &params.negative_prompt)?;
        truncated |= trunc_u;
        Some(condition(session, ctx_u, mask_u)?)
    } else {
        None
    };
    session.plan().check_unchanged()?;
    report(Progress::Encoded)?;

    // Image to image: the clean latents of the init image (mode of the VAE's distribution,
    // scaled), computed after the prompts as the img2img pipeline does.
    let mut encoder_tiles = None;
    let clean = match &params.init_image {
        Some(init) => {
            let (l, r) = encode_image_reported(session, &size, &init.rgb)?;
            encoder_tiles = r;
            session.plan().check_unchanged()?;
            report(Progress::ImageEncoded)?;
            Some(l)
        }
        None => None,
    };
    // One generator for the initial noise (unless given) and then the per-step noise of
    // stochastic samplers, as diffusers passes one generator to both.
    let mut noise = crate::rng::NoiseStream::new(params.rng, params.seed);
    let mut latents = match &params.init_latents {
        Some(l) if l.len() != latent_len => {
            return Err(Error::Argument {
                flag: "init-latents",
                reason: format!(
                    "has {} values, the plan's {}x{} latents have {latent_len} (shape {:?})",
                    l.len(),
                    params.width,
                    params.height,
                    den.values[den.inputs[0] as usize].shape
                ),
            })
        }
        Some(l) => l.clone(),
        None => {
            let mut n = vec![0f32; latent_len];
            noise.fill(&mut n);
            n
        }
    };
    match &clean {
        // `add_noise(init_latents, noise, timesteps[begin])`, no `init_noise_sigma`.
        Some(x0) => {
            let n = latents.clone();
            sampler.add_noise(x0, &n, &mut latents)?;
        }
        None => {
            let sigma0 = sampler.init_noise_sigma();
            for x in latents.iter_mut() {
                *x *= sigma0;
            }
        }
    }
    let timesteps = sampler.timesteps().to_vec();
    let begin = sampler.begin();
    let total = timesteps.len() - begin;
    let mut model_in = vec![0f32; latent_len];
    let mut eps_c = vec![0f32; latent_len];
    let mut eps_u = vec![0f32; latent_len];
    let mut step_noise = vec![0f32; latent_len];
    let mut shown = if params.preview.is_some_and(|p| !p.noisy) {
        vec![0f32; latent_len]
    } else {
        Vec::new()
    };
    let mut streamed_per_step = Vec::with_capacity(timesteps.len());
    for (i, &t) in timesteps.iter().enumerate().skip(begin) {
        let streamed_before = session.streamer().streamed_bytes();
        sampler.scale_model_input(i, &latents, &mut model_in)?;
        denoise(session, &size, &model_in, t, &cond, &mut eps_c)?;
        if let Some(u) = &uncond {
            denoise(session, &size, &model_in, t, u, &mut eps_u)?;
            let g = params.cfg_scale;
            for (c, &u) in eps_c.iter_mut().zip(&eps_u) {
                *c = u + g * (*c - u);
            }
        }
        let done = i + 1 - begin;
        let want_preview = params
            .preview
            .filter(|p| done % p.interval.max(1) == 0 || done == total);
        if want_preview.is_some_and(|p| !p.noisy) {
            sampler.denoised(i, &latents, &eps_c, &mut shown)?;
        }
        if params.method.draws_noise(i, timesteps.len()) {
            noise.fill(&mut step_noise);
            sampler.step_with_noise(i, &eps_c, &mut latents, Some(&step_noise))?;
        } else {
            sampler.step(i, &eps_c, &mut latents)?;
        }
        // A plan rewritten in place under the run is the cause to name, before divergence.
        session.plan().check_unchanged()?;
        if latents.iter().any(|v| !v.is_finite()) {
            return Err(Error::Diverged {
                step: i + 1 - begin,
                cfg_scale: params.cfg_scale,
            });
        }
        streamed_per_step.push(session.streamer().streamed_bytes() - streamed_before);
        if let Some(p) = want_preview {
            let lat = if p.noisy { &latents } else { &shown };
            let (image, _) = decode_with(session, &size, p.decoder, lat)?;
            let rgb = crate::image::to_rgb8(&image, params.width as usize, params.height as usize);
            preview(Preview {
                step: done,
                total,
                rgb: &rgb,
            })?;
        }
        report(Progress::Step { done, total })?;
    }
    // The conditions (T5 states and cross-attention K/V of both prompts) are not needed to
    // decode: freed first, so the decoder's peak does not include them.
    drop(cond);
    drop(uncond);
    let (image, tiles) = decode_with(session, &size, params.decoder, &latents)?;
    session.plan().check_unchanged()?;
    report(Progress::Decoded)?;
    let rgb = crate::image::to_rgb8(&image, params.width as usize, params.height as usize);
    Ok(Generated {
        latents,
        rgb,
        truncated,
        streamed_per_step,
        tiles,
        encoder_tiles,
    })
}
