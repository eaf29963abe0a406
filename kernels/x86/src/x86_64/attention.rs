//! The attention step ([`edge_kernels::AttentionOps::block_tile`]) in AVX2 / AVX-512 lanes:
//! `q·k` with the packed keys of the tile in lanes (one `vfmadd` per head channel, in order),
//! the polynomial `exp` of [`edge_kernels::expf`] on 8 / 16 lanes, and `acc ·= c`,
//! `acc = fma(w, v, acc)` with head channels in lanes; the scalar parts (tile maximum, running
//! sum) are the generic ones. Each lane does the generic scalar operation, so the attention
//! output is bit-identical. The bf16-products step ([`AVX512_BF16`], the twin of
//! [`edge_kernels::attention_bf16`]) shares the softmax and replaces both products with
//! `vdpbf16ps` on pairs rounded by `vcvtne2ps2bf16`.

use std::arch::x86_64::*;

use edge_kernels::{AttentionOps, BlockState, QueryBlock, KEY_TILE, QUERY_TILE};

use super::vmath::{exp16_nonpositive, exp8_nonpositive, mask, transpose16, transpose8};

/// AVX2 step: the block's rows together, as [`AVX512`] does, in 8-lane registers (16 keys ×
/// 4 rows of scores, 16 head channels × 4 rows of accumulators at a time).
pub(crate) const AVX2: AttentionOps = AttentionOps {
    name: "avx2_attention_f32_4q",
    block_tile: block_tile_avx2,
    block_tile_small: block_tile_avx2,
    pack_keys: pack_keys_avx2,
    pack_values: edge_kernels::pack_values,
    phases_small: Some((scores_phase_avx2, values_phase_avx2)),
};

/// AVX512_BF16 step of [`edge_kernels::attention_bf16`]: [`AVX512`]'s structure with
/// `vdpbf16ps` for both products (keys packed as channel pairs, values as key pairs).
pub(crate) const AVX512_BF16: AttentionOps = AttentionOps {
    name: "avx512bf16_attention_pairs_4q",
    block_tile: block_tile_bf16,
    block_tile_small: block_tile_bf16,
    pack_keys: pack_key_pairs_avx512,
    pack_values: pack_value_pairs_avx512,
    phases_small: None,
};

/// AVX-512 step: the block's rows together, so each key and value row is loaded once per block;
/// keys packed with 16 × 16 in-register transposes.
pub(crate) const AVX512: AttentionOps = AttentionOps {
    name: "avx512_attention_f32_4q",
    block_tile: block_tile_avx512,
    block_tile_small: block_tile_avx512,
    pack_keys: pack_keys_avx512,
    pack_values: pack_values_avx512,
    phases_small: None,
};

/// Row stride of [`pack_values_avx512`]'s values: `head_dim` rounded up to 16 lanes, so that
/// every value row starts on a cache line and each 16-channel load reads one line (on Intel
/// cores a zmm load across two lines costs two cache accesses: `kbench 2 attention` on a
/// Xeon with AMX, self 168–170 → 173–174 GFLOP/s, cross 153–157 → 163–165).
fn value_stride(head_dim: usize) -> usize {
    head_dim.next_multiple_of(16)
}

/// Hints into L2 (`prefetcht1`) the rows of the key tile after `j0 .. j0 + nk` of head `h`
/// (the next head's first tile after a head's last), at `offset` in each `kv_stride` row:
/// `offset = k_offset` for the keys, `v_offset` for the values. A task packs each tile once and
/// then runs every one of its query blocks against it (hundreds of thousands of cycles), so the
/// rows of the next tile, a whole token apart in the projection's output (the last-level
/// cache or memory), arrive before they are packed instead of while the pack waits on them.
/// Rows past `kv_src` are skipped.
fn prefetch_next_tile(
    p: &edge_kernels::AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    offset: usize,
) {
    let (h, j) = if j0 + nk < p.lk {
        (h, j0 + nk)
    } else if h + 1 < p.heads {
        (h + 1, 0)
    } else {
        return;
    };
    let hd = p.head_dim;
    for jj in j..(j + KEY_TILE).min(p.lk) {
        let start = jj * p.kv_stride + offset + h * hd;
        let Some(row) = kv_src.get(start..start + hd) else {
            return;
        };
        for line in row.chunks(16).chain(std::iter::once(&row[hd - 1..])) {
            // SAFETY: `prefetcht1` (SSE, part of x86-64) only hints the cache: it never faults,
            // and the address lies inside the row.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8) };
        }
    }
}

/// [`edge_kernels::pack_values`] with rows [`value_stride`] apart (`[nk, value_stride]`, the
/// padding zero: [`acc_group`] reads it as the upper lanes of a row's last register, whose
/// products land in accumulator lanes that are never stored): data movement only.
fn pack_values_avx512(
    p: &edge_kernels::AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let (hd, vs) = (p.head_dim, value_stride(p.head_dim));
    for (c, row) in dst[..nk * vs].chunks_exact_mut(vs).enumerate() {
        let (vals, pad) = row.split_at_mut(hd);
        vals.copy_from_slice(p.value_row(kv_src, h, j0 + c));
        pad.fill(0.0);
    }
    prefetch_next_tile(p, kv_src, h, j0, nk, p.v_offset);
}

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
    prefetch_next_tile(p, kv_src, h, j0, nk, p.k_offset);
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

