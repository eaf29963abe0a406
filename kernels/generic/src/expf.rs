//! `exp` as the kernels compute it: one polynomial that every SIMD twin reproduces bit for bit.
//!
//! Method (Cody & Waite range reduction, as in Cephes `expf`): `n = round_ties_even(x·log₂e)`,
//! `r = fma(−n, ln2_lo, fma(−n, ln2_hi, x))` (`ln2_hi` short enough that `n·ln2_hi` is exact),
//! then `p = 1 + r·(1 + r·(1/2 + r·(1/6 + r·(1/24 + r·(1/120 + r·(1/720 + r/5040))))))` (Taylor
//! to degree 7, Horner, each step one fused multiply-add `p = fma(p, r, c)`: one instruction
//! and one rounding per step on every SIMD target; the unfused form cost the AVX-512 attention
//! about 6 %: BENCHMARKS.md), and
//! `exp(x) = (p · 2^⌊n/2⌋) · 2^(n − ⌊n/2⌋)` (two exact power-of-two factors, so results down into
//! the subnormal range round once). `x < −104` gives 0, results above `f32::MAX` give +∞, NaN stays
//! NaN (the same bits). Measured against the correctly rounded `exp` (tested): at most 2 ulp
//! for normal results.

/// `log₂ e` rounded to f32.
pub const LOG2E: f32 = std::f32::consts::LOG2_E;
/// High part of `ln 2` (16 significant bits: `n·LN2_HI` is exact for `|n| ≤ 256`).
pub const LN2_HI: f32 = 0.693_145_75;
/// `ln 2 − LN2_HI`.
pub const LN2_LO: f32 = 1.428_606_8e-6;
/// Below this the result is 0 (`exp(−104) < 2⁻¹⁵⁰`, half the smallest subnormal).
pub const EXP_LO: f32 = -104.0;
/// Above this the result is +∞ without evaluation (`e⁸⁹ > f32::MAX`); between
/// `ln(f32::MAX) ≈ 88.722839` and this, the final scaling overflows to +∞ by itself.
pub const EXP_HI: f32 = 89.0;
/// Taylor coefficients `1/k!`, `k = 7` down to `k = 2`, for Horner's scheme.
pub const EXP_POLY: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];

/// `2^e` for `e` in `−126..=127` (a normal f32, built from its exponent bits).
#[inline(always)]
pub fn pow2i(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `eˣ` in the kernels' one arithmetic (see the module doc).
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < EXP_LO {
        return 0.0;
    }
    if x > EXP_HI {
        return f32::INFINITY;
    }
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    let ni = n as i32;
    let n1 = ni >> 1;
    (p * pow2i(n1)) * pow2i(ni - n1)
}

/// `tanh(u)` in the kernels' one arithmetic: `a = |u|`, `t = 1 − 2 / (exp_f32(2a) + 1)`, then the
/// sign bit of `u` copied onto `t` (so `tanh(−0) = −0`, large `|u|` gives exactly ±1, NaN stays
/// NaN). The absolute error is a few ulp of 1 (the subtraction cancels for small `|u|`, where
/// the relative error grows; the activations that use it add `1 + tanh`).
#[inline]
pub fn tanh_f32(u: f32) -> f32 {
    let a = u.abs();
    let e = exp_f32(2.0 * a);
    let t = 1.0 - 2.0 / (e + 1.0);
    t.copysign(u)
}
