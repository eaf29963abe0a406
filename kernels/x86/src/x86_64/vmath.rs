//! Vector forms of the kernels' one arithmetic for `exp`, `tanh`, SiLU and GELU
//! ([`edge_kernels::expf`], [`edge_kernels::silu_f32`], [`edge_kernels::gelu_tanh_f32`]): each
//! lane performs the scalar definition's operations in its order (fused multiply-adds exactly
//! where it fuses: the steps of `exp`), so results are bit-identical; and the `silu` /
//! `gelu_tanh` slots built on them.

use std::arch::x86_64::*;

use edge_kernels::expf::{EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E};
use edge_kernels::{gelu_tanh_f32, silu_f32, GELU_KAPPA, GELU_SQRT_2_OVER_PI};
use rayon::prelude::*;

/// [`exp_f32`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp8(x: __m256) -> __m256 {
    exp8_to::<true>(x)
}

/// [`exp8`] for lanes that are at most 0 or NaN (a softmax's `s − max`), without the overflow
/// fix-up (`x > EXP_HI`, which such lanes never take): the same bits as [`exp_f32`] on them,
/// two vector operations fewer (the AVX2 twin of [`exp16_nonpositive`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp8_nonpositive(x: __m256) -> __m256 {
    exp8_to::<false>(x)
}

/// [`exp_f32`] on 8 lanes; `HI`: with the overflow fix-up for lanes above `EXP_HI`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8_to<const HI: bool>(x: __m256) -> __m256 {
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let one = _mm256_set1_ps(1.0);
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    let y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    let lo = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LO));
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    let mut y = _mm256_blendv_ps(y, _mm256_setzero_ps(), lo);
    if HI {
        let hi = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(EXP_HI));
        y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), hi);
    }
    _mm256_blendv_ps(y, x, nan)
}

/// [`exp_f32`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn exp16(x: __m512) -> __m512 {
    exp16_to::<true>(x)
}

/// [`exp16`] for lanes that are at most 0 or NaN (a softmax's `s − max`), without the overflow
/// fix-up (`x > EXP_HI`, which such lanes never take): the same bits as [`exp_f32`] on them,
/// two vector operations fewer (`kbench 2 attention`, alternated: self 281–285 → 285.5–287
/// GFLOP/s, cross 265–267 → 268–269).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn exp16_nonpositive(x: __m512) -> __m512 {
    exp16_to::<false>(x)
}

/// [`exp_f32`] on 16 lanes; `HI`: with the overflow fix-up for lanes above `EXP_HI`.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16_to<const HI: bool>(x: __m512) -> __m512 {
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let one = _mm512_set1_ps(1.0);
    p = _mm512_fmadd_ps(p, r, one);
    p = _mm512_fmadd_ps(p, r, one);
    // `p · 2ⁿ` rounded once, by `vscalefps`. The generic `(p · 2^⌊n/2⌋) · 2^(n − ⌊n/2⌋)` gives
    // the same bits: for x in [−104, 89] (the only x that reach it) |n| ≤ 150 and p is in
    // (0.7, 1.5), so its first product is a normal float, exact, and its second rounds the exact
    // `p · 2ⁿ` once (to a subnormal, a normal or +∞). One instruction for nine (tested over a
    // sweep of x through the subnormal and overflow ends: `exp16_matches_exp_f32`).
    let y = _mm512_scalef_ps(p, n);
    let lo = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_LO));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let mut y = _mm512_mask_mov_ps(y, lo, _mm512_setzero_ps());
    if HI {
        let hi = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXP_HI));
        y = _mm512_mask_mov_ps(y, hi, _mm512_set1_ps(f32::INFINITY));
    }
    _mm512_mask_mov_ps(y, nan, x)
}

/// [`edge_kernels::expf::tanh_f32`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn tanh8(u: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let a = _mm256_andnot_ps(sign, u);
    let e = exp8(_mm256_mul_ps(_mm256_set1_ps(2.0), a));
    let one = _mm256_set1_ps(1.0);
    let t = _mm256_sub_ps(
        one,
        _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)),
    );
    _mm256_or_ps(_mm256_andnot_ps(sign, t), _mm256_and_ps(sign, u))
}

