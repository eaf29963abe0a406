//! Progress reports of a compile (weights read, plan bytes written), shared by the compile
//! driver and the plan writer.

/// What [`crate::CompileOptions::progress`] is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileProgress {
    /// A weight of `bytes` source bytes was read (and will be packed).
    Read { bytes: u64 },
    /// `done` of `total` bytes of the plan file are written.
    Written { done: u64, total: u64 },
}

/// A progress callback (thread-safe: weights may be read from several threads).
#[derive(Clone, Default)]
pub struct ProgressHook(pub Option<std::sync::Arc<dyn Fn(CompileProgress) + Send + Sync>>);

impl ProgressHook {
    /// Tells the callback, if any.
    pub fn report(&self, p: CompileProgress) {
        if let Some(f) = &self.0 {
            f(p);
        }
    }
}

impl std::fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ProgressHook(set)"
        } else {
            "ProgressHook(none)"
        })
    }
}
