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

/// Parses a memory size for `flag`: `1.5G`, `800M`, `64K`, `2T` or `1.5GiB`, `800MiB` (binary
/// units, 2¹⁰ⁿ bytes), `1.5GB`, `800MB`, `64kB` (decimal units, 10³ⁿ bytes, in any case:
/// `mb`), or a whole number of bytes (`1048576`, `1048576B`); fractions need a unit. Errors
/// name the flag and say what was expected: unknown units, zero, negative, NaN, or more than
/// 2⁶⁴ − 1 bytes.
pub fn parse_size(s: &str, flag: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let bad = |why: &str| {
        anyhow::anyhow!(
            "{flag} `{s}`: {why} (expected a size like 1.5G, 800M, 800MiB, 800MB or 1048576)"
        )
    };
    let split = t
        .char_indices()
        .find(|(_, c)| c.is_ascii_alphabetic())
        .map_or(t.len(), |(i, _)| i);
    let (num, unit) = (t[..split].trim(), &t[split..]);
    let power = |c: char| match c.to_ascii_uppercase() {
        'K' => Some(1),
        'M' => Some(2),
        'G' => Some(3),
        'T' => Some(4),
        _ => None,
    };
    let chars: Vec<char> = unit.chars().collect();
    let mult: f64 = match chars.as_slice() {
        [] => 1.0,
        ['b' | 'B'] => 1.0,
        [p] => power(*p).map_or(0.0, |n| 1024f64.powi(n)),
        [p, 'i', 'B' | 'b'] => power(*p).map_or(0.0, |n| 1024f64.powi(n)),
        [p, 'B' | 'b'] => power(*p).map_or(0.0, |n| 1000f64.powi(n)),
        _ => 0.0,
    };
    if mult == 0.0 {
        return Err(bad("unknown unit (K, M, G, T; KiB…TiB; kB…TB; B)"));
    }
    if mult == 1.0 {
        let v: u64 = num
            .parse()
            .map_err(|_| bad("not a whole number of bytes (add a unit for fractions)"))?;
        if v == 0 {
            return Err(bad("must be positive"));
        }
        return Ok(v);
    }
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad("not a number"));
    }
    let v: f64 = num.parse().map_err(|_| bad("not a number"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(bad("must be positive"));
    }
    let bytes = v * mult;
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

/// Refuses, before any work, an output that names a folder (`dir/`, an existing folder) or
/// an existing file that is not a regular file, so no output is left half-made.
pub fn check_output_file(flag: &str, out: &std::path::Path) -> anyhow::Result<()> {
    if out
        .as_os_str()
        .to_string_lossy()
        .ends_with(std::path::MAIN_SEPARATOR)
        || out.file_name().is_none()
    {
        anyhow::bail!(
            "{flag} {}: names a folder; give a file name (e.g. {})",
            out.display(),
            out.join("image.png").display()
        );
    }
    if let Ok(m) = std::fs::metadata(out) {
        if !m.is_file() {
            anyhow::bail!(
                "{flag} {}: exists and is not a regular file ({}); nothing was written",
                out.display(),
                if m.is_dir() {
                    "a folder"
                } else {
                    "a device, pipe or socket"
                }
            );
        }
    }
    Ok(())
}

/// Refuses, before any work, an output whose folder does not exist or is not a folder.
pub fn check_output_dir(flag: &str, out: &std::path::Path) -> anyhow::Result<()> {
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => writable(flag, out, dir),
        Ok(_) => anyhow::bail!(
            "{flag} {}: {} is not a folder",
            out.display(),
            dir.display()
        ),
        Err(e) => anyhow::bail!(
            "{flag} {}: the folder {} cannot be used: {e}",
            out.display(),
            dir.display()
        ),
    }
}

/// Refuses, before any work, a folder where no file can be created (read-only, not ours): a
/// probe file is created there and removed at once.
fn writable(flag: &str, out: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let probe = dir.join(format!(".edge-write-probe-{}-{nanos}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => anyhow::bail!(
            "{flag} {}: no file can be written in the folder {}: {e}; nothing was done",
            out.display(),
            dir.display()
        ),
    }
}

/// The candidate closest to `given` by edit distance (ASCII case ignored; `given` itself
/// excluded), if it is within a third of the candidate's length (a typo, not another word):
/// for "did you mean" hints.
pub fn did_you_mean<'a>(given: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let lower = given.to_ascii_lowercase();
    candidates
        .iter()
        .filter(|&&c| c != given)
        .map(|&c| (edit_distance(&lower, c), c))
        .filter(|&(d, c)| d <= c.len().div_ceil(3))
        // Ties go to a candidate that continues what was typed (`x86_64-avx512bf` is two
        // edits from both `x86_64-avx512` and `x86_64-avx512bf16`).
        .min_by_key(|&(d, c)| (d, !c.starts_with(&lower)))
        .map(|(_, c)| c)
}

/// Levenshtein distance between two strings, by bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn did_you_mean_takes_typos_not_other_words() {
        let names = [
            "generic",
            "x86_64",
            "x86_64-avx512",
            "x86_64-avx512bf16",
            "aarch64-neon",
        ];
        assert_eq!(
            super::did_you_mean("x86_64-avx512bf", &names),
            Some("x86_64-avx512bf16")
        );
        assert_eq!(
            super::did_you_mean("X86_64-AVX512", &names),
            Some("x86_64-avx512")
        );
        assert_eq!(
            super::did_you_mean("x86-64-avx51", &names),
            Some("x86_64-avx512")
        );
        assert_eq!(
            super::did_you_mean("aarch64-nen", &names),
            Some("aarch64-neon")
        );
        assert_eq!(super::did_you_mean("riscv", &names), None);
    }

    #[test]
    fn an_output_folder_where_nothing_can_be_written_is_refused_first() {
        // /proc refuses new files even to root (a chmod would not stop root).
        let e = super::check_output_dir("-o", std::path::Path::new("/proc/edge-test.plan"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no file can be written in the folder /proc"),
            "{e}"
        );
        let dir = std::env::temp_dir();
        super::check_output_dir("-o", &dir.join("edge-test.plan")).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!(".edge-write-probe-{}-", std::process::id()))
            })
            .collect();
        assert!(left.is_empty(), "the probe file is removed");
    }

    #[test]
    fn sizes_parse_strictly() {
        assert_eq!(parse_size("1.5G", "--max-ram").unwrap(), 3 << 29);
        assert_eq!(parse_size("800M", "--max-ram").unwrap(), 800 << 20);
        assert_eq!(parse_size(" 64k ", "--max-ram").unwrap(), 64 << 10);
        assert_eq!(parse_size("1048576", "--max-ram").unwrap(), 1 << 20);
        assert_eq!(parse_size("1048576B", "--max-ram").unwrap(), 1 << 20);
        assert_eq!(parse_size("768MiB", "--max-ram").unwrap(), 768 << 20);
        assert_eq!(parse_size("1.5GiB", "--max-ram").unwrap(), 3 << 29);
        assert_eq!(parse_size("1 gib", "--max-ram").unwrap(), 1 << 30);
        assert_eq!(parse_size("4MB", "--max-ram").unwrap(), 4_000_000);
        assert_eq!(parse_size("800mb", "--max-ram").unwrap(), 800_000_000);
        assert_eq!(parse_size("1.5GB", "--max-ram").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("64kB", "--max-ram").unwrap(), 64_000);
        for bad in [
            "0",
            "-5",
            "1.5",
            "abc",
            "NaN",
            "inf",
            "4XB",
            "4MiBs",
            "M",
            "-1G",
            "1.5B",
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
