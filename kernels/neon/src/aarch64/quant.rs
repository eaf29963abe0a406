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
//! (`sumf = fma(sumi, dw · da, sumf)` for Q8_0, one `fmla`; `sumf += sumi · dw · da` for Q4_0,
//! ggml's `ggml_vec_dot_q4_0_q8_0_generic` in `src/ggml-cpu/quants.c`), so the results are
//! bit-identical to [`edge_kernels::linear`].
//! Four weight rows share each loaded activation block.
//!
//! Weights in [`PackLayout::Interleaved4x8`] (ggml's `block_q8_0x4` idea, `ggml-cpu/repack.cpp`;
//! see the layout's doc) are read by `neon_linear_{q8_0,q4_0}_{base,dotprod,i8mm}_x4`, two
//! groups of 4 rows (8 output columns) per call: a 16-byte load holds chunk `c` of two rows.
//! `i8mm` uses it as the `smmla` weight operand as is; `dotprod` runs `sdot` on it against the
//! activation chunk duplicated in both halves and sums the lane pairs with `addp`; `base` takes
//! `smull`/`smlal` of its low half and `smull2`/`smlal2` of its high half. `Q4_0` nibbles enter
//! `sdot`/`smmla` scaled by 16 (one `eor`, one `shl` or `and` per vector) and the exact integer
//! sums are shifted back. The 4 weight scales load as one vector and the f32 scaling is done per
//! lane with the generic operations and order (Q8_0 fused, Q4_0 unfused), so these results are
//! bit-identical to the generic kernel too. The last `n mod 4` rows (row-major) use the row-major kernels.

use std::arch::aarch64::{
    float32x4_t, int32x4_t, int8x16_t, uint8x16_t, vaddq_f32, vaddvq_s32, vandq_u8, vcreate_u16,
    vcvt_f32_f16, vcvtq_f32_s32, vdup_n_u16, vdupq_laneq_s64, vdupq_n_f32, vdupq_n_s32, vdupq_n_s8,
    vdupq_n_u8, veorq_u8, vfmaq_f32, vget_low_s8, vld1_u16, vld1q_s8, vld1q_u8, vmlal_high_s8,
    vmlal_s8, vmull_high_s8, vmull_s8, vmulq_f32, vpadalq_s16, vpaddlq_s16, vpaddq_s32,
    vreinterpret_f16_u16, vreinterpretq_s32_s64, vreinterpretq_s64_s32, vreinterpretq_s64_s8,
    vreinterpretq_s8_s64, vreinterpretq_s8_u8, vreinterpretq_u8_s8, vshlq_n_u8, vshrq_n_s32,
    vshrq_n_u8, vst1q_f32, vst1q_s32, vsubq_s8, vzip1q_s64, vzip2q_s64,
};
use std::arch::asm;

use edge_kernels::pack::{CHUNK, GROUP_ROWS};
use edge_kernels::quant::{activation_row_bytes, quantize_activation_row};
use edge_schema::plan::PackLayout;
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
pub(super) fn widen4(bits: [u16; 4]) -> [f32; 4] {
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
pub(super) fn block_dot_base(w0: int8x16_t, w1: int8x16_t, a0: int8x16_t, a1: int8x16_t) -> i32 {
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
pub(super) unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
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
pub(super) unsafe fn block_dot_sdot(
    w0: int8x16_t,
    w1: int8x16_t,
    a0: int8x16_t,
    a1: int8x16_t,
) -> i32 {
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
        (sumi as f32).mul_add(dw * da, sumf)
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

/// Bytes of the 4 f16 scales that open every block of an interleaved group.
const GROUP_SCALES: usize = 2 * GROUP_ROWS;

/// Bytes of one block of one interleaved group (4 weight rows' blocks of `dtype`).
fn group_block_bytes(dtype: DType) -> usize {
    GROUP_ROWS
        * match dtype {
            DType::Q8_0 => Q8_0_BYTES,
            DType::Q4_0 => Q4_0_BYTES,
            other => unreachable!("neon quantized dot dispatched for {other:?}"),
        }
}

/// The 4 f16 scales at `p` (rows 0..4 of a group), widened exactly to f32.
///
/// # Safety
/// `p` points to 8 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn group_scales(p: *const u8) -> float32x4_t {
    // SAFETY: 8 readable bytes at p (caller); read unaligned.
    let bits = u64::from_le(unsafe { p.cast::<u64>().read_unaligned() });
    vcvt_f32_f16(vreinterpret_f16_u16(vcreate_u16(bits)))
}

/// One f16 scale (bits) widened exactly to f32 in all four lanes.
#[inline]
#[target_feature(enable = "neon")]
fn splat_scale(bits: u16) -> float32x4_t {
    vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(bits)))
}

