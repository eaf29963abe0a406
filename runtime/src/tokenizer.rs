//! The T5 prompt tokenizer: text → token ids, as diffusers' PixArt pipelines call
//! `T5TokenizerFast` (HF `tokenizers`, SentencePiece unigram).
//!
//! [`Tokenizer::encode`] runs the HF pipeline that transformers' T5 converter sets up:
//! 1. added tokens (`</s>`, `<pad>`, `<unk>`, `<extra_id_N>`) are found literally in the raw
//!    text, leftmost first and longest at a position (HF `AddedVocabulary`);
//! 2. each stretch of text between them is normalised with the precompiled `nmt_nfkc` charsmap
//!    (SentencePiece `Normalizer::NormalizePrefix`: the longest key that prefixes the remaining
//!    text is replaced; other characters pass through);
//! 3. pre-tokenised: split on whitespace (`WhitespaceSplit`, when
//!    `remove_extra_whitespaces`), `▁` prepended per the prepend scheme, spaces turned into
//!    `▁`, and split before every `▁` (`Metaspace(split=true)`);
//! 4. each piece of text is segmented by Viterbi over the unigram pieces (HF
//!    `Unigram::encode_optimized`: scores summed in f64, a character no piece starts with costs
//!    `min_score − 10` as `<unk>`, ties keep the earliest start), consecutive `<unk>` fused;
//! 5. `</s>` appended.
//!
//! One known difference from HF: HF's `Precompiled` normaliser looks rules up per extended
//! grapheme cluster (the whole cluster if under 6 bytes, else per char) while this follows
//! SentencePiece's longest match; they differ only for clusters of a base character plus
//! combining marks where the base alone has a rule (e.g. a fullwidth letter followed by a
//! combining accent). The fixtures' prompts (unicode, emoji, fullwidth, ligatures) agree.
//!
//! [`Tokenizer::encode_padded`] adds what `PixArtSigmaPipeline.encode_prompt` does around it
//! (diffusers 0.42 `_text_preprocessing` with `clean_caption=False`, then
//! `padding="max_length", truncation=True`).

use edge_schema::tokenizer::{split_charsmap, PrependScheme, TokenizerSpec};
use std::collections::HashMap;

/// The SentencePiece word-start marker `▁` (U+2581).
const SPACE_SYMBOL: char = '\u{2581}';

/// Score penalty of an unknown character below the lowest piece score (HF/SentencePiece
/// `kUnkPenalty`).
const UNK_PENALTY: f64 = 10.0;

/// Why a [`TokenizerSpec`] cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The spec failed [`TokenizerSpec::validate`].
    #[error("invalid tokenizer in plan: {reason}")]
    InvalidSpec { reason: String },
}

/// Ids and mask of one prompt, padded to a fixed length.
#[derive(Clone, Debug, PartialEq)]
pub struct PaddedTokens {
    /// Token ids `[max_len]`: the text tokens, `</s>`, then the pad id.
    pub ids: Vec<i32>,
    /// Attention mask `[max_len]`: 1.0 for the text tokens and `</s>`, 0.0 for padding.
    pub mask: Vec<f32>,
    /// Whether text tokens were dropped to fit (`max_len − 1` text tokens are kept).
    pub truncated: bool,
    /// Number of ids before truncation, `</s>` included.
    pub n_untruncated: usize,
}

/// A ready-to-use T5 tokenizer built from a plan's [`TokenizerSpec`].
#[derive(Clone, Debug)]
pub struct Tokenizer {
    /// Piece text → (id, score).
    pieces: HashMap<String, (u32, f64)>,
    /// Longest piece in bytes.
    max_piece_len: usize,
    /// `min_score − UNK_PENALTY`.
    unk_score: f64,
    /// `(content, id)` of the added tokens.
    added: Vec<(String, u32)>,
    /// Charsmap trie units and replacement strings.
    units: Vec<u32>,
    strings: Vec<u8>,
    unk_id: u32,
    eos_id: u32,
    pad_id: u32,
    remove_extra_whitespaces: bool,
    prepend_scheme: PrependScheme,
}

/// The pipeline's text preprocessing without `clean_caption`: Python `text.lower().strip()`.
///
/// `lower` is Unicode full lower-casing (Rust `to_lowercase`, which also applies the
/// final-sigma rule as CPython does); `strip` removes the characters Python's `str.isspace`
/// accepts (Unicode `White_Space` plus U+001C–U+001F) from both ends.
pub fn preprocess(text: &str) -> String {
    text.to_lowercase()
        .trim_matches(is_python_space)
        .to_string()
}

fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

