//! The attention step ([`edge_kernels::AttentionOps::block_tile`]) in AVX2 / AVX-512 lanes:
//! `q·k` with the packed keys of the tile in lanes (one `vfmadd` per head channel, in order),
//! the polynomial `exp` of [`edge_kernels::expf`] on 8 / 16 lanes, and `acc ·= c`,
//! `acc = fma(w, v, acc)` with head channels in lanes; the scalar parts (tile maximum, running
//! sum) are the generic ones. Each lane does the generic scalar operation, so the attention
//! output is bit-identical.

use std::arch::x86_64::*;

use edge_kernels::expf::exp_f32;
use edge_kernels::{
    tile_max, tile_sum, AttentionOps, BlockState, KeyTile, QueryBlock, RowState, KEY_TILE,
    QUERY_TILE,
};

use super::vmath::{exp16, exp8, mask, transpose16};

/// AVX2 step: one row at a time.
pub(crate) const AVX2: AttentionOps = AttentionOps {
    name: "avx2_attention_f32",
    block_tile: block_tile_avx2,
    pack_keys: edge_kernels::pack_keys,
};

/// AVX-512 step: the block's rows together, so each key and value row is loaded once per block;
/// keys packed with 16 × 16 in-register transposes.
pub(crate) const AVX512: AttentionOps = AttentionOps {
    name: "avx512_attention_f32_4q",
    block_tile: block_tile_avx512,
    pack_keys: pack_keys_avx512,
};

/// [`edge_kernels::pack_keys`] (same layout and zero lanes) with AVX-512 transposes of 16 keys ×
/// 16 channels.
fn pack_keys_avx512(
    p: &edge_kernels::AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let hd = p.head_dim;
    assert!((1..=KEY_TILE).contains(&nk) && dst.len() >= hd * KEY_TILE);
    let last = (j0 + nk - 1) * p.kv_stride + p.k_offset + h * hd + hd;
    assert!(last <= kv_src.len(), "attention: key rows outside kv_src");
    // SAFETY: AVX-512F was detected before this table was built; every key row read lies below
    // `last ≤ kv_src.len()` (asserted; rows grow with the key index), masked to `hd` channels,
    // and every store stays below `hd · KEY_TILE ≤ dst.len()`.
    unsafe { pack_keys_impl(p, kv_src, h, j0, nk, dst) }
}

#[target_feature(enable = "avx512f")]
unsafe fn pack_keys_impl(
    p: &edge_kernels::AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let hd = p.head_dim;
    let base = kv_src.as_ptr();
    let out = dst.as_mut_ptr();
    for c0 in (0..KEY_TILE).step_by(16) {
        for d0 in (0..hd).step_by(16) {
            let nd = (hd - d0).min(16);
            let m = mask(nd);
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, ri) in r.iter_mut().enumerate() {
                let c = c0 + i;
                if c < nk {
                    let off = (j0 + c) * p.kv_stride + p.k_offset + h * hd + d0;
                    // SAFETY: masked to the `nd` channels of key row `j0 + c` (the caller's
                    // bound).
                    *ri = unsafe { _mm512_maskz_loadu_ps(m, base.add(off)) };
                }
            }
            let t = transpose16(r);
            for (i, ti) in t.iter().enumerate().take(nd) {
                // SAFETY: `(d0 + i)·KEY_TILE + c0 + 16 ≤ hd·KEY_TILE`.
                unsafe { _mm512_storeu_ps(out.add((d0 + i) * KEY_TILE + c0), *ti) };
            }
        }
    }
}

fn block_tile_avx2(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState) {
    for r in 0..b.nq {
        let t = b.row(r);
        let (mut row, scores) = st.row(r, b.p.head_dim);
        row_tile_avx2(&t, keys, &mut row, scores);
    }
}

fn block_tile_avx512(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState) {
    b.check_step(keys);
    // SAFETY: AVX-512F was detected before this step was put in a table
    // (`crate::x86_64::avx512_table`); the packed keys hold `hd · KEY_TILE` f32 (asserted), the
    // packed values hold the tile's `nk · hd` f32 (both checked by `QueryBlock::check_step`),
    // query, bias and mask rows are bounds-checked slices, and the state arrays
    // are sized by the constants asserted above.
    unsafe { block_avx512(b, keys, st) }
}

