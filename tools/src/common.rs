//! Helpers shared by the two command-line programs (included by each binary).

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
