//! From a diffusers PixArt pipeline folder to plan metadata and packed weights.

use std::path::Path;

use edge_graph::WeightSpec;
use edge_models::config::{PixArtConfig, T5Config, VaeConfig};
use edge_models::pixart::{build_pixart_denoiser, MicroConditions};
use edge_models::t5::build_t5_encoder;
use edge_models::vae::build_vae_decoder;
use edge_schema::plan::{
    ImageSize, Isa, ModelFamily, ModelInfo, PlanMeta, StageKind, Target, TextInfo, VaeInfo,
};
use edge_schema::DType;

use crate::error::{PlanError, Result};
use crate::load::folder::PipelineFolder;
use crate::load::{scheduler, tokenizer, TensorSource};
use crate::lower::{lower, LoadedWeight, TensorTable, WeightResolver};
use crate::pack::PackPolicy;

/// What to compile.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Image sizes `(width, height)` in pixels; each must be a multiple of 16.
    pub sizes: Vec<(u32, u32)>,
    /// Tokens per prompt; `None` takes the pipeline's default (300 Σ, 120 α).
    pub max_sequence_length: Option<u32>,
    /// Weight types.
    pub policy: PackPolicy,
    /// Target the packs are laid out for.
    pub target: Target,
    /// Overrides the VAE config's `scaling_factor`.
    pub vae_scale_factor: Option<f32>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            sizes: vec![],
            max_sequence_length: None,
            policy: PackPolicy::default(),
            target: Target {
                isa: Isa::Generic,
                features: vec![],
            },
            vae_scale_factor: None,
        }
    }
}

/// A compiled plan before it is written: metadata (tensor and section tables not yet laid
/// out) and the packed tensors.
pub struct Compiled {
    pub meta: PlanMeta,
    pub table: TensorTable,
}

/// Resolves graph weights from one component's tensors (diffusers names).
pub struct SourceResolver<'a> {
    pub source: &'a dyn TensorSource,
}

impl SourceResolver<'_> {
    fn stored(&self, name: &str) -> String {
        match self.source.stored_name(name) {
            Some(s) => format!(" (stored as `{s}`)"),
            None => String::new(),
        }
    }
}

impl WeightResolver for SourceResolver<'_> {
    /// Fused specs (several parts) are first asked of [`TensorSource::fused`], so a tensor
    /// stored fused (original PixArt `attn.qkv`) is served whole, in its stored type; else
    /// the parts are read one by one and concatenated along axis 0.
    ///
    /// Errors: [`PlanError::Invalid`] naming the missing tensor (and its stored name) with
    /// the expected shape; [`PlanError::WeightShape`] naming the part whose shape disagrees.
    fn resolve(&self, spec: &WeightSpec, shape: &[u64]) -> Result<LoadedWeight> {
        let found_of = |t: &crate::load::RawTensor<'_>| -> Vec<u64> {
            t.shape.iter().map(|&d| d as u64).collect()
        };
        let shape_err = |name: String, found: Vec<u64>, expected: Vec<u64>| PlanError::WeightShape {
            tensor: name,
            source_desc: self.source.describe(),
            found,
            expected,
        };
        if spec.parts.len() > 1 {
            if let Some(t) = self.source.fused(&spec.parts)? {
                let found = found_of(&t);
                if found != shape {
                    let name = format!("{}{}", spec.parts.join(" + "), self.stored(&spec.parts[0]));
                    return Err(shape_err(name, found, shape.to_vec()));
                }
                return Ok(LoadedWeight {
                    dtype: t.dtype,
                    shape: shape.to_vec(),
                    bytes: t.data.to_vec(),
                });
            }
        }
        // The parts split the fused tensor along axis 0 into equal pieces (q/k/v, k/v):
        // each must agree with it on every other axis and hold its share of the rows.
        let n = spec.parts.len().max(1) as u64;
        let mut expected = shape.to_vec();
        if let Some(rows) = expected.first_mut() {
            *rows /= n;
        }
        let mut parts = Vec::with_capacity(spec.parts.len());
        for name in &spec.parts {
            let t = self.source.tensor(name)?.ok_or_else(|| {
                PlanError::Invalid(format!(
                    "tensor `{name}`{} is missing from {}; expected shape {expected:?}",
                    self.stored(name),
                    self.source.describe()
                ))
            })?;
            let found = found_of(&t);
            if found != expected {
                return Err(shape_err(
                    format!("{name}{}", self.stored(name)),
                    found,
                    expected.clone(),
                ));
            }
            parts.push(t);
        }
        let same_dtype = parts.iter().all(|t| t.dtype == parts[0].dtype);
        let (dtype, bytes) = if same_dtype {
            let mut b = Vec::new();
            for t in &parts {
                b.extend_from_slice(t.data);
            }
            (parts[0].dtype, b)
        } else {
            let mut b = Vec::new();
            for t in &parts {
                for x in crate::load::to_f32(t) {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
            (DType::F32, b)
        };
        Ok(LoadedWeight {
            dtype,
            shape: shape.to_vec(),
            bytes,
        })
    }
}

