//! From a diffusers PixArt pipeline folder to plan metadata and packed weights.

use std::path::{Path, PathBuf};

use edge_models::config::{PixArtConfig, T5Config, VaeConfig};
use edge_models::pixart::MicroConditions;
use edge_models::t5::build_t5_encoder;
use edge_schema::op::Op;
use edge_schema::plan::{
    ImageSize, Isa, ModelFamily, ModelInfo, PackLayout, PlanMeta, StageKind, Target, TextInfo,
    VaeInfo,
};
use edge_schema::DType;

use crate::budget::SegmentMode;
use crate::error::{PlanError, Result};
pub use crate::files::{compile_inputs, ComponentFiles};
use crate::load::file::{load_tokenizer_file, open_weights};
use crate::load::folder::PipelineFolder;
use crate::load::safetensors::open_safetensors_any;
use crate::load::{scheduler, tokenizer, LoadError, TensorSource};
use crate::lora::{LoraFile, LoraMerge, LoraRequest};
use crate::lower::{lower, TensorTable};
use crate::pack::PackPolicy;
pub use crate::progress::{CompileProgress, ProgressHook};
pub use crate::resolve::SourceResolver;
use crate::tiling::TileRequest;
pub use edge_models::infer::{ALPHA_VAE_SCALE, PIXART_SCHEDULER_CONFIG, SIGMA_VAE_SCALE};

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
    /// Memory budget (weights resident + arena, bytes); `None` = unlimited.
    pub max_ram: Option<u64>,
    /// Bytes of the budget kept free for the process itself.
    pub headroom: u64,
    /// Monolithic or segmented execution (`--segments`).
    pub segments: SegmentMode,
    /// Explicit VAE tiling (`--vae-tile-size`, `--vae-relative-tile-size`, `--vae-tile-overlap`).
    pub tiling: TileRequest,
    /// Type of the step-independent cross-attention K/V cache (`--kv-cache-type`): F32
    /// (default, bit-identical to recomputing it), F16 (half the bytes; each value within
    /// 2⁻¹¹ of itself relatively) or Q8_0 (34 bytes per 32 values; each value within
    /// `amax / 200` of itself, `amax` the largest magnitude of its 32-value block).
    pub kv_cache: DType,
    /// Called as the weights are read and packed and as the plan is written (a progress bar
    /// in `edgeplan`); none by default.
    pub progress: ProgressHook,
    /// LoRA adapters merged into the transformer's linear weights before packing
    /// (`--lora FILE[:MULTIPLIER]`, in order; see [`crate::lora`]).
    pub loras: Vec<LoraRequest>,
    /// Compile a VAE encoder stage per size for image to image (default; `--no-vae-encoder`
    /// leaves it out). Skipped, with a note, for a VAE without encoder weights and for a size
    /// whose whole-image encoder does not fit `max_ram`.
    pub vae_encoder: bool,
    /// A tiny autoencoder (TAESD for PixArt-α, TAESDXL for PixArt-Σ) whose decoder becomes a
    /// `TinyDecoder` stage per size (`--taesd DIR_OR_FILE`): a diffusers `AutoencoderTiny`
    /// folder (`config.json` + weights) or one weights file with diffusers names
    /// (`decoder.layers.N…`, TAESD's default config).
    pub taesd: Option<PathBuf>,
    /// CUDA kernels compiled for the plan's GPU (by the caller, e.g. `edgeplan compile
    /// --target cuda-sm87` with NVRTC), stored in the plan as they are.
    pub cuda: Option<edge_schema::plan::CudaModules>,
    /// The denoiser's attention products in bf16 pairs (`--attention-products bf16`): every
    /// attention step of the denoiser stages marked `bf16_products`, whose arithmetic
    /// `edge_kernels::attention_bf16` defines (`vdpbf16ps` on AVX512_BF16 CPUs, a scalar
    /// kernel elsewhere). The text encoder and the VAE keep f32 products. Refused for a cuda
    /// target (its GPU attention is f32).
    pub attention_bf16: bool,
    /// The denoiser's `Q8_0` products with 7-bit activations (`--activation-bits 7`): its
    /// `Q8_0` linear weights of at least 8 rows are stored in
    /// [`PackLayout::Interleaved8x4A7`], whose activations are quantized to 7 bits
    /// (`edge_kernels::quant::quantize_row_q8_0_a7`): faster on AVX2 CPUs without AVX-512
    /// VNNI, a larger quantization error (BENCHMARKS.md). The text encoder keeps 8-bit
    /// activations. Refused for aarch64, AVX-512 VNNI and cuda targets (their integer dot
    /// products take 8-bit activations at full speed) and where the denoiser has no such
    /// weight.
    pub activations_a7: bool,
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
            max_ram: None,
            headroom: crate::budget::HEADROOM,
            segments: SegmentMode::Auto,
            tiling: TileRequest::default(),
            kv_cache: DType::F32,
            progress: ProgressHook::default(),
            loras: Vec::new(),
            vae_encoder: true,
            taesd: None,
            cuda: None,
            attention_bf16: false,
            activations_a7: false,
        }
    }
}

