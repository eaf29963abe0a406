//! Quantized `linear` for the 32-element ggml block types on AVX2: the panel driver of
//! [`super::qgemm`] with a tile built on `vpmaddubsw` / `vpmaddwd` (no VNNI), bit-identical to
//! [`edge_kernels::linear`] like the VNNI tile.
//!
//! Method (the sign trick of ggml's AVX2 `mul_sum_i8_pairs`, on a column-in-lanes layout, not
//! its code):
//! - Activation rows are quantized to the weights' `vec_dot` type as the generic kernel does
//!   (`Q8_0` in AVX2 lanes with the generic rounding, `Q8_1` by the generic scalar code) and
//!   stored widened ([`ACT_BLOCK`]: f32 scale, f32 sum, 32 signed quants). Where the block's
//!   f16 scale `da` is not 0, `d = amax / 127` is a normal f32 and every quant is in
//!   −127..=127. Where it is 0, ggml's quants may saturate to −128 (subnormal `d`, infinite
//!   `1/d`) and the integer sum below may then be wrong, which changes no output bit: the
//!   block's term `sumi · (dw · 0)` (fused into `sumf`), `(sumi · dw) · 0` or `(dw · 0) · sumi +
//!   mw · sa` is ±0 or the same NaN whatever `sumi` is, and a ±0 term leaves `sumf` (from +0)
//!   as it was.
//! - Weights are repacked [`edge_kernels::quant_panel_cols`] columns at a time into scratch: per group of 8
//!   columns and block, eight k-steps of `8 columns × 4 bytes` of the signed values ggml's
//!   generic dot multiplies ([`quant::block32_values`]), then 8 f32 scales and 8 f32 minimums
//!   ([`GROUP_BLOCK`] = 320 bytes).
//! - Per k-step, row and group: `vpmaddubsw(|w|, sign(a, w))` multiplies `|w| ≤ 128` (unsigned)
//!   by `±a` with `|a| ≤ 127` and adds pairs — at most `2·128·127 = 32512`, so it does not
//!   saturate — and `vpmaddwd` with ones adds the pairs' pairs into the row's i32 column sums:
//!   the exact integer block sum `Σ q·w` (|sum| ≤ 32·128·127).
//! - The f32 terms are formed and added per block in the generic order (as in the VNNI tile:
//!   `Q8_0`, `Q5_0`: `sumf = fma(sumi, dw · da, sumf)`; `Q4_0`: `sumf + (sumi · dw) · da`;
//!   `Q4_1`, `Q5_1`: `sumf + ((dw · da) · sumi + mw · sa)`), then the driver adds the bias.
//! - A register tile is 4 activation rows × 8 columns (4 integer and 4 f32 accumulators of the
//!   16 ymm registers); a call of the driver's two groups runs it once per group.

use std::arch::x86_64::*;

use edge_kernels::{quant, WeightRef};
use edge_schema::plan::PackLayout;
use edge_schema::DType;

use super::qgemm::{
    pack_group_values, put_scales, widen_activation_row, GroupSrc, Panel, Scaling, TileSums,
    ACT_BLOCK, ACT_QUANTS_AT, MAX_R,
};

/// Columns per ymm group.
const GROUP: usize = 8;
/// Bytes of the eight k-steps of one block of one group.
const QUANTS: usize = 8 * GROUP * 4;
/// Offsets inside a group block: 8 f32 scales, then 8 f32 minimums.
const SCALE_AT: usize = QUANTS;
const MIN_AT: usize = QUANTS + 4 * GROUP;
/// Bytes of one block of one group in a scratch slot.
const GROUP_BLOCK: usize = MIN_AT + 4 * GROUP;
/// Activation rows per register tile.
const R: usize = 4;

// The planner reserves `QUANT_PANEL_BLOCK_BYTES` per column and block (the VNNI layout).
const _: () = assert!(GROUP_BLOCK <= GROUP * edge_kernels::QUANT_PANEL_BLOCK_BYTES);