impl Tokenizer {
    /// Builds the tokenizer; validates the spec first.
    ///
    /// Errors: [`TokenizerError::InvalidSpec`] with the validation message.
    pub fn new(spec: &TokenizerSpec) -> Result<Self, TokenizerError> {
        spec.validate()
            .map_err(|reason| TokenizerError::InvalidSpec { reason })?;
        let (units, strings) = split_charsmap(&spec.precompiled_charsmap)
            .map_err(|reason| TokenizerError::InvalidSpec { reason })?;
        let mut pieces = HashMap::with_capacity(spec.pieces.len());
        let mut min_score = f64::INFINITY;
        let mut max_piece_len = 0;
        for (id, p) in spec.pieces.iter().enumerate() {
            let score = f64::from(p.score);
            min_score = min_score.min(score);
            max_piece_len = max_piece_len.max(p.text.len());
            // validate() bounds the vocabulary far below u32::MAX.
            pieces.insert(p.text.clone(), (id as u32, score));
        }
        Ok(Tokenizer {
            pieces,
            max_piece_len,
            unk_score: min_score - UNK_PENALTY,
            added: spec
                .added_tokens
                .iter()
                .map(|t| (t.content.clone(), t.id))
                .collect(),
            units,
            strings: strings.to_vec(),
            unk_id: spec.unk_id,
            eos_id: spec.eos_id,
            pad_id: spec.pad_id,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            prepend_scheme: spec.prepend_scheme,
        })
    }