/// [`edge_kernels::expf::tanh_f32`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn tanh16(u: __m512) -> __m512 {
    let sign = _mm512_set1_epi32(i32::MIN);
    let ui = _mm512_castps_si512(u);
    let a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, ui));
    let e = exp16(_mm512_mul_ps(_mm512_set1_ps(2.0), a));
    let one = _mm512_set1_ps(1.0);
    let t = _mm512_sub_ps(
        one,
        _mm512_div_ps(_mm512_set1_ps(2.0), _mm512_add_ps(e, one)),
    );
    let ti = _mm512_castps_si512(t);
    _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_andnot_si512(sign, ti),
        _mm512_and_si512(sign, ui),
    ))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn silu8(v: __m256) -> __m256 {
    let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
    _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

#[inline]
#[target_feature(enable = "avx512f")]
fn silu16(v: __m512) -> __m512 {
    let neg = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(v),
        _mm512_set1_epi32(i32::MIN),
    ));
    let e = exp16(neg);
    _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0), e))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn gelu8(v: __m256) -> __m256 {
    let cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
    let inner = _mm256_mul_ps(
        _mm256_set1_ps(GELU_SQRT_2_OVER_PI),
        _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(GELU_KAPPA), cube)),
    );
    let half_v = _mm256_mul_ps(_mm256_set1_ps(0.5), v);
    _mm256_mul_ps(half_v, _mm256_add_ps(_mm256_set1_ps(1.0), tanh8(inner)))
}

#[inline]
#[target_feature(enable = "avx512f")]
fn gelu16(v: __m512) -> __m512 {
    let cube = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
    let inner = _mm512_mul_ps(
        _mm512_set1_ps(GELU_SQRT_2_OVER_PI),
        _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(GELU_KAPPA), cube)),
    );
    let half_v = _mm512_mul_ps(_mm512_set1_ps(0.5), v);
    _mm512_mul_ps(half_v, _mm512_add_ps(_mm512_set1_ps(1.0), tanh16(inner)))
}

/// The lane function of a unary slot.
#[derive(Clone, Copy)]
enum Unary {
    Silu,
    Gelu,
}

