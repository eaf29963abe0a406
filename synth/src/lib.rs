//! Synthetic PixArt pipelines: real shapes, random weights, nothing downloaded.
//!
//! [`preset`] describes a pipeline (the three `config.json` documents as diffusers 0.42 and
//! transformers 5 write them, and every weight tensor with its shape and initialisation);
//! [`synthesize`] writes it as a diffusers pipeline folder (the layout
//! [`edge_planner::load::folder::PipelineFolder`] reads):
//!
//! ```text
//! <dir>/model_index.json                          PixArtSigmaPipeline
//! <dir>/transformer/{config.json, diffusion_pytorch_model.safetensors}
//! <dir>/text_encoder/{config.json, model.safetensors | model-0000N-of-0000M.safetensors
//!                     + model.safetensors.index.json}
//! <dir>/vae/{config.json, diffusion_pytorch_model.safetensors}
//! <dir>/tokenizer/*, <dir>/scheduler/scheduler_config.json   (copied from a model folder)
//! ```
//!
//! Weights are a pure function of `(seed, tensor name, element index)`: each tensor gets a key
//! `blake3(seed ‖ name)`, element pair `j` takes two SplitMix64 outputs of the counter
//! `key + (2j+1)·γ`, `key + (2j+2)·γ` and turns them into two normal deviates with the
//! Box–Muller transform (so tensors and chunks of tensors are generated independently of
//! order and in parallel). Scales keep the activations finite through every layer: matrices
//! `N(0, gain²/fan_in)` with gain 1, or 0.5 for projections that write into a residual stream;
//! biases `N(0, 0.02²)`; norm scales 1 and norm shifts 0; `scale_shift_table` `N(0, 0.02²)`;
//! T5 embeddings `N(0, 0.5²)`, relative-attention bias `N(0, 0.1²)`.
//!
//! Shapes follow the graph builders in `edge_models` (`pixart.rs`, `t5.rs`, `vae.rs`), which
//! follow diffusers `PixArtTransformer2DModel` / `AutoencoderKL` and transformers
//! `T5EncoderModel`.

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// Why a synthetic pipeline cannot be described or written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// `--preset` names no known preset.
    #[error("unknown preset `{name}` (known: {known})")]
    UnknownPreset { name: String, known: String },
    /// `--dtype` names no supported storage type.
    #[error("unknown weight type `{name}` (expected f16, f32 or bf16)")]
    UnknownDType { name: String },
    /// The output folder exists and is not empty, and overwriting was not asked for.
    #[error("{path}: exists and is not empty (pass --force to replace it)")]
    NotEmpty { path: String },
    /// `--force` was given for a folder that is not a pipeline folder, or one that holds
    /// the current folder: replacing it would delete what synth did not write.
    #[error("{path}: {reason}; refusing to replace it (give a new or empty folder, or a pipeline folder synth wrote)")]
    NotReplaceable { path: String, reason: String },
    /// The output path exists and is not a folder.
    #[error("{path}: exists and is not a folder")]
    NotAFolder { path: String },
    /// The model folder to copy the tokenizer and scheduler from lacks them.
    #[error("{path}: missing (the tokenizer and scheduler are copied from --tokenizer-from, a diffusers pipeline folder with tokenizer/ and scheduler/scheduler_config.json)")]
    MissingSource { path: String },
    /// A file or folder could not be created, read, copied or renamed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The safetensors writer failed.
    #[error("writing {path}: {reason}")]
    Safetensors { path: String, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
    move |source| SynthError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Independent normal deviates with mean 0 and standard deviation `std`.
    Normal { std: f32 },
    /// Every element equal to the value (norm scales 1, norm shifts 0).
    Constant(f32),
}

/// One weight tensor of a synthetic component.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// The checkpoint name (diffusers / transformers naming).
    pub name: String,
    /// Shape, outermost-first (PyTorch order).
    pub shape: Vec<usize>,
    /// How its values are drawn.
    pub init: Init,
}

impl TensorSpec {
    /// Number of elements (product of the shape).
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// One model component of a synthetic pipeline (`transformer`, `text_encoder`, `vae`).
#[derive(Clone, Debug, PartialEq)]
pub struct ComponentSpec {
    /// The component's folder name inside the pipeline folder.
    pub folder: &'static str,
    /// `config.json` as diffusers / transformers write it (without the storage `dtype`, which
    /// [`synthesize`] adds to the transformers config).
    pub config: Value,
    /// Weight file stem: `diffusion_pytorch_model` (diffusers) or `model` (transformers).
    pub file_stem: &'static str,
    /// Largest shard in bytes; `None` writes one file `<stem>.safetensors`. With a limit the
    /// tensors are split, in list order, into `<stem>-0000N-of-0000M.safetensors` files of at
    /// most this many bytes of tensor data (a larger single tensor gets a shard of its own),
    /// plus `<stem>.safetensors.index.json`.
    pub max_shard_bytes: Option<u64>,
    /// Every weight tensor, in declaration order.
    pub tensors: Vec<TensorSpec>,
}

impl ComponentSpec {
    /// Total number of parameters (sum of the tensors' element counts).
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(TensorSpec::numel).sum()
    }
}

/// A synthetic PixArt pipeline: `model_index.json` and the three model components.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    /// The preset's name (`--preset`).
    pub name: &'static str,
    /// `model_index.json` (`_class_name: "PixArtSigmaPipeline"`).
    pub model_index: Value,
    /// `PixArtTransformer2DModel`.
    pub transformer: ComponentSpec,
    /// `T5EncoderModel`.
    pub text_encoder: ComponentSpec,
    /// `AutoencoderKL`.
    pub vae: ComponentSpec,
}

impl Preset {
    /// The three components, in the order they are written.
    pub fn components(&self) -> [&ComponentSpec; 3] {
        [&self.transformer, &self.text_encoder, &self.vae]
    }
}

/// Names accepted by [`preset`].
pub const PRESETS: [&str; 3] = [
    "pixart-sigma-xl2-1024",
    "pixart-sigma-xl2-1024-t5-1",
    "pixart-sigma-small",
];

/// Shards of about 2 GB (10⁹-byte GB, as `save_pretrained(max_shard_size="2GB")` counts).
const SHARD_2GB: u64 = 2_000_000_000;
const DIFFUSERS_VERSION: &str = "0.42.1";
const TRANSFORMERS_VERSION: &str = "5.24.0";
/// Standard deviation of biases, `scale_shift_table` entries.
const SMALL: f32 = 0.02;