fn block_tile_avx2<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    scores_phase_avx2(b, keys, st);
    values_phase_avx2(b, st);
}

/// The scores phase of the AVX2 step ([`AttentionOps::phases_small`]): the block's scores and
/// online softmax, the weights left in `st.scores` and the corrections in `st.corr`.
fn scores_phase_avx2<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    b.check_step(keys, st);
    // SAFETY: AVX2 and FMA were detected before this step was put in a table
    // (`crate::x86_64::avx2_table`); the packed keys hold `hd · KEY_TILE` f32 (checked by
    // `QueryBlock::check_step`), query, bias and mask rows are bounds-checked slices, and the
    // state arrays are sized by constants.
    unsafe { scores_avx2(b, keys, st) }
}

/// The value phase of the AVX2 step: `acc ·= corr`, then the weighted values added.
fn values_phase_avx2<const D: usize>(b: &QueryBlock<'_>, st: &mut BlockState<D>) {
    b.check_values(st);
    // SAFETY: AVX2 and FMA were detected before this step was put in a table; the packed
    // values hold the tile's `nk · hd` f32 (checked by `QueryBlock::check_values`) and the
    // state arrays are sized by constants (`hd ≤ D`, checked).
    unsafe { values_avx2(b, st) }
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

/// [`block_tile_avx2`]'s first phase: the steps of [`block_avx512`] in the same order on 8
/// lanes — scores of 4 rows × 16 keys at a time, then the online softmax ([`softmax_avx2`]),
/// whose corrections are kept in `st.corr` for [`values_avx2`].
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    let (hd, nk) = (b.p.head_dim, b.nk);
    let qs = b.queries();
    let mut dots = [[0f32; KEY_TILE]; QUERY_TILE];
    let nc = nk.div_ceil(16);
    for c0 in 0..nc {
        // SAFETY: AVX2 and FMA are enabled here; the caller checked the packed keys' length,
        // every query row holds `hd` elements and `16·c0 + 16 ≤ 16·nc ≤ KEY_TILE`.
        unsafe { scores16_avx2(&qs, keys, hd, c0, &mut dots) };
    }
    // SAFETY: AVX2 and FMA are enabled here.
    st.corr = unsafe { softmax_avx2(b, &dots, st) };
}

/// [`block_tile_avx2`]'s second phase: `acc[r] = fma(w[r][j], v[j], acc[r])` after
/// `acc[r] ·= corr[r]`, over 16-channel groups with each value chunk loaded once for all rows
/// (keys in increasing order per element).
#[target_feature(enable = "avx2,fma")]
unsafe fn values_avx2<const D: usize>(b: &QueryBlock<'_>, st: &mut BlockState<D>) {
    let (hd, nq, nk) = (b.p.head_dim, b.nq, b.nk);
    let corr = st.corr;
    // The packed values, `[nk, hd]` (`QueryBlock::check_values`).
    let vp = b.values.as_ptr();
    for d0 in (0..hd).step_by(16) {
        let lanes = (hd - d0).min(16);
        // SAFETY: AVX2 and FMA are enabled here; `vp` holds `nk` value rows of `hd` elements
        // (`QueryBlock::check_values`) and the accumulators hold `D ≥ hd`; the masks stay below
        // `hd` (whole registers, 16 or 8 lanes, need none).
        unsafe {
            match (nq, lanes) {
                (4, 16) => acc_group_avx2::<4, 2, false, D>(st, &corr, vp, nk, hd, d0, lanes),
                (4, 8) => acc_group_avx2::<4, 1, false, D>(st, &corr, vp, nk, hd, d0, lanes),
                (4, _) => acc_group_avx2::<4, 2, true, D>(st, &corr, vp, nk, hd, d0, lanes),
                (3, _) => acc_group_avx2::<3, 2, true, D>(st, &corr, vp, nk, hd, d0, lanes),
                (2, _) => acc_group_avx2::<2, 2, true, D>(st, &corr, vp, nk, hd, d0, lanes),
                _ => acc_group_avx2::<1, 2, true, D>(st, &corr, vp, nk, hd, d0, lanes),
            }
        }
    }
}

