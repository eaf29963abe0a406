//! The postcard-encoded plan metadata: target, model facts, tokenizer, scheduler, stages
//! (values, steps, segments, arena layout) and the weight-tensor table.
//!
//! Identity is by numeric index everywhere (values, tensors, sections, stages); names are kept
//! only for dumps and error messages.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::op::Op;
use crate::scheduler::SchedulerConfig;
use crate::tokenizer::TokenizerSpec;

/// The instruction set a plan's packs were laid out for, and the CPU features they need.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub isa: Isa,
    /// CPU features the packed layouts need (e.g. `dotprod`); empty for generic layouts.
    pub features: Vec<String>,
}

/// Instruction-set family of a [`Target`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Isa {
    /// Plain row-major packs that the generic kernels of every target understand.
    Generic,
    X86_64,
    Aarch64,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let isa = match self.isa {
            Isa::Generic => "generic",
            Isa::X86_64 => "x86_64",
            Isa::Aarch64 => "aarch64",
        };
        if self.features.is_empty() {
            write!(f, "{isa}")
        } else {
            write!(f, "{isa}+{}", self.features.join("+"))
        }
    }
}

/// Which PixArt variant the plan holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelFamily {
    /// PixArt-Σ: no micro-conditions, T5 sequence length 300 by default.
    PixArtSigma,
    /// PixArt-α: resolution and aspect-ratio micro-conditions, sequence length 120 by default.
    PixArtAlpha,
}

/// Facts about the compiled model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub family: ModelFamily,
    /// The pipeline folder's name or the model's `general.name`.
    pub name: String,
    /// The diffusers pipeline class (`PixArtSigmaPipeline`, `PixArtAlphaPipeline`).
    pub pipeline_class: String,
    /// LoRA adapters merged into the transformer's weights at plan time, in the order given.
    pub loras: Vec<LoraInfo>,
}

/// A LoRA merged at plan time (`edgeplan compile --lora FILE[:MULTIPLIER]`):
/// `W' = W + (B @ A) · multiplier · alpha / rank` for each adapted linear layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraInfo {
    /// The file's name (no directory: a plan does not record the workstation's paths).
    pub file: String,
    /// BLAKE3 of the file's bytes.
    pub blake3: [u8; 32],
    /// The user's strength (1 when not given).
    pub multiplier: f32,
    /// Key format: `peft` (lora_A/lora_B) or `kohya` (lora_down/lora_up/alpha).
    pub format: String,
    /// Number of adapted layers.
    pub layers: u32,
    /// The largest rank among them.
    pub rank: u32,
}

/// Facts about the text-encoder stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextInfo {
    /// Tokens per prompt after padding (300 for PixArt-Σ, 120 for PixArt-α by default).
    pub max_sequence_length: u32,
    /// Width of the encoder's hidden states (T5 `d_model`).
    pub hidden: u32,
    /// Rows of the embedding table; every token id must be below it.
    pub vocab_rows: u32,
}

/// Facts about the VAE.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VaeInfo {
    /// Latents are divided by this before decoding (`vae/config.json` `scaling_factor`).
    pub scaling_factor: f32,
    /// Channels of a latent (4 for SD/SDXL VAEs).
    pub latent_channels: u32,
    /// Image pixels per latent pixel along each axis (8).
    pub downscale: u32,
}

/// One image size the plan was compiled for, with the stages that serve it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageSize {
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// Index into [`PlanMeta::stages`] of the denoiser for this size.
    pub denoiser_stage: u32,
    /// Index into [`PlanMeta::stages`] of the VAE decoder for this size (the tile decoder
    /// when `decoder_tiling` is set).
    pub decoder_stage: u32,
    /// When set, the image is decoded tile by tile by the tile decoder `stage` (which then
    /// equals `decoder_stage`) instead of at once.
    pub decoder_tiling: Option<VaeTiling>,
    /// Index into [`PlanMeta::stages`] of the VAE encoder for this size (image to image), a
    /// `VaeEncoder` stage over the whole image (the window stage when `encoder_tiling` is set);
    /// `None` when the plan was compiled without it (`--no-vae-encoder`, or it did not fit the
    /// budget).
    pub encoder_stage: Option<u32>,
    /// When set, the image is encoded in exact tiles (see [`EncoderTiling`]) and
    /// `encoder_stage` is its `down_stage`.
    pub encoder_tiling: Option<EncoderTiling>,
    /// Index into [`PlanMeta::stages`] of the tiny decoder (TAESD, `edgeplan compile
    /// --taesd`) for this size: a `TinyDecoder` stage over the whole latent, for previews and
    /// `edgerun --decoder tae`.
    pub tiny_decoder_stage: Option<u32>,
}