/// The pipeline called `name`:
///
/// - `pixart-sigma-xl2-1024`: the released PixArt-Σ-XL-2-1024-MS transformer (28 blocks,
///   16 heads × 72, patch 2, 4 → 8 channels, caption 4096, sample size 128, interpolation
///   scale 2, no micro-conditions), the T5 v1.1 XXL encoder (24 blocks, d_model 4096, 64 heads
///   × 64, d_ff 10240, vocabulary 32128; shards of ≤ 2 GB) and the SDXL VAE (channels
///   128/256/512/512, 2 ResNets per block, 32 groups, scaling factor 0.13025);
/// - `pixart-sigma-small`: the same architecture scaled down for tests (4 blocks, 4 heads × 72
///   = 288, caption 256; T5 2 blocks, d_model 256, 4 heads × 64, d_ff 512, vocabulary 384,
///   sharded at 1 MB to exercise the shard index; VAE 32/64/64/64, 1 ResNet per block,
///   16 groups);
/// - `pixart-sigma-xl2-1024-t5-1`: the XL transformer and SDXL VAE at their real size with a
///   one-block T5 of T5-XXL's width and vocabulary (about 1 G parameters instead of 5.4 G):
///   for timing the denoiser and the VAE where the full encoder cannot be written or held
///   (a GPU machine with a small disk); its prompt encodings are not T5-XXL's.
///
/// Errors: [`SynthError::UnknownPreset`] listing the known names.
pub fn preset(name: &str) -> Result<Preset, SynthError> {
    match name {
        "pixart-sigma-xl2-1024" => Ok(xl_preset("pixart-sigma-xl2-1024", 24)),
        "pixart-sigma-xl2-1024-t5-1" => Ok(xl_preset("pixart-sigma-xl2-1024-t5-1", 1)),
        "pixart-sigma-small" => Ok(build_preset(
            "pixart-sigma-small",
            &PixArtDims {
                layers: 4,
                heads: 4,
                head_dim: 72,
                caption_channels: 256,
                sample_size: 32,
                interpolation_scale: 1,
            },
            &T5Dims {
                layers: 2,
                d_model: 256,
                d_kv: 64,
                heads: 4,
                d_ff: 512,
                vocab: 384,
                max_shard_bytes: 1_000_000,
            },
            &VaeDims {
                channels: vec![32, 64, 64, 64],
                layers_per_block: 1,
                groups: 16,
                sample_size: 256,
            },
        )),
        other => Err(SynthError::UnknownPreset {
            name: other.to_string(),
            known: PRESETS.join(", "),
        }),
    }
}

/// The XL transformer, T5-XXL's dimensions with `t5_layers` blocks, and the SDXL VAE.
fn xl_preset(name: &'static str, t5_layers: usize) -> Preset {
    build_preset(
        name,
        &PixArtDims {
            layers: 28,
            heads: 16,
            head_dim: 72,
            caption_channels: 4096,
            sample_size: 128,
            interpolation_scale: 2,
        },
        &T5Dims {
            layers: t5_layers,
            d_model: 4096,
            d_kv: 64,
            heads: 64,
            d_ff: 10240,
            vocab: 32128,
            max_shard_bytes: SHARD_2GB,
        },
        &VaeDims {
            channels: vec![128, 256, 512, 512],
            layers_per_block: 2,
            groups: 32,
            sample_size: 1024,
        },
    )
}

struct PixArtDims {
    layers: usize,
    heads: usize,
    head_dim: usize,
    caption_channels: usize,
    sample_size: usize,
    interpolation_scale: usize,
}

struct T5Dims {
    layers: usize,
    d_model: usize,
    d_kv: usize,
    heads: usize,
    d_ff: usize,
    vocab: usize,
    max_shard_bytes: u64,
}

struct VaeDims {
    channels: Vec<usize>,
    layers_per_block: usize,
    groups: usize,
    sample_size: usize,
}

