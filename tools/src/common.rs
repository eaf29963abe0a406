//! Helpers shared by the two command-line programs (included by each binary).

/// `eprintln!` that never panics: diagnostics to a closed stderr (`2>&1 | head -1`) are lost,
/// not fatal.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// `println!` that never panics; a closed stdout (`| head -1`) ends the output quietly.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// The error and its causes as one line: causes joined with `: `, a cause the line already
/// contains skipped, newlines turned into spaces.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let s = cause.to_string().replace('\n', " ");
        if line.contains(&s) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&s);
    }
    line
}

/// Parses a memory size for `flag`: `1.5G`, `800M`, `64K`, `2T` (binary units, fractions
/// allowed) or a whole number of bytes (`1048576`). Errors name the flag and say what was
/// expected: no unit with a fraction, unknown units, zero, negative, NaN, or more than 2⁶⁴ − 1
/// bytes.
pub fn parse_size(s: &str, flag: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let bad = |why: &str| {
        anyhow::anyhow!("{flag} `{s}`: {why} (expected a size like 1.5G, 800M or 1048576)")
    };
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(bad("unknown unit (K, M, G or T)")),
            };
            (t[..i].trim(), m)
        }
        _ => (t, 1),
    };
    if mult == 1 {
        let v: u64 = num
            .parse()
            .map_err(|_| bad("not a whole number of bytes (add a unit for fractions)"))?;
        if v == 0 {
            return Err(bad("must be positive"));
        }
        return Ok(v);
    }
    let v: f64 = num.parse().map_err(|_| bad("not a number"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(bad("must be positive"));
    }
    let bytes = v * mult as f64;
    if bytes >= u64::MAX as f64 {
        return Err(bad("too large"));
    }
    Ok((bytes as u64).max(1))
}

/// Reads the whole of `path`, which must be a regular file: a FIFO would block, a device such
/// as `/dev/zero` would never end, a directory is an error; the message names the path and
/// `what` it should be.
pub fn read_file(path: &std::path::Path, what: &str) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    let meta = std::fs::metadata(path).with_context(|| format!("{what} {}", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!("{what} {}: not a regular file", path.display());
    }
    std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))
}

/// The identity of an existing file, following symlinks: `(device, inode)` on Unix.
fn file_id(p: &std::path::Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(p).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        std::fs::canonicalize(p).ok().map(|c| (0, fxhash(&c)))
    }
}

#[cfg(not(unix))]
fn fxhash(p: &std::path::Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.hash(&mut h);
    h.finish()
}

/// `p` with symlinks and `..` resolved, also when `p` itself does not exist yet (its folder
/// is resolved and the file name appended); `None` when not even the folder resolves.
fn resolved(p: &std::path::Path) -> Option<std::path::PathBuf> {
    if let Ok(c) = std::fs::canonicalize(p) {
        return Some(c);
    }
    let name = p.file_name()?;
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    std::fs::canonicalize(parent).ok().map(|d| d.join(name))
}

/// The regular files at `path`: itself, or every file below it when it is a folder (the
/// files a model folder offers to the loader).
#[allow(dead_code)] // edgeplan's; this file is included by both programs
pub fn files_under(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() => {
                if let Ok(rd) = std::fs::read_dir(&p) {
                    stack.extend(rd.filter_map(|e| e.ok().map(|e| e.path())));
                }
            }
            Ok(m) if m.is_file() => out.push(p),
            _ => {}
        }
    }
    out
}

/// Refuses, before anything is written, an output that is one of the inputs or another
/// output: the same file by device and inode (hard links, symlinks, `..`) when it exists,
/// the same resolved path when it does not. `inputs` and `outputs` are `(flag, path)`; the
/// message names both flags and paths.
pub fn refuse_clobber(
    inputs: &[(&str, &std::path::Path)],
    outputs: &[(&str, &std::path::Path)],
) -> anyhow::Result<()> {
    for (i, &(oflag, out)) in outputs.iter().enumerate() {
        let oid = file_id(out);
        let opath = resolved(out);
        let same = |p: &std::path::Path| {
            (oid.is_some() && file_id(p) == oid) || (opath.is_some() && resolved(p) == opath)
        };
        for &(iflag, input) in inputs {
            if same(input) {
                anyhow::bail!(
                    "{oflag} {}: is the same file as {iflag} {}; refusing to write over an input",
                    out.display(),
                    input.display()
                );
            }
        }
        for &(flag2, out2) in &outputs[i + 1..] {
            if same(out2) {
                anyhow::bail!(
                    "{oflag} {} and {flag2} {} are the same file; give two different outputs",
                    out.display(),
                    out2.display()
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_strictly() {
        assert_eq!(parse_size("1.5G", "--max-ram").unwrap(), 3 << 29);
        assert_eq!(parse_size("800M", "--max-ram").unwrap(), 800 << 20);
        assert_eq!(parse_size(" 64k ", "--max-ram").unwrap(), 64 << 10);
        assert_eq!(parse_size("1048576", "--max-ram").unwrap(), 1 << 20);
        for bad in [
            "0",
            "-5",
            "1.5",
            "abc",
            "NaN",
            "inf",
            "4MB",
            "1e30",
            "99999999999999999999G",
            "18446744073709551616",
            "",
        ] {
            let e = parse_size(bad, "--max-ram").unwrap_err().to_string();
            assert!(
                e.contains("--max-ram") && e.contains(&format!("`{bad}`")),
                "{bad}: {e}"
            );
        }
    }
}
