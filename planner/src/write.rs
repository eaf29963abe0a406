//! Writing a plan file: the fixed header, page-aligned weight sections (each segment's
//! weights contiguous, every tensor 64-byte aligned) with their BLAKE3 digests, then the
//! postcard metadata. The metadata sits after the weights so that weights can be streamed to
//! disk before the metadata (which records their digests) is known. Writes are atomic: a
//! temporary file next to the target is renamed over it only once complete.

use std::path::Path;

use edge_schema::header::{Header, FORMAT_VERSION, HEADER_LEN, MAGIC, SECTION_ALIGN, TENSOR_ALIGN};
use edge_schema::plan::{PlanMeta, SectionEntry};
use zerocopy::IntoBytes;

use crate::error::{PlanError, Result};
use crate::lower::TensorTable;

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Lays out `table`'s sections, fills `meta.tensors` and `meta.sections`, and returns the
/// complete plan file bytes.
pub fn assemble(meta: &mut PlanMeta, table: &TensorTable) -> Result<Vec<u8>> {
    let weights_offset = align_up(HEADER_LEN as u64, SECTION_ALIGN);
    let mut weights: Vec<u8> = Vec::new();
    let mut entries = table.entries.clone();
    let mut sections = Vec::with_capacity(table.sections.len());
    for ids in &table.sections {
        let start = align_up(weights.len() as u64, SECTION_ALIGN);
        weights.resize(start as usize, 0);
        for &t in ids {
            let off = align_up(weights.len() as u64, TENSOR_ALIGN);
            weights.resize(off as usize, 0);
            entries[t as usize].offset = off - start;
            weights.extend_from_slice(&table.data[t as usize]);
        }
        let end = weights.len() as u64;
        sections.push(SectionEntry {
            offset: start,
            len: end - start,
            digest: *blake3::hash(&weights[start as usize..]).as_bytes(),
        });
    }
    let weights_len = align_up(weights.len() as u64, SECTION_ALIGN);
    weights.resize(weights_len as usize, 0);
    meta.tensors = entries;
    meta.sections = sections;
    edge_schema::verify::verify_meta(meta, weights_len)?;
    let meta_bytes = meta.encode()?;
    let meta_offset = weights_offset + weights_len;
    let file_len = meta_offset + meta_bytes.len() as u64;
    let mut header = Header {
        magic: MAGIC,
        format_version: FORMAT_VERSION.into(),
        header_len: (HEADER_LEN as u32).into(),
        meta_offset: meta_offset.into(),
        meta_len: (meta_bytes.len() as u64).into(),
        weights_offset: weights_offset.into(),
        weights_len: weights_len.into(),
        file_len: file_len.into(),
        meta_digest: *blake3::hash(&meta_bytes).as_bytes(),
        reserved: [0; 136],
        header_digest: [0; 32],
    };
    header.header_digest = header.compute_digest();
    let mut out = Vec::with_capacity(file_len as usize);
    out.extend_from_slice(header.as_bytes());
    out.resize(weights_offset as usize, 0);
    out.extend_from_slice(&weights);
    out.extend_from_slice(&meta_bytes);
    Ok(out)
}

/// Writes `bytes` to `path` with [`edge_schema::io::write_atomic`]: never a partial plan, a
/// symbolic link followed, a device, pipe or directory refused.
///
/// # Errors
/// [`PlanError::Write`] naming `path` when the folder is not writable, the disk is full or
/// `path` is not a regular file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    edge_schema::io::write_atomic(path, bytes).map_err(|source| PlanError::Write {
        path: path.display().to_string(),
        source,
    })
}