fn build_preset(name: &'static str, p: &PixArtDims, t: &T5Dims, v: &VaeDims) -> Preset {
    let model_index = json!({
        "_class_name": "PixArtSigmaPipeline",
        "_diffusers_version": DIFFUSERS_VERSION,
        "scheduler": ["diffusers", "DPMSolverMultistepScheduler"],
        "text_encoder": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "T5Tokenizer"],
        "transformer": ["diffusers", "PixArtTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    });
    Preset {
        name,
        model_index,
        transformer: pixart_component(p),
        text_encoder: t5_component(t),
        vae: vae_component(v),
    }
}

/// Collects tensor specs in declaration order.
#[derive(Default)]
struct Tensors(Vec<TensorSpec>);

impl Tensors {
    fn push(&mut self, name: String, shape: &[usize], init: Init) {
        self.0.push(TensorSpec {
            name,
            shape: shape.to_vec(),
            init,
        });
    }

    /// `nn.Linear(inp, out)`: weight `N(0, (gain/√inp)²)`, bias `N(0, 0.02²)` when present.
    fn linear(&mut self, prefix: &str, out: usize, inp: usize, gain: f32, bias: bool) {
        let std = gain / (inp as f32).sqrt();
        self.push(
            format!("{prefix}.weight"),
            &[out, inp],
            Init::Normal { std },
        );
        if bias {
            self.push(
                format!("{prefix}.bias"),
                &[out],
                Init::Normal { std: SMALL },
            );
        }
    }

    /// `nn.Conv2d(cin, cout, k)` with bias; fan-in `cin·k·k`.
    fn conv(&mut self, prefix: &str, cout: usize, cin: usize, k: usize, gain: f32) {
        let std = gain / ((cin * k * k) as f32).sqrt();
        self.push(
            format!("{prefix}.weight"),
            &[cout, cin, k, k],
            Init::Normal { std },
        );
        self.push(
            format!("{prefix}.bias"),
            &[cout],
            Init::Normal { std: SMALL },
        );
    }

    /// Affine `nn.GroupNorm` / `nn.LayerNorm`: scale 1, shift 0.
    fn norm(&mut self, prefix: &str, c: usize) {
        self.push(format!("{prefix}.weight"), &[c], Init::Constant(1.0));
        self.push(format!("{prefix}.bias"), &[c], Init::Constant(0.0));
    }
}

/// `PixArtTransformer2DModel` (diffusers `pixart_transformer_2d.py`) without
/// micro-conditions; names and shapes as `edge_models::build_pixart_denoiser` declares them.
fn pixart_component(p: &PixArtDims) -> ComponentSpec {
    let d = p.heads * p.head_dim;
    let (cin, cout, patch) = (4usize, 8usize, 2usize);
    let mut t = Tensors::default();
    t.conv("pos_embed.proj", d, cin, patch, 1.0);
    let emb = "adaln_single.emb.timestep_embedder";
    t.linear(&format!("{emb}.linear_1"), d, 256, 1.0, true);
    t.linear(&format!("{emb}.linear_2"), d, d, 1.0, true);
    // The modulation vector (shift, scale, gate ×2): gain 0.5 keeps `1 + scale` near 1.
    t.linear("adaln_single.linear", 6 * d, d, 0.5, true);
    t.linear(
        "caption_projection.linear_1",
        d,
        p.caption_channels,
        1.0,
        true,
    );
    t.linear("caption_projection.linear_2", d, d, 1.0, true);
    for n in 0..p.layers {
        let b = format!("transformer_blocks.{n}");
        t.push(
            format!("{b}.scale_shift_table"),
            &[6, d],
            Init::Normal { std: SMALL },
        );
        for attn in ["attn1", "attn2"] {
            for proj in ["to_q", "to_k", "to_v"] {
                t.linear(&format!("{b}.{attn}.{proj}"), d, d, 1.0, true);
            }
            t.linear(&format!("{b}.{attn}.to_out.0"), d, d, 0.5, true);
        }
        t.linear(&format!("{b}.ff.net.0.proj"), 4 * d, d, 1.0, true);
        t.linear(&format!("{b}.ff.net.2"), d, 4 * d, 0.5, true);
    }
    t.push(
        "scale_shift_table".into(),
        &[2, d],
        Init::Normal { std: SMALL },
    );
    t.linear("proj_out", patch * patch * cout, d, 1.0, true);

    let config = json!({
        "_class_name": "PixArtTransformer2DModel",
        "_diffusers_version": DIFFUSERS_VERSION,
        "activation_fn": "gelu-approximate",
        "attention_bias": true,
        "attention_head_dim": p.head_dim,
        "attention_type": "default",
        "caption_channels": p.caption_channels,
        "cross_attention_dim": d,
        "double_self_attention": false,
        "dropout": 0.0,
        "in_channels": cin,
        "interpolation_scale": p.interpolation_scale,
        "norm_elementwise_affine": false,
        "norm_eps": 1e-6,
        "norm_num_groups": 32,
        "norm_type": "ada_norm_single",
        "num_attention_heads": p.heads,
        "num_embeds_ada_norm": 1000,
        "num_layers": p.layers,
        "num_vector_embeds": null,
        "only_cross_attention": false,
        "out_channels": cout,
        "patch_size": patch,
        "sample_size": p.sample_size,
        "upcast_attention": false,
        "use_additional_conditions": false,
        "use_linear_projection": false,
    });
    ComponentSpec {
        folder: "transformer",
        config,
        file_stem: "diffusion_pytorch_model",
        max_shard_bytes: None,
        tensors: t.0,
    }
}

/// transformers `T5EncoderModel` (T5 v1.1: gated-GELU, no biases, RMSNorm scales). Only
/// `shared.weight` is stored for the embedding, as transformers 5 saves an encoder whose
/// `encoder.embed_tokens` is tied to `shared` (`tie_word_embeddings: true`).
fn t5_component(c: &T5Dims) -> ComponentSpec {
    let d = c.d_model;
    let inner = c.heads * c.d_kv;
    let mut t = Tensors::default();
    t.push(
        "shared.weight".into(),
        &[c.vocab, d],
        Init::Normal { std: 0.5 },
    );
    for n in 0..c.layers {
        let b = format!("encoder.block.{n}");
        let sa = format!("{b}.layer.0.SelfAttention");
        // T5 attention has no 1/√d_kv scaling: transformers folds it into the q init
        // (std (d_model·d_kv)^-½), which is followed here.
        let q_std = 1.0 / ((d * c.d_kv) as f32).sqrt();
        t.push(
            format!("{sa}.q.weight"),
            &[inner, d],
            Init::Normal { std: q_std },
        );
        t.linear(&format!("{sa}.k"), inner, d, 1.0, false);
        t.linear(&format!("{sa}.v"), inner, d, 1.0, false);
        t.linear(&format!("{sa}.o"), d, inner, 0.5, false);
        if n == 0 {
            t.push(
                format!("{sa}.relative_attention_bias.weight"),
                &[32, c.heads],
                Init::Normal { std: 0.1 },
            );
        }
        t.push(
            format!("{b}.layer.0.layer_norm.weight"),
            &[d],
            Init::Constant(1.0),
        );
        let ff = format!("{b}.layer.1.DenseReluDense");
        t.linear(&format!("{ff}.wi_0"), c.d_ff, d, 1.0, false);
        t.linear(&format!("{ff}.wi_1"), c.d_ff, d, 1.0, false);
        t.linear(&format!("{ff}.wo"), d, c.d_ff, 0.5, false);
        t.push(
            format!("{b}.layer.1.layer_norm.weight"),
            &[d],
            Init::Constant(1.0),
        );
    }
    t.push(
        "encoder.final_layer_norm.weight".into(),
        &[d],
        Init::Constant(1.0),
    );

    let config = json!({
        "architectures": ["T5EncoderModel"],
        "classifier_dropout": 0.0,
        "d_ff": c.d_ff,
        "d_kv": c.d_kv,
        "d_model": d,
        "decoder_start_token_id": 0,
        "dense_act_fn": "gelu_new",
        "dropout_rate": 0.1,
        "eos_token_id": 1,
        "feed_forward_proj": "gated-gelu",
        "initializer_factor": 1.0,
        "is_decoder": false,
        "is_encoder_decoder": false,
        "is_gated_act": true,
        "layer_norm_epsilon": 1e-6,
        "model_type": "t5",
        "num_decoder_layers": c.layers,
        "num_heads": c.heads,
        "num_layers": c.layers,
        "pad_token_id": 0,
        "relative_attention_max_distance": 128,
        "relative_attention_num_buckets": 32,
        "scale_decoder_outputs": false,
        "tie_word_embeddings": true,
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": false,
        "vocab_size": c.vocab,
    });
    ComponentSpec {
        folder: "text_encoder",
        config,
        file_stem: "model",
        max_shard_bytes: Some(c.max_shard_bytes),
        tensors: t.0,
    }
}

/// `ResnetBlock2D` without time embedding (diffusers `resnet.py`).
fn vae_resnet(t: &mut Tensors, p: &str, cin: usize, cout: usize) {
    t.norm(&format!("{p}.norm1"), cin);
    t.conv(&format!("{p}.conv1"), cout, cin, 3, 1.0);
    t.norm(&format!("{p}.norm2"), cout);
    t.conv(&format!("{p}.conv2"), cout, cout, 3, 0.5);
    if cin != cout {
        t.conv(&format!("{p}.conv_shortcut"), cout, cin, 1, 1.0);
    }
}

/// `UNetMidBlock2D`: resnet, attention (group norm, q/k/v/out Linear with bias), resnet.
fn vae_mid(t: &mut Tensors, p: &str, c: usize) {
    vae_resnet(t, &format!("{p}.resnets.0"), c, c);
    let a = format!("{p}.attentions.0");
    t.norm(&format!("{a}.group_norm"), c);
    for proj in ["to_q", "to_k", "to_v"] {
        t.linear(&format!("{a}.{proj}"), c, c, 1.0, true);
    }
    t.linear(&format!("{a}.to_out.0"), c, c, 0.5, true);
    vae_resnet(t, &format!("{p}.resnets.1"), c, c);
}

/// diffusers `AutoencoderKL` (encoder, decoder, quant convs) with `DownEncoderBlock2D` /
/// `UpDecoderBlock2D` blocks, as `edge_models::build_vae_{encoder,decoder}` declare them.
fn vae_component(v: &VaeDims) -> ComponentSpec {
    let ch = &v.channels;
    let n = ch.len();
    let (img, latent) = (3usize, 4usize);
    let mut t = Tensors::default();

    t.conv("encoder.conv_in", ch[0], img, 3, 1.0);
    let mut cin = ch[0];
    for (i, &cout) in ch.iter().enumerate() {
        let p = format!("encoder.down_blocks.{i}");
        for r in 0..v.layers_per_block {
            vae_resnet(&mut t, &format!("{p}.resnets.{r}"), cin, cout);
            cin = cout;
        }
        if i + 1 < n {
            t.conv(&format!("{p}.downsamplers.0.conv"), cout, cout, 3, 1.0);
        }
    }
    let top = ch[n - 1];
    vae_mid(&mut t, "encoder.mid_block", top);
    t.norm("encoder.conv_norm_out", top);
    t.conv("encoder.conv_out", 2 * latent, top, 3, 1.0);
    t.conv("quant_conv", 2 * latent, 2 * latent, 1, 1.0);

    t.conv("post_quant_conv", latent, latent, 1, 1.0);
    t.conv("decoder.conv_in", top, latent, 3, 1.0);
    vae_mid(&mut t, "decoder.mid_block", top);
    let mut cin = top;
    for (i, &cout) in ch.iter().rev().enumerate() {
        let p = format!("decoder.up_blocks.{i}");
        for r in 0..=v.layers_per_block {
            vae_resnet(&mut t, &format!("{p}.resnets.{r}"), cin, cout);
            cin = cout;
        }
        if i + 1 < n {
            t.conv(&format!("{p}.upsamplers.0.conv"), cout, cout, 3, 1.0);
        }
    }
    t.norm("decoder.conv_norm_out", ch[0]);
    t.conv("decoder.conv_out", img, ch[0], 3, 1.0);

    let config = json!({
        "_class_name": "AutoencoderKL",
        "_diffusers_version": DIFFUSERS_VERSION,
        "act_fn": "silu",
        "block_out_channels": ch,
        "down_block_types": vec!["DownEncoderBlock2D"; n],
        "force_upcast": true,
        "in_channels": img,
        "latent_channels": latent,
        "latents_mean": null,
        "latents_std": null,
        "layers_per_block": v.layers_per_block,
        "mid_block_add_attention": true,
        "norm_num_groups": v.groups,
        "out_channels": img,
        "sample_size": v.sample_size,
        "scaling_factor": 0.13025,
        "shift_factor": null,
        "up_block_types": vec!["UpDecoderBlock2D"; n],
        "use_post_quant_conv": true,
        "use_quant_conv": true,
    });
    ComponentSpec {
        folder: "vae",
        config,
        file_stem: "diffusion_pytorch_model",
        max_shard_bytes: None,
        tensors: t.0,
    }
}

/// Storage type of the written weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightDType {
    /// IEEE half precision (the default).
    #[default]
    F16,
    /// IEEE single precision.
    F32,
    /// bfloat16.
    BF16,
}

impl WeightDType {
    /// Parses `f16`, `f32` or `bf16` (also `float16`, `float32`, `bfloat16`).
    ///
    /// Errors: [`SynthError::UnknownDType`].
    pub fn from_name(name: &str) -> Result<Self, SynthError> {
        match name.to_ascii_lowercase().as_str() {
            "f16" | "float16" | "fp16" => Ok(WeightDType::F16),
            "f32" | "float32" | "fp32" => Ok(WeightDType::F32),
            "bf16" | "bfloat16" => Ok(WeightDType::BF16),
            _ => Err(SynthError::UnknownDType {
                name: name.to_string(),
            }),
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            WeightDType::F32 => 4,
            WeightDType::F16 | WeightDType::BF16 => 2,
        }
    }

    fn safetensors(self) -> safetensors::Dtype {
        match self {
            WeightDType::F16 => safetensors::Dtype::F16,
            WeightDType::F32 => safetensors::Dtype::F32,
            WeightDType::BF16 => safetensors::Dtype::BF16,
        }
    }

    /// The PyTorch name transformers writes in `config.json → dtype`.
    fn torch_name(self) -> &'static str {
        match self {
            WeightDType::F16 => "float16",
            WeightDType::F32 => "float32",
            WeightDType::BF16 => "bfloat16",
        }
    }

    fn encode(self, values: &[f32], out: &mut [u8]) {
        match self {
            WeightDType::F32 => {
                for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            WeightDType::F16 => {
                for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                    o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
                }
            }
            WeightDType::BF16 => {
                for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                    o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
                }
            }
        }
    }
}