/// A compiled plan before it is written: metadata (tensor and section tables not yet laid
/// out) and the packed tensors.
pub struct Compiled {
    pub meta: PlanMeta,
    pub table: TensorTable,
}

/// The family's display name.
pub(crate) fn family_name(f: ModelFamily) -> &'static str {
    match f {
        ModelFamily::PixArtSigma => "PixArt-Σ",
        ModelFamily::PixArtAlpha => "PixArt-α",
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
                Ok(if alpha {
                    ModelFamily::PixArtAlpha
                } else {
                    ModelFamily::PixArtSigma
                })
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

/// `--attention-products bf16`: marks the denoiser's attention steps `bf16_products`, with a
/// note saying how many and, for a target without `avx512bf16`, that a scalar kernel runs them.
fn mark_attention_bf16(meta: &mut PlanMeta) -> Result<()> {
    if meta.cuda.is_some() {
        return Err(PlanError::Invalid(
            "--attention-products bf16: a cuda target's attention runs on the GPU in f32; \
             bf16 products are a CPU arithmetic (x86-64 vdpbf16ps), leave the flag out"
                .into(),
        ));
    }
    let mut marked = 0usize;
    for st in meta
        .stages
        .iter_mut()
        .filter(|s| s.kind == StageKind::Denoiser)
    {
        for step in &mut st.steps {
            if let Op::Attention { bf16_products, .. } = &mut step.op {
                *bf16_products = true;
                marked += 1;
            }
        }
    }
    let fast =
        meta.target.isa == Isa::X86_64 && meta.target.features.iter().any(|f| f == "avx512bf16");
    meta.notes.push(format!(
        "--attention-products bf16: {marked} attention steps of the denoiser take bf16 products \
         (q·k and the weights times the values rounded to bf16, f32 sums, as vdpbf16ps; the \
         text encoder and the VAE keep f32){}",
        if fast {
            ""
        } else {
            "; on CPUs without avx512bf16 (this target does not require it) a scalar kernel \
             runs them, many times slower than f32 products (--target x86_64-avx512bf16 is \
             the target they are for)"
        }
    ));
    Ok(())
}

/// `--activation-bits 7` is for x86-64 (and generic) targets without AVX-512 VNNI.
fn check_a7_target(meta: &PlanMeta) -> Result<()> {
    match a7_refusal(&meta.target, meta.cuda.is_some()) {
        Some(why) => Err(PlanError::Invalid(format!(
            "--activation-bits 7 with --target {}: {why}",
            meta.target
        ))),
        None => Ok(()),
    }
}

/// Why `--activation-bits 7` does not go with `target` (`cuda`: a GPU target), or `None` where
/// it does (x86-64 without AVX-512 VNNI, and generic targets): the reason, ending with what to
/// do instead.
pub fn a7_refusal(target: &Target, cuda: bool) -> Option<&'static str> {
    if cuda {
        Some(
            "a cuda target's products run on the GPU with 8-bit activations; 7-bit activations \
             are for x86-64 CPUs with AVX2 only (--target x86_64 or generic), leave the flag out",
        )
    } else if target.isa == Isa::Aarch64 {
        Some(
            "aarch64's sdot/smmla multiply 8-bit activations at full speed; 7-bit activations \
             are for x86-64 CPUs with AVX2 only (--target x86_64 or generic), leave the flag out",
        )
    } else if target.features.iter().any(|f| f == "avx512vnni") {
        Some(
            "AVX-512 VNNI's vpdpbusd multiplies 8-bit activations at full speed; 7-bit \
             activations are for x86-64 CPUs with AVX2 only (--target x86_64 or generic), leave \
             the flag out",
        )
    } else {
        None
    }
}

