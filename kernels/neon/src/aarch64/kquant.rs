//! `neon_linear_{q2_k,q3_k,q4_k,q5_k,q6_k,q4_1,q5_0,q5_1}_{base,dotprod}`: `out = x · wᵀ + bias`
//! for the ggml K-quant weight types and the legacy types not covered by `quant.rs`.
//!
//! As ggml's `ggml_compute_forward_mul_mat` (ggml-cpu.c) and the generic
//! [`edge_kernels::linear`]: each activation row (`x` row, `[k]` f32) is quantized once to the
//! weight type's `vec_dot_type` with the generic [`quantize_activation_row`] (`Q8_K` for the
//! K-quants, `Q8_0` for `Q5_0`, `Q8_1` for `Q4_1`/`Q5_1`), then every output element is the dot
//! product of one weight row with that activation row, block by block. Four weight rows share
//! each loaded activation block; a task computes `COL_BLOCK` output columns of one row.
//!
//! The arithmetic is ggml's generic `ggml_vec_dot_*` (`src/ggml-cpu/quants.c`), as ported in
//! `edge_kernels::quant` (`vec_dot_q4_k_q8_k`, `vec_dot_q6_k_q8_k`, …):
//! - K-quants, `base` (ARMv8.0): the weight quants of each 16-element group are unpacked to
//!   i8 and multiplied with `smull`/`smull2`; the two 8-lane halves are added (lane `l` holds
//!   elements `l` and `l + 8`, exact in i16) and accumulated times the group scale with
//!   `smlal`/`smlal2` into two `int32x4` vectors, which are exactly the generic kernel's
//!   `aux32[0..8]` (element index mod 8). The f32 lane sums `sums[l] += d · aux32[l]` and the
//!   final reductions are done in the generic order (unfused multiply, then add), so `Q3_K`,
//!   `Q4_K`, `Q5_K` and `Q6_K` results are bit-identical to the generic kernel. `Q2_K` sums its
//!   integers into one exact `i32` per block as the generic kernel does: bit-identical too.
//! - K-quants, `dotprod` (`FEAT_DotProd`): `sdot` per 16-element group, times the group scale
//!   (`mla`), reduced to one exact `i32` per block; the f32 update is then
//!   `sumf += d · isum` (and `sumf −= dmin · Σ bsums·mins` for `Q4_K`/`Q5_K`) per block instead
//!   of the generic eight lane sums. The integer totals are exact, so the result differs from the
//!   generic one by f32 rounding only: with `u = 2⁻²⁴`, `nb` blocks and
//!   `T = Σ |d·sc·q·q8| + Σ |dmin·min·bsum|` (the absolute sum of the f32 terms), the generic
//!   result is within `γ(nb + 10)·T` of the exact sum (each term rounded twice, then at most
//!   `nb + 8` additions) and this one within `γ(2·nb + 2)·T`, so they are at most about
//!   `(3·nb + 12)·u·T` apart (`tests/linear.rs` allows `(3·nb + 16)·u·T` plus the bias
//!   rounding). `Q2_K` keeps the generic per-block formula and stays bit-identical.
//! - `Q4_1`, `Q5_0`, `Q5_1`: the exact integer sum of each 32-element block (`smull` +
//!   `sadalp` or `sdot`), then the generic f32 scaling (`sumf += (dx·dy)·sumi + mx·sy`;
//!   `Q5_0`: `sumf = fma(sumi, dx·dy, sumf)`): bit-identical in both paths.
//!
//! The `i8mm` table uses the `dotprod` kernels for these types (or the `base` ones on a CPU with
//! `i8mm` but without `dotprod`); [`variant_name`] reports which.

use std::arch::aarch64::{
    int16x8_t, int8x16_t, uint8x16_t, vaddq_f32, vaddq_s16, vaddq_s32, vaddvq_s32, vandq_u8,
    vcombine_u8, vcvtq_f32_s32, vdup_n_u8, vdupq_n_f32, vdupq_n_s32, vdupq_n_s8, vdupq_n_u8,
    vget_low_s16, vget_low_s8, vld1q_s16, vld1q_s8, vld1q_u8, vmlal_high_n_s16, vmlal_high_s16,
    vmlal_n_s16, vmlal_s16, vmlaq_n_s32, vmull_high_s8, vmull_s16, vmull_s8, vmulq_n_f32, vorrq_u8,
    vreinterpretq_s8_u8, vshlq_u8, vshrq_n_u8, vst1q_f32, vsubq_s8, vtstq_u8,
};

use edge_kernels::quant::{activation_row_bytes, quantize_activation_row};
use edge_schema::DType;
use rayon::prelude::*;

use super::quant::{block_dot_base, block_dot_sdot, sdot, widen4, IntPath};

/// Weight rows sharing one activation block.
const COLS: usize = 4;
const _: () = assert!(COLS == 4, "widen4 converts the scales of COLS rows at once");
/// Output columns per task.
const COL_BLOCK: usize = 64;
/// Elements per K-quant super-block (`QK_K`).
const QK_K: usize = 256;
/// Bytes of one `block_q8_K`: f32 scale + 256 × i8 + 16 × i16 group sums.
const Q8K_BYTES: usize = 292;
/// Offset of `qs` in a `block_q8_K`.
const Q8K_QS: usize = 4;
/// Offset of `bsums` in a `block_q8_K`.
const Q8K_BSUMS: usize = 260;
/// Bytes of one `block_q8_0`: f16 scale + 32 × i8.
const Q8_0_BYTES: usize = 34;
/// Bytes of one `block_q8_1`: f16 scale + f16 `d·Σq` + 32 × i8.
const Q8_1_BYTES: usize = 36;

