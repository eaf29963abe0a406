//! Output files that are never left half-written and never clobber what is not a file.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where `path` may be written: `path` itself when it does not exist or is a regular file;
/// the regular file a symbolic link points to (so the link survives); an error for anything
/// else (a directory, a device such as `/dev/null`, a FIFO, a socket, a dangling link), which
/// replacing by a rename would destroy.
fn destination(path: &Path) -> std::io::Result<PathBuf> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(path.to_path_buf()),
        Err(e) => return Err(e),
    };
    let (target, kind) = if meta.file_type().is_symlink() {
        let target = std::fs::canonicalize(path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("it is a symbolic link that does not resolve: {e}"),
            )
        })?;
        let kind = std::fs::metadata(&target)?.file_type();
        (target, kind)
    } else {
        (path.to_path_buf(), meta.file_type())
    };
    if kind.is_file() {
        Ok(target)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a regular file (a directory, device or pipe); refusing to replace it",
                target.display()
            ),
        ))
    }
}

/// Writes `bytes` to `path` atomically; see [`write_atomic_with`].
///
/// # Errors
/// The I/O error (folder not writable, disk full, destination not a regular file).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// Writes what `fill` writes to `path` atomically: into a temporary file in the destination's
/// folder (created with the usual `0666 & ~umask` permissions, buffered), synced, then renamed
/// over the destination, so a reader sees the old file or the whole new one and the content
/// never has to be held in memory at once. A symbolic link is followed (its target is
/// replaced, the link kept); a destination that exists but is not a regular file is refused.
/// The temporary file is removed on any error, including one returned by `fill`.
///
/// # Errors
/// The I/O error (folder not writable, disk full, destination not a regular file), or
/// `fill`'s.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dest = destination(path)?;
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut builder = tempfile::Builder::new();
    builder.prefix(".edge-out.tmp-");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let tmp = builder.tempfile_in(dir)?;
    let mut buffered = std::io::BufWriter::with_capacity(1 << 20, tmp);
    fill(&mut buffered)?;
    let tmp = buffered.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    tmp.persist(&dest).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn writes_replaces_follows_links_and_refuses_special_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("out.bin");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

        // A directory is refused and left alone.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let e = write_atomic(&sub, b"x").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(sub.is_dir());

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // A link is followed: the target gets the bytes, the link stays a link.
            let link = dir.path().join("link.bin");
            std::os::unix::fs::symlink(&f, &link).unwrap();
            write_atomic(&link, b"three").unwrap();
            assert!(std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink());
            assert_eq!(std::fs::read(&f).unwrap(), b"three");
            // A device is refused (and, above all, not replaced).
            let e = write_atomic(Path::new("/dev/null"), b"x").unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
            assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
            // Permissions are those of a plainly created file (0666 & ~umask), not the
            // temporary file's 0600.
            let plain = dir.path().join("plain.bin");
            std::fs::File::create(&plain).unwrap();
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&f), mode(&plain));
        }
    }
}