/// A planned tiled VAE decode: the latent image is covered by tiles of
/// `tile_latent_w × tile_latent_h` latent pixels overlapping by `overlap_latent_*` latent
/// pixels; each tile is decoded by `stage` (a VAE decoder compiled for the tile size) and the
/// decoded tiles are blended linearly over their overlap (as stable-diffusion.cpp's
/// `sd_tiling` and diffusers' `AutoencoderKL.tiled_decode` do).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VaeTiling {
    /// Index into [`PlanMeta::stages`] of the tile decoder.
    pub stage: u32,
    /// Tile width in latent pixels.
    pub tile_latent_w: u32,
    /// Tile height in latent pixels.
    pub tile_latent_h: u32,
    /// Overlap between neighbouring tiles along x, in latent pixels (< tile width).
    pub overlap_latent_w: u32,
    /// Overlap between neighbouring tiles along y, in latent pixels (< tile height).
    pub overlap_latent_h: u32,
    /// When set, the tiles are exact: `stage` is a [`StageKind::VaeDecoderTail`] run on windows
    /// of `tile_latent_w × tile_latent_h` latent pixels whose GroupNorms use the whole image's
    /// statistics (see [`crate::tiles`]), the overlaps are 0 and nothing is blended.
    pub sync: Option<GroupNormSync>,
    /// When set (never with `sync`), the blended tiles' GroupNorms normalise with statistics
    /// estimated by a whole-image decode of a reduced latent instead of each tile's own.
    pub estimate: Option<StatsEstimate>,
}

/// GroupNorm statistics estimated from a lower-resolution whole-image pass (the approach of
/// the tiled-VAE extension `multidiffusion-upscaler-for-automatic1111`, `tilevae.py`'s fast
/// mode): the latent `[c, lh, lw]` is reduced to `[c, ⌈lh/factor⌉, ⌈lw/factor⌉]` by averaging
/// each `factor × factor` box (boxes cut by the border average the pixels they hold,
/// [`crate::tiles::reduce_latent`]), `stage` decodes it, and the mean and variance each of its
/// GroupNorms computes replace those of the tile decoder's GroupNorm of the same rank (the two
/// decoders have the same GroupNorms in the same order). The tiles are still blended and the
/// mid-block attention still sees only its tile, so the image is close to the whole-image
/// decode, not equal to it (measured bounds: `edge_schema::tiles::ESTIMATE_BOUND_LEVELS`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsEstimate {
    /// Index into [`PlanMeta::stages`] of the whole decoder ([`StageKind::VaeDecoder`]) for
    /// the reduced latent (its size is the reduced latent's times the VAE factor).
    pub stage: u32,
    /// Latent pixels per reduced-latent pixel along each axis, 2…64.
    pub factor: u32,
}

/// An exact tiled decode (see [`crate::tiles`]): the decoder's head runs on the whole latent,
/// its tail window by window, with every GroupNorm of the tail normalised by statistics of the
/// whole image held between the tail's intervals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupNormSync {
    /// Index into [`PlanMeta::stages`] of the decoder head (a [`StageKind::VaeDecoderHead`] for
    /// the whole image).
    pub head_stage: u32,
    /// Context a window carries around its core on every interior side, latent pixels; at
    /// least [`crate::tiles::required_halo`] of the tail stage.
    pub halo_latent: u32,
    /// The tail stage's GroupNorm steps, ascending: all of them.
    pub sync_steps: Vec<u32>,
    /// Where the whole-image activations between GroupNorms are held.
    pub held: HeldIn,
}