/// The instructions a kernel actually runs (an [`IntPath`] resolved against the CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    /// ARMv8.0 `smull`/`smlal`.
    Base,
    /// `sdot`.
    Sdot,
}

/// `path` resolved: `I8mm` runs the `sdot` kernels when the CPU has `FEAT_DotProd`, else the
/// ARMv8.0 ones.
fn resolve(path: IntPath) -> Isa {
    match path {
        IntPath::Base => Isa::Base,
        IntPath::DotProd => Isa::Sdot,
        IntPath::I8mm if super::features().dotprod => Isa::Sdot,
        IntPath::I8mm => Isa::Base,
    }
}

/// Whether this module has kernels for weights of type `dtype`.
pub(super) fn handles(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q2K
            | DType::Q3K
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
    )
}

/// The kernel [`linear_kquant`] runs for `dtype` on `path`, or `None` when [`handles`] is
/// false.
pub(super) fn variant_name(dtype: DType, path: IntPath) -> Option<&'static str> {
    let sdot = resolve(path) == Isa::Sdot;
    let pick = |base: &'static str, dot: &'static str| Some(if sdot { dot } else { base });
    match dtype {
        DType::Q2K => pick("neon_linear_q2_k_base", "neon_linear_q2_k_dotprod"),
        DType::Q3K => pick("neon_linear_q3_k_base", "neon_linear_q3_k_dotprod"),
        DType::Q4K => pick("neon_linear_q4_k_base", "neon_linear_q4_k_dotprod"),
        DType::Q5K => pick("neon_linear_q5_k_base", "neon_linear_q5_k_dotprod"),
        DType::Q6K => pick("neon_linear_q6_k_base", "neon_linear_q6_k_dotprod"),
        DType::Q4_1 => pick("neon_linear_q4_1_base", "neon_linear_q4_1_dotprod"),
        DType::Q5_0 => pick("neon_linear_q5_0_base", "neon_linear_q5_0_dotprod"),
        DType::Q5_1 => pick("neon_linear_q5_1_base", "neon_linear_q5_1_dotprod"),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// Reads the little-endian u16 at `p`.
///
/// # Safety
/// `p` points to 2 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: 2 readable bytes at p (caller); read unaligned.
    u16::from_le(unsafe { p.cast::<u16>().read_unaligned() })
}

/// Reads the little-endian f32 at `p`.
///
/// # Safety
/// `p` points to 4 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: 4 readable bytes at p (caller); read unaligned.
    f32::from_bits(u32::from_le(unsafe { p.cast::<u32>().read_unaligned() }))
}

/// Loads 16 bytes at `p` as unsigned lanes.
///
/// # Safety
/// `p` points to 16 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld(p: *const u8) -> uint8x16_t {
    // SAFETY: 16 readable bytes at p (caller).
    unsafe { vld1q_u8(p) }
}

/// `v & 0x0F` as i8 lanes.
#[inline]
#[target_feature(enable = "neon")]
fn lo4(v: uint8x16_t) -> uint8x16_t {
    vandq_u8(v, vdupq_n_u8(0x0F))
}

/// `v >> 4` per lane.
#[inline]
#[target_feature(enable = "neon")]
fn hi4(v: uint8x16_t) -> uint8x16_t {
    vshrq_n_u8::<4>(v)
}

/// `(v >> sh) & 3` per lane (`sh` ≤ 6; folded to an immediate shift when inlined).
#[inline]
#[target_feature(enable = "neon")]
fn crumb(v: uint8x16_t, sh: usize) -> uint8x16_t {
    vandq_u8(vshlq_u8(v, vdupq_n_s8(-(sh as i8))), vdupq_n_u8(3))
}

/// `val` in the lanes where `v & mask != 0`, else 0.
#[inline]
#[target_feature(enable = "neon")]
fn bit_as(v: uint8x16_t, mask: u8, val: u8) -> uint8x16_t {
    vandq_u8(vtstq_u8(v, vdupq_n_u8(mask)), vdupq_n_u8(val))
}

/// Unsigned lanes reinterpreted as i8 (all values used here are below 128).
#[inline]
#[target_feature(enable = "neon")]
fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

// ---------------------------------------------------------------------------------------------
// K-quant weight formats
// ---------------------------------------------------------------------------------------------

/// How a K-quant block's integer sums enter the f32 result (the generic kernels' forms).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `sums[l] += d·aux32[l]` (8 f32 lanes), summed at the end (`Q3_K`, `Q6_K`).
    Lanes,
    /// As `Lanes`, and `sumf −= dmin·Σ bsums·mins` per block (`Q4_K`, `Q5_K`).
    LanesMins,
    /// `sumf += dall·isum − dmin·Σ bsums·mins` per block (`Q2_K`).
    Single,
}

/// The per-block values besides the quants.
struct KHead {
    /// f16 bits of the super-block scale `d`.
    d: u16,
    /// f16 bits of `dmin` (0 for types without mins).
    dmin: u16,
    /// Signed scale of each 16-element group.
    sc: [i16; 16],
    /// Min of each 16-element group (all 0 for types without mins).
    mins: [i16; 16],
}