impl Unary {
    fn scalar(self, v: f32) -> f32 {
        match self {
            Unary::Silu => silu_f32(v),
            Unary::Gelu => gelu_tanh_f32(v),
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn map8(f: Unary, x: &[f32], out: &mut [f32]) {
    let full = x.len() - x.len() % 8;
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full <= x.len() == out.len()`.
        unsafe {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let y = match f {
                Unary::Silu => silu8(v),
                Unary::Gelu => gelu8(v),
            };
            _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
        }
        i += 8;
    }
    for (o, &v) in out[full..].iter_mut().zip(&x[full..]) {
        *o = f.scalar(v);
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn map16(f: Unary, x: &[f32], out: &mut [f32]) {
    let full = x.len() - x.len() % 16;
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= x.len() == out.len()`.
        unsafe {
            let v = _mm512_loadu_ps(x.as_ptr().add(i));
            let y = match f {
                Unary::Silu => silu16(v),
                Unary::Gelu => gelu16(v),
            };
            _mm512_storeu_ps(out.as_mut_ptr().add(i), y);
        }
        i += 16;
    }
    for (o, &v) in out[full..].iter_mut().zip(&x[full..]) {
        *o = f.scalar(v);
    }
}

fn map(f: Unary, wide: bool, x: &[f32], out: &mut [f32], what: &str) {
    edge_kernels::contract::unary(x, out, what);
    out.par_chunks_mut(edge_kernels::ELEMENTWISE_CHUNK)
        .zip(x.par_chunks(edge_kernels::ELEMENTWISE_CHUNK))
        .for_each(|(o, x)| {
            // SAFETY: the tables that hold these slots are built only after AVX2 and FMA (`wide`:
            // AVX-512F) was detected (`crate::x86_64`); `o` and `x` have equal lengths.
            unsafe {
                if wide {
                    map16(f, x, o)
                } else {
                    map8(f, x, o)
                }
            }
        });
}

/// `avx2_silu_f32_x8`.
pub(crate) fn silu_avx2(x: &[f32], out: &mut [f32]) {
    map(Unary::Silu, false, x, out, "silu")
}

/// `avx512_silu_f32_x16`.
pub(crate) fn silu_avx512(x: &[f32], out: &mut [f32]) {
    map(Unary::Silu, true, x, out, "silu")
}

/// `x[i] = f(x[i])` on the calling thread, 8 lanes at a time, the tail through the scalar lane
/// function: the AVX2 in-place epilogue slots.
#[target_feature(enable = "avx2,fma")]
unsafe fn map8_in_place(f: Unary, x: &mut [f32]) {
    let full = x.len() - x.len() % 8;
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full <= x.len()`.
        unsafe {
            let v = _mm256_loadu_ps(p.add(i));
            let y = match f {
                Unary::Silu => silu8(v),
                Unary::Gelu => gelu8(v),
            };
            _mm256_storeu_ps(p.add(i), y);
        }
        i += 8;
    }
    for v in &mut x[full..] {
        *v = f.scalar(*v);
    }
}

/// [`map8_in_place`] 16 lanes at a time: the AVX-512 in-place epilogue slots.
#[target_feature(enable = "avx512f")]
unsafe fn map16_in_place(f: Unary, x: &mut [f32]) {
    let full = x.len() - x.len() % 16;
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= x.len()`.
        unsafe {
            let v = _mm512_loadu_ps(p.add(i));
            let y = match f {
                Unary::Silu => silu16(v),
                Unary::Gelu => gelu16(v),
            };
            _mm512_storeu_ps(p.add(i), y);
        }
        i += 16;
    }
    for v in &mut x[full..] {
        *v = f.scalar(*v);
    }
}

/// `avx2_gelu_tanh_f32_x8_in_place`: the `gelu_tanh_in_place` slot (a `linear` epilogue).
pub(crate) fn gelu_in_place_avx2(x: &mut [f32]) {
    // SAFETY: the tables that hold this slot are built only after AVX2 and FMA were detected.
    unsafe { map8_in_place(Unary::Gelu, x) }
}

/// `avx512_gelu_tanh_f32_x16_in_place`: the `gelu_tanh_in_place` slot (a `linear` epilogue).
pub(crate) fn gelu_in_place_avx512(x: &mut [f32]) {
    // SAFETY: the tables that hold this slot are built only after AVX-512F was detected.
    unsafe { map16_in_place(Unary::Gelu, x) }
}

/// `avx2_gelu_tanh_f32_x8`.
pub(crate) fn gelu_avx2(x: &[f32], out: &mut [f32]) {
    map(Unary::Gelu, false, x, out, "gelu_tanh")
}

/// `avx512_gelu_tanh_f32_x16`.
pub(crate) fn gelu_avx512(x: &[f32], out: &mut [f32]) {
    map(Unary::Gelu, true, x, out, "gelu_tanh")
}

/// Lanes `0..len` of a 16-lane mask.
pub(crate) fn mask(len: usize) -> __mmask16 {
    ((1u32 << len) - 1) as __mmask16
}

/// The transpose of an 8 × 8 block: lane `j` of output `i` is lane `i` of input `j`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // t[2g] = (r[2g][0], r[2g+1][0], r[2g][1], r[2g+1][1] | same for lanes 4, 5),
    // t[2g+1] the same for lanes 2, 3 | 6, 7.
    let pd = |x: __m256| _mm256_castps_pd(x);
    let u: [__m256; 8] = std::array::from_fn(|i| {
        // u[4q + k]: rows 4q .. 4q + 4, lane k (k < 4) in the low half and k + 4 in the high.
        let (q, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * q + k / 2], t[4 * q + 2 + k / 2]);
        _mm256_castpd_ps(if k % 2 == 0 {
            _mm256_unpacklo_pd(pd(a), pd(b))
        } else {
            _mm256_unpackhi_pd(pd(a), pd(b))
        })
    });
    std::array::from_fn(|i| {
        let k = i % 4;
        if i < 4 {
            _mm256_permute2f128_ps::<0x20>(u[k], u[4 + k])
        } else {
            _mm256_permute2f128_ps::<0x31>(u[k], u[4 + k])
        }
    })
}

/// The transpose of a 16 × 16 block: lane `j` of output `i` is lane `i` of input `j`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
        let pd = |x: __m512| _mm512_castps_pd(x);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(d)));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(d)));
    }
    // Now u[4g + k] holds, in 128-bit block `q`, column `4q + k` of rows `4g .. 4g + 4`.
    let mut v = [_mm512_setzero_ps(); 16];
    for g in 0..2 {
        for k in 0..4 {
            let (a, b) = (u[8 * g + k], u[8 * g + 4 + k]);
            v[8 * g + k] = _mm512_shuffle_f32x4::<0x88>(a, b);
            v[8 * g + 4 + k] = _mm512_shuffle_f32x4::<0xdd>(a, b);
        }
    }
    let mut o = [_mm512_setzero_ps(); 16];
    for k in 0..8 {
        o[k] = _mm512_shuffle_f32x4::<0x88>(v[k], v[8 + k]);
        o[8 + k] = _mm512_shuffle_f32x4::<0xdd>(v[k], v[8 + k]);
    }
    o
}