/// The 8-value chunk `L` of `v` (`v[8L..8L + 8]`) in both halves of a vector.
#[inline]
#[target_feature(enable = "neon")]
fn dup_chunk<const L: i32>(v: int8x16_t) -> int8x16_t {
    vreinterpretq_s8_s64(vdupq_laneq_s64::<L>(vreinterpretq_s64_s8(v)))
}

/// [`dup_chunk`] as an opaque `dup` instruction. The compiler cannot see that both halves are
/// equal, so `smull2`/`smlal2` of a weight vector with the result stay single instructions
/// (knowing the halves equal, it rewrites each into an `ext` of the weight vector and `smull`).
#[inline]
#[target_feature(enable = "neon")]
fn dup_chunk_opaque<const L: i32>(v: int8x16_t) -> int8x16_t {
    let out: int8x16_t;
    // SAFETY: `dup` only reads and writes the named vector registers (no memory, no flags);
    // NEON is baseline on aarch64.
    unsafe {
        asm!(
            "dup {o:v}.2d, {v:v}.d[{l}]",
            o = out(vreg) out,
            v = in(vreg) v,
            l = const L,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// The activation block `b` of a Q8_0 row: its scale in four lanes and its four 8-value chunks
/// each duplicated in both halves (`[a[8c..8c + 8], a[8c..8c + 8]]`, `c = 0..4`), with
/// [`dup_chunk_opaque`] if `OPAQUE`.
///
/// # Safety
/// `act` points to at least `b + 1` Q8_0 blocks.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_act_chunks<const OPAQUE: bool>(
    act: *const u8,
    b: usize,
) -> (float32x4_t, [int8x16_t; 4]) {
    // SAFETY: block b lies within the activation row (caller).
    let (bits, a0, a1) = unsafe { load_weight::<false>(act, b) };
    let chunks = if OPAQUE {
        [
            dup_chunk_opaque::<0>(a0),
            dup_chunk_opaque::<1>(a0),
            dup_chunk_opaque::<0>(a1),
            dup_chunk_opaque::<1>(a1),
        ]
    } else {
        [
            dup_chunk::<0>(a0),
            dup_chunk::<1>(a0),
            dup_chunk::<0>(a1),
            dup_chunk::<1>(a1),
        ]
    };
    (splat_scale(bits), chunks)
}

/// Q4_0 nibble bytes `v` as two i8 vectors scaled by 16: `(16·(lo − 8), 16·(hi − 8))` per byte
/// (`lo`, `hi` its low and high nibble). `v ^ 0x88` turns each nibble `q` into the 4-bit two's
/// complement of `q − 8`, which `<< 4` (low) or `& 0xF0` (high) places in the top bits. Integer
/// dot products with these operands are exactly 16 times the unscaled ones.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles_x16(v: uint8x16_t) -> (int8x16_t, int8x16_t) {
    let t = veorq_u8(v, vdupq_n_u8(0x88));
    (
        vreinterpretq_s8_u8(vshlq_n_u8::<4>(t)),
        vreinterpretq_s8_u8(vandq_u8(t, vdupq_n_u8(0xF0))),
    )
}

/// Q4_0 nibble bytes `v` as two i8 vectors `(lo − 8, hi − 8)` per byte.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(v: uint8x16_t) -> (int8x16_t, int8x16_t) {
    let eight = vdupq_n_s8(8);
    (
        vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), eight),
        vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)), eight),
    )
}

