//! `neon_linear_{q8_0,q4_0}_{base,dotprod,i8mm}`: `out = x · wᵀ + bias` for `Q8_0`/`Q4_0` weights.
//!
//! As ggml's `ggml_compute_forward_mul_mat` (ggml-cpu.c): each activation row is quantized once
//! to `Q8_0` with the generic [`quantize_activation_row`], then every output element is the dot
//! product of a weight row with that row, block by block (32 values, one f16 scale per block on
//! each side). The integer part of a block is computed with NEON and is exact:
//! - `base` (ARMv8.0): `smull`/`smull2` (`vmull_s8`, 8 × i8·i8 → i16) and `sadalp`
//!   (`vpadalq_s16`, pairwise widening accumulate into 4 × i32), then `addv`;
//! - `dotprod` (`FEAT_DotProd`): `sdot` (4 × four-way i8·i8 → i32 accumulate), then `addv`;
//! - `i8mm` (`FEAT_I8MM`): `smmla` on 2 activation rows × 2 weight rows (each instruction a
//!   2×8 by 8×2 i8 product accumulated into the 2×2 i32 tile), 4 per block and tile; rows are
//!   taken in pairs, a lone last row uses the `dotprod` (or base) path.
//!
//! The f32 scaling of each block follows the generic order exactly
//! (`sumf += sumi · (dw · da)` for Q8_0, `sumf += sumi · dw · da` for Q4_0, ggml's
//! `ggml_vec_dot_q8_0_q8_0_generic` / `ggml_vec_dot_q4_0_q8_0_generic` in
//! `src/ggml-cpu/quants.c`), so the results are bit-identical to [`edge_kernels::linear`].
//! Four weight rows share each loaded activation block.

use std::arch::aarch64::{
    int32x4_t, int8x16_t, vaddvq_s32, vandq_u8, vcvt_f32_f16, vdupq_n_s32, vdupq_n_s8, vdupq_n_u8,
    vget_low_s8, vld1_u16, vld1q_s8, vld1q_u8, vmull_high_s8, vmull_s8, vpadalq_s16,
    vreinterpret_f16_u16, vreinterpretq_s64_s8, vreinterpretq_s8_s64, vreinterpretq_s8_u8,
    vshrq_n_u8, vst1q_f32, vst1q_s32, vsubq_s8, vzip1q_s64, vzip2q_s64,
};
use std::arch::asm;

use edge_kernels::quant::{activation_row_bytes, quantize_activation_row};
use edge_schema::DType;
use rayon::prelude::*;

/// Bytes of one `block_q8_0`: f16 scale + 32 × i8.
const Q8_0_BYTES: usize = 34;
/// Bytes of one `block_q4_0`: f16 scale + 16 bytes of nibbles.
const Q4_0_BYTES: usize = 18;
/// Weight rows sharing one activation block.
const COLS: usize = 4;
/// Output columns per task.
const COL_BLOCK: usize = 64;

/// Which integer dot-product instructions a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IntPath {
    /// ARMv8.0 `smull` + `sadalp`.
    Base,
    /// `sdot`; only valid when the CPU has `FEAT_DotProd`.
    DotProd,
    /// `smmla` on 2 activation rows × 2 weight rows; only valid when the CPU has `FEAT_I8MM`.
    /// A lone last row (odd `m`) uses `sdot` if the CPU has it, else the ARMv8.0 path.
    I8mm,
}

/// Reads the little-endian f16 scale bits at `p`.
///
/// # Safety
/// `p` points to 2 readable bytes.
#[inline(always)]
unsafe fn scale_bits(p: *const u8) -> u16 {
    // SAFETY: 2 readable bytes at p (caller); read unaligned.
    u16::from_le(unsafe { p.cast::<u16>().read_unaligned() })
}

/// Four f16 values (bits) widened to f32 with one `fcvtl` (exact, as ggml's
/// `GGML_FP16_TO_FP32`).
#[inline]
#[target_feature(enable = "neon")]
fn widen4(bits: [u16; 4]) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    // SAFETY: `bits` holds 4 u16 (8 readable bytes), `out` 4 f32 (16 writable bytes).
    unsafe {
        vst1q_f32(
            out.as_mut_ptr(),
            vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(bits.as_ptr()))),
        );
    }
    out
}

