//! The whole-image tensors an exact tiled decode holds between GroupNorms
//! ([`edge_schema::tiles`]): in memory, or in a temporary file read and written one band of
//! rows at a time ([`edge_schema::plan::HeldIn::File`]), so that the process holds only the
//! band and group buffers ([`edge_schema::tiles::spill_buffer_bytes`]) and the file's pages
//! are the kernel's page cache, written back and dropped under memory pressure.
//!
//! Every tensor is `[c, h, w]` f32, outermost-first. Both stores give the same bytes: a window
//! is copied row by row, and GroupNorm statistics are computed one group at a time over the
//! group's contiguous values, which is what the statistics kernels do for the whole tensor.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use edge_kernels::{GroupStats, KernelTable};
use zerocopy::IntoBytes;

use crate::error::{Error, Result};

/// Shape of a held tensor: channels, height, width.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub c: usize,
    pub h: usize,
    pub w: usize,
}

impl Dims {
    fn len(self) -> usize {
        self.c * self.h * self.w
    }
}

enum Slot {
    Memory(Vec<f32>),
    /// Byte offset in the spill file.
    File(u64),
}

/// A temporary file, unlinked as soon as it is open (nothing is left behind, whatever happens),
/// with first-fit reuse of released ranges.
struct Spill {
    file: File,
    /// Where it was created, for messages.
    dir: PathBuf,
    free: Vec<(u64, u64)>,
    end: u64,
}

impl Spill {
    fn create(dir: &Path) -> Result<Spill> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = dir.join(format!(".edgerun-vae-{}-{nanos}.spill", std::process::id()));
        let io = |source| Error::Io {
            path: format!(
                "{} (spill file of exact VAE tiles; --spill-dir picks another folder)",
                path.display()
            ),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io)?;
        std::fs::remove_file(&path).map_err(io)?;
        Ok(Spill {
            file,
            dir: dir.to_path_buf(),
            free: Vec::new(),
            end: 0,
        })
    }

    /// A range of `bytes`: a released one that is large enough, else the file grows (sparse:
    /// unwritten bytes read as zero and take no disk).
    fn alloc(&mut self, bytes: u64) -> Result<u64> {
        if let Some(i) = self.free.iter().position(|&(_, len)| len >= bytes) {
            let (off, len) = self.free[i];
            if len == bytes {
                self.free.swap_remove(i);
            } else {
                self.free[i] = (off + bytes, len - bytes);
            }
            return Ok(off);
        }
        let off = self.end;
        self.end += bytes;
        self.file.set_len(self.end).map_err(|e| self.io(e))?;
        Ok(off)
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: format!(
                "spill file of exact VAE tiles in {} ({} bytes used; --spill-dir picks another folder)",
                self.dir.display(),
                self.end
            ),
            source,
        }
    }

    fn read(&self, at: u64, out: &mut [f32]) -> Result<()> {
        self.file
            .read_exact_at(out.as_mut_bytes(), at)
            .map_err(|e| self.io(e))
    }

    fn write(&self, at: u64, data: &[f32]) -> Result<()> {
        self.file
            .write_all_at(data.as_bytes(), at)
            .map_err(|e| self.io(e))
    }
}

/// The held tensors of one decode, by value id of the tail stage.
pub(crate) struct Held {
    slots: Vec<Option<(Dims, Slot)>>,
    spill: Option<Spill>,
    /// File mode: one channel's band of rows.
    band: Vec<f32>,
    /// File mode: one GroupNorm group.
    group: Vec<f32>,
}

fn missing(v: u32) -> Error {
    Error::Plan(edge_schema::Error::Invalid(format!(
        "exact VAE tiles: value {v} is not held"
    )))
}

impl Held {
    /// An empty store for `values` value ids; with `spill_dir`, tensors go to a new file there.
    pub fn new(values: usize, spill_dir: Option<&Path>) -> Result<Held> {
        Ok(Held {
            slots: (0..values).map(|_| None).collect(),
            spill: spill_dir.map(Spill::create).transpose()?,
            band: Vec::new(),
            group: Vec::new(),
        })
    }

    fn slot(&self, v: u32) -> Result<&(Dims, Slot)> {
        self.slots
            .get(v as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| missing(v))
    }

    /// Holds `data` (`[d.c, d.h, d.w]`) as value `v`.
    pub fn put(&mut self, v: u32, d: Dims, data: Vec<f32>) -> Result<()> {
        let slot = match &mut self.spill {
            Some(s) => {
                let at = s.alloc(d.len() as u64 * 4)?;
                s.write(at, &data)?;
                Slot::File(at)
            }
            None => Slot::Memory(data),
        };
        *self.slots.get_mut(v as usize).ok_or_else(|| missing(v))? = Some((d, slot));
        Ok(())
    }

    /// Makes room for value `v` (every value is written before it is read: the cores
    /// partition the image).
    pub fn alloc(&mut self, v: u32, d: Dims) -> Result<()> {
        let slot = match &mut self.spill {
            Some(s) => Slot::File(s.alloc(d.len() as u64 * 4)?),
            None => Slot::Memory(vec![0f32; d.len()]),
        };
        *self.slots.get_mut(v as usize).ok_or_else(|| missing(v))? = Some((d, slot));
        Ok(())
    }

    /// Forgets value `v` (its file range is reused).
    pub fn release(&mut self, v: u32) {
        if let Some(Some((d, Slot::File(at)))) = self.slots.get(v as usize) {
            if let Some(s) = &mut self.spill {
                s.free.push((*at, d.len() as u64 * 4));
            }
        }
        if let Some(s) = self.slots.get_mut(v as usize) {
            *s = None;
        }
    }