/// Options of [`synthesize`].
#[derive(Clone, Debug)]
pub struct SynthOptions {
    /// Seed of every weight (same seed → byte-identical files).
    pub seed: u64,
    /// Storage type of the weights.
    pub dtype: WeightDType,
    /// A diffusers pipeline folder whose `tokenizer/` and `scheduler/scheduler_config.json`
    /// are copied; `None`: the demo model's ([`EMBEDDED_TOKENIZER`], built into the program,
    /// so that `synth` works from any folder).
    pub tokenizer_from: Option<PathBuf>,
    /// Replace a non-empty output folder.
    pub force: bool,
}

/// What [`synthesize`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthReport {
    /// Parameters per component (`transformer`, `text_encoder`, `vae`).
    pub parameters: Vec<(&'static str, u64)>,
    /// Total bytes of all files written.
    pub bytes: u64,
    /// Number of safetensors files written.
    pub weight_files: usize,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Steele, Lea & Flood 2014) applied to state `z`.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The per-tensor key: the first 8 bytes of `blake3(seed as u64 LE ‖ name)`.
pub fn tensor_key(seed: u64, name: &str) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(name.as_bytes());
    let bytes = h.finalize();
    let mut k = [0u8; 8];
    k.copy_from_slice(&bytes.as_bytes()[..8]);
    u64::from_le_bytes(k)
}