/// An exact tiled VAE encode (image to image at sizes whose whole-image encoder does not fit
/// the budget; see [`crate::tiles`]): the encoder's front (`conv_in` and the down blocks, local
/// operations and GroupNorms, stride-2 convolutions included) runs window by window with every
/// GroupNorm normalised by the whole image's statistics, its output is held as a whole latent,
/// and the back (mid block, output head, `quant_conv`) runs on it at once. The moments equal
/// the whole-image encode's bit for bit on the CPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncoderTiling {
    /// Index into [`PlanMeta::stages`] of the front, a [`StageKind::VaeEncoderDown`] for
    /// windows of `tile_latent_w × tile_latent_h` latent pixels.
    pub down_stage: u32,
    /// Index into [`PlanMeta::stages`] of the back, a [`StageKind::VaeEncoderMid`] for the
    /// whole latent.
    pub mid_stage: u32,
    /// Window width in latent pixels.
    pub tile_latent_w: u32,
    /// Window height in latent pixels.
    pub tile_latent_h: u32,
    /// Context a window carries around its core on every interior side, latent pixels; at
    /// least [`crate::tiles::required_halo`] of the front.
    pub halo_latent: u32,
    /// The front's GroupNorm steps, ascending: all of them.
    pub sync_steps: Vec<u32>,
    /// Where the whole-image activations between GroupNorms are held.
    pub held: HeldIn,
}

/// Where an exact tiled decode holds the activations that cross its GroupNorms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HeldIn {
    /// Host memory ([`crate::tiles::peak_held_bytes`] of them).
    Memory,
    /// A temporary file, read and written a band of rows at a time: the process holds only
    /// [`crate::tiles::spill_buffer_bytes`]; the file's pages are the kernel's page cache.
    File,
}

/// What a stage computes; fixes the meaning of its inputs and outputs.
///
/// | kind | inputs | outputs |
/// | --- | --- | --- |
/// | `TextEncoder` | `ids [l]` I32, `mask [l]` F32 (1 keep, 0 pad) | `hidden [l, d]` |
/// | `CrossKv` | `context [l, d_text]` | `kv [l, layers · 2 · d]` (every block's cross-attention keys and values) |
/// | `Denoiser` | `latent [c, h, w]`, `timestep [1]`, `context [l, d_text]` (or `kv` when the plan has a `CrossKv` stage), `mask [l]` | `eps [c, h, w]` |
/// | `VaeDecoder` | `latent [c, h, w]` (scaled latents, as the sampler produces them) | `image [3, H, W]` in about −1…1 |
/// | `VaeEncoder` | `image [3, H, W]` in −1…1 | `moments [2c, h, w]` |
/// | `VaeDecoderHead` | `latent [c, h, w]` (as `VaeDecoder`) | `hidden [C, h, w]` (the mid block's output) |
/// | `VaeDecoderTail` | `hidden [C, h, w]` (a window of the head's output) | `image [3, H, W]` (that window of the image) |
/// | `VaeEncoderDown` | `image [3, H, W]` (a window of the image, as `VaeEncoder`) | `hidden [C, h, w]` (that window of the down blocks' output) |
/// | `VaeEncoderMid` | `hidden [C, h, w]` (the whole down blocks' output) | `moments [2c, h, w]` (as `VaeEncoder`) |
/// | `TinyDecoder` | `latent [c, h, w]` (as `VaeDecoder`) | `image [3, H, W]` in about −1…1 (TAESD) |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StageKind {
    TextEncoder,
    CrossKv,
    Denoiser,
    VaeDecoder,
    VaeEncoder,
    VaeDecoderHead,
    VaeDecoderTail,
    TinyDecoder,
    VaeEncoderDown,
    VaeEncoderMid,
}