    /// Copies the `wh × ww` window at `(y0, x0)` of value `v` into `win` `[c, wh, ww]`.
    pub fn crop(
        &mut self,
        v: u32,
        (y0, x0): (usize, usize),
        (wh, ww): (usize, usize),
        win: &mut [f32],
    ) -> Result<()> {
        let (d, slot) = self.slot(v)?;
        let d = *d;
        match slot {
            Slot::Memory(whole) => {
                for ch in 0..d.c {
                    for y in 0..wh {
                        let src = (ch * d.h + y0 + y) * d.w + x0;
                        let dst = (ch * wh + y) * ww;
                        win[dst..dst + ww].copy_from_slice(&whole[src..src + ww]);
                    }
                }
            }
            Slot::File(at) => {
                let at = *at;
                let s = self.spill.as_ref().ok_or_else(|| missing(v))?;
                self.band.resize(self.band.len().max(wh * d.w), 0.0);
                let band = &mut self.band[..wh * d.w];
                for ch in 0..d.c {
                    s.read(at + ((ch * d.h + y0) * d.w) as u64 * 4, band)?;
                    for y in 0..wh {
                        let dst = (ch * wh + y) * ww;
                        win[dst..dst + ww].copy_from_slice(&band[y * d.w + x0..][..ww]);
                    }
                }
            }
        }
        Ok(())
    }

    /// Copies the core `[cy, cy+ch) × [cx, cx+cw)` of `win` `[c, wh, ww]` (window
    /// coordinates; `core = [cy, ch, cx, cw]`) into value `v` at `origin + (cy, cx)`.
    pub fn paste(
        &mut self,
        v: u32,
        win: &[f32],
        (wh, ww): (usize, usize),
        core: [usize; 4],
        origin: (usize, usize),
    ) -> Result<()> {
        let [cy, chh, cx, cw] = core;
        let (d, _) = self.slot(v)?;
        let d = *d;
        // Start of row `y` of channel `k`'s core in the window.
        let row = |k: usize, y: usize| (k * wh + y) * ww + cx;
        match self.slots.get_mut(v as usize).and_then(Option::as_mut) {
            Some((_, Slot::Memory(whole))) => {
                for k in 0..d.c {
                    for y in cy..cy + chh {
                        let dst = (k * d.h + origin.0 + y) * d.w + origin.1 + cx;
                        whole[dst..dst + cw].copy_from_slice(&win[row(k, y)..][..cw]);
                    }
                }
            }
            Some((_, Slot::File(at))) => {
                let at = *at;
                let s = self.spill.as_ref().ok_or_else(|| missing(v))?;
                self.band.resize(self.band.len().max(chh * d.w), 0.0);
                let band = &mut self.band[..chh * d.w];
                for k in 0..d.c {
                    let off = at + ((k * d.h + origin.0 + cy) * d.w) as u64 * 4;
                    s.read(off, band)?;
                    for y in 0..chh {
                        band[y * d.w + origin.1 + cx..][..cw]
                            .copy_from_slice(&win[row(k, cy + y)..][..cw]);
                    }
                    s.write(off, band)?;
                }
            }
            None => return Err(missing(v)),
        }
        Ok(())
    }

    /// GroupNorm statistics of value `v` over the whole tensor, through `kernels`.
    pub fn stats(
        &mut self,
        v: u32,
        kernels: &KernelTable,
        groups: usize,
        eps: f32,
        out: &mut [GroupStats],
    ) -> Result<()> {
        let (d, slot) = self.slot(v)?;
        let d = *d;
        let hw = d.h * d.w;
        match slot {
            Slot::Memory(whole) => (kernels.group_norm_stats.run)(whole, d.c, hw, groups, eps, out),
            Slot::File(at) => {
                let at = *at;
                let s = self.spill.as_ref().ok_or_else(|| missing(v))?;
                if groups == 0 || d.c % groups != 0 || out.len() != groups {
                    return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                        "exact VAE tiles: {groups} groups for {} channels",
                        d.c
                    ))));
                }
                let n = d.c / groups * hw;
                self.group.resize(self.group.len().max(n), 0.0);
                let buf = &mut self.group[..n];
                for (g, o) in out.iter_mut().enumerate() {
                    s.read(at + (g * n) as u64 * 4, buf)?;
                    (kernels.group_norm_stats.run)(
                        buf,
                        d.c / groups,
                        hw,
                        1,
                        eps,
                        std::slice::from_mut(o),
                    );
                }
            }
        }
        Ok(())
    }

    /// Value `v` whole, taken out of the store into `out` (exactly its size; from a spill
    /// file it is read straight into `out`, with no second copy of it in memory).
    pub fn take_into(&mut self, v: u32, out: &mut [f32]) -> Result<()> {
        let (d, slot) = self
            .slots
            .get_mut(v as usize)
            .and_then(Option::take)
            .ok_or_else(|| missing(v))?;
        if d.len() != out.len() {
            return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                "held value {v} has {} values, its destination {}",
                d.len(),
                out.len()
            ))));
        }
        match slot {
            Slot::Memory(data) => out.copy_from_slice(&data),
            Slot::File(at) => {
                let s = self.spill.as_ref().ok_or_else(|| missing(v))?;
                s.read(at, out)?;
            }
        }
        Ok(())
    }
}
