//! `neon_add_f32_x4`, `neon_mul_f32_x4`, `neon_modulate_f32_x4`, `neon_gated_residual_f32_x4`:
//! the broadcast arithmetic of [`edge_kernels::add`], [`edge_kernels::mul`],
//! [`edge_kernels::modulate`] and [`edge_kernels::gated_residual`], four lanes at a time.
//!
//! Every output element is computed with exactly the single f32 operations of the generic
//! kernel, in the same order and without fused multiply-add (Rust never contracts the generic
//! `a * b + c` either): `a + b`, `a · b`, `(x · (1 + scale)) + shift` and `x + gate · y`. The
//! results are therefore bit-identical to the generic kernels, for any thread count. Work is
//! split like the generic kernels, in tasks of whole rows of about 2¹⁴ elements; the `d % 4`
//! tail of a row is computed in scalar f32 with the same operations.

use std::arch::aarch64::{float32x4_t, vaddq_f32, vdupq_n_f32, vld1q_f32, vmulq_f32, vst1q_f32};

use rayon::prelude::*;

/// Elements per task (as the generic kernels).
const CHUNK: usize = 1 << 14;

/// Whole rows of `d` elements per task, as the generic kernels.
fn rows_per_task(d: usize) -> usize {
    (CHUNK / d.max(1)).max(1)
}

/// Four lanes of `x · y` (`MUL`) or `x + y`.
#[inline]
#[target_feature(enable = "neon")]
fn op4<const MUL: bool>(x: float32x4_t, y: float32x4_t) -> float32x4_t {
    if MUL {
        vmulq_f32(x, y)
    } else {
        vaddq_f32(x, y)
    }
}

/// One element `x · y` (`MUL`) or `x + y`: the same single f32 operation as [`op4`].
#[inline(always)]
fn op1<const MUL: bool>(x: f32, y: f32) -> f32 {
    if MUL {
        x * y
    } else {
        x + y
    }
}

/// Four f32 starting at `s[i]`.
#[inline]
#[target_feature(enable = "neon")]
fn load4(s: &[f32], i: usize) -> float32x4_t {
    let s = &s[i..i + 4];
    // SAFETY: `s` has exactly 4 readable elements (the slice above is bounds-checked); `ld1`
    // reads unaligned.
    unsafe { vld1q_f32(s.as_ptr()) }
}

/// Stores four f32 at `d[i]`.
#[inline]
#[target_feature(enable = "neon")]
fn store4(d: &mut [f32], i: usize, v: float32x4_t) {
    let d = &mut d[i..i + 4];
    // SAFETY: `d` has exactly 4 writable elements (the slice above is bounds-checked); `st1`
    // writes unaligned.
    unsafe { vst1q_f32(d.as_mut_ptr(), v) }
}

/// `out[i] = a[i] ∘ b[i]` for equal-length slices.
#[target_feature(enable = "neon")]
fn row_op<const MUL: bool>(a: &[f32], b: &[f32], out: &mut [f32]) {
    let n = out.len();
    debug_assert!(a.len() == n && b.len() == n);
    let full = n - n % 4;
    for i in (0..full).step_by(4) {
        store4(out, i, op4::<MUL>(load4(a, i), load4(b, i)));
    }
    for i in full..n {
        out[i] = op1::<MUL>(a[i], b[i]);
    }
}

/// `out[i] = a[i] ∘ pattern[i % 4]`; `pattern` repeats `b` (`b.len()` divides 4), and `a`
/// starts at a row boundary.
#[target_feature(enable = "neon")]
fn periodic_op<const MUL: bool>(a: &[f32], pattern: &[f32; 4], out: &mut [f32]) {
    let n = out.len();
    debug_assert_eq!(a.len(), n);
    let p = load4(pattern, 0);
    let full = n - n % 4;
    for i in (0..full).step_by(4) {
        store4(out, i, op4::<MUL>(load4(a, i), p));
    }
    for i in full..n {
        out[i] = op1::<MUL>(a[i], pattern[i % 4]);
    }
}