/// A slot in an arena: `len` bytes at `offset` of arena number `arena`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaSlice {
    /// Arena id (0 = host arena). Reserved for device arenas.
    pub arena: u32,
    /// Byte offset inside the arena.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl ArenaSlice {
    /// End offset, or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.len)
    }

    /// Whether the two slices share at least one byte of the same arena.
    pub fn overlaps(&self, other: &ArenaSlice) -> bool {
        self.arena == other.arena
            && self.len > 0
            && other.len > 0
            && self.offset < other.offset.saturating_add(other.len)
            && other.offset < self.offset.saturating_add(self.len)
    }
}

/// Where a value lives at run time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Storage {
    /// An intermediate, input or output in the arena.
    Arena(ArenaSlice),
    /// A weight: index into [`PlanMeta::tensors`].
    Weight(u32),
    /// Stage input `i` (the value `Stage::inputs[i]`), read where the caller keeps it and
    /// never copied into the arena: the K/V cache and the latents a denoiser reads at every
    /// step stay in the buffers the pipeline holds them in.
    Input(u32),
}

/// A tensor of a stage: its fact and its storage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueEntry {
    pub dtype: DType,
    /// Shape, outermost-first.
    pub shape: Vec<u64>,
    pub storage: Storage,
}

impl ValueEntry {
    /// Bytes of the value in its type (`None` when the shape is not a whole number of the
    /// type's blocks, or overflows).
    pub fn byte_len(&self) -> Option<u64> {
        self.dtype
            .bytes_for(self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?)
    }
}

/// One kernel invocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub op: Op,
    /// Value ids of the stage.
    pub inputs: Vec<u32>,
    /// Value ids of the stage (one output per step in format version 1).
    pub outputs: Vec<u32>,
    /// Planned scratch memory for kernels that need it (conv im2col, quantized activations).
    pub scratch: Option<ArenaSlice>,
}

/// A contiguous run of steps whose weights are stored contiguously in one section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// First step (inclusive).
    pub first_step: u32,
    /// One past the last step.
    pub end_step: u32,
    /// Where the cut came from (e.g. `transformer_blocks.3`), for dumps.
    pub label: String,
    /// Index into [`PlanMeta::sections`] of this segment's weights (`None` if it has none).
    pub section: Option<u32>,
}

/// A stage: a static graph cut into segments, with its arena layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    pub kind: StageKind,
    /// Image width in pixels (0 for the text encoder).
    pub width: u32,
    /// Image height in pixels (0 for the text encoder).
    pub height: u32,
    pub values: Vec<ValueEntry>,
    pub steps: Vec<Step>,
    pub segments: Vec<Segment>,
    /// Value ids of the inputs, in the order [`StageKind`] documents.
    pub inputs: Vec<u32>,
    /// Value ids of the outputs, in the order [`StageKind`] documents.
    pub outputs: Vec<u32>,
    /// Bytes of arena 0 this stage needs.
    pub arena_size: u64,
    /// The maximum over steps of the bytes of values live at that step (a lower bound for any
    /// arena layout).
    pub live_lower_bound: u64,
    /// Whether the planner chose segment-by-segment execution (weights streamed per segment)
    /// because the stage does not fit the budget monolithic.
    pub segmented: bool,
}

