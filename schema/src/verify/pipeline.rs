//! The rules of the text-to-image pipeline the runtime runs (PixArt: T5 text encoder, optional
//! cross-K/V stage, a denoiser and VAE decoders per image size, text buckets, tiny decoder and
//! encoder stages), checked on metadata whose integrity [`super::verify_file`] has proved.

use super::{invalid, verify_encoder_tiling, verify_estimate, verify_sync};
use crate::error::{Error, Result};
use crate::plan::{PlanMeta, Stage, StageKind};

/// Checks the tokenizer, scheduler, VAE and LoRA records, the text stage and its buckets, the
/// cross-K/V cache every denoiser reads, and each image size's stages (kinds, sizes, tiling).
pub(super) fn verify_pipeline(meta: &PlanMeta) -> Result<()> {
    meta.tokenizer
        .validate()
        .map_err(|e| invalid(format!("tokenizer: {e}")))?;
    meta.scheduler
        .validate()
        .map_err(|e| invalid(format!("scheduler: {e}")))?;
    if !(meta.vae.scaling_factor.is_finite() && meta.vae.scaling_factor > 0.0) {
        return Err(invalid(format!(
            "vae scaling factor {} is not a positive number",
            meta.vae.scaling_factor
        )));
    }
    for (i, l) in meta.model.loras.iter().enumerate() {
        if !l.multiplier.is_finite()
            || l.file.chars().any(|c| c.is_control() || c == '/')
            || !matches!(l.format.as_str(), "peft" | "kohya")
        {
            return Err(invalid(format!(
                "LoRA record {i}: multiplier {}, file {:?}, format {:?} (expected a finite multiplier, a file name without directories or control characters, peft or kohya)",
                l.multiplier, l.file, l.format
            )));
        }
    }
    if let Some(c) = &meta.cuda {
        verify_cuda(c)?;
        for (i, &st) in c.host_stages.iter().enumerate() {
            let kind = meta.stages.get(st as usize).map(|s| s.kind);
            if !matches!(kind, Some(StageKind::TextEncoder)) || c.host_stages[..i].contains(&st) {
                return Err(invalid(format!(
                    "CUDA placement: stage {st} on the CPU cores is {kind:?} (expected each text encoder stage once)"
                )));
            }
        }
    }
    if meta.vae.downscale == 0 || meta.vae.latent_channels == 0 {
        return Err(invalid(
            "vae downscale and latent channels must be positive".into(),
        ));
    }
    if meta.stages.get(meta.text_stage as usize).map(|s| s.kind) != Some(StageKind::TextEncoder) {
        return Err(invalid(format!(
            "text stage {} is not a text encoder",
            meta.text_stage
        )));
    }
    if let Some(k) = meta.cross_kv_stage {
        let Some(kv) = meta
            .stages
            .get(k as usize)
            .filter(|s| s.kind == StageKind::CrossKv)
        else {
            return Err(invalid(format!(
                "cross-attention K/V stage {k} is not a CrossKv stage"
            )));
        };
        // Every denoiser reads the cache as the cross-K/V stage writes it.
        let fact = |s: &Stage, id: Option<&u32>| {
            id.and_then(|&i| s.values.get(i as usize))
                .map(|v| (v.dtype, v.shape.clone()))
        };
        let cache = fact(kv, kv.outputs.first());
        for (i, s) in meta.stages.iter().enumerate() {
            if s.kind == StageKind::Denoiser && fact(s, s.inputs.get(2)) != cache {
                return Err(invalid(format!(
                    "stage {i} ({}) reads a K/V cache {:?} but the cross-K/V stage writes {cache:?}",
                    s.name,
                    fact(s, s.inputs.get(2))
                )));
            }
        }
    }
    if meta.sizes.is_empty() {
        return Err(invalid("the plan holds no image size".into()));
    }
    for sz in &meta.sizes {
        let ok = |idx: u32, kind: StageKind| {
            meta.stages
                .get(idx as usize)
                .is_some_and(|s| s.kind == kind && s.width == sz.width && s.height == sz.height)
        };
        if let Some(t) = &sz.decoder_tiling {
            let ds = meta.vae.downscale;
            let (lw, lh) = (sz.width / ds.max(1), sz.height / ds.max(1));
            let tile_kind = if t.sync.is_some() {
                StageKind::VaeDecoderTail
            } else {
                StageKind::VaeDecoder
            };
            let tile_ok = meta.stages.get(t.stage as usize).is_some_and(|s| {
                s.kind == tile_kind
                    && u64::from(s.width) == u64::from(t.tile_latent_w) * u64::from(ds)
                    && u64::from(s.height) == u64::from(t.tile_latent_h) * u64::from(ds)
            });
            if !tile_ok
                || t.tile_latent_w == 0
                || t.tile_latent_h == 0
                || t.tile_latent_w > lw
                || t.tile_latent_h > lh
                || t.overlap_latent_w >= t.tile_latent_w
                || t.overlap_latent_h >= t.tile_latent_h
            {
                return Err(invalid(format!(
                    "size {}x{}: VAE tiling {t:?} does not fit the image or names a wrong stage",
                    sz.width, sz.height
                )));
            }
            if let Some(e) = &t.estimate {
                verify_estimate(meta, sz, t, e).map_err(|e| match e {
                    Error::Invalid(m) => invalid(format!(
                        "size {}x{}: estimated VAE tile statistics: {m}",
                        sz.width, sz.height
                    )),
                    other => other,
                })?;
            }
            if let Some(sync) = &t.sync {
                verify_sync(meta, sz, t, sync).map_err(|e| match e {
                    Error::Invalid(m) => invalid(format!(
                        "size {}x{}: exact VAE tiling: {m}",
                        sz.width, sz.height
                    )),
                    other => other,
                })?;
            }
        }
        let decoder_ok = match &sz.decoder_tiling {
            None => ok(sz.decoder_stage, StageKind::VaeDecoder),
            Some(t) => sz.decoder_stage == t.stage,
        };
        if !ok(sz.denoiser_stage, StageKind::Denoiser) || !decoder_ok {
            return Err(invalid(format!(
                "size {}x{} points at stages of the wrong kind or size",
                sz.width, sz.height
            )));
        }
        if let Some(t) = sz.tiny_decoder_stage {
            // latent [c, h, w] → image [3, H, W]
            let ds = meta.vae.downscale.max(1);
            let io_ok = meta.stages.get(t as usize).is_some_and(|st| {
                let shape = |id: Option<&u32>| {
                    id.and_then(|&i| st.values.get(i as usize))
                        .map(|v| v.shape.clone())
                };
                shape(st.inputs.first())
                    == Some(vec![
                        u64::from(meta.vae.latent_channels),
                        u64::from(sz.height / ds),
                        u64::from(sz.width / ds),
                    ])
                    && shape(st.outputs.first())
                        == Some(vec![3, u64::from(sz.height), u64::from(sz.width)])
            });
            if !ok(t, StageKind::TinyDecoder) || !io_ok {
                return Err(invalid(format!(
                    "size {}x{}: tiny decoder stage {t} is not a TinyDecoder from the latents to a [3, {}, {}] image",
                    sz.width, sz.height, sz.height, sz.width
                )));
            }
        }
        match (&sz.encoder_tiling, sz.encoder_stage) {
            (Some(et), Some(e)) if et.down_stage == e => {
                verify_encoder_tiling(meta, sz, et).map_err(|e| match e {
                    Error::Invalid(m) => invalid(format!(
                        "size {}x{}: exact VAE encoder tiling: {m}",
                        sz.width, sz.height
                    )),
                    other => other,
                })?;
            }
            (Some(et), e) => {
                return Err(invalid(format!(
                    "size {}x{}: encoder tiling of stage {} beside encoder stage {e:?}",
                    sz.width, sz.height, et.down_stage
                )));
            }
            (None, _) => {}
        }
        if let (None, Some(e)) = (&sz.encoder_tiling, sz.encoder_stage) {
            // image [3, H, W] → moments [2c, h, w]
            let st = meta.stages.get(e as usize);
            let shape_of = |st: &Stage, id: Option<&u32>| {
                id.and_then(|&i| st.values.get(i as usize))
                    .map(|v| v.shape.clone())
            };
            let ds = meta.vae.downscale.max(1);
            let io_ok = st.is_some_and(|st| {
                shape_of(st, st.inputs.first())
                    == Some(vec![3, u64::from(sz.height), u64::from(sz.width)])
                    && shape_of(st, st.outputs.first())
                        == Some(vec![
                            2 * u64::from(meta.vae.latent_channels),
                            u64::from(sz.height / ds),
                            u64::from(sz.width / ds),
                        ])
            });
            if !ok(e, StageKind::VaeEncoder) || !io_ok {
                return Err(invalid(format!(
                    "size {}x{}: encoder stage {e} is not a VAE encoder from [3, {}, {}] to [{}, {}, {}]",
                    sz.width,
                    sz.height,
                    sz.height,
                    sz.width,
                    2 * meta.vae.latent_channels,
                    sz.height / ds,
                    sz.width / ds
                )));
            }
        }
    }
    let mut prev = 0u32;
    for &(len, idx) in &meta.text_buckets {
        let st = meta
            .stages
            .get(idx as usize)
            .filter(|s| s.kind == StageKind::TextEncoder)
            .ok_or_else(|| {
                invalid(format!(
                    "text bucket {len} names stage {idx}, not a text encoder"
                ))
            })?;
        let ids = st
            .values
            .get(st.inputs[0] as usize)
            .map(|v| v.shape.clone());
        if len <= prev || len >= meta.text.max_sequence_length || ids != Some(vec![u64::from(len)])
        {
            return Err(invalid(format!(
                "text bucket {len} (stage {idx}) is not ascending, not shorter than {}, or its input is not [{len}]",
                meta.text.max_sequence_length
            )));
        }
        prev = len;
    }
    let text = &meta.stages[meta.text_stage as usize];
    let l = u64::from(meta.text.max_sequence_length);
    let ids_shape = &text.values[text.inputs[0] as usize].shape;
    if ids_shape != &[l] {
        return Err(invalid(format!(
            "text encoder input {ids_shape:?} does not match max sequence length {l}"
        )));
    }
    if meta.tokenizer.vocab_len() as u64 > u64::from(meta.text.vocab_rows) {
        return Err(invalid(format!(
            "tokenizer has {} ids but the embedding table has {} rows",
            meta.tokenizer.vocab_len(),
            meta.text.vocab_rows
        )));
    }
    Ok(())
}

