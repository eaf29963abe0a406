//! `neon_linear_f32_4x4`, `neon_linear_f16_4x4` and `neon_linear_bf16_4x4`: `out = x · wᵀ +
//! bias` for plain floating-point weights with NEON fused multiply-add.
//!
//! Each output element is one dot product in a fixed order: four f32 lane accumulators
//! `acc[l] = fma(x[4c + l], w[4c + l], acc[l])` over the whole 4-element chunks in increasing
//! `c`, the lanes summed with `faddv` (`vaddvq_f32`, a fixed pairwise order), the `k % 4` tail
//! elements fused in one by one in increasing index, then the bias added. The order does not
//! depend on the register tile (up to 4 rows × 4 columns) an element is computed in nor on the
//! thread that computes it. F16 weights are widened exactly with `fcvtl` (`vcvt_f32_f16`), BF16
//! weights exactly with a 16-bit left shift (`ushll #16`, `vshll_n_u16`: bfloat16 is the top half
//! of an f32).

use std::arch::aarch64::{
    float32x4_t, vaddvq_f32, vcvt_f32_f16, vdupq_n_f32, vfmaq_f32, vld1_u16, vld1q_f32,
    vreinterpret_f16_u16, vreinterpretq_f32_u32, vshll_n_u16,
};

use edge_kernels::quant::{bf16_to_fp32, fp16_to_fp32};
use edge_schema::DType;
use rayon::prelude::*;

/// Output rows of `x` per register tile.
const TILE_R: usize = 4;
/// Output columns (weight rows) per register tile.
const TILE_C: usize = 4;
/// Columns per task when `m` is small (column-parallel path).
const COL_BLOCK: usize = 32;

/// How a weight row of plain floats is read.
trait WeightLoad {
    /// Bytes per element.
    const BYTES: usize;
    /// Four elements starting at element `i` of the row at `p`, widened to f32.
    ///
    /// # Safety
    /// `p` points to a readable row of at least `(i + 4) · BYTES` bytes.
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t;
    /// Element `i` of the row at `p`, widened to f32.
    ///
    /// # Safety
    /// `p` points to a readable row of at least `(i + 1) · BYTES` bytes.
    unsafe fn load1(p: *const u8, i: usize) -> f32;
}

/// Little-endian f32 weights, read with unaligned loads.
struct F32W;
/// Little-endian IEEE half weights.
struct F16W;
/// Little-endian bfloat16 weights.
struct Bf16W;

impl WeightLoad for F32W {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t {
        // SAFETY: the caller guarantees 16 readable bytes at `p + 4i`; `ld1` has no alignment
        // requirement and stdarch's `vld1q_f32` reads unaligned.
        unsafe { vld1q_f32(p.add(i * 4).cast::<f32>()) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: the caller guarantees 4 readable bytes at `p + 4i`; read unaligned.
        unsafe { p.add(i * 4).cast::<f32>().read_unaligned() }
    }
}

impl WeightLoad for F16W {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t {
        // SAFETY: the caller guarantees 8 readable bytes at `p + 2i`; `ld1` reads unaligned;
        // `fcvtl` is baseline NEON and exact for every half value.
        unsafe { vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p.add(i * 2).cast::<u16>()))) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: the caller guarantees 2 readable bytes at `p + 2i`; read unaligned.
        let bits = unsafe { p.add(i * 2).cast::<u16>().read_unaligned() };
        fp16_to_fp32(u16::from_le(bits))
    }
}

impl WeightLoad for Bf16W {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t {
        // SAFETY: the caller guarantees 8 readable bytes at `p + 2i`; `ld1` reads unaligned;
        // shifting the 16 bits into the top half of a 32-bit lane is the exact widening.
        unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.add(i * 2).cast::<u16>()))) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: the caller guarantees 2 readable bytes at `p + 2i`; read unaligned.
        let bits = unsafe { p.add(i * 2).cast::<u16>().read_unaligned() };
        bf16_to_fp32(u16::from_le(bits))
    }
}

/// `out[r][c] = dot(xs[r][..k], ws[c][..k])` in the order of the module doc.
///
/// # Safety
/// Every `xs[r]` points to `k` readable f32 values and every `ws[c]` to `k · W::BYTES`
/// readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn tile<W: WeightLoad, const R: usize, const C: usize>(
    xs: &[*const f32; R],
    ws: &[*const u8; C],
    k: usize,
) -> [[f32; C]; R] {
    let full = k - k % 4;
    let mut acc = [[vdupq_n_f32(0.0); C]; R];
    let mut i = 0;
    while i < full {
        let mut wv = [vdupq_n_f32(0.0); C];
        for c in 0..C {
            // SAFETY: i + 4 <= full <= k, and ws[c] holds k elements (caller).
            wv[c] = unsafe { W::load4(ws[c], i) };
        }
        for r in 0..R {
            // SAFETY: i + 4 <= k and xs[r] holds k f32 values (caller).
            let xv = unsafe { vld1q_f32(xs[r].add(i)) };
            for c in 0..C {
                acc[r][c] = vfmaq_f32(acc[r][c], xv, wv[c]);
            }
        }
        i += 4;
    }
    let mut out = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut s = vaddvq_f32(acc[r][c]);
            for t in full..k {
                // SAFETY: t < k; both rows hold k elements (caller).
                let (xv, wv) = unsafe { (*xs[r].add(t), W::load1(ws[c], t)) };
                s = xv.mul_add(wv, s);
            }
            out[r][c] = s;
        }
    }
    out
}

