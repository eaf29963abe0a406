//! Element-wise kernels: activations, broadcast arithmetic and the adaLN helpers.
//!
//! Each output element depends only on the inputs at its own position, so any split is exact;
//! work is cut into fixed chunks of whole rows.

use rayon::prelude::*;

use crate::expf::{exp_f32, tanh_f32};

/// Elements per task (rounded to whole rows where rows matter).
pub const CHUNK: usize = 1 << 14;

fn rows_per_task(d: usize) -> usize {
    (CHUNK / d.max(1)).max(1)
}

/// Applies `f` to every element: `out[i] = f(x[i])`.
fn map_unary(x: &[f32], out: &mut [f32], what: &str, f: impl Fn(f32) -> f32 + Sync) {
    crate::contract::unary(x, out, what);
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, x)| {
            for (o, &v) in o.iter_mut().zip(x) {
                *o = f(v);
            }
        });
}

/// `out[i, j] = f(a[i, j], b[j])` with `a` `[len / d, d]` and `b` `[d]`.
fn map_rows(a: &[f32], b: &[f32], out: &mut [f32], what: &str, f: impl Fn(f32, f32) -> f32 + Sync) {
    crate::contract::broadcast(a, b, out, what);
    let d = b.len();
    if a.is_empty() {
        return;
    }
    let step = rows_per_task(d) * d;
    out.par_chunks_mut(step)
        .zip(a.par_chunks(step))
        .for_each(|(o, a)| {
            for (orow, arow) in o.chunks_mut(d).zip(a.chunks(d)) {
                for ((o, &x), &y) in orow.iter_mut().zip(arow).zip(b) {
                    *o = f(x, y);
                }
            }
        });
}

/// `generic_silu_f32`: `out = x · sigmoid(x) = x / (1 + exp(−x))` (torch `nn.SiLU`), with
/// the kernels' `exp` ([`exp_f32`]). `x` and `out` have the same length (any shape).
pub fn silu(x: &[f32], out: &mut [f32]) {
    map_unary(x, out, "silu", silu_f32);
}

/// One element of [`silu`]: `v / (1 + exp_f32(−v))`.
#[inline]
pub fn silu_f32(v: f32) -> f32 {
    v / (1.0 + exp_f32(-v))
}

/// `generic_relu_f32`: `out = x` where `x` is not below 0 (NaN and −0 pass), else 0 (torch
/// `nn.ReLU`). `x` and `out` have the same length (any shape).
pub fn relu(x: &[f32], out: &mut [f32]) {
    map_unary(x, out, "relu", |v| if v < 0.0 { 0.0 } else { v });
}

/// `generic_tanh_f32`: `out = tanh(x)` with the kernels' `tanh` ([`tanh_f32`]: an absolute
/// error of a few ulp of 1, exactly ±1 for large |x|). Same length in and out.
pub fn tanh(x: &[f32], out: &mut [f32]) {
    map_unary(x, out, "tanh", tanh_f32);
}

/// `√(2/π)` as [`gelu_tanh`] uses it.
pub const GELU_SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of [`gelu_tanh`].
pub const GELU_KAPPA: f32 = 0.044715;

/// One element of [`gelu_tanh`]: `(0.5·v)·(1 + tanh_f32(√(2/π)·(v + κ·((v·v)·v))))`.
#[inline]
pub fn gelu_tanh_f32(v: f32) -> f32 {
    let inner = GELU_SQRT_2_OVER_PI * (v + GELU_KAPPA * (v * v * v));
    0.5 * v * (1.0 + tanh_f32(inner))
}

/// `generic_gelu_tanh_f32`: `out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (torch
/// `GELU(approximate="tanh")`, transformers `gelu_new`), evaluated in f32 with the kernels'
/// `tanh` ([`tanh_f32`]) as [`gelu_tanh_f32`] writes it out.
pub fn gelu_tanh(x: &[f32], out: &mut [f32]) {
    map_unary(x, out, "gelu_tanh", gelu_tanh_f32);
}

/// `generic_gelu_tanh_f32_in_place`: [`gelu_tanh`] of `x` written over `x`, on the calling
/// thread (a fused GEMM epilogue, [`crate::EpilogueFn`]: the `linear` kernels call it on
/// blocks of outputs they just wrote). The same bits as [`gelu_tanh`] element by element.
pub fn gelu_tanh_in_place(x: &mut [f32]) {
    for v in x {
        *v = gelu_tanh_f32(*v);
    }
}

/// `generic_scale_f32`: `out = x · factor`.
pub fn scale(x: &[f32], factor: f32, out: &mut [f32]) {
    map_unary(x, out, "scale", |v| v * factor);
}

/// `generic_add_f32`: `out = a + b` with `b` broadcast over the leading axes of `a` (`b`'s shape
/// is a suffix of `a`'s, so `b.len()` divides `a.len()`); `out` has `a`'s shape.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    map_rows(a, b, out, "add", |x, y| x + y);
}

/// `generic_mul_f32`: `out = a · b` with `b` broadcast as in [`add`].
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) {
    map_rows(a, b, out, "mul", |x, y| x * y);
}

/// `generic_modulate_f32`: PixArt's `t2i_modulate`: `out = x · (1 + scale) + shift`.
/// Shapes: `x`, `out` `[m, d]`; `shift`, `scale` `[d]` broadcast over rows.
pub fn modulate(x: &[f32], m: usize, d: usize, shift: &[f32], scale: &[f32], out: &mut [f32]) {
    crate::contract::modulate(x, m, d, shift, scale, out);
    if m * d == 0 {
        return;
    }
    let step = rows_per_task(d) * d;
    out.par_chunks_mut(step)
        .zip(x.par_chunks(step))
        .for_each(|(o, x)| {
            for (orow, xrow) in o.chunks_mut(d).zip(x.chunks(d)) {
                for (j, (o, &v)) in orow.iter_mut().zip(xrow).enumerate() {
                    *o = v * (1.0 + scale[j]) + shift[j];
                }
            }
        });
}

/// `generic_gated_residual_f32`: `out = x + gate · y` (PixArt's gated residual
/// `hidden_states = gate_msa * attn_output + hidden_states`). Shapes: `x`, `y`, `out` `[m, d]`,
/// `gate` `[d]` broadcast over rows.
pub fn gated_residual(x: &[f32], y: &[f32], m: usize, d: usize, gate: &[f32], out: &mut [f32]) {
    crate::contract::gated_residual(x, y, m, d, gate, out);
    if m * d == 0 {
        return;
    }
    let step = rows_per_task(d) * d;
    out.par_chunks_mut(step)
        .zip(x.par_chunks(step).zip(y.par_chunks(step)))
        .for_each(|(o, (x, y))| {
            for (orow, (xrow, yrow)) in o.chunks_mut(d).zip(x.chunks(d).zip(y.chunks(d))) {
                for (((o, &a), &b), &g) in orow.iter_mut().zip(xrow).zip(yrow).zip(gate) {
                    *o = a + g * b;
                }
            }
        });
}
