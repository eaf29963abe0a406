//! The ggml block formats, byte for byte (`ggml/src/ggml-common.h`).
//!
//! A quantized row of `n` elements is `n / BLOCK_SIZE` consecutive blocks. Each struct here is
//! `#[repr(C)]` plain data with the field names, order and size of its ggml twin (`block_q8_0`,
//! `block_q4_K`, …), so a slice of GGUF tensor bytes or plan weight bytes can be viewed as a slice
//! of blocks through zerocopy without copying. Scales are stored as `u16` IEEE half bits, as
//! `ggml_half` is; the values are little-endian (this crate refuses to build on big-endian
//! targets, see the assertion below).
//!
//! Alignment: every weight block has alignment 2 (its `u16` scales) and no padding, so a byte
//! slice that starts at an even address can be viewed as blocks. [`BlockQ8K`] (an activation-only
//! format whose scale is an `f32`) has alignment 4. [`GgmlBlock::slice_from_bytes`] returns
//! `None` for misaligned input; [`GgmlBlock::cow_from_bytes`] copies in that case instead.

use std::borrow::Cow;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::DType;

// Block structs read little-endian file bytes in place.
const _: () = assert!(cfg!(target_endian = "little"));

/// Elements per `block_q4_0`.
pub const QK4_0: usize = 32;
/// Elements per `block_q4_1`.
pub const QK4_1: usize = 32;
/// Elements per `block_q5_0`.
pub const QK5_0: usize = 32;
/// Elements per `block_q5_1`.
pub const QK5_1: usize = 32;
/// Elements per `block_q8_0`.
pub const QK8_0: usize = 32;
/// Elements per `block_q8_1`.
pub const QK8_1: usize = 32;
/// Elements per K-quant super-block (`block_q2_K` … `block_q8_K`).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in `block_q4_K` / `block_q5_K`.
pub const K_SCALE_SIZE: usize = 12;

/// `block_q4_0`: 32 weights `x = d * (q - 8)`, 4-bit `q` (low nibbles hold elements 0..16,
/// high nibbles 16..32). 18 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ4_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Nibbles.
    pub qs: [u8; QK4_0 / 2],
}

/// `block_q4_1`: 32 weights `x = d * q + m`, 4-bit `q`. 20 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ4_1 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Minimum, f16 bits.
    pub m: u16,
    /// Nibbles.
    pub qs: [u8; QK4_1 / 2],
}

/// `block_q5_0`: 32 weights `x = d * (q - 16)`, 5-bit `q` (fifth bits in `qh`, a little-endian
/// u32 whose bit `j` belongs to element `j`). 22 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ5_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Fifth bits of the 32 quants.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK5_0 / 2],
}

/// `block_q5_1`: 32 weights `x = d * q + m`, 5-bit `q`. 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ5_1 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Minimum, f16 bits.
    pub m: u16,
    /// Fifth bits of the 32 quants.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK5_1 / 2],
}

/// `block_q8_0`: 32 values `x = d * q`, `q` in -127..=127. 34 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Quants.
    pub qs: [i8; QK8_0],
}

/// `block_q8_1`: the activation format paired with Q4_1 / Q5_1; `s = d * sum(qs)`. 36 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ8_1 {
    /// Scale, f16 bits.
    pub d: u16,
    /// `d * sum(qs)`, f16 bits.
    pub s: u16,
    /// Quants.
    pub qs: [i8; QK8_1],
}

/// `block_q2_K`: 256 weights in 16 groups of 16, `x = d * sc * q - dmin * m` with 2-bit `q`
/// and 4-bit `sc` (low nibble of `scales[g]`) / `m` (high nibble). 84 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ2K {
    /// Per-group scale (low nibble) and min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales, f16 bits.
    pub d: u16,
    /// Super-block scale for the mins, f16 bits.
    pub dmin: u16,
}

/// `block_q3_K`: 256 weights in 16 groups of 16, `x = d * (sc - 32) * (q - 4)` with 3-bit `q`
/// (low 2 bits in `qs`, high bit in `hmask`) and 6-bit `sc` packed into 12 bytes. 110 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ3K {
    /// High bits of the quants.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants.
    pub qs: [u8; QK_K / 4],
    /// 16 six-bit scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale, f16 bits.
    pub d: u16,
}

/// `block_q4_K`: 256 weights in 8 groups of 32, `x = d * sc * q - dmin * m` with 4-bit `q`
/// and 6-bit `sc`, `m` packed into 12 bytes. 144 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ4K {
    /// Super-block scale for the scales, f16 bits.
    pub d: u16,
    /// Super-block scale for the mins, f16 bits.
    pub dmin: u16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}

/// `block_q5_K`: as [`BlockQ4K`] with a fifth bit per quant in `qh`. 176 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ5K {
    /// Super-block scale for the scales, f16 bits.
    pub d: u16,
    /// Super-block scale for the mins, f16 bits.
    pub dmin: u16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits of the quants.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits of the quants.
    pub qs: [u8; QK_K / 2],
}