/// Safe front of [`tile`] for `R` x rows and `TILE_C` weight rows: checks every length.
#[inline(always)]
fn tile_checked<W: WeightLoad, const R: usize>(
    xs: [&[f32]; R],
    ws: [&[u8]; TILE_C],
    k: usize,
) -> [[f32; TILE_C]; R] {
    for x in &xs {
        assert_eq!(
            x.len(),
            k,
            "neon dense tile: x row of {} values, k = {k}",
            x.len()
        );
    }
    for w in &ws {
        assert_eq!(
            w.len(),
            k * W::BYTES,
            "neon dense tile: weight row of {} bytes, k = {k}",
            w.len()
        );
    }
    let xp: [*const f32; R] = xs.map(<[f32]>::as_ptr);
    let wp: [*const u8; TILE_C] = ws.map(<[u8]>::as_ptr);
    // SAFETY: every x row holds k f32 values and every weight row k·W::BYTES bytes (asserted
    // above); NEON is part of the aarch64 baseline.
    unsafe { tile::<W, R, TILE_C>(&xp, &wp, k) }
}

/// `out[r][c] = dot(xs[r], ws[c])` for f32 rows of length `k` (`R`, `C` ≤ 4), in the fixed
/// order of the module doc: the same dot product as `neon_linear_f32_4x4`, shared with
/// `neon_conv2d_f32_4x4`. Panics if a row is not `k` long.
pub(super) fn dot_tile_f32<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    for row in xs.iter().chain(ws.iter()) {
        assert_eq!(
            row.len(),
            k,
            "neon dot tile: row of {} values, k = {k}",
            row.len()
        );
    }
    let xp: [*const f32; R] = xs.map(<[f32]>::as_ptr);
    let wp: [*const u8; C] = ws.map(|w| w.as_ptr().cast::<u8>());
    // SAFETY: every row holds k f32 values (asserted above), so every weight row holds
    // k·F32W::BYTES readable bytes; NEON is part of the aarch64 baseline.
    unsafe { tile::<F32W, R, C>(&xp, &wp, k) }
}

/// Rows of `out` per task in the row-parallel path (a function of `m` only).
fn row_block(m: usize) -> usize {
    m.div_ceil(16).next_multiple_of(TILE_R).clamp(TILE_R, 64)
}

/// `out = x · wᵀ + bias` for `F32`, `F16` or `BF16` weights; shapes already checked by the caller
/// (`x` `[m, k]`, `w` `[n, k]` of `dtype`, `bias` `[n]`, `out` `[m, n]`, `m, n > 0`).
pub(super) fn linear_dense(
    dtype: DType,
    x: &[f32],
    w: &[u8],
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    match dtype {
        DType::F32 => gemm::<F32W>(x, w, bias, out, m, k, n),
        DType::F16 => gemm::<F16W>(x, w, bias, out, m, k, n),
        DType::BF16 => gemm::<Bf16W>(x, w, bias, out, m, k, n),
        other => unreachable!("linear_dense is only dispatched for F32/F16/BF16, got {other:?}"),
    }
}

fn gemm<W: WeightLoad>(
    x: &[f32],
    w: &[u8],
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    let wrow = k * W::BYTES;
    let wr = |j: usize| &w[j * wrow..(j + 1) * wrow];
    let add_bias = |s: f32, j: usize| match bias {
        Some(b) => s + b[j],
        None => s,
    };
    if m < 8 {
        out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            let xs = [&x[i * k..(i + 1) * k]];
            row.par_chunks_mut(COL_BLOCK)
                .enumerate()
                .for_each(|(cb, cols)| {
                    for (jt, chunk) in cols.chunks_mut(TILE_C).enumerate() {
                        let j0 = cb * COL_BLOCK + jt * TILE_C;
                        let ws: [&[u8]; TILE_C] = std::array::from_fn(|c| wr((j0 + c).min(n - 1)));
                        let t = tile_checked::<W, 1>(xs, ws, k);
                        for (c, o) in chunk.iter_mut().enumerate() {
                            *o = add_bias(t[0][c], j0 + c);
                        }
                    }
                });
        });
        return;
    }
    let rb = row_block(m);
    out.par_chunks_mut(rb * n)
        .enumerate()
        .for_each(|(b, rows_out)| {
            let i0 = b * rb;
            let rows = rows_out.len() / n;
            for j0 in (0..n).step_by(TILE_C) {
                let nc = TILE_C.min(n - j0);
                let ws: [&[u8]; TILE_C] = std::array::from_fn(|c| wr((j0 + c).min(n - 1)));
                for r0 in (0..rows).step_by(TILE_R) {
                    let nr = TILE_R.min(rows - r0);
                    let xs: [&[f32]; TILE_R] = std::array::from_fn(|r| {
                        let i = i0 + (r0 + r).min(rows - 1);
                        &x[i * k..(i + 1) * k]
                    });
                    let t = tile_checked::<W, TILE_R>(xs, ws, k);
                    for r in 0..nr {
                        let o = &mut rows_out[(r0 + r) * n + j0..][..nc];
                        for (c, v) in o.iter_mut().enumerate() {
                            *v = add_bias(t[r][c], j0 + c);
                        }
                    }
                }
            }
        });
}
