//! Errors of decoding and verifying a plan. Every variant names what was wrong and what was
//! expected, so the runtime can refuse a damaged or hostile plan with a one-line message.

/// Why a plan (or a part of one) was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "not a plan file: it starts with {}, expected {}",
        magic_text(found),
        magic_text(expected)
    )]
    BadMagic { found: [u8; 8], expected: [u8; 8] },
    #[error(
        "plan format version {found} is not supported (this runtime reads version {expected})"
    )]
    UnsupportedVersion { found: u32, expected: u32 },
    #[error("plan is truncated: {what} needs bytes {start}..{end} but the file has {len}")]
    Truncated {
        what: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("checksum mismatch in {what}: the plan file is corrupted")]
    ChecksumMismatch { what: String },
    #[error("plan metadata does not decode: {0}")]
    Decode(String),
    #[error("invalid plan: {0}")]
    Invalid(String),
    #[error("plan was compiled for {needed} but this device is {found}")]
    TargetMismatch { needed: String, found: String },
}

/// Result with the schema [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The first bytes of a file for a message: quoted when they are printable ASCII, else as hex
/// (`bytes 8f 13 3a … (hex)`), so a binary file's start reads plainly.
fn magic_text(bytes: &[u8]) -> String {
    if bytes.iter().all(|b| (0x20..0x7f).contains(b)) {
        format!("{:?}", String::from_utf8_lossy(bytes))
    } else {
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("bytes {} (hex)", hex.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_magic_shows_text_or_hex() {
        let expected = *b"EDGEPLAN";
        let text = Error::BadMagic {
            found: *b"GGUF\x03\0\0\0",
            expected,
        }
        .to_string();
        assert_eq!(
            text,
            "not a plan file: it starts with bytes 47 47 55 46 03 00 00 00 (hex), expected \"EDGEPLAN\""
        );
        let text = Error::BadMagic {
            found: *b"PK-ZIP!!",
            expected,
        }
        .to_string();
        assert_eq!(
            text,
            "not a plan file: it starts with \"PK-ZIP!!\", expected \"EDGEPLAN\""
        );
    }
}
