//! Signing plans with Ed25519 (RFC 8032, `ed25519-dalek`) and generating signing keys.
//!
//! The signature lives in the header's signature block and covers the header with the
//! signature bytes zeroed ([`edge_schema::header::Header::signed_message`]); the header holds
//! the metadata digest and the metadata holds every section digest, so the signature covers
//! every byte. See [`edge_schema::header`] for the byte layout and the key file format.
//!
//! [`sign_plan`] verifies the whole plan (header, metadata, every section digest, zero
//! padding) before signing, so it never signs a damaged file.

use std::io::Write;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey};
use edge_schema::header::{decode_key, encode_hex, Header, SignatureBlock, HEADER_LEN};
use edge_schema::plan::PlanMeta;
use edge_schema::verify;
use zerocopy::IntoBytes;

/// Why a key could not be made or read, or a plan could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("the operating system's random source failed: {0}")]
    Random(String),
    #[error("key file {path}: {reason}")]
    KeyFile { path: String, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to overwrite existing key file {path}")]
    KeyExists { path: String },
    #[error("refusing to sign a plan that does not verify: {0}")]
    Plan(#[from] edge_schema::Error),
    #[error(transparent)]
    Write(#[from] crate::PlanError),
}

/// A 32-byte Ed25519 secret seed (RFC 8032 "private key").
pub struct SecretKey {
    key: SigningKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretKey")
            .field("public", &encode_hex(&self.public_key()))
            .finish()
    }
}

impl SecretKey {
    /// A fresh key from the operating system's random source (`getrandom`).
    pub fn generate() -> Result<SecretKey, SignError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| SignError::Random(e.to_string()))?;
        let key = SecretKey::from_seed(&seed);
        seed.fill(0);
        Ok(key)
    }

    /// The key with secret seed `seed`.
    pub fn from_seed(seed: &[u8; 32]) -> SecretKey {
        SecretKey {
            key: SigningKey::from_bytes(seed),
        }
    }

    /// Reads a secret key file: 64 hexadecimal digits or 32 raw bytes (the seed).
    pub fn from_file(path: &Path) -> Result<SecretKey, SignError> {
        let bytes = std::fs::read(path).map_err(|source| SignError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let seed = decode_key(&bytes).ok_or_else(|| SignError::KeyFile {
            path: path.display().to_string(),
            reason: format!(
                "{} bytes, expected 64 hexadecimal digits or 32 raw bytes",
                bytes.len()
            ),
        })?;
        Ok(SecretKey::from_seed(&seed))
    }

    /// The matching 32-byte public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }

    /// Writes the seed as hex to `path` (created new, mode 0600 on Unix) and the public key
    /// as hex to `path` + `.pub`; returns the `.pub` path. Refuses to overwrite either.
    pub fn write_pair(&self, path: &Path) -> Result<PathBuf, SignError> {
        let mut pub_name = path.as_os_str().to_owned();
        pub_name.push(".pub");
        let pub_path = PathBuf::from(pub_name);
        for p in [path, pub_path.as_path()] {
            if p.exists() {
                return Err(SignError::KeyExists {
                    path: p.display().to_string(),
                });
            }
        }
        write_new(path, &encode_hex(self.key.as_bytes()), true)?;
        write_new(&pub_path, &encode_hex(&self.public_key()), false)?;
        Ok(pub_path)
    }
}

