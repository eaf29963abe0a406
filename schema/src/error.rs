//! Errors of decoding and verifying a plan. Every variant names what was wrong and what was
//! expected, so the runtime can refuse a damaged or hostile plan with a one-line message.

/// Why a plan (or a part of one) was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "not a plan file: it starts with {:?}, expected {:?}",
        String::from_utf8_lossy(found).escape_debug().to_string(),
        String::from_utf8_lossy(expected)
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
    #[error("plan checksum mismatch in {what}: the file is corrupted")]
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
