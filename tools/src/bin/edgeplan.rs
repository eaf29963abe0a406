//! `edgeplan`: the workstation side. Compiles a published PixArt model into a `.plan` file and
//! inspects plans.

use std::path::PathBuf;

#[path = "../common.rs"]
#[macro_use]
mod common;
use common::{one_line, parse_size, read_file};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use edge_planner::pack::PackPolicy;
use edge_planner::CompileOptions;
use edge_schema::plan::{Isa, Target};
use edge_schema::DType;

#[derive(Parser)]
#[command(
    name = "edgeplan",
    version,
    about = "Compile diffusion models into ahead-of-time plans"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile a diffusers PixArt pipeline folder, or single model files (--diffusion-model, --t5xxl, --vae, --tokenizer), into a plan.
    Compile(Box<CompileArgs>),
    /// Print a plan's stages, arena sizes, liveness bounds and weight bytes.
    Inspect {
        /// The plan file.
        plan: PathBuf,
    },
    /// Write a real-shape, random-weight PixArt pipeline folder (nothing downloaded).
    Synth(SynthArgs),
    /// Generate an Ed25519 signing key: KEY (secret 32-byte seed, hex) and KEY.pub (public
    /// key, hex).
    Keygen {
        /// The secret key file to create (KEY.pub is written beside it); never overwritten.
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a plan in place (or into --output) with an Ed25519 key from `keygen`.
    Sign {
        /// The plan file; it must verify in full before it is signed.
        plan: PathBuf,
        /// The secret key file KEY from `keygen` (not KEY.pub).
        #[arg(long)]
        key: PathBuf,
        /// Write the signed plan here instead of replacing PLAN.
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// Replace a signature by another key (refused otherwise).
        #[arg(long)]
        resign: bool,
    },
    /// Verify every digest of a plan (and, with --trusted-key, its signature); with
    /// --reference, also run it here with this CPU's best kernel table (every table gives the
    /// generic kernels' bytes and understands every pack, whatever the plan's target) and
    /// compare its final latents with a reference run.
    Verify {
        /// The plan file.
        plan: PathBuf,
        /// Require a valid signature by this public key (KEY.pub).
        #[arg(long)]
        trusted_key: Option<PathBuf>,
        #[command(flatten)]
        reference: ReferenceArgs,
    },
}

/// A reference pipeline run to compare a plan with (`pipeline_*.safetensors` of the fixtures:
/// `initial_noise`, `final_latents`).
#[derive(clap::Args)]
struct ReferenceArgs {
    /// Safetensors with `initial_noise` [1, 4, h, w] and `final_latents` [1, 4, h, w].
    #[arg(long)]
    reference: Option<PathBuf>,
    /// The reference run's prompt.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "",
        allow_hyphen_values = true
    )]
    prompt: String,
    /// The reference run's negative prompt.
    #[arg(
        short = 'n',
        long = "negative-prompt",
        default_value = "",
        allow_hyphen_values = true
    )]
    negative_prompt: String,
    /// The reference run's steps.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// The reference run's guidance scale.
    #[arg(long = "cfg-scale", default_value_t = 4.5)]
    cfg_scale: f32,
    /// The reference run's sampler: dpm++2m or euler.
    #[arg(long = "sampling-method", default_value = "dpm++2m")]
    sampling_method: String,
    /// Largest accepted max |ours − reference| / max(1, max |reference|). The default fits plans
    /// with the reference's weights (f32/f16); quantized plans differ by their weight
    /// quantization (about 2e-2 to 5e-2 on the fixtures), so give a bound such as 0.05.
    #[arg(long, default_value_t = 1e-3, allow_negative_numbers = true)]
    tolerance: f64,
}

