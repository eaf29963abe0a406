//! `neon_silu_f32_x4`, `neon_gelu_tanh_f32_x4`, `neon_relu_f32_x4` and `neon_tanh_f32_x4`: the
//! activations, four lanes at a time.
//!
//! ReLU is a compare and select (`x < 0 ? 0 : x`, so −0 and NaN pass as in the generic
//! kernel: bit-identical). tanh is the generic kernel's formula, `1 − 2/(exp(2|u|) + 1)` with
//! the sign of `u` copied on, over the `exp` below.
//!
//! Both are written as `x · sigmoid(t) = x / (1 + exp(−t))`: SiLU with `t = x` (torch
//! `nn.SiLU`), GELU-tanh with `t = 2·√(2/π)·(x + 0.044715·x³)`, since
//! `0.5·(1 + tanh(u)) = sigmoid(2u)` (torch `GELU(approximate="tanh")`). `exp` is evaluated
//! with the usual range reduction `exp(y) = 2ⁿ·exp(r)`, `n = round(y·log₂e)`,
//! `r = y − n·ln2` (ln2 split in a high and a low part, fused), and the degree-7 Taylor
//! polynomial of `exp(r)` on `|r| ≤ ln2/2` (truncation error below 1e-8 relative); `y` is
//! clamped to `[−87.3, 88.3]` so that `2ⁿ` is a normal f32 (`+inf` above the clamp, as libm). Results differ from the generic
//! kernels (libm `exp`/`tanh`) by a few f32 ulps; every lane is independent, so any work split
//! gives identical results.

use std::arch::aarch64::{
    float32x4_t, vabsq_f32, vaddq_f32, vaddq_s32, vbslq_f32, vcgtq_f32, vcltq_f32, vcvtq_s32_f32,
    vdivq_f32, vdupq_n_f32, vdupq_n_s32, vdupq_n_u32, vfmaq_f32, vfmsq_f32, vld1q_f32, vmaxq_f32,
    vminq_f32, vmulq_f32, vnegq_f32, vreinterpretq_f32_s32, vrndnq_f32, vshlq_n_s32, vst1q_f32,
    vsubq_f32,
};

use rayon::prelude::*;

/// Elements per task (as the generic kernels).
const CHUNK: usize = 1 << 14;

/// `exp(y)` per lane, see the module doc.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn exp4(y: float32x4_t) -> float32x4_t {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 = LN2_HI + LN2_LO, LN2_HI with 8 trailing zero bits (n·LN2_HI is exact for |n| < 2⁸).
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let overflow = vcgtq_f32(y, vdupq_n_f32(88.3));
    let y = vminq_f32(vmaxq_f32(y, vdupq_n_f32(-87.3)), vdupq_n_f32(88.3));
    let n = vrndnq_f32(vmulq_f32(y, vdupq_n_f32(LOG2E)));
    let r = vfmsq_f32(vfmsq_f32(y, n, vdupq_n_f32(LN2_HI)), n, vdupq_n_f32(LN2_LO));
    // Horner, 1/7! … 1/1!, 1.
    let c = [
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let mut p = vdupq_n_f32(c[0]);
    for &ci in &c[1..] {
        p = vfmaq_f32(vdupq_n_f32(ci), p, r);
    }
    // 2ⁿ from the exponent bits; n ∈ [−126, 127] after the clamp.
    let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    let v = vmulq_f32(p, vreinterpretq_f32_s32(e));
    // Above the clamp exp overflows: +inf, as libm (so x·sigmoid(t) → ±0 for t → −∞).
    vbslq_f32(overflow, vdupq_n_f32(f32::INFINITY), v)
}

/// `x / (1 + exp(−t))` per lane.
#[inline]
#[target_feature(enable = "neon")]
fn x_sigmoid(x: float32x4_t, t: float32x4_t) -> float32x4_t {
    vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), exp4(vnegq_f32(t))))
}

/// SiLU of four lanes.
#[inline]
#[target_feature(enable = "neon")]
fn silu4(x: float32x4_t) -> float32x4_t {
    x_sigmoid(x, x)
}

