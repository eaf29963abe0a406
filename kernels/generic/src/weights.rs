//! Weight bytes as typed views, and row conversion of plain (non-block) weight types.

use edge_schema::plan::PackLayout;
use edge_schema::DType;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use zerocopy::FromBytes;

/// A weight tensor as it lies in a plan: its storage type and its raw little-endian bytes.
///
/// In [`PackLayout::RowMajor`] rows are contiguous; a row of `k` elements takes
/// `dtype.bytes_for(k)` bytes (ggml block layout for quantized types); other layouts keep the
/// total length. Plans align every weight section to 64 bytes; kernels that view
/// `F32` weights in place need at least 4-byte alignment (`F16`/`BF16` are read byte-wise) and
/// panic with a message otherwise, never reading misaligned memory.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    /// Storage type of the elements.
    pub dtype: DType,
    /// The tensor's bytes, in `layout`.
    pub bytes: &'a [u8],
    /// How rows are arranged ([`PackLayout::Interleaved4x8`] only for `linear` weights of type
    /// `Q8_0`/`Q4_0`; every other kernel asserts [`PackLayout::RowMajor`]).
    pub layout: PackLayout,
}

impl<'a> WeightRef<'a> {
    /// Row-major weights of type `dtype`.
    pub fn row_major(dtype: DType, bytes: &'a [u8]) -> Self {
        Self {
            dtype,
            bytes,
            layout: PackLayout::RowMajor,
        }
    }
}

/// Views `bytes` as `f32` values (native endianness, which is little-endian on every target of
/// this project). Panics naming `what` if the slice is not 4-byte aligned or not a multiple of 4.
pub(crate) fn f32_view<'a>(bytes: &'a [u8], what: &str) -> &'a [f32] {
    match <[f32]>::ref_from_bytes(bytes) {
        Ok(v) => v,
        Err(e) => panic!(
            "{what}: {} bytes at address {:p} cannot be viewed as f32 (must be 4-byte aligned \
             and a multiple of 4 bytes; plan sections are 64-byte aligned): {e:?}",
            bytes.len(),
            bytes.as_ptr()
        ),
    }
}

/// Mutable twin of [`f32_view`], used for scratch memory.
pub(crate) fn f32_view_mut<'a>(bytes: &'a mut [u8], what: &str) -> &'a mut [f32] {
    let (len, ptr) = (bytes.len(), bytes.as_ptr());
    match <[f32]>::mut_from_bytes(bytes) {
        Ok(v) => v,
        Err(_) => panic!(
            "{what}: {len} bytes at address {ptr:p} cannot be viewed as f32 (scratch must be \
             4-byte aligned and a multiple of 4 bytes; arena slices are 64-byte aligned)"
        ),
    }
}

/// Converts one row of a plain floating-point weight (`F32`, `F16`, `BF16`) to `f32`.
/// `src` holds exactly `dst.len()` elements. Exact: every f16 and bf16 value is an f32.
pub(crate) fn convert_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => {
            debug_assert_eq!(src.len(), dst.len() * 4);
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        DType::F16 => {
            debug_assert_eq!(src.len(), dst.len() * 2);
            match <[u16]>::ref_from_bytes(src) {
                // Aligned: half's slice conversion (F16C/NEON when the CPU has it, exact).
                Ok(bits) => bits
                    .reinterpret_cast::<half::f16>()
                    .convert_to_f32_slice(dst),
                Err(_) => {
                    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                        *d = half::f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
                    }
                }
            }
        }
        DType::BF16 => {
            debug_assert_eq!(src.len(), dst.len() * 2);
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
            }
        }
        other => panic!("convert_row: {other:?} is not a plain floating-point type"),
    }
}

/// Bytes of one row of `k` elements of `dtype`; panics if `k` is not a whole number of blocks.
pub(crate) fn row_bytes(dtype: DType, k: usize, what: &str) -> usize {
    match dtype.bytes_for(k as u64) {
        Some(b) => b as usize,
        None => panic!(
            "{what}: a row of {k} elements is not a whole number of {:?} blocks of {}",
            dtype,
            dtype.block_size()
        ),
    }
}
