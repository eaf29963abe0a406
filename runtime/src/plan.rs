//! Opening a plan: map (or take) the bytes, verify header, metadata and sections, and hand out
//! zero-copy views of packed weights.
//!
//! # Safety of the mapping
//!
//! [`Plan::open`] memory-maps the file read-only. As with any `mmap`, the file must not be
//! modified or truncated by another process while the plan is open: the verification done at
//! open time cannot protect against bytes changing underneath it. [`Plan::from_bytes`] is the
//! safe alternative (tests, embedded use): it owns an aligned copy.

use std::path::Path;

use edge_schema::header::{Header, HEADER_LEN};
use edge_schema::plan::PlanMeta;
use edge_schema::verify;
use zerocopy::IntoBytes;

use crate::error::{Error, Result};

enum Bytes {
    Mapped(memmap2::Mmap),
    /// Owned bytes in a `u64` buffer so that the base is 8-aligned (weights need 4).
    Owned { words: Vec<u64>, len: usize },
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned { words, len } => &words.as_bytes()[..*len],
        }
    }
}

/// A verified plan: its metadata and its weight bytes.
pub struct Plan {
    bytes: Bytes,
    meta: PlanMeta,
    weights_offset: usize,
    weights_len: usize,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("bytes", &self.bytes.as_slice().len())
            .field("stages", &self.meta.stages.len())
            .finish()
    }
}

/// Maps `file` read-only.
#[allow(unsafe_code)]
fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and private to this process; the documented contract of
    // `Plan::open` is that the file is not modified while the plan is open (memmap2's rule for
    // `Mmap::map`). Every byte is verified before use.
    unsafe { memmap2::Mmap::map(file) }
}

/// Checks that every byte no digest covers (outside the header, the metadata and the weight
/// sections: alignment padding) is zero, so that a flipped byte anywhere in the file is refused.
/// Ranges were checked against the file length by [`Header::read`] and [`verify::verify_meta`].
fn check_padding(file: &[u8], h: &Header, meta: &PlanMeta) -> Result<()> {
    let w0 = h.weights_offset.get() as usize;
    let meta0 = h.meta_offset.get() as usize;
    let mut covered: Vec<(usize, usize)> = vec![
        (0, HEADER_LEN.min(file.len())),
        (meta0, meta0 + h.meta_len.get() as usize),
    ];
    covered.extend(
        meta.sections
            .iter()
            .map(|s| (w0 + s.offset as usize, w0 + (s.offset + s.len) as usize)),
    );
    covered.sort_unstable();
    let mut pos = 0;
    for (start, end) in covered.into_iter().chain([(file.len(), file.len())]) {
        if start > pos {
            if let Some(k) = file[pos..start].iter().position(|&b| b != 0) {
                return Err(edge_schema::Error::Invalid(format!(
                    "padding byte {} is {:#04x}, expected zero (the file is corrupted)",
                    pos + k,
                    file[pos + k]
                ))
                .into());
            }
        }
        pos = pos.max(end);
    }
    Ok(())
}

impl Plan {
    /// Opens and fully verifies the plan at `path` (see the module docs for the mapping
    /// contract). Errors name the file and what is wrong with it.
    pub fn open(path: &Path) -> Result<Plan> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let map = map_file(&file).map_err(io)?;
        Plan::verify(Bytes::Mapped(map)).map_err(|e| e.in_file(path))
    }

    /// Verifies and takes ownership of plan bytes (copied into an aligned buffer).
    pub fn from_bytes(bytes: &[u8]) -> Result<Plan> {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        words.as_mut_bytes()[..bytes.len()].copy_from_slice(bytes);
        Plan::verify(Bytes::Owned {
            words,
            len: bytes.len(),
        })
    }

    fn verify(bytes: Bytes) -> Result<Plan> {
        let file = bytes.as_slice();
        let h = Header::read(file)?;
        let meta_start = h.meta_offset.get() as usize;
        let meta_bytes = &file[meta_start..meta_start + h.meta_len.get() as usize];
        if blake3::hash(meta_bytes).as_bytes() != &h.meta_digest {
            return Err(edge_schema::Error::ChecksumMismatch {
                what: "metadata".into(),
            }
            .into());
        }
        let meta = PlanMeta::decode(meta_bytes)?;
        let weights_len = h.weights_len.get();
        verify::verify_meta(&meta, weights_len)?;
        let weights_offset = h.weights_offset.get() as usize;
        let weights = &file[weights_offset..weights_offset + weights_len as usize];
        for (i, s) in meta.sections.iter().enumerate() {
            let sec = &weights[s.offset as usize..(s.offset + s.len) as usize];
            verify::verify_section_digest(&meta, i, sec)?;
        }
        check_padding(file, &h, &meta)?;
        Ok(Plan {
            weights_offset,
            weights_len: weights_len as usize,
            meta,
            bytes,
        })
    }

    /// The verified metadata.
    pub fn meta(&self) -> &PlanMeta {
        &self.meta
    }

    /// The packed bytes of tensor `t` (verified in range at open; 64-byte aligned in the file).
    pub fn tensor_bytes(&self, t: u32) -> &[u8] {
        let e = &self.meta.tensors[t as usize];
        let s = &self.meta.sections[e.section as usize];
        let start = self.weights_offset + (s.offset + e.offset) as usize;
        let weights_end = self.weights_offset + self.weights_len;
        &self.bytes.as_slice()[start..(start + e.len as usize).min(weights_end)]
    }

    /// The whole file's length in bytes.
    pub fn file_len(&self) -> usize {
        self.bytes.as_slice().len()
    }
}