/// One K-quant weight format: block size, header decoding and quant unpacking.
trait KQuant {
    /// Bytes per 256-element block.
    const BYTES: usize;
    /// How the integer sums are scaled.
    const FORM: Form;
    /// Whether groups `2j` and `2j + 1` always share one scale (32-element sub-blocks).
    const PAIRED: bool;

    /// The block's scales and mins.
    ///
    /// # Safety
    /// `blk` points to one readable block.
    unsafe fn head(blk: *const u8) -> KHead;

    /// The quants of elements `64·s .. 64·s + 64` (`s` < 4) as four 16-lane i8 vectors, in
    /// element order, with the format's offset applied (the generic kernels' `aux8`).
    ///
    /// # Safety
    /// `blk` points to one readable block.
    unsafe fn quants(blk: *const u8, s: usize) -> [int8x16_t; 4];
}

/// ggml `get_scale_min_k4` for all 8 sub-blocks of a `Q4_K`/`Q5_K` block: `(scale, min)` per
/// 32 elements, 6 bits each, widened to the 16 groups of 16.
fn k4_scales(q: &[u8; 12]) -> ([i16; 16], [i16; 16]) {
    let mut sc = [0i16; 16];
    let mut mins = [0i16; 16];
    for j in 0..8 {
        let (s, m) = if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        };
        sc[2 * j] = s as i16;
        sc[2 * j + 1] = s as i16;
        mins[2 * j] = m as i16;
        mins[2 * j + 1] = m as i16;
    }
    (sc, mins)
}

/// Reads the 12 packed scale bytes at `p`.
///
/// # Safety
/// `p` points to 12 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn bytes12(p: *const u8) -> [u8; 12] {
    // SAFETY: 12 readable bytes at p (caller); [u8; 12] has alignment 1.
    unsafe { p.cast::<[u8; 12]>().read() }
}

/// `block_q4_K`: `d`, `dmin` (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
/// (elements `64h + l` low nibble and `64h + 32 + l` high nibble of byte `32h + l`). 144 bytes.
struct Q4K;

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const FORM: Form = Form::LanesMins;
    const PAIRED: bool = true;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn head(blk: *const u8) -> KHead {
        // SAFETY: the block's d (0..2), dmin (2..4) and scales (4..16) lie within it (caller).
        let (d, dmin, q) = unsafe { (rd_u16(blk), rd_u16(blk.add(2)), bytes12(blk.add(4))) };
        let (sc, mins) = k4_scales(&q);
        KHead { d, dmin, sc, mins }
    }

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn quants(blk: *const u8, s: usize) -> [int8x16_t; 4] {
        // SAFETY: bytes 16 + 32s .. 48 + 32s (s < 4) lie within the block (caller).
        let (v0, v1) = unsafe { (ld(blk.add(16 + 32 * s)), ld(blk.add(32 + 32 * s))) };
        [s8(lo4(v0)), s8(lo4(v1)), s8(hi4(v0)), s8(hi4(v1))]
    }
}

/// `block_q5_K`: as `block_q4_K` plus 32 bytes `qh` of fifth bits (bit `2h` of `qh[l]` for
/// element `64h + l`, bit `2h + 1` for `64h + 32 + l`). 176 bytes.
struct Q5K;

impl KQuant for Q5K {
    const BYTES: usize = 176;
    const FORM: Form = Form::LanesMins;
    const PAIRED: bool = true;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn head(blk: *const u8) -> KHead {
        // SAFETY: as for Q4_K (same header layout).
        unsafe { Q4K::head(blk) }
    }

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn quants(blk: *const u8, s: usize) -> [int8x16_t; 4] {
        // SAFETY: qh (16..48) and the nibbles 48 + 32s .. 80 + 32s (s < 4) lie within the
        // block (caller).
        let (h0, h1, v0, v1) = unsafe {
            (
                ld(blk.add(16)),
                ld(blk.add(32)),
                ld(blk.add(48 + 32 * s)),
                ld(blk.add(64 + 32 * s)),
            )
        };
        let (m0, m1) = (1u8 << (2 * s), 2u8 << (2 * s));
        [
            s8(vorrq_u8(lo4(v0), bit_as(h0, m0, 16))),
            s8(vorrq_u8(lo4(v1), bit_as(h1, m0, 16))),
            s8(vorrq_u8(hi4(v0), bit_as(h0, m1, 16))),
            s8(vorrq_u8(hi4(v1), bit_as(h1, m1, 16))),
        ]
    }
}

/// `block_q6_K`: 128 bytes `ql` (low 4 bits), 64 bytes `qh` (high 2 bits), 16 i8 scales, f16
/// `d`; element values `q − 32`. 210 bytes.
struct Q6K;