/// Everything a plan is compiled from, whatever the files were.
pub(crate) struct Inputs<'a> {
    /// Values no file stated (folderless compiles), for the plan's notes.
    pub(crate) assumed: Vec<String>,
    pub(crate) name: String,
    pub(crate) pipeline_class: String,
    pub(crate) family: ModelFamily,
    pub(crate) tok: edge_schema::tokenizer::TokenizerSpec,
    pub(crate) sched: edge_schema::scheduler::SchedulerConfig,
    pub(crate) t5_cfg: T5Config,
    pub(crate) dit_cfg: PixArtConfig,
    pub(crate) vae_cfg: VaeConfig,
    pub(crate) t5: &'a dyn TensorSource,
    pub(crate) dit: &'a dyn TensorSource,
    pub(crate) vae: &'a dyn TensorSource,
}

fn cfg_err(dir: &Path, e: edge_models::config::ConfigError) -> PlanError {
    PlanError::Invalid(format!("{}: {e}", dir.join("config.json").display()))
}

/// Compiles an opened pipeline folder.
pub fn compile_pipeline(folder: &PipelineFolder, opts: &CompileOptions) -> Result<Compiled> {
    compile_inputs_impl(folder_inputs(folder, None)?, opts)
}

/// The inputs of a pipeline folder; `tokenizer_file` replaces its tokenizer folder.
pub(crate) fn folder_inputs<'a>(
    folder: &'a PipelineFolder,
    tokenizer_file: Option<&Path>,
) -> Result<Inputs<'a>> {
    Ok(Inputs {
        assumed: Vec::new(),
        name: folder_name(&folder.root),
        pipeline_class: folder.pipeline_class.clone(),
        family: family_of(folder)?,
        tok: match tokenizer_file {
            Some(p) => load_tokenizer_file(p)?,
            None => {
                tokenizer::load_tokenizer_dir(&folder.tokenizer_dir).map_err(LoadError::from)?
            }
        },
        sched: scheduler::load_scheduler_config(&folder.scheduler_config)
            .map_err(LoadError::from)?,
        t5_cfg: T5Config::from_json(&folder.text_encoder.config)
            .map_err(|e| cfg_err(&folder.text_encoder.dir, e))?,
        dit_cfg: PixArtConfig::from_json(&folder.transformer.config)
            .map_err(|e| cfg_err(&folder.transformer.dir, e))?,
        vae_cfg: VaeConfig::from_json(&folder.vae.config)
            .map_err(|e| cfg_err(&folder.vae.dir, e))?,
        t5: folder.text_encoder.tensors.as_ref(),
        dit: folder.transformer.tensors.as_ref(),
        vae: folder.vae.tensors.as_ref(),
    })
}

fn folder_name(root: &Path) -> String {
    root.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default()
}