/// The online softmax of the block's rows from their dot products `dots` on 8 lanes: the
/// steps of [`softmax_avx512`] in the same order (the score terms `scale·dot`, `+ bias[j]`,
/// `+ (1 − mask[j])·masked_value`; the tile maximum with lanes past the keys at −∞ and NaN
/// scores skipped by `vmaxps(new, running)`; the weights `exp(s − m')`, zero past the keys;
/// their `tile_sum` as 16 lanes held in two registers, keys `16c .. 16c + 8` in `lo` and
/// `16c + 8 .. 16c + 16` in `hi`, then the halving tree), writing the weights to `st.scores`,
/// updating the running maximum and sum and returning each row's correction `exp(m − m')`.
///
/// Each step runs for the 4 rows of the block before the next chunk (rows past `nq` repeat the
/// last row and are dropped), so the rows' dependency chains overlap; chunks wholly inside the
/// tile's keys take whole loads and no mask; the weights' `exp` is [`exp8_nonpositive`]
/// (`s − m' ≤ 0` on the keys' lanes). Row by row with masks on every chunk and the full
/// [`exp8`], the softmax took about a third of the attention's time (BENCHMARKS.md, "AVX2
/// softmax"). The same operations on every lane that reaches the output: the same bits.
///
/// # Safety
/// AVX2 and FMA present.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2<const D: usize>(
    b: &QueryBlock<'_>,
    dots: &[[f32; KEY_TILE]; QUERY_TILE],
    st: &mut BlockState<D>,
) -> [f32; QUERY_TILE] {
    let (p, nq, nk) = (b.p, b.nq, b.nk);
    let n8 = nk.div_ceil(8);
    let keep = b.key_mask.map(|x| &x[b.j0..b.j0 + nk]);
    let bias: [Option<&[f32]>; QUERY_TILE] = std::array::from_fn(|r| {
        b.bias
            .map(|x| &x[(b.h * p.lq + b.i0 + r.min(nq - 1)) * p.lk + b.j0..][..nk])
    });
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let scale = _mm256_set1_ps(p.scale);
    let mut mx = [ninf; QUERY_TILE];
    for c in 0..n8 {
        let j = 8 * c;
        let whole = j + 8 <= nk;
        let m = mask8(nk - j);
        // Chunk `c` of one of the `nk`-long bias and mask slices.
        let load = |src: &[f32]| {
            assert!(src.len() >= nk);
            // SAFETY: whole registers (`j + 8 ≤ nk`) lie inside `src`, masked ones stop at
            // `nk ≤ src.len()`.
            unsafe {
                if whole {
                    _mm256_loadu_ps(src.as_ptr().add(j))
                } else {
                    _mm256_maskload_ps(src.as_ptr().add(j), m)
                }
            }
        };
        // `(1 − mask[j])·masked_value`, the same for every row.
        let dropped = keep.map(|km| {
            _mm256_mul_ps(
                _mm256_sub_ps(_mm256_set1_ps(1.0), load(km)),
                _mm256_set1_ps(p.masked_value),
            )
        });
        for r in 0..QUERY_TILE {
            // SAFETY: `dots[r]` and `st.scores[r]` hold `KEY_TILE ≥ j + 8` f32.
            unsafe {
                let mut x = _mm256_mul_ps(scale, _mm256_loadu_ps(dots[r].as_ptr().add(j)));
                if let Some(bs) = bias[r] {
                    x = _mm256_add_ps(x, load(bs));
                }
                if let Some(dm) = dropped {
                    x = _mm256_add_ps(x, dm);
                }
                _mm256_storeu_ps(st.scores[r].as_mut_ptr().add(j), x);
                let xm = if whole {
                    x
                } else {
                    _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(m))
                };
                mx[r] = _mm256_max_ps(xm, mx[r]);
            }
        }
    }
    let mut row_max = [f32::NEG_INFINITY; 8];
    for (r, v) in mx.iter().enumerate() {
        let h = _mm_max_ps(_mm256_castps256_ps128(*v), _mm256_extractf128_ps::<1>(*v));
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
    // `old ≤ new_max` per lane (or NaN lanes): `exp8_nonpositive`'s contract.
    let corr_v = exp8_nonpositive(_mm256_sub_ps(old, new_max));
    let mut corr = [0f32; 8];
    let mut nmax = [0f32; 8];
    // SAFETY: both arrays hold 8 f32.
    unsafe {
        _mm256_storeu_ps(corr.as_mut_ptr(), corr_v);
        _mm256_storeu_ps(nmax.as_mut_ptr(), new_max);
    }
    let mut lo = [_mm256_setzero_ps(); QUERY_TILE];
    let mut hi = [_mm256_setzero_ps(); QUERY_TILE];
    for c in 0..n8 {
        let whole = 8 * c + 8 <= nk;
        let m = _mm256_castsi256_ps(mask8(nk - 8 * c));
        for r in 0..QUERY_TILE {
            // SAFETY: `8c + 8 ≤ KEY_TILE`, inside the row's score array.
            unsafe {
                let x = _mm256_loadu_ps(st.scores[r].as_ptr().add(8 * c));
                // Lanes of the tile's keys are at most the new maximum (or NaN); the others,
                // which may exceed it, are zeroed whatever they give.
                let e = exp8_nonpositive(_mm256_sub_ps(x, _mm256_set1_ps(nmax[r])));
                let w = if whole { e } else { _mm256_and_ps(m, e) };
                _mm256_storeu_ps(st.scores[r].as_mut_ptr().add(8 * c), w);
                if c % 2 == 0 {
                    lo[r] = _mm256_add_ps(lo[r], w);
                } else {
                    hi[r] = _mm256_add_ps(hi[r], w);
                }
            }
        }
    }
    for r in 0..nq {
        // The halving tree: lanes l + 8, l + 4, l + 2, l + 1 onto l.
        let t = _mm256_add_ps(lo[r], hi[r]);
        let t = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
        let t = _mm_add_ps(t, _mm_movehl_ps(t, t));
        let t = _mm_add_ss(t, _mm_shuffle_ps::<1>(t, t));
        st.run_sum[r] = st.run_sum[r] * corr[r] + _mm_cvtss_f32(t);
        st.run_max[r] = nmax[r];
    }
    std::array::from_fn(|r| corr[r])
}

