//! Helpers shared by the fuzz targets (included with `#[path]`; not a target itself).

use std::path::PathBuf;

/// A per-process scratch folder under the system temp dir (created once).
pub fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("edge-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Writes `data` to `name` inside [`scratch_dir`] and returns its path.
pub fn write_scratch(name: &str, data: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, data).expect("fuzz scratch file is writable");
    path
}
