//! The T5 text tokenizer that travels in a plan.
//!
//! [`TokenizerSpec`] describes a SentencePiece **unigram** tokenizer the way HF `tokenizers`
//! runs it for `T5TokenizerFast` (transformers' T5 converter): added tokens matched literally
//! in the raw text, the `nmt_nfkc` normalisation rules, a `WhitespaceSplit` + `Metaspace(▁)`
//! pre-tokenizer, Viterbi segmentation over the pieces, and `</s>` appended. The planner fills
//! it from `tokenizer.json` or `spiece.model` (`edge_planner::load::tokenizer`); the runtime
//! builds its encoder from it (`edge_runtime::tokenizer`).
//!
//! The normalisation data is SentencePiece's `precompiled_charsmap` itself (a darts-clone
//! double-array trie followed by NUL-terminated replacement strings; `nmt_nfkc` is about
//! 240 KB, while the table it encodes has about 225 000 rules, so the trie is the compact
//! form). [`TokenizerSpec::validate`] checks its framing and that the replacement area is
//! UTF-8; the runtime bounds-checks every trie step, and the planner walks the whole trie
//! before writing a plan.
//!
//! The types are postcard-friendly: plain structs and unit enums.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// Largest number of model pieces plus added tokens a plan may describe (real T5: 32 100).
pub const MAX_VOCAB: usize = 1 << 22;

/// Longest piece, added token or normalisation key/replacement a plan may carry, in bytes.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// One unigram piece: its text (with `▁` for a word start) and its log-probability score.
/// The piece's id is its index in [`TokenizerSpec::pieces`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    /// The piece text, e.g. `"▁cat"`. Never empty.
    pub text: String,
    /// SentencePiece score (a log probability; finite). Viterbi maximises the sum.
    pub score: f32,
}

/// A token that is matched literally in the raw text before normalisation (HF "added token",
/// e.g. `</s>`, `<pad>`, `<unk>`, `<extra_id_0>`), and emitted as one id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddedToken {
    /// The literal text. Never empty.
    pub content: String,
    /// The id emitted for it.
    pub id: u32,
    /// Whether HF marks it special (skipped when decoding with `skip_special_tokens`).
    pub special: bool,
}

/// Where the Metaspace pre-tokenizer puts the `▁` word-start marker (HF `PrependScheme`;
/// SentencePiece `add_dummy_prefix`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PrependScheme {
    /// Every word that does not start with `▁` gets one (`add_dummy_prefix=true`, T5 legacy).
    Always,
    /// Only the word at the very start of the input gets one (transformers `legacy=false`).
    First,
    /// No `▁` is added (`add_dummy_prefix=false`).
    Never,
}

/// Everything the runtime needs to turn a prompt into T5 token ids.
///
/// Ids: piece `i` has id `i`; added tokens carry their own ids (for T5 they coincide with the
/// pieces of the same text). The id space is `0..vocab_len()`; it can be smaller than the T5
/// embedding table (1504 vs 1536 rows in the fixtures, 32 100 vs 32 128 in real T5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizerSpec {
    /// The unigram vocabulary `[piece, score]`, in id order (HF `model.vocab`; for T5 this
    /// includes `<pad>`, `</s>`, `<unk>` and the `<extra_id_N>` sentinels with score 0).
    pub pieces: Vec<Piece>,
    /// Tokens matched literally before normalisation, sorted by id.
    pub added_tokens: Vec<AddedToken>,
    /// Id of `<unk>`: emitted for a run of characters that no piece covers. Must be a piece.
    pub unk_id: u32,
    /// Id of `</s>`: appended to every encoding.
    pub eos_id: u32,
    /// Id of `<pad>`: fills the padded tail in `encode_padded`.
    pub pad_id: u32,
    /// SentencePiece `normalizer_spec.precompiled_charsmap` (HF `Precompiled` normalizer):
    /// little-endian `u32` trie size in bytes, the darts-clone trie (`u32` units), then
    /// NUL-terminated UTF-8 replacement strings. At each position the longest key that
    /// prefixes the remaining text is replaced. Empty means no normalisation.
    pub precompiled_charsmap: Vec<u8>,
    /// `true`: whitespace runs separate words and are dropped (HF `WhitespaceSplit`;
    /// SentencePiece `remove_extra_whitespaces`). `false`: spaces become `▁` and are kept.
    pub remove_extra_whitespaces: bool,
    /// Where `▁` is prepended to words.
    pub prepend_scheme: PrependScheme,
}