impl KQuant for Q6K {
    const BYTES: usize = 210;
    const FORM: Form = Form::Lanes;
    const PAIRED: bool = false;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn head(blk: *const u8) -> KHead {
        // SAFETY: scales (192..208) and d (208..210) lie within the block (caller).
        let (d, raw) = unsafe { (rd_u16(blk.add(208)), blk.add(192).cast::<[i8; 16]>().read()) };
        KHead {
            d,
            dmin: 0,
            sc: raw.map(i16::from),
            mins: [0; 16],
        }
    }

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn quants(blk: *const u8, s: usize) -> [int8x16_t; 4] {
        let (h, odd) = (s / 2, s % 2 == 1);
        // SAFETY: ql bytes 64h .. 64h + 64 and qh bytes 128 + 32h .. 160 + 32h (h < 2) lie
        // within the block (caller).
        let (l, q0, q1) = unsafe {
            (
                [0, 16, 32, 48].map(|o| ld(blk.add(64 * h + o))),
                ld(blk.add(128 + 32 * h)),
                ld(blk.add(144 + 32 * h)),
            )
        };
        let nib = |v: uint8x16_t| if odd { hi4(v) } else { lo4(v) };
        let sh = if odd { 4 } else { 0 };
        // ((q >> t) & 3) << 4 for t = sh + 2·part.
        let top = |q: uint8x16_t, t: i8| vandq_u8(vshlq_u8(q, vdupq_n_s8(4 - t)), vdupq_n_u8(0x30));
        let v = [
            vorrq_u8(nib(l[0]), top(q0, sh)),
            vorrq_u8(nib(l[1]), top(q1, sh)),
            vorrq_u8(nib(l[2]), top(q0, sh + 2)),
            vorrq_u8(nib(l[3]), top(q1, sh + 2)),
        ];
        v.map(|v| vsubq_s8(s8(v), vdupq_n_s8(32)))
    }
}

/// The 16 six-bit scales of a `Q3_K` block minus 32 (ggml's `kmask` unpacking in
/// `ggml_vec_dot_q3_K_q8_K_generic`): low 4 bits from byte `j` (`j` < 8, low nibble) or `j − 8`
/// (high nibble), high 2 bits from byte `8 + j % 4` at bit `2·(j / 4)`.
fn q3k_scales(s: &[u8; 12]) -> [i16; 16] {
    let mut out = [0i16; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i16 - 32;
    }
    out
}

/// `block_q3_K`: 32 bytes `hmask` (bit `t` of `hmask[l]` for element `32t + l`), 64 bytes of
/// 2-bit quants, 12 bytes of packed 6-bit scales, f16 `d`; element values `q − 4·(1 − hbit)`.
/// 110 bytes.
struct Q3K;

impl KQuant for Q3K {
    const BYTES: usize = 110;
    const FORM: Form = Form::Lanes;
    const PAIRED: bool = false;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn head(blk: *const u8) -> KHead {
        // SAFETY: scales (96..108) and d (108..110) lie within the block (caller).
        let (d, raw) = unsafe { (rd_u16(blk.add(108)), bytes12(blk.add(96))) };
        KHead {
            d,
            dmin: 0,
            sc: q3k_scales(&raw),
            mins: [0; 16],
        }
    }

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn quants(blk: *const u8, s: usize) -> [int8x16_t; 4] {
        let (half, sh) = (s / 2, 4 * (s % 2));
        // SAFETY: hmask (0..32) and qs bytes 32 + 32·half .. 64 + 32·half (half < 2) lie
        // within the block (caller).
        let (h0, h1, q0, q1) = unsafe {
            (
                ld(blk),
                ld(blk.add(16)),
                ld(blk.add(32 + 32 * half)),
                ld(blk.add(48 + 32 * half)),
            )
        };
        let (m0, m1) = (1u8 << (2 * s), 2u8 << (2 * s));
        let v = [
            vorrq_u8(crumb(q0, sh), bit_as(h0, m0, 4)),
            vorrq_u8(crumb(q1, sh), bit_as(h1, m0, 4)),
            vorrq_u8(crumb(q0, sh + 2), bit_as(h0, m1, 4)),
            vorrq_u8(crumb(q1, sh + 2), bit_as(h1, m1, 4)),
        ];
        v.map(|v| vsubq_s8(s8(v), vdupq_n_s8(4)))
    }
}

/// `block_q2_K`: 16 bytes of 4-bit scale (low) / min (high) per group, 64 bytes of 2-bit
/// quants (element `32t + l` at bits `2·(t % 4)` of byte `32·(t / 4) + l`), f16 `d`, `dmin`.
/// 84 bytes.
struct Q2K;

impl KQuant for Q2K {
    const BYTES: usize = 84;
    const FORM: Form = Form::Single;
    const PAIRED: bool = false;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn head(blk: *const u8) -> KHead {
        // SAFETY: scales (0..16), d (80..82) and dmin (82..84) lie within the block (caller).
        let (raw, d, dmin) = unsafe {
            (
                blk.cast::<[u8; 16]>().read(),
                rd_u16(blk.add(80)),
                rd_u16(blk.add(82)),
            )
        };
        KHead {
            d,
            dmin,
            sc: raw.map(|b| (b & 0x0F) as i16),
            mins: raw.map(|b| (b >> 4) as i16),
        }
    }

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn quants(blk: *const u8, s: usize) -> [int8x16_t; 4] {
        let (half, sh) = (s / 2, 4 * (s % 2));
        // SAFETY: qs bytes 16 + 32·half .. 48 + 32·half (half < 2) lie within the block
        // (caller).
        let (q0, q1) = unsafe { (ld(blk.add(16 + 32 * half)), ld(blk.add(32 + 32 * half))) };
        [
            s8(crumb(q0, sh)),
            s8(crumb(q1, sh)),
            s8(crumb(q0, sh + 2)),
            s8(crumb(q1, sh + 2)),
        ]
    }
}

// ---------------------------------------------------------------------------------------------
// K-quant dot products (4 weight rows × 1 Q8_K activation row)
// ---------------------------------------------------------------------------------------------

