//! The attention step ([`edge_kernels::AttentionOps::block_tile`]) in AVX2 / AVX-512 lanes:
//! `q·k` with the packed keys of the tile in lanes (one `vfmadd` per head channel, in order),
//! the polynomial `exp` of [`edge_kernels::expf`] on 8 / 16 lanes, and `acc ·= c`,
//! `acc = fma(w, v, acc)` with head channels in lanes; the scalar parts (tile maximum, running
//! sum) are the generic ones. Each lane does the generic scalar operation, so the attention
//! output is bit-identical.

use std::arch::x86_64::*;

use edge_kernels::{AttentionOps, BlockState, QueryBlock, KEY_TILE, QUERY_TILE};

use super::vmath::{exp16, exp8, mask, transpose16, transpose8};

/// AVX2 step: the block's rows together, as [`AVX512`] does, in 8-lane registers (16 keys ×
/// 4 rows of scores, 16 head channels × 4 rows of accumulators at a time).
pub(crate) const AVX2: AttentionOps = AttentionOps {
    name: "avx2_attention_f32_4q",
    block_tile: block_tile_avx2,
    pack_keys: pack_keys_avx2,
};

/// AVX-512 step: the block's rows together, so each key and value row is loaded once per block;
/// keys packed with 16 × 16 in-register transposes.
pub(crate) const AVX512: AttentionOps = AttentionOps {
    name: "avx512_attention_f32_4q",
    block_tile: block_tile_avx512,
    pack_keys: pack_keys_avx512,
};

/// What a SIMD [`AttentionOps::pack_keys`] relies on: `1 ≤ nk ≤ KEY_TILE`, room for
/// `head_dim · KEY_TILE` values in `dst`, and every key row read (they grow with the key index)
/// inside `kv_src`.
fn check_pack_keys(
    p: &edge_kernels::AttentionParams,
    kv_len: usize,
    h: usize,
    j0: usize,
    nk: usize,
    dst_len: usize,
) {
    let hd = p.head_dim;
    assert!((1..=KEY_TILE).contains(&nk) && dst_len >= hd * KEY_TILE);
    let last = (j0 + nk - 1) * p.kv_stride + p.k_offset + h * hd + hd;
    assert!(last <= kv_len, "attention: key rows outside kv_src");
}

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
    check_pack_keys(p, kv_src.len(), h, j0, nk, dst.len());
    // SAFETY: AVX-512F was detected before this table was built; every key row read lies below
    // the last one's end (asserted by `check_pack_keys`; rows grow with the key index),
    // masked to `hd` channels,
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

/// [`edge_kernels::pack_keys`] (same layout and zero lanes) with AVX2 transposes of 8 keys × 8
/// channels.
fn pack_keys_avx2(
    p: &edge_kernels::AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    check_pack_keys(p, kv_src.len(), h, j0, nk, dst.len());
    // SAFETY: AVX2 was detected before this table was built; every key row read lies below
    // the last one's end (asserted by `check_pack_keys`; rows grow with the key index),
    // masked to `hd` channels,
    // and every store stays below `hd · KEY_TILE ≤ dst.len()`.
    unsafe { pack_keys_avx2_impl(p, kv_src, h, j0, nk, dst) }
}

#[target_feature(enable = "avx2")]
unsafe fn pack_keys_avx2_impl(
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
    for c0 in (0..KEY_TILE).step_by(8) {
        for d0 in (0..hd).step_by(8) {
            let nd = (hd - d0).min(8);
            let m = mask8(nd);
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, ri) in r.iter_mut().enumerate() {
                let c = c0 + i;
                if c < nk {
                    let off = (j0 + c) * p.kv_stride + p.k_offset + h * hd + d0;
                    // SAFETY: masked to the `nd` channels of key row `j0 + c` (the caller's
                    // bound).
                    *ri = unsafe { _mm256_maskload_ps(base.add(off), m) };
                }
            }
            let t = transpose8(r);
            for (i, ti) in t.iter().enumerate().take(nd) {
                // SAFETY: `(d0 + i)·KEY_TILE + c0 + 8 ≤ hd·KEY_TILE`.
                unsafe { _mm256_storeu_ps(out.add((d0 + i) * KEY_TILE + c0), *ti) };
            }
        }
    }
}