/// [`accumulate`] on four lanes (four weight rows, one activation row): the same f32
/// operations in the same order per lane (`fmla` where the generic kernel fuses).
#[inline]
#[target_feature(enable = "neon")]
fn accumulate4<const Q4: bool>(
    sumf: float32x4_t,
    sumi: int32x4_t,
    dw: float32x4_t,
    da: float32x4_t,
) -> float32x4_t {
    let s = vcvtq_f32_s32(sumi);
    if !Q4 {
        vfmaq_f32(sumf, s, vmulq_f32(dw, da))
    } else {
        vaddq_f32(sumf, vmulq_f32(vmulq_f32(s, dw), da))
    }
}

/// The four lanes of `v`.
#[inline]
#[target_feature(enable = "neon")]
fn lanes(v: float32x4_t) -> [f32; COLS] {
    let mut out = [0.0f32; COLS];
    // SAFETY: `out` holds 4 f32 (16 writable bytes).
    unsafe { vst1q_f32(out.as_mut_ptr(), v) };
    out
}

/// Dot products of one Q8_0 activation row with `G` interleaved groups (4·`G` weight rows),
/// ARMv8.0 instructions. Each 16-byte load holds chunk `c` of two rows (`[row r, row r + 1]`);
/// `smull`/`smlal` of its low half (resp. `smull2`/`smlal2` of its high half) with the
/// activation chunk duplicated in both halves gives row `r`'s (resp. `r + 1`'s) products in
/// i16 (at most two Q8_0 products per lane: `2·128·127 < 2¹⁵`, the activation quants being in
/// `[-127, 127]`; at most four Q4_0 ones, `4·8·127`), widened pairwise into i32 with
/// `saddlp`/`sadalp`, then summed per row with two rounds of `addp`.
///
/// # Safety
/// `act` points to `nb` Q8_0 blocks, `grp` to `G` groups of `gstride` bytes, each `nb` blocks
/// of [`group_block_bytes`] (Q4_0 if `Q4`, else Q8_0).
#[target_feature(enable = "neon")]
unsafe fn dotx4_base<const Q4: bool, const G: usize>(
    act: *const u8,
    grp: *const u8,
    gstride: usize,
    nb: usize,
) -> [[f32; COLS]; G] {
    let gb = group_block_bytes(if Q4 { DType::Q4_0 } else { DType::Q8_0 });
    let mut sumf = [vdupq_n_f32(0.0); G];
    for b in 0..nb {
        // SAFETY: block b < nb lies within the activation row (caller).
        let (da, d) = unsafe { load_act_chunks::<true>(act, b) };
        for (t, sumf) in sumf.iter_mut().enumerate() {
            // SAFETY: group t < G, block b < nb lies within `grp` (caller): scales at p, quant
            // chunks at q + 16·i for i < 8 (Q8_0) or i < 4 (Q4_0), all inside the block.
            let (dw, v) = unsafe {
                let p = grp.add(t * gstride + b * gb);
                let q = p.add(GROUP_SCALES);
                let v: [int8x16_t; 8] = std::array::from_fn(|i| {
                    if !Q4 || i < 4 {
                        vld1q_s8(q.add(2 * CHUNK * i).cast::<i8>())
                    } else {
                        vdupq_n_s8(0)
                    }
                });
                (group_scales(p), v)
            };
            let mut s = [vdupq_n_s32(0); GROUP_ROWS];
            for pr in 0..2 {
                // Chunk c of rows (2pr, 2pr + 1) is v[2c + pr].
                let (e, o) = if !Q4 {
                    let c: [int8x16_t; 4] = std::array::from_fn(|c| v[2 * c + pr]);
                    let e0 = vmlal_s8(
                        vmull_s8(vget_low_s8(c[0]), vget_low_s8(d[0])),
                        vget_low_s8(c[1]),
                        vget_low_s8(d[1]),
                    );
                    let e1 = vmlal_s8(
                        vmull_s8(vget_low_s8(c[2]), vget_low_s8(d[2])),
                        vget_low_s8(c[3]),
                        vget_low_s8(d[3]),
                    );
                    let o0 = vmlal_high_s8(vmull_high_s8(c[0], d[0]), c[1], d[1]);
                    let o1 = vmlal_high_s8(vmull_high_s8(c[2], d[2]), c[3], d[3]);
                    (
                        vpadalq_s16(vpaddlq_s16(e0), e1),
                        vpadalq_s16(vpaddlq_s16(o0), o1),
                    )
                } else {
                    // Nibble chunk c holds element chunks c (low) and 2 + c (high).
                    let (l0, h0) = nibbles(vreinterpretq_u8_s8(v[pr]));
                    let (l1, h1) = nibbles(vreinterpretq_u8_s8(v[2 + pr]));
                    let e = vmlal_s8(
                        vmlal_s8(
                            vmlal_s8(
                                vmull_s8(vget_low_s8(l0), vget_low_s8(d[0])),
                                vget_low_s8(l1),
                                vget_low_s8(d[1]),
                            ),
                            vget_low_s8(h0),
                            vget_low_s8(d[2]),
                        ),
                        vget_low_s8(h1),
                        vget_low_s8(d[3]),
                    );
                    let o = vmlal_high_s8(
                        vmlal_high_s8(vmlal_high_s8(vmull_high_s8(l0, d[0]), l1, d[1]), h0, d[2]),
                        h1,
                        d[3],
                    );
                    (vpaddlq_s16(e), vpaddlq_s16(o))
                };
                s[2 * pr] = e;
                s[2 * pr + 1] = o;
            }
            let sumi = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
            *sumf = accumulate4::<Q4>(*sumf, sumi, dw, da);
        }
    }
    sumf.map(|v| lanes(v))
}