/// The 16 `bsums` of a `block_q8_K` at `ab`.
///
/// # Safety
/// `ab` points to one readable `block_q8_K`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn bsums(ab: *const u8) -> [int16x8_t; 2] {
    // SAFETY: bsums (260..292) lie within the block (caller); vld1q_s16 reads unaligned.
    unsafe {
        [
            vld1q_s16(ab.add(Q8K_BSUMS).cast::<i16>()),
            vld1q_s16(ab.add(Q8K_BSUMS + 16).cast::<i16>()),
        ]
    }
}

/// Exact `Σ_g bsums[g]·mins[g]` (|bsums| ≤ 16·127, mins < 64: no overflow).
#[inline]
#[target_feature(enable = "neon")]
fn mins_dot(bs: [int16x8_t; 2], mins: &[i16; 16]) -> i32 {
    // SAFETY: `mins` holds 16 i16 (32 readable bytes).
    let (m0, m1) = unsafe { (vld1q_s16(mins.as_ptr()), vld1q_s16(mins.as_ptr().add(8))) };
    let mut acc = vmull_s16(vget_low_s16(bs[0]), vget_low_s16(m0));
    acc = vmlal_high_s16(acc, bs[0], m0);
    acc = vmlal_s16(acc, vget_low_s16(bs[1]), vget_low_s16(m1));
    acc = vmlal_high_s16(acc, bs[1], m1);
    vaddvq_s32(acc)
}

/// Loads the 64 activation quants `64·s .. 64·s + 64` of the `block_q8_K` at `ab`.
///
/// # Safety
/// `ab` points to one readable `block_q8_K`, `s` < 4.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn act_seg(ab: *const u8, s: usize) -> [int8x16_t; 4] {
    // SAFETY: qs bytes 4 + 64s .. 68 + 64s lie within the block (caller).
    [0, 1, 2, 3].map(|i| unsafe { vld1q_s8(ab.add(Q8K_QS + 64 * s + 16 * i).cast::<i8>()) })
}

/// Dot products of `COLS` K-quant weight rows with one `Q8_K` activation row, ARMv8.0
/// instructions, in the generic kernels' integer lanes and f32 order (bit-identical).
///
/// # Safety
/// `act` points to `nb` `block_q8_K`, every `ws[c]` to `nb` blocks of `T`.
#[target_feature(enable = "neon")]
unsafe fn kdot4_base<T: KQuant>(act: *const u8, ws: &[*const u8; COLS], nb: usize) -> [f32; COLS] {
    let z = vdupq_n_f32(0.0);
    let mut lanes = [[z, z]; COLS];
    let mut sumf = [0.0f32; COLS];
    for b in 0..nb {
        // SAFETY: block b < nb lies within the activation row and every weight row (caller).
        let (ab, wb) = unsafe { (act.add(b * Q8K_BYTES), ws.map(|w| w.add(b * T::BYTES))) };
        // SAFETY: wb[c] points to one whole block of T (above).
        let heads: [KHead; COLS] = std::array::from_fn(|c| unsafe { T::head(wb[c]) });
        let mut aux = [[vdupq_n_s32(0); 2]; COLS];
        for s in 0..4 {
            // SAFETY: ab points to one whole block_q8_K, s < 4.
            let a = unsafe { act_seg(ab, s) };
            for c in 0..COLS {
                // SAFETY: wb[c] points to one whole block of T, s < 4.
                let w = unsafe { T::quants(wb[c], s) };
                for i in 0..4 {
                    let sc = heads[c].sc[4 * s + i];
                    // Lane l: elements l and l + 8 of the group (|q·q8| ≤ 32·127, exact).
                    let p = vaddq_s16(
                        vmull_s8(vget_low_s8(w[i]), vget_low_s8(a[i])),
                        vmull_high_s8(w[i], a[i]),
                    );
                    aux[c][0] = vmlal_n_s16(aux[c][0], vget_low_s16(p), sc);
                    aux[c][1] = vmlal_high_n_s16(aux[c][1], p, sc);
                }
            }
        }
        // SAFETY: ab points to one whole block_q8_K.
        let (da, bs) = unsafe { (rd_f32(ab), bsums(ab)) };
        let wd = widen4(std::array::from_fn(|c| heads[c].d));
        let wm = widen4(std::array::from_fn(|c| heads[c].dmin));
        for c in 0..COLS {
            let h = &heads[c];
            match T::FORM {
                Form::Single => {
                    let isum = vaddvq_s32(vaddq_s32(aux[c][0], aux[c][1]));
                    let summs = mins_dot(bs, &h.mins);
                    let dall = da * wd[c];
                    let dmin = da * wm[c];
                    sumf[c] += dall * isum as f32 - dmin * summs as f32;
                }
                Form::Lanes | Form::LanesMins => {
                    if T::FORM == Form::LanesMins {
                        let summs = mins_dot(bs, &h.mins);
                        let dmin = wm[c] * da;
                        sumf[c] -= dmin * summs as f32;
                    }
                    let d = wd[c] * da;
                    for half in 0..2 {
                        lanes[c][half] =
                            vaddq_f32(lanes[c][half], vmulq_n_f32(vcvtq_f32_s32(aux[c][half]), d));
                    }
                }
            }
        }
    }
    if T::FORM != Form::Single {
        for c in 0..COLS {
            let mut l = [0.0f32; 8];
            // SAFETY: `l` is an 8-element f32 stack array (32 writable bytes).
            unsafe {
                vst1q_f32(l.as_mut_ptr(), lanes[c][0]);
                vst1q_f32(l.as_mut_ptr().add(4), lanes[c][1]);
            }
            for v in l {
                sumf[c] += v;
            }
        }
    }
    sumf
}

