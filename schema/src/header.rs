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
//! | 88..224 | signature block (all zero in an unsigned plan), see below |
//! | 224..256 | BLAKE3 digest of bytes 0..224 |
//!
//! The file is the header, zero padding up to [`SECTION_ALIGN`], the weight region (sections,
//! each [`SECTION_ALIGN`]-aligned, zero padding between them), then the postcard metadata; the
//! header's file length covers every byte. Each section's BLAKE3 digest is in the metadata and
//! the metadata's digest is in the header, so the header digest transitively covers every
//! byte except padding, which readers require to be zero.
//!
//! # Signed plans
//!
//! A signed plan carries an Ed25519 signature (RFC 8032, as implemented by `ed25519-dalek`) in
//! the header's former reserved bytes; no byte is appended, so the layout and
//! [`FORMAT_VERSION`] are unchanged:
//!
//! | bytes | field |
//! | --- | --- |
//! | 88..92 | [`SIGNATURE_MAGIC`] `SIGN` (zero when unsigned) |
//! | 92..96 | zero |
//! | 96..128 | Ed25519 public key of the signer |
//! | 128..192 | Ed25519 signature |
//! | 192..224 | zero |
//!
//! The signed message is [`SIGNATURE_DOMAIN`] followed by header bytes 0..224 with the
//! signature bytes 128..192 set to zero ([`Header::signed_message`]): it covers the magic,
//! version, every offset and length, the file length, the metadata digest (and through it the
//! section digests, hence every weight byte) and the signer's public key. The header digest
//! (bytes 224..256) is computed *after* signing, over bytes 0..224 including the signature, so
//! a reader that does not check signatures still detects any flipped signature bit, and a
//! signed plan stays readable by readers that predate signing. Which keys are trusted is the
//! reader's decision (`edgerun generate --trusted-key`); the embedded public key only says who
//! claims to have signed.
//!
//! Key files ([`decode_key`]): 32 bytes, either raw or as 64 hexadecimal digits (surrounding
//! whitespace ignored). `edgeplan keygen` writes hex: the secret 32-byte Ed25519 seed to
//! `KEY` after [`SECRET_LABEL`], and the public key to `KEY.pub` (bare digits; a reader also
//! accepts them after [`PUBLIC_LABEL`]). The labels let each side refuse the other's file;
//! after a label only the 64 digits are read ([`decode_hex_key`]), never 32 raw bytes.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::{Error, Result};

/// `b"EDGEPLAN"`.
pub const MAGIC: [u8; 8] = *b"EDGEPLAN";
/// The plan format version this build reads and writes. Any change to a serialized type bumps it.
pub const FORMAT_VERSION: u32 = 14;
/// Size of [`Header`] in bytes.
pub const HEADER_LEN: usize = 256;
/// Alignment of every tensor inside the weight region, in bytes.
pub const TENSOR_ALIGN: u64 = 64;
/// Alignment of every weight section (segment group) in the file, in bytes.
pub const SECTION_ALIGN: u64 = 4096;

/// Marker at header bytes 88..92 of a signed plan.
pub const SIGNATURE_MAGIC: [u8; 4] = *b"SIGN";
/// Domain-separation prefix of the signed message ([`Header::signed_message`]).
pub const SIGNATURE_DOMAIN: &[u8] = b"EDGEPLAN signature v1\0";
/// Byte range of [`SIGNATURE_MAGIC`] inside [`Header::reserved`] (file bytes 88..92).
const SIG_MAGIC_AT: core::ops::Range<usize> = 0..4;
/// Byte range of the public key inside [`Header::reserved`] (file bytes 96..128).
const SIG_KEY_AT: core::ops::Range<usize> = 8..40;
/// Byte range of the signature inside [`Header::reserved`] (file bytes 128..192).
const SIG_AT: core::ops::Range<usize> = 40..104;
/// Offset of [`Header::reserved`] in the header.
const RESERVED_OFFSET: usize = 88;

/// The signature block of a signed plan (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureBlock {
    /// The signer's Ed25519 public key (32 bytes, RFC 8032 encoding).
    pub public_key: [u8; 32],
    /// The Ed25519 signature over [`Header::signed_message`] (64 bytes).
    pub signature: [u8; 64],
}