/// [`dotx4_base`] with `sdot`: `sdot` of a pair load (`[row r, row r + 1]` chunk `c`) with the
/// duplicated activation chunk leaves row `r`'s partial sums in lanes 0–1 and row `r + 1`'s in
/// lanes 2–3; `addp` of the two pairs' accumulators gives the 4 rows' block sums. Q4_0 nibbles
/// enter scaled by 16 ([`nibbles_x16`]) and the sums are shifted back exactly.
///
/// # Safety
/// As [`dotx4_base`], and the CPU implements `FEAT_DotProd`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dotx4_sdot<const Q4: bool, const G: usize>(
    act: *const u8,
    grp: *const u8,
    gstride: usize,
    nb: usize,
) -> [[f32; COLS]; G] {
    let gb = group_block_bytes(if Q4 { DType::Q4_0 } else { DType::Q8_0 });
    let mut sumf = [vdupq_n_f32(0.0); G];
    for b in 0..nb {
        // SAFETY: block b < nb lies within the activation row (caller).
        let (da, d) = unsafe { load_act_chunks::<false>(act, b) };
        for (t, sumf) in sumf.iter_mut().enumerate() {
            let mut acc = [vdupq_n_s32(0); 2];
            // SAFETY: group t < G, block b < nb lies within `grp` (caller): scales at p, quant
            // chunks at q + 16·i for i < 8 (Q8_0) or i < 4 (Q4_0), all inside the block;
            // FEAT_DotProd present (caller).
            let dw = unsafe {
                let p = grp.add(t * gstride + b * gb);
                let q = p.add(GROUP_SCALES);
                for (pr, acc) in acc.iter_mut().enumerate() {
                    if !Q4 {
                        for (c, &dc) in d.iter().enumerate() {
                            let w = vld1q_s8(q.add(2 * CHUNK * (2 * c + pr)).cast::<i8>());
                            *acc = sdot(*acc, w, dc);
                        }
                    } else {
                        for c in 0..2 {
                            let (lo, hi) = nibbles_x16(vld1q_u8(q.add(2 * CHUNK * (2 * c + pr))));
                            *acc = sdot(sdot(*acc, lo, d[c]), hi, d[2 + c]);
                        }
                    }
                }
                group_scales(p)
            };
            let mut sumi = vpaddq_s32(acc[0], acc[1]);
            if Q4 {
                sumi = vshrq_n_s32::<4>(sumi);
            }
            *sumf = accumulate4::<Q4>(*sumf, sumi, dw, da);
        }
    }
    sumf.map(|v| lanes(v))
}