/// Largest PTX text a plan may carry in all (the kernels of this release are about 0.5 MB).
pub const MAX_CUDA_PTX_BYTES: usize = 64 << 20;

/// Most CUDA modules a plan may carry (one per kernel source: 7 in this release), so that the
/// name checks stay cheap on a hostile plan.
pub const MAX_CUDA_MODULES: usize = 64;

/// Longest module name or compiler label, in bytes.
pub const MAX_CUDA_LABEL: usize = 64;

/// A plan's CUDA kernels: a known architecture, named modules without repeats, non-empty PTX
/// within [`MAX_CUDA_PTX_BYTES`]. Whether the modules match the runtime's own sources is the
/// CUDA executor's check (their digests).
fn verify_cuda(c: &crate::plan::CudaModules) -> Result<()> {
    if !matches!(c.arch.as_str(), "sm_72" | "sm_87" | "sm_90") {
        return Err(invalid(format!(
            "CUDA kernels for architecture {:?} (expected sm_72, sm_87 or sm_90)",
            c.arch
        )));
    }
    if c.compiler.is_empty()
        || c.compiler.len() > MAX_CUDA_LABEL
        || c.compiler.chars().any(char::is_control)
    {
        return Err(invalid(format!(
            "CUDA compiler label of {} bytes (expected 1 to {MAX_CUDA_LABEL} printable characters)",
            c.compiler.len()
        )));
    }
    if c.modules.len() > MAX_CUDA_MODULES {
        return Err(invalid(format!(
            "{} CUDA modules (at most {MAX_CUDA_MODULES})",
            c.modules.len()
        )));
    }
    let mut total = 0usize;
    for (i, m) in c.modules.iter().enumerate() {
        if m.name.is_empty()
            || m.name.len() > MAX_CUDA_LABEL
            || m.name.chars().any(|ch| ch.is_control() || ch == '/')
        {
            return Err(invalid(format!(
                "CUDA module {i}: name of {} bytes (expected a file name of 1 to {MAX_CUDA_LABEL} printable characters, without folders)",
                m.name.len()
            )));
        }
        if c.modules[..i].iter().any(|o| o.name == m.name) {
            return Err(invalid(format!(
                "CUDA module {i}: name {:?} repeated (expected a unique file name)",
                m.name
            )));
        }
        if m.ptx.is_empty() || m.ptx.contains('\0') {
            return Err(invalid(format!(
                "CUDA module {}: empty PTX or a NUL byte",
                m.name
            )));
        }
        total = total.saturating_add(m.ptx.len());
    }
    if total > MAX_CUDA_PTX_BYTES {
        return Err(invalid(format!(
            "CUDA modules hold {total} bytes of PTX, more than {MAX_CUDA_PTX_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::plan::{CudaModule, CudaModules};

    fn m(name: &str, ptx: &str) -> CudaModule {
        CudaModule {
            name: name.into(),
            source_digest: [0; 32],
            ptx: ptx.into(),
        }
    }

    #[test]
    fn cuda_modules_are_checked() {
        let ok = CudaModules {
            arch: "sm_87".into(),
            compiler: "NVRTC 12.6".into(),
            modules: vec![m("a.cu", ".version 8.5"), m("b.cu", ".version 8.5")],
            vram_budget: None,
            host_stages: vec![],
            device_bytes: 0,
        };
        assert!(verify_cuda(&ok).is_ok());
        let bad = |c: CudaModules, what: &str| {
            let e = verify_cuda(&c).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        bad(
            CudaModules {
                arch: "sm_80".into(),
                ..ok.clone()
            },
            "architecture \"sm_80\"",
        );
        let mut c = ok.clone();
        c.modules[1].name = "a.cu".into();
        bad(c, "unique file name");
        let mut c = ok.clone();
        c.modules[0].name = "../x.cu".into();
        bad(c, "without folders");
        let mut c = ok.clone();
        c.modules[0].name = "x".repeat(65);
        bad(c, "name of 65 bytes");
        let mut c = ok.clone();
        c.compiler = "\u{1b}[2JNVRTC\nforged".into();
        bad(c, "compiler label");
        let mut c = ok.clone();
        c.compiler = "N".repeat(MAX_CUDA_LABEL + 1);
        bad(c, "compiler label");
        let mut c = ok.clone();
        c.modules = (0..=MAX_CUDA_MODULES)
            .map(|i| m(&format!("{i}.cu"), "x"))
            .collect();
        bad(c, "CUDA modules (at most 64)");
        let mut c = ok.clone();
        c.modules[0].ptx.clear();
        bad(c, "empty PTX");
        let mut c = ok;
        c.modules[0].ptx = "x".repeat(MAX_CUDA_PTX_BYTES + 1);
        bad(c, "bytes of PTX");
    }
}