/// The first bytes of a secret key file `edgeplan keygen` writes, before the seed's 64 hex
/// digits.
pub const SECRET_LABEL: &str = "edgediff-ed25519-secret-key ";
/// The first bytes a public key file may carry before its 64 hex digits (`keygen` writes the
/// bare digits, which every release reads).
pub const PUBLIC_LABEL: &str = "edgediff-ed25519-public-key ";

/// Longest key file read: a labelled hex key with whitespace is under 200 bytes.
pub const KEY_FILE_MAX: u64 = 4096;

/// Reads a key file: it must be a regular file (a FIFO would block, a device such as
/// `/dev/zero` would never end) of at most [`KEY_FILE_MAX`] bytes. Errors: the file's own I/O
/// errors, or `InvalidData` saying which of the two it is not.
pub fn read_key_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    if !std::fs::metadata(path)?.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(KEY_FILE_MAX + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > KEY_FILE_MAX {
        return Err(bad(format!(
            "longer than {KEY_FILE_MAX} bytes: not a key file"
        )));
    }
    Ok(bytes)
}

/// Parses a key file's contents: exactly 32 raw bytes, or 64 hexadecimal digits with optional
/// surrounding whitespace ([`decode_hex_key`]). `None` for anything else.
pub fn decode_key(bytes: &[u8]) -> Option<[u8; 32]> {
    decode_hex_key(bytes).or_else(|| <[u8; 32]>::try_from(bytes).ok())
}

