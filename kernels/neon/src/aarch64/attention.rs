//! `neon_attention_f32_4q`: the attention step ([`edge_kernels::AttentionOps::block_tile`]) of
//! the generic online-softmax driver ([`edge_kernels::attention_with`]) in NEON lanes.
//!
//! Per block of up to 4 query rows and one packed key tile: `q·k` with 16 keys in four
//! q-registers per row (one `fmla` per head channel in order, the generic `f32::mul_add`
//! chain), the score epilogue, tile maximum and [`edge_kernels::tile_sum`] as the generic
//! scalar code, the weights with [`exp4`] (the generic polynomial on four lanes), and
//! `acc = fma(w, v, acc)` with head channels in lanes, keys in order. Every lane performs the
//! generic operation, so the output is bit-identical to the generic kernel (and to the x86
//! tables).

use std::arch::aarch64::{float32x4_t, vdupq_n_f32, vfmaq_n_f32, vld1q_f32, vst1q_f32, vsubq_f32};

use edge_kernels::expf::exp_f32;
use edge_kernels::{
    tile_max, tile_sum, AttentionOps, BlockState, QueryBlock, KEY_TILE, QUERY_TILE,
};

use super::elementwise::exp4;

/// The step.
pub(super) const NEON: AttentionOps = AttentionOps {
    name: "neon_attention_f32_4q",
    block_tile,
    block_tile_small: block_tile,
    pack_keys: edge_kernels::pack_keys,
    pack_values: edge_kernels::pack_values,
    phases_small: None,
};

fn block_tile<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    b.check_step(keys, st);
    // SAFETY: Advanced SIMD is part of every aarch64 target; the packed keys hold
    // `hd · KEY_TILE` f32 and the packed values the tile's `nk · hd` (both checked by
    // `QueryBlock::check_step`); query rows are bounds-checked slices and the
    // state arrays are sized by the constants asserted above.
    unsafe { block(b, keys, st) }
}

/// # Safety
/// As checked by [`block_tile`].
#[target_feature(enable = "neon")]
unsafe fn block<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    let (hd, nq, nk) = (b.p.head_dim, b.nq, b.nk);
    let qs = b.queries();
    // Dot products, 16 keys (four q-registers) × 4 rows at a time.
    let mut dots = [[0f32; KEY_TILE]; QUERY_TILE];
    let kp = keys.as_ptr();
    for c0 in (0..nk).step_by(16) {
        let mut a = [[vdupq_n_f32(0.0); 4]; QUERY_TILE];
        for d in 0..hd {
            // SAFETY: `d < hd`, `c0 + 16 ≤ KEY_TILE`: inside the packed keys.
            let kv: [float32x4_t; 4] =
                std::array::from_fn(|i| unsafe { vld1q_f32(kp.add(d * KEY_TILE + c0 + 4 * i)) });
            for r in 0..QUERY_TILE {
                let q = qs[r][d];
                for i in 0..4 {
                    a[r][i] = vfmaq_n_f32(a[r][i], kv[i], q);
                }
            }
        }
        for r in 0..QUERY_TILE {
            for i in 0..4 {
                // SAFETY: `c0 + 4i + 4 ≤ KEY_TILE`, inside the row of `dots`.
                unsafe { vst1q_f32(dots[r].as_mut_ptr().add(c0 + 4 * i), a[r][i]) };
            }
        }
    }
    for r in 0..nq {
        let t = b.row(r);
        let s = &mut st.scores[r][..nk];
        for (c, sj) in s.iter_mut().enumerate() {
            *sj = t.score(b.j0 + c, dots[r][c]);
        }
        let new_max = tile_max(st.run_max[r], s);
        let correction = exp_f32(st.run_max[r] - new_max);
        if correction != 1.0 {
            for x in &mut st.acc[r][..hd] {
                *x *= correction;
            }
        }
        exp_tile(s, new_max);
        st.run_sum[r] = st.run_sum[r] * correction + tile_sum(s);
        st.run_max[r] = new_max;
    }
    // acc[r][d] = fma(w[r][j], v[j][d], acc[r][d]), keys in order, 16 channels at a time.
    let vrow = |j: usize| -> *const f32 {
        // SAFETY: row `j < nk` of the packed values (`QueryBlock::check_step`).
        unsafe { b.values.as_ptr().add(j * hd) }
    };
    let full = hd - hd % 4;
    for d0 in (0..full).step_by(16) {
        let nv = ((full - d0) / 4).min(4);
        for r in 0..nq {
            let ap = st.acc[r].as_mut_ptr();
            let mut a = [vdupq_n_f32(0.0); 4];
            for (i, ai) in a.iter_mut().enumerate().take(nv) {
                // SAFETY: `d0 + 4i + 4 ≤ full ≤ hd ≤ MAX_HEAD_DIM`.
                *ai = unsafe { vld1q_f32(ap.add(d0 + 4 * i)) };
            }
            for j in 0..nk {
                let w = st.scores[r][j];
                let vp = vrow(j);
                for (i, ai) in a.iter_mut().enumerate().take(nv) {
                    // SAFETY: channels `d0 + 4i .. + 4 < hd` of value row `j`.
                    *ai = vfmaq_n_f32(*ai, unsafe { vld1q_f32(vp.add(d0 + 4 * i)) }, w);
                }
            }
            for (i, ai) in a.iter().enumerate().take(nv) {
                // SAFETY: as for the loads.
                unsafe { vst1q_f32(ap.add(d0 + 4 * i), *ai) };
            }
        }
    }
    for r in 0..nq {
        for j in 0..nk {
            let w = st.scores[r][j];
            let vp = vrow(j);
            for d in full..hd {
                // SAFETY: channel `d < hd` of value row `j`.
                let v = unsafe { *vp.add(d) };
                st.acc[r][d] = w.mul_add(v, st.acc[r][d]);
            }
        }
    }
}

/// `s[j] = exp_f32(s[j] − m)` with [`exp4`] on whole groups of four, the tail scalar.
#[target_feature(enable = "neon")]
fn exp_tile(s: &mut [f32], m: f32) {
    let full = s.len() - s.len() % 4;
    let mv = vdupq_n_f32(m);
    for i in (0..full).step_by(4) {
        // SAFETY: `i + 4 ≤ full ≤ s.len()`.
        unsafe {
            let y = vsubq_f32(vld1q_f32(s.as_ptr().add(i)), mv);
            vst1q_f32(s.as_mut_ptr().add(i), exp4(y));
        }
    }
    for v in &mut s[full..] {
        *v = exp_f32(*v - m);
    }
}

/// `neon_attention_f32_4q`: the contract of [`edge_kernels::attention`], through the generic
/// driver with [`NEON`].
pub(super) fn attention(
    p: &edge_kernels::AttentionParams,
    q: &[f32],
    kv: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    edge_kernels::attention_with(&NEON, p, q, kv, key_mask, bias, out)
}
