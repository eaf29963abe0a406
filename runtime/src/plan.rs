//! Opening a plan: map (or take) the bytes, verify header, signature, metadata and padding, and
//! hand out zero-copy views of packed weights whose section digest has been checked.
//!
//! # When digests are checked
//!
//! [`Plan::open`] (a memory map, possibly of a multi-GB file) checks the header, the metadata
//! digest, the metadata tables ([`verify::verify_meta`]) and the zero padding, and leaves each
//! weight section's BLAKE3 digest to be checked on first use: [`Plan::section_checked`] hashes
//! a section once (the result is remembered), [`Plan::tensor_bytes`] calls it before handing
//! out any tensor bytes, and [`crate::Session::run_stage`] calls it before each segment. So a
//! flipped weight byte is refused before the weight is read, and opening does not read the
//! weights. [`Plan::from_bytes`] copies the whole file anyway, so it checks every section at
//! once; [`Plan::verify_all_sections`] does the same for an opened plan.
//!
//! # Signed plans
//!
//! [`Plan::open_signed`] and [`Plan::from_bytes_signed`] additionally require a valid Ed25519
//! signature by a trusted key ([`crate::sign`]), checked right after the header and before the
//! metadata is decoded.
//!
//! # Safety of the mapping
//!
//! [`Plan::open`] memory-maps the file read-only. As with any `mmap`, the file must not be
//! modified or truncated by another process while the plan is open: the verification done at
//! open (and first use) cannot protect against bytes changing underneath it. The plan holds a
//! shared `flock` on the file, checks its stamp on request ([`Plan::check_unchanged`]) and
//! turns a `SIGBUS` on the mapping into a one-line error (see `guard`), so an in-place rewrite
//! ends the run with an error instead of a crash or a silently different image; replacing a
//! plan by `rename(2)` is always safe. [`Plan::from_bytes`] is the other safe alternative
//! (tests, embedded use): it owns an aligned copy.

use std::path::Path;
use std::sync::OnceLock;

use edge_schema::header::{Header, HEADER_LEN};
use edge_schema::plan::PlanMeta;
use edge_schema::verify;

use crate::error::{Error, Result};
use crate::sign::{self, TrustedKey};

enum Bytes {
    Mapped(memmap2::Mmap),
    /// Owned bytes, 8-aligned (weights need 4).
    Owned(crate::host::HostBytes),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(b) => b.as_bytes(),
        }
    }
}

/// A verified plan: its metadata and its weight bytes.
pub struct Plan {
    /// The open file's lock, stamp and SIGBUS registration (plans from [`Plan::open`]);
    /// dropped before the mapping.
    guard: Option<crate::guard::FileGuard>,
    bytes: Bytes,
    meta: PlanMeta,
    weights_offset: usize,
    weights_len: usize,
    /// Per section: unset until first use, then whether its digest matched.
    checked: Vec<OnceLock<bool>>,
    signer: Option<[u8; 32]>,
    /// BLAKE3 digest of the metadata (and through it of every section).
    digest: [u8; 32],
    /// The file, for errors found after opening (lazy section checks).
    path: Option<std::path::PathBuf>,
}