/// The AVX2 tile (4 rows × 8 columns, signed quants).
pub(crate) struct Avx2;

impl Panel for Avx2 {
    const GROUP: usize = GROUP;
    const GROUP_BLOCK: usize = GROUP_BLOCK;
    const R: usize = R;
    const INTERLEAVED16X4: bool = false;

    fn quantize_row(w: DType, x: &[f32], dst: &mut [u8]) {
        if quant::activation_type(w) == quant::ActFormat::Q8_0 {
            assert!(x.len().is_multiple_of(32) && dst.len() == x.len() / 32 * ACT_BLOCK);
            // SAFETY: AVX2 (and FMA) were detected before this kernel was put in a table
            // (`crate::x86_64::avx2_table`); the lengths are asserted above.
            unsafe { quantize_q8_0::<false>(x, dst) };
            return;
        }
        widen_activation_row::<false>(w, x, dst, 0);
    }

    fn prepare_group(
        w: WeightRef<'_>,
        wrow: usize,
        bb: usize,
        n: usize,
        j0: usize,
        _in_place: bool,
        dst: &mut [u8],
    ) {
        pack_group(w, wrow, bb, n, j0, dst)
    }

    fn tile(
        w: DType,
        kind: Scaling,
        acts: &[&[u8]; MAX_R],
        srcs: &[GroupSrc<'_>],
        nb: usize,
        res: &mut TileSums,
    ) {
        let ap = checked_rows(acts, srcs, nb);
        // `Q4_0`, `Q4_1`, `Q5_0`: |w| ≤ 16, so the 16 products a 16-bit lane gathers over a
        // block's eight k-steps stay within 16·16·127 = 32512: one `vpmaddwd` per block.
        let narrow = matches!(w, DType::Q4_0 | DType::Q4_1 | DType::Q5_0);
        for (g, s) in srcs.iter().enumerate() {
            // SAFETY: the kernel table holds this kernel only when AVX2 and FMA were detected
            // (`crate::x86_64::avx2_table`); every offset read stays inside `acts[r]` (block
            // `b < nb` of ACT_BLOCK bytes) and inside the group's quants and meta (block
            // `b < nb`), as `checked_rows` asserted; `8g + 8 ≤ 16 ≤ MAX_COLS`.
            unsafe {
                match (kind, narrow) {
                    (Scaling::SumiTimesScales, false) => {
                        qtile::<0, false, false>(&ap, s, nb, res, g * GROUP)
                    }
                    (Scaling::SumiTimesScales, true) => {
                        qtile::<0, true, false>(&ap, s, nb, res, g * GROUP)
                    }
                    (Scaling::SumiThenScales, _) => {
                        qtile::<1, true, false>(&ap, s, nb, res, g * GROUP)
                    }
                    (Scaling::WithMin, false) => {
                        qtile::<2, false, false>(&ap, s, nb, res, g * GROUP)
                    }
                    (Scaling::WithMin, true) => qtile::<2, true, false>(&ap, s, nb, res, g * GROUP),
                }
            }
        }
    }
}

/// The bounds both AVX2 tiles' `unsafe` reads rely on (each of the `R` activation rows holds
/// `nb` widened blocks; one or two groups, each with `nb` blocks of quants and meta), and the
/// rows' pointers.
fn checked_rows(acts: &[&[u8]; MAX_R], srcs: &[GroupSrc<'_>], nb: usize) -> [*const u8; R] {
    assert!(acts[..R].iter().all(|a| a.len() == nb * ACT_BLOCK));
    assert!(srcs.len() == 1 || srcs.len() == 2);
    for s in srcs {
        assert!(s.meta.len() >= nb * GROUP_BLOCK && s.qstride >= QUANTS);
        assert!(s.quants.len() >= (nb - 1) * s.qstride + QUANTS);
    }
    std::array::from_fn(|r| acts[r].as_ptr())
}

/// `res[r][c0 + c]` for the 4 rows `ap` and the 8 columns of `src`; `KIND` 0, 1, 2 =
/// [`Scaling`] in declaration order. With `NARROW` (weights with |w| ≤ 16), the `vpmaddubsw`
/// pairs of a block are added in 16-bit lanes and widened by one `vpmaddwd` per block (exact:
/// at most 16·16·127 per lane); otherwise one per k-step. With `A7` ([`Avx2A7`]: `KIND` 0, not
/// `NARROW`) the weights are biased (`w + 128`) and multiplied by the 7-bit activations as
/// they are, each integer block sum starting from the block's `−128 · Σ a`.
///
/// # Safety
/// AVX2 present; every `ap[r]` points at `nb` widened blocks (7-bit ones with their
/// correction for `A7`); `src` holds `nb` blocks as [`Avx2::tile`] asserts (biased for `A7`);
/// `c0 + 8 ≤ MAX_COLS`; with `NARROW`, every weight value of `src` has |w| ≤ 16 (else the sums
/// may wrap: wrong, though defined, values).
#[target_feature(enable = "avx2,fma")]
unsafe fn qtile<const KIND: u8, const NARROW: bool, const A7: bool>(
    ap: &[*const u8; R],
    src: &GroupSrc<'_>,
    nb: usize,
    res: &mut TileSums,
    c0: usize,
) {
    let ones = _mm256_set1_epi16(1);
    let (qp, qs, mp) = (src.quants.as_ptr(), src.qstride, src.meta.as_ptr());
    let mut facc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY: block `b < nb` of the group and of every activation row (the caller's
        // bounds).
        unsafe {
            let qb = qp.add(b * qs);
            let blk = mp.add(b * GROUP_BLOCK);
            let mut iacc: [__m256i; R] = std::array::from_fn(|r| {
                if A7 {
                    let corr = ap[r].add(b * ACT_BLOCK + 4) as *const i32;
                    _mm256_set1_epi32(corr.read_unaligned())
                } else {
                    _mm256_setzero_si256()
                }
            });
            let aq: [*const u8; R] =
                std::array::from_fn(|r| ap[r].add(b * ACT_BLOCK + ACT_QUANTS_AT));
            for s in 0..8 {
                let w = _mm256_loadu_si256(qb.add(s * 32) as *const __m256i);
                let aw = if A7 { w } else { _mm256_abs_epi8(w) };
                for r in 0..R {
                    let a = _mm256_set1_epi32((aq[r].add(s * 4) as *const i32).read_unaligned());
                    let p = if A7 {
                        _mm256_maddubs_epi16(w, a)
                    } else {
                        _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w))
                    };
                    iacc[r] = if NARROW {
                        _mm256_add_epi16(iacc[r], p)
                    } else {
                        _mm256_add_epi32(iacc[r], _mm256_madd_epi16(p, ones))
                    };
                }
            }
            if NARROW {
                for acc in iacc.iter_mut() {
                    *acc = _mm256_madd_epi16(*acc, ones);
                }
            }
            let sc = _mm256_loadu_ps(blk.add(SCALE_AT) as *const f32);
            let mn = if KIND == 2 {
                _mm256_loadu_ps(blk.add(MIN_AT) as *const f32)
            } else {
                _mm256_setzero_ps()
            };
            for r in 0..R {
                let ab = ap[r].add(b * ACT_BLOCK);
                let da = _mm256_set1_ps((ab as *const f32).read_unaligned());
                let f = _mm256_cvtepi32_ps(iacc[r]);
                facc[r] = match KIND {
                    0 => _mm256_fmadd_ps(f, _mm256_mul_ps(sc, da), facc[r]),
                    1 => _mm256_add_ps(facc[r], _mm256_mul_ps(_mm256_mul_ps(f, sc), da)),
                    _ => {
                        let sa = _mm256_set1_ps((ab.add(4) as *const f32).read_unaligned());
                        let term = _mm256_add_ps(
                            _mm256_mul_ps(_mm256_mul_ps(sc, da), f),
                            _mm256_mul_ps(mn, sa),
                        );
                        _mm256_add_ps(facc[r], term)
                    }
                };
            }
        }
    }
    for (r, acc) in facc.iter().enumerate() {
        // SAFETY: `c0 + 8 ≤ MAX_COLS` (the caller's bound), inside `res[r]`.
        unsafe { _mm256_storeu_ps(res[r].as_mut_ptr().add(c0), *acc) };
    }
}

