//! `neon_upsample_nearest2x_f32_x4`: torch `F.interpolate(x, scale_factor=2, mode="nearest")`
//! (diffusers `Upsample2D`) with NEON stores.
//!
//! Pure data movement: four input values are loaded, doubled with `zip1`/`zip2` and stored to
//! both output rows, so the result is bit-identical to [`edge_kernels::upsample_nearest2x`]
//! (NaN payloads included: no arithmetic touches the values). Parallel over blocks of input rows
//! whose size depends on `w` only.

use std::arch::aarch64::{vld1q_f32, vst1q_f32, vzip1q_f32, vzip2q_f32};

use rayon::prelude::*;

/// Output elements per task, at least (one input row at a time when rows are longer).
const TASK_ELEMS: usize = 16384;

/// `neon_upsample_nearest2x_f32_x4`: the contract of [`edge_kernels::upsample_nearest2x`]:
/// `out[ch, y, x] = x[ch, y / 2, x / 2]`. Shapes: `x` `[c, h, w]`, `out` `[c, 2h, 2w]`.
pub(super) fn upsample_nearest2x(x: &[f32], c: usize, h: usize, w: usize, out: &mut [f32]) {
    edge_kernels::contract::upsample_nearest2x(x, c, h, w, out);
    if c * h * w == 0 {
        return;
    }
    // Input row `(ch, y)` becomes output rows `2y` and `2y + 1` of channel `ch`: the 4·w output
    // elements starting at `(ch·h + y)·4w`.
    let rows = (TASK_ELEMS / (4 * w)).max(1);
    out.par_chunks_mut(4 * w * rows)
        .zip(x.par_chunks(w * rows))
        .for_each(|(ob, xb)| {
            for (pair, src) in ob.chunks_mut(4 * w).zip(xb.chunks(w)) {
                let (top, bottom) = pair.split_at_mut(2 * w);
                double_row(src, top, bottom);
            }
        });
}

/// `top[2i] = top[2i + 1] = bottom[2i] = bottom[2i + 1] = src[i]`.
fn double_row(src: &[f32], top: &mut [f32], bottom: &mut [f32]) {
    let w = src.len();
    assert!(
        top.len() == 2 * w && bottom.len() == 2 * w,
        "upsample_nearest2x: output rows of {} and {} for an input row of {w}",
        top.len(),
        bottom.len()
    );
    let full = w - w % 4;
    for i in (0..full).step_by(4) {
        // SAFETY: i + 4 <= w, so `src` holds 4 values at i and `top`, `bottom` (2w long,
        // asserted) hold 8 at 2i; `ld1`/`st1` have no alignment requirement beyond f32's, which
        // the slices have; NEON is baseline on aarch64.
        unsafe {
            let v = vld1q_f32(src.as_ptr().add(i));
            let (lo, hi) = (vzip1q_f32(v, v), vzip2q_f32(v, v));
            vst1q_f32(top.as_mut_ptr().add(2 * i), lo);
            vst1q_f32(top.as_mut_ptr().add(2 * i + 4), hi);
            vst1q_f32(bottom.as_mut_ptr().add(2 * i), lo);
            vst1q_f32(bottom.as_mut_ptr().add(2 * i + 4), hi);
        }
    }
    for i in full..w {
        let v = src[i];
        top[2 * i..2 * i + 2].fill(v);
        bottom[2 * i..2 * i + 2].fill(v);
    }
}