/// The largest f32 below ½ (`0.5 − 2⁻²⁵`).
const BELOW_HALF: f32 = 0.499_999_97;

/// `roundf(y)` (half away from zero) of 16 lanes as i32, for `|y| < 2²²` (the quantizers' `x ·
/// id`, at most 127 in magnitude): `trunc(y + copysign(0.5 − 2⁻²⁵, y))`, one `vpternlogd`, one
/// `vaddps` and one truncating conversion. Exact: with `y = n + f` (`n = ⌊|y|⌋`, `0 ≤ f < 1`),
/// for `f < ½` the sum stays below `n + 1` after rounding (`f ≤ ½ − ulp(y)`, and `n + 1 − ulp(y)
/// − 2⁻²⁵` rounds down within `y`'s binade); for `f > ½` it is at least `n + 1` and below `n +
/// 1½`; for `f = ½` it is `n + 1 − 2⁻²⁵`, which rounds to `n + 1` (a quarter of an ulp or less
/// away, or, below 1, the tie that goes to the even 1.0). Tested against `f32::round` around
/// every integer and half-integer up to 128 (`round_half_away_matches_round`).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn round_half_away16(y: __m512) -> __m512i {
    let half = _mm512_castps_si512(_mm512_set1_ps(BELOW_HALF));
    let sign = _mm512_set1_epi32(i32::MIN);
    // `half | (y & sign)`: 0xF8 = A | (B & C) with A = half, B = y, C = sign.
    let h = _mm512_ternarylogic_epi32::<0xF8>(half, _mm512_castps_si512(y), sign);
    _mm512_cvttps_epi32(_mm512_add_ps(y, _mm512_castsi512_ps(h)))
}