/// Dot products of 2 Q8_0 activation rows with `G` interleaved groups (4·`G` weight rows), with
/// `smmla`: a 16-byte load at chunk `c` of rows `(0, 1)` or `(2, 3)` is the 2×8 weight operand
/// as stored; the activation rows are paired per chunk with `zip`. Q4_0 nibbles enter scaled by
/// 16 ([`nibbles_x16`]) and the sums are shifted back exactly.
///
/// # Safety
/// `acts[r]` point to `nb` Q8_0 blocks, `grp` as in [`dotx4_base`]; the CPU implements
/// `FEAT_I8MM`.
#[target_feature(enable = "neon,i8mm")]
unsafe fn dot2x4_packed_i8mm<const Q4: bool, const G: usize>(
    acts: &[*const u8; 2],
    grp: *const u8,
    gstride: usize,
    nb: usize,
) -> [[[f32; COLS]; G]; 2] {
    let gb = group_block_bytes(if Q4 { DType::Q4_0 } else { DType::Q8_0 });
    let mut sumf = [[vdupq_n_f32(0.0); G]; 2];
    for b in 0..nb {
        // SAFETY: block b < nb lies within both activation rows (caller).
        let ((ab0, a00, a01), (ab1, a10, a11)) = unsafe {
            (
                load_weight::<false>(acts[0], b),
                load_weight::<false>(acts[1], b),
            )
        };
        let da = [splat_scale(ab0), splat_scale(ab1)];
        let (x0, x1) = pair(a00, a10);
        let (x2, x3) = pair(a01, a11);
        let x = [x0, x1, x2, x3];
        for t in 0..G {
            let mut acc = [vdupq_n_s32(0); 2];
            // SAFETY: group t < G, block b < nb lies within `grp` (caller): scales at p, quant
            // chunks at q + 16·i for i < 8 (Q8_0) or i < 4 (Q4_0), all inside the block;
            // FEAT_I8MM present (caller).
            let dw = unsafe {
                let p = grp.add(t * gstride + b * gb);
                let q = p.add(GROUP_SCALES);
                for (pr, acc) in acc.iter_mut().enumerate() {
                    if !Q4 {
                        for (c, &xc) in x.iter().enumerate() {
                            let w = vld1q_s8(q.add(2 * CHUNK * (2 * c + pr)).cast::<i8>());
                            *acc = smmla(*acc, xc, w);
                        }
                    } else {
                        for c in 0..2 {
                            let (lo, hi) = nibbles_x16(vld1q_u8(q.add(2 * CHUNK * (2 * c + pr))));
                            *acc = smmla(smmla(*acc, x[c], lo), x[2 + c], hi);
                        }
                    }
                }
                group_scales(p)
            };
            // acc[0] = [a0·w0, a0·w1, a1·w0, a1·w1], acc[1] the same for w2, w3.
            let (c0, c1) = (vreinterpretq_s64_s32(acc[0]), vreinterpretq_s64_s32(acc[1]));
            let mut rows = [
                vreinterpretq_s32_s64(vzip1q_s64(c0, c1)),
                vreinterpretq_s32_s64(vzip2q_s64(c0, c1)),
            ];
            if Q4 {
                rows = rows.map(|v| vshrq_n_s32::<4>(v));
            }
            for r in 0..2 {
                sumf[r][t] = accumulate4::<Q4>(sumf[r][t], rows[r], dw, da[r]);
            }
        }
    }
    sumf.map(|row| row.map(|v| lanes(v)))
}

/// Checks the lengths of an activation row and of `G` interleaved groups.
fn check_groups<const G: usize>(dtype: DType, act: &[u8], groups: &[u8], nb: usize) -> usize {
    let gb = group_block_bytes(dtype);
    assert_eq!(
        act.len(),
        nb * Q8_0_BYTES,
        "neon dotx4: activation row length"
    );
    assert_eq!(
        groups.len(),
        G * nb * gb,
        "neon dotx4: {G} interleaved {dtype:?} groups length"
    );
    nb * gb
}