/// `dots[r][c] = fma(q_r[hd−1], k_c[hd−1], … fma(q_r[0], k_c[0], 0))` for the 4 query rows and the
/// `16·NC` packed keys (lanes past the tile's keys read the packing's zeros).
///
/// # Safety
/// AVX-512F present; `keys` holds `hd · KEY_TILE` f32 and every `qs[r]` `hd` f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scores_avx512<const NC: usize>(
    qs: &[&[f32]; QUERY_TILE],
    keys: &[f32],
    hd: usize,
    dots: &mut [[f32; KEY_TILE]; QUERY_TILE],
) {
    let mut a = [[_mm512_setzero_ps(); NC]; QUERY_TILE];
    let kp = keys.as_ptr();
    assert!(keys.len() >= hd * KEY_TILE && qs.iter().all(|q| q.len() >= hd));
    let qp: [*const f32; QUERY_TILE] = std::array::from_fn(|r| qs[r].as_ptr());
    for d in 0..hd {
        // SAFETY: `d < hd` and `16·NC ≤ KEY_TILE`, inside the packed keys.
        let kv: [__m512; NC] =
            std::array::from_fn(|c| unsafe { _mm512_loadu_ps(kp.add(d * KEY_TILE + 16 * c)) });
        for r in 0..QUERY_TILE {
            // SAFETY: `d < hd ≤ qs[r].len()` (asserted above).
            let qb = _mm512_set1_ps(unsafe { *qp[r].add(d) });
            for c in 0..NC {
                a[r][c] = _mm512_fmadd_ps(qb, kv[c], a[r][c]);
            }
        }
    }
    for r in 0..QUERY_TILE {
        for c in 0..NC {
            // SAFETY: `16·c + 16 ≤ KEY_TILE`, inside the row of `dots`.
            unsafe { _mm512_storeu_ps(dots[r].as_mut_ptr().add(16 * c), a[r][c]) };
        }
    }
}

