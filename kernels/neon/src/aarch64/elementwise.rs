//! `neon_silu_f32_x4`, `neon_gelu_tanh_f32_x4`, `neon_relu_f32_x4` and `neon_tanh_f32_x4`: the
//! activations, four lanes at a time.
//!
//! ReLU is a compare and select (`x < 0 ? 0 : x`, so −0 and NaN pass as in the generic
//! kernel). SiLU (`x / (1 + exp(−x))`), GELU-tanh (`(0.5·x)·(1 + tanh(√(2/π)·(x + κ·x³)))`) and
//! tanh (`1 − 2/(exp(2|u|) + 1)` with the sign of `u` copied on) are the generic formulas
//! ([`edge_kernels::silu_f32`], [`edge_kernels::gelu_tanh_f32`], [`edge_kernels::expf`]) with
//! every lane performing the scalar operations in their order (no fused multiply-add outside
//! `exp`) and [`exp4`] the generic polynomial `exp` (its fused multiply-adds, as
//! [`edge_kernels::expf::exp_f32`]): all four kernels are bit-identical to the generic ones.

use std::arch::aarch64::{
    float32x4_t, vabsq_f32, vaddq_f32, vaddq_s32, vbslq_f32, vceqq_f32, vcgtq_f32, vcltq_f32,
    vcvtq_s32_f32, vdivq_f32, vdupq_n_f32, vdupq_n_s32, vdupq_n_u32, vfmaq_f32, vfmsq_f32,
    vld1q_f32, vmulq_f32, vmvnq_u32, vnegq_f32, vreinterpretq_f32_s32, vrndnq_f32, vshlq_n_s32,
    vshrq_n_s32, vst1q_f32, vsubq_f32, vsubq_s32,
};

use edge_kernels::expf::{EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E};
use edge_kernels::{GELU_KAPPA, GELU_SQRT_2_OVER_PI};
use rayon::prelude::*;

/// Elements per task (as the generic kernels).
const CHUNK: usize = 1 << 14;

/// [`edge_kernels::expf::exp_f32`] on four lanes: the same operations in the same order
/// (`n = round_ties_even(x·log₂e)`, `r = fma(−n, ln2_lo, fma(−n, ln2_hi, x))`, Horner with
/// `fmla`, two exact power-of-two factors; 0 below `EXP_LO`, +∞ above `EXP_HI`, NaN kept).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn exp4(x: float32x4_t) -> float32x4_t {
    let n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(LOG2E)));
    let r = vfmsq_f32(x, n, vdupq_n_f32(LN2_HI));
    let r = vfmsq_f32(r, n, vdupq_n_f32(LN2_LO));
    let mut p = vdupq_n_f32(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let one = vdupq_n_f32(1.0);
    p = vfmaq_f32(one, p, r);
    p = vfmaq_f32(one, p, r);
    let ni = vcvtq_s32_f32(n);
    let n1 = vshrq_n_s32::<1>(ni);
    let n2 = vsubq_s32(ni, n1);
    let bias = vdupq_n_s32(127);
    let s1 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n1, bias)));
    let s2 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n2, bias)));
    let y = vmulq_f32(vmulq_f32(p, s1), s2);
    let y = vbslq_f32(vcltq_f32(x, vdupq_n_f32(EXP_LO)), vdupq_n_f32(0.0), y);
    let y = vbslq_f32(
        vcgtq_f32(x, vdupq_n_f32(EXP_HI)),
        vdupq_n_f32(f32::INFINITY),
        y,
    );
    vbslq_f32(vmvnq_u32(vceqq_f32(x, x)), x, y)
}

/// SiLU of four lanes: `x / (1 + exp(−x))`.
#[inline]
#[target_feature(enable = "neon")]
fn silu4(x: float32x4_t) -> float32x4_t {
    vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), exp4(vnegq_f32(x))))
}

/// GELU-tanh of four lanes: `(0.5·x)·(1 + tanh(√(2/π)·(x + κ·((x·x)·x))))`.
#[inline]
#[target_feature(enable = "neon")]
fn gelu4(x: float32x4_t) -> float32x4_t {
    let cube = vmulq_f32(vmulq_f32(x, x), x);
    let inner = vmulq_f32(
        vdupq_n_f32(GELU_SQRT_2_OVER_PI),
        vaddq_f32(x, vmulq_f32(vdupq_n_f32(GELU_KAPPA), cube)),
    );
    let half_x = vmulq_f32(vdupq_n_f32(0.5), x);
    vmulq_f32(half_x, vaddq_f32(vdupq_n_f32(1.0), tanh4(inner)))
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

/// [`map4`] of `x` written over `x` (the in-place epilogue slots).
#[target_feature(enable = "neon")]
fn map4_in_place(act: Act, x: &mut [f32]) {
    let full = x.len() - x.len() % 4;
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i < full {
        // SAFETY: i + 4 <= full <= x.len().
        unsafe { vst1q_f32(p.add(i), act4(act, vld1q_f32(p.add(i)))) };
        i += 4;
    }
    if full < x.len() {
        let mut buf = [0.0f32; 4];
        let tail = x.len() - full;
        buf[..tail].copy_from_slice(&x[full..]);
        // SAFETY: `buf` is a 4-element stack array, read and written in place.
        unsafe { vst1q_f32(buf.as_mut_ptr(), act4(act, vld1q_f32(buf.as_ptr()))) };
        x[full..].copy_from_slice(&buf[..tail]);
    }
}

/// `neon_gelu_tanh_f32_x4_in_place`: [`gelu_tanh`] written over its input on the calling thread
/// (the epilogue of a fused `linear`, the contract of [`edge_kernels::gelu_tanh_in_place`]).
pub(super) fn gelu_tanh_in_place(x: &mut [f32]) {
    // SAFETY: NEON is part of the aarch64 baseline, so the target feature is present.
    unsafe { map4_in_place(Act::Gelu, x) }
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