/// Exact `Σ a[i]·b[i]` over two 16-lane halves: ARMv8.0 widening multiplies.
#[inline]
#[target_feature(enable = "neon")]
fn block_dot_base(w0: int8x16_t, w1: int8x16_t, a0: int8x16_t, a1: int8x16_t) -> i32 {
    let mut acc = vdupq_n_s32(0);
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w0), vget_low_s8(a0)));
    acc = vpadalq_s16(acc, vmull_high_s8(w0, a0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(a1)));
    acc = vpadalq_s16(acc, vmull_high_s8(w1, a1));
    vaddvq_s32(acc)
}

/// `acc + sdot(a, b)`: per 32-bit lane, the sum of four i8·i8 products.
///
/// # Safety
/// The CPU implements `FEAT_DotProd`.
#[inline]
#[target_feature(enable = "dotprod")]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` only reads and writes the named vector registers (no memory, no flags);
    // the caller guarantees the CPU implements it. (`vdotq_s32` is not stable in Rust.)
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Exact `Σ a[i]·b[i]` over two 16-lane halves with `sdot`.
///
/// # Safety
/// The CPU implements `FEAT_DotProd`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn block_dot_sdot(w0: int8x16_t, w1: int8x16_t, a0: int8x16_t, a1: int8x16_t) -> i32 {
    // SAFETY: dotprod is available (caller).
    let acc = unsafe { sdot(sdot(vdupq_n_s32(0), w0, a0), w1, a1) };
    vaddvq_s32(acc)
}

/// Loads the f16 scale bits and the 32 quants of weight block `b` as two 16-lane i8 vectors (Q8_0 as stored; Q4_0's
/// low nibbles → elements 0..16, high nibbles → 16..32, each minus 8, as ggml's layout).
///
/// # Safety
/// `row` points to at least `(b + 1)` blocks of Q4_0 (`Q4`) or Q8_0 (`!Q4`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_weight<const Q4: bool>(row: *const u8, b: usize) -> (u16, int8x16_t, int8x16_t) {
    if !Q4 {
        // SAFETY: block b lies within the row (caller): 2 scale bytes + 32 quant bytes.
        unsafe {
            let p = row.add(b * Q8_0_BYTES);
            (
                scale_bits(p),
                vld1q_s8(p.add(2).cast::<i8>()),
                vld1q_s8(p.add(18).cast::<i8>()),
            )
        }
    } else {
        // SAFETY: block b lies within the row (caller): 2 scale bytes + 16 nibble bytes.
        let (d, v) = unsafe {
            let p = row.add(b * Q4_0_BYTES);
            (scale_bits(p), vld1q_u8(p.add(2)))
        };
        let eight = vdupq_n_s8(8);
        let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), eight);
        let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)), eight);
        (d, lo, hi)
    }
}

/// Adds one block's integer sum to the running f32 sum in the generic kernel's order.
#[inline(always)]
fn accumulate<const Q4: bool>(sumf: f32, sumi: i32, dw: f32, da: f32) -> f32 {
    if !Q4 {
        sumf + sumi as f32 * (dw * da)
    } else {
        sumf + sumi as f32 * dw * da
    }
}

/// Dot products of `COLS` weight rows with one Q8_0 activation row, ARMv8.0 instructions.
///
/// # Safety
/// `act` points to `nb` Q8_0 blocks, every `ws[c]` to `nb` Q4_0 (`Q4`) or Q8_0 blocks.
#[target_feature(enable = "neon")]
unsafe fn dot4_base<const Q4: bool>(
    act: *const u8,
    ws: &[*const u8; COLS],
    nb: usize,
) -> [f32; COLS] {
    let mut sumf = [0.0f32; COLS];
    for b in 0..nb {
        // SAFETY: block b < nb lies within the activation row (caller).
        let (abits, a0, a1) = unsafe { load_weight::<false>(act, b) };
        let mut bits = [0u16; COLS];
        let mut sumi = [0i32; COLS];
        for c in 0..COLS {
            // SAFETY: block b < nb lies within weight row c (caller).
            let (wbits, w0, w1) = unsafe { load_weight::<Q4>(ws[c], b) };
            bits[c] = wbits;
            sumi[c] = block_dot_base(w0, w1, a0, a1);
        }
        let dw = widen4(bits);
        let da = widen4([abits; 4])[0];
        for c in 0..COLS {
            sumf[c] = accumulate::<Q4>(sumf[c], sumi[c], dw[c], da);
        }
    }
    sumf
}

