//! `generic_conv2d_f32`: 2-D convolution as tiled im2col + the f32 dot tile.

use edge_schema::DType;
use rayon::prelude::*;
use zerocopy::IntoBytes;

use crate::contract;
use crate::gemm::{
    column_tasks, gemm, gemm_column_tasks, scratch_slots, Bias, F32Tile, GENERIC_TILE, PANEL_SLOTS,
};
use crate::params::direct_scratch_bytes;
pub use crate::params::{conv2d_scratch_bytes, Conv2dParams};
use crate::weights::{convert_row, f32_view, f32_view_mut, WeightRef};
use crate::winograd;
pub use crate::winograd::{winograd_applies, WINOGRAD_MIN_CHANNELS};

/// `generic_conv2d_f32`: `out[co, oy, ox] = bias[co] + Σ_{ci,ky,kx} w[co, ci, ky, kx] ·
/// xpad[ci, oy·stride_h + ky, ox·stride_w + kx]` (torch `nn.Conv2d`, groups 1, dilation 1),
/// where `xpad` is `x` with `pad_top/bottom/left/right` zero rows and columns.
///
/// Shapes: `x` `[cin, h, w]`, `w` `[cout, cin, kh, kw]` (`F32`, `F16` or `BF16`), `bias`
/// `[cout]`, `out` `[cout, oh, ow]` with `(oh, ow) = p.out_hw()`. `scratch` holds at least
/// [`conv2d_scratch_bytes`] bytes, 4-byte aligned; nothing is allocated.
///
/// Method: 3×3 kernels with stride 1 and at least [`WINOGRAD_MIN_CHANNELS`] input channels
/// ([`winograd_applies`]: the VAE's convolutions but its first) by Winograd F(2×2, 3×3), 2.25 times
/// fewer multiply-adds, in the order its module doc states (`winograd.rs`). Every other shape
/// directly ([`conv2d_direct`]): output pixels in tiles, each tile's patches unfolded (im2col)
/// into `scratch` in the GEMM driver's packed panel layout (pixels of a panel side by side,
/// patch elements in `(ci, ky, kx)` order), every output element the driver's f32 dot product
/// (one fused multiply-add per patch element in that order, from `0.0`) of a weight row and a
/// patch, plus the bias; this beat a shift-and-accumulate loop in `examples/kbench.rs`. Either
/// way bit-identical for any thread count and on every CPU target.
pub fn conv2d(
    p: &Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    conv2d_with(&GENERIC_TILE, p, x, w, bias, out, scratch)
}

/// [`conv2d`] with the f32 register tile `tile` of the shared blocked GEMM driver (the SIMD
/// crates pass their own [`F32Tile`]): same shapes, scratch, checks and bits as [`conv2d`].
pub fn conv2d_with(
    tile: &F32Tile,
    p: &Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    let wrow = contract::conv2d(p, x, w, bias, out, scratch.len());
    if winograd_applies(p) {
        return winograd::conv2d(tile, p, x, w, bias, out, scratch);
    }
    direct(tile, p, x, w, wrow, bias, out, scratch)
}

/// The direct (im2col) order of [`conv2d`] for every shape, Winograd's included: the twin of
/// the CUDA `edge_conv2d` kernel (`kernels/cuda/tests/twins.rs`). Same shapes and errors as
/// [`conv2d`]; allocates its own scratch.
pub fn conv2d_direct(
    p: &Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let wrow = contract::conv2d(p, x, w, bias, out, usize::MAX);
    let mut scratch = vec![0f32; direct_scratch_bytes(p, w.dtype).div_ceil(4)];
    direct(
        &GENERIC_TILE,
        p,
        x,
        w,
        wrow,
        bias,
        out,
        scratch.as_mut_bytes(),
    )
}

