//! Weight repacking: [`PackLayout::Interleaved4x8`] (rows of `Q8_0`/`Q4_0` matrices
//! interleaved in groups of 4 for the aarch64 kernels) and [`PackLayout::Interleaved16x4`]
//! (`Q8_0` rows in groups of 16, quants in 4-byte steps, for the x86-64 AVX-512 VNNI kernels),
//! [`PackLayout::Interleaved8x4A7`] (`Q8_0` rows in groups of 8, quants in 4-byte steps, for
//! the x86-64 AVX2 kernels of 7-bit activations), [`PackLayout::Bf16Pairs16`] (through
//! [`crate::bf16dot`]), their inverses, and block access for the generic kernels, which read
//! any layout.

use crate::weights::WeightRef;
use edge_schema::plan::PackLayout;
use edge_schema::DType;

/// Weight rows per interleaved group.
pub const GROUP_ROWS: usize = 4;
/// Bytes per interleaved quant chunk.
pub const CHUNK: usize = 8;
/// Largest block (`Q8_0`, 34 bytes) among the layouts' types.
pub const MAX_BLOCK_BYTES: usize = 34;

/// Weight rows per group of [`PackLayout::Interleaved16x4`].
pub const GROUP_ROWS_16: usize = 16;
/// Quant bytes per row and step of [`PackLayout::Interleaved16x4`] (one `vpdpbusd` lane) and
/// of [`PackLayout::Interleaved8x4A7`] (one `vpmaddubsw` lane pair).
pub const STEP_16: usize = 4;

/// Weight rows per group of [`PackLayout::Interleaved8x4A7`] (one ymm of i32 lanes).
pub const GROUP_ROWS_8: usize = 8;

/// Whether matrices of `dtype` can be stored as [`PackLayout::Interleaved4x8`] (`Q8_0`, `Q4_0`).
pub fn interleaves(dtype: DType) -> bool {
    matches!(dtype, DType::Q8_0 | DType::Q4_0)
}

/// Whether matrices of `dtype` can be stored in `layout` (any type row-major;
/// [`PackLayout::Interleaved4x8`]: `Q8_0`, `Q4_0`; [`PackLayout::Interleaved16x4`]: `Q8_0`;
/// [`PackLayout::Bf16Pairs16`]: `BF16`, with an even row length;
/// [`PackLayout::Interleaved8x4A7`]: `Q8_0`).
pub fn holds(layout: PackLayout, dtype: DType) -> bool {
    match layout {
        PackLayout::RowMajor => true,
        PackLayout::Interleaved4x8 => interleaves(dtype),
        PackLayout::Interleaved16x4 | PackLayout::Interleaved8x4A7 => dtype == DType::Q8_0,
        PackLayout::Bf16Pairs16 => dtype == DType::BF16,
    }
}

/// Rows per group of an interleaved `layout` (1 for row-major).
pub fn group_rows(layout: PackLayout) -> usize {
    match layout {
        PackLayout::RowMajor => 1,
        PackLayout::Interleaved4x8 => GROUP_ROWS,
        PackLayout::Interleaved16x4 | PackLayout::Bf16Pairs16 => GROUP_ROWS_16,
        PackLayout::Interleaved8x4A7 => GROUP_ROWS_8,
    }
}

/// `(block bytes, quant bytes per row and block)` of an interleavable type.
fn block_geometry(dtype: DType) -> (usize, usize) {
    match dtype {
        DType::Q8_0 => (34, 32),
        DType::Q4_0 => (18, 16),
        other => panic!("Interleaved4x8: weights of type {other:?} cannot be interleaved"),
    }
}

/// Where block `b` of row `r` of a `[n, k]` matrix stored as `layout` lies: the byte offset of
/// its f16 scale, and a [`Quants`] mapping quant byte `i` of the block to its byte offset.
fn locate(
    dtype: DType,
    layout: PackLayout,
    n: usize,
    k: usize,
    r: usize,
    b: usize,
) -> (usize, Quants) {
    let (bb, _) = block_geometry(dtype);
    let nb = k / 32;
    let rows = group_rows(layout);
    let grouped = if rows > 1 { n / rows * rows } else { 0 };
    if r >= grouped {
        let base = (r * nb + b) * bb;
        return (
            base,
            Quants {
                base: base + 2,
                chunk: usize::MAX,
                stride: 0,
            },
        );
    }
    let (g, rr) = (r / rows, r % rows);
    let base = (g * nb + b) * rows * bb;
    let chunk = match layout {
        PackLayout::Interleaved16x4 | PackLayout::Interleaved8x4A7 => STEP_16,
        _ => CHUNK,
    };
    (
        base + 2 * rr,
        Quants {
            base: base + 2 * rows + chunk * rr,
            chunk,
            stride: chunk * rows,
        },
    )
}

