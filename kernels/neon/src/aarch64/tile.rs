//! `neon_f32_6x16`: the f32 register tile of the shared GEMM driver ([`edge_kernels::F32Tile`])
//! behind the `F32`/`F16`/`BF16` `linear` and the `conv2d` slots.
//!
//! One output column per lane, one `fmla` (`vfmaq_n_f32`: `acc + w·x` with one rounding) per
//! input feature in increasing order, exactly the generic `f32::mul_add` chain, so these slots
//! give the generic kernels' bits (and the x86 tables'). 6 rows × 4 q-registers of columns: 24
//! accumulators, 4 weight vectors.

use std::arch::aarch64::{float32x4_t, vdupq_n_f32, vfmaq_n_f32, vld1q_f32, vst1q_f32};

use edge_kernels::F32Tile;

/// The tile.
pub(super) const NEON: F32Tile = F32Tile {
    name: "neon_f32_6x16",
    rows: 6,
    cols: 16,
    run: neon_tile,
    pack: edge_kernels::pack_panel,
    any_rows: false,
    kc: edge_kernels::KC,
};

fn neon_tile(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32], ld: usize) {
    NEON.check_args(xs, panel, kc, acc, ld);
    NEON.each_row_tile(xs.len(), |r0, nr| {
        let (rows, acc) = (&xs[r0..r0 + nr], &mut acc[r0 * ld..]);
        // SAFETY: Advanced SIMD is part of every aarch64 target; every row holds `kc` f32, the
        // panel `16·kc` and `acc` from row `r0` on the `(nr − 1)·ld + 16` it writes
        // (`F32Tile::check_args` asserted them for all the rows).
        unsafe {
            if nr == 6 {
                rc::<6>(rows, panel, kc, acc, ld)
            } else {
                rc::<1>(rows, panel, kc, acc, ld)
            }
        }
    });
}

/// # Safety
/// `xs` has `R` rows of ≥ `kc` f32, `panel` ≥ `16·kc`, `acc` ≥ `(R − 1)·ld + 16`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn rc<const R: usize>(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32], ld: usize) {
    const C: usize = 4;
    let ap = acc.as_mut_ptr();
    let mut a: [[float32x4_t; C]; R] = [[vdupq_n_f32(0.0); C]; R];
    for (r, ar) in a.iter_mut().enumerate() {
        for (c, v) in ar.iter_mut().enumerate() {
            // SAFETY: `r·ld + 4c + 4 ≤ (R − 1)·ld + 16 ≤ acc.len()`.
            *v = unsafe { vld1q_f32(ap.add(r * ld + 4 * c)) };
        }
    }
    let xp: [*const f32; R] = std::array::from_fn(|r| xs[r].as_ptr());
    let mut wp = panel.as_ptr();
    for t in 0..kc {
        // SAFETY: `t < kc`: the panel row `t` holds 16 f32 at `wp`, every `xs[r]` ≥ `kc` f32.
        unsafe {
            let w: [float32x4_t; C] = std::array::from_fn(|c| vld1q_f32(wp.add(4 * c)));
            for r in 0..R {
                let xv = *xp[r].add(t);
                for c in 0..C {
                    a[r][c] = vfmaq_n_f32(a[r][c], w[c], xv);
                }
            }
            wp = wp.add(16);
        }
    }
    for (r, ar) in a.iter().enumerate() {
        for (c, v) in ar.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { vst1q_f32(ap.add(r * ld + 4 * c), *v) };
        }
    }
}