/// Standard normal deviates for elements `start .. start + out.len()` of the stream `key`:
/// element `2j` is `r·cos θ` and `2j+1` is `r·sin θ` with `r = √(−2 ln u₁)`, `θ = 2π u₂`,
/// `u₁ ∈ (0, 1]`, `u₂ ∈ [0, 1)` from the top 24 bits of SplitMix64 outputs `2j+1`, `2j+2`.
pub fn normals(key: u64, start: u64, out: &mut [f32]) {
    const INV24: f32 = 1.0 / (1u32 << 24) as f32;
    let end = start + out.len() as u64;
    let mut j = start / 2;
    while 2 * j < end {
        let a = mix64(key.wrapping_add((2 * j + 1).wrapping_mul(GOLDEN)));
        let b = mix64(key.wrapping_add((2 * j + 2).wrapping_mul(GOLDEN)));
        let u1 = ((a >> 40) + 1) as f32 * INV24;
        let u2 = (b >> 40) as f32 * INV24;
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f32::consts::TAU * u2).sin_cos();
        for (e, z) in [(2 * j, r * cos), (2 * j + 1, r * sin)] {
            if (start..end).contains(&e) {
                out[(e - start) as usize] = z;
            }
        }
        j += 1;
    }
}

/// Elements per work item when generating a tensor (a multiple of 2: Box–Muller pairs).
const CHUNK: usize = 1 << 20;

/// The stored bytes of tensor `spec` for `seed` in `dtype` (little-endian, row-major).
/// Large tensors are generated on all available cores; the result does not depend on how
/// many.
pub fn tensor_bytes(seed: u64, spec: &TensorSpec, dtype: WeightDType) -> Vec<u8> {
    let n = spec.numel() as usize;
    let size = dtype.size();
    let mut bytes = vec![0u8; n * size];
    let key = tensor_key(seed, &spec.name);
    let fill = |first: usize, out: &mut [u8]| {
        let mut vals = vec![0f32; out.len() / size];
        match spec.init {
            Init::Constant(c) => vals.fill(c),
            Init::Normal { std } => {
                normals(key, first as u64, &mut vals);
                for v in &mut vals {
                    *v *= std;
                }
            }
        }
        dtype.encode(&vals, out);
    };
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    if n <= CHUNK || threads == 1 {
        fill(0, &mut bytes);
        return bytes;
    }
    let chunks: Vec<(usize, &mut [u8])> = bytes
        .chunks_mut(CHUNK * size)
        .enumerate()
        .map(|(i, c)| (i * CHUNK, c))
        .collect();
    let queue = std::sync::Mutex::new(chunks);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let item = queue.lock().ok().and_then(|mut q| q.pop());
                match item {
                    Some((first, out)) => fill(first, out),
                    None => break,
                }
            });
        }
    });
    bytes
}

/// A tensor whose bytes are generated when the safetensors writer asks for them, so a file
/// holds one tensor in memory at a time.
struct LazyTensor<'a> {
    spec: &'a TensorSpec,
    seed: u64,
    dtype: WeightDType,
}

impl safetensors::View for LazyTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype.safetensors()
    }
    fn shape(&self) -> &[usize] {
        &self.spec.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(tensor_bytes(self.seed, self.spec, self.dtype))
    }
    fn data_len(&self) -> usize {
        self.spec.numel() as usize * self.dtype.size()
    }
}

/// The weight files of a component: `(file name, tensors)`, in order.
pub fn shard_plan(c: &ComponentSpec, dtype: WeightDType) -> Vec<(String, Vec<&TensorSpec>)> {
    let Some(limit) = c.max_shard_bytes else {
        return vec![(
            format!("{}.safetensors", c.file_stem),
            c.tensors.iter().collect(),
        )];
    };
    let mut groups: Vec<Vec<&TensorSpec>> = vec![];
    let mut current: Vec<&TensorSpec> = vec![];
    let mut used = 0u64;
    for t in &c.tensors {
        let len = t.numel() * dtype.size() as u64;
        if !current.is_empty() && used + len > limit {
            groups.push(std::mem::take(&mut current));
            used = 0;
        }
        current.push(t);
        used += len;
    }
    if !current.is_empty() {
        groups.push(current);
    }
    let total = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            (
                format!("{}-{:05}-of-{:05}.safetensors", c.file_stem, i + 1, total),
                g,
            )
        })
        .collect()
}

fn write_json(path: &Path, v: &Value) -> Result<u64, SynthError> {
    let mut text = serde_json::to_string_pretty(v).map_err(|e| SynthError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    text.push('\n');
    std::fs::write(path, &text).map_err(io_err(path))?;
    Ok(text.len() as u64)
}

/// Writes one component folder; returns (bytes written, weight files).
fn write_component(
    root: &Path,
    c: &ComponentSpec,
    opts: &SynthOptions,
) -> Result<(u64, usize), SynthError> {
    let dir = root.join(c.folder);
    std::fs::create_dir(&dir).map_err(io_err(&dir))?;
    let mut config = c.config.clone();
    if let Value::Object(m) = &mut config {
        if m.contains_key("transformers_version") {
            m.insert("dtype".into(), Value::from(opts.dtype.torch_name()));
        }
    }
    let mut bytes = write_json(&dir.join("config.json"), &config)?;
    let plan = shard_plan(c, opts.dtype);
    let mut weight_map = Map::new();
    let mut total_size = 0u64;
    for (file, tensors) in &plan {
        let path = dir.join(file);
        let views = tensors.iter().map(|t| {
            (
                t.name.clone(),
                LazyTensor {
                    spec: t,
                    seed: opts.seed,
                    dtype: opts.dtype,
                },
            )
        });
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(meta), &path).map_err(|e| {
            SynthError::Safetensors {
                path: path.display().to_string(),
                reason: e.to_string(),
            }
        })?;
        // The writer's temporary file is private (0600); give the shard the permissions an
        // ordinary file gets here (those of `config.json`, written with the process umask).
        let perms = std::fs::metadata(dir.join("config.json"))
            .map_err(io_err(&dir))?
            .permissions();
        std::fs::set_permissions(&path, perms).map_err(io_err(&path))?;
        bytes += std::fs::metadata(&path).map_err(io_err(&path))?.len();
        for t in tensors {
            weight_map.insert(t.name.clone(), Value::from(file.as_str()));
            total_size += t.numel() * opts.dtype.size() as u64;
        }
    }
    if c.max_shard_bytes.is_some() {
        let index = json!({
            "metadata": {
                "total_parameters": c.parameter_count(),
                "total_size": total_size,
            },
            "weight_map": weight_map,
        });
        let path = dir.join(format!("{}.safetensors.index.json", c.file_stem));
        bytes += write_json(&path, &index)?;
    }
    Ok((bytes, plan.len()))
}