/// GELU-tanh of four lanes: `t = 2·√(2/π)·(x + 0.044715·x³)`.
#[inline]
#[target_feature(enable = "neon")]
fn gelu4(x: float32x4_t) -> float32x4_t {
    // 2·√(2/π), from the generic kernel's f32 constant (doubling is exact).
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    const KAPPA: f32 = 0.044715;
    let x3 = vmulq_f32(vmulq_f32(x, x), x);
    let t = vmulq_f32(
        vdupq_n_f32(TWO_SQRT_2_OVER_PI),
        vfmaq_f32(x, vdupq_n_f32(KAPPA), x3),
    );
    x_sigmoid(x, t)
}

/// ReLU of four lanes: `x < 0 ? 0 : x`.
#[inline]
#[target_feature(enable = "neon")]
fn relu4(x: float32x4_t) -> float32x4_t {
    vbslq_f32(vcltq_f32(x, vdupq_n_f32(0.0)), vdupq_n_f32(0.0), x)
}

/// tanh of four lanes: `1 − 2/(exp(2|u|) + 1)`, the sign bit of `u` copied on.
#[inline]
#[target_feature(enable = "neon")]
fn tanh4(u: float32x4_t) -> float32x4_t {
    let e = exp4(vmulq_f32(vdupq_n_f32(2.0), vabsq_f32(u)));
    let t = vsubq_f32(
        vdupq_n_f32(1.0),
        vdivq_f32(vdupq_n_f32(2.0), vaddq_f32(e, vdupq_n_f32(1.0))),
    );
    vbslq_f32(vdupq_n_u32(0x8000_0000), u, t)
}

/// The activation a kernel applies.
#[derive(Clone, Copy)]
enum Act {
    Silu,
    Gelu,
    Relu,
    Tanh,
}

/// `act` of four lanes.
#[inline]
#[target_feature(enable = "neon")]
fn act4(act: Act, x: float32x4_t) -> float32x4_t {
    match act {
        Act::Silu => silu4(x),
        Act::Gelu => gelu4(x),
        Act::Relu => relu4(x),
        Act::Tanh => tanh4(x),
    }
}

/// Applies [`act4`] to `x` four lanes at a time (the tail through a zero-padded buffer).
#[target_feature(enable = "neon")]
fn map4(act: Act, x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    let full = x.len() - x.len() % 4;
    let mut i = 0;
    while i < full {
        // SAFETY: i + 4 <= full <= x.len() == out.len() (asserted above).
        unsafe {
            vst1q_f32(
                out.as_mut_ptr().add(i),
                act4(act, vld1q_f32(x.as_ptr().add(i))),
            )
        };
        i += 4;
    }
    if full < x.len() {
        let mut buf = [0.0f32; 4];
        buf[..x.len() - full].copy_from_slice(&x[full..]);
        // SAFETY: `buf` is a 4-element stack array, read and written in place.
        unsafe { vst1q_f32(buf.as_mut_ptr(), act4(act, vld1q_f32(buf.as_ptr()))) };
        out[full..].copy_from_slice(&buf[..x.len() - full]);
    }
}

/// Parallel driver shared by the activations; checks the lengths.
fn unary(act: Act, x: &[f32], out: &mut [f32], what: &str) {
    edge_kernels::contract::unary(x, out, what);
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        // SAFETY: NEON is part of the aarch64 baseline, so the target feature is present.
        .for_each(|(o, x)| unsafe { map4(act, x, o) });
}

/// `neon_silu_f32_x4`: torch `nn.SiLU`, the contract of [`edge_kernels::silu`].
pub(super) fn silu(x: &[f32], out: &mut [f32]) {
    unary(Act::Silu, x, out, "silu");
}

/// `neon_gelu_tanh_f32_x4`: torch `GELU(approximate="tanh")`, the contract of
/// [`edge_kernels::gelu_tanh`].
pub(super) fn gelu_tanh(x: &[f32], out: &mut [f32]) {
    unary(Act::Gelu, x, out, "gelu_tanh");
}

/// `neon_relu_f32_x4`: torch `nn.ReLU`, the contract of [`edge_kernels::relu`] (bit-identical).
pub(super) fn relu(x: &[f32], out: &mut [f32]) {
    unary(Act::Relu, x, out, "relu");
}

/// `neon_tanh_f32_x4`: `tanh`, the contract of [`edge_kernels::tanh`].
pub(super) fn tanh(x: &[f32], out: &mut [f32]) {
    unary(Act::Tanh, x, out, "tanh");
}
