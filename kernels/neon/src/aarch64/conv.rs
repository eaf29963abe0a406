//! `neon_conv2d_f32_4x4`: 2-D convolution (torch `nn.Conv2d`, groups 1, dilation 1, zero
//! padding per side as diffusers `Downsample2D` needs) as tiled im2col + the NEON f32 dot tile
//! of `neon_linear_f32_4x4`.
//!
//! Method (the generic kernel's, [`edge_kernels::conv2d`]): output pixels are processed in tiles
//! of `pixel_tile` pixels, as many as the generic kernel's scratch holds (derived from
//! [`edge_kernels::conv2d_scratch_bytes`], so this kernel never needs more scratch). Each tile's
//! patches are unfolded (im2col) into scratch as rows of `cin·kh·kw` in `(ci, ky, kx)` order;
//! then every output element `out[co, pix]` is the dot product of weight row `co` and patch row
//! `pix` computed by [`super::dense::dot_tile_f32`] in 4 pixels × 4 channels register tiles
//! (four f32 lanes, fused multiply-add over `k` in steps of 4, `faddv`, the `k % 4` tail fused),
//! plus `bias[co]`. `F16`/`BF16` weights are first converted exactly to f32 rows in scratch
//! (the part of the generic scratch reserved for that); `F32` weights are read in place.
//!
//! im2col rather than a direct loop: the dot tile's inner loop is 8 `ldr q` + 16 `fmla` per 4
//! `k` (no spills, 24 of 32 vector registers), unit-stride loads from rows that stay in cache
//! across a whole tile; im2col costs `cin·kh·kw` copies per pixel against `cout·cin·kh·kw`
//! multiply-adds, i.e. 1/cout of the arithmetic. A direct loop needs padding and stride cases
//! inside its inner loop.
//!
//! Work split: each pixel tile is unfolded in parallel over pixels, then its products are
//! computed in parallel over a grid of output-channel blocks × pixel blocks (the block sizes
//! depend on the shapes only). Every output element is one dot product in a fixed order, so
//! results are bit-identical for any thread count; they differ from the generic kernel (eight
//! unfused lanes) by f32 rounding only.

use std::arch::aarch64::{vcvt_f32_f16, vld1_u16, vreinterpret_f16_u16, vst1q_f32};
use std::marker::PhantomData;

use edge_kernels::quant::{dequantize_row, fp16_to_fp32};
use edge_kernels::{Conv2dParams, WeightRef};
use edge_schema::DType;
use rayon::prelude::*;

use super::dense::dot_tile_f32;

/// Pixels (patch rows) per register tile.
const TILE_P: usize = 4;
/// Output channels (weight rows) per register tile.
const TILE_CO: usize = 4;
/// Pixels per task in the product grid.
const PIX_BLOCK: usize = 32;
/// Patch elements per im2col task, at least.
const IM2COL_TASK: usize = 4096;

/// `neon_conv2d_f32_4x4`: the contract of [`edge_kernels::conv2d`]: `out[co, oy, ox] =
/// bias[co] + Σ_{ci,ky,kx} w[co, ci, ky, kx] · xpad[ci, oy·stride_h + ky, ox·stride_w + kx]`.
///
/// Shapes: `x` `[cin, h, w]`, `w` `[cout, cin, kh, kw]`, `bias` `[cout]`, `out` `[cout, oh, ow]`
/// with `(oh, ow) = p.out_hw()`; `scratch` at least [`edge_kernels::conv2d_scratch_bytes`]
/// bytes, 4-byte aligned. `F32`, `F16` and `BF16` weights run here; any other type goes to the
/// generic kernel (which rejects it). The same checks and panic messages as the generic kernel.
pub(super) fn conv2d(
    p: &Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    // Other types and layouts: the generic kernel converts them or refuses them.
    if !matches!(w.dtype, DType::F32 | DType::F16 | DType::BF16)
        || w.layout != edge_schema::plan::PackLayout::RowMajor
    {
        return edge_kernels::conv2d(p, x, w, bias, out, scratch);
    }
    let wrow = edge_kernels::contract::conv2d(p, x, w, bias, out, scratch.len());
    let (oh, ow) = p.out_hw();
    let kk = p.cin * p.kh * p.kw;
    let npix = oh * ow;
    let need = edge_kernels::conv2d_scratch_bytes(p, w.dtype);
    if p.cout == 0 || npix == 0 {
        return;
    }
    if kk == 0 {
        for (co, row) in out.chunks_mut(npix).enumerate() {
            row.fill(bias.map_or(0.0, |b| b[co]));
        }
        return;
    }

    // The generic scratch: converted weights (F16/BF16 only), then one im2col tile of
    // `pixel_tile · kk` f32, which is exactly `conv2d_scratch_bytes(p, F32)`.
    let tile_bytes = edge_kernels::conv2d_scratch_bytes(p, DType::F32);
    let pixel_tile = tile_bytes / (kk * 4);
    let (wbuf, colbuf) = scratch[..need].split_at_mut(need - tile_bytes);
    let wf: &[f32] = match w.dtype {
        DType::F32 => f32_view(w.bytes, "conv2d weight (F32)"),
        dtype => {
            let dst = f32_view_mut(wbuf, "conv2d scratch");
            dst.par_chunks_mut(kk).enumerate().for_each(|(co, row)| {
                let src = &w.bytes[co * wrow..(co + 1) * wrow];
                match dtype {
                    DType::F16 => f16_row_to_f32(src, row),
                    _ => dequantize_row(dtype, src, row),
                }
            });
            dst
        }
    };
    let col = f32_view_mut(colbuf, "conv2d scratch");
    let shared = SharedOut::new(out);
    for p0 in (0..npix).step_by(pixel_tile) {
        let np = pixel_tile.min(npix - p0);
        let tile = &mut col[..np * kk];
        tile.par_chunks_mut(kk)
            .with_min_len(IM2COL_TASK.div_ceil(kk))
            .enumerate()
            .for_each(|(r, patch)| {
                let pix = p0 + r;
                im2col_patch(p, x, pix / ow, pix % ow, patch);
            });
        products(wf, p.cout, kk, tile, np, p0, npix, bias, &shared);
    }
}