fn block_tile_avx2(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState) {
    b.check_step(keys);
    // SAFETY: AVX2 and FMA were detected before this step was put in a table
    // (`crate::x86_64::avx2_table`); the packed keys hold `hd · KEY_TILE` f32 and the packed
    // values the tile's `nk · hd` f32 (both checked by `QueryBlock::check_step`), query, bias
    // and mask rows are bounds-checked slices, and the state arrays are sized by constants.
    unsafe { block_avx2(b, keys, st) }
}

/// Lanes `0 .. len.min(8)` set (all bits), the others clear: the mask of `vmaskmovps`.
#[inline]
#[target_feature(enable = "avx2")]
fn mask8(len: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(len.min(8) as i32), idx)
}

/// `dots[r][16c0 + c] = fma(q_r[hd−1], k[hd−1], … fma(q_r[0], k[0], 0))` for the 4 query rows
/// and the 16 packed keys `16c0 ..` (lanes past the tile's keys read the packing's zeros).
///
/// # Safety
/// AVX2 and FMA present; `keys` holds `hd · KEY_TILE` f32, every `qs[r]` `hd` f32, and
/// `16c0 + 16 ≤ KEY_TILE`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores16_avx2(
    qs: &[&[f32]; QUERY_TILE],
    keys: &[f32],
    hd: usize,
    c0: usize,
    dots: &mut [[f32; KEY_TILE]; QUERY_TILE],
) {
    assert!(keys.len() >= hd * KEY_TILE && qs.iter().all(|q| q.len() >= hd));
    assert!(16 * c0 + 16 <= KEY_TILE);
    let mut a = [[_mm256_setzero_ps(); 2]; QUERY_TILE];
    let kp = keys.as_ptr().wrapping_add(16 * c0);
    let qp: [*const f32; QUERY_TILE] = std::array::from_fn(|r| qs[r].as_ptr());
    for d in 0..hd {
        // SAFETY: `d < hd` and `16c0 + 16 ≤ KEY_TILE`, inside the packed keys.
        let kv = unsafe {
            [
                _mm256_loadu_ps(kp.add(d * KEY_TILE)),
                _mm256_loadu_ps(kp.add(d * KEY_TILE + 8)),
            ]
        };
        for r in 0..QUERY_TILE {
            // SAFETY: `d < hd ≤ qs[r].len()` (asserted above).
            let qb = _mm256_set1_ps(unsafe { *qp[r].add(d) });
            for c in 0..2 {
                a[r][c] = _mm256_fmadd_ps(qb, kv[c], a[r][c]);
            }
        }
    }
    for r in 0..QUERY_TILE {
        for c in 0..2 {
            // SAFETY: `16c0 + 8c + 8 ≤ KEY_TILE`, inside the row of `dots`.
            unsafe { _mm256_storeu_ps(dots[r].as_mut_ptr().add(16 * c0 + 8 * c), a[r][c]) };
        }
    }
}

