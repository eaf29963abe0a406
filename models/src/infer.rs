//! What a published PixArt pipeline leaves unsaid, as this crate knows it: configs inferred
//! from tensor shapes when a checkpoint comes without its `config.json` (single files, GGUF),
//! the pipelines' default scheduler config and VAE scaling factors.

use crate::ModelError;

/// Result of config inference.
pub type Result<T> = std::result::Result<T, ModelError>;

/// The shapes of a checkpoint's tensors under diffusers / transformers names.
pub trait ShapeSource {
    /// All tensor names.
    fn names(&self) -> Vec<String>;
    /// The shape (outermost-first) of `name`, `Ok(None)` when absent; `Err` names the file
    /// that could not be read.
    fn shape(&self, name: &str) -> std::result::Result<Option<Vec<usize>>, String>;
    /// Where the tensors come from (file paths), for errors.
    fn describe(&self) -> String;
    /// The name the file stores `name` under, when it differs (for errors).
    fn stored_name(&self, name: &str) -> Option<String>;
}

/// What the tensor shapes of a PixArt transformer cannot say, from the command line or a GGUF
/// file's `pixart.*` keys.
#[derive(Clone, Copy, Debug, Default)]
pub struct PixArtHints {
    /// Attention heads (PixArt-XL: 16).
    pub heads: Option<usize>,
    /// Native latent size (1024-px models: 128).
    pub sample_size: Option<usize>,
    pub interpolation_scale: Option<f64>,
    pub norm_eps: Option<f64>,
}

/// The `scheduler_config.json` of the PixArt-α / Σ pipelines (DPM-Solver++ 2M, linear betas
/// 1e-4…0.02 over 1000 steps, epsilon prediction), used when there is no folder.
pub const PIXART_SCHEDULER_CONFIG: &str = r#"{
  "_class_name": "DPMSolverMultistepScheduler",
  "algorithm_type": "dpmsolver++",
  "beta_end": 0.02,
  "beta_schedule": "linear",
  "beta_start": 0.0001,
  "dynamic_thresholding_ratio": 0.995,
  "euler_at_final": false,
  "final_sigmas_type": "zero",
  "lambda_min_clipped": -Infinity,
  "lower_order_final": true,
  "num_train_timesteps": 1000,
  "prediction_type": "epsilon",
  "rescale_betas_zero_snr": false,
  "sample_max_value": 1.0,
  "solver_order": 2,
  "solver_type": "midpoint",
  "steps_offset": 0,
  "thresholding": false,
  "timestep_spacing": "linspace",
  "trained_betas": null,
  "use_karras_sigmas": false,
  "use_lu_lambdas": false,
  "variance_type": null
}"#;

/// VAE `scaling_factor` of the PixArt-α VAE (SD 1.x/2.x `AutoencoderKL`).
pub const ALPHA_VAE_SCALE: f32 = 0.18215;
/// VAE `scaling_factor` of the PixArt-Σ VAE (SDXL `AutoencoderKL`).
pub const SIGMA_VAE_SCALE: f32 = 0.13025;

fn shape_of(src: &dyn ShapeSource, name: &str) -> Result<Vec<usize>> {
    src.shape(name).map_err(ModelError::Infer)?.ok_or_else(|| {
        ModelError::Infer(format!(
            "tensor `{name}`{} is missing from {} (needed to infer the model config from shapes)",
            src.stored_name(name)
                .map(|s| format!(" (stored as `{s}`)"))
                .unwrap_or_default(),
            src.describe()
        ))
    })
}

fn dim(
    src: &dyn ShapeSource,
    name: &str,
    shape: &[usize],
    axis: usize,
    rank: usize,
) -> Result<usize> {
    if shape.len() != rank {
        return Err(ModelError::Infer(format!(
            "tensor `{name}` in {} has shape {shape:?}; expected {rank} dimensions",
            src.describe()
        )));
    }
    Ok(shape[axis])
}