impl TokenizerSpec {
    /// Size of the id space: one more than the largest piece or added-token id.
    pub fn vocab_len(&self) -> usize {
        let max_added = self
            .added_tokens
            .iter()
            .map(|t| t.id as usize + 1)
            .max()
            .unwrap_or(0);
        self.pieces.len().max(max_added)
    }

    /// Checks internal consistency, since a plan is untrusted input.
    ///
    /// Errors (as a one-line message naming the field): no pieces or more than [`MAX_VOCAB`];
    /// an empty, over-long ([`MAX_TOKEN_BYTES`]) or duplicate piece; a non-finite score; an
    /// empty, over-long or duplicate added token, or two added tokens with one id; an id above
    /// `i32::MAX` (ids are passed to the model as int32); `unk_id` not a piece; `eos_id` or
    /// `pad_id` outside `0..vocab_len()`; a non-empty `precompiled_charsmap` shorter than its
    /// header, whose trie size is not a non-zero multiple of 4 within the blob, or whose
    /// replacement area is not NUL-terminated UTF-8 strings.
    pub fn validate(&self) -> Result<(), String> {
        if self.pieces.is_empty() {
            return Err("tokenizer: no pieces".into());
        }
        if self.pieces.len() > MAX_VOCAB || self.added_tokens.len() > MAX_VOCAB {
            return Err(format!(
                "tokenizer: {} pieces and {} added tokens (at most {MAX_VOCAB} each)",
                self.pieces.len(),
                self.added_tokens.len()
            ));
        }
        let mut seen: HashSet<&str> = HashSet::with_capacity(self.pieces.len());
        for (id, piece) in self.pieces.iter().enumerate() {
            if piece.text.is_empty() || piece.text.len() > MAX_TOKEN_BYTES {
                return Err(format!(
                    "tokenizer: piece {id} has {} bytes (expected 1..={MAX_TOKEN_BYTES})",
                    piece.text.len()
                ));
            }
            if !piece.score.is_finite() {
                return Err(format!(
                    "tokenizer: piece {id} {:?} has non-finite score {}",
                    piece.text, piece.score
                ));
            }
            if !seen.insert(&piece.text) {
                return Err(format!(
                    "tokenizer: piece {id} {:?} appears twice in the vocabulary",
                    piece.text
                ));
            }
        }
        let mut contents: HashSet<&str> = HashSet::with_capacity(self.added_tokens.len());
        let mut ids: HashSet<u32> = HashSet::with_capacity(self.added_tokens.len());
        for tok in &self.added_tokens {
            if tok.content.is_empty() || tok.content.len() > MAX_TOKEN_BYTES {
                return Err(format!(
                    "tokenizer: added token id {} has {} bytes (expected 1..={MAX_TOKEN_BYTES})",
                    tok.id,
                    tok.content.len()
                ));
            }
            if tok.id > i32::MAX as u32 {
                return Err(format!(
                    "tokenizer: added token {:?} has id {} (> i32::MAX)",
                    tok.content, tok.id
                ));
            }
            if !contents.insert(&tok.content) {
                return Err(format!(
                    "tokenizer: added token {:?} appears twice",
                    tok.content
                ));
            }
            if !ids.insert(tok.id) {
                return Err(format!(
                    "tokenizer: two added tokens have id {} (second: {:?})",
                    tok.id, tok.content
                ));
            }
        }
        let vocab_len = self.vocab_len();
        if vocab_len > MAX_VOCAB {
            return Err(format!(
                "tokenizer: id space has {vocab_len} ids (at most {MAX_VOCAB})"
            ));
        }
        if self.unk_id as usize >= self.pieces.len() {
            return Err(format!(
                "tokenizer: unk_id {} is not a piece (there are {})",
                self.unk_id,
                self.pieces.len()
            ));
        }
        for (name, id) in [("eos_id", self.eos_id), ("pad_id", self.pad_id)] {
            if id as usize >= vocab_len {
                return Err(format!(
                    "tokenizer: {name} {id} is outside the id space 0..{vocab_len}"
                ));
            }
        }
        check_charsmap_framing(&self.precompiled_charsmap)?;
        Ok(())
    }
}

