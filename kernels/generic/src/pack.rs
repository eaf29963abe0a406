//! Weight repacking: [`PackLayout::Interleaved4x8`] (rows of `Q8_0`/`Q4_0` matrices
//! interleaved in groups of 4 for the aarch64 kernels), its inverse, and block access for the
//! generic kernels, which read any layout.

use edge_schema::plan::PackLayout;
use edge_schema::DType;

/// Weight rows per interleaved group.
pub const GROUP_ROWS: usize = 4;
/// Bytes per interleaved quant chunk.
pub const CHUNK: usize = 8;
/// Largest block (`Q8_0`, 34 bytes) among the layouts' types.
pub const MAX_BLOCK_BYTES: usize = 34;

/// Whether matrices of `dtype` can be stored as [`PackLayout::Interleaved4x8`] (`Q8_0`, `Q4_0`).
pub fn interleaves(dtype: DType) -> bool {
    matches!(dtype, DType::Q8_0 | DType::Q4_0)
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
    let grouped = match layout {
        PackLayout::RowMajor => 0,
        PackLayout::Interleaved4x8 => n / GROUP_ROWS * GROUP_ROWS,
    };
    if r >= grouped {
        let base = (r * nb + b) * bb;
        (
            base,
            Quants {
                base: base + 2,
                interleaved: false,
            },
        )
    } else {
        let (g, rr) = (r / GROUP_ROWS, r % GROUP_ROWS);
        let base = (g * nb + b) * GROUP_ROWS * bb;
        (
            base + 2 * rr,
            Quants {
                base: base + 2 * GROUP_ROWS + CHUNK * rr,
                interleaved: true,
            },
        )
    }
}

/// Byte offsets of one block's quant bytes (see [`locate`]).
#[derive(Clone, Copy)]
struct Quants {
    /// Offset of quant byte 0.
    base: usize,
    /// Chunks of [`CHUNK`] bytes are [`GROUP_ROWS`] chunks apart.
    interleaved: bool,
}

impl Quants {
    /// Offset of quant byte `i` of the block.
    #[inline]
    fn at(self, i: usize) -> usize {
        if self.interleaved {
            self.base + CHUNK * GROUP_ROWS * (i / CHUNK) + i % CHUNK
        } else {
            self.base + i
        }
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

/// Repacks a row-major `[n, k]` `Q8_0`/`Q4_0` matrix (`src`) into [`PackLayout::Interleaved4x8`]
/// (`dst`, same length). Panics if `dtype` cannot be interleaved or a length does not match.
pub fn interleave4x8(dtype: DType, src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    check(dtype, src.len(), n, k, "interleave4x8 src");
    check(dtype, dst.len(), n, k, "interleave4x8 dst");
    let (bb, qb) = block_geometry(dtype);
    let nb = k / 32;
    for r in 0..n {
        for b in 0..nb {
            let blk = &src[(r * nb + b) * bb..][..bb];
            let (scale, quant) = locate(dtype, PackLayout::Interleaved4x8, n, k, r, b);
            dst[scale..scale + 2].copy_from_slice(&blk[..2]);
            for (i, &q) in blk[2..2 + qb].iter().enumerate() {
                dst[quant.at(i)] = q;
            }
        }
    }
}

/// The inverse of [`interleave4x8`]: writes the row-major matrix of an interleaved one.
pub fn deinterleave4x8(dtype: DType, src: &[u8], n: usize, k: usize, dst: &mut [u8]) {
    check(dtype, src.len(), n, k, "deinterleave4x8 src");
    check(dtype, dst.len(), n, k, "deinterleave4x8 dst");
    let (bb, _) = block_geometry(dtype);
    let nb = k / 32;
    for r in 0..n {
        for b in 0..nb {
            let out = &mut dst[(r * nb + b) * bb..][..bb];
            read_block(dtype, PackLayout::Interleaved4x8, src, n, k, r, b, out);
        }
    }
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