/// [`block_tile_avx512`]: scores of 4 rows × the tile's keys (keys in lanes), then per row the
/// generic scalar steps and the vector `exp`, then `acc[r] = fma(w[r][j], v[j], acc[r])` over
/// 16-lane chunks of the head with each value chunk loaded once for all rows (keys still in
/// increasing order per element, so every row's sums are the generic ones).
#[target_feature(enable = "avx512f")]
unsafe fn block_avx512(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState) {
    let (p, hd, nq, nk) = (b.p, b.p.head_dim, b.nq, b.nk);
    let qs: [&[f32]; QUERY_TILE] = std::array::from_fn(|r| {
        let i = b.i0 + r.min(nq - 1);
        &b.q_src[i * p.q_stride + p.q_offset + b.h * hd..][..hd]
    });
    let mut dots = [[0f32; KEY_TILE]; QUERY_TILE];
    // SAFETY: AVX-512F is enabled here; the caller checked the packed keys' length and every
    // query row holds `hd` elements.
    unsafe {
        match nk.div_ceil(16) {
            1 => scores_avx512::<1>(&qs, keys, hd, &mut dots),
            2 => scores_avx512::<2>(&qs, keys, hd, &mut dots),
            3 => scores_avx512::<3>(&qs, keys, hd, &mut dots),
            _ => scores_avx512::<4>(&qs, keys, hd, &mut dots),
        }
    }
    // Per row, 16 keys at a time: the score (`KeyTile::score`'s operations in its order:
    // `scale·dot`, `+ bias[j]`, `+ (1 − mask[j])·masked_value`), the tile maximum (lanes past
    // the keys at −∞; `vmaxps(new, running)` skips NaN scores as `f32::max` does, and the order
    // of a maximum changes no bit that reaches the output), the weights `exp(s − m')` (zero past
    // the keys) and their `tile_sum` (16 lanes, then the halving tree). Each step runs for all
    // the block's rows before the next, and nothing branches on the data (the corrections of
    // the 4 rows are one `exp16`, and `acc ·= c` always runs, in `acc_group`: `x · 1 = x`), so
    // the rows' dependency chains overlap instead of following each other.
    let nc = nk.div_ceil(16);
    let keep = b.key_mask.map(|x| &x[b.j0..b.j0 + nk]);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut v = [[_mm512_setzero_ps(); KEY_TILE / 16]; QUERY_TILE];
    let mut row_max = [f32::NEG_INFINITY; 16];
    for r in 0..nq {
        let bias = b
            .bias
            .map(|x| &x[(b.h * p.lq + b.i0 + r) * p.lk + b.j0..][..nk]);
        let mut mx = ninf;
        for (c, vc) in v[r].iter_mut().enumerate().take(nc) {
            let j = 16 * c;
            let m = mask((nk - j).min(16));
            // SAFETY: the mask covers `j..nk` of the `nk`-long bias and mask slices; `dots[r]`
            // holds `KEY_TILE ≥ j + 16` f32.
            unsafe {
                let mut x = _mm512_mul_ps(
                    _mm512_set1_ps(p.scale),
                    _mm512_loadu_ps(dots[r].as_ptr().add(j)),
                );
                if let Some(bs) = bias {
                    x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, bs.as_ptr().add(j)));
                }
                if let Some(km) = keep {
                    let drop = _mm512_sub_ps(
                        _mm512_set1_ps(1.0),
                        _mm512_maskz_loadu_ps(m, km.as_ptr().add(j)),
                    );
                    x = _mm512_add_ps(x, _mm512_mul_ps(drop, _mm512_set1_ps(p.masked_value)));
                }
                *vc = x;
                mx = _mm512_max_ps(_mm512_mask_blend_ps(m, ninf, x), mx);
            }
        }
        row_max[r] = _mm512_reduce_max_ps(mx);
    }
    // Lane r: the row's running maximum, then the new one (`run_max.max(tile maximum)`: no NaN
    // reaches either operand), the correction `exp(m − m')` and the new maximum per row.
    let mut old = [f32::NEG_INFINITY; 16];
    old[..QUERY_TILE].copy_from_slice(&st.run_max);
    // SAFETY: both arrays hold 16 f32.
    let (old, tmax) = unsafe {
        (
            _mm512_loadu_ps(old.as_ptr()),
            _mm512_loadu_ps(row_max.as_ptr()),
        )
    };
    let new_max = _mm512_max_ps(tmax, old);
    let corr_v = exp16(_mm512_sub_ps(old, new_max));
    let mut corr = [0f32; 16];
    let mut nmax = [0f32; 16];
    // SAFETY: both arrays hold 16 f32.
    unsafe {
        _mm512_storeu_ps(corr.as_mut_ptr(), corr_v);
        _mm512_storeu_ps(nmax.as_mut_ptr(), new_max);
    }
    let mut sv = [_mm512_setzero_ps(); QUERY_TILE];
    for r in 0..nq {
        let nm = _mm512_set1_ps(nmax[r]);
        for (c, vc) in v[r].iter().enumerate().take(nc) {
            let m = mask((nk - 16 * c).min(16));
            let w = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(*vc, nm)));
            sv[r] = _mm512_add_ps(sv[r], w);
            // SAFETY: `16c + 16 ≤ KEY_TILE`, inside the row's score array.
            unsafe { _mm512_storeu_ps(st.scores[r].as_mut_ptr().add(16 * c), w) };
        }
    }
    for r in 0..nq {
        let s = sv[r];
        let t = _mm512_add_ps(s, _mm512_shuffle_f32x4::<0b01_00_11_10>(s, s));
        let t = _mm512_add_ps(t, _mm512_shuffle_f32x4::<0b10_11_00_01>(t, t));
        let t = _mm512_add_ps(t, _mm512_permute_ps::<0b01_00_11_10>(t));
        let t = _mm512_add_ps(t, _mm512_permute_ps::<0b10_11_00_01>(t));
        st.run_sum[r] = st.run_sum[r] * corr[r] + _mm512_cvtss_f32(t);
        st.run_max[r] = nmax[r];
    }
    let corr: [f32; QUERY_TILE] = std::array::from_fn(|r| corr[r]);
    // The packed values, `[nk, hd]` (`QueryBlock::check_step`).
    let vp = b.values.as_ptr();
    // Groups of up to 5 × 16 head channels: the group's accumulators of every row stay in
    // registers while the keys pass in order.
    for d0 in (0..hd).step_by(GROUP_LANES) {
        let lanes = (hd - d0).min(GROUP_LANES);
        // SAFETY: AVX-512F is enabled here; `vp` holds `nk` value rows of `hd` elements and the
        // accumulators hold `MAX_HEAD_DIM ≥ hd`; the masks stay below `hd`.
        unsafe {
            match (nq, lanes.div_ceil(16)) {
                (4, 5) => acc_group::<4, 5>(st, &corr, vp, nk, hd, d0, lanes),
                (4, 4) => acc_group::<4, 4>(st, &corr, vp, nk, hd, d0, lanes),
                (4, 3) => acc_group::<4, 3>(st, &corr, vp, nk, hd, d0, lanes),
                (4, 2) => acc_group::<4, 2>(st, &corr, vp, nk, hd, d0, lanes),
                (4, _) => acc_group::<4, 1>(st, &corr, vp, nk, hd, d0, lanes),
                (3, _) => acc_group::<3, 5>(st, &corr, vp, nk, hd, d0, lanes),
                (2, _) => acc_group::<2, 5>(st, &corr, vp, nk, hd, d0, lanes),
                _ => acc_group::<1, 5>(st, &corr, vp, nk, hd, d0, lanes),
            }
        }
    }
}