/// When [`Plan::verify`] hashes the weight sections.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sections {
    /// All of them, before returning.
    Now,
    /// Each on first use ([`Plan::section_checked`]).
    OnFirstUse,
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
    /// Opens the plan at `path`: verifies the header, metadata and padding now and each weight
    /// section on first use (see the module docs, also for the mapping contract). A signature,
    /// if present, is not checked (use [`Plan::open_signed`]). Errors name the file and what is
    /// wrong with it.
    pub fn open(path: &Path) -> Result<Plan> {
        Plan::open_inner(path, None)
    }

    /// Like [`Plan::open`], and refuses the plan unless it carries a valid signature by
    /// `trusted` (unsigned, signed by another key, or modified after signing).
    pub fn open_signed(path: &Path, trusted: &TrustedKey) -> Result<Plan> {
        Plan::open_inner(path, Some(trusted))
    }

    fn open_inner(path: &Path, trusted: Option<&TrustedKey>) -> Result<Plan> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        // A FIFO would block in `open`, a directory or device is not a plan: only regular
        // files are opened.
        if !std::fs::metadata(path).map_err(io)?.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file (expected a .plan file)",
            )));
        }
        let file = std::fs::File::open(path).map_err(io)?;
        let mut guard = crate::guard::FileGuard::lock(file, path)?;
        let map = map_file(guard.file()).map_err(io)?;
        guard.guard_mapping(map.as_ptr(), map.len());
        let mut plan = Plan::verify(Bytes::Mapped(map), trusted, Sections::OnFirstUse)
            .map_err(|e| e.in_file(path))?;
        plan.path = Some(path.to_path_buf());
        plan.guard = Some(guard);
        Ok(plan)
    }

    /// Verifies and takes ownership of plan bytes (copied into an aligned buffer). Every
    /// section digest is checked before returning.
    pub fn from_bytes(bytes: &[u8]) -> Result<Plan> {
        Plan::from_bytes_inner(bytes, None)
    }

    /// Like [`Plan::from_bytes`], and requires a valid signature by `trusted`.
    pub fn from_bytes_signed(bytes: &[u8], trusted: &TrustedKey) -> Result<Plan> {
        Plan::from_bytes_inner(bytes, Some(trusted))
    }

    fn from_bytes_inner(bytes: &[u8], trusted: Option<&TrustedKey>) -> Result<Plan> {
        let owned = Bytes::Owned(crate::host::HostBytes::copy_of(bytes));
        Plan::verify(owned, trusted, Sections::Now)
    }

    fn verify(bytes: Bytes, trusted: Option<&TrustedKey>, sections: Sections) -> Result<Plan> {
        let file = bytes.as_slice();
        let h = Header::read(file)?;
        if let Some(key) = trusted {
            sign::verify_header(&h, key)?;
        }
        let signer = h.signature_block()?.map(|b| b.public_key);
        let meta = verify::read_meta(file, &h)?;
        let weights_len = h.weights_len.get();
        check_padding(file, &h, &meta)?;
        let plan = Plan {
            guard: None,
            digest: h.meta_digest,
            weights_offset: h.weights_offset.get() as usize,
            weights_len: weights_len as usize,
            checked: meta.sections.iter().map(|_| OnceLock::new()).collect(),
            signer,
            path: None,
            meta,
            bytes,
        };
        if sections == Sections::Now {
            plan.verify_all_sections()?;
        }
        Ok(plan)
    }

    /// The verified metadata.
    pub fn meta(&self) -> &PlanMeta {
        &self.meta
    }

    /// Checks weight section `section`'s BLAKE3 digest, hashing it on the first call only (the
    /// outcome is remembered; thread-safe). Errors with a checksum mismatch naming the section
    /// (and the file, for a plan from [`Plan::open`]), or when there is no such section.
    pub fn section_checked(&self, section: usize) -> Result<()> {
        self.section_checked_from(section, false)
    }

    /// [`Plan::section_checked`] for a section that is resident in this process already (just
    /// populated, [`Plan::populate_section`]): a mapped plan's section is then hashed in place,
    /// on the kernels' worker threads, instead of being read again through the file.
    pub fn section_checked_resident(&self, section: usize) -> Result<()> {
        self.section_checked_from(section, true)
    }

    fn section_checked_from(&self, section: usize, resident: bool) -> Result<()> {
        let (Some(cell), Some(s)) = (self.checked.get(section), self.meta.sections.get(section))
        else {
            return Err(edge_schema::Error::Invalid(format!("no weight section {section}")).into());
        };
        let ok = *cell.get_or_init(|| {
            // Ranges were checked against the weight region by `verify_meta`.
            let start = self.weights_offset + s.offset as usize;
            // A mapped plan is hashed through the file, not the mapping, unless the section is
            // resident anyway: reading the mapping would make the whole section resident (a
            // 263 MB embedding table of which a prompt gathers a few rows), which the memory
            // plan does not count.
            if let (Some(g), Bytes::Mapped(_), false) = (&self.guard, &self.bytes, resident) {
                return file_digest(g.file(), start as u64, s.len).is_ok_and(|d| d == s.digest);
            }
            let bytes = &self.bytes.as_slice()[start..start + s.len as usize];
            // The same digest as `verify::verify_section_digest`, on the worker threads.
            let mut h = blake3::Hasher::new();
            h.update_rayon(bytes);
            h.finalize().as_bytes() == &s.digest
        });
        if ok {
            return Ok(());
        }
        // A file changed under the plan is the cause to name, not the digest.
        self.check_unchanged()?;
        let err = Error::from(edge_schema::Error::ChecksumMismatch {
            what: format!("weight section {section}"),
        });
        Err(match &self.path {
            Some(p) => err.in_file(p),
            None => err,
        })
    }

    /// Checks every weight section's digest now (see [`Plan::section_checked`]); for tools and
    /// tests that want the whole file verified up front.
    pub fn verify_all_sections(&self) -> Result<()> {
        (0..self.meta.sections.len()).try_for_each(|i| self.section_checked(i))
    }

    /// The packed bytes of tensor `t` (in range and 64-byte aligned, checked at open), after
    /// checking its section's digest ([`Plan::section_checked`]). Errors when `t` is not a
    /// tensor of the plan or its section is corrupted.
    pub fn tensor_bytes(&self, t: u32) -> Result<&[u8]> {
        let e = self
            .meta
            .tensors
            .get(t as usize)
            .ok_or_else(|| edge_schema::Error::Invalid(format!("no weight tensor {t}")))?;
        self.section_checked(e.section as usize)?;
        let s = &self.meta.sections[e.section as usize];
        let start = self.weights_offset + (s.offset + e.offset) as usize;
        let weights_end = self.weights_offset + self.weights_len;
        Ok(&self.bytes.as_slice()[start..(start + e.len as usize).min(weights_end)])
    }

    /// The public key embedded in a signed plan's header (not by itself a proof of anything:
    /// only [`Plan::open_signed`] checks the signature against a trusted key); `None` when
    /// unsigned.
    pub fn signer(&self) -> Option<[u8; 32]> {
        self.signer
    }

    /// BLAKE3 digest of the plan's metadata, which holds every section's digest: one value
    /// that names these exact weights and graphs (unchanged by signing).
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// Checks that the file of a plan from [`Plan::open`] is still the one opened (same inode,
    /// length and modification time; see `guard`). Plans from bytes always
    /// pass.
    ///
    /// Errors: [`Error::PlanChanged`] naming the plan and what changed.
    pub fn check_unchanged(&self) -> Result<()> {
        self.guard.as_ref().map_or(Ok(()), |g| g.check())
    }

    /// The whole file's length in bytes.
    pub fn file_len(&self) -> usize {
        self.bytes.as_slice().len()
    }
}