pub(crate) fn compile_inputs_impl(inp: Inputs<'_>, opts: &CompileOptions) -> Result<Compiled> {
    if opts.sizes.is_empty() {
        return Err(PlanError::Invalid("no image size given (-W/-H)".into()));
    }
    let family = inp.family;
    let (t5_cfg, dit_cfg, vae_cfg) = (&inp.t5_cfg, &inp.dit_cfg, &inp.vae_cfg);
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

    let t5_graph = build_t5_encoder(t5_cfg, seq_len as usize)?;
    // Sizes are checked before any weight is read.
    let unit = downscale * patch;
    if let Some(&(w, h)) = opts
        .sizes
        .iter()
        .find(|&&(w, h)| w == 0 || h == 0 || w % unit != 0 || h % unit != 0 || w > 8192 || h > 8192)
    {
        return Err(PlanError::Invalid(format!(
            "image size {w}x{h}: width and height (-W/-H) must be positive multiples of {unit} (VAE factor {downscale} × patch {patch}), at most 8192"
        )));
    }
    let t5_src = SourceResolver::new(inp.t5).with_progress(opts.progress.clone());
    stages.push(lower(
        &t5_graph,
        StageKind::TextEncoder,
        0,
        0,
        &mut table,
        &t5_src,
        policy,
    )?);
    let vocab_rows = t5_cfg.vocab_size as u32;
    // Shorter encoders so that short prompts do not pay for padding (see `PlanMeta::text_buckets`).
    let mut text_buckets = Vec::new();
    for len in [16u32, 32, 64, 128] {
        if len < seq_len {
            let g = build_t5_encoder(t5_cfg, len as usize)?;
            text_buckets.push((len, stages.len() as u32));
            stages.push(lower(
                &g,
                StageKind::TextEncoder,
                0,
                0,
                &mut table,
                &t5_src,
                policy,
            )?);
        }
    }

    let denoiser_graph = |w: u32, h: u32| {
        let micro = match family {
            ModelFamily::PixArtAlpha => Some(MicroConditions {
                height_px: h as f32,
                width_px: w as f32,
            }),
            ModelFamily::PixArtSigma => None,
        };
        edge_models::build_pixart_denoiser_cached(
            dit_cfg,
            (h / downscale) as usize,
            (w / downscale) as usize,
            seq_len as usize,
            micro,
            opts.kv_cache,
        )
    };
    let cross_kv_graph =
        edge_models::build_pixart_cross_kv(dit_cfg, seq_len as usize, opts.kv_cache)?;
    let lora = if opts.loras.is_empty() {
        LoraMerge::default()
    } else {
        let (w, h) = opts.sizes[0];
        let layers = linear_layers(&[&cross_kv_graph, &denoiser_graph(w, h)?]);
        let files = opts
            .loras
            .iter()
            .map(|r| Ok((LoraFile::open(&r.path)?, r.multiplier)))
            .collect::<Result<Vec<_>>>()?;
        LoraMerge::bind(files, &layers)?
    };
    let dit_src = SourceResolver::new(inp.dit)
        .with_progress(opts.progress.clone())
        .with_lora(&lora);
    let mut notes: Vec<String> = Vec::new();
    let cross_kv_stage = Some(stages.len() as u32);
    stages.push(lower(
        &cross_kv_graph,
        StageKind::CrossKv,
        0,
        0,
        &mut table,
        &dit_src,
        policy,
    )?);
    let vae_src = SourceResolver::new(inp.vae).with_progress(opts.progress.clone());
    let tiny = opts
        .taesd
        .as_deref()
        .map(|p| open_tiny_vae(p, vae_cfg))
        .transpose()?;
    let tiny_src = tiny
        .as_ref()
        .map(|(_, src)| SourceResolver::new(src.as_ref()).with_progress(opts.progress.clone()));
    if let Some((cfg, src)) = &tiny {
        notes.push(format!(
            "tiny decoder: {} (AutoencoderTiny, {} latent channels, scaling factor {}; TAESD matches PixArt-α's SD VAE, TAESDXL PixArt-Σ's SDXL VAE)",
            src.describe(),
            cfg.latent_channels,
            cfg.scaling_factor
        ));
    }
    let mut sizes = Vec::new();
    for &(w, h) in &opts.sizes {
        let unit = downscale * patch;
        if w == 0 || h == 0 || w % unit != 0 || h % unit != 0 || w > 8192 || h > 8192 {
            return Err(PlanError::Invalid(format!(
                "image size {w}x{h}: width and height (-W/-H) must be positive multiples of {unit} (VAE factor {downscale} × patch {patch}), at most 8192"
            )));
        }
        if sizes
            .iter()
            .any(|s: &ImageSize| s.width == w && s.height == h)
        {
            continue;
        }
        let dit = denoiser_graph(w, h)?;
        let denoiser_stage = stages.len() as u32;
        stages.push(lower(
            &dit,
            StageKind::Denoiser,
            w,
            h,
            &mut table,
            &dit_src,
            policy,
        )?);
        // What the budget leaves the decoder: minus the headroom and the decoded image (the
        // conditions are freed before decoding; the exact tiles' held bytes are counted by
        // the tiling choice itself), as `edge_schema::memory::host_bytes_at` counts them.
        let host_fixed = edge_schema::memory::image_bytes(w, h);
        if let Some(b) = opts.max_ram.filter(|&b| b <= opts.headroom + host_fixed) {
            return Err(PlanError::Invalid(format!(
                "--max-ram {b} bytes: nothing is left once the planning headroom of {} bytes \
                 (--planning-headroom, default 128 MiB: what the process itself holds) and the \
                 {host_fixed}-byte decoded {w}x{h} image are taken off; give a larger --max-ram \
                 or a smaller --planning-headroom",
                opts.headroom
            )));
        }
        let budget_left = opts
            .max_ram
            .map(|b| b.saturating_sub(opts.headroom + host_fixed));
        let tiling = crate::decoder::plan_tiling(
            vae_cfg,
            w,
            h,
            downscale,
            &opts.tiling,
            budget_left,
            &mut notes,
        )?;
        let adjust = |g: &mut edge_graph::Graph| {
            if opts.vae_scale_factor.is_some() {
                override_vae_scale(g, scaling_factor);
            }
        };
        let (decoder_stage, decoder_tiling) = crate::decoder::lower_decoder(
            vae_cfg,
            w,
            h,
            downscale,
            tiling,
            &adjust,
            &mut stages,
            &mut table,
            &vae_src,
            policy,
        )?;
        let encoder = if !opts.vae_encoder {
            None
        } else if inp.vae.tensor("encoder.conv_in.weight")?.is_none() {
            if sizes.is_empty() {
                notes.push(format!(
                    "no VAE encoder: {} has no encoder weights (encoder.conv_in.weight), so the plan cannot encode init images (image to image)",
                    inp.vae.describe()
                ));
            }
            None
        } else {
            // What the budget leaves the encoder's arena and buffers: minus the headroom.
            let budget = opts.max_ram.map(|b| b.saturating_sub(opts.headroom));
            // The two conditions (T5 states and K/V caches) held while an init image is
            // encoded, as `edge_schema::memory::host_bytes_at` counts them.
            let out_bytes = |i: Option<u32>| -> u64 {
                i.and_then(|i| stages.get(i as usize))
                    .and_then(|st| st.outputs.first().map(|&o| &st.values[o as usize]))
                    .and_then(|v| v.byte_len())
                    .unwrap_or(0)
            };
            let conditions = 2 * (out_bytes(Some(0)) + out_bytes(cross_kv_stage));
            match crate::encoder::plan_encoder(
                vae_cfg,
                w,
                h,
                downscale,
                &opts.tiling,
                budget,
                conditions,
                &mut notes,
            )? {
                None => None,
                Some(p) => Some(crate::encoder::lower_encoder(
                    vae_cfg,
                    w,
                    h,
                    downscale,
                    p,
                    &mut stages,
                    &mut table,
                    &vae_src,
                    policy,
                )?),
            }
        };
        let (encoder_stage, encoder_tiling) = match encoder {
            Some((s, t)) => (Some(s), t),
            None => (None, None),
        };
        let tiny_decoder_stage = match (&tiny, &tiny_src) {
            (Some((cfg, _)), Some(src)) => {
                let g = edge_models::build_tiny_decoder(
                    cfg,
                    (h / downscale) as usize,
                    (w / downscale) as usize,
                )?;
                let idx = stages.len() as u32;
                stages.push(lower(
                    &g,
                    StageKind::TinyDecoder,
                    w,
                    h,
                    &mut table,
                    src,
                    policy,
                )?);
                Some(idx)
            }
            _ => None,
        };
        sizes.push(ImageSize {
            width: w,
            height: h,
            denoiser_stage,
            decoder_stage,
            decoder_tiling,
            encoder_stage,
            encoder_tiling,
            tiny_decoder_stage,
        });
    }
    let meta = PlanMeta {
        target: opts.target.clone(),
        model: ModelInfo {
            family,
            name: inp.name,
            pipeline_class: inp.pipeline_class,
            loras: lora.infos().to_vec(),
        },
        tokenizer: inp.tok,
        scheduler: inp.sched,
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
        text_buckets,
        cross_kv_stage,
        stages,
        tensors: vec![],
        sections: vec![],
        notes,
        budget: None,
        cuda: opts.cuda.clone(),
    };
    policy.check_rules_applied(&table.rules_applied)?;
    let mut meta = meta;
    meta.notes.splice(0..0, inp.assumed.iter().cloned());
    let encoder_compiled = meta.sizes.iter().any(|z| z.encoder_stage.is_some());
    meta.notes
        .extend(unused_notes(&t5_src, &dit_src, &vae_src, encoder_compiled));
    if opts.attention_bf16 {
        mark_attention_bf16(&mut meta)?;
    }
    if opts.activations_a7 {
        check_a7_target(&meta)?;
        let n = table.repack_a7(&meta.stages);
        if n == 0 {
            return Err(PlanError::Invalid(
                "--activation-bits 7: the denoiser has no Q8_0 linear weight of at least 8 rows \
                 to take 7-bit activations (compile with --quant q8_0, and no --quant-rule that \
                 gives its matrices another type)"
                    .into(),
            ));
        }
        meta.notes.push(format!(
            "--activation-bits 7: {n} Q8_0 linear weights of the denoiser in the AVX2 layout \
             with 7-bit activations (d = amax/63; the text encoder keeps 8-bit activations)"
        ));
    }
    table.repack_for_target(&meta.stages, &meta.target);
    if meta.target.isa == Isa::X86_64 {
        // Each AVX-512 layout the target names that no weight took: the plan still demands the
        // layout's CPU feature (an x86_64-avx512bf16 plan of q8_0 weights needs avx512bf16).
        for (dtype, layout) in crate::table::target_layouts(&meta.target) {
            if table.entries.iter().any(|e| e.layout == layout) {
                continue;
            }
            let (what, feature, hint) = match layout {
                PackLayout::Bf16Pairs16 => (
                    "the AVX512_BF16 pairs layout",
                    "avx512bf16",
                    "--quant bf16 gives BF16 matrices; compile with --target x86_64-avx512 to \
                     run it on AVX-512 VNNI CPUs without it",
                ),
                _ => (
                    "the AVX-512 VNNI layout",
                    "avx512vnni",
                    "compile with --target x86_64 to run it on any x86-64 CPU",
                ),
            };
            meta.notes.push(format!(
                "--target {}: no {dtype:?} linear weight to store in {what} (only such matrices \
                 of at least 16 rows are repacked); the plan still requires {feature} on an \
                 x86-64 host: {hint}",
                meta.target
            ));
        }
    }
    crate::budget::apply(
        &mut meta,
        &table.entries,
        opts.max_ram,
        opts.segments,
        opts.headroom,
    )?;
    Ok(Compiled { meta, table })
}