/// Head channels per register group of the value pass.
const GROUP_LANES: usize = 80;

/// `acc[r][d0 + d] ·= corr[r]`, then `acc[r][d0 + d] = fma(w[r][j], v[j][d0 + d],
/// acc[r][d0 + d])` for the first `NQ` rows, `d < lanes ≤ 16·NC`, keys `j` in order (the generic
/// per-element sequence; the generic step skips the product when `corr[r] = 1`, which changes
/// no bit).
///
/// # Safety
/// AVX-512F must be present; `vp` must point at `nk` rows of `hd ≥ d0 + lanes` readable f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn acc_group<const NQ: usize, const NC: usize>(
    st: &mut BlockState,
    corr: &[f32; QUERY_TILE],
    vp: *const f32,
    nk: usize,
    hd: usize,
    d0: usize,
    lanes: usize,
) {
    let mut m = [0 as __mmask16; NC];
    for (c, mc) in m.iter_mut().enumerate() {
        *mc = mask(lanes.saturating_sub(16 * c).min(16));
    }
    let mut a = [[_mm512_setzero_ps(); NC]; NQ];
    for r in 0..NQ {
        for c in 0..NC {
            // SAFETY: masked to `d0 + 16c + lane < d0 + lanes ≤ MAX_HEAD_DIM`.
            let x = unsafe { _mm512_maskz_loadu_ps(m[c], st.acc[r].as_ptr().add(d0 + 16 * c)) };
            a[r][c] = _mm512_mul_ps(x, _mm512_set1_ps(corr[r]));
        }
    }
    for jj in 0..nk {
        let v = vp.wrapping_add(jj * hd);
        let mut w = [_mm512_setzero_ps(); NQ];
        for r in 0..NQ {
            w[r] = _mm512_set1_ps(st.scores[r][jj]);
        }
        for c in 0..NC {
            // SAFETY: masked to the `lanes` channels of value row `jj` from `d0`.
            let vv = unsafe { _mm512_maskz_loadu_ps(m[c], v.add(d0 + 16 * c)) };
            for r in 0..NQ {
                a[r][c] = _mm512_fmadd_ps(w[r], vv, a[r][c]);
            }
        }
    }
    for r in 0..NQ {
        for c in 0..NC {
            // SAFETY: as for the load.
            unsafe {
                _mm512_mask_storeu_ps(st.acc[r].as_mut_ptr().add(d0 + 16 * c), m[c], a[r][c])
            };
        }
    }
}

