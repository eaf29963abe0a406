//! The fixed-size header at offset 0 of every plan file, read with zerocopy.
//!
//! Layout (all integers little-endian):
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | magic `EDGEPLAN` |
//! | 8..12 | format version |
//! | 12..16 | header length (256) |
//! | 16..24 / 24..32 | metadata offset / length |
//! | 32..40 / 40..48 | weight region offset / length |
//! | 48..56 | total file length |
//! | 56..88 | BLAKE3 digest of the metadata bytes |
//! | 88..224 | reserved (zero) |
//! | 224..256 | BLAKE3 digest of bytes 0..224 |

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::{Error, Result};

/// `b"EDGEPLAN"`.
pub const MAGIC: [u8; 8] = *b"EDGEPLAN";
/// The plan format version this build reads and writes. Any change to a serialized type bumps it.
pub const FORMAT_VERSION: u32 = 1;
/// Size of [`Header`] in bytes.
pub const HEADER_LEN: usize = 256;
/// Alignment of every tensor inside the weight region, in bytes.
pub const TENSOR_ALIGN: u64 = 64;
/// Alignment of every weight section (segment group) in the file, in bytes.
pub const SECTION_ALIGN: u64 = 4096;

/// The fixed plan header. See the module docs for the byte layout.
#[derive(Clone, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub format_version: U32,
    pub header_len: U32,
    pub meta_offset: U64,
    pub meta_len: U64,
    pub weights_offset: U64,
    pub weights_len: U64,
    pub file_len: U64,
    pub meta_digest: [u8; 32],
    pub reserved: [u8; 136],
    pub header_digest: [u8; 32],
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_LEN);

impl Header {
    /// Reads and checks the header at the start of `file`: magic, version, self-digest, and that
    /// every range lies inside the file. Does not check the metadata digest.
    pub fn read(file: &[u8]) -> Result<Header> {
        let len = file.len() as u64;
        let head = file.get(..HEADER_LEN).ok_or(Error::Truncated {
            what: "header".into(),
            start: 0,
            end: HEADER_LEN as u64,
            len,
        })?;
        let h = Header::read_from_bytes(head).map_err(|_| Error::Invalid("header size".into()))?;
        if h.magic != MAGIC {
            return Err(Error::BadMagic {
                found: h.magic,
                expected: MAGIC,
            });
        }
        if h.format_version.get() != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                found: h.format_version.get(),
                expected: FORMAT_VERSION,
            });
        }
        if h.header_digest != h.compute_digest() {
            return Err(Error::ChecksumMismatch {
                what: "header".into(),
            });
        }
        if h.header_len.get() as usize != HEADER_LEN {
            return Err(Error::Invalid(format!(
                "header length {} (expected {HEADER_LEN})",
                h.header_len.get()
            )));
        }
        if h.file_len.get() != len {
            return Err(Error::Truncated {
                what: "file (header records its length)".into(),
                start: 0,
                end: h.file_len.get(),
                len,
            });
        }
        check_range("metadata", h.meta_offset.get(), h.meta_len.get(), len)?;
        check_range("weight region", h.weights_offset.get(), h.weights_len.get(), len)?;
        if h.weights_offset.get() % SECTION_ALIGN != 0 {
            return Err(Error::Invalid(format!(
                "weight region offset {} is not {SECTION_ALIGN}-aligned",
                h.weights_offset.get()
            )));
        }
        Ok(h)
    }

    /// BLAKE3 of the header bytes before `header_digest`.
    pub fn compute_digest(&self) -> [u8; 32] {
        let bytes = self.as_bytes();
        *blake3::hash(&bytes[..HEADER_LEN - 32]).as_bytes()
    }
}

/// Checks that `offset..offset+len` lies inside a file of `file_len` bytes, with checked arithmetic.
pub fn check_range(what: &str, offset: u64, len: u64, file_len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= file_len => Ok(()),
        end => Err(Error::Truncated {
            what: what.into(),
            start: offset,
            end: end.unwrap_or(u64::MAX),
            len: file_len,
        }),
    }
}