/// Repacks columns `j0..j0 + 8` (zeros past `n`) of the row-major weight into `dst` (`nb`
/// group blocks of [`GROUP_BLOCK`] bytes): `Q8_0` with an 8 × 8 dword transpose per block,
/// the other types block by block through [`quant::block32_values`] (the same bytes).
fn pack_group(w: WeightRef<'_>, wrow: usize, bb: usize, n: usize, j0: usize, dst: &mut [u8]) {
    assert!(dst.len().is_multiple_of(GROUP_BLOCK) && w.bytes.len() == n * wrow);
    if w.dtype == DType::Q8_0 && j0 + GROUP <= n {
        assert!(dst.len() / GROUP_BLOCK * 34 <= wrow);
        // SAFETY: AVX2 was detected before this kernel was put in a table; the loads read
        // columns `j0 .. j0 + 8 ≤ n` and blocks `b < dst.len() / GROUP_BLOCK ≤ wrow / 34`
        // (asserted), inside `w.bytes`.
        return unsafe { pack_group_q8_0(w.bytes, wrow, j0, dst) };
    }
    pack_group_values(
        w,
        wrow,
        bb,
        n,
        j0,
        GROUP,
        GROUP_BLOCK,
        dst,
        |gb, c, _, d, mn| {
            gb[SCALE_AT + 4 * c..][..4].copy_from_slice(&d.to_le_bytes());
            gb[MIN_AT + 4 * c..][..4].copy_from_slice(&mn.to_le_bytes());
        },
    );
}