/// Opens `--taesd`: a diffusers `AutoencoderTiny` folder, or one weights file read with
/// TAESD's default config; checks that its latents are the VAE's.
///
/// Errors: [`PlanError::Invalid`] naming the path for a config that is not an
/// `AutoencoderTiny`'s, an original-layout TAESD file (`taesd_decoder.safetensors`), or
/// latents of another shape than `vae`'s; the readers' errors.
fn open_tiny_vae(
    path: &Path,
    vae: &VaeConfig,
) -> Result<(edge_models::TinyVaeConfig, Box<dyn TensorSource>)> {
    let bad = |why: String| PlanError::Invalid(format!("--taesd {}: {why}", path.display()));
    let (cfg, src): (edge_models::TinyVaeConfig, Box<dyn TensorSource>) = if path.is_dir() {
        let config_path = path.join("config.json");
        if !config_path.is_file() {
            return Err(bad(
                "no config.json (expected a diffusers AutoencoderTiny folder such as madebyollin/taesdxl, or one .safetensors file)".into(),
            ));
        }
        let json = crate::load::folder::read_json_config(&config_path)?;
        if let Some(c) = json.get("_class_name").and_then(serde_json::Value::as_str) {
            if c != "AutoencoderTiny" {
                return Err(bad(format!(
                    "config.json is an {c}'s; expected AutoencoderTiny (TAESD)"
                )));
            }
        }
        let cfg = edge_models::TinyVaeConfig::from_json(&json).map_err(|e| cfg_err(path, e))?;
        (cfg, open_safetensors_any(path)?)
    } else {
        let (src, _) = open_weights(path)?;
        let names = src.names();
        if !names.iter().any(|n| n.starts_with("decoder.layers.")) {
            let hint = if names.iter().any(|n| n == "1.weight") {
                "holds the original TAESD layout (taesd_decoder.safetensors, keys `1.weight`, `3.conv.0.weight`); give the diffusers version (madebyollin/taesd or madebyollin/taesdxl: config.json and diffusion_pytorch_model.safetensors)".to_string()
            } else {
                format!(
                    "no tensor `decoder.layers.0.weight` (an AutoencoderTiny's decoder); it holds {}",
                    names.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
                )
            };
            return Err(bad(hint));
        }
        let mut json = serde_json::json!({});
        if let Ok(Some(t)) = src.tensor("decoder.layers.0.weight") {
            if let [c, l, ..] = t.shape[..] {
                json = serde_json::json!({
                    "latent_channels": l,
                    "decoder_block_out_channels": [c, c, c, c],
                    "encoder_block_out_channels": [c, c, c, c],
                });
            }
        }
        let cfg = edge_models::TinyVaeConfig::from_json(&json).map_err(|e| cfg_err(path, e))?;
        (cfg, src)
    };
    if cfg.latent_channels != vae.latent_channels
        || cfg.downscale_factor() != vae.downscale_factor()
    {
        return Err(bad(format!(
            "its latents have {} channels at 1/{} scale, the VAE's {} at 1/{}: not a tiny autoencoder for this model",
            cfg.latent_channels,
            cfg.downscale_factor(),
            vae.latent_channels,
            vae.downscale_factor()
        )));
    }
    Ok((cfg, src))
}