#[derive(clap::Args)]
struct SynthArgs {
    /// Preset: pixart-sigma-xl2-1024 (PixArt-Σ XL-2 + T5-XXL + SDXL VAE),
    /// pixart-sigma-xl2-1024-t5-1 (the same with a one-block T5, for timing the denoiser and
    /// VAE) or pixart-sigma-small.
    #[arg(long)]
    preset: String,
    /// Output pipeline folder (created; must be absent or empty unless --force).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Seed of the weights (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Storage type of the weights: f16, f32 or bf16.
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Pipeline folder whose tokenizer/ and scheduler/ are copied (default: the demo model's,
    /// built into edgeplan).
    #[arg(long)]
    tokenizer_from: Option<PathBuf>,
    /// Replace a non-empty output folder.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct CompileArgs {
    /// The diffusers pipeline folder (model_index.json, transformer/, text_encoder/, vae/, tokenizer/, scheduler/).
    /// Optional when --diffusion-model, --t5xxl, --vae and --tokenizer are all given.
    model: Option<PathBuf>,
    /// Transformer weights (safetensors or GGUF; diffusers or original PixArt names), replacing the folder's.
    #[arg(long)]
    diffusion_model: Option<PathBuf>,
    /// T5 encoder weights (safetensors), replacing the folder's.
    #[arg(long)]
    t5xxl: Option<PathBuf>,
    /// VAE weights (diffusers AutoencoderKL safetensors), replacing the folder's.
    #[arg(long)]
    vae: Option<PathBuf>,
    /// Tokenizer file (spiece.model or tokenizer.json), replacing the folder's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Attention heads of the transformer when there is no folder config (PixArt-XL: 16).
    #[arg(long)]
    heads: Option<usize>,
    /// Native latent size of the transformer when there is no folder config or GGUF key
    /// (1024-px models: 128, 512-px: 64).
    #[arg(long)]
    sample_size: Option<usize>,
    /// GroupNorm groups of the VAE when there is no folder config (default 32).
    #[arg(long)]
    vae_norm_groups: Option<usize>,
    /// Model family when there is no folder: sigma (SDXL VAE, 300 tokens) or alpha (SD VAE,
    /// 120 tokens); needed unless the transformer has PixArt-α's micro-condition embedders.
    #[arg(long)]
    family: Option<String>,
    /// Image width in pixels; repeat (or give a comma list) for several sizes, paired with -H.
    #[arg(
        short = 'W',
        long = "width",
        allow_negative_numbers = true,
        value_delimiter = ',',
        required = true
    )]
    width: Vec<u32>,
    /// Image height in pixels; as many as widths (or one, used for every width).
    #[arg(
        short = 'H',
        long = "height",
        allow_negative_numbers = true,
        value_delimiter = ',',
        required = true
    )]
    height: Vec<u32>,
    /// Output plan file.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Tokens per prompt (default: 300 for PixArt-Σ, 120 for PixArt-α).
    #[arg(long)]
    max_sequence_length: Option<u32>,
    /// Default type of matrix weights (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k); default: as stored.
    #[arg(long)]
    quant: Option<String>,
    /// Per-tensor override PATTERN=TYPE (substring or * glob over the tensor name); repeatable.
    #[arg(long = "quant-rule")]
    quant_rule: Vec<String>,
    /// Override the VAE config's scaling factor.
    #[arg(long)]
    vae_scale_factor: Option<f32>,
    /// LoRA FILE[:MULTIPLIER] (safetensors; PEFT/diffusers or kohya keys) merged into the
    /// transformer's weights before packing; repeatable, applied in order; multiplier 1 by default.
    #[arg(long = "lora", value_name = "FILE[:MULTIPLIER]")]
    lora: Vec<String>,
    /// Leave the VAE encoder out of the plan (no image to image; a smaller plan).
    #[arg(long = "no-vae-encoder")]
    no_vae_encoder: bool,
    /// A tiny autoencoder (TAESD for PixArt-α, TAESDXL for PixArt-Σ): a diffusers
    /// AutoencoderTiny folder or one .safetensors file; adds a tiny-decoder stage per size for
    /// `edgerun --decoder tae` and `--preview tae`.
    #[arg(long = "taesd", value_name = "DIR_OR_FILE")]
    taesd: Option<PathBuf>,
    /// Memory budget for weights resident + arena on the device (e.g. `1.5G`, `800M`).
    #[arg(long = "max-ram")]
    max_ram: Option<String>,
    /// GPU memory budget for a `--target cuda-smXX` plan (e.g. `6G`): the planner places the
    /// text encoder on the device's CPU cores when the GPU cannot hold it beside the denoiser
    /// and the VAE, and refuses a plan whose GPU part does not fit (`edgeplan inspect` shows
    /// the placement). For a CPU target, the same as --max-ram.
    #[arg(long = "max-vram")]
    max_vram: Option<String>,
    /// Execution per stage: auto (segmented only when over budget), monolithic, every-cut.
    #[arg(long, default_value = "auto")]
    segments: String,
    /// Budget bytes kept free for the process itself (default 128M).
    #[arg(long = "planning-headroom")]
    planning_headroom: Option<String>,
    /// Type of the cross-attention K/V cache computed once per prompt: f32 (bit-identical),
    /// f16 (half the bytes) or q8_0 (34 bytes per 32 values); case-insensitive; see the
    /// README's memory budget paragraph.
    #[arg(long = "kv-cache-type", default_value = "f32")]
    kv_cache_type: String,
    /// Products of the denoiser's attention: f32 (default) or bf16 (q·k and the weights times
    /// the values from bf16-rounded operands with f32 sums, the arithmetic of x86-64
    /// `vdpbf16ps`: faster on AVX512_BF16 CPUs, a scalar kernel elsewhere; not for cuda
    /// targets); case-insensitive.
    #[arg(long = "attention-products", default_value = "f32")]
    attention_products: String,
    /// Bits of the activation quants the denoiser's Q8_0 products multiply: 8 (default, ggml's
    /// q8_0 arithmetic) or 7 (d = amax/63: faster on x86-64 CPUs with AVX2 but no AVX-512 VNNI,
    /// about twice the activations' rounding error; needs Q8_0 matrices in the denoiser, e.g.
    /// --quant q8_0; --target x86_64 or generic).
    #[arg(long = "activation-bits", default_value = "8")]
    activation_bits: String,
    /// VAE tile size in image pixels, WxH or one number (tiles the decode).
    #[arg(long = "vae-tile-size")]
    vae_tile_size: Option<String>,
    /// How VAE tiles are decoded: exact (GroupNorm statistics of the whole image, a halo of
    /// context, no blending: the same image as decoding at once; falls back to estimate when
    /// it does not fit the budget), estimate (overlaps blended, GroupNorm statistics estimated
    /// by decoding the whole latent at reduced resolution: close to the whole image, little
    /// memory) or blend (each tile alone, overlaps blended, as stable-diffusion.cpp; colours can
    /// shift).
    #[arg(long = "vae-tile-mode", default_value = "exact")]
    vae_tile_mode: String,
    /// Where exact tiles hold the activations between GroupNorms on the device: auto (memory
    /// when they fit the budget, else a temporary file), memory, or file.
    #[arg(long = "vae-tile-hold", default_value = "auto")]
    vae_tile_hold: String,
    /// Latent reduction of the statistics estimate (estimate mode): 2…64 latent pixels per
    /// reduced pixel along each axis; default the smallest power of two that fits the budget.
    #[arg(long = "vae-estimate-factor", allow_hyphen_values = true)]
    vae_estimate_factor: Option<String>,
    /// VAE tile overlap as a fraction of the tile (0…0.5, default 0.5; blend and estimate modes).
    #[arg(long = "vae-tile-overlap", allow_hyphen_values = true)]
    vae_tile_overlap: Option<f32>,
    /// VAE tile size relative to the image: ≤ 1 a fraction of each axis, > 1 a tile count (X or XxY).
    #[arg(long = "vae-relative-tile-size", allow_hyphen_values = true)]
    vae_relative_tile_size: Option<String>,
    /// Target the plan is packed for: generic, x86_64 (or x86-64), x86_64-avx512 (or
    /// x86-64-avx512: Q8_0 weights in the AVX-512 VNNI kernels' layout; the plan then needs
    /// avx512f, avx512bw and avx512vnni on an x86-64 host), x86_64-avx512bf16 (the same, and
    /// BF16 weights in the AVX512_BF16 kernels' layout, whose products round the activations to
    /// bf16 as `vdpbf16ps` does: other bits than the same weights row-major; needs avx512bf16
    /// too), aarch64-neon (or aarch64: Q8_0/Q4_0
    /// weights in the NEON kernels' layout), or a GPU: cuda-sm72
    /// (Xavier), cuda-sm87 (Orin), cuda-sm90 (generic packs plus the CUDA kernels compiled
    /// here with NVRTC and stored in the plan; needs an edgeplan built with `--features cuda`
    /// and libnvrtc.so.12).
    #[arg(long, default_value = "generic")]
    target: String,
    /// No progress display (a bar on a terminal, plain lines otherwise).
    #[arg(long)]
    quiet: bool,
}