/// Counts `<prefix>{i}<suffix>` for i = 0, 1, … while present.
fn count_indexed(names: &[String], prefix: &str, suffix: &str) -> usize {
    let mut n = 0;
    while names.iter().any(|x| *x == format!("{prefix}{n}{suffix}")) {
        n += 1;
    }
    n
}

/// A diffusers `PixArtTransformer2DModel` config inferred from tensor shapes (diffusers
/// names): hidden `D` and patch `p` from `pos_embed.proj.weight [D, C_in, p, p]`, depth from
/// the `transformer_blocks.N.scale_shift_table` count, caption channels from
/// `caption_projection.linear_1.weight [D, C_cap]`, out channels from
/// `proj_out.weight [p·p·C_out, D]`, α micro-conditions from the presence of
/// `adaln_single.emb.resolution_embedder`. The head count comes from `files.heads` or the
/// GGUF key ([`PixArtHints`]); without either this is an error.
pub fn pixart_config(src: &dyn ShapeSource, hints: &PixArtHints) -> Result<serde_json::Value> {
    let names = src.names();
    let pe = "pos_embed.proj.weight";
    let s = shape_of(src, pe)?;
    let d = dim(src, pe, &s, 0, 4)?;
    let (cin, p) = (s[1], s[2]);
    let cap = "caption_projection.linear_1.weight";
    let caption = dim(src, cap, &shape_of(src, cap)?, 1, 2)?;
    let po = "proj_out.weight";
    let rows = dim(src, po, &shape_of(src, po)?, 0, 2)?;
    if p == 0 || rows % (p * p) != 0 {
        return Err(ModelError::Infer(format!(
            "tensor `{po}` in {} has {rows} rows; expected a multiple of patch² = {}",
            src.describe(),
            p * p
        )));
    }
    let depth = count_indexed(&names, "transformer_blocks.", ".scale_shift_table");
    if depth == 0 {
        return Err(ModelError::Infer(format!(
            "{}: no transformer blocks found (expected `blocks.0.scale_shift_table` or `transformer_blocks.0.scale_shift_table`)",
            src.describe()
        )));
    }
    let heads = hints.heads.ok_or_else(|| {
        ModelError::Infer(format!(
            "{}: the attention head count cannot be read from tensor shapes (hidden size {d}); give it with --heads N (PixArt-XL: 16)",
            src.describe()
        ))
    })?;
    if heads == 0 || d % heads != 0 {
        return Err(ModelError::Infer(format!(
            "--heads {heads}: must divide the hidden size {d}"
        )));
    }
    let alpha = names.iter().any(|n| n.contains("resolution_embedder"));
    let mut cfg = serde_json::json!({
        "num_attention_heads": heads,
        "attention_head_dim": d / heads,
        "in_channels": cin,
        "out_channels": rows / (p * p),
        "num_layers": depth,
        "cross_attention_dim": d,
        "attention_bias": true,
        "sample_size": hints.sample_size.ok_or_else(|| {
            ModelError::Infer(format!(
                "{}: the transformer's native latent size cannot be read from tensor shapes (PixArt models ship 32, 64, 128 and 256 for 256 to 2048 px); give it with --sample-size N (1024-px models: 128)",
                src.describe()
            ))
        })?,
        "patch_size": p,
        "caption_channels": caption,
        "use_additional_conditions": alpha,
    });
    if let Some(obj) = cfg.as_object_mut() {
        if let Some(x) = hints.interpolation_scale {
            obj.insert("interpolation_scale".into(), serde_json::json!(x));
        }
        if let Some(x) = hints.norm_eps {
            obj.insert("norm_eps".into(), serde_json::json!(x));
        }
    }
    Ok(cfg)
}