/// Weight layout inside a tensor's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PackLayout {
    /// Rows of the outermost-first shape, one after another (ggml blocks along each row).
    RowMajor,
    /// `Q8_0`/`Q4_0` matrices `[n, k]` (outermost-first) repacked for the aarch64 NEON kernels,
    /// which compute 4 weight rows at a time: rows `4g .. 4g+4` are stored together, block
    /// index by block index. For block `b` of group `g` the 4 blocks' f16 scales come first
    /// (row order, 8 bytes), then their quant bytes in 8-byte chunks, chunk `c` of row `r` at
    /// byte `8 + 8·(4c + r)` (4 chunks for `Q8_0`, 2 for `Q4_0`), so each 16-byte load holds
    /// two rows' chunk `c` — the 2×8 operand of `smmla` — and the 4 scales load as one vector
    /// (the idea of ggml's `block_q8_0x4` in `ggml-cpu/repack.cpp`). The last `n mod 4` rows
    /// follow row-major. Same byte length as [`PackLayout::RowMajor`]. Only `Linear` weights.
    Interleaved4x8,
    /// `Q8_0` matrices `[n, k]` (outermost-first) repacked for the x86-64 AVX-512 VNNI kernels,
    /// which compute 16 weight rows (output columns) in the 16 lanes of a zmm: rows
    /// `16g .. 16g+16` are stored together, block index by block index. For block `b` of group
    /// `g` (544 bytes at `(g·k/32 + b)·544`) the 16 rows' f16 scales come first (row order, 32
    /// bytes), then the quants in steps of 4: quant `4s + e` of row `r` at byte `32 + 64s + 4r
    /// + e`, so each 64-byte step is the signed operand of one `vpdpbusd` (the layout the
    /// kernels otherwise build at run time for every call). The last `n mod 16` rows follow
    /// row-major. Same byte length as [`PackLayout::RowMajor`]. Only `Linear` weights.
    Interleaved16x4,
    /// `BF16` matrices `[n, k]` (outermost-first, `k` even) for the x86-64 AVX512_BF16 kernels
    /// (`vdpbf16ps`), which compute 16 weight rows in the 16 lanes of a zmm: rows `16g .. 16g+16`
    /// are stored together, feature pair by feature pair: features `2s` and `2s + 1` of row `r`
    /// at bytes `32k·g + 64s + 4r` and `+ 2`, so each 64-byte step is one instruction's weight
    /// operand. The last `n mod 16` rows follow row-major. Same byte length as
    /// [`PackLayout::RowMajor`]. Only `Linear` weights.
    ///
    /// **This layout also sets the arithmetic** (unlike the others, which only move bytes): the
    /// activations are rounded to bf16 and each output is a sum of bf16 products taken a pair of
    /// features at a time, the instruction's own rounding (`edge_kernels::bf16dot`), so a plan
    /// with it computes other bits than the same weights row-major, on every CPU alike.
    Bf16Pairs16,
    /// `Q8_0` matrices `[n, k]` (outermost-first) for the x86-64 AVX2 kernels, which compute 8
    /// weight rows (output columns) in the 8 lanes of a ymm: rows `8g .. 8g+8` are stored
    /// together, block index by block index. For block `b` of group `g` (272 bytes at
    /// `(g·k/32 + b)·272`) the 8 rows' f16 scales come first (row order, 16 bytes), then the
    /// quants in steps of 4: quant `4s + e` of row `r` at byte `16 + 32s + 4r + e`. The last
    /// `n mod 8` rows follow row-major. Same byte length as [`PackLayout::RowMajor`]. Only
    /// `Linear` weights.
    ///
    /// **This layout also sets the arithmetic** (`edgeplan compile --activation-bits 7`): the
    /// activation rows multiplied with it are quantized to `Q8_0` blocks of 7-bit values
    /// (`d = amax / 63`, quants in −63..=63: `edge_kernels::quant::quantize_row_q8_0_a7`)
    /// instead of ggml's 8-bit ones; the block products and their f32 scaling are ggml's
    /// `vec_dot_q8_0_q8_0`. With 7-bit activations an AVX2 CPU multiplies by `vpmaddubsw`
    /// without its sign step (8-bit values can overflow its 16-bit pair sums). A plan with it
    /// computes other bits than the same weights row-major, on every CPU alike.
    Interleaved8x4A7,
}

/// A packed weight tensor in the weight region.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// Canonical name (for dumps only; identity is the index).
    pub name: String,
    pub dtype: DType,
    /// Shape, outermost-first.
    pub shape: Vec<u64>,
    pub layout: PackLayout,
    /// Index into [`PlanMeta::sections`].
    pub section: u32,
    /// Byte offset inside the section (a multiple of [`crate::header::TENSOR_ALIGN`]).
    pub offset: u64,
    /// Byte length (`dtype.bytes_for(elements)`).
    pub len: u64,
}

/// A page-aligned group of weights (one segment's), with its digest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SectionEntry {
    /// Byte offset relative to the weight region (a multiple of [`crate::header::SECTION_ALIGN`]).
    pub offset: u64,
    pub len: u64,
    /// BLAKE3 of the section's bytes.
    pub digest: [u8; 32],
}

