//! `generic_linear_bf16_pairs`: the products of `BF16` weights stored as
//! [`PackLayout::Bf16Pairs16`], in the arithmetic of x86-64 `vdpbf16ps` (AVX512_BF16), which this
//! module defines for every CPU.
//!
//! **The arithmetic.** Each activation is rounded to bf16 ([`round_bf16`]: to nearest, ties to
//! even, as ggml's `GGML_FP32_TO_BF16`). Each output element is one f32 accumulator from `+0.0`
//! that takes, for every feature pair `s = 0, 1, …, k/2 − 1` in order, first the product of the
//! odd features `2s + 1`, then that of the even ones `2s` ([`pair_step`]): a bf16 input whose
//! exponent is zero reads as a zero of its sign (DAZ); the product is exact (16 significant
//! bits; it neither overflows nor underflows); `acc + product` is rounded once to a 24-bit
//! significand, to nearest even, as if the exponent were unbounded, then becomes ±∞ above
//! f32's range and a zero of its sign below its normal range (flush to zero after rounding).
//! Then the bias is added with one ordinary addition. This is what `VDPBF16PS` (AVX512_BF16)
//! computes per lane: on an AMD Zen 4, probes of ties, products beyond f32's range either way
//! and sums at the edge of the normal range, and 320 000 random lanes of every exponent
//! (`edge_kernels_x86`'s `vdpbf16ps_is_pair_step`), gave these bits every time; note that the
//! products are *not* rounded to f32 first (a product of 2²⁰⁰ then −2²⁰⁰ gives +∞, not NaN; a
//! product of 2⁻¹³⁰ added to 2⁻¹²⁶ counts). For finite, normal-range data it is a sequential sum
//! over `k` with one rounding per product, as the f32 GEMM's, of bf16-rounded activations.

use edge_schema::plan::PackLayout;
use edge_schema::DType;
use rayon::prelude::*;

use crate::weights::WeightRef;

/// Weight rows per group of [`PackLayout::Bf16Pairs16`] (one zmm of f32 lanes).
pub const PAIR_GROUP_ROWS: usize = 16;

/// `x` rounded to bf16 (the upper 16 bits of an f32): to nearest, ties to even; a NaN stays a
/// NaN (quiet, its sign and upper payload bits kept), overflow gives ±∞.
#[inline]
pub fn round_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The bf16 `h` as an f32, a subnormal read as a zero of its sign (DAZ).
#[inline]
fn daz(h: u16) -> f32 {
    let h = if h & 0x7f80 == 0 { h & 0x8000 } else { h };
    f32::from_bits(u32::from(h) << 16)
}

/// `acc + p` (`p` exact) rounded to a 24-bit significand as if the exponent were unbounded,
/// ±∞ beyond f32's range, a zero of its sign below 2⁻¹²⁶. The f64 sum is exact or, where the
/// operands lie more than 28 bits apart, off by less than the smaller one, which then cannot
/// reach an f32 rounding boundary: rounding it to f32 rounds the exact sum.
#[inline]
fn add_rounded(acc: f32, p: f64) -> f32 {
    let v = f64::from(acc) + p;
    if v.abs() >= 1e-30 {
        return v as f32;
    }
    // Round at a normal exponent (2⁶⁴ higher, exact in f64), then flush what is tiny.
    let r = (v * 18_446_744_073_709_551_616.0) as f32;
    if r.abs() < 2f32.powi(-62) {
        f32::from_bits(r.to_bits() & 0x8000_0000)
    } else {
        r * 2f32.powi(-64)
    }
}

/// One feature pair of the arithmetic (module doc): `x` and `w` hold features `2s` (low 16
/// bits) and `2s + 1` (high 16 bits) as bf16; the odd product is added first. `acc` is a
/// previous result (never subnormal) or `+0.0`.
#[inline]
pub fn pair_step(acc: f32, x: u32, w: u32) -> f32 {
    let prod = |a: u32, b: u32| f64::from(daz(a as u16)) * f64::from(daz(b as u16));
    let acc = add_rounded(acc, prod(x >> 16, w >> 16));
    add_rounded(acc, prod(x & 0xffff, w & 0xffff))
}

/// Rounds activation rows `x` `[m, k]` (`k` even) to bf16 pairs: `out[i·k/2 + s]` holds features
/// `2s` (low half) and `2s + 1` (high half) of row `i`.
pub fn activation_pairs(x: &[f32], out: &mut [u32]) {
    assert!(
        x.len() == 2 * out.len(),
        "activation_pairs: {} activations for {} pairs",
        x.len(),
        out.len()
    );
    for (o, p) in out.iter_mut().zip(x.chunks_exact(2)) {
        *o = u32::from(round_bf16(p[0])) | (u32::from(round_bf16(p[1])) << 16);
    }
}