/// Byte offsets of one block's quant bytes (see [`locate`]).
#[derive(Clone, Copy)]
struct Quants {
    /// Offset of quant byte 0.
    base: usize,
    /// Bytes per chunk of consecutive quants (`usize::MAX`: the block's quants are contiguous).
    chunk: usize,
    /// Bytes from one chunk of a row to its next (the group's rows' chunks lie between).
    stride: usize,
}

impl Quants {
    /// Offset of quant byte `i` of the block.
    #[inline]
    fn at(self, i: usize) -> usize {
        self.base + self.stride * (i / self.chunk) + i % self.chunk
    }
}

/// Checks the byte length of a `[n, k]` matrix of `dtype`; panics with a message otherwise.
fn check(dtype: DType, bytes: usize, n: usize, k: usize, what: &str) {
    assert!(
        k.is_multiple_of(32),
        "{what}: k = {k} is not a whole number of {dtype:?} blocks of 32"
    );
    let (bb, _) = block_geometry(dtype);
    assert_eq!(
        bytes,
        n * (k / 32) * bb,
        "{what}: {bytes} bytes, expected [{n}, {k}] {dtype:?}"
    );
}

/// Copies block `b` (32 elements) of row `r` of a `[n, k]` `dtype` matrix stored as `layout`
/// into `out` as one ggml block (`block_q8_0`: f16 scale + 32 × i8; `block_q4_0`: f16 scale +
/// 16 nibble bytes). For [`PackLayout::RowMajor`] this is a plain copy. Panics if `r`, `b` or
/// the sizes are out of range.
pub fn read_block(
    dtype: DType,
    layout: PackLayout,
    bytes: &[u8],
    n: usize,
    k: usize,
    r: usize,
    b: usize,
    out: &mut [u8],
) {
    let (bb, qb) = block_geometry(dtype);
    assert!(
        r < n && b < k / 32,
        "read_block: row {r} block {b} of [{n}, {k}]"
    );
    assert_eq!(
        out.len(),
        bb,
        "read_block: out holds {} bytes, a block is {bb}",
        out.len()
    );
    let (scale, quant) = locate(dtype, layout, n, k, r, b);
    out[..2].copy_from_slice(&bytes[scale..scale + 2]);
    for (i, o) in out[2..2 + qb].iter_mut().enumerate() {
        *o = bytes[quant.at(i)];
    }
}

/// Row-major `[n, k]` weights of `dtype` (`src`) as a [`WeightRef`] in `layout`: `src` itself for
/// [`PackLayout::RowMajor`], else [`repack`]ed into `dst` (resized to `src.len()`).
///
/// Panics as [`repack`] does for a layout that cannot hold `dtype`.
pub fn in_layout<'a>(
    layout: PackLayout,
    dtype: DType,
    src: &'a [u8],
    n: usize,
    k: usize,
    dst: &'a mut Vec<u8>,
) -> WeightRef<'a> {
    if layout == PackLayout::RowMajor {
        return WeightRef::row_major(dtype, src);
    }
    dst.clear();
    dst.resize(src.len(), 0);
    repack(layout, dtype, src, n, k, dst);
    WeightRef {
        dtype,
        bytes: dst,
        layout,
    }
}

/// Repacks a row-major `[n, k]` matrix (`src`) into `layout` (`dst`, same length). Panics if
/// `layout` cannot hold `dtype` ([`holds`]) or a length does not match.
pub fn repack(layout: PackLayout, dtype: DType, src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    assert!(
        holds(layout, dtype) && layout != PackLayout::RowMajor,
        "repack: {dtype:?} weights cannot be in layout {layout:?}"
    );
    if layout == PackLayout::Bf16Pairs16 {
        return crate::bf16dot::repack_pairs(src, n, k, dst);
    }
    check(dtype, src.len(), n, k, "repack src");
    check(dtype, dst.len(), n, k, "repack dst");
    let (bb, qb) = block_geometry(dtype);
    let nb = k / 32;
    for r in 0..n {
        for b in 0..nb {
            let blk = &src[(r * nb + b) * bb..][..bb];
            let (scale, quant) = locate(dtype, layout, n, k, r, b);
            dst[scale..scale + 2].copy_from_slice(&blk[..2]);
            for (i, &q) in blk[2..2 + qb].iter().enumerate() {
                dst[quant.at(i)] = q;
            }
        }
    }
}

