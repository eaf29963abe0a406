//! Verifying a signed plan's Ed25519 signature (RFC 8032, `ed25519-dalek`).
//!
//! Where the signature lives and what it covers is documented in
//! [`edge_schema::header`]: an Ed25519 signature over the header (signature bytes zeroed),
//! which holds the metadata digest, which holds every section digest — so a valid signature
//! plus the digest checks [`crate::Plan`] performs cover every byte of the plan.
//!
//! The check runs after the header's own digest and before the metadata is decoded, so an
//! untrusted plan's metadata is never parsed.

use std::path::Path;

use ed25519_dalek::{Signature, VerifyingKey};
use edge_schema::header::{
    decode_hex_key, decode_key, encode_hex, Header, PUBLIC_LABEL, SECRET_LABEL,
};

/// Why a plan's signature was refused, or a key file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "the plan is not signed, but a trusted key is required (sign it with `edgeplan sign`)"
    )]
    Unsigned,
    #[error("the plan is signed by key {found}, which is not the trusted key {trusted}")]
    UntrustedSigner { found: String, trusted: String },
    #[error("the plan's signature does not verify with key {key}: the plan was modified after signing or the signature is forged")]
    BadSignature { key: String },
    #[error("public key file {path}: {reason}")]
    KeyFile { path: String, reason: String },
    #[error("public key {key} is not a valid Ed25519 point")]
    BadKey { key: String },
}

/// An Ed25519 public key whose signatures the reader accepts.
#[derive(Clone, Debug)]
pub struct TrustedKey {
    key: VerifyingKey,
}

impl TrustedKey {
    /// The key from its 32-byte RFC 8032 encoding. Errors when the bytes are not a point of
    /// the curve.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<TrustedKey, SignatureError> {
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| SignatureError::BadKey {
            key: encode_hex(bytes),
        })?;
        Ok(TrustedKey { key })
    }

    /// Reads a public key file (`KEY.pub` from `edgeplan keygen`): 64 hex digits (optionally
    /// after [`edge_schema::header::PUBLIC_LABEL`], then nothing else) or 32 raw bytes (see
    /// [`edge_schema::header::decode_key`]). A secret key file (it starts with
    /// [`edge_schema::header::SECRET_LABEL`]) is refused, naming the `.pub` file to give.
    pub fn from_file(path: &Path) -> Result<TrustedKey, SignatureError> {
        let err = |reason: String| SignatureError::KeyFile {
            path: path.display().to_string(),
            reason,
        };
        let bytes = edge_schema::header::read_key_file(path).map_err(|e| err(e.to_string()))?;
        if bytes.starts_with(SECRET_LABEL.as_bytes()) {
            return Err(err(
                "is a secret key (KEY from `edgeplan keygen`); give its public key KEY.pub".into(),
            ));
        }
        // After the label only hex (a labelled file cut short is not a raw key); bare, either.
        let raw = match bytes.strip_prefix(PUBLIC_LABEL.as_bytes()) {
            Some(hex) => decode_hex_key(hex).ok_or_else(|| {
                err(format!(
                    "{} bytes, expected `{PUBLIC_LABEL}` and 64 hexadecimal digits",
                    bytes.len()
                ))
            }),
            None => decode_key(&bytes).ok_or_else(|| {
                err(format!(
                    "{} bytes, expected 64 hexadecimal digits or 32 raw bytes",
                    bytes.len()
                ))
            }),
        }?;
        TrustedKey::from_bytes(&raw).map_err(|e| {
            err(format!(
                "{e} (give the public key file KEY.pub, not the secret key)"
            ))
        })
    }

    /// The key's 32-byte encoding.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }
}

/// Checks that `header` (already read and digest-checked by [`Header::read`]) carries a valid
/// signature by `trusted`. Uses `verify_strict` (rejects small-order keys and non-canonical
/// signatures).
pub fn verify_header(header: &Header, trusted: &TrustedKey) -> Result<(), SignatureError> {
    // A malformed block was already refused by `Header::read`; treat it as unsigned here too.
    let block = header
        .signature_block()
        .ok()
        .flatten()
        .ok_or(SignatureError::Unsigned)?;
    if block.public_key != trusted.to_bytes() {
        return Err(SignatureError::UntrustedSigner {
            found: encode_hex(&block.public_key),
            trusted: encode_hex(&trusted.to_bytes()),
        });
    }
    let sig = Signature::from_bytes(&block.signature);
    trusted
        .key
        .verify_strict(&header.signed_message(), &sig)
        .map_err(|_| SignatureError::BadSignature {
            key: encode_hex(&block.public_key),
        })
}