/// Splits a `precompiled_charsmap` into `(trie units, replacement strings)` after checking
/// its framing; an empty blob gives no units and no strings. See [`TokenizerSpec::precompiled_charsmap`].
pub fn split_charsmap(blob: &[u8]) -> Result<(Vec<u32>, &[u8]), String> {
    if blob.is_empty() {
        return Ok((Vec::new(), &[]));
    }
    let Some(&[a, b, c, d]) = blob.get(..4) else {
        return Err(format!(
            "tokenizer: precompiled_charsmap has {} bytes, less than its 4-byte header",
            blob.len()
        ));
    };
    let trie_size = u32::from_le_bytes([a, b, c, d]) as usize;
    let rest = &blob[4..];
    if trie_size == 0 || !trie_size.is_multiple_of(4) || trie_size > rest.len() {
        return Err(format!(
            "tokenizer: precompiled_charsmap trie size {trie_size} is not a non-zero multiple \
             of 4 within the {} bytes after the header",
            rest.len()
        ));
    }
    let units = rest[..trie_size]
        .chunks_exact(4)
        .map(|u| u32::from_le_bytes([u[0], u[1], u[2], u[3]]))
        .collect();
    Ok((units, &rest[trie_size..]))
}

fn check_charsmap_framing(blob: &[u8]) -> Result<(), String> {
    let (_, strings) = split_charsmap(blob)?;
    if strings.is_empty() {
        return Ok(());
    }
    if strings.last() != Some(&0) {
        return Err(
            "tokenizer: precompiled_charsmap replacement area does not end with NUL".into(),
        );
    }
    for (i, s) in strings[..strings.len() - 1].split(|&b| b == 0).enumerate() {
        if std::str::from_utf8(s).is_err() {
            return Err(format!(
                "tokenizer: precompiled_charsmap replacement string {i} is not UTF-8"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn small() -> TokenizerSpec {
        let piece = |t: &str, s: f32| Piece {
            text: t.into(),
            score: s,
        };
        TokenizerSpec {
            pieces: vec![
                piece("<pad>", 0.0),
                piece("</s>", 0.0),
                piece("<unk>", 0.0),
                piece("▁a", -1.5),
                piece("<extra_id_0>", 0.0),
            ],
            added_tokens: vec![
                AddedToken {
                    content: "</s>".into(),
                    id: 1,
                    special: true,
                },
                AddedToken {
                    content: "<extra_id_0>".into(),
                    id: 4,
                    special: true,
                },
            ],
            unk_id: 2,
            eos_id: 1,
            pad_id: 0,
            // trie of 2 units (root only, no keys), then the strings "fi\0"
            precompiled_charsmap: vec![8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'f', b'i', 0],
            remove_extra_whitespaces: true,
            prepend_scheme: PrependScheme::Always,
        }
    }

    #[test]
    fn postcard_round_trip() {
        let spec = small();
        spec.validate().unwrap();
        let bytes = postcard::to_allocvec(&spec).unwrap();
        let back: TokenizerSpec = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn validate_refuses_inconsistent_specs() {
        let mut s = small();
        s.pieces[3].text = "</s>".into();
        assert!(s.validate().unwrap_err().contains("twice"));

        let mut s = small();
        s.pieces[3].score = f32::NAN;
        assert!(s.validate().unwrap_err().contains("non-finite"));

        let mut s = small();
        s.unk_id = 5;
        assert!(s.validate().unwrap_err().contains("unk_id"));

        let mut s = small();
        s.eos_id = 9;
        assert!(s.validate().unwrap_err().contains("eos_id"));

        let mut s = small();
        s.added_tokens[1].id = 1;
        assert!(s.validate().unwrap_err().contains("id 1"));

        let mut s = small();
        s.precompiled_charsmap.pop();
        assert!(s.validate().unwrap_err().contains("NUL"));

        let mut s = small();
        s.precompiled_charsmap[12] = 0xff;
        assert!(s.validate().unwrap_err().contains("UTF-8"));

        let mut s = small();
        s.precompiled_charsmap[0] = 6;
        assert!(s.validate().unwrap_err().contains("trie size"));

        let mut s = small();
        s.precompiled_charsmap.truncate(3);
        assert!(s.validate().unwrap_err().contains("header"));

        let mut s = small();
        s.pieces.clear();
        assert!(s.validate().is_err());
    }

    #[test]
    fn vocab_len_counts_added_ids_beyond_pieces() {
        let mut s = small();
        assert_eq!(s.vocab_len(), 5);
        s.added_tokens.push(AddedToken {
            content: "<x>".into(),
            id: 9,
            special: false,
        });
        assert_eq!(s.vocab_len(), 10);
        s.validate().unwrap();
    }
}