/// Byte offset of feature pair `s` of weight row `r` of a `[n, k]` BF16 matrix stored as
/// [`PackLayout::Bf16Pairs16`] (its 4 bytes: features `2s`, then `2s + 1`).
#[inline]
pub fn pair_offset(n: usize, k: usize, r: usize, s: usize) -> usize {
    let grouped = n / PAIR_GROUP_ROWS * PAIR_GROUP_ROWS;
    if r >= grouped {
        return (r * k + 2 * s) * 2;
    }
    let (g, rr) = (r / PAIR_GROUP_ROWS, r % PAIR_GROUP_ROWS);
    32 * k * g + 64 * s + 4 * rr
}

/// Checks a `[n, k]` BF16 matrix for [`PackLayout::Bf16Pairs16`]; panics with a message.
fn check(bytes: usize, n: usize, k: usize, what: &str) {
    assert!(
        k.is_multiple_of(2),
        "{what}: k = {k} is odd (Bf16Pairs16 stores features in pairs)"
    );
    assert_eq!(
        bytes,
        n * k * 2,
        "{what}: {bytes} bytes, expected [{n}, {k}] BF16"
    );
}

/// Repacks a row-major `[n, k]` BF16 matrix into [`PackLayout::Bf16Pairs16`] (same length).
pub fn repack_pairs(src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    check(src.len(), n, k, "repack src");
    check(dst.len(), n, k, "repack dst");
    for r in 0..n {
        for s in 0..k / 2 {
            let at = pair_offset(n, k, r, s);
            dst[at..at + 4].copy_from_slice(&src[(r * k + 2 * s) * 2..][..4]);
        }
    }
}

/// The inverse of [`repack_pairs`].
pub fn unpack_pairs(src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    check(src.len(), n, k, "unpack src");
    check(dst.len(), n, k, "unpack dst");
    for r in 0..n {
        for s in 0..k / 2 {
            let at = pair_offset(n, k, r, s);
            dst[(r * k + 2 * s) * 2..][..4].copy_from_slice(&src[at..at + 4]);
        }
    }
}

/// One output element without its bias: the pair steps of one activation row's pairs `xs`
/// (`k / 2`) against weight row `j` of the `[n, k]` matrix `w` in [`PackLayout::Bf16Pairs16`].
pub fn column_dot(xs: &[u32], w: &[u8], n: usize, k: usize, j: usize) -> f32 {
    let mut acc = 0.0f32;
    for (s, &xv) in xs.iter().enumerate() {
        let at = pair_offset(n, k, j, s);
        let wv = u32::from_le_bytes([w[at], w[at + 1], w[at + 2], w[at + 3]]);
        acc = pair_step(acc, xv, wv);
    }
    acc
}

/// Scratch bytes of [`linear_pairs`]: the `m` activation rows as bf16 pairs, `2·m·k` bytes.
pub fn pairs_scratch_bytes(m: usize, k: usize) -> usize {
    2 * m * k
}

/// The activation pairs in the first [`pairs_scratch_bytes`] of `scratch`.
pub fn pairs_scratch(scratch: &mut [u8], m: usize, k: usize) -> &mut [u32] {
    let need = pairs_scratch_bytes(m, k);
    match zerocopy::FromBytes::mut_from_bytes(&mut scratch[..need]) {
        Ok(v) => v,
        Err(_) => panic!("linear: scratch for bf16 pairs is not 4-byte aligned"),
    }
}