/// Safe front of the interleaved 1-row kernels: the dot products of one activation row with
/// `G` groups of 4 weight rows (`groups`, in [`PackLayout::Interleaved4x8`]); checks every
/// length, and the CPU feature for [`IntPath::DotProd`].
fn dotx4<const G: usize>(
    path: IntPath,
    dtype: DType,
    act: &[u8],
    groups: &[u8],
    nb: usize,
) -> [[f32; COLS]; G] {
    let gs = check_groups::<G>(dtype, act, groups, nb);
    let (a, g) = (act.as_ptr(), groups.as_ptr());
    let q4 = dtype == DType::Q4_0;
    let sdot = match path {
        IntPath::Base => false,
        IntPath::I8mm => super::features().dotprod,
        IntPath::DotProd => {
            assert!(
                super::features().dotprod,
                "neon dotx4: the dotprod kernel was called on a CPU without FEAT_DotProd"
            );
            true
        }
    };
    // SAFETY: the activation row holds nb Q8_0 blocks and `groups` G groups of nb group blocks
    // of dtype (asserted above); FEAT_DotProd detected at run time when `sdot`; NEON is
    // baseline on aarch64.
    unsafe {
        match (sdot, q4) {
            (false, false) => dotx4_base::<false, G>(a, g, gs, nb),
            (false, true) => dotx4_base::<true, G>(a, g, gs, nb),
            (true, false) => dotx4_sdot::<false, G>(a, g, gs, nb),
            (true, true) => dotx4_sdot::<true, G>(a, g, gs, nb),
        }
    }
}

/// Safe front of [`dot2x4_packed_i8mm`]: checks every length and the CPU feature.
fn dot2x4_packed<const G: usize>(
    dtype: DType,
    acts: [&[u8]; 2],
    groups: &[u8],
    nb: usize,
) -> [[[f32; COLS]; G]; 2] {
    let gs = check_groups::<G>(dtype, acts[0], groups, nb);
    check_groups::<G>(dtype, acts[1], groups, nb);
    assert!(
        super::features().i8mm,
        "neon dot2x4: the i8mm kernel was called on a CPU without FEAT_I8MM"
    );
    let ap: [*const u8; 2] = acts.map(<[u8]>::as_ptr);
    // SAFETY: both activation rows hold nb Q8_0 blocks and `groups` G groups of nb group blocks
    // of dtype (asserted above); FEAT_I8MM detected at run time just above.
    unsafe {
        if dtype == DType::Q4_0 {
            dot2x4_packed_i8mm::<true, G>(&ap, groups.as_ptr(), gs, nb)
        } else {
            dot2x4_packed_i8mm::<false, G>(&ap, groups.as_ptr(), gs, nb)
        }
    }
}

/// A run of output columns computed together by one kernel call.
#[derive(Clone, Copy, Debug)]
enum Tile {
    /// Columns `j0 .. j0 + 4·g` are `g` (1 or 2) interleaved groups.
    Groups { j0: usize, g: usize },
    /// Columns `j0 .. min(j0 + 4, n)` are row-major rows (the tail of an interleaved matrix, or
    /// any row of a row-major one).
    Rows { j0: usize },
}

/// The tiles covering output columns `lo .. hi` (`lo` a multiple of 4), the first `grouped`
/// columns being interleaved groups: pairs of groups, a last single group, then row tiles.
fn tiles(lo: usize, hi: usize, grouped: usize) -> impl Iterator<Item = Tile> {
    let mut j = lo;
    std::iter::from_fn(move || {
        if j >= hi {
            return None;
        }
        let t = if j + 2 * GROUP_ROWS <= hi.min(grouped) {
            Tile::Groups { j0: j, g: 2 }
        } else if j + GROUP_ROWS <= hi.min(grouped) {
            Tile::Groups { j0: j, g: 1 }
        } else {
            Tile::Rows { j0: j }
        };
        j += match t {
            Tile::Groups { g, .. } => g * GROUP_ROWS,
            Tile::Rows { .. } => COLS,
        };
        Some(t)
    })
}

