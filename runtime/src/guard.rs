//! Guarding a memory-mapped plan against its file changing underneath it.
//!
//! Devices receive plans by over-the-air updates. The safe way to replace a plan is to write
//! the new file elsewhere on the same filesystem and `rename(2)` it over the old name (what
//! `edgeplan` does): a running `edgerun` keeps reading the old inode and finishes with the old
//! plan. An updater that rewrites the file *in place* instead (`cp new.plan model.plan`
//! truncates and rewrites the same inode) would, without this module, either kill the process
//! with `SIGBUS` (a mapped page beyond the new end of file) or silently change weights the
//! run re-reads after their pages were released. Three guards:
//!
//! - **A shared lock.** [`FileGuard::lock`] takes `flock(LOCK_SH)` on the plan for as long as
//!   the plan is open, and refuses to open a plan while another process holds an exclusive
//!   lock (an updater following the documented protocol: `flock -x model.plan cp …`, which in
//!   turn waits until no run holds the plan).
//! - **A stamp.** The file's length, modification time and inode are
//!   recorded at open; [`FileGuard::check`] (called by the pipeline after every denoising step
//!   and before returning an image) refuses to hand out an image computed from a file that
//!   changed, naming the plan and what changed.
//! - **`SIGBUS` on the mapping** becomes one line on stderr naming the plan and exit status 1
//!   ([`register_mapping`]); a `SIGBUS` anywhere else is passed to the handler that was there
//!   before (the default: terminate).
//!
//! All `unsafe` of this module is the signal handler and its installation.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

/// What identifies one version of the plan file: `(device, inode, length, mtime)`, the time
/// in nanoseconds since the epoch. (Not the status-change time: renaming a new plan over the
/// name unlinks the old inode, which changes its ctime although its bytes are intact.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn stamp(file: &File) -> std::io::Result<Stamp> {
    let m = file.metadata()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
    #[cfg(not(unix))]
    {
        let t = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        Ok(Stamp {
            dev: 0,
            ino: 0,
            len: m.len(),
            mtime_ns: t,
        })
    }
}

/// The open plan file with its shared lock, its stamp at open and its `SIGBUS` registration.
#[derive(Debug)]
pub(crate) struct FileGuard {
    file: File,
    path: std::path::PathBuf,
    at_open: Stamp,
    slot: Option<usize>,
}

impl FileGuard {
    /// Takes a shared lock on `file` (opened from `path`) and records its stamp.
    ///
    /// Errors: [`Error::PlanLocked`] when another process holds an exclusive lock (an updater
    /// rewriting the plan); [`Error::Io`] when `fstat` fails. A filesystem that cannot lock
    /// is not an error (the plan is opened unlocked).
    pub(crate) fn lock(file: File, path: &Path) -> Result<FileGuard> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        match file.try_lock_shared() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::PlanLocked {
                    path: path.display().to_string(),
                })
            }
            // A filesystem without locks (some network mounts: ENOLCK, EOPNOTSUPP) is not a
            // reason to refuse the plan: the stamp and the SIGBUS guard still hold.
            Err(std::fs::TryLockError::Error(_)) => {}
        }
        let at_open = stamp(&file).map_err(io)?;
        Ok(FileGuard {
            file,
            path: path.to_path_buf(),
            at_open,
            slot: None,
        })
    }

    /// The open file (for mapping it).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Registers the mapping `[start, start + len)` of this file for the `SIGBUS` guard.
    pub(crate) fn guard_mapping(&mut self, start: *const u8, len: usize) {
        let msg = format!(
            "error: plan {}: the file was truncated or rewritten in place while it was in use (SIGBUS reading its memory map); nothing was written. Replace a plan by writing the new file elsewhere and renaming it over the old one.\n",
            self.path.display()
        );
        self.slot = register_mapping(start as usize, len, msg);
    }

    /// Checks that the file is still the one opened: same inode, length and modification time.
    ///
    /// Errors: [`Error::PlanChanged`] naming the plan and what changed.
    pub(crate) fn check(&self) -> Result<()> {
        let now = stamp(&self.file).map_err(|source| Error::Io {
            path: self.path.display().to_string(),
            source,
        })?;
        if now == self.at_open {
            return Ok(());
        }
        let what = if now.len != self.at_open.len {
            format!(
                "its length changed from {} to {} bytes",
                self.at_open.len, now.len
            )
        } else {
            "it was written to".to_string()
        };
        Err(Error::PlanChanged {
            path: self.path.display().to_string(),
            what,
        })
    }
}