fn parse_type(s: &str, flag: &str) -> Result<DType> {
    let d = DType::from_name(s).with_context(|| {
        format!("{flag}: unknown type `{s}` (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)")
    })?;
    if d == DType::I32 || matches!(d, DType::Q2K | DType::Q3K) {
        bail!("{flag}: type `{s}` cannot be used for weights (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)");
    }
    Ok(d)
}

/// Refuses a plan file name whose extension says another format (`-o model.png`); `.plan`
/// or no extension is accepted.
fn check_plan_name(flag: &str, out: &std::path::Path) -> Result<()> {
    match out.extension().map(|e| e.to_string_lossy()) {
        Some(e) if !e.eq_ignore_ascii_case("plan") => bail!(
            "{flag} {}: edgeplan writes a plan here, not .{e}; name the file .plan",
            out.display()
        ),
        _ => Ok(()),
    }
}

fn parse_family(s: &str) -> Result<edge_schema::plan::ModelFamily> {
    use edge_schema::plan::ModelFamily;
    match s.to_ascii_lowercase().as_str() {
        "sigma" | "pixart-sigma" | "σ" => Ok(ModelFamily::PixArtSigma),
        "alpha" | "pixart-alpha" | "α" => Ok(ModelFamily::PixArtAlpha),
        _ => bail!("--family: unknown family `{s}` (expected sigma or alpha)"),
    }
}

/// The GPU architecture `--target cuda-smXX` names (`sm_87`), checked before anything is read;
/// `None` for a CPU target.
fn cuda_arch(target: &str) -> Result<Option<&'static str>> {
    let Some(rest) = target.strip_prefix("cuda-") else {
        return Ok(None);
    };
    match rest {
        "sm72" => Ok(Some("sm_72")),
        "sm87" => Ok(Some("sm_87")),
        "sm90" => Ok(Some("sm_90")),
        _ => bail!("--target {target}: unknown GPU target (expected cuda-sm72 (Xavier), cuda-sm87 (Orin) or cuda-sm90)"),
    }
}

/// The CUDA kernels for `arch` (from [`cuda_arch`]), compiled now.
#[cfg(feature = "cuda")]
fn compile_cuda(arch: &str) -> Result<edge_schema::plan::CudaModules> {
    let a = edge_kernels_cuda::Arch::parse(arch).map_err(|e| anyhow::anyhow!("--target: {e}"))?;
    let target = format!("cuda-{}", arch.replace('_', ""));
    edge_kernels_cuda::compile_modules(a).map_err(|e| anyhow::anyhow!("--target {target}: {e}"))
}