/// `out = x · wᵀ + bias` for `Q8_0`/`Q4_0` weights; shapes already checked by the caller
/// (`x` `[m, k]`, `w` `[n, k]` of `dtype` in `layout` with `k` a multiple of 32, `bias` `[n]`,
/// `out` `[m, n]`, `m, n > 0`, `scratch` ≥ `m · activation_row_bytes(dtype, k)` bytes).
///
/// In [`PackLayout::Interleaved4x8`] the first `4·⌊n/4⌋` columns are computed by the
/// interleaved kernels two groups (8 columns) at a time, the last `n mod 4` (stored row-major
/// at their row-major offsets) by the row-major kernels.
pub(super) fn linear_quant(
    path: IntPath,
    dtype: DType,
    layout: PackLayout,
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
    let grouped = match layout {
        PackLayout::RowMajor => 0,
        PackLayout::Interleaved4x8 => n / GROUP_ROWS * GROUP_ROWS,
        PackLayout::Interleaved16x4 | PackLayout::Bf16Pairs16 | PackLayout::Interleaved8x4A7 => {
            unreachable!("linear_quant: {layout:?} weights go to the generic kernel")
        }
    };
    let gbytes = nb * group_block_bytes(dtype);
    let acts = &mut scratch[..m * arow];
    acts.par_chunks_mut(arow)
        .zip(x.par_chunks(k))
        .for_each(|(dst, src)| quantize_activation_row(dtype, src, dst));
    let acts = &*acts;
    let wr = |j: usize| &w[j * wrow..(j + 1) * wrow];
    let rows4 = |j0: usize| -> [&[u8]; COLS] { std::array::from_fn(|c| wr((j0 + c).min(n - 1))) };
    let groups = |j0: usize, g: usize| &w[j0 / GROUP_ROWS * gbytes..][..g * gbytes];
    // Writes the sums `s` of columns `j0 ..` (as many as `o` holds) plus the bias.
    let store = |o: &mut [f32], s: &[f32], j0: usize| {
        for (c, o) in o.iter_mut().enumerate() {
            *o = match bias {
                Some(b) => s[c] + b[j0 + c],
                None => s[c],
            };
        }
    };
    // The sums of one activation row over a tile (up to 8 columns).
    let one = |act: &[u8], tile: Tile| -> [f32; 2 * COLS] {
        let mut s = [0.0f32; 2 * COLS];
        match tile {
            Tile::Groups { j0, g: 2 } => {
                let d = dotx4::<2>(path, dtype, act, groups(j0, 2), nb);
                s[..COLS].copy_from_slice(&d[0]);
                s[COLS..].copy_from_slice(&d[1]);
            }
            Tile::Groups { j0, .. } => {
                s[..COLS].copy_from_slice(&dotx4::<1>(path, dtype, act, groups(j0, 1), nb)[0]);
            }
            Tile::Rows { j0 } => s[..COLS].copy_from_slice(&dot4(path, dtype, act, rows4(j0), nb)),
        }
        s
    };
    let span = |tile: Tile| match tile {
        Tile::Groups { j0, g } => (j0, g * GROUP_ROWS),
        Tile::Rows { j0 } => (j0, COLS.min(n - j0)),
    };
    if path == IntPath::I8mm {
        out.par_chunks_mut(2 * n).enumerate().for_each(|(p, rows)| {
            let i = 2 * p;
            if rows.len() == n {
                // A lone last row.
                let act = &acts[i * arow..(i + 1) * arow];
                for tile in tiles(0, n, grouped) {
                    let (j0, len) = span(tile);
                    store(&mut rows[j0..j0 + len], &one(act, tile), j0);
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
                    let lo = cb * COL_BLOCK;
                    for tile in tiles(lo, lo + c0.len(), grouped) {
                        let mut s = [[0.0f32; 2 * COLS]; 2];
                        match tile {
                            Tile::Groups { j0, g: 2 } => {
                                let d = dot2x4_packed::<2>(dtype, a2, groups(j0, 2), nb);
                                for r in 0..2 {
                                    s[r][..COLS].copy_from_slice(&d[r][0]);
                                    s[r][COLS..].copy_from_slice(&d[r][1]);
                                }
                            }
                            Tile::Groups { j0, .. } => {
                                let d = dot2x4_packed::<1>(dtype, a2, groups(j0, 1), nb);
                                for r in 0..2 {
                                    s[r][..COLS].copy_from_slice(&d[r][0]);
                                }
                            }
                            Tile::Rows { j0 } => {
                                let d = dot2x4(dtype, a2, rows4(j0), nb);
                                for r in 0..2 {
                                    s[r][..COLS].copy_from_slice(&d[r]);
                                }
                            }
                        }
                        let (j0, len) = span(tile);
                        store(&mut c0[j0 - lo..j0 - lo + len], &s[0], j0);
                        store(&mut c1[j0 - lo..j0 - lo + len], &s[1], j0);
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
                let lo = cb * COL_BLOCK;
                for tile in tiles(lo, lo + cols.len(), grouped) {
                    let (j0, len) = span(tile);
                    store(&mut cols[j0 - lo..j0 - lo + len], &one(act, tile), j0);
                }
            });
    });
}