/// Output channels per task in the product grid: a multiple of [`TILE_CO`] from 4 to 64,
/// about `cout / 16` (a function of `cout` only).
fn channel_block(cout: usize) -> usize {
    cout.div_ceil(16)
        .next_multiple_of(TILE_CO)
        .clamp(TILE_CO, 64)
}

/// `out[co, p0 + q] = dot(wf[co], cols[q]) + bias[co]` for every `co < cout`, `q < np`.
///
/// `wf` is `[cout, kk]`, `cols` `[np, kk]` (one im2col tile), `out` `[cout, npix]`. Parallel
/// over blocks of [`channel_block`] channels × [`PIX_BLOCK`] pixels; each task writes only its
/// own block.
fn products(
    wf: &[f32],
    cout: usize,
    kk: usize,
    cols: &[f32],
    np: usize,
    p0: usize,
    npix: usize,
    bias: Option<&[f32]>,
    out: &SharedOut<'_>,
) {
    let cb = channel_block(cout);
    let (nbc, nbp) = (cout.div_ceil(cb), np.div_ceil(PIX_BLOCK));
    (0..nbc * nbp).into_par_iter().for_each(|task| {
        let (c_lo, q_lo) = ((task / nbp) * cb, (task % nbp) * PIX_BLOCK);
        let (c_hi, q_hi) = ((c_lo + cb).min(cout), (q_lo + PIX_BLOCK).min(np));
        for c0 in (c_lo..c_hi).step_by(TILE_CO) {
            let nc = TILE_CO.min(c_hi - c0);
            let ws: [&[f32]; TILE_CO] = std::array::from_fn(|c| {
                let co = c0 + c.min(nc - 1);
                &wf[co * kk..(co + 1) * kk]
            });
            for q0 in (q_lo..q_hi).step_by(TILE_P) {
                let nq = TILE_P.min(q_hi - q0);
                let xs: [&[f32]; TILE_P] = std::array::from_fn(|r| {
                    let q = q0 + r.min(nq - 1);
                    &cols[q * kk..(q + 1) * kk]
                });
                let t = match nc {
                    1 => widen(dot_tile_f32::<TILE_P, 1>(xs, [ws[0]], kk)),
                    2 => widen(dot_tile_f32::<TILE_P, 2>(xs, [ws[0], ws[1]], kk)),
                    3 => widen(dot_tile_f32::<TILE_P, 3>(xs, [ws[0], ws[1], ws[2]], kk)),
                    _ => dot_tile_f32::<TILE_P, TILE_CO>(xs, ws, kk),
                };
                for c in 0..nc {
                    let co = c0 + c;
                    let b = bias.map(|b| b[co]);
                    for r in 0..nq {
                        let s = t[r][c];
                        // SAFETY: (co, pixel) lies in this task's channel × pixel block; the
                        // blocks of `products` are disjoint, so no other task writes it.
                        unsafe { out.write(co * npix + p0 + q0 + r, b.map_or(s, |b| s + b)) };
                    }
                }
            }
        }
    });
}

/// A `[TILE_P, C]` tile padded with zeros to `[TILE_P, TILE_CO]` columns.
#[inline(always)]
fn widen<const C: usize>(t: [[f32; C]; TILE_P]) -> [[f32; TILE_CO]; TILE_P] {
    t.map(|row| std::array::from_fn(|c| if c < C { row[c] } else { 0.0 }))
}