fn row_tile_avx2(t: &KeyTile<'_>, keys: &[f32], st: &mut RowState<'_>, scores: &mut [f32]) {
    assert!(t.nk >= 1 && scores.len() >= t.nk && st.acc.len() == t.p.head_dim);
    assert!(keys.len() >= t.p.head_dim * KEY_TILE && t.q.len() >= t.p.head_dim);
    // SAFETY: AVX2 and FMA were detected before this step was put in a table
    // (`crate::x86_64::avx2_table`); every access below is through slices checked above or by
    // `KeyTile::value`.
    unsafe { row_tile_avx2_impl(t, keys, st, scores) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn row_tile_avx2_impl(
    t: &KeyTile<'_>,
    keys: &[f32],
    st: &mut RowState<'_>,
    scores: &mut [f32],
) {
    let hd = t.p.head_dim;
    let mut a = [_mm256_setzero_ps(); KEY_TILE / 8];
    let kp = keys.as_ptr();
    for d in 0..hd {
        let qb = _mm256_set1_ps(t.q[d]);
        for (c, v) in a.iter_mut().enumerate() {
            // SAFETY: `d < hd` and `8c + 8 ≤ KEY_TILE`, inside the packed keys.
            *v = _mm256_fmadd_ps(
                qb,
                unsafe { _mm256_loadu_ps(kp.add(d * KEY_TILE + 8 * c)) },
                *v,
            );
        }
    }
    let mut dots = [0f32; KEY_TILE];
    for (c, v) in a.iter().enumerate() {
        // SAFETY: `8c + 8 ≤ KEY_TILE`.
        unsafe { _mm256_storeu_ps(dots.as_mut_ptr().add(8 * c), *v) };
    }
    let s = &mut scores[..t.nk];
    for (c, sj) in s.iter_mut().enumerate() {
        *sj = t.score(t.j0 + c, dots[c]);
    }
    let new_max = tile_max(*st.run_max, s);
    let correction = exp_f32(*st.run_max - new_max);
    if correction != 1.0 {
        scale_avx2(st.acc, correction);
    }
    for sj in s.iter_mut() {
        *sj -= new_max;
    }
    exp_avx2(s);
    *st.run_sum = *st.run_sum * correction + tile_sum(s);
    for (jj, &w) in s.iter().enumerate() {
        axpy_avx2(st.acc, w, t.value(t.j0 + jj));
    }
    *st.run_max = new_max;
}

#[inline]
#[target_feature(enable = "avx2")]
fn exp_avx2(s: &mut [f32]) {
    let full = s.len() - s.len() % 8;
    // SAFETY: AVX2 is enabled in this function; loads and stores stay below `full ≤ s.len()`.
    unsafe { exp8_run(s.as_mut_ptr(), full) };
    for v in &mut s[full..] {
        *v = exp_f32(*v);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn exp8_run(p: *mut f32, full: usize) {
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full`, inside the slice.
        unsafe { _mm256_storeu_ps(p.add(i), exp8(_mm256_loadu_ps(p.add(i)))) };
        i += 8;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn axpy_avx2(acc: &mut [f32], w: f32, v: &[f32]) {
    assert_eq!(acc.len(), v.len());
    let full = acc.len() - acc.len() % 8;
    // SAFETY: AVX2 is enabled in this function; both slices hold `acc.len() ≥ full` elements.
    unsafe { axpy8_run(acc.as_mut_ptr(), w, v.as_ptr(), full) };
    for (x, &vv) in acc[full..].iter_mut().zip(&v[full..]) {
        *x = w.mul_add(vv, *x);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy8_run(a: *mut f32, w: f32, v: *const f32, full: usize) {
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= full`, inside both slices.
        unsafe {
            let x = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v.add(i)), _mm256_loadu_ps(a.add(i)));
            _mm256_storeu_ps(a.add(i), x);
        }
        i += 8;
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn scale_avx2(acc: &mut [f32], c: f32) {
    let full = acc.len() - acc.len() % 8;
    // SAFETY: AVX2 is enabled in this function; `full ≤ acc.len()`.
    unsafe { scale8_run(acc.as_mut_ptr(), c, full) };
    for x in &mut acc[full..] {
        *x *= c;
    }
}

#[inline]
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