/// [`block_tile_avx2`]: the steps of [`block_avx512`] in the same order on 8 lanes — scores of
/// 4 rows × 16 keys at a time, per row the score terms, the tile maximum, the weights
/// `exp(s − m')` and their `tile_sum` (16 lanes as two registers, then the halving tree), then
/// `acc[r] = fma(w[r][j], v[j], acc[r])` over 16-channel groups with each value chunk loaded
/// once for all rows (keys in increasing order per element).
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState) {
    let (p, hd, nq, nk) = (b.p, b.p.head_dim, b.nq, b.nk);
    let qs: [&[f32]; QUERY_TILE] = std::array::from_fn(|r| {
        let i = b.i0 + r.min(nq - 1);
        &b.q_src[i * p.q_stride + p.q_offset + b.h * hd..][..hd]
    });
    let mut dots = [[0f32; KEY_TILE]; QUERY_TILE];
    let nc = nk.div_ceil(16);
    for c0 in 0..nc {
        // SAFETY: AVX2 and FMA are enabled here; the caller checked the packed keys' length,
        // every query row holds `hd` elements and `16·c0 + 16 ≤ 16·nc ≤ KEY_TILE`.
        unsafe { scores16_avx2(&qs, keys, hd, c0, &mut dots) };
    }
    let keep = b.key_mask.map(|x| &x[b.j0..b.j0 + nk]);
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let n8 = nk.div_ceil(8);
    let mut row_max = [f32::NEG_INFINITY; 8];
    for r in 0..nq {
        let bias = b
            .bias
            .map(|x| &x[(b.h * p.lq + b.i0 + r) * p.lk + b.j0..][..nk]);
        let mut mx = ninf;
        for c in 0..n8 {
            let j = 8 * c;
            let m = mask8(nk - j);
            // SAFETY: the masked loads cover `j..nk` of the `nk`-long bias and mask slices;
            // `dots[r]` and `st.scores[r]` hold `KEY_TILE ≥ j + 8` f32.
            unsafe {
                let mut x = _mm256_mul_ps(
                    _mm256_set1_ps(p.scale),
                    _mm256_loadu_ps(dots[r].as_ptr().add(j)),
                );
                if let Some(bs) = bias {
                    x = _mm256_add_ps(x, _mm256_maskload_ps(bs.as_ptr().add(j), m));
                }
                if let Some(km) = keep {
                    let drop = _mm256_sub_ps(
                        _mm256_set1_ps(1.0),
                        _mm256_maskload_ps(km.as_ptr().add(j), m),
                    );
                    x = _mm256_add_ps(x, _mm256_mul_ps(drop, _mm256_set1_ps(p.masked_value)));
                }
                _mm256_storeu_ps(st.scores[r].as_mut_ptr().add(j), x);
                // `vmaxps(new, running)` returns `running` for a NaN score, as `f32::max`
                // skips it; lanes past the keys are −∞.
                let xm = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(m));
                mx = _mm256_max_ps(xm, mx);
            }
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        row_max[r] = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h)));
    }
    // Lane r: the row's running maximum, then the new one, the correction `exp(m − m')`.
    let mut old = [f32::NEG_INFINITY; 8];
    old[..QUERY_TILE].copy_from_slice(&st.run_max);
    // SAFETY: both arrays hold 8 f32.
    let (old, tmax) = unsafe {
        (
            _mm256_loadu_ps(old.as_ptr()),
            _mm256_loadu_ps(row_max.as_ptr()),
        )
    };
    let new_max = _mm256_max_ps(tmax, old);
    let corr_v = exp8(_mm256_sub_ps(old, new_max));
    let mut corr = [0f32; 8];
    let mut nmax = [0f32; 8];
    // SAFETY: both arrays hold 8 f32.
    unsafe {
        _mm256_storeu_ps(corr.as_mut_ptr(), corr_v);
        _mm256_storeu_ps(nmax.as_mut_ptr(), new_max);
    }
    for r in 0..nq {
        let nm = _mm256_set1_ps(nmax[r]);
        // `tile_sum`'s 16 lanes: keys `16c .. 16c + 8` into `lo`, `16c + 8 .. 16c + 16` into
        // `hi` (zeros past the keys add nothing: the weights are never −0).
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let weights = |c: usize, st: &mut BlockState| {
            let m = _mm256_castsi256_ps(mask8(nk - 8 * c));
            // SAFETY: `8c + 8 ≤ KEY_TILE`, inside the row's score array.
            unsafe {
                let x = _mm256_loadu_ps(st.scores[r].as_ptr().add(8 * c));
                let w = _mm256_and_ps(m, exp8(_mm256_sub_ps(x, nm)));
                _mm256_storeu_ps(st.scores[r].as_mut_ptr().add(8 * c), w);
                w
            }
        };
        for c in (0..n8).step_by(2) {
            lo = _mm256_add_ps(lo, weights(c, st));
            if c + 1 < n8 {
                hi = _mm256_add_ps(hi, weights(c + 1, st));
            }
        }
        // The halving tree: lanes l + 8, l + 4, l + 2, l + 1 onto l.
        let t = _mm256_add_ps(lo, hi);
        let t = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
        let t = _mm_add_ps(t, _mm_movehl_ps(t, t));
        let t = _mm_add_ss(t, _mm_shuffle_ps::<1>(t, t));
        st.run_sum[r] = st.run_sum[r] * corr[r] + _mm_cvtss_f32(t);
        st.run_max[r] = nmax[r];
    }
    let corr: [f32; QUERY_TILE] = std::array::from_fn(|r| corr[r]);
    // The packed values, `[nk, hd]` (`QueryBlock::check_step`).
    let vp = b.values.as_ptr();
    for d0 in (0..hd).step_by(16) {
        let lanes = (hd - d0).min(16);
        // SAFETY: AVX2 and FMA are enabled here; `vp` holds `nk` value rows of `hd` elements
        // and the accumulators hold `MAX_HEAD_DIM ≥ hd`; the masks stay below `hd` (whole
        // registers, 16 or 8 lanes, need none).
        unsafe {
            match (nq, lanes) {
                (4, 16) => acc_group_avx2::<4, 2, false>(st, &corr, vp, nk, hd, d0, lanes),
                (4, 8) => acc_group_avx2::<4, 1, false>(st, &corr, vp, nk, hd, d0, lanes),
                (4, _) => acc_group_avx2::<4, 2, true>(st, &corr, vp, nk, hd, d0, lanes),
                (3, _) => acc_group_avx2::<3, 2, true>(st, &corr, vp, nk, hd, d0, lanes),
                (2, _) => acc_group_avx2::<2, 2, true>(st, &corr, vp, nk, hd, d0, lanes),
                _ => acc_group_avx2::<1, 2, true>(st, &corr, vp, nk, hd, d0, lanes),
            }
        }
    }
}