/// The output tensor shared by the tasks of [`products`], each of which writes a disjoint set
/// of elements.
struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: `SharedOut` holds the mutable borrow of `out` for its lifetime `'a`; tasks only
// write, each to elements no other task writes (see `write`).
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    /// Borrows `out` mutably for as long as the returned value lives.
    fn new(out: &'a mut [f32]) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _out: PhantomData,
        }
    }

    /// Stores `v` at element `i` (bounds-checked).
    ///
    /// # Safety
    /// No other thread reads or writes element `i` while this call runs (every element is
    /// written by exactly one task).
    #[inline(always)]
    unsafe fn write(&self, i: usize, v: f32) {
        assert!(i < self.len, "conv2d: output index {i} of {}", self.len);
        // SAFETY: `i < len` (asserted), `ptr` is the start of the `out` slice borrowed mutably
        // for `'a`, and the caller guarantees no other thread touches element `i`.
        unsafe { self.ptr.add(i).write(v) };
    }
}

/// Writes the `(ci, ky, kx)` patch of output pixel `(oy, ox)` into `patch` (zeros outside the
/// input): the generic kernel's im2col, with the in-range part of each kernel row copied as one
/// contiguous run (dilation 1 makes `ix` consecutive in `kx` for any stride).
fn im2col_patch(p: &Conv2dParams, x: &[f32], oy: usize, ox: usize, patch: &mut [f32]) {
    debug_assert_eq!(patch.len(), p.cin * p.kh * p.kw);
    // Kernel columns kx in kx_lo..kx_hi read ix = ox·stride_w + kx − pad_left in 0..w.
    let x0 = ox * p.stride_w;
    let kx_lo = p.pad_left.saturating_sub(x0).min(p.kw);
    let kx_hi = (p.w + p.pad_left).saturating_sub(x0).clamp(kx_lo, p.kw);
    let ix_lo = (x0 + kx_lo).saturating_sub(p.pad_left);
    let plane_len = p.h * p.w;
    for (ci, pc) in patch.chunks_mut(p.kh * p.kw).enumerate() {
        let plane = &x[ci * plane_len..(ci + 1) * plane_len];
        for (ky, dst) in pc.chunks_mut(p.kw).enumerate() {
            let iy = (oy * p.stride_h + ky)
                .checked_sub(p.pad_top)
                .filter(|&iy| iy < p.h);
            match iy {
                None => dst.fill(0.0),
                Some(iy) => {
                    let row = &plane[iy * p.w..(iy + 1) * p.w];
                    dst[..kx_lo].fill(0.0);
                    if kx_hi > kx_lo {
                        dst[kx_lo..kx_hi].copy_from_slice(&row[ix_lo..][..kx_hi - kx_lo]);
                    }
                    dst[kx_hi..].fill(0.0);
                }
            }
        }
    }
}

/// Converts one row of little-endian IEEE half values to f32 (exact), four at a time with
/// `fcvtl`.
fn f16_row_to_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    assert_eq!(src.len(), 2 * n, "conv2d: F16 row of {} bytes", src.len());
    let full = n - n % 4;
    for i in (0..full).step_by(4) {
        // SAFETY: i + 4 <= n, so `src` holds 8 bytes at 2i and `dst` 4 values at i; `ld1` and
        // `st1` have no alignment requirement; NEON (with `fcvtl`) is baseline on aarch64.
        unsafe {
            let h = vld1_u16(src.as_ptr().add(2 * i).cast::<u16>());
            vst1q_f32(
                dst.as_mut_ptr().add(i),
                vcvt_f32_f16(vreinterpret_f16_u16(h)),
            );
        }
    }
    for i in full..n {
        dst[i] = fp16_to_fp32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
    }
}

/// Views `bytes` as f32 values; panics naming `what` (as the generic kernel does) if they are
/// not 4-byte aligned or not a multiple of 4 bytes.
fn f32_view<'a>(bytes: &'a [u8], what: &str) -> &'a [f32] {
    // SAFETY: every bit pattern is a valid f32; `align_to` only reinterprets the aligned middle.
    let (head, mid, tail) = unsafe { bytes.align_to::<f32>() };
    assert!(
        head.is_empty() && tail.is_empty(),
        "{what}: {} bytes at address {:p} cannot be viewed as f32 (must be 4-byte aligned and a \
         multiple of 4 bytes; plan sections are 64-byte aligned)",
        bytes.len(),
        bytes.as_ptr()
    );
    mid
}

/// Mutable twin of [`f32_view`] for scratch memory.
fn f32_view_mut<'a>(bytes: &'a mut [u8], what: &str) -> &'a mut [f32] {
    let (len, ptr) = (bytes.len(), bytes.as_ptr());
    // SAFETY: every bit pattern is a valid f32 and every f32 is valid bytes; `align_to_mut`
    // only reinterprets the aligned middle.
    let (head, mid, tail) = unsafe { bytes.align_to_mut::<f32>() };
    assert!(
        head.is_empty() && tail.is_empty(),
        "{what}: {len} bytes at address {ptr:p} cannot be viewed as f32 (scratch must be 4-byte \
         aligned and a multiple of 4 bytes; arena slices are 64-byte aligned)"
    );
    mid
}
