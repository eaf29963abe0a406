//! `avx512bf16_linear_pairs_6x64`: `BF16` weights in [`PackLayout::Bf16Pairs16`] with
//! `vdpbf16ps` (AVX512_BF16), the twin of [`edge_kernels::bf16dot::linear_pairs`].
//!
//! The activations are rounded to bf16 pairs once per call (16 lanes of the generic integer
//! rounding, then `vpmovdw`), then a register tile of 6 activation rows × 64 output columns
//! (24 zmm accumulators, 4 groups of 16 weight rows) takes one `vdpbf16ps` per row, group and
//! feature pair: each lane adds the exact odd product, then the even one, each sum rounded once
//! and flushed below the normal range, which is what the generic
//! `edge_kernels::bf16dot::pair_step` defines, so the bits are the generic kernel's (tested on
//! ragged sizes, and the instruction itself on random lanes below). The bias is one addition at the end. Rows of `w` past the
//! last whole group of 16 (row-major in the layout) take the generic per-element sum.

use std::arch::x86_64::*;

use edge_kernels::bf16dot::{activation_pairs, column_dot, pairs_scratch};
use edge_kernels::{contract, WeightRef};
use edge_schema::plan::PackLayout;
use edge_schema::DType;
use rayon::prelude::*;

/// Activation rows per register tile.
const R: usize = 6;
/// Groups of 16 weight rows (output columns) per register tile.
const C: usize = 4;

/// The linear slot's path for [`PackLayout::Bf16Pairs16`] weights on a CPU with AVX512_BF16
/// (the caller checked it): same contract and bits as [`edge_kernels::linear`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    contract::linear(x, w, bias, out, m, k, n, scratch.len());
    assert!(
        w.dtype == DType::BF16 && w.layout == PackLayout::Bf16Pairs16 && k.is_multiple_of(2),
        "avx512bf16 linear: {:?} weights in {:?}, k = {k}",
        w.dtype,
        w.layout
    );
    if m == 0 || n == 0 {
        return;
    }
    let kp = k / 2;
    let xp = pairs_scratch(scratch, m, k);
    xp.par_chunks_mut(kp)
        .zip(x.par_chunks(k))
        .for_each(|(dst, src)| round_row(src, dst));
    let xp = &*xp;
    let groups = n / 16;
    // Columns past the whole groups: row-major weight rows, the generic sum per element.
    let tail = |i: usize, row: &mut [f32]| {
        for (j, o) in row.iter_mut().enumerate().skip(groups * 16) {
            let acc = column_dot(&xp[i * kp..][..kp], w.bytes, n, k, j);
            *o = bias.map_or(acc, |b| acc + b[j]);
        }
    };
    let threads = rayon::current_num_threads().max(1);
    if m >= 2 * R * threads {
        // Row tasks (a multiple of the tile's rows, about 4 per thread); each walks the column
        // blocks, the block's weights staying in cache while its row tiles pass.
        let per = m.div_ceil(4 * threads).next_multiple_of(R);
        out.par_chunks_mut(per * n)
            .enumerate()
            .for_each(|(t, rows)| {
                let (i0, nr) = (t * per, rows.len() / n);
                for g0 in (0..groups).step_by(C) {
                    let gs = (groups - g0).min(C);
                    for r0 in (0..nr).step_by(R) {
                        let rr = (nr - r0).min(R);
                        let dst = &mut rows[r0 * n..(r0 + rr) * n];
                        let at = Out { ld: n, col0: 0 };
                        block(xp, i0 + r0, rr, kp, w.bytes, k, g0, gs, bias, dst, at);
                    }
                }
                for r in 0..nr {
                    tail(i0 + r, &mut rows[r * n..(r + 1) * n]);
                }
            });
    } else {
        // Few rows: column tasks, each into its own buffer, copied out after.
        let blocks: Vec<(usize, Vec<f32>)> = (0..groups.div_ceil(C))
            .into_par_iter()
            .map(|b| {
                let g0 = b * C;
                let gs = (groups - g0).min(C);
                let ld = 16 * gs;
                let mut buf = vec![0f32; m * ld];
                for r0 in (0..m).step_by(R) {
                    let rr = (m - r0).min(R);
                    let dst = &mut buf[r0 * ld..(r0 + rr) * ld];
                    let at = Out { ld, col0: 16 * g0 };
                    block(xp, r0, rr, kp, w.bytes, k, g0, gs, bias, dst, at);
                }
                (g0, buf)
            })
            .collect();
        for (g0, buf) in blocks {
            let (lo, ld) = (16 * g0, 16 * (groups - g0).min(C));
            for (o, b) in out.chunks_mut(n).zip(buf.chunks(ld)) {
                o[lo..lo + ld].copy_from_slice(b);
            }
        }
        for (i, row) in out.chunks_mut(n).enumerate() {
            tail(i, row);
        }
    }
}