/// [`acc_group`] on 8 lanes for channels `d0 .. d0 + lanes` (`lanes ≤ 8·NC`, `NC ≤ 2`
/// registers per row); without `MASKED`, `lanes = 8·NC` and the loads and stores are whole
/// registers (`vmaskmovps` stores are slow on AMD cores).
///
/// # Safety
/// AVX2 and FMA present; `vp` points at `nk` rows of `hd ≥ d0 + lanes` readable f32, and
/// `hd ≤ D`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn acc_group_avx2<const NQ: usize, const NC: usize, const MASKED: bool, const D: usize>(
    st: &mut BlockState<D>,
    corr: &[f32; QUERY_TILE],
    vp: *const f32,
    nk: usize,
    hd: usize,
    d0: usize,
    lanes: usize,
) {
    assert!(NC <= 2 && (MASKED || lanes == 8 * NC) && d0 + lanes <= hd.min(D));
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
            // SAFETY: as for the loads (`d0 + lanes ≤ hd ≤ D`).
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

fn block_tile_avx512<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    b.check_step(keys, st);
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
unsafe fn block_avx512<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    let (hd, nq, nk) = (b.p.head_dim, b.nq, b.nk);
    let qs = b.queries();
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
    // SAFETY: AVX-512F is enabled here.
    let corr = unsafe { softmax_avx512(b, &dots, st) };
    // The packed values, `[nk, value_stride(hd)]` ([`pack_values_avx512`]).
    let vs = value_stride(hd);
    assert!(b.values.len() >= nk * vs);
    let vp = b.values.as_ptr();
    // Groups of up to 5 × 16 head channels: the group's accumulators of every row stay in
    // registers while the keys pass in order.
    for d0 in (0..hd).step_by(GROUP_LANES) {
        let lanes = (hd - d0).min(GROUP_LANES);
        // SAFETY: AVX-512F is enabled here; `vp` holds `nk` value rows of `vs` elements, `hd`
        // and zero padding (asserted; `pack_values_avx512`), and the accumulators hold
        // `MAX_HEAD_DIM ≥ hd`; the masks stay below `hd`; the `EXACT` arms pass `NC =
        // ⌈lanes/16⌉` (the value matched), so `d0 + 16·NC ≤ vs` (`d0` a multiple of 16).
        unsafe {
            match (nq, lanes.div_ceil(16)) {
                (4, 5) => acc_group::<4, 5, D, true>(st, &corr, vp, nk, vs, d0, lanes),
                (4, 4) => acc_group::<4, 4, D, true>(st, &corr, vp, nk, vs, d0, lanes),
                (4, 3) => acc_group::<4, 3, D, true>(st, &corr, vp, nk, vs, d0, lanes),
                (4, 2) => acc_group::<4, 2, D, true>(st, &corr, vp, nk, vs, d0, lanes),
                (4, _) => acc_group::<4, 1, D, true>(st, &corr, vp, nk, vs, d0, lanes),
                (3, _) => acc_group::<3, 5, D, false>(st, &corr, vp, nk, vs, d0, lanes),
                (2, _) => acc_group::<2, 5, D, false>(st, &corr, vp, nk, vs, d0, lanes),
                _ => acc_group::<1, 5, D, false>(st, &corr, vp, nk, vs, d0, lanes),
            }
        }
    }
}

/// The online softmax of the block's rows from their dot products `dots` (both arithmetics):
/// writes the weights to `st.scores` (zero past the tile's keys, up to the next multiple of
/// 16), updates the running maximum and sum, and returns each row's correction `exp(m − m')`.
///
/// # Safety
/// AVX-512F present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_avx512<const D: usize>(
    b: &QueryBlock<'_>,
    dots: &[[f32; KEY_TILE]; QUERY_TILE],
    st: &mut BlockState<D>,
) -> [f32; QUERY_TILE] {
    let (p, nq, nk) = (b.p, b.nq, b.nk);
    // Each row's dot products are read (by the first loop) before its weights are written.
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
    // `old ≤ new_max` per lane (or NaN lanes past the rows): `exp16_nonpositive`'s contract.
    let corr_v = exp16_nonpositive(_mm512_sub_ps(old, new_max));
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
            // Lanes of the tile's keys are at most the new maximum (or NaN); the others, which
            // may exceed it, are zeroed whatever they give.
            let w = _mm512_maskz_mov_ps(m, exp16_nonpositive(_mm512_sub_ps(*vc, nm)));
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
    std::array::from_fn(|r| corr[r])
}

/// Head channels per register group of the value pass.
const GROUP_LANES: usize = 80;