/// Creates `path` (failing if it exists) holding `hex` and a newline.
fn write_new(path: &Path, hex: &str, secret: bool) -> Result<(), SignError> {
    let io = |source| SignError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut f = opts.open(path).map_err(io)?;
    f.write_all(format!("{hex}\n").as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

/// Verifies every digest of `plan` (header, metadata, sections) and that padding is zero.
fn verify_plan(plan: &[u8]) -> Result<Header, SignError> {
    let h = Header::read(plan)?;
    let meta_start = h.meta_offset.get() as usize;
    let meta_bytes = &plan[meta_start..meta_start + h.meta_len.get() as usize];
    if blake3::hash(meta_bytes).as_bytes() != &h.meta_digest {
        return Err(edge_schema::Error::ChecksumMismatch {
            what: "metadata".into(),
        }
        .into());
    }
    let meta = PlanMeta::decode(meta_bytes)?;
    verify::verify_meta(&meta, h.weights_len.get())?;
    let w0 = h.weights_offset.get() as usize;
    let mut covered = vec![(0, HEADER_LEN), (meta_start, meta_start + meta_bytes.len())];
    for (i, s) in meta.sections.iter().enumerate() {
        let (a, b) = (w0 + s.offset as usize, w0 + (s.offset + s.len) as usize);
        verify::verify_section_digest(&meta, i, &plan[a..b])?;
        covered.push((a, b));
    }
    covered.sort_unstable();
    let mut pos = 0;
    for (a, b) in covered.into_iter().chain([(plan.len(), plan.len())]) {
        if a > pos && plan[pos..a].iter().any(|&x| x != 0) {
            return Err(edge_schema::Error::Invalid(format!(
                "non-zero padding in bytes {pos}..{a}"
            ))
            .into());
        }
        pos = pos.max(b);
    }
    Ok(h)
}

/// Signs the plan file bytes `plan` in place with `key` (replacing any earlier signature),
/// after verifying the whole plan. Only the header's signature block and digest change.
pub fn sign_plan(plan: &mut [u8], key: &SecretKey) -> Result<(), SignError> {
    let mut h = verify_plan(plan)?;
    let mut block = SignatureBlock {
        public_key: key.public_key(),
        signature: [0; 64],
    };
    h.set_signature_block(&block);
    block.signature = key.key.sign(&h.signed_message()).to_bytes();
    h.set_signature_block(&block);
    plan[..HEADER_LEN].copy_from_slice(h.as_bytes());
    Ok(())
}

/// Reads the plan at `input`, signs it with `key` ([`sign_plan`]) and writes it atomically to
/// `output` (which may be `input`).
pub fn sign_file(input: &Path, output: &Path, key: &SecretKey) -> Result<(), SignError> {
    let mut bytes = std::fs::read(input).map_err(|source| SignError::Io {
        path: input.display().to_string(),
        source,
    })?;
    sign_plan(&mut bytes, key)?;
    crate::write::write_atomic(output, &bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip_and_refuse_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = SecretKey::generate().unwrap();
        let pub_path = key.write_pair(&path).unwrap();
        let back = SecretKey::from_file(&path).unwrap();
        assert_eq!(back.public_key(), key.public_key());
        let pub_text = std::fs::read(&pub_path).unwrap();
        assert_eq!(decode_key(&pub_text), Some(key.public_key()));
        assert!(matches!(
            key.write_pair(&path),
            Err(SignError::KeyExists { .. })
        ));
        // Raw 32-byte seeds are accepted too.
        let raw = dir.path().join("raw");
        std::fs::write(&raw, key.key.as_bytes()).unwrap();
        assert_eq!(
            SecretKey::from_file(&raw).unwrap().public_key(),
            key.public_key()
        );
        std::fs::write(&raw, b"not a key").unwrap();
        assert!(matches!(
            SecretKey::from_file(&raw),
            Err(SignError::KeyFile { .. })
        ));
    }

    #[test]
    fn two_generated_keys_differ() {
        let a = SecretKey::generate().unwrap();
        let b = SecretKey::generate().unwrap();
        assert_ne!(a.public_key(), b.public_key());
    }

    #[test]
    fn rfc8032_test_vector_1_public_key() {
        // RFC 8032 section 7.1, TEST 1: secret key and public key.
        let seed = decode_key(b"9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
            .unwrap();
        let public =
            decode_key(b"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
                .unwrap();
        assert_eq!(SecretKey::from_seed(&seed).public_key(), public);
    }

    #[test]
    fn refuses_to_sign_garbage() {
        let key = SecretKey::from_seed(&[7; 32]);
        let mut junk = vec![0u8; 4096];
        assert!(matches!(
            sign_plan(&mut junk, &key),
            Err(SignError::Plan(_))
        ));
    }
}