/// [`kdot4_base`] with `sdot`: exact integer total per block, then one f32 update per block
/// (see the module doc for the bound against the generic kernel; `Q2_K` stays bit-identical).
///
/// # Safety
/// As [`kdot4_base`], and the CPU implements `FEAT_DotProd`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn kdot4_sdot<T: KQuant>(act: *const u8, ws: &[*const u8; COLS], nb: usize) -> [f32; COLS] {
    let mut sumf = [0.0f32; COLS];
    let zero = vdupq_n_s32(0);
    for b in 0..nb {
        // SAFETY: block b < nb lies within the activation row and every weight row (caller).
        let (ab, wb) = unsafe { (act.add(b * Q8K_BYTES), ws.map(|w| w.add(b * T::BYTES))) };
        // SAFETY: wb[c] points to one whole block of T (above).
        let heads: [KHead; COLS] = std::array::from_fn(|c| unsafe { T::head(wb[c]) });
        let mut acc = [zero; COLS];
        for s in 0..4 {
            // SAFETY: ab points to one whole block_q8_K, s < 4.
            let a = unsafe { act_seg(ab, s) };
            for c in 0..COLS {
                // SAFETY: wb[c] points to one whole block of T, s < 4.
                let w = unsafe { T::quants(wb[c], s) };
                let sc = &heads[c].sc;
                if T::PAIRED {
                    for j in 0..2 {
                        // SAFETY: FEAT_DotProd present (caller).
                        let t = unsafe {
                            sdot(sdot(zero, w[2 * j], a[2 * j]), w[2 * j + 1], a[2 * j + 1])
                        };
                        acc[c] = vmlaq_n_s32(acc[c], t, sc[4 * s + 2 * j] as i32);
                    }
                } else {
                    for i in 0..4 {
                        // SAFETY: FEAT_DotProd present (caller).
                        let t = unsafe { sdot(zero, w[i], a[i]) };
                        acc[c] = vmlaq_n_s32(acc[c], t, sc[4 * s + i] as i32);
                    }
                }
            }
        }
        // SAFETY: ab points to one whole block_q8_K.
        let (da, bs) = unsafe { (rd_f32(ab), bsums(ab)) };
        let wd = widen4(std::array::from_fn(|c| heads[c].d));
        let wm = widen4(std::array::from_fn(|c| heads[c].dmin));
        for c in 0..COLS {
            let h = &heads[c];
            let isum = vaddvq_s32(acc[c]);
            match T::FORM {
                Form::Single => {
                    let summs = mins_dot(bs, &h.mins);
                    let dall = da * wd[c];
                    let dmin = da * wm[c];
                    sumf[c] += dall * isum as f32 - dmin * summs as f32;
                }
                Form::Lanes | Form::LanesMins => {
                    sumf[c] += wd[c] * da * isum as f32;
                    if T::FORM == Form::LanesMins {
                        let summs = mins_dot(bs, &h.mins);
                        sumf[c] -= wm[c] * da * summs as f32;
                    }
                }
            }
        }
    }
    sumf
}