impl Drop for FileGuard {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            unregister_mapping(s);
        }
    }
}

#[cfg(unix)]
mod sigbus {
    use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// At most this many plans are guarded at once (more are mapped unguarded).
    const SLOTS: usize = 16;
    static START: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static END: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static MSG: [AtomicPtr<u8>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
    static MSG_LEN: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    /// The `SIGBUS` action before ours, restored for faults outside every guarded mapping.
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

    /// Claims a free slot for `[start, start + len)` with the line to print; installs the
    /// handler on first use.
    pub(super) fn register(start: usize, len: usize, msg: String) -> Option<usize> {
        install();
        PREVIOUS.get()?;
        // The message stays allocated for the life of the process (a few hundred bytes per
        // plan opened), so the handler never reads freed memory.
        let msg: &'static mut [u8] = Box::leak(msg.into_bytes().into_boxed_slice());
        for i in 0..SLOTS {
            if START[i]
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                MSG_LEN[i].store(msg.len(), Ordering::Release);
                MSG[i].store(msg.as_mut_ptr(), Ordering::Release);
                END[i].store(start.saturating_add(len), Ordering::Release);
                START[i].store(start.max(1), Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    pub(super) fn unregister(i: usize) {
        END[i].store(0, Ordering::Release);
        START[i].store(0, Ordering::Release);
    }

    fn install() {
        PREVIOUS.get_or_init(|| {
            // SAFETY: `sigaction` with a zeroed, then filled struct is the documented way to
            // install a handler; `handler` has the SA_SIGINFO signature and only calls
            // async-signal-safe functions (write, _exit, sigaction) and atomics.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = handler as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGBUS, &act, &mut old);
                old
            }
        });
    }

    extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers; `si_addr` is the
        // faulting address for SIGBUS.
        let addr = unsafe { (*info).si_addr() } as usize;
        for i in 0..SLOTS {
            let (s, e) = (
                START[i].load(Ordering::Acquire),
                END[i].load(Ordering::Acquire),
            );
            if s != 0 && s != usize::MAX && addr >= s && addr < e {
                let p = MSG[i].load(Ordering::Acquire);
                let n = MSG_LEN[i].load(Ordering::Acquire);
                // SAFETY: `p..p+n` is a leaked, never-freed message; write(2) and _exit(2)
                // are async-signal-safe.
                unsafe {
                    libc::write(2, p as *const libc::c_void, n);
                    libc::_exit(1);
                }
            }
        }
        // Not a guarded mapping: put the previous action back and return; the access faults
        // again and gets what it would have got without us.
        if let Some(old) = PREVIOUS.get() {
            // SAFETY: restoring a sigaction obtained from the kernel.
            unsafe {
                libc::sigaction(libc::SIGBUS, old, std::ptr::null_mut());
            }
        }
    }
}

/// Registers a mapped plan so that a `SIGBUS` inside it prints `msg` and exits with status 1;
/// `None` when no slot is free or on targets without signals (the stamp check still holds).
fn register_mapping(start: usize, len: usize, msg: String) -> Option<usize> {
    #[cfg(unix)]
    {
        sigbus::register(start, len, msg)
    }
    #[cfg(not(unix))]
    {
        let _ = (start, len, msg);
        None
    }
}

fn unregister_mapping(slot: usize) {
    #[cfg(unix)]
    sigbus::unregister(slot);
    #[cfg(not(unix))]
    let _ = slot;
}
