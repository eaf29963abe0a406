//! From a diffusers PixArt pipeline folder to plan metadata and packed weights.

use std::path::{Path, PathBuf};

use edge_graph::WeightSpec;
use edge_models::config::{PixArtConfig, T5Config, VaeConfig};
use edge_models::infer;
use edge_models::pixart::MicroConditions;
use edge_models::t5::build_t5_encoder;
use edge_schema::plan::{
    ImageSize, Isa, ModelFamily, ModelInfo, PlanMeta, StageKind, Target, TextInfo, VaeInfo,
};
use edge_schema::DType;

use crate::budget::SegmentMode;
use crate::error::{PlanError, Result};
use crate::load::folder::PipelineFolder;
use crate::load::gguf::GgufFile;
use crate::load::original::OriginalLayout;
use crate::load::safetensors::open_safetensors_any;
use crate::load::{scheduler, tokenizer, LoadError, TensorSource};
use crate::lora::{LoraFile, LoraMerge, LoraRequest};
use crate::lower::{lower, LoadedWeight, TensorTable, WeightResolver};
use crate::pack::PackPolicy;
pub use crate::progress::{CompileProgress, ProgressHook};
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
        }
    }
}

/// A compiled plan before it is written: metadata (tensor and section tables not yet laid
/// out) and the packed tensors.
pub struct Compiled {
    pub meta: PlanMeta,
    pub table: TensorTable,
}

/// Resolves graph weights from one component's tensors (diffusers names), remembering which
/// tensors the graphs used (for [`SourceResolver::unused`]) and checking each once for
/// non-finite values.
pub struct SourceResolver<'a> {
    pub source: &'a dyn TensorSource,
    used: std::sync::Mutex<std::collections::BTreeSet<String>>,
    progress: ProgressHook,
    lora: Option<&'a crate::lora::LoraMerge>,
}

impl<'a> SourceResolver<'a> {
    /// A resolver over `source` that has used nothing yet.
    pub fn new(source: &'a dyn TensorSource) -> SourceResolver<'a> {
        SourceResolver {
            source,
            used: Default::default(),
            progress: ProgressHook::default(),
            lora: None,
        }
    }

    /// The resolver, merging `lora`'s updates into the weights it adapts.
    pub fn with_lora(mut self, lora: &'a crate::lora::LoraMerge) -> Self {
        self.lora = Some(lora);
        self
    }

    /// The resolver, reporting every weight it reads to `progress`.
    pub fn with_progress(mut self, progress: ProgressHook) -> Self {
        self.progress = progress;
        self
    }

    /// The source's tensors no graph asked for, sorted, leaving out those `ignored` accepts
    /// (parts of the checkpoint the plan does not contain by design).
    pub fn unused(&self, ignored: impl Fn(&str) -> bool) -> Vec<String> {
        let used = self.used.lock().map(|u| u.clone()).unwrap_or_default();
        self.source
            .names()
            .into_iter()
            .filter(|n| !used.contains(n) && !ignored(n))
            .collect()
    }

    /// Marks `names` used; true for those not used before (checked for finiteness then).
    fn first_use(&self, names: &[String]) -> bool {
        let Ok(mut used) = self.used.lock() else {
            return true;
        };
        let mut fresh = false;
        for n in names {
            fresh |= used.insert(n.clone());
        }
        fresh
    }

    /// Refuses a tensor holding NaN or infinity, naming the file, tensor and first index:
    /// sampling would otherwise diverge and blame the guidance scale.
    fn check_finite(&self, name: &str, t: &crate::load::RawTensor<'_>) -> Result<()> {
        let Some((i, v)) = first_non_finite(t) else {
            return Ok(());
        };
        Err(PlanError::Invalid(format!(
            "{}: tensor `{name}` (shape {:?}, {}) holds {v} at flat index {i}; weights must be finite",
            self.source.describe(),
            t.shape,
            t.dtype.name()
        )))
    }

    fn stored(&self, name: &str) -> String {
        match self.source.stored_name(name) {
            Some(s) => format!(" (stored as {s})"),
            None => String::new(),
        }
    }
}

impl WeightResolver for SourceResolver<'_> {
    /// Fused specs (several parts) are first asked of [`TensorSource::fused`], so a tensor
    /// stored fused (original PixArt `attn.qkv`) is served whole, in its stored type; else
    /// the parts are read one by one and concatenated along axis 0.
    ///
    /// Errors: [`PlanError::MissingWeight`] naming the missing tensor, the file, its stored
    /// name when it differs, and the expected shape; [`PlanError::WeightShape`] naming the part whose shape disagrees.
    fn resolve(&self, spec: &WeightSpec, shape: &[u64]) -> Result<LoadedWeight> {
        let w = self.resolve_quietly(spec, shape)?;
        let w = self.merge_lora(spec, w);
        self.progress.report(CompileProgress::Read {
            bytes: w.bytes.len() as u64,
        });
        Ok(w)
    }
}