/// `acc[r][d0 + d] ·= corr[r]`, then `acc[r][d0 + d] = fma(w[r][j], v[j][d0 + d],
/// acc[r][d0 + d])` for the first `NQ` rows, `d < lanes ≤ 16·NC`, keys `j` in order (the generic
/// per-element sequence; the generic step skips the product when `corr[r] = 1`, which changes
/// no bit).
///
/// The value rows are read with whole-register loads: with `EXACT` (`NC = ⌈lanes/16⌉`, the rows
/// padded with zeros to `d0 + 16·NC` channels, as [`pack_values_avx512`] writes them) all of
/// them, the last register's lanes past `lanes` adding `w · 0` to accumulator lanes that are
/// never stored; without it, wherever a register's 16 channels all lie below `lanes`, masked
/// loads for the rest. A masked load costs a vector-port operation besides its load on Intel
/// cores, one per key and register beside 4 `vfmadd` (`kbench 2 attention` on the Xeon with
/// AMX: masking only the last register, self 192–193 → 202 GFLOP/s, cross 183–185 → 192; none,
/// BENCHMARKS.md). The stored lanes see the same operations, so the bits are the same. (A
/// release `assert!` of `EXACT`'s condition per call measured 1.5 % slower: it is the caller's
/// contract, checked in debug builds.)
///
/// # Safety
/// AVX-512F must be present; `vp` must point at `nk` value rows `vs` f32 apart, each with at
/// least `d0 + lanes` readable f32; with `EXACT`, `NC = ⌈lanes/16⌉` and each row has
/// `d0 + 16·NC` readable f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn acc_group<const NQ: usize, const NC: usize, const D: usize, const EXACT: bool>(
    st: &mut BlockState<D>,
    corr: &[f32; QUERY_TILE],
    vp: *const f32,
    nk: usize,
    vs: usize,
    d0: usize,
    lanes: usize,
) {
    debug_assert!(!EXACT || lanes.div_ceil(16) == NC);
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
        let v = vp.wrapping_add(jj * vs);
        let mut w = [_mm512_setzero_ps(); NQ];
        for r in 0..NQ {
            w[r] = _mm512_set1_ps(st.scores[r][jj]);
        }
        for c in 0..NC {
            // SAFETY: channels `d0 + 16c ..` of value row `jj`: a whole register with `EXACT`
            // (the caller's padded rows) or where all 16 lie below `d0 + lanes`, else masked to
            // them.
            let vv = unsafe {
                if EXACT || m[c] == 0xFFFF {
                    _mm512_loadu_ps(v.add(d0 + 16 * c))
                } else {
                    _mm512_maskz_loadu_ps(m[c], v.add(d0 + 16 * c))
                }
            };
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

/// [`edge_kernels::attention_bf16::pack_key_pairs`]'s layout and zero lanes: the keys packed
/// as f32 ([`pack_keys_avx512`]'s transposes, in `dst`), then rows `2s` and `2s + 1` rounded and
/// joined into row `s` in place. Uses `head_dim · KEY_TILE` slots of `dst`.
fn pack_key_pairs_avx512(
    p: &edge_kernels::AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    check_pack_keys(p, kv_src.len(), h, j0, nk, dst.len());
    // SAFETY: AVX-512F/BW and AVX512_BF16 were detected before this table was built;
    // `check_pack_keys` bounds the key rows read and `dst` holds `hd · KEY_TILE` slots, the
    // most either writes.
    unsafe {
        pack_keys_impl(p, kv_src, h, j0, nk, dst);
        join_pairs(dst, p.head_dim);
    }
    prefetch_next_tile(p, kv_src, h, j0, nk, p.k_offset);
}

/// Row `s < ⌈hd/2⌉` of `rows` (`[hd, KEY_TILE]` f32) becomes [`edge_kernels::attention_bf16::pair`]
/// of rows `2s` and `2s + 1` (zero past `hd`), lane by lane. In place: row `s` is written after
/// rows `2s` and `2s + 1 ≥ s` were read, and every row below them was read before.
///
/// # Safety
/// AVX-512F, BW and AVX512_BF16 present; `rows` holds at least `hd · KEY_TILE` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn join_pairs(rows: &mut [f32], hd: usize) {
    assert!(rows.len() >= hd * KEY_TILE);
    let base = rows.as_mut_ptr();
    for s in 0..hd.div_ceil(2) {
        for c0 in (0..KEY_TILE).step_by(16) {
            // SAFETY: rows `2s` and `2s + 1 < hd` and row `s` lie inside `hd · KEY_TILE`.
            unsafe {
                let lo = _mm512_loadu_ps(base.add(2 * s * KEY_TILE + c0));
                let hi = if 2 * s + 1 < hd {
                    _mm512_loadu_ps(base.add((2 * s + 1) * KEY_TILE + c0))
                } else {
                    _mm512_setzero_ps()
                };
                _mm512_storeu_si512(base.add(s * KEY_TILE + c0) as *mut __m512i, pairs16(lo, hi));
            }
        }
    }
}

/// [`edge_kernels::attention_bf16::pack_value_pairs`] 16 channels at a time.
fn pack_value_pairs_avx512(
    p: &edge_kernels::AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let hd = p.head_dim;
    assert!((1..=KEY_TILE).contains(&nk) && dst.len() >= nk.div_ceil(2) * hd);
    let row = |c: usize| p.value_row(kv_src, h, j0 + c);
    for t in 0..nk.div_ceil(2) {
        let lo = row(2 * t);
        let hi = (2 * t + 1 < nk).then(|| row(2 * t + 1));
        let out = &mut dst[t * hd..(t + 1) * hd];
        // SAFETY: AVX-512F/BW and AVX512_BF16 were detected before this table was built; `lo`,
        // `hi` and `out` are `hd`-long slices and every access is masked to their `hd` elements.
        unsafe { join_value_rows(lo, hi, out) };
    }
    prefetch_next_tile(p, kv_src, h, j0, nk, p.v_offset);
}

/// `out[d] = pair(lo[d], hi[d])` (`hi` 0 when absent) as f32 bits.
///
/// # Safety
/// AVX-512F, BW and AVX512_BF16 present; `lo`, `out` (and `hi`) have the same length.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn join_value_rows(lo: &[f32], hi: Option<&[f32]>, out: &mut [f32]) {
    let n = out.len();
    assert!(lo.len() == n && hi.is_none_or(|h| h.len() == n));
    for d0 in (0..n).step_by(16) {
        let m = mask((n - d0).min(16));
        // SAFETY: masked to the slices' `n` elements.
        unsafe {
            let l = _mm512_maskz_loadu_ps(m, lo.as_ptr().add(d0));
            let h = hi.map_or(_mm512_setzero_ps(), |h| {
                _mm512_maskz_loadu_ps(m, h.as_ptr().add(d0))
            });
            _mm512_mask_storeu_epi32(out.as_mut_ptr().add(d0) as *mut i32, m, pairs16(l, h));
        }
    }
}