/// BLAKE3 of `len` bytes of `file` from `offset`, read with `pread` in 1 MiB pieces (the page
/// cache, not this process's mapping).
fn file_digest(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from((len - done).min(buf.len() as u64)).unwrap_or(buf.len());
        read_at(file, &mut buf[..n], offset + done)?;
        // On the kernels' worker threads (the same digest as `update`).
        h.update_rayon(&buf[..n]);
        done += n as u64;
    }
    Ok(*h.finalize().as_bytes())
}

#[cfg(unix)]
fn read_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

/// Page-residency advice for weight streaming ([`crate::stream`]); no-ops for owned bytes.
impl Plan {
    fn section_file_range(&self, section: usize) -> Option<(usize, usize)> {
        let s = self.meta.sections.get(section)?;
        let start = self
            .weights_offset
            .checked_add(usize::try_from(s.offset).ok()?)?;
        Some((start, usize::try_from(s.len).ok()?))
    }

    /// Asks the kernel to read `section` ahead (`madvise(WILLNEED)`).
    pub fn prefetch_section(&self, section: usize) {
        if let (Bytes::Mapped(m), Some((start, len))) =
            (&self.bytes, self.section_file_range(section))
        {
            let _ = m.advise_range(memmap2::Advice::WillNeed, start, len);
        }
    }

    /// Maps `section`'s pages into this process now (`madvise(MADV_POPULATE_READ)`, Linux 5.14;
    /// elsewhere, or when refused, nothing: the pages fault in as they are read). Reading them
    /// is what the segment about to run does anyway; this replaces one page fault per few
    /// pages (about 1.2 million 4 KiB pages for the T5-XXL of a Q8_0 plan) by one call.
    pub fn populate_section(&self, section: usize) {
        #[cfg(target_os = "linux")]
        if let (Bytes::Mapped(m), Some((start, len))) =
            (&self.bytes, self.section_file_range(section))
        {
            let _ = m.advise_range(memmap2::Advice::PopulateRead, start, len);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = section;
    }

    /// Drops `section`'s pages from this process (`madvise(DONTNEED)`); they are re-read from
    /// the file on next use. Callers must hold no view into the section (no step running).
    pub fn release_section(&self, section: usize) {
        if let (Bytes::Mapped(m), Some((start, len))) =
            (&self.bytes, self.section_file_range(section))
        {
            release_pages(m, start, len);
        }
    }
}

/// Releases the pages of the anonymous arena `m` from byte `from` (rounded up to a page) to its
/// end (`madvise(DONTNEED)`: they read as zero when next touched, and stop counting in the
/// resident set). The caller holds `m` mutably, so no view into it is alive.
#[allow(unsafe_code)]
pub(crate) fn release_anon_above(m: &mut memmap2::MmapMut, from: usize) {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p.is_power_of_two())
            .unwrap_or(65536);
        let start = from.div_ceil(page) * page;
        if start < m.len() {
            // SAFETY: the range lies inside the anonymous mapping, starts on a page boundary
            // (the mapping is page-aligned), and nothing borrows it (`&mut`); the arena's
            // contents above `from` are not needed (the running stage's values all lie below
            // its arena size), and dropped anonymous pages read back as zeros.
            let _ = unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, m.len() - start)
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (m, from);
}

/// `madvise(DONTNEED)` on a range of the read-only mapping.
#[allow(unsafe_code)]
fn release_pages(m: &memmap2::Mmap, start: usize, len: usize) {
    // SAFETY: the mapping is a read-only, private mapping of a file that is not modified while
    // the plan is open (`Plan::open`'s contract), so dropped pages are re-read unchanged from
    // the file on their next access; `release_section` is only called between segments, when
    // no slice into the range is being read (DESIGN.md invariant 9).
    let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
}