/// The linear-layer weights of `graphs` (diffusers name of each part → `[out, in]`): what a
/// LoRA may adapt.
fn linear_layers(graphs: &[&edge_graph::Graph]) -> std::collections::BTreeMap<String, [u64; 2]> {
    let mut layers = std::collections::BTreeMap::new();
    for g in graphs {
        for v in &g.values {
            let edge_graph::Source::Weight(spec) = &v.source else {
                continue;
            };
            let (edge_graph::WeightKind::Matrix, [rows, cols]) = (spec.kind, v.shape.as_slice())
            else {
                continue;
            };
            let n = spec.parts.len().max(1) as u64;
            for p in &spec.parts {
                layers.insert(p.clone(), [rows / n, *cols]);
            }
        }
    }
    layers
}

/// Plan notes (warnings) for checkpoint tensors the graphs did not use, as diffusers warns
/// ("Some weights of the model checkpoint … were not used"): a config with fewer layers than
/// the weights, or a tensor under a misspelt name. Not reported: the VAE encoder and
/// `quant_conv` when the plan has no encoder stage, a T5 checkpoint's decoder and `lm_head`
/// (PixArt uses the encoder, as `T5EncoderModel` ignores them), and the second name of T5's
/// tied embedding (`shared.weight` / `encoder.embed_tokens.weight`).
fn unused_notes(
    t5: &SourceResolver<'_>,
    dit: &SourceResolver<'_>,
    vae: &SourceResolver<'_>,
    encoder_compiled: bool,
) -> Vec<String> {
    let t5_used = |n: &str| t5.was_used(n);
    let tied = ["shared.weight", "encoder.embed_tokens.weight"];
    let lists = [
        (
            "text encoder",
            t5,
            t5.unused(|n| {
                n.starts_with("decoder.")
                    || n == "lm_head.weight"
                    || (tied.contains(&n) && tied.iter().any(|t| t5_used(t)))
            }),
        ),
        ("transformer", dit, dit.unused(|_| false)),
        (
            "VAE",
            vae,
            vae.unused(|n| {
                !encoder_compiled && (n.starts_with("encoder.") || n.starts_with("quant_conv."))
            }),
        ),
    ];
    let mut notes = Vec::new();
    for (what, r, unused) in lists {
        if unused.is_empty() {
            continue;
        }
        const SHOWN: usize = 12;
        let more = if unused.len() > SHOWN {
            format!(", and {} more", unused.len() - SHOWN)
        } else {
            String::new()
        };
        notes.push(format!(
            "warning: {} {what} tensors of {} were not used by the model's config (a config with fewer layers than the weights, or names the model does not have): {}{more}",
            unused.len(),
            r.source.describe(),
            unused[..unused.len().min(SHOWN)].join(", ")
        ));
    }
    notes
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

/// Compiles `dir` and writes the plan to `out` atomically.
pub fn compile_to_file(dir: &Path, opts: &CompileOptions, out: &Path) -> Result<Compiled> {
    let c = compile_folder(dir, opts)?;
    write_compiled(c, out, &opts.progress)
}

/// [`compile_inputs`], then writes the plan to `out` atomically.
pub fn compile_inputs_to_file(
    dir: Option<&Path>,
    files: &ComponentFiles,
    opts: &CompileOptions,
    out: &Path,
) -> Result<Compiled> {
    let c = compile_inputs(dir, files, opts)?;
    write_compiled(c, out, &opts.progress)
}

/// Records the fallbacks as plan notes, assembles and writes atomically.
fn write_compiled(mut c: Compiled, out: &Path, progress: &ProgressHook) -> Result<Compiled> {
    let fallbacks: Vec<String> = c
        .table
        .fallbacks
        .iter()
        .map(|f| {
            format!(
                "{}: asked {}, stored {} ({})",
                f.tensor, f.asked, f.used, f.reason
            )
        })
        .collect();
    c.meta.notes.extend(fallbacks);
    crate::write::write_plan_reporting(&mut c.meta, &c.table, out, progress)?;
    Ok(c)
}