/// Copies the regular files of `src` into the new folder `dst`; returns the bytes copied.
/// The tokenizer files of `demo/pixart-shapes-64` (a T5 SentencePiece tokenizer with its
/// `tokenizer.json`), written when no `tokenizer_from` folder is given.
pub const EMBEDDED_TOKENIZER: [(&str, &[u8]); 4] = [
    (
        "special_tokens_map.json",
        include_bytes!("../../demo/pixart-shapes-64/tokenizer/special_tokens_map.json"),
    ),
    (
        "spiece.model",
        include_bytes!("../../demo/pixart-shapes-64/tokenizer/spiece.model"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../../demo/pixart-shapes-64/tokenizer/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../../demo/pixart-shapes-64/tokenizer/tokenizer_config.json"),
    ),
];

/// The scheduler config of `demo/pixart-shapes-64` (PixArt-Σ's published DPM-Solver++ config).
pub const EMBEDDED_SCHEDULER: &[u8] =
    include_bytes!("../../demo/pixart-shapes-64/scheduler/scheduler_config.json");

fn write_bytes(path: &Path, bytes: &[u8]) -> Result<u64, SynthError> {
    std::fs::write(path, bytes).map_err(io_err(path))?;
    Ok(bytes.len() as u64)
}

fn copy_files(src: &Path, dst: &Path) -> Result<u64, SynthError> {
    std::fs::create_dir(dst).map_err(io_err(dst))?;
    let mut bytes = 0;
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .map_err(io_err(src))?
        .collect::<Result<_, _>>()
        .map_err(io_err(src))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let from = e.path();
        if from.is_file() {
            bytes += std::fs::copy(&from, dst.join(e.file_name())).map_err(io_err(&from))?;
        }
    }
    Ok(bytes)
}

/// The file every folder `synthesize` writes holds; `--force` replaces only folders with it.
pub const SYNTH_MARKER: &str = ".edgeplan-synth";

/// Writes `preset` as a diffusers pipeline folder at `out`.
///
/// Everything is written into a temporary sibling folder `.<name>.synth-tmp` which is renamed
/// to `out` at the end, so `out` never holds a partial pipeline. An existing empty folder is
/// replaced; a non-empty one only with `opts.force`. The tokenizer folder and the scheduler
/// config are copied from `opts.tokenizer_from` (or written from the built-in demo copies); the T5 vocabulary of the preset may be
/// larger than that tokenizer's.
///
/// Errors: [`SynthError::MissingSource`] when `tokenizer_from/tokenizer/` or
/// `tokenizer_from/scheduler/scheduler_config.json` is missing (checked before writing);
/// [`SynthError::NotEmpty`] / [`SynthError::NotAFolder`] for an occupied `out`;
/// [`SynthError::Io`] / [`SynthError::Safetensors`] naming the file that failed.
pub fn synthesize(
    preset: &Preset,
    out: &Path,
    opts: &SynthOptions,
) -> Result<SynthReport, SynthError> {
    let sources = match &opts.tokenizer_from {
        Some(from) => {
            let tok_src = from.join("tokenizer");
            let sched_src = from.join("scheduler").join("scheduler_config.json");
            if !tok_src.is_dir() {
                return Err(SynthError::MissingSource {
                    path: tok_src.display().to_string(),
                });
            }
            if !sched_src.is_file() {
                return Err(SynthError::MissingSource {
                    path: sched_src.display().to_string(),
                });
            }
            Some((tok_src, sched_src))
        }
        None => None,
    };
    if out.exists() {
        if !out.is_dir() {
            return Err(SynthError::NotAFolder {
                path: out.display().to_string(),
            });
        }
        let occupied = std::fs::read_dir(out)
            .map_err(io_err(out))?
            .next()
            .is_some();
        if occupied && !opts.force {
            return Err(SynthError::NotEmpty {
                path: out.display().to_string(),
            });
        }
        let refuse = |reason: &str| SynthError::NotReplaceable {
            path: out.display().to_string(),
            reason: reason.to_string(),
        };
        let real = std::fs::canonicalize(out).map_err(io_err(out))?;
        if std::env::current_dir()
            .and_then(std::fs::canonicalize)
            .is_ok_and(|cwd| cwd.starts_with(&real))
        {
            return Err(refuse("it is or contains the current folder"));
        }
        if occupied && !real.join(SYNTH_MARKER).is_file() {
            return Err(refuse(&format!(
                "it is not empty and was not written by edgeplan synth (no {SYNTH_MARKER}; a real pipeline folder or other files are never replaced)"
            )));
        }
    }
    let name = out
        .file_name()
        .map_or_else(|| "pipeline".into(), |n| n.to_string_lossy().into_owned());
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io_err(&parent))?;
    let tmp = parent.join(format!(".{name}.synth-tmp"));
    if tmp.exists() {
        // A leftover of an interrupted synth (it holds the marker, or nothing yet) is removed;
        // anything else under that name is not ours.
        let ours = tmp.join(SYNTH_MARKER).is_file()
            || std::fs::read_dir(&tmp).is_ok_and(|mut d| d.next().is_none());
        if !ours {
            return Err(SynthError::NotReplaceable {
                path: tmp.display().to_string(),
                reason: format!("the temporary folder synth writes into exists and was not written by it (no {SYNTH_MARKER})"),
            });
        }
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io_err(&tmp))?;
    let result = write_all(preset, &tmp, sources.as_ref(), opts);
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            // Best effort: the error being reported matters more than a leftover temp folder.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(io_err(out))?;
    }
    std::fs::rename(&tmp, out).map_err(io_err(out))?;
    Ok(report)
}