/// Pairs per row of its weight buffer (`KEY_TILE / 2`).
const W_ROW: usize = KEY_TILE / 2;

/// `f32` values `src` rounded to bf16 pairs at `dst` (`⌈len/2⌉` pairs, the high half of an odd
/// last pair 0, nothing else written): consecutive values are pairs, so one `vcvtne2ps2bf16`
/// rounds 32 of them in order.
///
/// # Safety
/// AVX-512F and AVX512_BF16 present; `dst` is valid for writes of `cap ≥ ⌈src.len()/2⌉` u32.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_pairs(src: &[f32], dst: *mut u32, cap: usize) {
    let n = src.len();
    assert!(cap >= n.div_ceil(2));
    for c in (0..n).step_by(32) {
        let len = (n - c).min(32);
        let (m0, m1) = (mask(len.min(16)), mask(len.saturating_sub(16)));
        // SAFETY: the loads are masked to `src`'s elements (zeros past them); the store writes
        // pairs `c/2 .. c/2 + ⌈len/2⌉ ≤ ⌈n/2⌉ ≤ cap` at `dst`.
        unsafe {
            let lo = _mm512_maskz_loadu_ps(m0, src.as_ptr().add(c));
            let hi = _mm512_maskz_loadu_ps(m1, src.as_ptr().add(c + 16));
            let v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_mask_storeu_epi32(dst.add(c / 2) as *mut i32, mask(len.div_ceil(2)), v);
        }
    }
}

/// A row of the tile's weights `w` (zero from the tile's `nk` keys up to the next multiple of
/// 16, as the softmax writes them) rounded to its first `np = ⌈nk/2⌉` pairs at `dst`, 32
/// weights at a time with whole-register loads and stores: pairs from `np` up to the next
/// multiple of 16 are written too, from lanes the value pass never reads. The softmax has just
/// stored `w` with whole registers, so these loads take the stores' data (a masked load, as
/// [`round_pairs`] issues, waited for the stores to retire: `perf annotate` put about a tenth of
/// the step's samples on it; the step ran 1.04× as fast with this, in-process A/B).
///
/// # Safety
/// AVX-512F and AVX512_BF16 present; `np ≤ W_ROW`; `dst` is valid for writes of `W_ROW` u32.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_weight_pairs(w: &[f32; KEY_TILE], np: usize, dst: *mut u32) {
    debug_assert!(np <= W_ROW);
    for c in (0..2 * np).step_by(32) {
        // SAFETY: `c + 32 ≤ KEY_TILE` (`c < 2·np ≤ KEY_TILE`, a multiple of 32), inside `w`;
        // pairs `c/2 .. c/2 + 16 ≤ W_ROW` at `dst`.
        unsafe {
            let lo = _mm512_loadu_ps(w.as_ptr().add(c));
            let hi = _mm512_loadu_ps(w.as_ptr().add(c + 16));
            let v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(dst.add(c / 2) as *mut __m512i, v);
        }
    }
}

/// Lane `d` of the result: `lo[d]` and `hi[d]` rounded by
/// [`edge_kernels::attention_bf16::round_bf16_daz`], `lo` in the low 16 bits
/// ([`edge_kernels::attention_bf16::pair`]): one `vcvtne2ps2bf16` and one `vpermw`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn pairs16(lo: __m512, hi: __m512) -> __m512i {
    // Words 0..16 hold `lo`'s, 16..32 `hi`'s; word 2d of the result takes word d, 2d + 1 word
    // 16 + d.
    const IDX: [u16; 32] = {
        let mut a = [0u16; 32];
        let mut d = 0;
        while d < 16 {
            a[2 * d] = d as u16;
            a[2 * d + 1] = 16 + d as u16;
            d += 1;
        }
        a
    };
    // SAFETY: `IDX` is 64 bytes; both vector types are 64 bytes of plain lanes.
    unsafe {
        let idx = _mm512_loadu_si512(IDX.as_ptr() as *const __m512i);
        let w = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_permutexvar_epi16(idx, w)
    }
}

fn block_tile_bf16<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    b.check_step(keys, st);
    // SAFETY: AVX-512F/BW and AVX512_BF16 were detected before this step was put in a table
    // (`crate::x86_64::avx512_bf16_table`); the packed keys hold `hd · KEY_TILE` slots (of which
    // `⌈hd/2⌉ · KEY_TILE` are pairs) and the packed values `⌈nk/2⌉ · hd` pairs (within the
    // `nk · hd` that `check_step` asserts); query rows are bounds-checked slices.
    unsafe { block_bf16(b, keys, st) }
}