/// `block_q6_K`: 256 weights in 16 groups of 16, `x = d * sc * (q - 32)` with 6-bit `q` and
/// signed 8-bit `sc`. 210 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Per-group scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale, f16 bits.
    pub d: u16,
}

/// `block_q8_K`: the activation format paired with the K-quants; `x = d * q`,
/// `bsums[g] = sum(qs[16g..16g+16])`. 292 bytes, alignment 4 (the scale is an `f32`).
#[derive(Clone, Copy, Debug, PartialEq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockQ8K {
    /// Scale (f32, not f16).
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sums of the quants in groups of 16.
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(core::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(core::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(core::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(core::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(core::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(core::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(core::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(core::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(core::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(core::mem::size_of::<BlockQ8K>() == 292);
const _: () = assert!(core::mem::align_of::<BlockQ4_0>() == 2);
const _: () = assert!(core::mem::align_of::<BlockQ6K>() == 2);
const _: () = assert!(core::mem::align_of::<BlockQ8K>() == 4);

/// A ggml block type: its element count, byte size and the zero-copy views of byte slices.
///
/// Implemented by every struct of this module. The provided methods are the only place where
/// bytes become blocks, so crates that use blocks need not depend on zerocopy themselves.
pub trait GgmlBlock: FromBytes + IntoBytes + KnownLayout + Immutable + Copy {
    /// Elements per block (`QK…`).
    const BLOCK_SIZE: usize;
    /// Bytes per block (ggml `type_size`), equal to `size_of::<Self>()`.
    const TYPE_SIZE: usize = core::mem::size_of::<Self>();
    /// The plan dtype stored with this block, or `None` for the activation-only formats
    /// (`Q8_1`, `Q8_K`).
    const DTYPE: Option<DType>;
    /// ggml's type name (`q8_0`, `q4_K`, …).
    const NAME: &'static str;

    /// An all-zero block.
    fn zeroed() -> Self {
        Self::new_zeroed()
    }

    /// Views `bytes` as blocks without copying. `None` when `bytes.len()` is not a multiple of
    /// [`Self::TYPE_SIZE`] or `bytes` is not aligned to `align_of::<Self>()`.
    fn slice_from_bytes(bytes: &[u8]) -> Option<&[Self]> {
        <[Self]>::ref_from_bytes(bytes).ok()
    }

    /// Mutable twin of [`GgmlBlock::slice_from_bytes`].
    fn slice_from_bytes_mut(bytes: &mut [u8]) -> Option<&mut [Self]> {
        <[Self]>::mut_from_bytes(bytes).ok()
    }

    /// Views `bytes` as blocks, borrowing when `bytes` is aligned and copying block by block
    /// otherwise. `None` when `bytes.len()` is not a multiple of [`Self::TYPE_SIZE`].
    fn cow_from_bytes(bytes: &[u8]) -> Option<Cow<'_, [Self]>> {
        if !bytes.len().is_multiple_of(Self::TYPE_SIZE) {
            return None;
        }
        if let Some(s) = Self::slice_from_bytes(bytes) {
            return Some(Cow::Borrowed(s));
        }
        bytes
            .chunks_exact(Self::TYPE_SIZE)
            .map(|c| Self::read_from_bytes(c).ok())
            .collect::<Option<Vec<Self>>>()
            .map(Cow::Owned)
    }

    /// Copies block `i` out of `bytes` (any alignment); `None` when it lies past the end.
    fn read_at(bytes: &[u8], i: usize) -> Option<Self> {
        let start = i.checked_mul(Self::TYPE_SIZE)?;
        let end = start.checked_add(Self::TYPE_SIZE)?;
        Self::read_from_bytes(bytes.get(start..end)?).ok()
    }

    /// The bytes of a block slice (the layout that files and plans store).
    fn slice_as_bytes(blocks: &[Self]) -> &[u8] {
        blocks.as_bytes()
    }

    /// Mutable twin of [`GgmlBlock::slice_as_bytes`].
    fn slice_as_bytes_mut(blocks: &mut [Self]) -> &mut [u8] {
        blocks.as_mut_bytes()
    }
}

macro_rules! impl_block {
    ($t:ty, $bs:expr, $dt:expr, $name:expr) => {
        impl GgmlBlock for $t {
            const BLOCK_SIZE: usize = $bs;
            const DTYPE: Option<DType> = $dt;
            const NAME: &'static str = $name;
        }
    };
}

impl_block!(BlockQ4_0, QK4_0, Some(DType::Q4_0), "q4_0");
impl_block!(BlockQ4_1, QK4_1, Some(DType::Q4_1), "q4_1");
impl_block!(BlockQ5_0, QK5_0, Some(DType::Q5_0), "q5_0");
impl_block!(BlockQ5_1, QK5_1, Some(DType::Q5_1), "q5_1");
impl_block!(BlockQ8_0, QK8_0, Some(DType::Q8_0), "q8_0");
impl_block!(BlockQ8_1, QK8_1, None, "q8_1");
impl_block!(BlockQ2K, QK_K, Some(DType::Q2K), "q2_K");
impl_block!(BlockQ3K, QK_K, Some(DType::Q3K), "q3_K");
impl_block!(BlockQ4K, QK_K, Some(DType::Q4K), "q4_K");
impl_block!(BlockQ5K, QK_K, Some(DType::Q5K), "q5_K");
impl_block!(BlockQ6K, QK_K, Some(DType::Q6K), "q6_K");
impl_block!(BlockQ8K, QK_K, None, "q8_K");

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn check<B: GgmlBlock>() {
        if let Some(dt) = B::DTYPE {
            assert_eq!(dt.block_size(), B::BLOCK_SIZE, "{}", B::NAME);
            assert_eq!(dt.type_size(), B::TYPE_SIZE, "{}", B::NAME);
            assert_eq!(dt.type_size(), core::mem::size_of::<B>(), "{}", B::NAME);
            assert_eq!(dt.name(), B::NAME.to_ascii_lowercase());
            assert!(core::mem::align_of::<B>() <= 2, "{}", B::NAME);
        }
    }

    #[test]
    fn sizes_agree_with_dtype() {
        check::<BlockQ4_0>();
        check::<BlockQ4_1>();
        check::<BlockQ5_0>();
        check::<BlockQ5_1>();
        check::<BlockQ8_0>();
        check::<BlockQ8_1>();
        check::<BlockQ2K>();
        check::<BlockQ3K>();
        check::<BlockQ4K>();
        check::<BlockQ5K>();
        check::<BlockQ6K>();
        check::<BlockQ8K>();
        for dt in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
            let covered = [
                BlockQ4_0::DTYPE,
                BlockQ4_1::DTYPE,
                BlockQ5_0::DTYPE,
                BlockQ5_1::DTYPE,
                BlockQ8_0::DTYPE,
                BlockQ2K::DTYPE,
                BlockQ3K::DTYPE,
                BlockQ4K::DTYPE,
                BlockQ5K::DTYPE,
                BlockQ6K::DTYPE,
            ];
            assert!(covered.contains(&Some(dt)), "{dt} has no block struct");
        }
    }

    /// ggml field offsets (`ggml-common.h`): the f16 scale sits at the end for Q2_K/Q3_K/Q6_K.
    #[test]
    fn field_offsets() {
        let mut b = BlockQ6K::zeroed();
        b.d = 0x1234;
        assert_eq!(&b.as_bytes()[208..210], &[0x34, 0x12]);
        let mut b = BlockQ2K::zeroed();
        b.d = 0x0102;
        b.dmin = 0x0304;
        assert_eq!(&b.as_bytes()[80..84], &[2, 1, 4, 3]);
        let mut b = BlockQ3K::zeroed();
        b.d = 0xabcd;
        assert_eq!(&b.as_bytes()[108..110], &[0xcd, 0xab]);
        let mut b = BlockQ5_0::zeroed();
        b.qh = [9, 8, 7, 6];
        assert_eq!(&b.as_bytes()[2..6], &[9, 8, 7, 6]);
        let mut b = BlockQ8K::zeroed();
        b.bsums[0] = -2;
        assert_eq!(&b.as_bytes()[260..262], &(-2i16).to_le_bytes());
    }

    #[test]
    fn views_at_even_offsets_and_copies_otherwise() {
        // A u64 buffer is 8-aligned; offset 2 is 2-aligned but not 4-aligned.
        let words = [0x0706_0504_0302_0100u64; 40];
        let bytes = words.as_bytes();
        let at2 = &bytes[2..2 + 2 * 34];
        let Some(v) = BlockQ8_0::slice_from_bytes(at2) else {
            panic!("no view of 2-aligned bytes");
        };
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].d, u16::from_le_bytes([2, 3]));
        let at1 = &bytes[1..1 + 2 * 34];
        assert!(BlockQ8_0::slice_from_bytes(at1).is_none());
        let Some(c) = BlockQ8_0::cow_from_bytes(at1) else {
            panic!("no copy of misaligned bytes");
        };
        assert!(matches!(c, Cow::Owned(_)));
        assert_eq!(c[1].d, u16::from_le_bytes([bytes[35], bytes[36]]));
        assert_eq!(BlockQ8_0::read_at(at1, 1), Some(c[1]));
        assert_eq!(BlockQ8_0::read_at(at1, 2), None);
        assert!(BlockQ8_0::cow_from_bytes(&bytes[..33]).is_none());
        // Q8_K needs 4-byte alignment.
        let at2 = &bytes[2..2 + 292];
        assert!(BlockQ8K::slice_from_bytes(at2).is_none());
        assert!(BlockQ8K::cow_from_bytes(at2).is_some());
    }
}