#[allow(clippy::too_many_arguments)]
fn direct(
    tile: &F32Tile,
    p: &Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    wrow: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    let (oh, ow) = p.out_hw();
    let kk = p.patch_len();
    let npix = oh * ow;
    let need = direct_scratch_bytes(p, w.dtype);
    if p.cout == 0 || npix == 0 {
        return;
    }
    if kk == 0 {
        for (co, row) in out.chunks_mut(npix).enumerate() {
            row.fill(bias.map_or(0.0, |b| b[co]));
        }
        return;
    }

    let (wbuf, colbuf) = scratch.split_at_mut(need - p.col_tile_bytes() * scratch_slots(p.cout));
    let wf: &[f32] = match w.dtype {
        DType::F32 => f32_view(w.bytes, "conv2d weight (F32)"),
        _ => {
            let dst = f32_view_mut(wbuf, "conv2d scratch");
            dst.par_chunks_mut(kk).enumerate().for_each(|(co, row)| {
                convert_row(w.dtype, &w.bytes[co * wrow..(co + 1) * wrow], row);
            });
            dst
        }
    };
    let pt = p.pixel_tile();
    let tc = tile.cols;
    let b = bias.map_or(Bias::None, Bias::PerRow);
    let slots = (colbuf.len() / p.col_tile_bytes()).min(PANEL_SLOTS);
    if column_tasks(
        p.cout,
        npix.div_ceil(pt),
        slots,
        rayon::current_num_threads(),
    ) {
        // Column tasks (`gemm_column_tasks`): each unfolds its own pixel tile and runs every
        // output channel over it.
        let slots = f32_view_mut(&mut colbuf[..slots * p.col_tile_bytes()], "conv2d scratch");
        let fill = |j0: usize, nb: usize, panels: &mut [f32]| {
            for (pi, panel) in panels.chunks_mut(kk * tc).enumerate() {
                im2col_panel(p, x, j0 + pi * tc, (nb - pi * tc).min(tc), 0, panel, tc);
            }
        };
        return gemm_column_tasks(
            tile,
            wf,
            p.cout,
            kk,
            npix,
            pt,
            slots,
            fill,
            |_, _| b,
            None,
            out,
        );
    }
    let col = f32_view_mut(&mut colbuf[..p.col_tile_bytes()], "conv2d scratch");
    for p0 in (0..npix).step_by(pt) {
        let np = pt.min(npix - p0);
        let panels = &mut col[..np.div_ceil(tc) * kk * tc];
        for (pi, panel) in panels.chunks_mut(kk * tc).enumerate() {
            let (pix0, nl) = (p0 + pi * tc, (np - pi * tc).min(tc));
            panel
                .par_chunks_mut(IM2COL_ELEMS * tc)
                .enumerate()
                .for_each(|(ei, rows)| im2col_panel(p, x, pix0, nl, ei * IM2COL_ELEMS, rows, tc));
        }
        gemm(tile, wf, p.cout, kk, panels, np, p0, npix, b, None, out);
    }
}

/// Patch elements per im2col task.
const IM2COL_ELEMS: usize = 128;

/// Writes patch elements `e0 ..` (as many as `rows` holds rows of `tc` lanes) of output pixels
/// `pix0 .. pix0 + nl` into rows of a packed panel: `rows[(e − e0)·tc + l]` is patch element `e`
/// (in `(ci, ky, kx)` order) of pixel `pix0 + l`, zero outside the input and in the lanes
/// `nl..tc`. The lanes of one output row read one input row: with stride 1 a contiguous run
/// (copied whole, zeros where it leaves the input), else every `stride_w`-th value.
fn im2col_panel(
    p: &Conv2dParams,
    x: &[f32],
    pix0: usize,
    nl: usize,
    e0: usize,
    rows: &mut [f32],
    tc: usize,
) {
    let (_, ow) = p.out_hw();
    let khw = p.kh * p.kw;
    for (r, dst) in rows.chunks_mut(tc).enumerate() {
        let e = e0 + r;
        let (ci, kyx) = (e / khw, e % khw);
        let (ky, kx) = (kyx / p.kw, kyx % p.kw);
        let plane = &x[ci * p.h * p.w..(ci + 1) * p.h * p.w];
        let mut l = 0;
        while l < nl {
            let (oy, ox) = ((pix0 + l) / ow, (pix0 + l) % ow);
            let run = (ow - ox).min(nl - l);
            let lanes = &mut dst[l..l + run];
            match (oy * p.stride_h + ky).checked_sub(p.pad_top) {
                Some(iy) if iy < p.h => {
                    let src = &plane[iy * p.w..(iy + 1) * p.w];
                    // Input column of lane j: ox·stride + kx + j·stride − pad_left.
                    let base = ox * p.stride_w + kx;
                    if p.stride_w == 1 {
                        // Lanes before the input (base + j < pad_left), inside, after it.
                        let lead = p.pad_left.saturating_sub(base).min(run);
                        let first = (base + lead).saturating_sub(p.pad_left);
                        let inside = if lead < run {
                            p.w.saturating_sub(first).min(run - lead)
                        } else {
                            0
                        };
                        lanes[..lead].fill(0.0);
                        if inside > 0 {
                            lanes[lead..lead + inside].copy_from_slice(&src[first..first + inside]);
                        }
                        lanes[lead + inside..].fill(0.0);
                    } else {
                        for (j, d) in lanes.iter_mut().enumerate() {
                            *d = match (base + j * p.stride_w).checked_sub(p.pad_left) {
                                Some(ix) if ix < p.w => src[ix],
                                _ => 0.0,
                            };
                        }
                    }
                }
                _ => lanes.fill(0.0),
            }
            l += run;
        }
        dst[nl..].fill(0.0);
    }
}