/// [`pack_group`] for 8 whole `Q8_0` columns: per block, each column's 32 quant bytes in one
/// ymm, an 8 × 8 transpose of 4-byte words (`vpunpck{l,h}dq`, `vpunpck{l,h}qdq`,
/// `vperm2i128`) gives the eight k-steps `8 columns × 4 bytes`; the f16 scales are widened by
/// [`quant::fp16_to_fp32`] (exact). The same bytes as the generic path (tested through the
/// twins).
///
/// # Safety
/// AVX2 present; `bytes` holds rows `j0 .. j0 + 8` of `wrow` bytes, each with at least
/// `dst.len() / GROUP_BLOCK` blocks of 34 bytes.
#[target_feature(enable = "avx2")]
unsafe fn pack_group_q8_0(bytes: &[u8], wrow: usize, j0: usize, dst: &mut [u8]) {
    // SAFETY: row `j0` lies inside `bytes` (the caller's bound; pointer arithmetic only).
    let base = unsafe { bytes.as_ptr().add(j0 * wrow) };
    for (b, gb) in dst.chunks_exact_mut(GROUP_BLOCK).enumerate() {
        let mut rows = [_mm256_setzero_si256(); GROUP];
        for (c, row) in rows.iter_mut().enumerate() {
            // SAFETY: block `b` of row `j0 + c` (the caller's bound): bytes `b·34 .. b·34 + 34`.
            unsafe {
                let blk = base.add(c * wrow + b * 34);
                let d = u16::from_le_bytes([*blk, *blk.add(1)]);
                gb[SCALE_AT + 4 * c..][..4].copy_from_slice(&quant::fp16_to_fp32(d).to_le_bytes());
                *row = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            }
        }
        // rows[c] = dwords s = 0..8 of column c. Transpose to t[s] = dword s of columns 0..8.
        let t0 = _mm256_unpacklo_epi32(rows[0], rows[1]);
        let t1 = _mm256_unpackhi_epi32(rows[0], rows[1]);
        let t2 = _mm256_unpacklo_epi32(rows[2], rows[3]);
        let t3 = _mm256_unpackhi_epi32(rows[2], rows[3]);
        let t4 = _mm256_unpacklo_epi32(rows[4], rows[5]);
        let t5 = _mm256_unpackhi_epi32(rows[4], rows[5]);
        let t6 = _mm256_unpacklo_epi32(rows[6], rows[7]);
        let t7 = _mm256_unpackhi_epi32(rows[6], rows[7]);
        let u0 = _mm256_unpacklo_epi64(t0, t2);
        let u1 = _mm256_unpackhi_epi64(t0, t2);
        let u2 = _mm256_unpacklo_epi64(t1, t3);
        let u3 = _mm256_unpackhi_epi64(t1, t3);
        let u4 = _mm256_unpacklo_epi64(t4, t6);
        let u5 = _mm256_unpackhi_epi64(t4, t6);
        let u6 = _mm256_unpacklo_epi64(t5, t7);
        let u7 = _mm256_unpackhi_epi64(t5, t7);
        let steps = [
            _mm256_permute2x128_si256::<0x20>(u0, u4),
            _mm256_permute2x128_si256::<0x20>(u1, u5),
            _mm256_permute2x128_si256::<0x20>(u2, u6),
            _mm256_permute2x128_si256::<0x20>(u3, u7),
            _mm256_permute2x128_si256::<0x31>(u0, u4),
            _mm256_permute2x128_si256::<0x31>(u1, u5),
            _mm256_permute2x128_si256::<0x31>(u2, u6),
            _mm256_permute2x128_si256::<0x31>(u3, u7),
        ];
        for (s, v) in steps.iter().enumerate() {
            // SAFETY: bytes `32s .. 32s + 32 ≤ QUANTS` of the group block.
            unsafe { _mm256_storeu_si256(gb.as_mut_ptr().add(s * 32) as *mut __m256i, *v) };
        }
        gb[MIN_AT..MIN_AT + 4 * GROUP].fill(0);
    }
}

