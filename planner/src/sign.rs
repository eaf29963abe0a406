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
use edge_schema::header::{
    decode_hex_key, decode_key, encode_hex, Header, SignatureBlock, HEADER_LEN, PUBLIC_LABEL,
    SECRET_LABEL,
};
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
    #[error(
        "refusing to overwrite {path}: the file already exists (keygen creates a new key \
         pair; give a path that does not exist)"
    )]
    KeyExists { path: String },
    #[error("refusing to sign a plan that does not verify: {0}")]
    Plan(#[from] edge_schema::Error),
    #[error(transparent)]
    Write(#[from] crate::PlanError),
    #[error("the plan is already signed by key {signer}; give --resign to replace that signature with one by key {key}")]
    AlreadySigned { signer: String, key: String },
}

/// What [`sign_plan`] did to the plan's signature block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signed {
    /// The plan was unsigned; it now carries a signature by the key.
    New,
    /// The plan was already signed by the same key; the (deterministic) signature was
    /// written again, the same bytes.
    Same,
    /// The plan was signed by another key (its public key, hex), replaced on request.
    Replaced(String),
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
    ///
    /// The file must start with [`SECRET_LABEL`] (what `keygen` writes). Bare 64 hex digits or
    /// 32 raw bytes are refused with the way out (add the label): a public key file holds the
    /// same, and signing with a public key copied under another name would make signatures by
    /// a key nobody holds. A file named `*.pub`, a file that starts with [`PUBLIC_LABEL`], and a
    /// seed whose `KEY.pub` beside it holds another public key are refused too.
    pub fn from_file(path: &Path) -> Result<SecretKey, SignError> {
        let bad = |reason: String| SignError::KeyFile {
            path: path.display().to_string(),
            reason,
        };
        let bytes = edge_schema::header::read_key_file(path).map_err(|source| SignError::Io {
            path: path.display().to_string(),
            source,
        })?;
        if bytes.starts_with(PUBLIC_LABEL.as_bytes()) {
            return Err(bad(
                "is a public key (KEY.pub from `edgeplan keygen`); sign with the secret key KEY beside it".into(),
            ));
        }
        let Some(labelled) = bytes.strip_prefix(SECRET_LABEL.as_bytes()) else {
            if path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("pub"))
            {
                return Err(bad(
                    "is named like a public key (.pub); sign with the secret key file (KEY, without .pub)".into(),
                ));
            }
            // 64 bare hex digits (or 32 raw bytes) are what a public key file holds too: signing
            // with a public key copied under another name would sign with a key nobody holds.
            return Err(bad(if decode_key(&bytes).is_some() {
                format!("holds a bare 32-byte key, which could as well be a public key; `edgeplan keygen` writes secret keys as `{SECRET_LABEL}<64 hex digits>`: if this is a secret seed, add that prefix")
            } else {
                format!(
                    "{} bytes, expected a secret key from `edgeplan keygen` (`{SECRET_LABEL}<64 hex digits>`)",
                    bytes.len()
                )
            }));
        };
        // Only hex after the label: a key file cut short to 32 hex digits is 32 bytes, which
        // `decode_key` would take as a raw seed, signing with a key nobody holds.
        let seed = decode_hex_key(labelled).ok_or_else(|| {
            bad(format!(
                "{} bytes, expected a secret key from `edgeplan keygen` (`{SECRET_LABEL}<64 hex digits>`)",
                bytes.len()
            ))
        })?;
        let key = SecretKey::from_seed(&seed);
        let mut pub_name = path.as_os_str().to_owned();
        pub_name.push(".pub");
        if let Ok(text) = std::fs::read(PathBuf::from(&pub_name)) {
            let text = text.strip_prefix(PUBLIC_LABEL.as_bytes()).unwrap_or(&text);
            if decode_key(text).is_some_and(|p| p != key.public_key()) {
                return Err(bad(format!(
                    "its public key {} is not the one in {} beside it; the two files are not a pair",
                    encode_hex(&key.public_key()),
                    PathBuf::from(&pub_name).display()
                )));
            }
        }
        Ok(key)
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
        if path.is_dir() {
            return Err(SignError::KeyFile {
                path: path.display().to_string(),
                reason: "is a folder; give the name of the key file to create (e.g. FOLDER/key)"
                    .into(),
            });
        }
        for p in [path, pub_path.as_path()] {
            // Any entry, a dangling symbolic link included (`exists` follows links, and
            // `create_new` refuses the link with a bare "File exists").
            if p.symlink_metadata().is_ok() {
                return Err(SignError::KeyExists {
                    path: p.display().to_string(),
                });
            }
        }
        write_new(
            path,
            &format!("{SECRET_LABEL}{}", encode_hex(self.key.as_bytes())),
            true,
        )?;
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

/// Signs the plan file bytes `plan` in place with `key`, after verifying the whole plan. Only
/// the header's signature block and digest change. A signature by another key is replaced
/// only with `resign` ([`SignError::AlreadySigned`] otherwise, the bytes untouched).
pub fn sign_plan(plan: &mut [u8], key: &SecretKey, resign: bool) -> Result<Signed, SignError> {
    let mut h = verify_plan(plan)?;
    let done = match h.signature_block()? {
        None => Signed::New,
        Some(b) if b.public_key == key.public_key() => Signed::Same,
        Some(b) if resign => Signed::Replaced(encode_hex(&b.public_key)),
        Some(b) => {
            return Err(SignError::AlreadySigned {
                signer: encode_hex(&b.public_key),
                key: encode_hex(&key.public_key()),
            })
        }
    };
    let mut block = SignatureBlock {
        public_key: key.public_key(),
        signature: [0; 64],
    };
    h.set_signature_block(&block);
    block.signature = key.key.sign(&h.signed_message()).to_bytes();
    h.set_signature_block(&block);
    plan[..HEADER_LEN].copy_from_slice(h.as_bytes());
    Ok(done)
}

/// Reads the plan at `input`, signs it with `key` ([`sign_plan`]) and writes it atomically to
/// `output` (which may be `input`); `resign` as in [`sign_plan`].
pub fn sign_file(
    input: &Path,
    output: &Path,
    key: &SecretKey,
    resign: bool,
) -> Result<Signed, SignError> {
    let mut bytes = std::fs::read(input).map_err(|source| SignError::Io {
        path: input.display().to_string(),
        source,
    })?;
    let done = sign_plan(&mut bytes, key, resign)?;
    crate::write::write_atomic(output, &bytes)?;
    Ok(done)
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
        // A dangling symbolic link is an existing entry too, named as one.
        #[cfg(unix)]
        {
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
            let err = key.write_pair(&link).unwrap_err();
            assert!(matches!(err, SignError::KeyExists { .. }), "{err}");
            assert!(
                err.to_string().contains("link: the file already exists"),
                "{err}"
            );
            assert!(!dir.path().join("nowhere").exists());
        }
        // Raw 32-byte seeds are refused (a public key looks the same), naming the way out.
        let raw = dir.path().join("raw");
        std::fs::write(&raw, key.key.as_bytes()).unwrap();
        let e = SecretKey::from_file(&raw).unwrap_err().to_string();
        assert!(
            e.contains("could as well be a public key") && e.contains(SECRET_LABEL),
            "{e}"
        );
        std::fs::write(&raw, b"not a key").unwrap();
        assert!(matches!(
            SecretKey::from_file(&raw),
            Err(SignError::KeyFile { .. })
        ));
    }

    #[test]
    fn key_files_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = SecretKey::generate().unwrap();
        let pub_path = key.write_pair(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(SECRET_LABEL), "{text}");
        // The public key is not a secret key, by name or by label.
        let e = SecretKey::from_file(&pub_path).unwrap_err().to_string();
        assert!(e.contains("k.pub") && e.contains("public key"), "{e}");
        let labelled = dir.path().join("labelled");
        std::fs::write(
            &labelled,
            format!("{PUBLIC_LABEL}{}", encode_hex(&key.public_key())),
        )
        .unwrap();
        let e = SecretKey::from_file(&labelled).unwrap_err().to_string();
        assert!(e.contains("public key"), "{e}");
        // A seed whose KEY.pub beside it is another key's.
        let other = SecretKey::generate().unwrap();
        std::fs::write(
            &path,
            format!("{SECRET_LABEL}{}", encode_hex(other.key.as_bytes())),
        )
        .unwrap();
        let e = SecretKey::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("not a pair") && e.contains("k.pub"), "{e}");
        // A public key copied under another name (bare hex): refused; with the label added
        // to a real seed, accepted.
        let copied = dir.path().join("copied");
        std::fs::copy(&pub_path, &copied).unwrap();
        let e = SecretKey::from_file(&copied).unwrap_err().to_string();
        assert!(e.contains("could as well be a public key"), "{e}");
        let bare = dir.path().join("bare");
        std::fs::write(&bare, encode_hex(other.key.as_bytes())).unwrap();
        assert!(SecretKey::from_file(&bare).is_err());
        std::fs::write(
            &bare,
            format!("{SECRET_LABEL}{}", encode_hex(other.key.as_bytes())),
        )
        .unwrap();
        assert_eq!(
            SecretKey::from_file(&bare).unwrap().public_key(),
            other.public_key()
        );
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
            sign_plan(&mut junk, &key, false),
            Err(SignError::Plan(_))
        ));
    }
}