impl SourceResolver<'_> {
    /// [`WeightResolver::resolve`] without the progress report.
    fn resolve_quietly(&self, spec: &WeightSpec, shape: &[u64]) -> Result<LoadedWeight> {
        let found_of = |t: &crate::load::RawTensor<'_>| -> Vec<u64> {
            t.shape.iter().map(|&d| d as u64).collect()
        };
        let shape_err =
            |name: String, found: Vec<u64>, expected: Vec<u64>| PlanError::WeightShape {
                tensor: name,
                source_desc: self.source.describe(),
                found,
                expected,
            };
        if spec.parts.is_empty() {
            return Err(PlanError::Internal("weight spec without parts".into()));
        }
        if spec.parts.len() > 1 {
            if let Some(t) = self.source.fused(&spec.parts)? {
                let found = found_of(&t);
                if found != shape {
                    // The fused tensor is stored whole: drop the part's row range.
                    let stored = self.stored(&spec.parts[0]);
                    let stored = match stored.split_once(" (rows part") {
                        Some((whole, _)) => format!("{whole})"),
                        None => stored,
                    };
                    let name = format!("{}{stored}", spec.parts.join(" + "));
                    return Err(shape_err(name, found, shape.to_vec()));
                }
                if self.first_use(&spec.parts) {
                    let stored = self.stored(&spec.parts[0]);
                    let stored = match stored.split_once(" (rows part") {
                        Some((whole, _)) => format!("{whole})"),
                        None => stored,
                    };
                    self.check_finite(&format!("{}{stored}", spec.parts.join(" + ")), &t)?;
                }
                return Ok(LoadedWeight {
                    dtype: t.dtype,
                    shape: shape.to_vec(),
                    bytes: t.data.to_vec(),
                    checkpoint_dtype: t.dtype,
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
            let t = self
                .source
                .tensor(name)?
                .ok_or_else(|| PlanError::MissingWeight {
                    tensor: name.clone(),
                    source_desc: format!(
                        "{}{}; expected shape {expected:?}",
                        self.source.describe(),
                        self.stored(name)
                    ),
                })?;
            let found = found_of(&t);
            if found != expected {
                return Err(shape_err(
                    format!("{name}{}", self.stored(name)),
                    found,
                    expected.clone(),
                ));
            }
            if self.first_use(std::slice::from_ref(name)) {
                self.check_finite(&format!("{name}{}", self.stored(name)), &t)?;
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
            checkpoint_dtype: dtype,
        })
    }

    /// Merges the LoRA updates of `spec`'s parts (each part's rows in turn) into `w`, in f32;
    /// `w` is returned unchanged when no part is adapted.
    fn merge_lora(&self, spec: &WeightSpec, w: LoadedWeight) -> LoadedWeight {
        let Some(lora) = self.lora else {
            return w;
        };
        if !spec.parts.iter().any(|p| lora.touches(p)) {
            return w;
        }
        let dims: Vec<usize> = w.shape.iter().map(|&d| d as usize).collect();
        let mut f = crate::load::to_f32(&crate::load::RawTensor {
            dtype: w.dtype,
            shape: dims,
            data: &w.bytes,
        });
        let part_len = f.len() / spec.parts.len().max(1);
        for (part, rows) in spec.parts.iter().zip(f.chunks_exact_mut(part_len.max(1))) {
            lora.apply(part, rows);
        }
        LoadedWeight {
            dtype: DType::F32,
            shape: w.shape,
            bytes: f.iter().flat_map(|x| x.to_le_bytes()).collect(),
            checkpoint_dtype: w.checkpoint_dtype,
        }
    }
}

/// The first value of `t` that is NaN or infinite, with its flat index (row-major); block
/// types are dequantized to find it (a NaN scale poisons its whole block).
fn first_non_finite(t: &crate::load::RawTensor<'_>) -> Option<(usize, f32)> {
    let bits16 = |exp_mask: u16, f: fn(u16) -> f32| {
        t.data
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .position(|h| h & exp_mask == exp_mask)
            .map(|i| {
                let c = &t.data[2 * i..2 * i + 2];
                (i, f(u16::from_le_bytes([c[0], c[1]])))
            })
    };
    match t.dtype {
        DType::F32 => t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .enumerate()
            .find(|(_, v)| !v.is_finite()),
        DType::F16 => bits16(0x7c00, |h| half::f16::from_bits(h).to_f32()),
        DType::BF16 => bits16(0x7f80, |h| half::bf16::from_bits(h).to_f32()),
        DType::I32 => None,
        _ => crate::load::to_f32(t)
            .into_iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite()),
    }
}

/// The family's display name.
fn family_name(f: ModelFamily) -> &'static str {
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

