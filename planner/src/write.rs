//! Writing a plan file: the fixed header, page-aligned weight sections (each segment's
//! weights contiguous, every tensor 64-byte aligned) with their BLAKE3 digests, then the
//! postcard metadata. The metadata sits after the weights so that weights can be streamed to
//! disk before the metadata (which records their digests) is known. Writes are atomic: a
//! temporary file next to the target is renamed over it only once complete.

use std::io::Write;
use std::path::Path;

use edge_schema::header::{Header, FORMAT_VERSION, HEADER_LEN, MAGIC, SECTION_ALIGN, TENSOR_ALIGN};
use edge_schema::plan::{PlanMeta, SectionEntry};
use zerocopy::IntoBytes;

use crate::error::{PlanError, Result};
use crate::lower::TensorTable;

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Zero bytes for padding.
const ZEROS: [u8; 4096] = [0; 4096];

/// Writes `n` zero bytes to `out`.
fn pad(out: &mut dyn Write, mut n: u64) -> std::io::Result<()> {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// A laid-out plan: everything but the weight bytes, which stay in the [`TensorTable`].
struct Layout {
    header: Header,
    meta_bytes: Vec<u8>,
}

/// Lays out `table`'s sections (offsets relative to the weight region, each section
/// page-aligned, each tensor 64-byte aligned), hashes each section as it would be written,
/// fills `meta.tensors` and `meta.sections`, verifies and encodes the metadata and builds the
/// header. Reads the weight bytes once; copies none.
fn lay_out(meta: &mut PlanMeta, table: &TensorTable) -> Result<Layout> {
    let weights_offset = align_up(HEADER_LEN as u64, SECTION_ALIGN);
    let mut entries = table.entries.clone();
    let mut sections = Vec::with_capacity(table.sections.len());
    let mut pos = 0u64;
    for ids in &table.sections {
        let start = align_up(pos, SECTION_ALIGN);
        pos = start;
        let mut hasher = blake3::Hasher::new();
        for &t in ids {
            let off = align_up(pos, TENSOR_ALIGN);
            hasher.update(&ZEROS[..(off - pos) as usize]);
            entries[t as usize].offset = off - start;
            let data = &table.data[t as usize];
            hasher.update(data);
            pos = off + data.len() as u64;
        }
        sections.push(SectionEntry {
            offset: start,
            len: pos - start,
            digest: *hasher.finalize().as_bytes(),
        });
    }
    let weights_len = align_up(pos, SECTION_ALIGN);
    meta.tensors = entries;
    meta.sections = sections;
    crate::cuda_place::place(meta)?;
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
    Ok(Layout { header, meta_bytes })
}

/// Writes the plan file of `layout` and `table` to `out`: header, padding, the weight sections
/// in the layout's order (tensor bytes straight from the table), the metadata.
fn emit(
    out: &mut dyn Write,
    layout: &Layout,
    meta: &PlanMeta,
    table: &TensorTable,
) -> std::io::Result<()> {
    let h = &layout.header;
    out.write_all(h.as_bytes())?;
    pad(out, h.weights_offset.get() - HEADER_LEN as u64)?;
    let mut pos = 0u64;
    for (sec, ids) in meta.sections.iter().zip(&table.sections) {
        pad(out, sec.offset - pos)?;
        pos = sec.offset;
        for &t in ids {
            let off = sec.offset + meta.tensors[t as usize].offset;
            pad(out, off - pos)?;
            let data = &table.data[t as usize];
            out.write_all(data)?;
            pos = off + data.len() as u64;
        }
    }
    pad(out, h.weights_len.get() - pos)?;
    out.write_all(&layout.meta_bytes)
}

/// Lays out `table`'s sections, fills `meta.tensors` and `meta.sections`, and returns the
/// complete plan file bytes (for tests and in-memory use; [`write_plan`] streams to a file).
pub fn assemble(meta: &mut PlanMeta, table: &TensorTable) -> Result<Vec<u8>> {
    let layout = lay_out(meta, table)?;
    let mut out = Vec::with_capacity(layout.header.file_len.get() as usize);
    emit(&mut out, &layout, meta, table)
        .map_err(|e| PlanError::Internal(format!("writing a plan to memory: {e}")))?;
    Ok(out)
}

/// Lays out `table` as [`assemble`] does and writes the plan file to `path` atomically,
/// streaming the weights from the table (the file's bytes are never held in memory at once).
///
/// # Errors
/// Layout and verification errors as [`assemble`]; [`PlanError::Write`] naming `path`.
pub fn write_plan(meta: &mut PlanMeta, table: &TensorTable, path: &Path) -> Result<()> {
    write_plan_reporting(meta, table, path, &crate::progress::ProgressHook::default())
}

/// [`write_plan`], telling `progress` the bytes written after each tensor.
pub fn write_plan_reporting(
    meta: &mut PlanMeta,
    table: &TensorTable,
    path: &Path,
    progress: &crate::progress::ProgressHook,
) -> Result<()> {
    let layout = lay_out(meta, table)?;
    let total = layout.header.file_len.get();
    edge_schema::io::write_atomic_with(path, |out| {
        let mut counting = Counting {
            out,
            done: 0,
            total,
            progress,
            reported: 0,
        };
        emit(&mut counting, &layout, meta, table)?;
        progress.report(crate::progress::CompileProgress::Written { done: total, total });
        Ok(())
    })
    .map_err(|source| PlanError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// A writer that reports its byte count (at most every 4 MiB).
struct Counting<'a> {
    out: &'a mut dyn Write,
    done: u64,
    total: u64,
    progress: &'a crate::progress::ProgressHook,
    reported: u64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.done += n as u64;
        if self.done - self.reported >= 4 << 20 {
            self.reported = self.done;
            self.progress
                .report(crate::progress::CompileProgress::Written {
                    done: self.done,
                    total: self.total,
                });
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The streamed file equals the in-memory assembly byte for byte, for a plan with
    /// several sections (segments), interleaved packs and padding between tensors.
    #[test]
    fn streamed_plan_equals_assembled_plan() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/pixart-sigma-tiny");
        let opts = crate::CompileOptions {
            sizes: vec![(64, 64)],
            policy: crate::pack::PackPolicy {
                default: Some(edge_schema::DType::Q8_0),
                rules: vec![],
            },
            target: edge_schema::plan::Target {
                isa: edge_schema::plan::Isa::Aarch64,
                features: vec!["neon".into()],
            },
            ..Default::default()
        };
        let c = crate::compile::compile_folder(&dir, &opts).unwrap();
        let (mut m1, mut m2) = (c.meta.clone(), c.meta.clone());
        let bytes = assemble(&mut m1, &c.table).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.plan");
        write_plan(&mut m2, &c.table, &path).unwrap();
        assert!(m1.sections.len() > 3);
        assert_eq!(m1, m2);
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }
}