/// `out[i, j] = a[i, j] ∘ b[j]`, `a` `[len / d, d]`, `b` `[d]`: the checks and messages of the
/// generic `map_rows`.
fn map_rows<const MUL: bool>(a: &[f32], b: &[f32], out: &mut [f32], what: &str) {
    edge_kernels::contract::broadcast(a, b, out, what);
    let d = b.len();
    if a.is_empty() {
        return;
    }
    let step = rows_per_task(d) * d;
    if 4 % d == 0 {
        // d ∈ {1, 2, 4}: every task starts at a row boundary, so lane l always meets b[l % d].
        let pattern: [f32; 4] = std::array::from_fn(|l| b[l % d]);
        out.par_chunks_mut(step)
            .zip(a.par_chunks(step))
            .for_each(|(o, a)| {
                // SAFETY: NEON is part of the aarch64 baseline, so the target feature is
                // present.
                unsafe { periodic_op::<MUL>(a, &pattern, o) }
            });
    } else {
        out.par_chunks_mut(step)
            .zip(a.par_chunks(step))
            .for_each(|(o, a)| {
                for (orow, arow) in o.chunks_mut(d).zip(a.chunks(d)) {
                    // SAFETY: NEON is part of the aarch64 baseline, so the target feature is
                    // present.
                    unsafe { row_op::<MUL>(arow, b, orow) };
                }
            });
    }
}

/// `neon_add_f32_x4`: `out = a + b`, `b` broadcast over the leading axes of `a` (its shape is
/// a suffix of `a`'s); the contract of [`edge_kernels::add`].
pub(super) fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    map_rows::<false>(a, b, out, "add");
}

/// `neon_mul_f32_x4`: `out = a · b`, `b` broadcast as in [`add`]; the contract of
/// [`edge_kernels::mul`].
pub(super) fn mul(a: &[f32], b: &[f32], out: &mut [f32]) {
    map_rows::<true>(a, b, out, "mul");
}

/// One row of [`modulate`]: `out[j] = x[j] · (1 + scale[j]) + shift[j]`, three roundings in
/// this order.
#[target_feature(enable = "neon")]
fn modulate_row(x: &[f32], shift: &[f32], scale: &[f32], out: &mut [f32]) {
    let d = out.len();
    let full = d - d % 4;
    let one = vdupq_n_f32(1.0);
    for j in (0..full).step_by(4) {
        let t = vaddq_f32(one, load4(scale, j));
        store4(
            out,
            j,
            vaddq_f32(vmulq_f32(load4(x, j), t), load4(shift, j)),
        );
    }
    for j in full..d {
        out[j] = x[j] * (1.0 + scale[j]) + shift[j];
    }
}

/// `neon_modulate_f32_x4`: PixArt's `t2i_modulate`, `out = x · (1 + scale) + shift`; the
/// contract of [`edge_kernels::modulate`]. Shapes: `x`, `out` `[m, d]`; `shift`, `scale` `[d]`
/// broadcast over rows.
pub(super) fn modulate(
    x: &[f32],
    m: usize,
    d: usize,
    shift: &[f32],
    scale: &[f32],
    out: &mut [f32],
) {
    edge_kernels::contract::modulate(x, m, d, shift, scale, out);
    if m * d == 0 {
        return;
    }
    let step = rows_per_task(d) * d;
    out.par_chunks_mut(step)
        .zip(x.par_chunks(step))
        .for_each(|(o, x)| {
            for (orow, xrow) in o.chunks_mut(d).zip(x.chunks(d)) {
                // SAFETY: NEON is part of the aarch64 baseline, so the target feature is
                // present.
                unsafe { modulate_row(xrow, shift, scale, orow) };
            }
        });
}

/// One row of [`gated_residual`]: `out[j] = x[j] + gate[j] · y[j]`, product then sum.
#[target_feature(enable = "neon")]
fn gated_row(x: &[f32], y: &[f32], gate: &[f32], out: &mut [f32]) {
    let d = out.len();
    let full = d - d % 4;
    for j in (0..full).step_by(4) {
        let gy = vmulq_f32(load4(gate, j), load4(y, j));
        store4(out, j, vaddq_f32(load4(x, j), gy));
    }
    for j in full..d {
        out[j] = x[j] + gate[j] * y[j];
    }
}

/// `neon_gated_residual_f32_x4`: `out = x + gate · y` (PixArt's gated residual); the contract
/// of [`edge_kernels::gated_residual`]. Shapes: `x`, `y`, `out` `[m, d]`, `gate` `[d]`
/// broadcast over rows.
pub(super) fn gated_residual(
    x: &[f32],
    y: &[f32],
    m: usize,
    d: usize,
    gate: &[f32],
    out: &mut [f32],
) {
    edge_kernels::contract::gated_residual(x, y, m, d, gate, out);
    if m * d == 0 {
        return;
    }
    let step = rows_per_task(d) * d;
    out.par_chunks_mut(step)
        .zip(x.par_chunks(step).zip(y.par_chunks(step)))
        .for_each(|(o, (x, y))| {
            for (orow, (xrow, yrow)) in o.chunks_mut(d).zip(x.chunks(d).zip(y.chunks(d))) {
                // SAFETY: NEON is part of the aarch64 baseline, so the target feature is
                // present.
                unsafe { gated_row(xrow, yrow, gate, orow) };
            }
        });
}