    /// The id of `</s>`.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// The id used for padding.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Token ids of `text`, ending with `</s>`: HF `tokenizer(text)["input_ids"]` with
    /// `add_special_tokens=True` and no truncation. The text is used as given (no
    /// lower-casing; see [`Tokenizer::encode_padded`]). Never empty.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut start = 0;
        while start < text.len() {
            match self.next_added(text, start) {
                Some((at, len, id)) => {
                    self.encode_segment(&text[start..at], start == 0, &mut ids);
                    ids.push(id);
                    start = at + len;
                }
                None => {
                    self.encode_segment(&text[start..], start == 0, &mut ids);
                    break;
                }
            }
        }
        ids.push(self.eos_id);
        ids
    }

    /// What diffusers' PixArt `encode_prompt` feeds the text encoder for one prompt:
    /// [`preprocess`] (`text.lower().strip()`), [`Tokenizer::encode`], then at most
    /// `max_len − 1` text tokens followed by `</s>`, padded with the pad id to exactly
    /// `max_len` (`padding="max_length", max_length=max_len, truncation=True`).
    ///
    /// Shapes: `ids` and `mask` are `[max_len]`. `max_len` is the pipeline's
    /// `max_sequence_length` (120 for PixArt-α, 300 for PixArt-Σ). With `max_len == 0` both
    /// are empty and `truncated` is true.
    pub fn encode_padded(&self, text: &str, max_len: usize) -> PaddedTokens {
        let mut ids = self.encode(&preprocess(text));
        let n_untruncated = ids.len();
        let truncated = n_untruncated > max_len;
        if truncated {
            ids.truncate(max_len.saturating_sub(1));
            if max_len > 0 {
                ids.push(self.eos_id);
            }
        }
        let n_real = ids.len();
        // validate() keeps every id at or below i32::MAX.
        let mut out: Vec<i32> = ids.into_iter().map(|id| id as i32).collect();
        out.resize(max_len, self.pad_id as i32);
        let mut mask = vec![1.0f32; n_real];
        mask.resize(max_len, 0.0);
        PaddedTokens {
            ids: out,
            mask,
            truncated,
            n_untruncated,
        }
    }

    /// The first added token at or after byte `from`: `(start, byte length, id)`, the longest
    /// one where several start at the same place.
    fn next_added(&self, text: &str, from: usize) -> Option<(usize, usize, u32)> {
        if self.added.is_empty() {
            return None;
        }
        for (i, _) in text[from..].char_indices() {
            let at = from + i;
            let rest = &text[at..];
            let best = self
                .added
                .iter()
                .filter(|(content, _)| rest.starts_with(content.as_str()))
                .max_by_key(|(content, _)| content.len());
            if let Some((content, id)) = best {
                return Some((at, content.len(), *id));
            }
        }
        None
    }

    /// Normalises, pre-tokenises and segments one stretch of text between added tokens.
    fn encode_segment(&self, text: &str, at_input_start: bool, ids: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let normalized = self.normalize(text);
        if self.remove_extra_whitespaces {
            let mut pos = 0;
            for word in normalized.split(char::is_whitespace) {
                if !word.is_empty() {
                    self.encode_word(word, at_input_start && pos == 0, ids);
                }
                pos += word.len() + 1;
            }
        } else {
            self.encode_word(&normalized, at_input_start, ids);
        }
    }

    /// Metaspace: spaces → `▁`, prepend `▁` per the scheme, split before every `▁`, then
    /// Viterbi on each part.
    fn encode_word(&self, word: &str, at_input_start: bool, ids: &mut Vec<u32>) {
        let mut w: String = word
            .chars()
            .map(|c| if c == ' ' { SPACE_SYMBOL } else { c })
            .collect();
        let prepend = match self.prepend_scheme {
            PrependScheme::Always => true,
            PrependScheme::First => at_input_start,
            PrependScheme::Never => false,
        };
        if prepend && !w.starts_with(SPACE_SYMBOL) {
            w.insert(0, SPACE_SYMBOL);
        }
        let mut start = 0;
        for (i, c) in w.char_indices() {
            if c == SPACE_SYMBOL && i > start {
                self.viterbi(&w[start..i], ids);
                start = i;
            }
        }
        self.viterbi(&w[start..], ids);
    }

    /// Applies the charsmap: at each position the longest matching key is replaced by its
    /// replacement, otherwise one character is copied.
    fn normalize(&self, text: &str) -> String {
        if self.units.is_empty() {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut pos = 0;
        while let Some(c) = text[pos..].chars().next() {
            match self.longest_rule(&text[pos..]) {
                Some((len, replacement)) => {
                    out.push_str(replacement);
                    pos += len;
                }
                None => {
                    out.push(c);
                    pos += c.len_utf8();
                }
            }
        }
        out
    }

    /// darts-clone `commonPrefixSearch` over the charsmap trie, keeping the longest key that
    /// ends on a character boundary and has a readable replacement. Every unit access is
    /// bounds-checked, so a damaged trie only loses rules.
    fn longest_rule(&self, rest: &str) -> Option<(usize, &str)> {
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
        let mut node = offset(*self.units.first()?);
        let mut best = None;
        for (i, &c) in rest.as_bytes().iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= usize::from(c);
            let Some(&unit) = self.units.get(node) else {
                break;
            };
            if unit & ((1 << 31) | 0xff) != u32::from(c) {
                break;
            }
            node ^= offset(unit);
            if (unit >> 8) & 1 == 1 && rest.is_char_boundary(i + 1) {
                if let Some(&leaf) = self.units.get(node) {
                    if let Some(r) = self.replacement((leaf & 0x7fff_ffff) as usize) {
                        best = Some((i + 1, r));
                    }
                }
            }
        }
        best
    }

    /// The NUL-terminated replacement string at `offset`, if it is in range and UTF-8.
    fn replacement(&self, offset: usize) -> Option<&str> {
        let tail = self.strings.get(offset..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&tail[..end]).ok()
    }

    /// Best unigram segmentation of `s` (HF `Unigram::encode_optimized` with `fuse_unk`).
    fn viterbi(&self, s: &str, ids: &mut Vec<u32>) {
        if s.is_empty() {
            return;
        }
        #[derive(Clone, Copy)]
        struct Best {
            score: f64,
            start: Option<usize>,
            id: u32,
        }
        let n = s.len();
        let mut best = vec![
            Best {
                score: 0.0,
                start: None,
                id: 0,
            };
            n + 1
        ];
        let relax = |best: &mut [Best], from: usize, to: usize, score: f64, id: u32| {
            let cand = best[from].score + score;
            let t = &mut best[to];
            if t.start.is_none() || cand > t.score {
                *t = Best {
                    score: cand,
                    start: Some(from),
                    id,
                };
            }
        };
        for (start, c) in s.char_indices() {
            let char_len = c.len_utf8();
            let mut has_single = false;
            for (off, ch) in s[start..].char_indices() {
                let end = start + off + ch.len_utf8();
                if end - start > self.max_piece_len {
                    break;
                }
                if let Some(&(id, score)) = self.pieces.get(&s[start..end]) {
                    relax(&mut best, start, end, score, id);
                    has_single |= end - start == char_len;
                }
            }
            if !has_single {
                relax(
                    &mut best,
                    start,
                    start + char_len,
                    self.unk_score,
                    self.unk_id,
                );
            }
        }
        // Backtrack: spans in reverse order, consecutive <unk> spans fused into one.
        let mut spans: Vec<(usize, usize, u32)> = Vec::new();
        let mut end = n;
        while end > 0 {
            let b = best[end];
            let Some(start) = b.start else {
                // Unreachable: every character has an <unk> fallback edge.
                spans.push((0, end, self.unk_id));
                break;
            };
            match spans.last_mut() {
                Some(last) if b.id == self.unk_id && last.2 == self.unk_id => last.0 = start,
                _ => spans.push((start, end, b.id)),
            }
            end = start;
        }
        for &(a, b, id) in spans.iter().rev() {
            if id == self.unk_id {
                let text = &s[a..b];
                ids.push(self.pieces.get(text).map_or(self.unk_id, |p| p.0));
            } else {
                ids.push(id);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use edge_schema::tokenizer::{AddedToken, Piece};

    /// A hand-made vocabulary; expected segmentations follow from the scores by hand.
    fn spec() -> TokenizerSpec {
        let piece = |t: &str, s: f32| Piece {
            text: t.into(),
            score: s,
        };
        TokenizerSpec {
            pieces: vec![
                piece("<pad>", 0.0),
                piece("</s>", 0.0),
                piece("<unk>", 0.0),
                piece("▁", -2.0),
                piece("▁a", -1.0),
                piece("b", -3.0),
                piece("▁ab", -3.5),
                piece("a", -3.0),
                piece("<extra_id_0>", 0.0),
            ],
            added_tokens: vec![
                AddedToken {
                    content: "<pad>".into(),
                    id: 0,
                    special: true,
                },
                AddedToken {
                    content: "</s>".into(),
                    id: 1,
                    special: true,
                },
                AddedToken {
                    content: "<extra_id_0>".into(),
                    id: 8,
                    special: true,
                },
            ],
            unk_id: 2,
            eos_id: 1,
            pad_id: 0,
            precompiled_charsmap: Vec::new(),
            remove_extra_whitespaces: true,
            prepend_scheme: PrependScheme::Always,
        }
    }

    #[test]
    fn viterbi_picks_the_highest_total_score() {
        let t = Tokenizer::new(&spec()).unwrap();
        // "▁ab": ▁ab = -3.5 beats ▁a + b = -4.0 and ▁ + a + b = -8.0.
        assert_eq!(t.encode("ab"), vec![6, 1]);
        // "▁a" alone: -1.0.
        assert_eq!(t.encode("a"), vec![4, 1]);
        assert_eq!(t.encode(""), vec![1]);
    }

    #[test]
    fn unknown_runs_fuse_into_one_unk() {
        let t = Tokenizer::new(&spec()).unwrap();
        // "▁xyz": ▁ then x, y, z unknown → one <unk>.
        assert_eq!(t.encode("xyz"), vec![3, 2, 1]);
        // "▁axb": ▁a, <unk>, b.
        assert_eq!(t.encode("axb"), vec![4, 2, 5, 1]);
    }

    #[test]
    fn added_tokens_split_the_text_and_words_get_a_prefix() {
        let t = Tokenizer::new(&spec()).unwrap();
        assert_eq!(t.encode("a<extra_id_0>b</s>"), vec![4, 8, 3, 5, 1, 1]);
        assert_eq!(t.encode("  a \t b "), vec![4, 3, 5, 1]);
    }

    #[test]
    fn prepend_first_only_marks_the_first_word() {
        let mut s = spec();
        s.prepend_scheme = PrependScheme::First;
        let t = Tokenizer::new(&s).unwrap();
        // "a b" → "▁a", "b"
        assert_eq!(t.encode("a b"), vec![4, 5, 1]);
        s.prepend_scheme = PrependScheme::Never;
        let t = Tokenizer::new(&s).unwrap();
        assert_eq!(t.encode("a b"), vec![7, 5, 1]);
    }

    #[test]
    fn padding_and_truncation() {
        let t = Tokenizer::new(&spec()).unwrap();
        let p = t.encode_padded("  A A A ", 3);
        assert_eq!(p.ids, vec![4, 4, 1]);
        assert_eq!(p.mask, vec![1.0, 1.0, 1.0]);
        assert!(p.truncated);
        assert_eq!(p.n_untruncated, 4);
        let p = t.encode_padded("", 4);
        assert_eq!(p.ids, vec![1, 0, 0, 0]);
        assert_eq!(p.mask, vec![1.0, 0.0, 0.0, 0.0]);
        assert!(!p.truncated);
        let p = t.encode_padded("a", 0);
        assert!(p.ids.is_empty() && p.mask.is_empty() && p.truncated);
    }

    #[test]
    fn preprocess_is_python_lower_strip() {
        assert_eq!(preprocess("  A Cat\u{1f}\n"), "a cat");
        assert_eq!(preprocess("ΣΑΣ"), "σας");
        assert_eq!(preprocess("\u{3000}İ"), "i\u{307}");
    }

    #[test]
    fn invalid_spec_is_refused() {
        let mut s = spec();
        s.unk_id = 99;
        assert!(matches!(
            Tokenizer::new(&s),
            Err(TokenizerError::InvalidSpec { .. })
        ));
    }
}