/// The inverse of [`repack`]: writes the row-major matrix of one stored in `layout`.
pub fn unpack(layout: PackLayout, dtype: DType, src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    if layout == PackLayout::Bf16Pairs16 {
        assert!(
            dtype == DType::BF16,
            "unpack: {dtype:?} weights in {layout:?}"
        );
        return crate::bf16dot::unpack_pairs(src, n, k, dst);
    }
    check(dtype, src.len(), n, k, "unpack src");
    check(dtype, dst.len(), n, k, "unpack dst");
    let (bb, _) = block_geometry(dtype);
    let nb = k / 32;
    for r in 0..n {
        for b in 0..nb {
            let out = &mut dst[(r * nb + b) * bb..][..bb];
            read_block(dtype, layout, src, n, k, r, b, out);
        }
    }
}

/// [`repack`] into [`PackLayout::Interleaved4x8`].
pub fn interleave4x8(dtype: DType, src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    repack(PackLayout::Interleaved4x8, dtype, src, n, k, dst)
}

/// [`unpack`] from [`PackLayout::Interleaved4x8`].
pub fn deinterleave4x8(dtype: DType, src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    unpack(PackLayout::Interleaved4x8, dtype, src, n, k, dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(dtype: DType, n: usize, k: usize) -> Vec<u8> {
        let (bb, _) = block_geometry(dtype);
        (0..n * (k / 32) * bb)
            .map(|i| (i * 7 + i / 13) as u8)
            .collect()
    }

    #[test]
    fn interleave_round_trips_and_moves_every_byte() {
        for dtype in [DType::Q8_0, DType::Q4_0] {
            for n in [1, 3, 4, 5, 8, 11] {
                for k in [32, 96] {
                    let src = matrix(dtype, n, k);
                    let mut packed = vec![0u8; src.len()];
                    interleave4x8(dtype, &src, n, k, &mut packed);
                    let mut back = vec![0u8; src.len()];
                    deinterleave4x8(dtype, &packed, n, k, &mut back);
                    assert_eq!(back, src, "{dtype:?} n={n} k={k}");
                    if n >= 4 {
                        assert_ne!(packed, src, "{dtype:?} n={n} k={k}: nothing moved");
                    }
                }
            }
        }
    }

    #[test]
    fn interleave16x4_round_trips_and_moves_every_byte() {
        for n in [1, 15, 16, 17, 33] {
            for k in [32, 96] {
                let src = matrix(DType::Q8_0, n, k);
                let mut packed = vec![0u8; src.len()];
                repack(
                    PackLayout::Interleaved16x4,
                    DType::Q8_0,
                    &src,
                    n,
                    k,
                    &mut packed,
                );
                let mut back = vec![0u8; src.len()];
                unpack(
                    PackLayout::Interleaved16x4,
                    DType::Q8_0,
                    &packed,
                    n,
                    k,
                    &mut back,
                );
                assert_eq!(back, src, "n={n} k={k}");
                if n >= 16 {
                    assert_ne!(packed, src, "n={n} k={k}: nothing moved");
                } else {
                    assert_eq!(
                        packed, src,
                        "n={n} k={k}: fewer than 16 rows stay row-major"
                    );
                }
            }
        }
    }

    #[test]
    fn group16_layout_is_scales_then_4_byte_steps() {
        // Q8_0, 17 rows, 2 blocks: row r's block b is [scale (2 bytes), 32 quants].
        let (n, k) = (17, 64);
        let mut src = vec![0u8; n * 2 * 34];
        for r in 0..n {
            for b in 0..2 {
                let at = (r * 2 + b) * 34;
                src[at] = r as u8;
                src[at + 1] = 0x80 + b as u8;
                for i in 0..32 {
                    src[at + 2 + i] = (r * 7 + b * 32 + i) as u8;
                }
            }
        }
        let mut dst = vec![0u8; src.len()];
        repack(
            PackLayout::Interleaved16x4,
            DType::Q8_0,
            &src,
            n,
            k,
            &mut dst,
        );
        // Block 1 of group 0 starts at 544: 16 scales, then step s of row r at 32 + 64s + 4r.
        let g = 544;
        for r in 0..16 {
            assert_eq!(&dst[g + 2 * r..g + 2 * r + 2], &[r as u8, 0x81]);
        }
        let (s, r) = (5, 9);
        let q = (r * 2 + 1) * 34 + 2 + 4 * s;
        assert_eq!(&dst[g + 32 + 64 * s + 4 * r..][..4], &src[q..q + 4]);
        // Row 16 (the tail) stays where row-major puts it.
        assert_eq!(&dst[16 * 2 * 34..], &src[16 * 2 * 34..]);
    }

    #[test]
    fn interleave8x4a7_round_trips_and_keeps_the_tail_row_major() {
        for n in [1, 7, 8, 9, 23] {
            for k in [32, 96] {
                let src = matrix(DType::Q8_0, n, k);
                let mut packed = vec![0u8; src.len()];
                let a7 = PackLayout::Interleaved8x4A7;
                repack(a7, DType::Q8_0, &src, n, k, &mut packed);
                let mut back = vec![0u8; src.len()];
                unpack(a7, DType::Q8_0, &packed, n, k, &mut back);
                assert_eq!(back, src, "n={n} k={k}");
                let grouped = n / 8 * 8 * (k / 32) * 34;
                assert_eq!(
                    packed[grouped..],
                    src[grouped..],
                    "n={n} k={k}: the tail moved"
                );
                if n >= 8 {
                    assert_ne!(packed, src, "n={n} k={k}: nothing moved");
                }
            }
        }
    }

    #[test]
    fn group8_layout_is_scales_then_4_byte_steps() {
        // Q8_0, 9 rows, 2 blocks: row r's block b is [scale (2 bytes), 32 quants].
        let (n, k) = (9, 64);
        let mut src = vec![0u8; n * 2 * 34];
        for r in 0..n {
            for b in 0..2 {
                let at = (r * 2 + b) * 34;
                src[at] = r as u8;
                src[at + 1] = 0x80 + b as u8;
                for i in 0..32 {
                    src[at + 2 + i] = (r * 7 + b * 32 + i) as u8;
                }
            }
        }
        let mut dst = vec![0u8; src.len()];
        let a7 = PackLayout::Interleaved8x4A7;
        repack(a7, DType::Q8_0, &src, n, k, &mut dst);
        // Block 1 of group 0 starts at 272: 8 scales, then step s of row r at 16 + 32s + 4r.
        let g = 272;
        for r in 0..8 {
            assert_eq!(&dst[g + 2 * r..g + 2 * r + 2], &[r as u8, 0x81]);
        }
        let (s, r) = (6, 5);
        let q = (r * 2 + 1) * 34 + 2 + 4 * s;
        assert_eq!(&dst[g + 16 + 32 * s + 4 * r..][..4], &src[q..q + 4]);
        assert_eq!(&dst[8 * 2 * 34..], &src[8 * 2 * 34..]);
    }

    #[test]
    #[should_panic(expected = "repack: Q4_0 weights cannot be in layout Interleaved8x4A7")]
    fn interleave8x4a7_refuses_other_types() {
        let src = matrix(DType::Q4_0, 8, 32);
        let mut dst = vec![0u8; src.len()];
        repack(
            PackLayout::Interleaved8x4A7,
            DType::Q4_0,
            &src,
            8,
            32,
            &mut dst,
        );
    }

    #[test]
    #[should_panic(expected = "repack: Q4_0 weights cannot be in layout Interleaved16x4")]
    fn interleave16x4_refuses_other_types() {
        let src = matrix(DType::Q4_0, 16, 32);
        let mut dst = vec![0u8; src.len()];
        repack(
            PackLayout::Interleaved16x4,
            DType::Q4_0,
            &src,
            16,
            32,
            &mut dst,
        );
    }

    #[test]
    fn group_layout_is_scales_then_8_byte_chunks() {
        // Q8_0, 4 rows, 1 block: row r's block is [scale (2 bytes), 32 quants].
        let (n, k) = (4, 32);
        let mut src = vec![0u8; 4 * 34];
        for r in 0..4 {
            src[r * 34] = 0xA0 + r as u8;
            src[r * 34 + 1] = 0xB0 + r as u8;
            for i in 0..32 {
                src[r * 34 + 2 + i] = (r * 32 + i) as u8;
            }
        }
        let mut dst = vec![0u8; src.len()];
        interleave4x8(DType::Q8_0, &src, n, k, &mut dst);
        assert_eq!(&dst[..8], &[0xA0, 0xB0, 0xA1, 0xB1, 0xA2, 0xB2, 0xA3, 0xB3]);
        // Chunk 1 of row 2 (quants 8..16 of row 2) at 8 + 8·(4·1 + 2).
        let at = 8 + 8 * 6;
        assert_eq!(&dst[at..at + 8], &src[2 * 34 + 2 + 8..2 * 34 + 2 + 16]);
    }
}