/// `generic_linear_bf16_pairs`: `out[i, j] = Σ x[i, c]·w[j, c] + bias[j]` in the arithmetic of
/// the module doc. Shapes: `x` `[m, k]` f32 (`k` even), `w` `[n, k]` BF16 stored as
/// [`PackLayout::Bf16Pairs16`], `bias` `[n]`, `out` `[m, n]`; `scratch` holds at least
/// [`pairs_scratch_bytes`]`(m, k)` bytes, 4-byte aligned. The caller ([`crate::linear`]) has
/// checked the lengths. Parallel over output rows; the same bits for any thread count.
#[allow(clippy::too_many_arguments)]
pub fn linear_pairs(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    assert!(
        w.dtype == DType::BF16 && w.layout == PackLayout::Bf16Pairs16,
        "linear_pairs: {:?} weights in {:?}",
        w.dtype,
        w.layout
    );
    check(w.bytes.len(), n, k, "linear weight");
    let xp = pairs_scratch(scratch, m, k);
    activation_pairs(x, xp);
    let xp = &*xp;
    let kp = k / 2;
    out.par_chunks_mut(n.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            let xs = &xp[i * kp..][..kp];
            for (j, o) in row.iter_mut().enumerate() {
                let acc = column_dot(xs, w.bytes, n, k, j);
                *o = bias.map_or(acc, |b| acc + b[j]);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(round_bf16(1.0), 0x3f80);
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties to the even 1.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(round_bf16(f32::MAX), 0x7f80, "overflow gives +inf");
        assert_eq!(round_bf16(-0.0), 0x8000);
        assert!(daz(round_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn products_are_added_odd_first_each_rounded() {
        // 1 + 2⁻²⁴ ties back to 1, twice; one rounding of the three terms would give 1 + 2⁻²³.
        let t = u32::from(round_bf16(2f32.powi(-12)));
        let both = t | (t << 16);
        assert_eq!(pair_step(1.0, both, both), 1.0);
        // Odd first: (1e8 + 1·1) rounds to 1e8 before the even product −1e8·1 cancels it.
        let one = u32::from(round_bf16(1.0));
        let big = u32::from(round_bf16(-1e8));
        let acc = f32::from_bits(u32::from(round_bf16(1e8)) << 16);
        assert_eq!(pair_step(acc, big | (one << 16), one | (one << 16)), 0.0);
        // A subnormal input counts as zero; a sum below the normal range is flushed.
        let tiny = u32::from(round_bf16(1e-30));
        assert_eq!(
            pair_step(0.0, tiny | (tiny << 16), tiny | (tiny << 16)),
            0.0
        );
        let sub = 0x0001u32;
        assert_eq!(pair_step(0.0, sub, one), 0.0);
    }

    /// The probes that pin the rounding down, with what `vdpbf16ps` gave on an AMD Zen 4.
    #[test]
    fn products_are_exact_and_sums_flush_after_rounding() {
        let p = |e: i32| 2f32.powi(e);
        let pair =
            |even: f32, odd: f32| u32::from(round_bf16(even)) | (u32::from(round_bf16(odd)) << 16);
        // 2⁻¹²⁶ + 2⁻¹³⁰: the product below f32's normal range still counts.
        let got = pair_step(p(-126), pair(0.0, p(-65)), pair(0.0, p(-65)));
        assert_eq!(got.to_bits(), 0x0088_0000);
        // 0 + 2⁻¹³⁰ is flushed before 2⁻¹²⁶ is added.
        let got = pair_step(0.0, pair(p(-63), p(-65)), pair(p(-63), p(-65)));
        assert_eq!(got.to_bits(), 0x0080_0000);
        // 2²⁰⁰ overflows the sum to +∞; −2²⁰⁰ (exact, finite) leaves it there: not NaN.
        let got = pair_step(0.0, pair(-p(100), p(100)), pair(p(100), p(100)));
        assert_eq!(got, f32::INFINITY);
        // 2⁻¹²⁶ − 1.5·2⁻¹⁵¹ rounds (unbounded exponent) to 2⁻¹²⁶ − 2⁻¹⁵⁰: tiny, flushed; a tie
        // (−2⁻¹⁵¹) goes to the even 2⁻¹²⁶.
        let got = pair_step(p(-126), pair(0.0, -1.5 * p(-76)), pair(0.0, p(-75)));
        assert_eq!(got.to_bits(), 0);
        let got = pair_step(p(-126), pair(0.0, -p(-76)), pair(0.0, p(-75)));
        assert_eq!(got.to_bits(), 0x0080_0000);
        // 2⁻¹²⁵ − 1.5·2⁻¹²⁶ = 2⁻¹²⁷: flushed.
        let got = pair_step(p(-125), pair(0.0, -1.5 * p(-63)), pair(0.0, p(-63)));
        assert_eq!(got.to_bits(), 0);
    }

    #[test]
    fn pairs_layout_round_trips() {
        for (n, k) in [(1, 2), (15, 4), (16, 6), (17, 2), (35, 10)] {
            let src: Vec<u8> = (0..n * k * 2).map(|i| (i * 7 + i / 5) as u8).collect();
            let mut packed = vec![0u8; src.len()];
            repack_pairs(&src, n, k, &mut packed);
            let mut back = vec![0u8; src.len()];
            unpack_pairs(&packed, n, k, &mut back);
            assert_eq!(back, src, "n={n} k={k}");
            // (With one pair per row, a group is its rows one after the other: row-major.)
            if n >= 16 && k > 2 {
                assert_ne!(packed, src, "n={n} k={k}: nothing moved");
                // Pair 1 of row 3: bytes 64 + 12 of group 0.
                assert_eq!(&packed[64 + 12..][..4], &src[(3 * k + 2) * 2..][..4]);
            }
        }
    }
}