/// Rounds one activation row to bf16 pairs, 16 features at a time (the generic rounding in
/// integer lanes), the last `k mod 16` with the generic function.
fn round_row(src: &[f32], dst: &mut [u32]) {
    let whole = src.len() / 16 * 16;
    assert!(dst.len() * 2 == src.len());
    // SAFETY: AVX-512F (and BW) were detected before this kernel was put in a table; the loop
    // reads 16 f32 at `c ≤ whole − 16` and writes 8 u32 at `c / 2`, both inside the slices
    // (`dst` holds `src.len() / 2` pairs, asserted).
    unsafe { round_row_impl(&src[..whole], &mut dst[..whole / 2]) };
    activation_pairs(&src[whole..], &mut dst[whole / 2..]);
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn round_row_impl(src: &[f32], dst: &mut [u32]) {
    for c in (0..src.len()).step_by(16) {
        // SAFETY: `c + 16 ≤ src.len()` and `c / 2 + 8 ≤ dst.len()` (the caller's lengths).
        unsafe {
            let r = round16(_mm512_loadu_ps(src.as_ptr().add(c)));
            _mm256_storeu_si256(
                dst.as_mut_ptr().add(c / 2) as *mut __m256i,
                _mm512_cvtepi32_epi16(r),
            );
        }
    }
}

/// [`edge_kernels::bf16dot::round_bf16`] on 16 lanes: each lane's bf16 in its low 16 bits
/// (the high 16 zero), in integer operations.
#[inline]
#[target_feature(enable = "avx512f")]
fn round16(v: __m512) -> __m512i {
    let b = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(
        _mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)),
        odd,
    ));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40))
}

/// Where a block's outputs go: output column `j` of row `r` at `dst[r·ld + j − col0]`.
#[derive(Clone, Copy)]
struct Out {
    ld: usize,
    col0: usize,
}

/// Rows `i0 .. i0 + rr` (`rr ≤ R`) of the output, columns of groups `g0 .. g0 + gs` (`gs ≤ C`),
/// into `dst` as `at` says.
#[allow(clippy::too_many_arguments)]
fn block(
    xp: &[u32],
    i0: usize,
    rr: usize,
    kp: usize,
    w: &[u8],
    k: usize,
    g0: usize,
    gs: usize,
    bias: Option<&[f32]>,
    dst: &mut [f32],
    at: Out,
) {
    assert!((1..=R).contains(&rr) && (1..=C).contains(&gs) && 2 * kp == k);
    assert!(
        at.col0 <= 16 * g0,
        "bf16 pairs: output columns before the buffer"
    );
    assert!(xp.len() >= (i0 + rr) * kp && dst.len() >= (rr - 1) * at.ld + 16 * (g0 + gs) - at.col0);
    assert!(
        w.len() >= 32 * k * (g0 + gs),
        "bf16 pairs: groups outside the weight"
    );
    if let Some(b) = bias {
        assert!(b.len() >= 16 * (g0 + gs));
    }
    // SAFETY: AVX-512F and AVX512_BF16 were detected before this kernel was put in a table;
    // the asserts above bound every access of `tile` (rows `i0 .. i0 + rr` of `kp` pairs,
    // groups `g0 .. g0 + gs` of `32k` bytes, `rr` output rows `ld` apart up to column
    // `16(g0 + gs) − col0`).
    unsafe {
        match (rr, gs) {
            (6, 4) => tile::<6, 4>(xp, i0, kp, w, k, g0, bias, dst, at),
            (6, 3) => tile::<6, 3>(xp, i0, kp, w, k, g0, bias, dst, at),
            (6, 2) => tile::<6, 2>(xp, i0, kp, w, k, g0, bias, dst, at),
            (6, _) => tile::<6, 1>(xp, i0, kp, w, k, g0, bias, dst, at),
            (5, _) => tile_rows::<5>(xp, i0, kp, w, k, g0, gs, bias, dst, at),
            (4, _) => tile_rows::<4>(xp, i0, kp, w, k, g0, gs, bias, dst, at),
            (3, _) => tile_rows::<3>(xp, i0, kp, w, k, g0, gs, bias, dst, at),
            (2, _) => tile_rows::<2>(xp, i0, kp, w, k, g0, gs, bias, dst, at),
            _ => tile_rows::<1>(xp, i0, kp, w, k, g0, gs, bias, dst, at),
        }
    }
}