/// ggml's `quantize_row_q8_0_ref` (the generic [`quant::quantize_activation_row`] for `Q8_0`),
/// 32 values per block in four ymm, stored widened ([`ACT_BLOCK`]: the f16 scale's f32 value,
/// 0, the signed quants): `amax` of `|x|` (a maximum: order-free without NaN), `d = amax /
/// 127`, `id = 1/d` (0 for `d = 0`) and the f16 scale in the generic scalar code,
/// `round(x·id)` half away from zero by [`super::vmath::round_half_away8`] (exact; 5 vector
/// operations per 8 values where `t + (|x·id − t| ≥ ½ ? ±1 : 0)`, `t = trunc(x·id)`, took 10:
/// 1024 × {1152, 4608} × 8 products, mostly this quantizer, 1.14–1.31× on one thread of Zen 5,
/// in-process A/B). A block holding NaN or ±∞, or whose f16 scale is 0 (where `d` may be
/// subnormal and `1/d` infinite), takes the scalar path ([`widen_activation_row`]).
///
/// # Safety
/// AVX2 present; `dst.len() == src.len() / 32 · ACT_BLOCK`, `src.len()` a multiple of 32.
///
/// With `A7` it is [`quant::quantize_row_q8_0_a7`] instead (`d = amax / 63`, quants in
/// −63..=63, its scalar path [`widen_block_a7`]), and the block's sum slot holds the i32
/// `−128 · Σ q` that [`Avx2A7`]'s tile starts its integer sum from.
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_q8_0<const A7: bool>(src: &[f32], dst: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(ACT_BLOCK)) {
        // SAFETY: `x` holds 32 f32.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let a: [__m256; 4] = std::array::from_fn(|i| _mm256_andnot_ps(sign, v[i]));
        // Not finite: NaN (unordered) or |x| = ∞.
        let mut bad = 0;
        for ai in &a {
            bad |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(*ai, inf));
        }
        let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let d = amax / if A7 { 63.0 } else { 127.0 };
        let d16 = quant::fp32_to_fp16(d);
        if bad != 0 || d16 & 0x7FFF == 0 {
            if A7 {
                widen_block_a7(x, b);
            } else {
                widen_activation_row::<false>(DType::Q8_0, x, b, 0);
            }
            continue;
        }
        let id = 1.0 / d;
        put_scales(b, d16, None);
        let idv = _mm256_set1_ps(id);
        // `roundf(x·id)`, half away from zero (|x·id| ≤ 127).
        let q: [__m256i; 4] =
            std::array::from_fn(|i| super::vmath::round_half_away8(_mm256_mul_ps(v[i], idv)));
        if A7 {
            // |q| ≤ 63 here (`d` normal: `amax · fl(1/fl(amax/63)) < 63.5`), as the generic
            // clamp leaves it; the sum of the 32 quants is exact in any order.
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            let corr = -128 * _mm_cvtsi128_si32(s);
            b[4..ACT_QUANTS_AT].copy_from_slice(&corr.to_le_bytes());
        }
        // |q| ≤ 127 (d is a normal f32 here), so the saturating packs are exact; the packs
        // work per 128-bit lane, the final dword permute restores the element order.
        let w01 = _mm256_packs_epi32(q[0], q[1]);
        let w23 = _mm256_packs_epi32(q[2], q[3]);
        let bytes = _mm256_packs_epi16(w01, w23);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: bytes `ACT_QUANTS_AT .. ACT_QUANTS_AT + 32 = ACT_BLOCK` of the block.
        unsafe { _mm256_storeu_si256(b.as_mut_ptr().add(ACT_QUANTS_AT) as *mut __m256i, bytes) };
    }
}