/// [`dot4_base`] with `sdot`.
///
/// # Safety
/// As [`dot4_base`], and the CPU implements `FEAT_DotProd`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot4_sdot<const Q4: bool>(
    act: *const u8,
    ws: &[*const u8; COLS],
    nb: usize,
) -> [f32; COLS] {
    let mut sumf = [0.0f32; COLS];
    for b in 0..nb {
        // SAFETY: block b < nb lies within the activation row (caller).
        let (abits, a0, a1) = unsafe { load_weight::<false>(act, b) };
        let mut bits = [0u16; COLS];
        let mut sumi = [0i32; COLS];
        for c in 0..COLS {
            // SAFETY: block b < nb lies within weight row c (caller); dotprod present (caller).
            let (wbits, s) = unsafe {
                let (wbits, w0, w1) = load_weight::<Q4>(ws[c], b);
                (wbits, block_dot_sdot(w0, w1, a0, a1))
            };
            bits[c] = wbits;
            sumi[c] = s;
        }
        let dw = widen4(bits);
        let da = widen4([abits; 4])[0];
        for c in 0..COLS {
            sumf[c] = accumulate::<Q4>(sumf[c], sumi[c], dw[c], da);
        }
    }
    sumf
}

/// `acc + smmla(a, b)`: `a` holds 2 rows × 8 i8, `b` 2 rows × 8 i8; lanes of the result are
/// `[a0·b0, a0·b1, a1·b0, a1·b1]` (8-term i8 dot products, accumulated in i32).
///
/// # Safety
/// The CPU implements `FEAT_I8MM`.
#[inline]
#[target_feature(enable = "neon,i8mm")]
unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `smmla` only reads and writes the named vector registers (no memory, no flags);
    // the caller guarantees the CPU implements it. (`vmmlaq_s32` is not stable in Rust.)
    unsafe {
        asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// The 8-value chunks `2q`, `2q + 1` of two 16-lane vectors paired for `smmla`:
/// (`[u[0..8], v[0..8]]`, `[u[8..16], v[8..16]]`).
#[inline]
#[target_feature(enable = "neon")]
fn pair(u: int8x16_t, v: int8x16_t) -> (int8x16_t, int8x16_t) {
    let (u, v) = (vreinterpretq_s64_s8(u), vreinterpretq_s64_s8(v));
    (
        vreinterpretq_s8_s64(vzip1q_s64(u, v)),
        vreinterpretq_s8_s64(vzip2q_s64(u, v)),
    )
}

/// Dot products of 2 Q8_0 activation rows with `COLS` weight rows, with `smmla` (2 × 2 tiles).
///
/// # Safety
/// `acts[r]` point to `nb` Q8_0 blocks, every `ws[c]` to `nb` Q4_0 (`Q4`) or Q8_0 blocks; the
/// CPU implements `FEAT_I8MM`.
#[target_feature(enable = "neon,i8mm")]
unsafe fn dot2x4_i8mm<const Q4: bool>(
    acts: &[*const u8; 2],
    ws: &[*const u8; COLS],
    nb: usize,
) -> [[f32; COLS]; 2] {
    let mut sumf = [[0.0f32; COLS]; 2];
    for b in 0..nb {
        // SAFETY: block b < nb lies within both activation rows (caller).
        let ((ab0, a00, a01), (ab1, a10, a11)) = unsafe {
            (
                load_weight::<false>(acts[0], b),
                load_weight::<false>(acts[1], b),
            )
        };
        // Activation chunks of 8: rows 0 and 1 side by side.
        let (x0, x1) = pair(a00, a10);
        let (x2, x3) = pair(a01, a11);
        let mut bits = [0u16; COLS];
        let mut sumi = [[0i32; COLS]; 2];
        for cp in 0..COLS / 2 {
            // SAFETY: block b < nb lies within weight rows 2cp and 2cp + 1 (caller).
            let ((wb0, w00, w01), (wb1, w10, w11)) = unsafe {
                (
                    load_weight::<Q4>(ws[2 * cp], b),
                    load_weight::<Q4>(ws[2 * cp + 1], b),
                )
            };
            bits[2 * cp] = wb0;
            bits[2 * cp + 1] = wb1;
            let (y0, y1) = pair(w00, w10);
            let (y2, y3) = pair(w01, w11);
            // SAFETY: FEAT_I8MM present (caller).
            let acc = unsafe {
                smmla(
                    smmla(smmla(smmla(vdupq_n_s32(0), x0, y0), x1, y1), x2, y2),
                    x3,
                    y3,
                )
            };
            let mut lanes = [0i32; 4];
            // SAFETY: `lanes` is a 4-element i32 stack array (16 writable bytes).
            unsafe { vst1q_s32(lanes.as_mut_ptr(), acc) };
            sumi[0][2 * cp] = lanes[0];
            sumi[0][2 * cp + 1] = lanes[1];
            sumi[1][2 * cp] = lanes[2];
            sumi[1][2 * cp + 1] = lanes[3];
        }
        let dw = widen4(bits);
        let da = widen4([ab0, ab1, 0, 0]);
        for r in 0..2 {
            for c in 0..COLS {
                sumf[r][c] = accumulate::<Q4>(sumf[r][c], sumi[r][c], dw[c], da[r]);
            }
        }
    }
    sumf
}

/// Safe front of [`dot2x4_i8mm`]: checks every length and the CPU feature.
fn dot2x4(dtype: DType, acts: [&[u8]; 2], ws: [&[u8]; COLS], nb: usize) -> [[f32; COLS]; 2] {
    let wblock = match dtype {
        DType::Q8_0 => Q8_0_BYTES,
        DType::Q4_0 => Q4_0_BYTES,
        other => unreachable!("neon quantized dot dispatched for {other:?}"),
    };
    for a in &acts {
        assert_eq!(
            a.len(),
            nb * Q8_0_BYTES,
            "neon dot2x4: activation row length"
        );
    }
    for w in &ws {
        assert_eq!(
            w.len(),
            nb * wblock,
            "neon dot2x4: {dtype:?} weight row length"
        );
    }
    assert!(
        super::features().i8mm,
        "neon dot2x4: the i8mm kernel was called on a CPU without FEAT_I8MM"
    );
    let ap: [*const u8; 2] = acts.map(<[u8]>::as_ptr);
    let wp: [*const u8; COLS] = ws.map(<[u8]>::as_ptr);
    // SAFETY: both activation rows hold nb Q8_0 blocks and every weight row nb blocks of dtype
    // (asserted above); FEAT_I8MM detected at run time just above.
    unsafe {
        if dtype == DType::Q4_0 {
            dot2x4_i8mm::<true>(&ap, &wp, nb)
        } else {
            dot2x4_i8mm::<false>(&ap, &wp, nb)
        }
    }
}

/// Safe front of the 4-column dot kernels: checks every length, and the CPU feature for
/// [`IntPath::DotProd`].
fn dot4(path: IntPath, dtype: DType, act: &[u8], ws: [&[u8]; COLS], nb: usize) -> [f32; COLS] {
    let wblock = match dtype {
        DType::Q8_0 => Q8_0_BYTES,
        DType::Q4_0 => Q4_0_BYTES,
        other => unreachable!("neon quantized dot dispatched for {other:?}"),
    };
    assert_eq!(
        act.len(),
        nb * Q8_0_BYTES,
        "neon dot4: activation row length"
    );
    for w in &ws {
        assert_eq!(
            w.len(),
            nb * wblock,
            "neon dot4: {dtype:?} weight row length"
        );
    }
    let wp: [*const u8; COLS] = ws.map(<[u8]>::as_ptr);
    let q4 = dtype == DType::Q4_0;
    match path {
        // SAFETY: the activation row holds nb Q8_0 blocks and every weight row nb blocks of
        // dtype (asserted above); NEON is baseline on aarch64.
        IntPath::Base => unsafe {
            if q4 {
                dot4_base::<true>(act.as_ptr(), &wp, nb)
            } else {
                dot4_base::<false>(act.as_ptr(), &wp, nb)
            }
        },
        IntPath::I8mm if !super::features().dotprod => {
            // SAFETY: as for IntPath::Base.
            unsafe {
                if q4 {
                    dot4_base::<true>(act.as_ptr(), &wp, nb)
                } else {
                    dot4_base::<false>(act.as_ptr(), &wp, nb)
                }
            }
        }
        IntPath::DotProd | IntPath::I8mm => {
            assert!(
                super::features().dotprod,
                "neon dot4: the dotprod kernel was called on a CPU without FEAT_DotProd"
            );
            // SAFETY: lengths asserted above; FEAT_DotProd detected at run time just above.
            unsafe {
                if q4 {
                    dot4_sdot::<true>(act.as_ptr(), &wp, nb)
                } else {
                    dot4_sdot::<false>(act.as_ptr(), &wp, nb)
                }
            }
        }
    }
}

/// `out = x · wᵀ + bias` for `Q8_0`/`Q4_0` weights; shapes already checked by the caller
/// (`x` `[m, k]`, `w` `[n, k]` of `dtype` with `k` a multiple of 32, `bias` `[n]`, `out`
/// `[m, n]`, `m, n > 0`, `scratch` ≥ `m · activation_row_bytes(dtype, k)` bytes).
pub(super) fn linear_quant(
    path: IntPath,
    dtype: DType,
    x: &[f32],
    w: &[u8],
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    let arow = activation_row_bytes(dtype, k);
    if k == 0 || arow == 0 {
        for row in out.chunks_mut(n) {
            for (j, o) in row.iter_mut().enumerate() {
                *o = bias.map_or(0.0, |b| b[j]);
            }
        }
        return;
    }
    let nb = k / 32;
    let wrow = w.len() / n;
    let acts = &mut scratch[..m * arow];
    acts.par_chunks_mut(arow)
        .zip(x.par_chunks(k))
        .for_each(|(dst, src)| quantize_activation_row(dtype, src, dst));
    let acts = &*acts;
    let wr = |j: usize| &w[j * wrow..(j + 1) * wrow];
    let store = |o: &mut [f32], s: &[f32; COLS], j0: usize| {
        for (c, o) in o.iter_mut().enumerate() {
            *o = match bias {
                Some(b) => s[c] + b[j0 + c],
                None => s[c],
            };
        }
    };
    if path == IntPath::I8mm {
        out.par_chunks_mut(2 * n).enumerate().for_each(|(p, rows)| {
            let i = 2 * p;
            if rows.len() == n {
                // A lone last row.
                let act = &acts[i * arow..(i + 1) * arow];
                for (jt, chunk) in rows.chunks_mut(COLS).enumerate() {
                    let j0 = jt * COLS;
                    let ws: [&[u8]; COLS] = std::array::from_fn(|c| wr((j0 + c).min(n - 1)));
                    store(chunk, &dot4(path, dtype, act, ws, nb), j0);
                }
                return;
            }
            let a2 = [
                &acts[i * arow..(i + 1) * arow],
                &acts[(i + 1) * arow..(i + 2) * arow],
            ];
            let (r0, r1) = rows.split_at_mut(n);
            r0.par_chunks_mut(COL_BLOCK)
                .zip(r1.par_chunks_mut(COL_BLOCK))
                .enumerate()
                .for_each(|(cb, (c0, c1))| {
                    for (jt, (o0, o1)) in c0.chunks_mut(COLS).zip(c1.chunks_mut(COLS)).enumerate() {
                        let j0 = cb * COL_BLOCK + jt * COLS;
                        let ws: [&[u8]; COLS] = std::array::from_fn(|c| wr((j0 + c).min(n - 1)));
                        let s = dot2x4(dtype, a2, ws, nb);
                        store(o0, &s[0], j0);
                        store(o1, &s[1], j0);
                    }
                });
        });
        return;
    }
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let act = &acts[i * arow..(i + 1) * arow];
        row.par_chunks_mut(COL_BLOCK)
            .enumerate()
            .for_each(|(cb, cols)| {
                for (jt, chunk) in cols.chunks_mut(COLS).enumerate() {
                    let j0 = cb * COL_BLOCK + jt * COLS;
                    let ws: [&[u8]; COLS] = std::array::from_fn(|c| wr((j0 + c).min(n - 1)));
                    store(chunk, &dot4(path, dtype, act, ws, nb), j0);
                }
            });
    });
}