/// Everything in a plan but the weight bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanMeta {
    pub target: Target,
    pub model: ModelInfo,
    pub tokenizer: TokenizerSpec,
    pub scheduler: SchedulerConfig,
    pub text: TextInfo,
    pub vae: VaeInfo,
    pub sizes: Vec<ImageSize>,
    /// Index into `stages` of the text encoder (full `max_sequence_length`).
    pub text_stage: u32,
    /// Shorter text encoders `(tokens, stage)`, ascending: a prompt whose tokens (with `</s>`)
    /// fit `tokens` is encoded by that stage, and the padded rows are left zero. The real
    /// tokens' states are bit-identical (padded keys get exactly zero attention weight), and
    /// the denoiser masks the padded rows out; the work on padding is not done at all.
    pub text_buckets: Vec<(u32, u32)>,
    /// Index into `stages` of the step-independent cross-attention K/V stage, run once per
    /// prompt; when set, denoisers take its output instead of the T5 states.
    pub cross_kv_stage: Option<u32>,
    pub stages: Vec<Stage>,
    pub tensors: Vec<TensorEntry>,
    pub sections: Vec<SectionEntry>,
    /// What the planner decided that differs from what was asked (type fallbacks), for
    /// `edgeplan inspect`.
    pub notes: Vec<String>,
    /// The memory budget (weights resident + arena, bytes) the plan was compiled for.
    pub budget: Option<u64>,
    /// CUDA kernels compiled ahead of time for the plan's GPU (`edgeplan compile --target
    /// cuda-sm87`); `None` for CPU-only plans. Covered by the metadata digest (and a
    /// signature) like everything else.
    pub cuda: Option<CudaModules>,
}

/// The CUDA kernels of a plan, compiled by the planner for one GPU architecture, so that the
/// device compiles nothing beyond the driver's own PTX assembly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaModules {
    /// The architecture they were compiled for: `sm_72` (Xavier), `sm_87` (Orin) or `sm_90`.
    pub arch: String,
    /// The compiler that made them, e.g. `NVRTC 12.6`.
    pub compiler: String,
    /// One module per kernel source, in the order of `edge_kernels_cuda::SOURCES`.
    pub modules: Vec<CudaModule>,
    /// The device memory budget the placement was planned for (`edgeplan --max-vram`), bytes.
    pub vram_budget: Option<u64>,
    /// Stages the device runs on its CPU cores instead of the GPU, by index: the text encoder
    /// when the budget cannot hold it beside the denoiser and the VAE (its weights then stay
    /// in the mapped plan and never reach the GPU).
    pub host_stages: Vec<u32>,
    /// Device bytes the GPU's stages need as planned: their weights (Q8_0 split for the
    /// tensor-core kernels), the largest of their arenas and the Q8_0 activation buffer.
    pub device_bytes: u64,
}

/// One compiled kernel source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaModule {
    /// The source's file name (`linear.cu`, …).
    pub name: String,
    /// BLAKE3 digest of the source text compiled: a runtime whose sources differ (another
    /// release, whose kernels may take other arguments) refuses the module.
    pub source_digest: [u8; 32],
    /// The PTX text.
    pub ptx: String,
}

impl PlanMeta {
    /// Decodes postcard bytes (no verification; see [`crate::verify`]).
    pub fn decode(bytes: &[u8]) -> crate::Result<PlanMeta> {
        postcard::from_bytes(bytes).map_err(|e| crate::Error::Decode(e.to_string()))
    }

    /// Encodes to postcard bytes.
    #[cfg(feature = "write")]
    pub fn encode(&self) -> crate::Result<Vec<u8>> {
        postcard::to_allocvec(self).map_err(|e| crate::Error::Decode(e.to_string()))
    }

    /// The size entry for `width × height` pixels.
    pub fn size(&self, width: u32, height: u32) -> Option<&ImageSize> {
        self.sizes
            .iter()
            .find(|s| s.width == width && s.height == height)
    }
}