#[cfg(not(feature = "cuda"))]
fn compile_cuda(arch: &str) -> Result<edge_schema::plan::CudaModules> {
    bail!("--target cuda-{}: this edgeplan was built without CUDA (build it with `cargo build --release -p edge-tools --features cuda`; NVRTC compiles the kernels)", arch.replace('_', ""))
}

fn parse_target(s: &str) -> Result<Target> {
    if s.starts_with("cuda-") {
        // The GPU reads the generic row-major packs (the CPU can check the plan too).
        return Ok(Target {
            isa: Isa::Generic,
            features: vec![],
        });
    }
    let (isa, features) = match s {
        "generic" => (Isa::Generic, vec![]),
        "x86_64" | "x86-64" => (Isa::X86_64, vec![]),
        "x86_64-avx512" | "x86-64-avx512" => (
            Isa::X86_64,
            ["avx512f", "avx512bw", "avx512vnni"]
                .map(String::from)
                .to_vec(),
        ),
        "x86_64-avx512bf16" | "x86-64-avx512bf16" => (
            Isa::X86_64,
            ["avx512f", "avx512bw", "avx512vnni", "avx512bf16"]
                .map(String::from)
                .to_vec(),
        ),
        "aarch64" | "aarch64-neon" => (Isa::Aarch64, vec!["neon".to_string()]),
        other => {
            const NAMES: [&str; 9] = [
                "generic",
                "x86_64",
                "x86_64-avx512",
                "x86_64-avx512bf16",
                "aarch64-neon",
                "aarch64",
                "cuda-sm72",
                "cuda-sm87",
                "cuda-sm90",
            ];
            let hint = common::did_you_mean(other, &NAMES)
                .map(|n| format!("did you mean `{n}`? "))
                .unwrap_or_default();
            bail!("--target: unknown target `{other}`: {hint}expected generic, x86_64 (or x86-64), x86_64-avx512 (or x86-64-avx512), x86_64-avx512bf16 (or x86-64-avx512bf16), aarch64-neon (or aarch64), cuda-sm72, cuda-sm87, cuda-sm90")
        }
    };
    Ok(Target { isa, features })
}