/// [`tile`] with `NR` rows, one group at a time.
///
/// # Safety
/// As [`tile`], for `gs` groups.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_rows<const NR: usize>(
    xp: &[u32],
    i0: usize,
    kp: usize,
    w: &[u8],
    k: usize,
    g0: usize,
    gs: usize,
    bias: Option<&[f32]>,
    dst: &mut [f32],
    at: Out,
) {
    for g in g0..g0 + gs {
        // SAFETY: the caller's bounds cover group `g < g0 + gs`.
        unsafe { tile::<NR, 1>(xp, i0, kp, w, k, g, bias, dst, at) };
    }
}

/// `dst[r·ld + 16(g0 + c) + l − col0] = Σ_s pair steps + bias` for rows `r < NR`, groups
/// `c < NG`, lanes `l < 16`: one `vdpbf16ps` per row, group and feature pair.
///
/// # Safety
/// AVX-512F and AVX512_BF16 present; `xp` holds rows `i0 .. i0 + NR` of `kp` pairs, `w` groups
/// `g0 .. g0 + NG` (`32k` bytes each), `dst` `NR` rows `ld` apart up to column
/// `16(g0 + NG) − col0` (`col0 ≤ 16·g0`), `bias` (if any) at least `16(g0 + NG)` values.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile<const NR: usize, const NG: usize>(
    xp: &[u32],
    i0: usize,
    kp: usize,
    w: &[u8],
    k: usize,
    g0: usize,
    bias: Option<&[f32]>,
    dst: &mut [f32],
    at: Out,
) {
    let mut acc = [[_mm512_setzero_ps(); NG]; NR];
    let xr: [*const u32; NR] = std::array::from_fn(|r| xp[(i0 + r) * kp..].as_ptr());
    let wg: [*const u8; NG] = std::array::from_fn(|c| w[32 * k * (g0 + c)..].as_ptr());
    for s in 0..kp {
        // SAFETY: `s < kp`: pair `s` of each group (64 bytes at `64s`) and of each row.
        unsafe {
            let wv: [__m512bh; NG] = std::array::from_fn(|c| {
                let v = _mm512_loadu_si512(wg[c].add(64 * s) as *const __m512i);
                // SAFETY: both are 64 bytes of plain lanes; the bits are the operand.
                std::mem::transmute::<__m512i, __m512bh>(v)
            });
            for r in 0..NR {
                let xb = _mm512_set1_epi32(*xr[r].add(s) as i32);
                let xb = std::mem::transmute::<__m512i, __m512bh>(xb);
                for c in 0..NG {
                    acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, wv[c]);
                }
            }
        }
    }
    for (r, ar) in acc.iter().enumerate() {
        for (c, &a) in ar.iter().enumerate() {
            let col = 16 * (g0 + c);
            // SAFETY: `r·ld + col + 16 − col0 ≤ (NR − 1)·ld + 16(g0 + NG) − col0 ≤ dst.len()`,
            // and the bias holds `col + 16` values (the caller's bounds).
            unsafe {
                let v = match bias {
                    Some(b) => _mm512_add_ps(a, _mm512_loadu_ps(b.as_ptr().add(col))),
                    None => a,
                };
                _mm512_storeu_ps(dst.as_mut_ptr().add(r * at.ld + col - at.col0), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edge_kernels::bf16dot::pair_step;

    /// `vdpbf16ps` against the generic `pair_step` on random lanes: bf16 operands of every finite
    /// exponent (subnormals, which read as zero, and products that underflow or overflow
    /// included), accumulators of many magnitudes, and rounding ties (`1 + 2⁻²⁴` twice).
    #[test]
    fn vdpbf16ps_is_pair_step() {
        let f = edge_kernels::cpu::features();
        if !(f.avx512f && f.avx512bf16) {
            eprintln!("vdpbf16ps_is_pair_step: skipped, this CPU has no AVX512_BF16");
            return;
        }
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // A finite bf16 from random bits: any sign, exponent 0..=254, any mantissa.
        let bf = |r: u64| {
            let exp = (r % 255) as u16;
            ((r >> 8) as u16 & 0x8000) | (exp << 7) | ((r >> 20) as u16 & 0x7f)
        };
        for round in 0..20_000 {
            let mut acc = [0f32; 16];
            let (mut x, mut w) = ([0u32; 16], [0u32; 16]);
            for l in 0..16 {
                if round % 5 == 0 {
                    // 1 + 2⁻²⁴ + 2⁻²⁴: ties to even twice.
                    acc[l] = 1.0;
                    x[l] = 0x3980_3980;
                    w[l] = 0x3980_3980;
                    continue;
                }
                let e = (next() % 60) as i32 - 30;
                acc[l] = ((next() % 4001) as f32 - 2000.0) * 2f32.powi(e);
                x[l] = u32::from(bf(next())) | (u32::from(bf(next())) << 16);
                w[l] = u32::from(bf(next())) | (u32::from(bf(next())) << 16);
            }
            let mut got = [0f32; 16];
            // SAFETY: AVX-512F and AVX512_BF16 were detected; every array holds 16 lanes.
            unsafe { dp(&acc, &x, &w, &mut got) };
            for l in 0..16 {
                let want = pair_step(acc[l], x[l], w[l]);
                let ok = got[l].to_bits() == want.to_bits() || (got[l].is_nan() && want.is_nan());
                assert!(
                    ok,
                    "lane {l}: acc {:e}, x {:08x}, w {:08x}: vdpbf16ps {:e}, pair_step {:e}",
                    acc[l], x[l], w[l], got[l], want
                );
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dp(acc: &[f32; 16], x: &[u32; 16], w: &[u32; 16], out: &mut [f32; 16]) {
        // SAFETY: 16 lanes each (the arrays' types); the casts reinterpret 64 bytes.
        unsafe {
            let a = _mm512_loadu_ps(acc.as_ptr());
            let xv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                x.as_ptr() as *const __m512i
            ));
            let wv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                w.as_ptr() as *const __m512i
            ));
            _mm512_storeu_ps(out.as_mut_ptr(), _mm512_dpbf16_ps(a, xv, wv));
        }
    }

    /// `vdpbf16ps` reads a subnormal f32 accumulator as zero (probed on Zen 4): 10⁻⁴⁰ or ±10⁻³⁹
    /// plus a product of about 2·10⁻³⁸ gives the product alone. `edge_kernels::attention_bf16`
    /// therefore flushes its rescaled sums to zero before they meet the instruction, so that
    /// the generic `pair_step` (which would add them exactly) gives the same bits.
    #[test]
    fn vdpbf16ps_reads_a_subnormal_accumulator_as_zero() {
        if !edge_kernels::cpu::features().avx512bf16 {
            eprintln!("vdpbf16ps_reads_a_subnormal_accumulator_as_zero: skipped, no AVX512_BF16");
            return;
        }
        #[target_feature(enable = "avx512f,avx512bf16")]
        fn one_lane(acc: f32, x: u32, w: u32) -> f32 {
            // SAFETY: both types are 64 bytes of plain lanes.
            let (xv, wv) = unsafe {
                (
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(x as i32)),
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(w as i32)),
                )
            };
            _mm512_cvtss_f32(_mm512_dpbf16_ps(_mm512_set1_ps(acc), xv, wv))
        }
        let one = 0x3f80u32;
        let tiny = 2.0e-38f32.to_bits() >> 16;
        let product = f32::from_bits(tiny << 16);
        for acc in [1e-40f32, 1e-39, -1e-39, 0.0] {
            // SAFETY: AVX512_BF16 was detected above.
            let got = unsafe { one_lane(acc, one, tiny) };
            assert_eq!(got, product, "acc {acc:e}");
        }
    }

    /// `vcvtne2ps2bf16` gives `edge_kernels::attention_bf16::round_bf16_daz` on random f32 of
    /// every exponent (subnormals read as zero, otherwise to nearest even; NaN quiet with its
    /// upper payload) and on the edge values.
    #[test]
    fn vcvtne2ps2bf16_is_round_bf16_daz() {
        if !edge_kernels::cpu::features().avx512bf16 {
            eprintln!("vcvtne2ps2bf16_is_round_bf16_daz: skipped, no AVX512_BF16");
            return;
        }
        #[target_feature(enable = "avx512f,avx512bf16")]
        fn cvt(v: &[f32; 32]) -> [u16; 32] {
            // SAFETY: `v` holds 32 f32; both result types are 64 bytes of plain lanes.
            unsafe {
                let lo = _mm512_loadu_ps(v.as_ptr());
                let hi = _mm512_loadu_ps(v.as_ptr().add(16));
                std::mem::transmute::<__m512bh, [u16; 32]>(_mm512_cvtne2ps_pbh(hi, lo))
            }
        }
        let edges = [
            f32::from_bits(1),
            f32::from_bits(0x007f_ffff),
            -f32::from_bits(0x007f_ffff),
            f32::MIN_POSITIVE,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            1.003_906_3,
            1.011_718_8,
            -0.0,
            0.0,
            3.0,
            f32::from_bits(0x3f80_8000),
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..20_000 {
            let mut v = [0f32; 32];
            for l in &mut v {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *l = f32::from_bits(x as u32);
            }
            if i == 0 {
                v[..16].copy_from_slice(&edges);
            }
            // SAFETY: AVX512_BF16 was detected above.
            let got = unsafe { cvt(&v) };
            for (l, &g) in got.iter().enumerate() {
                let want = edge_kernels::attention_bf16::round_bf16_daz(v[l]);
                assert_eq!(
                    g,
                    want,
                    "x {:08x}: {g:04x}, want {want:04x}",
                    v[l].to_bits()
                );
            }
        }
    }
}