/// [`block_avx512`] with the products of [`edge_kernels::attention_bf16`]: the query rows
/// rounded to pairs, `vdpbf16ps` for `q·k` (keys in lanes, one per channel pair in order), the
/// shared softmax, the weights rounded to pairs and `vdpbf16ps` for the values (channels in
/// lanes, one per key pair in order), after `acc ·= c` and the flush of subnormals.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn block_bf16<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    let (hd, nq, nk) = (b.p.head_dim, b.nq, b.nk);
    let hp = hd.div_ceil(2);
    // The query rows' pairs, `D/2` apart in the state, rounded at the head's first key tile and
    // kept to its last: rounded at every tile, their masked loads from the projection's output
    // and the masked stores that the score loop's broadcasts then waited on took about a tenth
    // of this step's samples (`perf annotate`); kept, the self- and cross-attention of a 512²
    // PixArt block ran 1.14× as fast (in-process A/B, BENCHMARKS.md). Only the first `hp` of
    // each row are written (and read).
    let q_row = D / 2;
    let qp = st.query_pairs.as_flattened_mut().as_mut_ptr();
    if !st.queries_ready {
        for (r, q) in b.queries().into_iter().enumerate() {
            // SAFETY: AVX512_BF16 is enabled here; row `r` of the state's pairs has room for
            // `D/2 ≥ ⌈hd/2⌉` pairs (`hd ≤ D`, checked by `check_step`), `QUERY_TILE · D/2` in all.
            unsafe { round_pairs(q, qp.add(r * q_row), q_row) };
        }
        st.queries_ready = true;
    }
    let qp = qp as *const u32;
    let mut dots = [[0f32; KEY_TILE]; QUERY_TILE];
    // SAFETY: AVX512_BF16 is enabled here; the packed keys hold `hp · KEY_TILE` pairs and each
    // query row its first `hp` pairs (written above).
    unsafe {
        match nk.div_ceil(16) {
            1 => scores_bf16::<1>(qp, q_row, keys, hp, &mut dots),
            2 => scores_bf16::<2>(qp, q_row, keys, hp, &mut dots),
            3 => scores_bf16::<3>(qp, q_row, keys, hp, &mut dots),
            _ => scores_bf16::<4>(qp, q_row, keys, hp, &mut dots),
        }
    }
    // SAFETY: AVX-512F is enabled here.
    let corr = unsafe { softmax_avx512(b, &dots, st) };
    let np = nk.div_ceil(2);
    // The weights' pairs, `W_ROW` apart: rows `r < nq`, pairs `t < np` written and read (and
    // up to the next multiple of 16 written).
    let mut wbuf = std::mem::MaybeUninit::<[u32; QUERY_TILE * W_ROW]>::uninit();
    let wp = wbuf.as_mut_ptr() as *mut u32;
    for r in 0..nq {
        // SAFETY: AVX512_BF16 is enabled here; `st.scores[r]` is zero from `nk` up to the next
        // multiple of 16 (the softmax wrote it), so an odd tile's last pair takes a zero weight;
        // row `r` of the buffer holds `W_ROW = KEY_TILE / 2 ≥ np` pairs.
        unsafe { round_weight_pairs(&st.scores[r], np, wp.add(r * W_ROW)) };
    }
    let wp = wp as *const u32;
    let vp = b.values.as_ptr() as *const i32;
    for d0 in (0..hd).step_by(GROUP_LANES) {
        let lanes = (hd - d0).min(GROUP_LANES);
        // SAFETY: AVX512_BF16 is enabled here; `vp` holds `np` rows of `hd` pairs and the
        // accumulators `MAX_HEAD_DIM ≥ hd`; the masks stay below `hd`; the `EXACT` arms pass
        // `NC = ⌈lanes/16⌉` (the value matched).
        unsafe {
            match (nq, lanes.div_ceil(16)) {
                (4, 5) => acc_group_bf16::<4, 5, D, true>(st, &corr, wp, vp, np, hd, d0, lanes),
                (4, 4) => acc_group_bf16::<4, 4, D, true>(st, &corr, wp, vp, np, hd, d0, lanes),
                (4, 3) => acc_group_bf16::<4, 3, D, true>(st, &corr, wp, vp, np, hd, d0, lanes),
                (4, 2) => acc_group_bf16::<4, 2, D, true>(st, &corr, wp, vp, np, hd, d0, lanes),
                (4, _) => acc_group_bf16::<4, 1, D, true>(st, &corr, wp, vp, np, hd, d0, lanes),
                (3, _) => acc_group_bf16::<3, 5, D, false>(st, &corr, wp, vp, np, hd, d0, lanes),
                (2, _) => acc_group_bf16::<2, 5, D, false>(st, &corr, wp, vp, np, hd, d0, lanes),
                _ => acc_group_bf16::<1, 5, D, false>(st, &corr, wp, vp, np, hd, d0, lanes),
            }
        }
    }
}

/// The 64 bytes at `p` as a `vdpbf16ps` operand.
///
/// # Safety
/// AVX-512F present; 64 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_pairs(p: *const i32) -> __m512bh {
    // SAFETY: the caller's bound; both types are 64 bytes of plain lanes.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const __m512i)) }
}