/// One block `x` (32 values) quantized by [`quant::quantize_row_q8_0_a7`] and stored widened
/// into `dst` ([`ACT_BLOCK`]: the f16 scale's f32 value, the i32 `−128 · Σ q`, the 32 signed
/// quants): the scalar path of [`quantize_q8_0`] for blocks with NaN, ±∞ or a zero f16 scale.
fn widen_block_a7(x: &[f32], dst: &mut [u8]) {
    let mut blk = [0u8; 34];
    let w = WeightRef {
        dtype: DType::Q8_0,
        bytes: &[],
        layout: PackLayout::Interleaved8x4A7,
    };
    quant::quantize_activation_row_for(&w, x, &mut blk);
    put_scales(dst, u16::from_le_bytes([blk[0], blk[1]]), None);
    let sum: i32 = blk[2..].iter().map(|&q| q as i8 as i32).sum();
    dst[4..ACT_QUANTS_AT].copy_from_slice(&(-128 * sum).to_le_bytes());
    dst[ACT_QUANTS_AT..ACT_BLOCK].copy_from_slice(&blk[2..]);
}

/// Bytes per block of one 8-row group of [`PackLayout::Interleaved8x4A7`] weights (8 f16
/// scales, then 256 quants in 4-byte steps).
const A7_PLAN_BLOCK: usize = 16 + QUANTS;

/// The AVX2 tile of `Q8_0` weights in [`PackLayout::Interleaved8x4A7`] (plans compiled with
/// `--activation-bits 7`), bit-identical to [`edge_kernels::linear`] on them: activations
/// quantized to 7 bits ([`quant::quantize_row_q8_0_a7`]), weights biased to unsigned
/// (`w + 128 = w ^ 0x80`, 0..=255), so one `vpmaddubsw(w + 128, a)` per k-step and row needs no
/// sign step — a pair's sum stays within `2 · 255 · 63 = 32130` (no saturation) — and
/// `vpmaddwd` with ones widens it; each row's integer block sum starts from the activation
/// block's `−128 · Σ a`, so it ends at the exact `Σ a · w`. The f32 term is ggml's `Q8_0` one,
/// `sumf = fma(sumi, dw · da, sumf)`. Three multiply-pipe operations per k-step and row become
/// two: `vpsignb` is gone, and `vpabsb` with it.
pub(crate) struct Avx2A7;

