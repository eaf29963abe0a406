//! Compiling from model files given one by one (single-file and GGUF checkpoints, a separate
//! tokenizer), with or without a pipeline folder: opening each file, inferring what no
//! `config.json` says ([`edge_models::infer`]), then the common compile.

use std::path::{Path, PathBuf};

use edge_models::config::{PixArtConfig, T5Config, VaeConfig};
use edge_models::infer;
use edge_schema::plan::ModelFamily;

use crate::compile::{compile_inputs_impl, CompileOptions, Compiled, Inputs};
use crate::compile::{family_name, folder_inputs};
use crate::error::{PlanError, Result};
use crate::load::file::{load_tokenizer_file, open_weights, GgufHints};
use crate::load::folder::PipelineFolder;
use crate::load::{scheduler, LoadError, TensorSource};
use edge_models::infer::{ALPHA_VAE_SCALE, PIXART_SCHEDULER_CONFIG, SIGMA_VAE_SCALE};

/// Model files given one by one (the `edgeplan compile` flags `--diffusion-model`,
/// `--t5xxl`, `--vae`, `--tokenizer`), each replacing that component of a pipeline folder,
/// or, without a folder, making up the whole pipeline.
#[derive(Clone, Debug, Default)]
pub struct ComponentFiles {
    /// PixArt transformer weights: safetensors (file, shard index or folder) or GGUF, in the
    /// diffusers or the original PixArt layout (detected from the names, see
    /// [`crate::load::original`]).
    pub diffusion_model: Option<PathBuf>,
    /// T5 encoder weights (diffusers / transformers names), safetensors.
    pub t5xxl: Option<PathBuf>,
    /// VAE weights (diffusers `AutoencoderKL` names), safetensors.
    pub vae: Option<PathBuf>,
    /// `spiece.model`, or an HF `tokenizer.json` (by the `.json` extension).
    pub tokenizer: Option<PathBuf>,
    /// Attention heads of the transformer when there is no folder config (shapes cannot tell;
    /// PixArt-XL has 16). A GGUF `pixart.attention.head_count` key is used when absent.
    pub heads: Option<usize>,
    /// The transformer's native latent size (`sample_size`) when there is no folder config;
    /// default: GGUF `pixart.sample_size`; required otherwise (no tensor reveals it).
    pub sample_size: Option<usize>,
    /// GroupNorm groups of the VAE when there is no folder config (shapes cannot tell);
    /// default 32, as in every published SD / SDXL VAE.
    pub vae_norm_groups: Option<usize>,
    /// The model family when there is no folder (`model_index.json` names it otherwise).
    /// PixArt-α at 1024 px is recognised by its micro-condition embedders; PixArt-Σ and
    /// PixArt-α at 512 px have the same tensors, and the family sets the VAE scale factor
    /// ([`SIGMA_VAE_SCALE`] / [`ALPHA_VAE_SCALE`]) and the default token count (300 / 120),
    /// so without those embedders it must be given.
    pub family: Option<ModelFamily>,
}

impl ComponentFiles {
    /// Whether no file is given.
    pub fn is_empty(&self) -> bool {
        self.diffusion_model.is_none()
            && self.t5xxl.is_none()
            && self.vae.is_none()
            && self.tokenizer.is_none()
    }
}

/// A [`TensorSource`] as the shape view that config inference reads.
struct Shapes<'a>(&'a dyn TensorSource);

impl infer::ShapeSource for Shapes<'_> {
    fn names(&self) -> Vec<String> {
        self.0.names()
    }
    fn shape(&self, name: &str) -> std::result::Result<Option<Vec<usize>>, String> {
        match self.0.tensor(name) {
            Ok(t) => Ok(t.map(|t| t.shape)),
            Err(e) => Err(e.to_string()),
        }
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn stored_name(&self, name: &str) -> Option<String> {
        self.0.stored_name(name)
    }
}