/// [`acc_group`] on 8 lanes for channels `d0 .. d0 + lanes` (`lanes ≤ 8·NC`, `NC ≤ 2`
/// registers per row); without `MASKED`, `lanes = 8·NC` and the loads and stores are whole
/// registers (`vmaskmovps` stores are slow on AMD cores).
///
/// # Safety
/// AVX2 and FMA present; `vp` points at `nk` rows of `hd ≥ d0 + lanes` readable f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn acc_group_avx2<const NQ: usize, const NC: usize, const MASKED: bool>(
    st: &mut BlockState,
    corr: &[f32; QUERY_TILE],
    vp: *const f32,
    nk: usize,
    hd: usize,
    d0: usize,
    lanes: usize,
) {
    assert!(NC <= 2 && (MASKED || lanes == 8 * NC) && d0 + lanes <= hd);
    let m: [__m256i; NC] = std::array::from_fn(|c| mask8(lanes.saturating_sub(8 * c)));
    let load = |p: *const f32, c: usize| {
        // SAFETY: the callers' bounds: whole registers lie inside `d0 .. d0 + lanes`, masked
        // ones stop at `lanes`.
        unsafe {
            if MASKED {
                _mm256_maskload_ps(p, m[c])
            } else {
                _mm256_loadu_ps(p)
            }
        }
    };
    let mut a = [[_mm256_setzero_ps(); NC]; NQ];
    for r in 0..NQ {
        for c in 0..NC {
            let x = load(st.acc[r].as_ptr().wrapping_add(d0 + 8 * c), c);
            a[r][c] = _mm256_mul_ps(x, _mm256_set1_ps(corr[r]));
        }
    }
    for jj in 0..nk {
        let v = vp.wrapping_add(jj * hd + d0);
        let vv: [__m256; NC] = std::array::from_fn(|c| load(v.wrapping_add(8 * c), c));
        for r in 0..NQ {
            let w = _mm256_set1_ps(st.scores[r][jj]);
            for c in 0..NC {
                a[r][c] = _mm256_fmadd_ps(w, vv[c], a[r][c]);
            }
        }
    }
    for r in 0..NQ {
        for c in 0..NC {
            let dst = st.acc[r].as_mut_ptr().wrapping_add(d0 + 8 * c);
            // SAFETY: as for the loads (`d0 + lanes ≤ hd ≤ MAX_HEAD_DIM`).
            unsafe {
                if MASKED {
                    _mm256_maskstore_ps(dst, m[c], a[r][c]);
                } else {
                    _mm256_storeu_ps(dst, a[r][c]);
                }
            }
        }
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