fn compile(a: CompileArgs) -> Result<()> {
    let sizes: Vec<(u32, u32)> = if a.height.len() == a.width.len() {
        a.width
            .iter()
            .copied()
            .zip(a.height.iter().copied())
            .collect()
    } else if a.height.len() == 1 {
        a.width.iter().map(|&w| (w, a.height[0])).collect()
    } else if a.width.len() == 1 {
        a.height.iter().map(|&h| (a.width[0], h)).collect()
    } else {
        bail!(
            "-W/-H: {} widths and {} heights; give as many of each (or one of either)",
            a.width.len(),
            a.height.len()
        );
    };
    let mut policy = PackPolicy {
        default: a
            .quant
            .as_deref()
            .map(|q| parse_type(q, "--quant"))
            .transpose()?,
        rules: vec![],
    };
    for r in &a.quant_rule {
        let (p, t) = r
            .split_once('=')
            .with_context(|| format!("--quant-rule `{r}`: expected PATTERN=TYPE"))?;
        if p.trim().is_empty() {
            bail!(
                "--quant-rule `{r}`: the pattern is empty (it would match every matrix weight: \
                 give --quant TYPE for that)"
            );
        }
        policy
            .rules
            .push((p.to_string(), parse_type(t, "--quant-rule")?));
    }
    let gpu_arch = cuda_arch(&a.target)?;
    let gpu_target = gpu_arch.is_some();
    let vram = match (gpu_target, a.max_vram.as_deref()) {
        (true, Some(v)) => Some(parse_size(v, "--max-vram")?),
        _ => None,
    };
    if a.vae_estimate_factor.is_some() && a.vae_tile_mode == "blend" {
        bail!("--vae-estimate-factor: blended tiles estimate no statistics; use --vae-tile-mode estimate (or exact, whose fallback uses it)");
    }
    let activations_a7 = match a.activation_bits.as_str() {
        "8" => false,
        "7" => true,
        other => bail!("--activation-bits `{other}`: expected 8 or 7"),
    };
    if activations_a7 {
        if let Some(why) = edge_planner::a7_refusal(&parse_target(&a.target)?, gpu_target) {
            bail!("--activation-bits 7 with --target {}: {why}", a.target);
        }
    }
    let mut opts = CompileOptions {
        sizes,
        max_sequence_length: a.max_sequence_length,
        policy,
        target: parse_target(&a.target)?,
        // Compiled once the inputs and -o are checked (below).
        cuda: None,
        vae_scale_factor: a.vae_scale_factor,
        max_ram: match (a.max_ram.as_deref(), a.max_vram.as_deref()) {
            (Some(r), _) => Some(parse_size(r, "--max-ram")?),
            // A CPU target: --max-vram is --max-ram (a GPU target plans it separately).
            (None, Some(v)) if !gpu_target => Some(parse_size(v, "--max-vram")?),
            _ => None,
        },
        headroom: match a.planning_headroom.as_deref() {
            Some("0") => 0,
            Some(h) => parse_size(h, "--planning-headroom")?,
            None => edge_planner::budget::HEADROOM,
        },
        segments: a.segments.parse()?,
        progress: Default::default(),
        loras: a
            .lora
            .iter()
            .map(|l| edge_planner::lora::LoraRequest::parse(l))
            .collect::<Result<_, _>>()?,
        vae_encoder: !a.no_vae_encoder,
        taesd: a.taesd.clone(),
        kv_cache: match a.kv_cache_type.to_ascii_lowercase().as_str() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "q8_0" => DType::Q8_0,
            other => bail!("--kv-cache-type `{other}`: expected f32, f16 or q8_0"),
        },
        attention_bf16: match a.attention_products.to_ascii_lowercase().as_str() {
            "f32" => false,
            "bf16" if gpu_target => bail!(
                "--attention-products bf16: a cuda target's attention runs on the GPU in f32; \
                 bf16 products are a CPU arithmetic (x86-64 vdpbf16ps), leave the flag out"
            ),
            "bf16" => true,
            other => bail!("--attention-products `{other}`: expected f32 or bf16"),
        },
        activations_a7,
        tiling: edge_planner::tiling::TileRequest {
            mode: a.vae_tile_mode.parse()?,
            hold: a.vae_tile_hold.parse()?,
            size: a
                .vae_tile_size
                .as_deref()
                .map(edge_planner::tiling::parse_tile_size)
                .transpose()?,
            relative: a
                .vae_relative_tile_size
                .as_deref()
                .map(edge_planner::tiling::parse_relative)
                .transpose()?,
            overlap: a
                .vae_tile_overlap
                .map(edge_planner::tiling::validate_overlap)
                .transpose()?,
            estimate_factor: a
                .vae_estimate_factor
                .as_deref()
                .map(edge_planner::tiling::parse_estimate_factor)
                .transpose()?,
        },
    };
    let mut sources: Vec<(String, std::path::PathBuf)> = Vec::new();
    if let Some(m) = &a.model {
        sources.extend(common::files_under(m).into_iter().map(|p| {
            let what = if m.is_dir() {
                "the model folder's"
            } else {
                "the model file"
            };
            (what.to_string(), p)
        }));
    }
    for (flag, p) in [
        ("--diffusion-model", &a.diffusion_model),
        ("--t5xxl", &a.t5xxl),
        ("--vae", &a.vae),
        ("--tokenizer", &a.tokenizer),
    ] {
        if let Some(p) = p {
            sources.extend(
                common::files_under(p)
                    .into_iter()
                    .map(|f| (flag.to_string(), f)),
            );
        }
    }
    // Progress: the weight files' bytes as the total of the reading phase (a weight read twice
    // only moves the bar further), the plan file's length for the writing phase.
    let read_total: u64 = sources
        .iter()
        .filter(|(_, p)| {
            p.extension()
                .is_some_and(|e| e == "safetensors" || e == "gguf" || e == "bin")
        })
        .filter_map(|(_, p)| std::fs::metadata(p).ok().map(|m| m.len()))
        .sum();
    if !a.quiet {
        let ui = std::sync::Arc::new(CompileUi::new(read_total));
        opts.progress =
            edge_planner::compile::ProgressHook(Some(std::sync::Arc::new(move |p| ui.report(p))));
    }
    // A component given as a device or a FIFO would be read without end or block: refused.
    let lora_paths: Vec<PathBuf> = opts.loras.iter().map(|l| l.path.clone()).collect();
    for (flag, p) in [
        ("--diffusion-model", a.diffusion_model.as_ref()),
        ("--t5xxl", a.t5xxl.as_ref()),
        ("--vae", a.vae.as_ref()),
        ("--tokenizer", a.tokenizer.as_ref()),
        ("--taesd", a.taesd.as_ref()),
    ]
    .into_iter()
    .chain(lora_paths.iter().map(|p| ("--lora", Some(p))))
    {
        if let Some(p) = p {
            if std::fs::metadata(p).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
                anyhow::bail!("{flag} {}: not a regular file or folder", p.display());
            }
        }
    }
    // Inputs read besides the weights counted above: the LoRA files and the TAESD weights.
    let mut extra: Vec<(String, std::path::PathBuf)> = Vec::new();
    for l in &opts.loras {
        extra.extend(
            common::files_under(&l.path)
                .into_iter()
                .map(|f| ("--lora".to_string(), f)),
        );
    }
    if let Some(t) = &a.taesd {
        extra.extend(
            common::files_under(t)
                .into_iter()
                .map(|f| ("--taesd".to_string(), f)),
        );
    }
    let inputs: Vec<(&str, &std::path::Path)> = sources
        .iter()
        .chain(&extra)
        .map(|(f, p)| (f.as_str(), p.as_path()))
        .collect();
    common::refuse_clobber(&inputs, &[("-o", a.output.as_path())])?;
    check_plan_name("-o", &a.output)?;
    // Refused before any weight is read.
    common::check_output_dir("-o", &a.output)?;
    common::check_output_file("-o", &a.output)?;
    if let Some(arch) = gpu_arch {
        let mut c = compile_cuda(arch)?;
        c.vram_budget = vram;
        opts.cuda = Some(c);
    }
    let started = std::time::Instant::now();
    let files = edge_planner::compile::ComponentFiles {
        diffusion_model: a.diffusion_model.clone(),
        t5xxl: a.t5xxl.clone(),
        vae: a.vae.clone(),
        tokenizer: a.tokenizer.clone(),
        heads: a.heads,
        sample_size: a.sample_size,
        vae_norm_groups: a.vae_norm_groups,
        family: a.family.as_deref().map(parse_family).transpose()?,
    };
    let what = match (&a.model, &files.diffusion_model) {
        (Some(m), _) => m.display().to_string(),
        (None, Some(d)) => d.display().to_string(),
        (None, None) => {
            bail!("give a pipeline folder, or --diffusion-model, --t5xxl, --vae and --tokenizer")
        }
    };
    let c =
        edge_planner::compile::compile_inputs_to_file(a.model.as_deref(), &files, &opts, &a.output)
            .with_context(|| format!("compiling {what}"))?;
    // The quantization fallbacks are the notes' tail (`write_compiled` appends one per matrix);
    // here they are summed up per (asked, stored) pair: a q4_k plan of PixArt falls back on
    // hundreds of matrices. `edgeplan inspect` lists each.
    let fallbacks = &c.table.fallbacks;
    let own = c.meta.notes.len().saturating_sub(fallbacks.len());
    for n in &c.meta.notes[..own] {
        if n.starts_with("warning:") {
            say!("{n}");
        } else {
            say!("note: {n}");
        }
    }
    let mut groups: Vec<(&edge_planner::pack::Fallback, usize)> = Vec::new();
    for f in fallbacks {
        match groups
            .iter_mut()
            .find(|(g, _)| g.asked == f.asked && g.used == f.used)
        {
            Some((_, count)) => *count += 1,
            None => groups.push((f, 1)),
        }
    }
    for (f, count) in groups {
        if count == 1 {
            say!(
                "note: {}: asked {}, stored {} ({})",
                f.tensor,
                f.asked,
                f.used,
                f.reason
            );
        } else {
            say!(
                "note: {count} matrices asked {}, stored {} (the first, {}: {}); `edgeplan inspect` lists each",
                f.asked,
                f.used,
                f.tensor,
                f.reason
            );
        }
    }
    if let Some(budget) = opts.max_ram {
        print_memory_plan(&c, budget, opts.headroom);
    }
    let len = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    say!(
        "wrote {} ({} bytes, {} stages, {} tensors) in {:.2}s",
        a.output.display(),
        len,
        c.meta.stages.len(),
        c.table.entries.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `edgeplan compile`'s progress: a bar on a terminal, plain lines at every tenth otherwise
/// (logs, systemd).
struct CompileUi {
    bar: indicatif::ProgressBar,
    lines: bool,
    state: std::sync::Mutex<UiState>,
}

struct UiState {
    read: u64,
    writing: bool,
    last_tenth: u64,
    started: std::time::Instant,
}

impl CompileUi {
    fn new(read_total: u64) -> Self {
        use std::io::IsTerminal;
        let lines = !std::io::stderr().is_terminal();
        let bar = indicatif::ProgressBar::new(read_total.max(1));
        if lines {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        } else {
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg:>16} [{bar:30}] {bytes}/{total_bytes} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message("reading weights");
        }
        CompileUi {
            bar,
            lines,
            state: std::sync::Mutex::new(UiState {
                read: 0,
                writing: false,
                last_tenth: 0,
                started: std::time::Instant::now(),
            }),
        }
    }

    fn report(&self, p: edge_planner::compile::CompileProgress) {
        use edge_planner::compile::CompileProgress as P;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (phase, done, total) = match p {
            P::Read { bytes } => {
                st.read += bytes;
                let total = self.bar.length().unwrap_or(1);
                ("reading weights", st.read.min(total), total)
            }
            P::Written { done, total } => {
                if !st.writing {
                    st.writing = true;
                    st.last_tenth = 0;
                    st.started = std::time::Instant::now();
                    self.bar.set_length(total.max(1));
                    self.bar.set_message("writing the plan");
                    self.bar.reset_eta();
                }
                ("writing the plan", done, total.max(1))
            }
        };
        self.bar.set_position(done);
        if self.lines {
            let tenth = done * 10 / total;
            if tenth > st.last_tenth {
                st.last_tenth = tenth;
                let secs = st.started.elapsed().as_secs_f64();
                let eta = if done > 0 {
                    secs * (total - done) as f64 / done as f64
                } else {
                    0.0
                };
                // The percentage of the bytes themselves (a line is printed when a new tenth is
                // reached, and one update may cross several), beside the rounded MB.
                say!(
                    "{phase}: {}% ({} of {} MB), {secs:.1}s, eta {eta:.1}s",
                    done * 100 / total,
                    done >> 20,
                    total >> 20
                );
            }
        }
        if st.writing && done >= total {
            self.bar.finish_and_clear();
        }
    }
}