/// Safe front of the K-quant dot kernels: checks every length, and the CPU feature for the
/// `sdot` kernel.
fn kdot4<T: KQuant>(isa: Isa, act: &[u8], ws: [&[u8]; COLS], nb: usize) -> [f32; COLS] {
    assert_eq!(
        act.len(),
        nb * Q8K_BYTES,
        "neon kdot4: activation row length"
    );
    for w in &ws {
        assert_eq!(w.len(), nb * T::BYTES, "neon kdot4: weight row length");
    }
    let wp: [*const u8; COLS] = ws.map(<[u8]>::as_ptr);
    match isa {
        // SAFETY: the activation row holds nb block_q8_K and every weight row nb blocks of T
        // (asserted above); NEON is baseline on aarch64.
        Isa::Base => unsafe { kdot4_base::<T>(act.as_ptr(), &wp, nb) },
        Isa::Sdot => {
            assert!(
                super::features().dotprod,
                "neon kdot4: the dotprod kernel was called on a CPU without FEAT_DotProd"
            );
            // SAFETY: lengths asserted above; FEAT_DotProd detected at run time just above.
            unsafe { kdot4_sdot::<T>(act.as_ptr(), &wp, nb) }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Legacy 32-element formats: Q4_1, Q5_0, Q5_1
// ---------------------------------------------------------------------------------------------

/// One legacy weight format paired with its activation format (`Q8_0` or `Q8_1`).
trait Legacy {
    /// Bytes per 32-element weight block.
    const BYTES: usize;
    /// Whether the block has a min `m` (then the activation is `Q8_1`, whose `s = d·Σq` enters
    /// as `+ m·s`); otherwise the activation is `Q8_0`.
    const MIN: bool;

    /// f16 bits of `d`, of `m` (0 without a min), and the 32 quants (offset applied) as two
    /// 16-lane i8 vectors in element order.
    ///
    /// # Safety
    /// `blk` points to one readable block.
    unsafe fn load(blk: *const u8) -> (u16, u16, int8x16_t, int8x16_t);
}

/// The fifth bits of a `Q5_0`/`Q5_1` block as `16` in the lanes of elements whose bit is set
/// (bit `e` of the little-endian `qh` for element `e`), for elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "neon")]
fn q5_high(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let bits: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `bits` is a 16-byte stack array.
    let bits = unsafe { vld1q_u8(bits.as_ptr()) };
    let spread = |a: u8, b: u8| vcombine_u8(vdup_n_u8(a), vdup_n_u8(b));
    let sixteen = vdupq_n_u8(16);
    (
        vandq_u8(vtstq_u8(spread(qh[0], qh[1]), bits), sixteen),
        vandq_u8(vtstq_u8(spread(qh[2], qh[3]), bits), sixteen),
    )
}

/// `block_q4_1`: f16 `d`, f16 `m`, 16 bytes of nibbles (low → elements 0..16, high → 16..32);
/// `x = d·q + m`. 20 bytes.
struct Q4_1;

impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const MIN: bool = true;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load(blk: *const u8) -> (u16, u16, int8x16_t, int8x16_t) {
        // SAFETY: d (0..2), m (2..4) and qs (4..20) lie within the block (caller).
        let (d, m, v) = unsafe { (rd_u16(blk), rd_u16(blk.add(2)), ld(blk.add(4))) };
        (d, m, s8(lo4(v)), s8(hi4(v)))
    }
}

/// `block_q5_0`: f16 `d`, 4 bytes `qh`, 16 bytes of nibbles; `x = d·(q − 16)`. 22 bytes.
struct Q5_0;

impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const MIN: bool = false;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load(blk: *const u8) -> (u16, u16, int8x16_t, int8x16_t) {
        // SAFETY: d (0..2), qh (2..6) and qs (6..22) lie within the block (caller).
        let (d, qh, v) = unsafe {
            (
                rd_u16(blk),
                blk.add(2).cast::<[u8; 4]>().read(),
                ld(blk.add(6)),
            )
        };
        let (h0, h1) = q5_high(qh);
        let sixteen = vdupq_n_s8(16);
        (
            d,
            0,
            vsubq_s8(s8(vorrq_u8(lo4(v), h0)), sixteen),
            vsubq_s8(s8(vorrq_u8(hi4(v), h1)), sixteen),
        )
    }
}

/// `block_q5_1`: f16 `d`, f16 `m`, 4 bytes `qh`, 16 bytes of nibbles; `x = d·q + m`. 24 bytes.
struct Q5_1;

impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const MIN: bool = true;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load(blk: *const u8) -> (u16, u16, int8x16_t, int8x16_t) {
        // SAFETY: d (0..2), m (2..4), qh (4..8) and qs (8..24) lie within the block (caller).
        let (d, m, qh, v) = unsafe {
            (
                rd_u16(blk),
                rd_u16(blk.add(2)),
                blk.add(4).cast::<[u8; 4]>().read(),
                ld(blk.add(8)),
            )
        };
        let (h0, h1) = q5_high(qh);
        (d, m, s8(vorrq_u8(lo4(v), h0)), s8(vorrq_u8(hi4(v), h1)))
    }
}

/// Dot products of `COLS` legacy weight rows with one `Q8_0`/`Q8_1` activation row; the f32
/// scaling per block is the generic one (`sumf += (dx·dy)·sumi + mx·sy` for `Q4_1`/`Q5_1`,
/// `sumf = fma(sumi, dx·dy, sumf)` for `Q5_0`), bit-identical.
///
/// # Safety
/// `act` points to `nb` activation blocks (`Q8_1` if `T::MIN`, else `Q8_0`), every `ws[c]` to
/// `nb` blocks of `T`; with `SDOT` the CPU implements `FEAT_DotProd`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn ldot4<T: Legacy, const SDOT: bool>(
    act: *const u8,
    ws: &[*const u8; COLS],
    nb: usize,
) -> [f32; COLS] {
    let (abytes, aqs) = if T::MIN {
        (Q8_1_BYTES, 4)
    } else {
        (Q8_0_BYTES, 2)
    };
    let mut sumf = [0.0f32; COLS];
    for b in 0..nb {
        // SAFETY: block b < nb lies within the activation row (caller).
        let (ad, as_, a0, a1) = unsafe {
            let p = act.add(b * abytes);
            (
                rd_u16(p),
                if T::MIN { rd_u16(p.add(2)) } else { 0 },
                vld1q_s8(p.add(aqs).cast::<i8>()),
                vld1q_s8(p.add(aqs + 16).cast::<i8>()),
            )
        };
        let mut dbits = [0u16; COLS];
        let mut mbits = [0u16; COLS];
        let mut sumi = [0i32; COLS];
        for c in 0..COLS {
            // SAFETY: block b < nb lies within weight row c (caller).
            let (d, m, w0, w1) = unsafe { T::load(ws[c].add(b * T::BYTES)) };
            dbits[c] = d;
            mbits[c] = m;
            sumi[c] = if SDOT {
                // SAFETY: FEAT_DotProd present when SDOT (caller).
                unsafe { block_dot_sdot(w0, w1, a0, a1) }
            } else {
                block_dot_base(w0, w1, a0, a1)
            };
        }
        let (dx, mx, [dy, sy, _, _]) = (widen4(dbits), widen4(mbits), widen4([ad, as_, 0, 0]));
        for c in 0..COLS {
            sumf[c] = if T::MIN {
                sumf[c] + ((dx[c] * dy) * sumi[c] as f32 + mx[c] * sy)
            } else {
                // Q5_0: fused, as the generic kernel does (`sumf = fma(sumi, dx·dy, sumf)`).
                (sumi[c] as f32).mul_add(dx[c] * dy, sumf[c])
            };
        }
    }
    sumf
}