/// [`round_half_away16`] on 8 lanes (AVX2): `trunc(y + copysign(0.5 − 2⁻²⁵, y))` as i32, for
/// `|y| < 2²²`, with an `and` and an `or` for the sign.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn round_half_away8(y: __m256) -> __m256i {
    let h = _mm256_or_ps(
        _mm256_set1_ps(BELOW_HALF),
        _mm256_and_ps(y, _mm256_set1_ps(-0.0)),
    );
    _mm256_cvttps_epi32(_mm256_add_ps(y, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use edge_kernels::expf::exp_f32;

    /// `round_half_away16` and `round_half_away8` against `f32::round` (half away from zero,
    /// ggml's `roundf`) on the 4001 floats around every integer and half-integer from −128 to
    /// 128, both signs, and a sweep of every 4099th float below 128; a width this CPU lacks is
    /// skipped with a message.
    #[test]
    fn round_half_away_matches_round() {
        let f = edge_kernels::cpu::features();
        let mut ys: Vec<f32> = Vec::new();
        for k in 0..=256u32 {
            let c = (k as f32 * 0.5).to_bits();
            ys.extend((c.saturating_sub(2000)..=c + 2000).map(f32::from_bits));
        }
        ys.extend((0..128f32.to_bits()).step_by(4099).map(f32::from_bits));
        let negated: Vec<f32> = ys.iter().map(|y| -y).collect();
        ys.extend(negated);
        for chunk in ys.chunks(16) {
            let mut v = [0f32; 16];
            v[..chunk.len()].copy_from_slice(chunk);
            let want: [i32; 16] = std::array::from_fn(|i| v[i].round() as i32);
            if f.avx512f {
                let mut got = [0i32; 16];
                // SAFETY: AVX-512F was detected; the arrays hold 16 lanes.
                unsafe {
                    let r = round_half_away16(_mm512_loadu_ps(v.as_ptr()));
                    _mm512_storeu_si512(got.as_mut_ptr() as *mut __m512i, r);
                }
                assert_eq!(got, want, "round_half_away16({v:?})");
            }
            if f.avx2 {
                let mut got = [0i32; 16];
                for h in 0..2 {
                    // SAFETY: AVX2 was detected; 8 lanes at `8h` of 16-lane arrays.
                    unsafe {
                        let r = round_half_away8(_mm256_loadu_ps(v.as_ptr().add(8 * h)));
                        _mm256_storeu_si256(got.as_mut_ptr().add(8 * h) as *mut __m256i, r);
                    }
                }
                assert_eq!(got, want, "round_half_away8({v:?})");
            }
        }
        if !f.avx512f || !f.avx2 {
            eprintln!("round_half_away_matches_round: AVX-512F {}, AVX2 {} (a path this CPU lacks is skipped)", f.avx512f, f.avx2);
        }
    }

    /// Every 257th f32 between −110 and 95 (the whole subnormal end below −87.3 and the
    /// overflow end above 88.7 included), the ends of the ranges and the special values.
    fn exp_sweep() -> Vec<f32> {
        let mut xs: Vec<f32> = Vec::new();
        let (lo, hi) = ((-110f32).to_bits(), 95f32.to_bits());
        // Negative floats: bits from -0.0 up to -110; positive: from 0 up to 95.
        xs.extend((0x8000_0000..=lo).step_by(257).map(f32::from_bits));
        xs.extend((0..=hi).step_by(257).map(f32::from_bits));
        xs.extend([
            -104.0,
            -103.999_99,
            -104.000_01,
            -87.336_54,
            -87.336_55,
            88.722_83,
            88.722_84,
            89.0,
            89.000_01,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -0.0,
        ]);
        xs
    }

    /// Checks one vector `exp` result against `exp_f32`: `full` for every lane, `nonpositive`
    /// (its contract) for lanes at most 0 (both zeros included) or NaN.
    fn check_exp(name: &str, x: f32, full: f32, nonpositive: f32) {
        let want = exp_f32(x);
        assert!(
            full.to_bits() == want.to_bits(),
            "{name}({x:e}) = {full:e}, exp_f32 gives {want:e}"
        );
        if x <= 0.0 || x.is_nan() {
            assert!(
                nonpositive.to_bits() == want.to_bits(),
                "{name}_nonpositive({x:e}) = {nonpositive:e}, exp_f32 gives {want:e}"
            );
        }
    }

    /// `exp16` and `exp16_nonpositive` against the generic `exp_f32`, bit for bit, on
    /// [`exp_sweep`].
    #[test]
    fn exp16_matches_exp_f32() {
        if !edge_kernels::cpu::features().avx512f {
            eprintln!("exp16_matches_exp_f32: skipped, this CPU has no AVX-512F");
            return;
        }
        for chunk in exp_sweep().chunks(16) {
            let mut v = [0f32; 16];
            v[..chunk.len()].copy_from_slice(chunk);
            let mut got = [0f32; 16];
            let mut got_np = [0f32; 16];
            // SAFETY: AVX-512F was detected above; the arrays hold 16 f32.
            unsafe {
                let x = _mm512_loadu_ps(v.as_ptr());
                _mm512_storeu_ps(got.as_mut_ptr(), exp16(x));
                _mm512_storeu_ps(got_np.as_mut_ptr(), exp16_nonpositive(x));
            }
            for i in 0..16 {
                check_exp("exp16", v[i], got[i], got_np[i]);
            }
        }
    }

    /// `exp8` and `exp8_nonpositive` against the generic `exp_f32`, bit for bit, on
    /// [`exp_sweep`].
    #[test]
    fn exp8_matches_exp_f32() {
        let f = edge_kernels::cpu::features();
        if !(f.avx2 && f.fma) {
            eprintln!("exp8_matches_exp_f32: skipped, this CPU has no AVX2 and FMA");
            return;
        }
        for chunk in exp_sweep().chunks(8) {
            let mut v = [0f32; 8];
            v[..chunk.len()].copy_from_slice(chunk);
            let mut got = [0f32; 8];
            let mut got_np = [0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; the arrays hold 8 f32.
            unsafe {
                let x = _mm256_loadu_ps(v.as_ptr());
                _mm256_storeu_ps(got.as_mut_ptr(), exp8(x));
                _mm256_storeu_ps(got_np.as_mut_ptr(), exp8_nonpositive(x));
            }
            for i in 0..8 {
                check_exp("exp8", v[i], got[i], got_np[i]);
            }
        }
    }
}