/// Whether `path` is a GGUF file (extension `.gguf` or the magic `GGUF`).
fn is_gguf(path: &Path) -> bool {
    if path
        .extension()
        .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// What a GGUF file's `pixart.*` metadata says about the transformer config.
#[derive(Clone, Debug, Default)]
struct GgufHints {
    heads: Option<usize>,
    sample_size: Option<usize>,
    interpolation_scale: Option<f64>,
    norm_eps: Option<f64>,
}

/// Opens one weights file: GGUF ([`GgufFile::open`]) or safetensors
/// ([`open_safetensors_any`]); original-layout PixArt names are presented under diffusers
/// names ([`OriginalLayout::wrap_if_original`]).
fn open_weights(path: &Path) -> Result<(Box<dyn TensorSource>, GgufHints)> {
    if is_gguf(path) {
        let f = GgufFile::open(path).map_err(LoadError::from)?;
        let count = |k: &str| f.get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
        let hints = GgufHints {
            heads: count("pixart.attention.head_count"),
            sample_size: count("pixart.sample_size"),
            interpolation_scale: f.get("pixart.interpolation_scale").and_then(|v| v.as_f64()),
            norm_eps: f.get("pixart.norm_eps").and_then(|v| v.as_f64()),
        };
        Ok((OriginalLayout::wrap_if_original(Box::new(f)), hints))
    } else {
        let src = open_safetensors_any(path)?;
        Ok((OriginalLayout::wrap_if_original(src), GgufHints::default()))
    }
}

fn load_tokenizer_file(path: &Path) -> Result<edge_schema::tokenizer::TokenizerSpec> {
    let json = path
        .extension()
        .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case("json"));
    let spec = if json {
        tokenizer::load_tokenizer_json(path)
    } else {
        tokenizer::load_spiece_model(path)
    };
    Ok(spec.map_err(LoadError::from)?)
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

/// Everything a plan is compiled from, whatever the files were.
struct Inputs<'a> {
    /// Values no file stated (folderless compiles), for the plan's notes.
    assumed: Vec<String>,
    name: String,
    pipeline_class: String,
    family: ModelFamily,
    tok: edge_schema::tokenizer::TokenizerSpec,
    sched: edge_schema::scheduler::SchedulerConfig,
    t5_cfg: T5Config,
    dit_cfg: PixArtConfig,
    vae_cfg: VaeConfig,
    t5: &'a dyn TensorSource,
    dit: &'a dyn TensorSource,
    vae: &'a dyn TensorSource,
}

fn cfg_err(dir: &Path, e: edge_models::config::ConfigError) -> PlanError {
    PlanError::Invalid(format!("{}: {e}", dir.join("config.json").display()))
}

/// Compiles an opened pipeline folder.
pub fn compile_pipeline(folder: &PipelineFolder, opts: &CompileOptions) -> Result<Compiled> {
    compile_inputs_impl(folder_inputs(folder, None)?, opts)
}

/// The inputs of a pipeline folder; `tokenizer_file` replaces its tokenizer folder.
fn folder_inputs<'a>(
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

fn compile_inputs_impl(inp: Inputs<'_>, opts: &CompileOptions) -> Result<Compiled> {
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
        let encoder_stage = if !opts.vae_encoder {
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
            let g = edge_models::build_vae_encoder(vae_cfg, h as usize, w as usize)?;
            let moments = 2
                * vae_cfg.latent_channels as u64
                * u64::from(h / downscale)
                * u64::from(w / downscale)
                * 4;
            let need = crate::lower::arena_estimate(&g, DType::F32)?
                + edge_schema::memory::image_bytes(w, h)
                + moments
                + opts.headroom;
            match opts.max_ram {
                Some(b) if need > b => {
                    notes.push(format!(
                        "no VAE encoder for {w}x{h}: its arena and buffers need {} MiB, more than --max-ram allows (tiled encoding is not built); image to image is unavailable at this size",
                        need.div_ceil(1 << 20)
                    ));
                    None
                }
                _ => {
                    let idx = stages.len() as u32;
                    stages.push(lower(
                        &g,
                        StageKind::VaeEncoder,
                        w,
                        h,
                        &mut table,
                        &vae_src,
                        policy,
                    )?);
                    Some(idx)
                }
            }
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
    };
    policy.check_rules_applied(&table.rules_applied)?;
    let mut meta = meta;
    meta.notes.splice(0..0, inp.assumed.iter().cloned());
    let encoder_compiled = meta.sizes.iter().any(|z| z.encoder_stage.is_some());
    meta.notes
        .extend(unused_notes(&t5_src, &dit_src, &vae_src, encoder_compiled));
    table.repack_for_target(&meta.stages, &meta.target);
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
    let t5_used = |n: &str| t5.used.lock().is_ok_and(|u| u.contains(n));
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