/// A T5 encoder config inferred from shapes (transformers names): `shared.weight
/// [vocab, d_model]`, `…SelfAttention.relative_attention_bias.weight [buckets, heads]`,
/// `…SelfAttention.q.weight [heads·d_kv, d_model]`, `…wi_0.weight [d_ff, d_model]`, the
/// layer count from `encoder.block.N`; `gated-gelu` (T5 v1.1), max distance 128.
pub fn t5_config(src: &dyn ShapeSource) -> Result<serde_json::Value> {
    let names = src.names();
    let sh = "shared.weight";
    let s = shape_of(src, sh)?;
    let (vocab, d) = (dim(src, sh, &s, 0, 2)?, s[1]);
    let rb = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    let s = shape_of(src, rb)?;
    let (buckets, heads) = (dim(src, rb, &s, 0, 2)?, s[1]);
    let q = "encoder.block.0.layer.0.SelfAttention.q.weight";
    let inner = dim(src, q, &shape_of(src, q)?, 0, 2)?;
    let wi = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight";
    let d_ff = dim(src, wi, &shape_of(src, wi)?, 0, 2)?;
    let layers = count_indexed(&names, "encoder.block.", ".layer.0.layer_norm.weight");
    if heads == 0 || inner % heads != 0 {
        return Err(ModelError::Infer(format!(
            "{}: `{q}` has {inner} rows, not a multiple of the {heads} heads of `{rb}`",
            src.describe()
        )));
    }
    Ok(serde_json::json!({
        "vocab_size": vocab,
        "d_model": d,
        "d_kv": inner / heads,
        "d_ff": d_ff,
        "num_layers": layers,
        "num_heads": heads,
        "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": 128,
        "feed_forward_proj": "gated-gelu",
        "layer_norm_epsilon": 1e-6,
    }))
}

/// A VAE config inferred from shapes (diffusers `AutoencoderKL` names): up block `i` of the
/// decoder has `block_out_channels[n-1-i]` channels (`decoder.up_blocks.i.resnets.0.conv2.weight`),
/// `layers_per_block + 1` resnets; latent channels from `decoder.conv_in.weight`, output
/// channels from `decoder.conv_out.weight`. GroupNorm groups cannot be read from shapes:
/// `groups`, default 32 (every published SD/SDXL VAE). `scaling_factor` from the model family.
pub fn vae_config(
    src: &dyn ShapeSource,
    scaling_factor: f32,
    groups: Option<usize>,
) -> Result<serde_json::Value> {
    let names = src.names();
    let n = count_indexed(&names, "decoder.up_blocks.", ".resnets.0.conv2.weight");
    if n == 0 {
        return Err(ModelError::Infer(format!(
            "{}: no `decoder.up_blocks.0.resnets.0.conv2.weight` (expected a diffusers AutoencoderKL)",
            src.describe()
        )));
    }
    let mut channels = vec![0usize; n];
    for (i, c) in channels.iter_mut().rev().enumerate() {
        let name = format!("decoder.up_blocks.{i}.resnets.0.conv2.weight");
        *c = dim(src, &name, &shape_of(src, &name)?, 0, 4)?;
    }
    let resnets = count_indexed(&names, "decoder.up_blocks.0.resnets.", ".conv1.weight");
    let ci = "decoder.conv_in.weight";
    let latent = dim(src, ci, &shape_of(src, ci)?, 1, 4)?;
    let co = "decoder.conv_out.weight";
    let out = dim(src, co, &shape_of(src, co)?, 0, 4)?;
    let has = |p: &str| names.iter().any(|x| x.starts_with(p));
    Ok(serde_json::json!({
        "act_fn": "silu",
        "block_out_channels": channels,
        "down_block_types": vec!["DownEncoderBlock2D"; n],
        "up_block_types": vec!["UpDecoderBlock2D"; n],
        "in_channels": out,
        "out_channels": out,
        "latent_channels": latent,
        "layers_per_block": resnets.saturating_sub(1).max(1),
        "norm_num_groups": groups.unwrap_or(32),
        "scaling_factor": scaling_factor,
        "use_quant_conv": has("quant_conv."),
        "use_post_quant_conv": has("post_quant_conv."),
        "mid_block_add_attention": has("decoder.mid_block.attentions.0."),
    }))
}