/// Prints, per image size, the predicted peak of every stage the run goes through (the shared
/// model of `edge_schema::memory`: arena, resident weights, host buffers; the process itself is
/// covered by the headroom) and how each stage runs.
fn print_memory_plan(c: &edge_planner::compile::Compiled, budget: u64, headroom: u64) {
    use edge_schema::memory;
    let meta = &c.meta;
    let charges = memory::tensor_charges(&meta.stages, &c.table.entries);
    let limit = budget.saturating_sub(headroom);
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
    for z in &meta.sizes {
        let peaks = memory::stage_peaks(meta, &c.table.entries, &charges, z, Some(limit));
        let top = peaks.iter().map(|p| p.peak).max().unwrap_or(0);
        say!(
            "memory at {}x{}: predicted peak {} of the {} budget ({} kept for the process itself)",
            z.width,
            z.height,
            mib(top + headroom),
            mib(budget),
            mib(headroom)
        );
        for p in &peaks {
            let st = &meta.stages[p.stage as usize];
            let how = if st.segmented {
                format!("segmented ({} segments, one prefetched)", st.segments.len())
            } else {
                "monolithic".to_string()
            };
            say!(
                "  {}: {} = arena {} + weights {} + host buffers {}; {how}",
                st.name,
                mib(p.peak),
                mib(p.arena),
                mib(p.peak - p.arena - p.host),
                mib(p.host)
            );
        }
        let gathered: u64 = c
            .table
            .entries
            .iter()
            .zip(&charges)
            .filter(|(t, &ch)| ch < t.len)
            .map(|(t, &ch)| t.len - ch)
            .sum();
        if gathered > 0 {
            say!(
                "  embedding tables: rows gathered from the mapping ({} of the tables never made resident)",
                mib(gathered)
            );
        }
    }
}