/// [`ldot4`] with ARMv8.0 instructions.
///
/// # Safety
/// As [`ldot4`].
#[target_feature(enable = "neon")]
unsafe fn ldot4_base<T: Legacy>(act: *const u8, ws: &[*const u8; COLS], nb: usize) -> [f32; COLS] {
    // SAFETY: forwarded contract (caller).
    unsafe { ldot4::<T, false>(act, ws, nb) }
}

/// [`ldot4`] with `sdot`.
///
/// # Safety
/// As [`ldot4`], and the CPU implements `FEAT_DotProd`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn ldot4_sdot<T: Legacy>(act: *const u8, ws: &[*const u8; COLS], nb: usize) -> [f32; COLS] {
    // SAFETY: forwarded contract (caller), FEAT_DotProd present (caller).
    unsafe { ldot4::<T, true>(act, ws, nb) }
}

/// Safe front of the legacy dot kernels: checks every length, and the CPU feature for the
/// `sdot` kernel.
fn ldot4_front<T: Legacy>(isa: Isa, act: &[u8], ws: [&[u8]; COLS], nb: usize) -> [f32; COLS] {
    let abytes = if T::MIN { Q8_1_BYTES } else { Q8_0_BYTES };
    assert_eq!(act.len(), nb * abytes, "neon ldot4: activation row length");
    for w in &ws {
        assert_eq!(w.len(), nb * T::BYTES, "neon ldot4: weight row length");
    }
    let wp: [*const u8; COLS] = ws.map(<[u8]>::as_ptr);
    match isa {
        // SAFETY: the activation row holds nb activation blocks and every weight row nb blocks
        // of T (asserted above); NEON is baseline on aarch64.
        Isa::Base => unsafe { ldot4_base::<T>(act.as_ptr(), &wp, nb) },
        Isa::Sdot => {
            assert!(
                super::features().dotprod,
                "neon ldot4: the dotprod kernel was called on a CPU without FEAT_DotProd"
            );
            // SAFETY: lengths asserted above; FEAT_DotProd detected at run time just above.
            unsafe { ldot4_sdot::<T>(act.as_ptr(), &wp, nb) }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// linear
// ---------------------------------------------------------------------------------------------

/// A safe 4-column dot front: (`isa`, activation row, `COLS` weight rows, blocks per row) →
/// `COLS` dot products.
type DotFn = fn(Isa, &[u8], [&[u8]; COLS], usize) -> [f32; COLS];

/// `out = x · wᵀ + bias` for the weight types of [`handles`]; shapes already checked by the
/// caller (`x` `[m, k]`, `w` `[n, k]` of `dtype` with `k` a whole number of blocks, `bias`
/// `[n]`, `out` `[m, n]`, `m, n > 0`, `scratch` ≥ `m · activation_row_bytes(dtype, k)` bytes).
pub(super) fn linear_kquant(
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
    let isa = resolve(path);
    let kb = k / QK_K;
    let lb = k / 32;
    let dot: DotFn = match dtype {
        DType::Q2K => kdot4::<Q2K>,
        DType::Q3K => kdot4::<Q3K>,
        DType::Q4K => kdot4::<Q4K>,
        DType::Q5K => kdot4::<Q5K>,
        DType::Q6K => kdot4::<Q6K>,
        DType::Q4_1 => ldot4_front::<Q4_1>,
        DType::Q5_0 => ldot4_front::<Q5_0>,
        DType::Q5_1 => ldot4_front::<Q5_1>,
        other => unreachable!("neon linear_kquant dispatched for {other:?}"),
    };
    let nb = if dtype.block_size() == QK_K { kb } else { lb };
    let arow = activation_row_bytes(dtype, k);
    if k == 0 || arow == 0 {
        for row in out.chunks_mut(n) {
            for (j, o) in row.iter_mut().enumerate() {
                *o = bias.map_or(0.0, |b| b[j]);
            }
        }
        return;
    }
    let wrow = w.len() / n;
    let acts = &mut scratch[..m * arow];
    acts.par_chunks_mut(arow)
        .zip(x.par_chunks(k))
        .for_each(|(dst, src)| quantize_activation_row(dtype, src, dst));
    let acts = &*acts;
    let wr = |j: usize| &w[j * wrow..(j + 1) * wrow];
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let act = &acts[i * arow..(i + 1) * arow];
        row.par_chunks_mut(COL_BLOCK)
            .enumerate()
            .for_each(|(cb, cols)| {
                for (jt, chunk) in cols.chunks_mut(COLS).enumerate() {
                    let j0 = cb * COL_BLOCK + jt * COLS;
                    // Past the last column, row n − 1 is recomputed and discarded.
                    let ws: [&[u8]; COLS] = std::array::from_fn(|c| wr((j0 + c).min(n - 1)));
                    let s = dot(isa, act, ws, nb);
                    for (c, o) in chunk.iter_mut().enumerate() {
                        *o = match bias {
                            Some(b) => s[c] + b[j0 + c],
                            None => s[c],
                        };
                    }
                }
            });
    });
}
