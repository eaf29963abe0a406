//! The per-ISA pieces of the shared attention driver ([`edge_kernels::AttentionOps`]): the
//! `q·k` scores through the f32 tiles, and `exp`, `acc += w·v` and `acc *= c` in AVX2 / AVX-512
//! lanes, each the generic scalar operation per element in the same order (the polynomial
//! `exp` of [`edge_kernels::expf`], unfused), so the attention output is bit-identical.

use std::arch::x86_64::*;

use edge_kernels::expf::{exp_f32, EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E};
use edge_kernels::AttentionOps;

use super::tile;

/// AVX2 pieces (ymm, scalar generic tails).
pub(crate) const AVX2: AttentionOps = AttentionOps {
    name: "avx2_attention_f32",
    scores: tile::AVX2,
    exp: exp_avx2,
    axpy: axpy_avx2,
    scale: scale_avx2,
};

/// AVX-512 pieces (zmm, masked tails).
pub(crate) const AVX512: AttentionOps = AttentionOps {
    name: "avx512_attention_f32",
    scores: tile::AVX512,
    exp: exp_avx512,
    axpy: axpy_avx512,
    scale: scale_avx512,
};

fn exp_avx2(s: &mut [f32]) {
    let full = s.len() - s.len() % 8;
    // SAFETY: AVX2 was detected before this function was put in a table
    // (`crate::x86_64::avx2_table`); loads and stores stay below `full ≤ s.len()`.
    unsafe { exp8_run(s.as_mut_ptr(), full) };
    for v in &mut s[full..] {
        *v = exp_f32(*v);
    }
}

#[target_feature(enable = "avx2")]
unsafe fn exp8_run(p: *mut f32, full: usize) {
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full`, inside the slice.
        unsafe { _mm256_storeu_ps(p.add(i), exp8(_mm256_loadu_ps(p.add(i)))) };
        i += 8;
    }
}

/// [`exp_f32`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn exp8(x: __m256) -> __m256 {
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
        _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)),
    );
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let one = _mm256_set1_ps(1.0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    let y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    let lo = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LO));
    let hi = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(EXP_HI));
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), lo);
    let y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), hi);
    _mm256_blendv_ps(y, x, nan)
}

fn axpy_avx2(acc: &mut [f32], w: f32, v: &[f32]) {
    assert_eq!(acc.len(), v.len());
    let full = acc.len() - acc.len() % 8;
    // SAFETY: AVX2 was detected (see `exp_avx2`); both slices hold `acc.len() ≥ full` elements.
    unsafe { axpy8_run(acc.as_mut_ptr(), w, v.as_ptr(), full) };
    for (x, &vv) in acc[full..].iter_mut().zip(&v[full..]) {
        *x += w * vv;
    }
}

#[target_feature(enable = "avx2")]
unsafe fn axpy8_run(a: *mut f32, w: f32, v: *const f32, full: usize) {
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full`, inside both slices.
        unsafe {
            let x = _mm256_add_ps(
                _mm256_loadu_ps(a.add(i)),
                _mm256_mul_ps(wv, _mm256_loadu_ps(v.add(i))),
            );
            _mm256_storeu_ps(a.add(i), x);
        }
        i += 8;
    }
}

fn scale_avx2(acc: &mut [f32], c: f32) {
    let full = acc.len() - acc.len() % 8;
    // SAFETY: AVX2 was detected (see `exp_avx2`); `full ≤ acc.len()`.
    unsafe { scale8_run(acc.as_mut_ptr(), c, full) };
    for x in &mut acc[full..] {
        *x *= c;
    }
}

#[target_feature(enable = "avx2")]
unsafe fn scale8_run(a: *mut f32, c: f32, full: usize) {
    let cv = _mm256_set1_ps(c);
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full`, inside the slice.
        unsafe { _mm256_storeu_ps(a.add(i), _mm256_mul_ps(_mm256_loadu_ps(a.add(i)), cv)) };
        i += 8;
    }
}

/// Lanes `0..len` of a 16-lane mask.
fn mask(len: usize) -> __mmask16 {
    ((1u32 << len) - 1) as __mmask16
}

fn exp_avx512(s: &mut [f32]) {
    // SAFETY: AVX-512F was detected before this function was put in a table
    // (`crate::x86_64::avx512_table`); masked loads and stores touch only `s`.
    unsafe { exp16_run(s.as_mut_ptr(), s.len()) };
}

#[target_feature(enable = "avx512f")]
unsafe fn exp16_run(p: *mut f32, len: usize) {
    let mut i = 0;
    while i < len {
        let m = mask((len - i).min(16));
        // SAFETY: the mask covers only elements `i..len`.
        unsafe {
            let x = _mm512_maskz_loadu_ps(m, p.add(i));
            _mm512_mask_storeu_ps(p.add(i), m, exp16(x));
        }
        i += 16;
    }
}

/// [`exp_f32`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
    );
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    }
    let one = _mm512_set1_ps(1.0);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), one);
    let ni = _mm512_cvtps_epi32(n);
    let n1 = _mm512_srai_epi32::<1>(ni);
    let n2 = _mm512_sub_epi32(ni, n1);
    let bias = _mm512_set1_epi32(127);
    let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n1, bias)));
    let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n2, bias)));
    let y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
    let lo = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_LO));
    let hi = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXP_HI));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let y = _mm512_mask_mov_ps(y, lo, _mm512_setzero_ps());
    let y = _mm512_mask_mov_ps(y, hi, _mm512_set1_ps(f32::INFINITY));
    _mm512_mask_mov_ps(y, nan, x)
}

fn axpy_avx512(acc: &mut [f32], w: f32, v: &[f32]) {
    assert_eq!(acc.len(), v.len());
    // SAFETY: AVX-512F was detected (see `exp_avx512`); masked accesses stay inside both slices.
    unsafe { axpy16_run(acc.as_mut_ptr(), w, v.as_ptr(), acc.len()) };
}

#[target_feature(enable = "avx512f")]
unsafe fn axpy16_run(a: *mut f32, w: f32, v: *const f32, len: usize) {
    let wv = _mm512_set1_ps(w);
    let mut i = 0;
    while i < len {
        let m = mask((len - i).min(16));
        // SAFETY: the mask covers only elements `i..len` of both slices.
        unsafe {
            let x = _mm512_add_ps(
                _mm512_maskz_loadu_ps(m, a.add(i)),
                _mm512_mul_ps(wv, _mm512_maskz_loadu_ps(m, v.add(i))),
            );
            _mm512_mask_storeu_ps(a.add(i), m, x);
        }
        i += 16;
    }
}

fn scale_avx512(acc: &mut [f32], c: f32) {
    // SAFETY: AVX-512F was detected (see `exp_avx512`); masked accesses stay inside `acc`.
    unsafe { scale16_run(acc.as_mut_ptr(), c, acc.len()) };
}

#[target_feature(enable = "avx512f")]
unsafe fn scale16_run(a: *mut f32, c: f32, len: usize) {
    let cv = _mm512_set1_ps(c);
    let mut i = 0;
    while i < len {
        let m = mask((len - i).min(16));
        // SAFETY: the mask covers only elements `i..len`.
        unsafe {
            let x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a.add(i)), cv);
            _mm512_mask_storeu_ps(a.add(i), m, x);
        }
        i += 16;
    }
}