/// 64 hexadecimal digits with optional surrounding whitespace, as 32 bytes; `None` for anything
/// else. What follows a key file's label ([`SECRET_LABEL`], [`PUBLIC_LABEL`]) must be this: a
/// labelled file cut short (32 hex digits are 32 bytes too) must not read as a raw key.
pub fn decode_hex_key(bytes: &[u8]) -> Option<[u8; 32]> {
    let t = core::str::from_utf8(bytes).ok()?.trim();
    if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(t.as_bytes().chunks_exact(2)) {
        *o = u8::from_str_radix(core::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Lower-case hexadecimal of `bytes` (the key file format [`decode_key`] reads).
pub fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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
    /// The signature block (all zero when unsigned); see the module docs and
    /// [`Header::signature_block`].
    pub reserved: [u8; 136],
    pub header_digest: [u8; 32],
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_LEN);

impl Header {
    /// Reads and checks the header at the start of `file`: magic, version, self-digest, and that
    /// every range lies inside the file. Does not check the metadata digest.
    pub fn read(file: &[u8]) -> Result<Header> {
        let len = file.len() as u64;
        // The magic first: a short file that does not start with it is not a plan at all (a
        // text file given by mistake), which says more than "truncated".
        if let Some(found) = file.first_chunk::<8>().filter(|m| **m != MAGIC) {
            return Err(Error::BadMagic {
                found: *found,
                expected: MAGIC,
            });
        }
        if file.is_empty() {
            return Err(Error::Invalid(
                "not a plan file: the file is empty (a plan starts with \"EDGEPLAN\")".into(),
            ));
        }
        if file.len() < MAGIC.len() && !MAGIC.starts_with(file) {
            return Err(Error::Invalid(format!(
                "not a plan file: its {} bytes are not the start of \"EDGEPLAN\"",
                file.len()
            )));
        }
        let head = file.get(..HEADER_LEN).ok_or(Error::Truncated {
            what: "header".into(),
            start: 0,
            end: HEADER_LEN as u64,
            len,
        })?;
        let h = Header::read_from_bytes(head).map_err(|_| Error::Invalid("header size".into()))?;
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
        h.signature_block()?;
        if h.header_len.get() as usize != HEADER_LEN {
            return Err(Error::Invalid(format!(
                "header length {} (expected {HEADER_LEN})",
                h.header_len.get()
            )));
        }
        if h.file_len.get() > len {
            return Err(Error::Truncated {
                what: "file (header records its length)".into(),
                start: 0,
                end: h.file_len.get(),
                len,
            });
        }
        if h.file_len.get() < len {
            return Err(Error::Invalid(format!(
                "the header records a file of {} bytes but the file has {len}: {} trailing bytes \
                 (appended to, or not a whole plan)",
                h.file_len.get(),
                len - h.file_len.get()
            )));
        }
        check_range("metadata", h.meta_offset.get(), h.meta_len.get(), len)?;
        check_range(
            "weight region",
            h.weights_offset.get(),
            h.weights_len.get(),
            len,
        )?;
        if h.weights_offset.get() % SECTION_ALIGN != 0 {
            return Err(Error::Invalid(format!(
                "weight region offset {} is not {SECTION_ALIGN}-aligned",
                h.weights_offset.get()
            )));
        }
        Ok(h)
    }

    /// The signature block: `Ok(None)` for an unsigned plan (all reserved bytes zero),
    /// `Ok(Some(_))` for a signed one. Errors when the reserved bytes are neither (a marker
    /// other than [`SIGNATURE_MAGIC`], or non-zero bytes outside the key and signature).
    /// Does not verify the signature (the runtime's `sign` module does).
    pub fn signature_block(&self) -> Result<Option<SignatureBlock>> {
        let r = &self.reserved;
        if r.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        if r[SIG_MAGIC_AT] != SIGNATURE_MAGIC {
            return Err(Error::Invalid(format!(
                "header bytes 88..92 are {:?}, expected zero (unsigned) or the signature marker {:?}",
                &r[SIG_MAGIC_AT],
                SIGNATURE_MAGIC
            )));
        }
        let stray = r
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                !SIG_MAGIC_AT.contains(i) && !SIG_KEY_AT.contains(i) && !SIG_AT.contains(i)
            })
            .find(|(_, &b)| b != 0);
        if let Some((i, b)) = stray {
            return Err(Error::Invalid(format!(
                "header byte {} of the signature block is {b:#04x}, expected zero",
                RESERVED_OFFSET + i
            )));
        }
        let mut block = SignatureBlock {
            public_key: [0; 32],
            signature: [0; 64],
        };
        block.public_key.copy_from_slice(&r[SIG_KEY_AT]);
        block.signature.copy_from_slice(&r[SIG_AT]);
        Ok(Some(block))
    }

    /// Stores `block` in the reserved bytes (marker, key, signature) and recomputes
    /// `header_digest`. The caller computes the signature over [`Header::signed_message`]
    /// after setting the key (see the planner's `sign` module).
    pub fn set_signature_block(&mut self, block: &SignatureBlock) {
        self.reserved = [0; 136];
        self.reserved[SIG_MAGIC_AT].copy_from_slice(&SIGNATURE_MAGIC);
        self.reserved[SIG_KEY_AT].copy_from_slice(&block.public_key);
        self.reserved[SIG_AT].copy_from_slice(&block.signature);
        self.header_digest = self.compute_digest();
    }

    /// The message an Ed25519 signature covers: [`SIGNATURE_DOMAIN`], then header bytes
    /// 0..224 with the signature bytes (128..192) zeroed. The marker and the public key are
    /// included, so they cannot be swapped without invalidating the signature.
    pub fn signed_message(&self) -> Vec<u8> {
        let mut msg = Vec::with_capacity(SIGNATURE_DOMAIN.len() + HEADER_LEN - 32);
        msg.extend_from_slice(SIGNATURE_DOMAIN);
        let start = msg.len();
        msg.extend_from_slice(&self.as_bytes()[..HEADER_LEN - 32]);
        let sig = start + RESERVED_OFFSET + SIG_AT.start..start + RESERVED_OFFSET + SIG_AT.end;
        msg[sig].fill(0);
        msg
    }

    /// The header's 256 bytes as written at the start of a plan file.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(self.as_bytes());
        out
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn header() -> Header {
        let mut h = Header::read_from_bytes(&[0u8; HEADER_LEN]).unwrap();
        h.magic = MAGIC;
        h.format_version = FORMAT_VERSION.into();
        h.header_len = (HEADER_LEN as u32).into();
        h.file_len = (HEADER_LEN as u64).into();
        h.header_digest = h.compute_digest();
        h
    }

    #[test]
    fn a_short_file_without_the_magic_is_not_a_plan() {
        let text = b"hello, this is a text file and not a plan\n";
        let e = Header::read(text).unwrap_err();
        assert!(
            matches!(e, Error::BadMagic { .. }),
            "{e} (a text file shorter than the header)"
        );
        assert!(e.to_string().contains("\"hello, t\""), "{e}");
        // A short file that starts like a plan is one cut short.
        let mut cut = MAGIC.to_vec();
        cut.extend_from_slice(&[0; 40]);
        let e = Header::read(&cut).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "{e}");
        // Shorter than the magic: a start of it is a plan cut short, anything else (or
        // nothing) is not a plan.
        assert!(matches!(
            Header::read(b"EDGE").unwrap_err(),
            Error::Truncated { .. }
        ));
        for short in [&b""[..], b"hello!!"] {
            let e = Header::read(short).unwrap_err().to_string();
            assert!(
                e.contains("not a plan file") && e.contains("EDGEPLAN"),
                "{e}"
            );
        }
    }

    #[test]
    fn decode_key_reads_hex_and_raw() {
        let hex = "00ff".repeat(16);
        let want: Vec<u8> = (0..32).map(|i| if i % 2 == 0 { 0 } else { 0xff }).collect();
        assert_eq!(
            decode_key(format!("  {hex}\n").as_bytes())
                .unwrap()
                .to_vec(),
            want
        );
        assert_eq!(
            decode_key(hex.to_uppercase().as_bytes()).unwrap().to_vec(),
            want
        );
        assert_eq!(encode_hex(&want), hex);
        assert_eq!(decode_key(&[7u8; 32]), Some([7u8; 32]));
        // 32 hex digits are 32 bytes: a raw key, but never a labelled file's hex key.
        let half = "ab".repeat(16);
        assert_eq!(
            decode_key(half.as_bytes()),
            Some([b'a', b'b'].repeat(16).try_into().unwrap())
        );
        assert_eq!(decode_hex_key(half.as_bytes()), None);
        assert_eq!(
            decode_hex_key(format!(" {hex}\n").as_bytes()).map(|k| k.to_vec()),
            decode_key(hex.as_bytes()).map(|k| k.to_vec())
        );
        assert_eq!(decode_key(&[7u8; 31]), None);
        assert_eq!(decode_key("zz".repeat(32).as_bytes()), None);
        assert_eq!(decode_key("+1".repeat(32).as_bytes()), None);
    }

    #[test]
    fn signature_block_round_trips_at_documented_offsets() {
        let mut h = header();
        assert_eq!(h.signature_block().unwrap(), None);
        let block = SignatureBlock {
            public_key: [0xaa; 32],
            signature: [0xbb; 64],
        };
        h.set_signature_block(&block);
        let b = h.to_bytes();
        assert_eq!(&b[88..92], b"SIGN");
        assert_eq!(&b[92..96], &[0; 4]);
        assert_eq!(&b[96..128], &[0xaa; 32]);
        assert_eq!(&b[128..192], &[0xbb; 64]);
        assert_eq!(&b[192..224], &[0; 32]);
        let read = Header::read(&b).unwrap();
        assert_eq!(read.signature_block().unwrap(), Some(block));
        // The signed message zeroes the signature only.
        let msg = read.signed_message();
        let body = &msg[SIGNATURE_DOMAIN.len()..];
        assert_eq!(body.len(), 224);
        assert_eq!(&body[128..192], &[0; 64]);
        assert_eq!(&body[96..128], &[0xaa; 32]);
    }

    #[test]
    fn malformed_signature_blocks_are_refused() {
        for (at, value) in [(88, b'X'), (93, 1), (200, 1)] {
            let mut h = header();
            h.set_signature_block(&SignatureBlock {
                public_key: [1; 32],
                signature: [2; 64],
            });
            h.reserved[at - 88] = value;
            h.header_digest = h.compute_digest();
            let err = Header::read(&h.to_bytes()).unwrap_err();
            assert!(matches!(err, Error::Invalid(_)), "byte {at}: {err}");
        }
        // Non-zero bytes with no marker at all.
        let mut h = header();
        h.reserved[100] = 1;
        h.header_digest = h.compute_digest();
        assert!(Header::read(&h.to_bytes()).is_err());
    }
}