impl Panel for Avx2A7 {
    const GROUP: usize = GROUP;
    const GROUP_BLOCK: usize = GROUP_BLOCK;
    const R: usize = R;
    const INTERLEAVED16X4: bool = false;
    const A7: bool = true;

    fn quantize_row(w: DType, x: &[f32], dst: &mut [u8]) {
        assert!(w == DType::Q8_0, "Avx2A7: {w:?} weights");
        assert!(x.len().is_multiple_of(32) && dst.len() == x.len() / 32 * ACT_BLOCK);
        // SAFETY: AVX2 and FMA were detected before any x86 kernel table was built (every x86
        // table requires them); the lengths are asserted above.
        unsafe { quantize_q8_0::<true>(x, dst) };
    }

    /// Whole 8-row groups from the plan's layout (quants biased, scales widened); the last
    /// `n mod 8` rows (row-major in the layout) through [`pack_group`], then biased.
    fn prepare_group(
        w: WeightRef<'_>,
        wrow: usize,
        bb: usize,
        n: usize,
        j0: usize,
        _in_place: bool,
        dst: &mut [u8],
    ) {
        assert!(w.dtype == DType::Q8_0 && w.layout == PackLayout::Interleaved8x4A7);
        assert!(dst.len().is_multiple_of(GROUP_BLOCK) && w.bytes.len() == n * wrow);
        let nb = dst.len() / GROUP_BLOCK;
        if j0 + GROUP <= n / GROUP * GROUP {
            let start = j0 / GROUP * (wrow / bb) * A7_PLAN_BLOCK;
            let src = &w.bytes[start..start + nb * A7_PLAN_BLOCK];
            for (gb, pb) in dst
                .chunks_exact_mut(GROUP_BLOCK)
                .zip(src.chunks_exact(A7_PLAN_BLOCK))
            {
                for (o, &q) in gb[..QUANTS].iter_mut().zip(&pb[16..]) {
                    *o = q ^ 0x80;
                }
                for c in 0..GROUP {
                    let d = quant::fp16_to_fp32(u16::from_le_bytes([pb[2 * c], pb[2 * c + 1]]));
                    gb[SCALE_AT + 4 * c..][..4].copy_from_slice(&d.to_le_bytes());
                }
                gb[MIN_AT..].fill(0);
            }
            return;
        }
        // The tail group (fewer than 8 columns, row-major): as the 8-bit tile packs it.
        pack_group(w, wrow, bb, n, j0, dst);
        for gb in dst.chunks_exact_mut(GROUP_BLOCK) {
            gb[..QUANTS].iter_mut().for_each(|q| *q ^= 0x80);
        }
    }

    fn tile(
        w: DType,
        kind: Scaling,
        acts: &[&[u8]; MAX_R],
        srcs: &[GroupSrc<'_>],
        nb: usize,
        res: &mut TileSums,
    ) {
        assert!(w == DType::Q8_0 && kind == Scaling::SumiTimesScales);
        let ap = checked_rows(acts, srcs, nb);
        for (g, s) in srcs.iter().enumerate() {
            // SAFETY: every x86 kernel table requires AVX2 and FMA; the reads stay inside
            // `acts[r]` (blocks `b < nb` of ACT_BLOCK bytes) and the group's quants and meta
            // (blocks `b < nb`), as `checked_rows` asserted; `8g + 8 ≤ 16 ≤ MAX_COLS`.
            unsafe { qtile::<0, false, true>(&ap, s, nb, res, g * GROUP) }
        }
    }
}