fn family_of(folder: &PipelineFolder) -> Result<ModelFamily> {
    match folder.pipeline_class.as_str() {
        "PixArtSigmaPipeline" => Ok(ModelFamily::PixArtSigma),
        "PixArtAlphaPipeline" => Ok(ModelFamily::PixArtAlpha),
        other => {
            let alpha = folder
                .transformer
                .tensors
                .names()
                .iter()
                .any(|n| n.contains("resolution_embedder"));
            if other.starts_with("PixArt") {
                Ok(if alpha { ModelFamily::PixArtAlpha } else { ModelFamily::PixArtSigma })
            } else {
                Err(PlanError::Invalid(format!(
                    "{}: model_index.json names pipeline `{other}`; expected PixArtSigmaPipeline or PixArtAlphaPipeline",
                    folder.root.display()
                )))
            }
        }
    }
}

/// Compiles the diffusers pipeline folder `dir`.
pub fn compile_folder(dir: &Path, opts: &CompileOptions) -> Result<Compiled> {
    let folder = PipelineFolder::open(dir)?;
    compile_pipeline(&folder, opts)
}

/// Compiles an opened pipeline folder.
pub fn compile_pipeline(folder: &PipelineFolder, opts: &CompileOptions) -> Result<Compiled> {
    if opts.sizes.is_empty() {
        return Err(PlanError::Invalid("no image size given (-W/-H)".into()));
    }
    let family = family_of(folder)?;
    let tok = tokenizer::load_tokenizer_dir(&folder.tokenizer_dir).map_err(crate::load::LoadError::from)?;
    let sched = scheduler::load_scheduler_config(&folder.scheduler_config)
        .map_err(crate::load::LoadError::from)?;
    let cfg_err = |dir: &Path, e: edge_models::config::ConfigError| {
        PlanError::Invalid(format!("{}: {e}", dir.join("config.json").display()))
    };
    let t5_cfg = T5Config::from_json(&folder.text_encoder.config)
        .map_err(|e| cfg_err(&folder.text_encoder.dir, e))?;
    let dit_cfg = PixArtConfig::from_json(&folder.transformer.config)
        .map_err(|e| cfg_err(&folder.transformer.dir, e))?;
    let vae_cfg = VaeConfig::from_json(&folder.vae.config).map_err(|e| cfg_err(&folder.vae.dir, e))?;
    let seq_len = opts.max_sequence_length.unwrap_or(match family {
        ModelFamily::PixArtSigma => 300,
        ModelFamily::PixArtAlpha => 120,
    });
    if seq_len == 0 || seq_len > 4096 {
        return Err(PlanError::Invalid(format!(
            "--max-sequence-length {seq_len} is outside 1..=4096"
        )));
    }
    let scaling_factor = opts.vae_scale_factor.unwrap_or(vae_cfg.scaling_factor);
    if !(scaling_factor.is_finite() && scaling_factor > 0.0) {
        return Err(PlanError::Invalid(format!(
            "VAE scale factor {scaling_factor} must be a positive number"
        )));
    }
    let downscale = vae_cfg.downscale_factor() as u32;
    let patch = dit_cfg.patch_size as u32;

    let mut table = TensorTable::default();
    let policy = &opts.policy;
    let mut stages = Vec::new();

    let t5_graph = build_t5_encoder(&t5_cfg, seq_len as usize)?;
    let t5_src = SourceResolver { source: folder.text_encoder.tensors.as_ref() };
    stages.push(lower(&t5_graph, StageKind::TextEncoder, 0, 0, &mut table, &t5_src, policy)?);
    let vocab_rows = t5_cfg.vocab_size as u32;

    let dit_src = SourceResolver { source: folder.transformer.tensors.as_ref() };
    let vae_src = SourceResolver { source: folder.vae.tensors.as_ref() };
    let mut sizes = Vec::new();
    for &(w, h) in &opts.sizes {
        let unit = downscale * patch;
        if w == 0 || h == 0 || w % unit != 0 || h % unit != 0 || w > 8192 || h > 8192 {
            return Err(PlanError::Invalid(format!(
                "image size {w}x{h}: width and height (-W/-H) must be positive multiples of {unit} (VAE factor {downscale} × patch {patch}), at most 8192"
            )));
        }
        if sizes.iter().any(|s: &ImageSize| s.width == w && s.height == h) {
            continue;
        }
        let (lh, lw) = ((h / downscale) as usize, (w / downscale) as usize);
        let micro = match family {
            ModelFamily::PixArtAlpha => Some(MicroConditions {
                height_px: h as f32,
                width_px: w as f32,
            }),
            ModelFamily::PixArtSigma => None,
        };
        let dit = build_pixart_denoiser(&dit_cfg, lh, lw, seq_len as usize, micro)?;
        let denoiser_stage = stages.len() as u32;
        stages.push(lower(&dit, StageKind::Denoiser, w, h, &mut table, &dit_src, policy)?);
        let mut vae = build_vae_decoder(&vae_cfg, lh, lw)?;
        if opts.vae_scale_factor.is_some() {
            override_vae_scale(&mut vae, scaling_factor);
        }
        let decoder_stage = stages.len() as u32;
        stages.push(lower(&vae, StageKind::VaeDecoder, w, h, &mut table, &vae_src, policy)?);
        sizes.push(ImageSize {
            width: w,
            height: h,
            denoiser_stage,
            decoder_stage,
        });
    }
    let name = folder
        .root
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let meta = PlanMeta {
        target: opts.target.clone(),
        model: ModelInfo {
            family,
            name,
            pipeline_class: folder.pipeline_class.clone(),
        },
        tokenizer: tok,
        scheduler: sched,
        text: TextInfo {
            max_sequence_length: seq_len,
            hidden: t5_cfg.d_model as u32,
            vocab_rows,
        },
        vae: VaeInfo {
            scaling_factor,
            latent_channels: vae_cfg.latent_channels as u32,
            downscale,
        },
        sizes,
        text_stage: 0,
        stages,
        tensors: vec![],
        sections: vec![],
        notes: vec![],
    };
    Ok(Compiled { meta, table })
}

/// Replaces the decoder's leading `Scale { 1 / scaling_factor }` with the overridden factor.
fn override_vae_scale(g: &mut edge_graph::Graph, scaling_factor: f32) {
    if let Some(node) = g
        .nodes
        .iter_mut()
        .find(|n| matches!(n.op, edge_schema::op::Op::Scale { .. }))
    {
        node.op = edge_schema::op::Op::Scale {
            factor: 1.0 / scaling_factor,
        };
    }
}

/// Compiles `dir` and writes the plan to `out` atomically. Returns the file's bytes length.
pub fn compile_to_file(dir: &Path, opts: &CompileOptions, out: &Path) -> Result<Compiled> {
    let mut c = compile_folder(dir, opts)?;
    c.meta.notes = c
        .table
        .fallbacks
        .iter()
        .map(|f| format!("{}: asked {}, stored {} ({})", f.tensor, f.asked, f.used, f.reason))
        .collect();
    let bytes = crate::write::assemble(&mut c.meta, &c.table)?;
    crate::write::write_atomic(out, &bytes)?;
    Ok(c)
}