fn write_all(
    preset: &Preset,
    root: &Path,
    sources: Option<&(PathBuf, PathBuf)>,
    opts: &SynthOptions,
) -> Result<SynthReport, SynthError> {
    // The marker first: an interrupted run's temporary folder is recognisable as ours.
    let mut bytes = write_bytes(
        &root.join(SYNTH_MARKER),
        format!(
            "written by edgeplan synth (preset {}, seed {}); `edgeplan synth --force` may replace this folder\n",
            preset.name, opts.seed
        )
        .as_bytes(),
    )?;
    bytes += write_json(&root.join("model_index.json"), &preset.model_index)?;
    let mut files = 0;
    let mut parameters = vec![];
    for c in preset.components() {
        let (b, f) = write_component(root, c, opts)?;
        bytes += b;
        files += f;
        parameters.push((c.folder, c.parameter_count()));
    }
    let tok_dst = root.join("tokenizer");
    let sched = root.join("scheduler");
    std::fs::create_dir(&sched).map_err(io_err(&sched))?;
    match sources {
        Some((tok_src, sched_src)) => {
            bytes += copy_files(tok_src, &tok_dst)?;
            bytes += std::fs::copy(sched_src, sched.join("scheduler_config.json"))
                .map_err(io_err(sched_src))?;
        }
        None => {
            std::fs::create_dir(&tok_dst).map_err(io_err(&tok_dst))?;
            for (name, data) in EMBEDDED_TOKENIZER {
                bytes += write_bytes(&tok_dst.join(name), data)?;
            }
            bytes += write_bytes(&sched.join("scheduler_config.json"), EMBEDDED_SCHEDULER)?;
        }
    }
    Ok(SynthReport {
        parameters,
        bytes,
        weight_files: files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use edge_graph::{Graph, Source};
    use edge_models::{PixArtConfig, T5Config, VaeConfig};
    use std::collections::BTreeMap;

    fn repo(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
    }

    /// Every checkpoint tensor a graph declares, with the shape of each part (fused weights
    /// are row concatenations of equal parts).
    fn declared(graphs: &[Graph]) -> BTreeMap<String, Vec<usize>> {
        let mut out = BTreeMap::new();
        for g in graphs {
            for v in &g.values {
                if let Source::Weight(w) = &v.source {
                    let mut shape: Vec<usize> = v.shape.iter().map(|&d| d as usize).collect();
                    shape[0] /= w.parts.len();
                    for p in &w.parts {
                        out.insert(p.clone(), shape.clone());
                    }
                }
            }
        }
        out
    }

    fn listed(c: &ComponentSpec) -> BTreeMap<String, Vec<usize>> {
        let map: BTreeMap<_, _> = c
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        assert_eq!(map.len(), c.tensors.len(), "duplicate tensor names");
        map
    }

    /// The configs parse with the planner's parsers and every tensor the graph builders
    /// declare is listed with the same shape, and nothing else.
    #[test]
    fn presets_match_the_graph_builders() {
        for name in PRESETS {
            let p = preset(name).unwrap();
            let pc = PixArtConfig::from_json(&p.transformer.config).unwrap();
            assert!(!pc.use_additional_conditions);
            let g = edge_models::build_pixart_denoiser(&pc, 8, 8, 4, None).unwrap();
            assert_eq!(declared(&[g]), listed(&p.transformer), "{name} transformer");

            let tc = T5Config::from_json(&p.text_encoder.config).unwrap();
            let g = edge_models::build_t5_encoder(&tc, 4).unwrap();
            assert_eq!(
                declared(&[g]),
                listed(&p.text_encoder),
                "{name} text_encoder"
            );

            let vc = VaeConfig::from_json(&p.vae.config).unwrap();
            let dec = edge_models::build_vae_decoder(&vc, 2, 2).unwrap();
            let enc = edge_models::build_vae_encoder(&vc, 16, 16).unwrap();
            assert_eq!(declared(&[dec, enc]), listed(&p.vae), "{name} vae");
        }
    }

    /// A demo-sized preset built with the demo's dimensions lists exactly the tensors (names
    /// and shapes) of the demo's trained safetensors files.
    #[test]
    fn demo_dimensions_reproduce_the_demo_tensor_list() {
        let p = build_preset(
            "demo",
            &PixArtDims {
                layers: 6,
                heads: 6,
                head_dim: 32,
                caption_channels: 64,
                sample_size: 8,
                interpolation_scale: 1,
            },
            &T5Dims {
                layers: 2,
                d_model: 64,
                d_kv: 16,
                heads: 4,
                d_ff: 128,
                vocab: 384,
                max_shard_bytes: SHARD_2GB,
            },
            &VaeDims {
                channels: vec![32, 64, 64, 64],
                layers_per_block: 1,
                groups: 16,
                sample_size: 64,
            },
        );
        let demo = repo("demo/pixart-shapes-64");
        for (c, file) in [
            (
                &p.transformer,
                "transformer/diffusion_pytorch_model.safetensors",
            ),
            (&p.text_encoder, "text_encoder/model.safetensors"),
            (&p.vae, "vae/diffusion_pytorch_model.safetensors"),
        ] {
            let bytes = std::fs::read(demo.join(file)).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let want: BTreeMap<String, Vec<usize>> = st
                .tensors()
                .into_iter()
                .map(|(n, v)| (n, v.shape().to_vec()))
                .collect();
            assert_eq!(listed(c), want, "{file}");
        }
    }

    #[test]
    fn xl_configs_hold_the_released_settings() {
        let p = preset("pixart-sigma-xl2-1024").unwrap();
        let pc = PixArtConfig::from_json(&p.transformer.config).unwrap();
        assert_eq!(
            (pc.num_layers, pc.num_attention_heads, pc.attention_head_dim),
            (28, 16, 72)
        );
        assert_eq!(pc.caption_channels, Some(4096));
        assert_eq!((pc.sample_size, pc.interpolation_scale), (128, 2.0));
        assert_eq!((pc.in_channels, pc.out_channels, pc.patch_size), (4, 8, 2));
        assert_eq!(pc.cross_attention_dim, 1152);
        let tc = T5Config::from_json(&p.text_encoder.config).unwrap();
        assert_eq!(
            (
                tc.num_layers,
                tc.d_model,
                tc.d_kv,
                tc.num_heads,
                tc.d_ff,
                tc.vocab_size
            ),
            (24, 4096, 64, 64, 10240, 32128)
        );
        let te = &p.text_encoder.config;
        assert_eq!(te["architectures"], json!(["T5EncoderModel"]));
        assert_eq!(te["dense_act_fn"], json!("gelu_new"));
        assert_eq!(te["is_gated_act"], json!(true));
        let vc = VaeConfig::from_json(&p.vae.config).unwrap();
        assert_eq!(vc.block_out_channels, vec![128, 256, 512, 512]);
        assert_eq!((vc.layers_per_block, vc.norm_num_groups), (2, 32));
        assert_eq!(vc.scaling_factor, 0.13025);
        assert_eq!(p.model_index["_class_name"], json!("PixArtSigmaPipeline"));
        assert!(matches!(
            preset("pixart-sigma-xxl"),
            Err(SynthError::UnknownPreset { .. })
        ));
    }

    #[test]
    fn xl_text_encoder_shards_stay_under_2gb() {
        let p = preset("pixart-sigma-xl2-1024").unwrap();
        let plan = shard_plan(&p.text_encoder, WeightDType::F16);
        // 4,762,310,656 parameters · 2 bytes = 9.52 GB → 5 shards of ≤ 2 GB.
        assert_eq!(plan.len(), 5);
        assert_eq!(plan[0].0, "model-00001-of-00005.safetensors");
        let mut n = 0;
        for (_, ts) in &plan {
            let bytes: u64 = ts.iter().map(|t| t.numel() * 2).sum();
            assert!(bytes <= SHARD_2GB, "{bytes}");
            n += ts.len();
        }
        assert_eq!(n, p.text_encoder.tensors.len());
    }

    #[test]
    fn normals_are_standard_and_order_independent() {
        let key = tensor_key(7, "x");
        let mut all = vec![0f32; 100_001];
        normals(key, 0, &mut all);
        // Odd and even starting elements (the two halves of a Box–Muller pair).
        for start in [99_949usize, 99_950] {
            let mut tail = vec![0f32; all.len() - start];
            normals(key, start as u64, &mut tail);
            assert_eq!(&all[start..], &tail[..]);
        }
        let n = all.len() as f64;
        let mean = all.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = all
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        // Standard errors: mean 1/√n ≈ 0.003, variance √(2/n) ≈ 0.0045.
        assert!(mean.abs() < 0.015, "{mean}");
        assert!((var - 1.0).abs() < 0.025, "{var}");
        assert!(all.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn chunked_generation_matches_sequential() {
        let spec = TensorSpec {
            name: "big".into(),
            shape: vec![3, CHUNK + 7],
            init: Init::Normal { std: 0.5 },
        };
        let bytes = tensor_bytes(3, &spec, WeightDType::F32);
        let mut want = vec![0f32; spec.numel() as usize];
        normals(tensor_key(3, "big"), 0, &mut want);
        let got: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert!(got.iter().zip(&want).all(|(g, w)| *g == w * 0.5));
    }

    fn synth_small(dir: &Path, seed: u64, dtype: WeightDType) -> SynthReport {
        let opts = SynthOptions {
            seed,
            dtype,
            tokenizer_from: Some(repo("demo/pixart-shapes-64")),
            force: false,
        };
        synthesize(&preset("pixart-sigma-small").unwrap(), dir, &opts).unwrap()
    }

    fn read(dir: &Path, rel: &str) -> Vec<u8> {
        std::fs::read(dir.join(rel)).unwrap()
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            tmp.path().join("a"),
            tmp.path().join("b"),
            tmp.path().join("c"),
        );
        let ra = synth_small(&a, 1, WeightDType::F16);
        synth_small(&b, 1, WeightDType::F16);
        synth_small(&c, 2, WeightDType::F16);
        assert!(ra.weight_files > 3, "the small T5 should be sharded");
        let te = &preset("pixart-sigma-small").unwrap().text_encoder;
        let mut files = vec![
            "transformer/diffusion_pytorch_model.safetensors".to_string(),
            "vae/diffusion_pytorch_model.safetensors".to_string(),
            "text_encoder/model.safetensors.index.json".to_string(),
        ];
        for (f, _) in shard_plan(te, WeightDType::F16) {
            files.push(format!("text_encoder/{f}"));
        }
        for f in &files {
            assert_eq!(read(&a, f), read(&b, f), "{f}");
            if f.ends_with(".safetensors") {
                assert_ne!(read(&a, f), read(&c, f), "{f}");
            }
        }
        // The folder opens with the loader; configs hold what the preset says.
        let pf = edge_planner::load::folder::PipelineFolder::open(&a).unwrap();
        assert_eq!(pf.pipeline_class, "PixArtSigmaPipeline");
        assert_eq!(pf.text_encoder.config["dtype"], json!("float16"));
        assert_eq!(pf.text_encoder.tensors.names().len(), te.tensors.len());
        let t = pf.transformer.tensors.tensor("scale_shift_table").unwrap();
        let t = t.unwrap();
        assert_eq!(t.dtype, edge_schema::DType::F16);
        assert_eq!(t.shape, vec![2, 288]);
    }

    #[test]
    fn without_a_source_folder_the_built_in_demo_tokenizer_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("p");
        let opts = SynthOptions {
            seed: 0,
            dtype: WeightDType::F16,
            tokenizer_from: None,
            force: false,
        };
        synthesize(&preset("pixart-sigma-small").unwrap(), &out, &opts).unwrap();
        let demo = repo("demo/pixart-shapes-64");
        for (name, _) in EMBEDDED_TOKENIZER {
            let rel = format!("tokenizer/{name}");
            assert_eq!(read(&out, &rel), read(&demo, &rel), "{rel}");
        }
        let rel = "scheduler/scheduler_config.json";
        assert_eq!(read(&out, rel), read(&demo, rel));
        edge_planner::load::folder::PipelineFolder::open(&out).unwrap();
    }

    #[test]
    fn refuses_to_overwrite_without_force_and_checks_the_source() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("p");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("keep"), b"x").unwrap();
        let p = preset("pixart-sigma-small").unwrap();
        let mut opts = SynthOptions {
            seed: 0,
            dtype: WeightDType::BF16,
            tokenizer_from: Some(repo("demo/pixart-shapes-64")),
            force: false,
        };
        let e = synthesize(&p, &out, &opts).unwrap_err();
        assert!(matches!(e, SynthError::NotEmpty { .. }), "{e}");
        assert!(out.join("keep").is_file());
        opts.force = true;
        // --force replaces only a pipeline folder: a folder of other files is kept.
        let e = synthesize(&p, &out, &opts).unwrap_err();
        assert!(matches!(e, SynthError::NotReplaceable { .. }), "{e}");
        assert!(e.to_string().contains(SYNTH_MARKER), "{e}");
        assert!(out.join("keep").is_file());
        // A real pipeline folder (model_index.json, no marker) is not replaced either.
        std::fs::write(out.join("model_index.json"), b"{}").unwrap();
        let e = synthesize(&p, &out, &opts).unwrap_err();
        assert!(matches!(e, SynthError::NotReplaceable { .. }), "{e}");
        assert!(out.join("keep").is_file());
        std::fs::write(out.join(SYNTH_MARKER), b"").unwrap();
        synthesize(&p, &out, &opts).unwrap();
        assert!(out.join(SYNTH_MARKER).is_file());
        assert!(!out.join("keep").exists());
        assert!(out.join("vae/config.json").is_file());
        assert!(!tmp.path().join(".p.synth-tmp").exists());

        opts.tokenizer_from = Some(tmp.path().join("nowhere"));
        let e = synthesize(&p, &tmp.path().join("q"), &opts).unwrap_err();
        assert!(matches!(e, SynthError::MissingSource { .. }), "{e}");
        assert!(e.to_string().contains("nowhere"), "{e}");
        assert!(!tmp.path().join("q").exists());
    }
}