/// Compiles from a pipeline folder `dir` whose components `files` replace (any subset), or,
/// with `dir = None`, from `files` alone.
///
/// Without a folder every file is needed (diffusion model, T5, VAE, tokenizer); the
/// scheduler is [`PIXART_SCHEDULER_CONFIG`]; the configs are inferred from tensor shapes
/// (see [`ComponentFiles::heads`]); PixArt-α is recognised by its micro-condition embedders,
/// which also set the default VAE scale ([`ALPHA_VAE_SCALE`], else [`SIGMA_VAE_SCALE`]).
/// With a folder, its configs (transformer, T5, VAE) are kept and only weights/tokenizer are
/// replaced. [`CompileOptions::vae_scale_factor`] overrides the scale either way.
///
/// Errors: those of [`compile_pipeline`], of opening each file, and [`PlanError::Invalid`]
/// for a missing file or a config that cannot be inferred (naming the tensor or flag).
pub fn compile_inputs(
    dir: Option<&Path>,
    files: &ComponentFiles,
    opts: &CompileOptions,
) -> Result<Compiled> {
    let open_opt = |p: &Option<PathBuf>| -> Result<Option<(Box<dyn TensorSource>, GgufHints)>> {
        p.as_deref().map(open_weights).transpose()
    };
    let dit_file = open_opt(&files.diffusion_model)?;
    let t5_file = open_opt(&files.t5xxl)?;
    let vae_file = open_opt(&files.vae)?;
    if let Some(dir) = dir {
        let folder = PipelineFolder::open(dir)?;
        let mut inputs = folder_inputs(&folder, files.tokenizer.as_deref())?;
        if let Some((s, _)) = &dit_file {
            inputs.dit = s.as_ref();
        }
        if let Some((s, _)) = &t5_file {
            inputs.t5 = s.as_ref();
        }
        if let Some((s, _)) = &vae_file {
            inputs.vae = s.as_ref();
        }
        return compile_inputs_impl(inputs, opts);
    }
    let need = |what: &str, flag: &str| {
        PlanError::Invalid(format!(
            "no {what}: without a pipeline folder give {flag} FILE (and --diffusion-model, --t5xxl, --vae, --tokenizer)"
        ))
    };
    let (dit, hints) = dit_file.ok_or_else(|| need("diffusion model", "--diffusion-model"))?;
    let (t5, _) = t5_file.ok_or_else(|| need("text encoder", "--t5xxl"))?;
    let (vae, _) = vae_file.ok_or_else(|| need("VAE", "--vae"))?;
    let tok_path = files
        .tokenizer
        .as_deref()
        .ok_or_else(|| need("tokenizer", "--tokenizer"))?;
    // Everything the weights cannot tell, asked for at once rather than one run at a time.
    let mut missing: Vec<&str> = Vec::new();
    if files.heads.or(hints.heads).is_none() {
        missing.push("--heads N (attention heads; PixArt-XL: 16)");
    }
    if files.sample_size.or(hints.sample_size).is_none() {
        missing.push("--sample-size N (native latent size; 1024-px models: 128, 512-px: 64)");
    }
    let has_micro = dit
        .names()
        .iter()
        .any(|n| n.contains("resolution_embedder"));
    if files.family.is_none() && !has_micro {
        missing.push("--family sigma|alpha (PixArt-Σ: SDXL VAE, scale 0.13025, 300 tokens; PixArt-α: SD VAE, scale 0.18215, 120 tokens)");
    }
    if missing.len() > 1 {
        return Err(PlanError::Invalid(format!(
            "{}: without a pipeline folder these cannot be read from the weights; give {}",
            dit.describe(),
            missing.join(", ")
        )));
    }
    let dit_json = infer::pixart_config(
        &Shapes(dit.as_ref()),
        &infer::PixArtHints {
            heads: files.heads.or(hints.heads),
            sample_size: files.sample_size.or(hints.sample_size),
            interpolation_scale: hints.interpolation_scale,
            norm_eps: hints.norm_eps,
        },
    )?;
    let micro = dit_json
        .get("use_additional_conditions")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    // Every value no file states is recorded in the plan's notes (and printed by edgeplan).
    let mut assumed: Vec<String> = Vec::new();
    let family = match (files.family, micro) {
        (Some(ModelFamily::PixArtSigma), true) => {
            return Err(PlanError::Invalid(format!(
                "--family sigma: {} has PixArt-α's micro-condition embedders (adaln_single.emb.resolution_embedder); it is a PixArt-α transformer",
                dit.describe()
            )))
        }
        (Some(f), _) => f,
        (None, true) => {
            assumed.push("assumed family PixArt-α: the transformer has micro-condition embedders (resolution, aspect ratio)".into());
            ModelFamily::PixArtAlpha
        }
        (None, false) => {
            return Err(PlanError::Invalid(format!(
                "{}: without a pipeline folder the family cannot be told from the weights (PixArt-Σ and PixArt-α 512 px have the same tensors); give --family sigma (SDXL VAE, scale 0.13025, 300 tokens) or --family alpha (SD VAE, scale 0.18215, 120 tokens)",
                dit.describe()
            )))
        }
    };
    let (pipeline_class, scale, vae_name) = match family {
        ModelFamily::PixArtAlpha => ("PixArtAlphaPipeline", ALPHA_VAE_SCALE, "SD"),
        ModelFamily::PixArtSigma => ("PixArtSigmaPipeline", SIGMA_VAE_SCALE, "SDXL"),
    };
    let src_of = |flag: Option<usize>, gguf: Option<usize>, flag_name: &str, key: &str| {
        if flag.is_some() {
            flag_name.to_string()
        } else if gguf.is_some() {
            format!("GGUF {key}")
        } else {
            "default".to_string()
        }
    };
    assumed.push(format!(
        "transformer config from tensor shapes: {} attention heads ({}), sample size {} ({}), interpolation scale {}, norm eps {} ({})",
        dit_json["num_attention_heads"],
        src_of(files.heads, hints.heads, "--heads", "pixart.attention.head_count"),
        dit_json["sample_size"],
        src_of(files.sample_size, hints.sample_size, "--sample-size", "pixart.sample_size"),
        hints.interpolation_scale.map_or("sample size / 64".to_string(), |x| x.to_string()),
        hints.norm_eps.map_or("1e-6".to_string(), |x| x.to_string()),
        if hints.interpolation_scale.is_some() || hints.norm_eps.is_some() { "GGUF pixart.*" } else { "diffusers defaults" }
    ));
    assumed.push("assumed T5 config (T5 v1.1, as PixArt's T5-XXL): gated-gelu feed-forward, relative attention max distance 128, layer norm eps 1e-6".into());
    assumed.push(format!(
        "assumed VAE config: GroupNorm groups {} ({}), scaling factor {} ({})",
        files.vae_norm_groups.unwrap_or(32),
        if files.vae_norm_groups.is_some() {
            "--vae-norm-groups"
        } else {
            "every published SD/SDXL VAE; --vae-norm-groups to change"
        },
        opts.vae_scale_factor.unwrap_or(scale),
        if opts.vae_scale_factor.is_some() {
            "--vae-scale-factor".to_string()
        } else {
            format!(
                "the {vae_name} VAE of {}; --vae-scale-factor to change",
                family_name(family)
            )
        }
    ));
    assumed.push("assumed scheduler: the PixArt pipelines' DPMSolverMultistepScheduler config (no scheduler_config.json)".into());
    let file_err = |p: &Option<PathBuf>, e: edge_models::config::ConfigError| {
        PlanError::Invalid(format!(
            "{} (config inferred from tensor shapes): {e}",
            p.as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ))
    };
    let t5_json = infer::t5_config(&Shapes(t5.as_ref()))?;
    let vae_json = infer::vae_config(&Shapes(vae.as_ref()), scale, files.vae_norm_groups)?;
    let dit_path = files.diffusion_model.as_deref().unwrap_or(Path::new(""));
    let inputs = Inputs {
        assumed,
        name: dit_path
            .file_stem()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default(),
        pipeline_class: pipeline_class.to_string(),
        family,
        tok: load_tokenizer_file(tok_path)?,
        sched: scheduler::parse_scheduler_config(
            PIXART_SCHEDULER_CONFIG,
            "built-in PixArt scheduler config",
        )
        .map_err(LoadError::from)?,
        t5_cfg: T5Config::from_json(&t5_json).map_err(|e| file_err(&files.t5xxl, e))?,
        dit_cfg: PixArtConfig::from_json(&dit_json)
            .map_err(|e| file_err(&files.diffusion_model, e))?,
        vae_cfg: VaeConfig::from_json(&vae_json).map_err(|e| file_err(&files.vae, e))?,
        t5: t5.as_ref(),
        dit: dit.as_ref(),
        vae: vae.as_ref(),
    };
    compile_inputs_impl(inputs, opts)
}