/// Checks every weight section's BLAKE3 digest (header, metadata and layout verified by the
/// runtime's reader, the file memory-mapped rather than read), then prints the plan's summary
/// and says the sections were verified; a corrupted section is an error and nothing is
/// printed.
fn inspect(plan: PathBuf) -> Result<()> {
    let p = edge_runtime::Plan::open(&plan)?;
    // Every section's digest first: a damaged plan prints no summary, only the error.
    p.verify_all_sections().map_err(|e| e.in_file(&plan))?;
    out!(
        "{}",
        edge_planner::inspect::summary(p.meta(), p.file_len() as u64).trim_end()
    );
    match p.signer() {
        Some(k) => out!(
            "signature: claims signer {} (not checked here; `edgeplan verify --trusted-key KEY.pub` checks it)",
            edge_schema::header::encode_hex(&k)
        ),
        None => out!("signature: unsigned"),
    }
    out!(
        "sections: {} weight sections verified (BLAKE3)",
        p.meta().sections.len()
    );
    Ok(())
}

fn synth(a: SynthArgs) -> Result<()> {
    use edge_synth as synth;
    let preset = synth::preset(&a.preset)?;
    let opts = synth::SynthOptions {
        seed: a.seed,
        dtype: synth::WeightDType::from_name(&a.dtype).context("--dtype")?,
        tokenizer_from: a.tokenizer_from,
        force: a.force,
    };
    let started = std::time::Instant::now();
    let r = synth::synthesize(&preset, &a.output, &opts)
        .with_context(|| format!("writing preset {} to {}", a.preset, a.output.display()))?;
    let params: Vec<String> = r
        .parameters
        .iter()
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    say!(
        "wrote {} ({} bytes in {} weight files; parameters: {}) in {:.2}s",
        a.output.display(),
        r.bytes,
        r.weight_files,
        params.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Compile(a) => compile(*a),
        Cmd::Inspect { plan } => inspect(plan),
        Cmd::Synth(a) => synth(a),
        Cmd::Keygen { out } => keygen(out),
        Cmd::Sign {
            plan,
            key,
            output,
            resign,
        } => sign(plan, key, output, resign),
        Cmd::Verify {
            plan,
            trusted_key,
            reference,
        } => verify(plan, trusted_key, reference),
    };
    if let Err(e) = r {
        say!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

fn keygen(out: PathBuf) -> Result<()> {
    let key = edge_planner::sign::SecretKey::generate()?;
    let pub_path = key.write_pair(&out)?;
    say!(
        "wrote secret key {} and public key {} ({})",
        out.display(),
        pub_path.display(),
        edge_schema::header::encode_hex(&key.public_key())
    );
    Ok(())
}

fn sign(plan: PathBuf, key: PathBuf, output: Option<PathBuf>, resign: bool) -> Result<()> {
    let secret = edge_planner::sign::SecretKey::from_file(&key).context("--key")?;
    if let Some(o) = &output {
        check_plan_name("--output", o)?;
    }
    let out = output.unwrap_or_else(|| plan.clone());
    // Signing in place (the default) rewrites the plan on purpose; the key must survive.
    common::refuse_clobber(&[("--key", key.as_path())], &[("--output", out.as_path())])?;
    let done = edge_planner::sign::sign_file(&plan, &out, &secret, resign)
        .with_context(|| format!("signing plan {}", plan.display()))?;
    let key_hex = edge_schema::header::encode_hex(&secret.public_key());
    match done {
        edge_planner::sign::Signed::New => say!("signed {} with key {key_hex}", out.display()),
        edge_planner::sign::Signed::Same => say!(
            "{} was already signed with key {key_hex}; signature unchanged",
            out.display()
        ),
        edge_planner::sign::Signed::Replaced(old) => say!(
            "signed {} with key {key_hex}, replacing the signature by key {old}",
            out.display()
        ),
    }
    Ok(())
}

fn verify(plan: PathBuf, trusted_key: Option<PathBuf>, r: ReferenceArgs) -> Result<()> {
    let p = match &trusted_key {
        Some(k) => {
            let key = edge_runtime::TrustedKey::from_file(k).context("--trusted-key")?;
            edge_runtime::Plan::open_signed(&plan, &key)
        }
        None => edge_runtime::Plan::open(&plan),
    }?;
    p.verify_all_sections().map_err(|e| e.in_file(&plan))?;
    let signer = p
        .signer()
        .map(|k| edge_schema::header::encode_hex(&k))
        .unwrap_or_else(|| "unsigned".into());
    let how = if trusted_key.is_some() {
        "signature verified"
    } else {
        "signature not checked"
    };
    out!(
        "{}: ok ({} bytes, {} sections; signer {signer}, {how})",
        plan.display(),
        p.file_len(),
        p.meta().sections.len()
    );
    if let Some(reference) = &r.reference {
        compare_with_reference(&p, reference, &r)?;
    }
    Ok(())
}

fn read_f32(
    st: &safetensors::SafeTensors<'_>,
    name: &str,
    path: &std::path::Path,
) -> Result<(Vec<usize>, Vec<f32>)> {
    let t = st
        .tensor(name)
        .map_err(|_| anyhow::anyhow!("{}: no tensor `{name}`", path.display()))?;
    if t.dtype() != safetensors::Dtype::F32 {
        bail!(
            "{}: tensor `{name}` is {:?}, expected F32",
            path.display(),
            t.dtype()
        );
    }
    let v = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((t.shape().to_vec(), v))
}

/// Runs `plan` with the best kernel table of this CPU (the generic kernels' bytes, faster) from
/// the reference's initial noise and compares the final latents.
fn compare_with_reference(
    plan: &edge_runtime::Plan,
    path: &std::path::Path,
    r: &ReferenceArgs,
) -> Result<()> {
    if !(r.tolerance.is_finite() && r.tolerance > 0.0) {
        bail!("--tolerance {}: expected a positive number", r.tolerance);
    }
    let bytes = read_file(path, "reference")?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a valid safetensors file: {e}", path.display()))?;
    let (shape, noise) = read_f32(&st, "initial_noise", path)?;
    let (want_shape, want) = read_f32(&st, "final_latents", path)?;
    if shape.len() != 4 || shape[0] != 1 {
        bail!(
            "{}: initial_noise is {shape:?}, expected [1, 4, h, w]",
            path.display()
        );
    }
    // The sampler's latents have the noise's shape: a reference of another shape (or an empty
    // one) would otherwise be compared over the shorter of the two and could pass.
    if want_shape != shape {
        bail!(
            "{}: final_latents is {want_shape:?}, expected {shape:?} (the shape of initial_noise)",
            path.display()
        );
    }
    for (name, v) in [("initial_noise", &noise), ("final_latents", &want)] {
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            bail!(
                "{}: {name} holds {} at element {i}: expected finite values",
                path.display(),
                v[i]
            );
        }
    }
    let ds = plan.meta().vae.downscale as usize;
    let method = r
        .sampling_method
        .parse()
        .map_err(|e| anyhow::anyhow!("--sampling-method: {e}"))?;
    let mut session = edge_runtime::Session::new(plan, edge_kernels_cpu::best(), None)?;
    let params = edge_runtime::GenerateParams {
        prompt: r.prompt.clone(),
        negative_prompt: r.negative_prompt.clone(),
        steps: r.steps,
        cfg_scale: r.cfg_scale,
        method,
        seed: 0,
        width: (shape[3] * ds) as u32,
        height: (shape[2] * ds) as u32,
        rng: Default::default(),
        karras: None,
        init_latents: Some(noise),
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    let out = edge_runtime::generate(&mut session, &params, &mut |_| {}).with_context(|| {
        format!(
            "{}: sampling from initial_noise {shape:?} ({}x{} pixels)",
            path.display(),
            params.width,
            params.height
        )
    })?;
    let max_ref = want.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    let max_diff = out.latents.iter().zip(&want).fold(0f64, |m, (&a, &b)| {
        m.max((f64::from(a) - f64::from(b)).abs())
    });
    let num: f64 = out
        .latents
        .iter()
        .zip(&want)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| f64::from(b).powi(2)).sum();
    let rel = (num / den.max(1e-300)).sqrt();
    let score = max_diff / max_ref.max(1.0);
    out!(
        "{}: final latents vs {}: max |diff| {max_diff:.3e} ({score:.3e} of max(1, max |ref|)), rel L2 {rel:.3e}",
        plan.meta().model.name,
        path.display()
    );
    // Not `score > tolerance`: a NaN in the latents must fail the check, not pass it.
    if score.is_nan() || score > r.tolerance {
        bail!(
            "{}: final latents differ from the reference by {score:.3e} (more than --tolerance {})",
            path.display(),
            r.tolerance
        );
    }
    Ok(())
}