/// One pair broadcast to 16 lanes as a `vdpbf16ps` operand.
#[inline]
#[target_feature(enable = "avx512f")]
fn bcast_pair(x: u32) -> __m512bh {
    // SAFETY: both types are 64 bytes of plain lanes.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(x as i32)) }
}

/// `dots[r][c] = pair steps over s < hp` of the 4 query rows' pairs with the packed key pairs
/// of the `16·NC` keys (lanes past the tile's keys read zero pairs).
///
/// # Safety
/// AVX-512F and AVX512_BF16 present; `keys` holds `hp · KEY_TILE` pairs; `qp` holds 4 rows
/// `q_row` apart whose first `hp` pairs are initialized.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn scores_bf16<const NC: usize>(
    qp: *const u32,
    q_row: usize,
    keys: &[f32],
    hp: usize,
    dots: &mut [[f32; KEY_TILE]; QUERY_TILE],
) {
    assert!(keys.len() >= hp * KEY_TILE && hp <= q_row);
    let kp = keys.as_ptr() as *const i32;
    let mut a = [[_mm512_setzero_ps(); NC]; QUERY_TILE];
    for s in 0..hp {
        // SAFETY: `s < hp` and `16·NC ≤ KEY_TILE`, inside the packed keys.
        let kv: [__m512bh; NC] =
            std::array::from_fn(|c| unsafe { load_pairs(kp.add(s * KEY_TILE + 16 * c)) });
        for r in 0..QUERY_TILE {
            // SAFETY: pair `s < hp` of query row `r` (the caller's bound).
            let qb = bcast_pair(unsafe { *qp.add(r * q_row + s) });
            for c in 0..NC {
                a[r][c] = _mm512_dpbf16_ps(a[r][c], qb, kv[c]);
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

/// `acc[r][d0 + d] = flush(acc · corr[r])`, then for key pairs `t < np` in order
/// `acc[r][d0 + d] = pair_step(acc, wp[r][t], v[t][d0 + d])` for the first `NQ` rows and
/// `d < lanes ≤ 16·NC`. Value rows are loaded as [`acc_group`]'s: whole registers where all
/// their lanes are inside, masked loads for the rest.
///
/// # Safety
/// AVX-512F and AVX512_BF16 present; `vp` points at `np` rows of `hd ≥ d0 + lanes` pairs;
/// `wp` at `NQ` rows `W_ROW` apart whose first `np` pairs are initialized; with `EXACT`,
/// `NC = ⌈lanes/16⌉`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn acc_group_bf16<const NQ: usize, const NC: usize, const D: usize, const EXACT: bool>(
    st: &mut BlockState<D>,
    corr: &[f32; QUERY_TILE],
    wp: *const u32,
    vp: *const i32,
    np: usize,
    hd: usize,
    d0: usize,
    lanes: usize,
) {
    debug_assert!(!EXACT || lanes.div_ceil(16) == NC);
    let mut m = [0 as __mmask16; NC];
    for (c, mc) in m.iter_mut().enumerate() {
        *mc = mask(lanes.saturating_sub(16 * c).min(16));
    }
    let sign = _mm512_set1_epi32(i32::MIN);
    let min_normal = _mm512_set1_ps(f32::MIN_POSITIVE);
    let mut a = [[_mm512_setzero_ps(); NC]; NQ];
    for r in 0..NQ {
        for c in 0..NC {
            // SAFETY: masked to `d0 + 16c + lane < d0 + lanes ≤ MAX_HEAD_DIM`.
            let x = unsafe { _mm512_maskz_loadu_ps(m[c], st.acc[r].as_ptr().add(d0 + 16 * c)) };
            let x = _mm512_mul_ps(x, _mm512_set1_ps(corr[r]));
            // `flush_subnormal`: |x| below the smallest normal (zeros too, which keep their
            // sign either way) becomes x's sign alone; NaN compares false and stays.
            let xi = _mm512_castps_si512(x);
            let abs = _mm512_castsi512_ps(_mm512_andnot_si512(sign, xi));
            let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(abs, min_normal);
            let signed_zero = _mm512_castsi512_ps(_mm512_and_si512(xi, sign));
            a[r][c] = _mm512_mask_mov_ps(x, tiny, signed_zero);
        }
    }
    for t in 0..np {
        let v = vp.wrapping_add(t * hd + d0);
        // SAFETY: pair `t < np` of weight row `r < NQ` (the caller's bound).
        let w: [__m512bh; NQ] =
            std::array::from_fn(|r| bcast_pair(unsafe { *wp.add(r * W_ROW + t) }));
        for c in 0..NC {
            // SAFETY: pairs `d0 + 16c ..` of value row `t`: a whole register where all 16 lie
            // below `d0 + lanes` (with `EXACT`, every register but the last: the caller's
            // `NC = ⌈lanes/16⌉`), else masked to them.
            let vv = unsafe {
                if (EXACT && c + 1 < NC) || (!EXACT && m[c] == 0xFFFF) {
                    load_pairs(v.add(16 * c))
                } else {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi32(
                        m[c],
                        v.add(16 * c),
                    ))
                }
            };
            for r in 0..NQ {
                a[r][c] = _mm512_dpbf16_ps(a[r][c], w[r], vv);
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
