//! The parameter structs of the kernels whose geometry does not fit in a few integers
//! (convolution, attention) and the scratch sizes they imply: a leaf module that the kernels,
//! their argument contract ([`crate::contract`]) and the step decoding ([`crate::call`]) share.

use edge_schema::DType;

use crate::gemm::MAX_TILE_COLS;

/// Largest supported `head_dim` (the stack accumulator size). The VAE mid-block attention is
/// single-head with `head_dim = channels` (512 in the SD VAE used by PixArt).
pub const MAX_HEAD_DIM: usize = 512;
/// Where queries, keys and values lie in their source buffers, and the score formula.
///
/// Query of head `h` at row `i`: `q_src[i·q_stride + q_offset + h·head_dim ..][..head_dim]`;
/// key of row `j`: `kv_src[j·kv_stride + k_offset + h·head_dim ..]`; value likewise with
/// `v_offset`. A fused qkv projection `[L, 3D]` is read in place with strides `3D` and offsets
/// `0, D, 2D`; a fused kv projection `[L, 2D]` with stride `2D` and offsets `0, D`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query rows.
    pub lq: usize,
    /// Key/value rows (≥ 1).
    pub lk: usize,
    /// Heads.
    pub heads: usize,
    /// Elements per head (1..=[`MAX_HEAD_DIM`]).
    pub head_dim: usize,
    /// Multiplier of `q·k` (`1/√head_dim` for PixArt and the VAE, 1.0 for T5).
    pub scale: f32,
    /// Elements between consecutive query rows of `q_src`.
    pub q_stride: usize,
    /// Offset of head 0 within a query row.
    pub q_offset: usize,
    /// Elements between consecutive rows of `kv_src`.
    pub kv_stride: usize,
    /// Offset of head 0's key within a `kv_src` row.
    pub k_offset: usize,
    /// Offset of head 0's value within a `kv_src` row.
    pub v_offset: usize,
    /// Added to the score of a dropped key, times `1 − mask[j]` (−10000 in PixArt's cross
    /// attention, `f32::MIN` in T5).
    pub masked_value: f32,
}

impl AttentionParams {
    /// Query row `i` of head `h` in `q_src`, `[head_dim]`.
    #[inline]
    pub fn query_row<'a>(&self, q_src: &'a [f32], h: usize, i: usize) -> &'a [f32] {
        &q_src[i * self.q_stride + self.q_offset + h * self.head_dim..][..self.head_dim]
    }

    /// Key row `j` of head `h` in `kv_src`, `[head_dim]`.
    #[inline]
    pub fn key_row<'a>(&self, kv_src: &'a [f32], h: usize, j: usize) -> &'a [f32] {
        &kv_src[j * self.kv_stride + self.k_offset + h * self.head_dim..][..self.head_dim]
    }

    /// Value row `j` of head `h` in `kv_src`, `[head_dim]`.
    #[inline]
    pub fn value_row<'a>(&self, kv_src: &'a [f32], h: usize, j: usize) -> &'a [f32] {
        &kv_src[j * self.kv_stride + self.v_offset + h * self.head_dim..][..self.head_dim]
    }
}

/// Geometry of one 2-D convolution (torch `nn.Conv2d`, groups = 1, dilation = 1) with
/// zero padding that may differ per side (diffusers `Downsample2D` pads right 1, bottom 1 and
/// then convolves with padding 0 and stride 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Input channels.
    pub cin: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Vertical stride (≥ 1).
    pub stride_h: usize,
    /// Horizontal stride (≥ 1).
    pub stride_w: usize,
    /// Zero rows added above the input.
    pub pad_top: usize,
    /// Zero rows added below the input.
    pub pad_bottom: usize,
    /// Zero columns added left of the input.
    pub pad_left: usize,
    /// Zero columns added right of the input.
    pub pad_right: usize,
}

impl Conv2dParams {
    /// Output `(oh, ow)`: `(h + pad_top + pad_bottom − kh) / stride_h + 1` and likewise for the
    /// width (torch's formula with dilation 1). Panics if the kernel is larger than the padded
    /// input or a stride is 0.
    pub fn out_hw(&self) -> (usize, usize) {
        assert!(
            self.stride_h > 0 && self.stride_w > 0,
            "conv2d: stride must be ≥ 1: {self:?}"
        );
        let ph = self.h + self.pad_top + self.pad_bottom;
        let pw = self.w + self.pad_left + self.pad_right;
        assert!(
            ph >= self.kh && pw >= self.kw && self.kh > 0 && self.kw > 0,
            "conv2d: kernel {}x{} does not fit the padded input {ph}x{pw}",
            self.kh,
            self.kw
        );
        (
            (ph - self.kh) / self.stride_h + 1,
            (pw - self.kw) / self.stride_w + 1,
        )
    }

    /// Elements of one im2col row: `cin · kh · kw`.
    pub(crate) fn patch_len(&self) -> usize {
        self.cin * self.kh * self.kw
    }

    /// Bytes of the im2col tile: `pixel_tile` rounded up to [`MAX_TILE_COLS`] pixels (the
    /// packed panels of any tile), times `cin·kh·kw` f32.
    pub(crate) fn col_tile_bytes(&self) -> usize {
        self.pixel_tile().next_multiple_of(MAX_TILE_COLS) * self.patch_len() * 4
    }

    /// Output pixels per im2col tile: about 256 Ki floats (1 MiB) of scratch, a multiple of 64
    /// (the widest panel), at least 64, at most 256 and at most the number of output pixels.
    /// Depends on the shapes only. (64 Ki floats until 2026-12-01: the larger tile halves the
    /// driver's per-tile synchronisation, `kbench` in BENCHMARKS.md.)
    pub(crate) fn pixel_tile(&self) -> usize {
        let (oh, ow) = self.out_hw();
        let kk = self.patch_len().max(1);
        ((262_144 / kk) / MAX_TILE_COLS * MAX_TILE_COLS)
            .clamp(MAX_TILE_COLS, 256)
            .min(oh * ow)
            .max(1)
    }
}

/// Scratch bytes [`conv2d`] needs. Winograd shapes ([`crate::winograd_applies`]): the
/// transformed kernels (`16 · cout · cin` f32) and [`crate::PANEL_SLOTS`] slots of a block's
/// transformed patches (`16 · cin · 64` f32) and products (`16 · 64 · 64` f32). Else
/// [`direct_scratch_bytes`].
pub fn conv2d_scratch_bytes(p: &Conv2dParams, w_dtype: DType) -> usize {
    let direct = direct_scratch_bytes(p, w_dtype);
    if crate::winograd_applies(p) {
        crate::winograd::scratch_bytes(p)
    } else {
        direct
    }
}

/// Scratch bytes of [`conv2d`]'s direct (im2col) form: im2col tiles (`pixel_tile` rounded up to 64 pixels, times
/// `cin·kh·kw` f32; [`crate::PANEL_SLOTS`] of them from 8 output channels on, one per column
/// task, else one) plus, for `F16`/`BF16` weights, the weights converted to f32 (`cout ·
/// cin·kh·kw` f32).
pub(crate) fn direct_scratch_bytes(p: &Conv2dParams, w_dtype: DType) -> usize {
    let kk = p.patch_len();
    let weights = match w_dtype {
        DType::F32 => 0,
        DType::F16 | DType::BF16 => p.cout * kk * 4,
        other => panic!("conv2d_scratch_bytes: weights of type {other:?} are not supported"),
    };
    weights + p.col_tile_bytes() * crate::gemm::scratch_slots(p.cout)
}
