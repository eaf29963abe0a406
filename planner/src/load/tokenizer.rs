//! Reads a diffusers `tokenizer/` folder (T5, SentencePiece unigram) into a [`TokenizerSpec`].
//!
//! Two sources give the same spec:
//! * `tokenizer.json` (HF `tokenizers` format, as transformers' T5 converter writes it):
//!   normalizer `Precompiled` (base64 `precompiled_charsmap`), pre-tokenizer
//!   `Sequence[WhitespaceSplit, Metaspace(▁)]` or `Metaspace(▁)`, model `Unigram`
//!   (`vocab: [[piece, score], …]`, `unk_id`), post-processor `TemplateProcessing` that appends
//!   `</s>`, and `added_tokens`.
//! * `spiece.model` (SentencePiece `ModelProto` protobuf) plus `tokenizer_config.json`, turned
//!   into the tokenizer transformers would build from it (`T5Converter`): the pieces, then the
//!   sentinels `<extra_id_{N-1}>` … `<extra_id_0>` (score 0) with ids `n_pieces..n_pieces+N`,
//!   `N = extra_ids` (default 100, as `T5Tokenizer`), and `<pad>`, `</s>`, `<unk>` and the
//!   sentinels as added tokens. Real PixArt folders ship only this file.
//!
//! The `precompiled_charsmap` (a darts-clone double-array trie followed by NUL-terminated
//! replacement strings, SentencePiece `normalizer.cc`) is carried as is; before it goes into a
//! spec, [`walk_charsmap`] visits every key of its trie and checks that each one is UTF-8 and
//! points at a NUL-terminated UTF-8 replacement.

use edge_schema::tokenizer::{split_charsmap, AddedToken, Piece, PrependScheme, TokenizerSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The SentencePiece word-start marker `▁` (U+2581).
const SPACE_SYMBOL: &str = "\u{2581}";

/// Number of `<extra_id_N>` sentinels `T5Tokenizer` adds when `tokenizer_config.json` does not
/// say (`extra_ids=100`).
pub const DEFAULT_EXTRA_IDS: usize = 100;

/// Longest key the charsmap trie may hold, in bytes (`nmt_nfkc`: 12).
const MAX_CHARSMAP_KEY: usize = 1024;

/// Most trie nodes [`walk_charsmap`] visits (`nmt_nfkc`: 262 842 nodes, 225 276 keys; the
/// darts-clone trie shares suffixes, so nodes are visited once per key path).
const MAX_CHARSMAP_VISITS: usize = 1 << 24;

/// Why a tokenizer folder or file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerLoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A field is missing or has the wrong type or value.
    #[error("{path}: {what}")]
    Malformed { path: PathBuf, what: String },
    /// The protobuf of `spiece.model` does not decode.
    #[error(
        "{path}: not a SentencePiece model (its protobuf is malformed at byte {offset}: {what}); \
         a tokenizer is a spiece.model or a tokenizer.json"
    )]
    Protobuf {
        path: PathBuf,
        offset: usize,
        what: String,
    },
    /// The file describes a tokenizer feature the runtime does not implement.
    #[error("{path}: unsupported tokenizer: {what}")]
    Unsupported { path: PathBuf, what: String },
    /// The folder has neither `tokenizer.json` nor `spiece.model`.
    #[error("{dir}: no tokenizer.json or spiece.model")]
    NoTokenizerFile { dir: PathBuf },
    /// The spec built from the file is inconsistent ([`TokenizerSpec::validate`]).
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

type Result<T> = std::result::Result<T, TokenizerLoadError>;

fn malformed(path: &Path, what: impl Into<String>) -> TokenizerLoadError {
    TokenizerLoadError::Malformed {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

fn unsupported(path: &Path, what: impl Into<String>) -> TokenizerLoadError {
    TokenizerLoadError::Unsupported {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TokenizerLoadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = read_bytes(path)?;
    serde_json::from_slice(&bytes).map_err(|source| TokenizerLoadError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn finish(path: &Path, spec: TokenizerSpec) -> Result<TokenizerSpec> {
    spec.validate()
        .map_err(|reason| TokenizerLoadError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
    Ok(spec)
}

/// Loads the tokenizer of a diffusers `tokenizer/` folder.
///
/// Uses `tokenizer.json` when present, else `spiece.model`. `tokenizer_config.json`, when
/// present, gives `pad_token` (default `<pad>`), and for `spiece.model` also `extra_ids`
/// (default [`DEFAULT_EXTRA_IDS`]) and `legacy` (default true).
///
/// Errors: [`TokenizerLoadError::NoTokenizerFile`] when neither file exists, and every error
/// of [`load_tokenizer_json`] / [`load_spiece_model`] or of reading `tokenizer_config.json`.
pub fn load_tokenizer_dir(dir: &Path) -> Result<TokenizerSpec> {
    let config = TokenizerConfig::read(dir)?;
    let json = dir.join("tokenizer.json");
    if json.is_file() {
        return tokenizer_json_with(&json, &config.pad_token);
    }
    let spm = dir.join("spiece.model");
    if spm.is_file() {
        return spiece_model_with(&spm, &config);
    }
    Err(TokenizerLoadError::NoTokenizerFile {
        dir: dir.to_path_buf(),
    })
}

/// What `tokenizer_config.json` contributes (transformers' defaults when a key is absent).
#[derive(Clone, Debug)]
struct TokenizerConfig {
    pad_token: String,
    extra_ids: usize,
    legacy: bool,
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        TokenizerConfig {
            pad_token: "<pad>".into(),
            extra_ids: DEFAULT_EXTRA_IDS,
            legacy: true,
        }
    }
}

impl TokenizerConfig {
    fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        let mut config = TokenizerConfig::default();
        if !path.is_file() {
            return Ok(config);
        }
        let v = read_json(&path)?;
        match v.get("pad_token") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => config.pad_token = s.clone(),
            Some(obj) => match obj.get("content").and_then(Value::as_str) {
                Some(s) => config.pad_token = s.to_string(),
                None => {
                    return Err(malformed(
                        &path,
                        "pad_token: expected a string or {\"content\": string}",
                    ))
                }
            },
        }
        match v.get("extra_ids") {
            None | Some(Value::Null) => {}
            Some(n) => {
                config.extra_ids = n
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n <= 100_000)
                    .ok_or_else(|| {
                        malformed(&path, format!("extra_ids: expected 0..=100000, got {n}"))
                    })?;
            }
        }
        match v.get("legacy") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => config.legacy = *b,
            Some(other) => {
                return Err(malformed(
                    &path,
                    format!("legacy: expected a bool, got {other}"),
                ))
            }
        }
        Ok(config)
    }
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json
// ---------------------------------------------------------------------------------------------

/// Loads an HF `tokenizer.json` (Unigram model) with pad token `<pad>`.
///
/// Supported: normalizer `Precompiled` (alone or as the only member of a `Sequence`) or none;
/// pre-tokenizer `Sequence[WhitespaceSplit, Metaspace]` or `Metaspace` with replacement `▁`
/// and `split=true`; post-processor `TemplateProcessing` whose single template is
/// `[$A, <special>]` (the special token becomes `eos_id`); added tokens without
/// `lstrip`/`rstrip`/`single_word`. Added tokens marked `normalized` are matched in the raw
/// text like the others (identical for ASCII tokens such as `<extra_id_0>`).
///
/// Errors: I/O, JSON, [`TokenizerLoadError::Malformed`] naming the field,
/// [`TokenizerLoadError::Unsupported`] for other configurations (BPE/WordPiece models,
/// `byte_fallback`, other normalizers), [`TokenizerLoadError::Invalid`] from validation.
pub fn load_tokenizer_json(path: &Path) -> Result<TokenizerSpec> {
    tokenizer_json_with(path, &TokenizerConfig::default().pad_token)
}

fn tokenizer_json_with(path: &Path, pad_token: &str) -> Result<TokenizerSpec> {
    let root = read_json(path)?;

    let model = root
        .get("model")
        .ok_or_else(|| malformed(path, "missing \"model\""))?;
    let model_type = model.get("type").and_then(Value::as_str).unwrap_or("");
    if model_type != "Unigram" {
        return Err(unsupported(
            path,
            format!("model.type {model_type:?} (only \"Unigram\")"),
        ));
    }
    if model.get("byte_fallback").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(path, "model.byte_fallback = true"));
    }
    let vocab = model
        .get("vocab")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed(path, "model.vocab: expected an array"))?;
    let mut pieces = Vec::with_capacity(vocab.len());
    for (i, entry) in vocab.iter().enumerate() {
        let pair = entry.as_array().filter(|a| a.len() == 2);
        let text = pair.and_then(|a| a[0].as_str());
        let score = pair.and_then(|a| a[1].as_f64());
        match (text, score) {
            (Some(text), Some(score)) => pieces.push(Piece {
                text: text.to_string(),
                score: score as f32,
            }),
            _ => {
                return Err(malformed(
                    path,
                    format!("model.vocab[{i}]: expected [string, number], got {entry}"),
                ))
            }
        }
    }
    let unk_id = model
        .get("unk_id")
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| malformed(path, "model.unk_id: expected a non-negative integer"))?;

    let precompiled_charsmap = match root.get("normalizer") {
        None | Some(Value::Null) => Vec::new(),
        Some(n) => json_normalizer(path, n)?,
    };

    let (remove_extra_whitespaces, prepend_scheme) = match root.get("pre_tokenizer") {
        Some(p) => json_pre_tokenizer(path, p)?,
        None => return Err(malformed(path, "missing \"pre_tokenizer\"")),
    };

    let mut added_tokens = Vec::new();
    if let Some(list) = root.get("added_tokens") {
        let list = list
            .as_array()
            .ok_or_else(|| malformed(path, "added_tokens: expected an array"))?;
        for (i, t) in list.iter().enumerate() {
            added_tokens.push(json_added_token(path, i, t)?);
        }
    }
    added_tokens.sort_by_key(|t| t.id);

    let eos_name = json_eos_token(path, root.get("post_processor"))?;
    let eos_id = eos_name
        .1
        .or_else(|| token_id(&pieces, &added_tokens, &eos_name.0))
        .ok_or_else(|| {
            malformed(
                path,
                format!(
                    "post_processor token {:?} is not in the vocabulary",
                    eos_name.0
                ),
            )
        })?;
    let pad_id = token_id(&pieces, &added_tokens, pad_token).ok_or_else(|| {
        malformed(
            path,
            format!("pad token {pad_token:?} is not in the vocabulary"),
        )
    })?;

    finish(
        path,
        TokenizerSpec {
            pieces,
            added_tokens,
            unk_id,
            eos_id,
            pad_id,
            precompiled_charsmap,
            remove_extra_whitespaces,
            prepend_scheme,
        },
    )
}

/// Id of `text` as an added token, else as a piece.
fn token_id(pieces: &[Piece], added: &[AddedToken], text: &str) -> Option<u32> {
    added
        .iter()
        .find(|t| t.content == text)
        .map(|t| t.id)
        .or_else(|| {
            pieces
                .iter()
                .position(|p| p.text == text)
                .and_then(|i| u32::try_from(i).ok())
        })
}

/// Returns the decoded `precompiled_charsmap` (empty: no normalisation).
fn json_normalizer(path: &Path, n: &Value) -> Result<Vec<u8>> {
    let ty = n.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "Precompiled" => match n.get("precompiled_charsmap") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::String(b64)) => {
                let blob = base64_decode(b64).map_err(|what| {
                    malformed(path, format!("normalizer.precompiled_charsmap: {what}"))
                })?;
                walk_charsmap(&blob, |_, _| ()).map_err(|what| {
                    malformed(path, format!("normalizer.precompiled_charsmap: {what}"))
                })?;
                Ok(blob)
            }
            Some(other) => Err(malformed(
                path,
                format!("normalizer.precompiled_charsmap: expected a base64 string, got {other}"),
            )),
        },
        "Sequence" => {
            let list = n
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or_else(|| malformed(path, "normalizer.normalizers: expected an array"))?;
            match list.as_slice() {
                [] => Ok(Vec::new()),
                [one] => json_normalizer(path, one),
                _ => Err(unsupported(
                    path,
                    format!(
                        "normalizer Sequence of {} normalizers (only a single Precompiled)",
                        list.len()
                    ),
                )),
            }
        }
        other => Err(unsupported(
            path,
            format!("normalizer type {other:?} (only \"Precompiled\")"),
        )),
    }
}

/// Returns `(remove_extra_whitespaces, prepend_scheme)`.
fn json_pre_tokenizer(path: &Path, p: &Value) -> Result<(bool, PrependScheme)> {
    let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "Metaspace" => Ok((false, json_metaspace(path, p)?)),
        "Sequence" => {
            let list = p
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| malformed(path, "pre_tokenizer.pretokenizers: expected an array"))?;
            let types: Vec<&str> = list
                .iter()
                .map(|x| x.get("type").and_then(Value::as_str).unwrap_or(""))
                .collect();
            match (types.as_slice(), list.as_slice()) {
                (["WhitespaceSplit", "Metaspace"], [_, meta]) => {
                    Ok((true, json_metaspace(path, meta)?))
                }
                (["Metaspace"], [meta]) => Ok((false, json_metaspace(path, meta)?)),
                _ => Err(unsupported(
                    path,
                    format!(
                        "pre_tokenizer Sequence {types:?} (only [WhitespaceSplit, Metaspace] \
                         or [Metaspace])"
                    ),
                )),
            }
        }
        other => Err(unsupported(
            path,
            format!(
                "pre_tokenizer type {other:?} (only Metaspace, optionally after WhitespaceSplit)"
            ),
        )),
    }
}

fn json_metaspace(path: &Path, m: &Value) -> Result<PrependScheme> {
    let replacement = m.get("replacement").and_then(Value::as_str);
    if replacement != Some(SPACE_SYMBOL) {
        return Err(unsupported(
            path,
            format!("Metaspace replacement {replacement:?} (only \"▁\")"),
        ));
    }
    if m.get("split").and_then(Value::as_bool) == Some(false) {
        return Err(unsupported(path, "Metaspace split = false"));
    }
    match (
        m.get("prepend_scheme").and_then(Value::as_str),
        m.get("add_prefix_space").and_then(Value::as_bool),
    ) {
        (Some("always"), _) => Ok(PrependScheme::Always),
        (Some("first"), _) => Ok(PrependScheme::First),
        (Some("never"), _) => Ok(PrependScheme::Never),
        (Some(other), _) => Err(malformed(
            path,
            format!("Metaspace prepend_scheme {other:?} (expected always/first/never)"),
        )),
        (None, Some(true)) => Ok(PrependScheme::Always),
        (None, Some(false)) => Ok(PrependScheme::Never),
        (None, None) => Err(malformed(
            path,
            "Metaspace: neither prepend_scheme nor add_prefix_space",
        )),
    }
}

fn json_added_token(path: &Path, i: usize, t: &Value) -> Result<AddedToken> {
    let content = t.get("content").and_then(Value::as_str).ok_or_else(|| {
        malformed(
            path,
            format!("added_tokens[{i}].content: expected a string"),
        )
    })?;
    let id = t
        .get("id")
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| malformed(path, format!("added_tokens[{i}].id: expected a u32")))?;
    for flag in ["lstrip", "rstrip", "single_word"] {
        if t.get(flag).and_then(Value::as_bool) == Some(true) {
            return Err(unsupported(
                path,
                format!("added token {content:?} has {flag} = true"),
            ));
        }
    }
    Ok(AddedToken {
        content: content.to_string(),
        id,
        special: t.get("special").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// The token the post-processor appends: `(text, id from the template if it gives one)`.
fn json_eos_token(path: &Path, p: Option<&Value>) -> Result<(String, Option<u32>)> {
    let Some(p) = p.filter(|p| !p.is_null()) else {
        return Err(unsupported(
            path,
            "no post_processor (the T5 encoder expects </s> appended)",
        ));
    };
    let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
    if ty != "TemplateProcessing" {
        return Err(unsupported(
            path,
            format!("post_processor type {ty:?} (only TemplateProcessing)"),
        ));
    }
    let single = p
        .get("single")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed(path, "post_processor.single: expected an array"))?;
    let name = match single.as_slice() {
        [a, b] if a.get("Sequence").is_some() => b
            .get("SpecialToken")
            .and_then(|s| s.get("id"))
            .and_then(Value::as_str),
        _ => None,
    }
    .ok_or_else(|| {
        unsupported(
            path,
            "post_processor.single is not [$A, <special token>] (T5 appends </s>)",
        )
    })?;
    let id = p
        .get("special_tokens")
        .and_then(|s| s.get(name))
        .and_then(|s| s.get("ids"))
        .and_then(Value::as_array)
        .and_then(|ids| match ids.as_slice() {
            [one] => one.as_u64().and_then(|v| u32::try_from(v).ok()),
            _ => None,
        });
    Ok((name.to_string(), id))
}

// ---------------------------------------------------------------------------------------------
// spiece.model
// ---------------------------------------------------------------------------------------------

/// Loads a SentencePiece `spiece.model` as transformers' T5 converter would, with
/// [`DEFAULT_EXTRA_IDS`] sentinels, pad token `<pad>` and `legacy=true`
/// (see [`load_tokenizer_dir`] for the folder form that reads `tokenizer_config.json`).
///
/// Fields read (`sentencepiece_model.proto`): `pieces` (piece, score, type),
/// `trainer_spec` (`model_type`, `byte_fallback`, `unk_id`, `eos_id`, `pad_id`),
/// `normalizer_spec` (`precompiled_charsmap`, `add_dummy_prefix`, `remove_extra_whitespaces`,
/// `escape_whitespaces`).
///
/// Errors: I/O, [`TokenizerLoadError::Protobuf`] with the byte offset,
/// [`TokenizerLoadError::Unsupported`] for non-unigram models, byte fallback, user-defined
/// pieces or `escape_whitespaces=false`, [`TokenizerLoadError::Malformed`] for bad ids or a
/// bad charsmap, [`TokenizerLoadError::Invalid`] from validation.
pub fn load_spiece_model(path: &Path) -> Result<TokenizerSpec> {
    spiece_model_with(path, &TokenizerConfig::default())
}

/// SentencePiece piece types (`ModelProto.SentencePiece.Type`).
const PIECE_USER_DEFINED: u64 = 4;
const PIECE_BYTE: u64 = 6;

#[derive(Debug)]
struct SpmModel {
    pieces: Vec<(String, f32, u64)>,
    model_type: u64,
    byte_fallback: bool,
    unk_id: i64,
    eos_id: i64,
    pad_id: i64,
    charsmap: Vec<u8>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
}

fn spiece_model_with(path: &Path, config: &TokenizerConfig) -> Result<TokenizerSpec> {
    let bytes = read_bytes(path)?;
    let m = parse_model_proto(&bytes).map_err(|(offset, what)| TokenizerLoadError::Protobuf {
        path: path.to_path_buf(),
        offset,
        what,
    })?;
    if m.model_type != 1 {
        return Err(unsupported(
            path,
            format!(
                "trainer_spec.model_type {} (only UNIGRAM = 1)",
                m.model_type
            ),
        ));
    }
    if m.byte_fallback {
        return Err(unsupported(path, "trainer_spec.byte_fallback = true"));
    }
    if !m.escape_whitespaces {
        return Err(unsupported(
            path,
            "normalizer_spec.escape_whitespaces = false",
        ));
    }
    if let Some((text, _, ty)) = m
        .pieces
        .iter()
        .find(|p| p.2 == PIECE_USER_DEFINED || p.2 == PIECE_BYTE)
    {
        return Err(unsupported(
            path,
            format!("piece {text:?} has type {ty} (user-defined/byte pieces)"),
        ));
    }
    let n = m.pieces.len();
    let id_of = |name: &str, v: i64| -> Result<u32> {
        usize::try_from(v)
            .ok()
            .filter(|&i| i < n)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| {
                malformed(
                    path,
                    format!("trainer_spec.{name} = {v} is not a piece id (0..{n})"),
                )
            })
    };
    let unk_id = id_of("unk_id", m.unk_id)?;
    let eos_id = id_of("eos_id", m.eos_id)?;

    walk_charsmap(&m.charsmap, |_, _| ()).map_err(|what| {
        malformed(
            path,
            format!("normalizer_spec.precompiled_charsmap: {what}"),
        )
    })?;

    let mut pieces: Vec<Piece> = m
        .pieces
        .iter()
        .map(|(text, score, _)| Piece {
            text: text.clone(),
            score: *score,
        })
        .collect();
    let mut added_tokens = Vec::new();
    let mut special_ids = vec![unk_id, eos_id];
    if m.pad_id >= 0 {
        special_ids.push(id_of("pad_id", m.pad_id)?);
    }
    for id in special_ids {
        let content = pieces[id as usize].text.clone();
        if !added_tokens.iter().any(|t: &AddedToken| t.id == id) {
            added_tokens.push(AddedToken {
                content,
                id,
                special: true,
            });
        }
    }
    for k in (0..config.extra_ids).rev() {
        let id = u32::try_from(pieces.len())
            .map_err(|_| malformed(path, "too many pieces for u32 ids"))?;
        let content = format!("<extra_id_{k}>");
        pieces.push(Piece {
            text: content.clone(),
            score: 0.0,
        });
        added_tokens.push(AddedToken {
            content,
            id,
            special: true,
        });
    }
    added_tokens.sort_by_key(|t| t.id);

    let pad_id = token_id(&pieces, &added_tokens, &config.pad_token).ok_or_else(|| {
        malformed(
            path,
            format!("pad token {:?} is not in the vocabulary", config.pad_token),
        )
    })?;
    let prepend_scheme = match (m.add_dummy_prefix, config.legacy) {
        (false, _) => PrependScheme::Never,
        (true, true) => PrependScheme::Always,
        (true, false) => PrependScheme::First,
    };

    finish(
        path,
        TokenizerSpec {
            pieces,
            added_tokens,
            unk_id,
            eos_id,
            pad_id,
            precompiled_charsmap: m.charsmap,
            remove_extra_whitespaces: m.remove_extra_whitespaces,
            prepend_scheme,
        },
    )
}

/// One protobuf field value (wire types 0, 1, 2, 5).
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Protobuf reader over one message; errors are `(absolute byte offset, what)`.
struct ProtoReader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

type ProtoResult<T> = std::result::Result<T, (usize, String)>;

impl<'a> ProtoReader<'a> {
    fn new(buf: &'a [u8], base: usize) -> Self {
        ProtoReader { buf, pos: 0, base }
    }

    fn err<T>(&self, what: impl Into<String>) -> ProtoResult<T> {
        Err((self.base + self.pos, what.into()))
    }

    fn varint(&mut self) -> ProtoResult<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return self.err("truncated varint");
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.err("varint longer than 10 bytes")
    }

    fn take(&mut self, n: usize) -> ProtoResult<&'a [u8]> {
        match self.pos.checked_add(n).filter(|&e| e <= self.buf.len()) {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => self.err(format!(
                "field of {n} bytes runs past the end of its message ({} bytes left)",
                self.buf.len() - self.pos
            )),
        }
    }

    /// Next `(field number, value, absolute offset of the value)`, or `None` at the end.
    fn next_field(&mut self) -> ProtoResult<Option<(u64, Wire<'a>, usize)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = key >> 3;
        let at = self.base + self.pos;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed64
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).or_else(|_| self.err("length overflows usize"))?;
                let at = self.base + self.pos;
                return Ok(Some((field, Wire::Bytes(self.take(len)?), at)));
            }
            5 => {
                let b = self.take(4)?;
                Wire::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => return self.err(format!("field {field} has unsupported wire type {w}")),
        };
        Ok(Some((field, value, at)))
    }
}

fn expect_varint(v: Wire<'_>, at: usize, name: &str) -> ProtoResult<u64> {
    match v {
        Wire::Varint(x) => Ok(x),
        _ => Err((at, format!("{name}: expected a varint"))),
    }
}

fn expect_bytes<'a>(v: Wire<'a>, at: usize, name: &str) -> ProtoResult<&'a [u8]> {
    match v {
        Wire::Bytes(b) => Ok(b),
        _ => Err((at, format!("{name}: expected a length-delimited field"))),
    }
}

fn expect_string(v: Wire<'_>, at: usize, name: &str) -> ProtoResult<String> {
    let b = expect_bytes(v, at, name)?;
    String::from_utf8(b.to_vec()).map_err(|_| (at, format!("{name}: not valid UTF-8")))
}

/// `int32` fields are varints holding the two's complement of the sign-extended value.
fn as_int32(x: u64) -> i64 {
    i64::from(x as u32 as i32)
}

fn parse_model_proto(buf: &[u8]) -> ProtoResult<SpmModel> {
    let mut m = SpmModel {
        pieces: Vec::new(),
        model_type: 1,
        byte_fallback: false,
        unk_id: 0,
        eos_id: 2,
        pad_id: -1,
        charsmap: Vec::new(),
        add_dummy_prefix: true,
        remove_extra_whitespaces: true,
        escape_whitespaces: true,
    };
    let mut r = ProtoReader::new(buf, 0);
    while let Some((field, v, at)) = r.next_field()? {
        match field {
            1 => {
                let b = expect_bytes(v, at, "pieces")?;
                m.pieces.push(parse_piece(b, at)?);
            }
            2 => parse_trainer_spec(expect_bytes(v, at, "trainer_spec")?, at, &mut m)?,
            3 => parse_normalizer_spec(expect_bytes(v, at, "normalizer_spec")?, at, &mut m)?,
            _ => {}
        }
    }
    if m.pieces.is_empty() {
        return Err((0, "no pieces".into()));
    }
    Ok(m)
}

fn parse_piece(buf: &[u8], base: usize) -> ProtoResult<(String, f32, u64)> {
    let mut text = None;
    let mut score = 0.0f32;
    let mut ty = 1u64;
    let mut r = ProtoReader::new(buf, base);
    while let Some((field, v, at)) = r.next_field()? {
        match field {
            1 => text = Some(expect_string(v, at, "piece")?),
            2 => match v {
                Wire::Fixed32(bits) => score = f32::from_bits(bits),
                _ => return Err((at, "score: expected a 32-bit float".into())),
            },
            3 => ty = expect_varint(v, at, "type")?,
            _ => {}
        }
    }
    let text = text.ok_or((base, "piece without text".to_string()))?;
    Ok((text, score, ty))
}

fn parse_trainer_spec(buf: &[u8], base: usize, m: &mut SpmModel) -> ProtoResult<()> {
    let mut r = ProtoReader::new(buf, base);
    while let Some((field, v, at)) = r.next_field()? {
        match field {
            3 => m.model_type = expect_varint(v, at, "model_type")?,
            35 => m.byte_fallback = expect_varint(v, at, "byte_fallback")? != 0,
            40 => m.unk_id = as_int32(expect_varint(v, at, "unk_id")?),
            42 => m.eos_id = as_int32(expect_varint(v, at, "eos_id")?),
            43 => m.pad_id = as_int32(expect_varint(v, at, "pad_id")?),
            _ => {}
        }
    }
    Ok(())
}

fn parse_normalizer_spec(buf: &[u8], base: usize, m: &mut SpmModel) -> ProtoResult<()> {
    let mut r = ProtoReader::new(buf, base);
    while let Some((field, v, at)) = r.next_field()? {
        match field {
            2 => m.charsmap = expect_bytes(v, at, "precompiled_charsmap")?.to_vec(),
            3 => m.add_dummy_prefix = expect_varint(v, at, "add_dummy_prefix")? != 0,
            4 => {
                m.remove_extra_whitespaces = expect_varint(v, at, "remove_extra_whitespaces")? != 0
            }
            5 => m.escape_whitespaces = expect_varint(v, at, "escape_whitespaces")? != 0,
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// precompiled charsmap and base64
// ---------------------------------------------------------------------------------------------

/// Visits every `(key, replacement)` rule of a SentencePiece `precompiled_charsmap` and
/// returns how many there are.
///
/// Layout (SentencePiece `normalizer.cc`, `DecodePrecompiledCharsMap`): little-endian `u32`
/// trie size in bytes, the darts-clone double array (`u32` units), then the replacement
/// strings, each NUL-terminated; a trie value is a byte offset into that string area.
/// A darts-clone unit holds `has_leaf = bit 8`, `label = bits 0..8 | bit 31`,
/// `offset = (unit >> 10) << ((unit & 1<<9) >> 6)`, `value = unit & 0x7fff_ffff`; the child of
/// node `p` with byte `c` sits at `p ^ c`, a node's leaf at `p ^ 0`. The walk reaches exactly
/// the keys that darts-clone's `commonPrefixSearch` can report. An empty blob has no rules.
///
/// Errors: bad framing ([`split_charsmap`]), a leaf or value out of range, a key or
/// replacement that is not UTF-8 or not NUL-terminated, a key over 1024 bytes, or more than
/// 2^24 nodes visited.
pub fn walk_charsmap(
    blob: &[u8],
    mut on_rule: impl FnMut(&str, &str),
) -> std::result::Result<usize, String> {
    let (units, strings) = split_charsmap(blob)?;
    let Some(&root) = units.first() else {
        return Ok(0);
    };
    let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
    let has_leaf = |u: u32| (u >> 8) & 1 == 1;
    let label = |u: u32| u & ((1 << 31) | 0xff);

    let mut n_rules = 0usize;
    let mut stack: Vec<(usize, Vec<u8>)> = vec![(offset(root), Vec::new())];
    let mut visited = 0usize;
    while let Some((node, key)) = stack.pop() {
        visited += 1;
        if visited > MAX_CHARSMAP_VISITS {
            return Err(format!(
                "trie has more than {MAX_CHARSMAP_VISITS} nodes on its key paths"
            ));
        }
        if key.len() >= MAX_CHARSMAP_KEY {
            return Err(format!("trie key longer than {MAX_CHARSMAP_KEY} bytes"));
        }
        for c in 1..=255u8 {
            let child = node ^ usize::from(c);
            let Some(&unit) = units.get(child) else {
                continue;
            };
            if label(unit) != u32::from(c) {
                continue;
            }
            let next = child ^ offset(unit);
            let mut k = key.clone();
            k.push(c);
            if has_leaf(unit) {
                let leaf = units
                    .get(next)
                    .ok_or_else(|| format!("leaf unit {next} outside the trie"))?;
                let value = (leaf & 0x7fff_ffff) as usize;
                let (from, to) = charsmap_rule(&k, value, strings)?;
                on_rule(from, to);
                n_rules += 1;
            }
            stack.push((next, k));
        }
    }
    Ok(n_rules)
}

fn charsmap_rule<'a>(
    key: &'a [u8],
    value: usize,
    strings: &'a [u8],
) -> std::result::Result<(&'a str, &'a str), String> {
    let from = std::str::from_utf8(key).map_err(|_| format!("trie key {key:02x?} is not UTF-8"))?;
    let tail = strings.get(value..).ok_or_else(|| {
        format!(
            "key {from:?} points at offset {value}, outside the {} string bytes",
            strings.len()
        )
    })?;
    let end = tail
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| format!("replacement of {from:?} is not NUL-terminated"))?;
    let to = std::str::from_utf8(&tail[..end])
        .map_err(|_| format!("replacement of {from:?} is not UTF-8"))?;
    Ok((from, to))
}

/// Decodes standard base64 (RFC 4648 alphabet, `=` padding optional).
fn base64_decode(s: &str) -> std::result::Result<Vec<u8>, String> {
    let sextet = |c: u8| -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    };
    let body = s.trim_end_matches('=');
    if s.len() - body.len() > 2 {
        return Err("more than two '=' padding characters".into());
    }
    let bytes = body.as_bytes();
    if bytes.len() % 4 == 1 {
        return Err(format!("base64 length {} is impossible", bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3 + 2);
    for (ci, chunk) in bytes.chunks(4).enumerate() {
        let mut acc = 0u32;
        for (j, &c) in chunk.iter().enumerate() {
            let v = sextet(c).ok_or_else(|| {
                format!("invalid base64 character {:?} at {}", c as char, ci * 4 + j)
            })?;
            acc |= v << (18 - 6 * j);
        }
        let n = chunk.len() - 1;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fixture_dirs() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        vec![
            root.join("tests/fixtures/pixart-sigma-tiny/tokenizer"),
            root.join("tests/fixtures/pixart-alpha-tiny/tokenizer"),
            root.join("demo/pixart-shapes-64/tokenizer"),
        ]
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        // RFC 4648 §10 test vectors.
        for (enc, dec) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(base64_decode(enc).unwrap(), dec.as_bytes());
        }
        assert!(base64_decode("Zm9v!").is_err());
        assert!(base64_decode("Z").is_err());
    }

    #[test]
    fn json_and_spiece_give_the_same_spec() {
        for dir in fixture_dirs() {
            let from_json = load_tokenizer_dir(&dir).unwrap();
            let config = TokenizerConfig::read(&dir).unwrap();
            let from_spm = spiece_model_with(&dir.join("spiece.model"), &config).unwrap();
            assert_eq!(from_json, from_spm, "{}", dir.display());
        }
    }

    #[test]
    fn fixture_specs_follow_the_readme() {
        // fixtures README §2: 1500 pieces + 4 sentinels, <extra_id_3>=1500 … <extra_id_0>=1503;
        // demo README §2: 256 pieces + 4 sentinels (ids 256…259).
        for (dir, n) in fixture_dirs().into_iter().zip([1500usize, 1500, 256]) {
            let spec = load_tokenizer_dir(&dir).unwrap();
            assert_eq!(spec.vocab_len(), n + 4);
            assert_eq!((spec.pad_id, spec.eos_id, spec.unk_id), (0, 1, 2));
            assert_eq!(spec.pieces[0].text, "<pad>");
            assert_eq!(spec.pieces[1].text, "</s>");
            assert_eq!(spec.pieces[2].text, "<unk>");
            for k in 0..4u32 {
                let t = spec
                    .added_tokens
                    .iter()
                    .find(|t| t.content == format!("<extra_id_{k}>"))
                    .unwrap();
                assert_eq!(t.id as usize, n + 3 - k as usize);
            }
            assert!(spec.remove_extra_whitespaces);
            assert_eq!(spec.prepend_scheme, PrependScheme::Always);
            // nmt_nfkc: fullwidth letters and the fi ligature are rewritten (README prompt
            // `nfkc` tokenises `ｆｕｌｌ` as `full` and `ﬁ` as `f`,`i`).
            let mut rules = std::collections::HashMap::new();
            let n = walk_charsmap(&spec.precompiled_charsmap, |f, t| {
                rules.insert(f.to_string(), t.to_string());
            })
            .unwrap();
            assert_eq!(n, rules.len());
            assert_eq!(rules.get("ｆ").map(String::as_str), Some("f"));
            assert_eq!(rules.get("ﬁ").map(String::as_str), Some("fi"));
            assert_eq!(rules.get("\t").map(String::as_str), Some(" "));
            assert_eq!(rules.get("a"), None);
        }
    }

    #[test]
    fn fixture_spec_survives_postcard() {
        for dir in fixture_dirs() {
            let spec = load_tokenizer_dir(&dir).unwrap();
            let bytes = postcard::to_allocvec(&spec).unwrap();
            let back: TokenizerSpec = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back, spec, "{}", dir.display());
            back.validate().unwrap();
        }
    }

    #[test]
    fn spiece_without_config_adds_100_sentinels() {
        let dir = &fixture_dirs()[0];
        let spec = load_spiece_model(&dir.join("spiece.model")).unwrap();
        assert_eq!(spec.vocab_len(), 1600);
        let t = spec
            .added_tokens
            .iter()
            .find(|t| t.content == "<extra_id_0>")
            .unwrap();
        assert_eq!(t.id, 1599);
    }

    #[test]
    fn bad_files_name_the_file_and_the_problem() {
        let tmp = tempfile::tempdir().unwrap();
        let err = load_tokenizer_dir(tmp.path()).unwrap_err();
        assert!(matches!(err, TokenizerLoadError::NoTokenizerFile { .. }));

        let spm = tmp.path().join("spiece.model");
        // field 1 (pieces), length 10, but only 2 bytes follow
        std::fs::write(&spm, [0x0a, 0x0a, 0x0a, 0x00]).unwrap();
        let err = load_spiece_model(&spm).unwrap_err();
        assert!(matches!(err, TokenizerLoadError::Protobuf { .. }), "{err}");
        assert!(err.to_string().contains("spiece.model"));
        // Another kind of file (a PNG given as the tokenizer) says what was expected.
        let png = tmp.path().join("cat.png");
        std::fs::write(&png, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
        let err = load_spiece_model(&png).unwrap_err().to_string();
        assert!(
            err.contains("cat.png: not a SentencePiece model")
                && err.contains("a spiece.model or a tokenizer.json"),
            "{err}"
        );

        let json = tmp.path().join("tokenizer.json");
        std::fs::write(&json, r#"{"model": {"type": "BPE"}}"#).unwrap();
        let err = load_tokenizer_json(&json).unwrap_err();
        assert!(
            matches!(err, TokenizerLoadError::Unsupported { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("BPE"));

        std::fs::write(&json, "{not json").unwrap();
        let err = load_tokenizer_json(&json).unwrap_err();
        assert!(matches!(err, TokenizerLoadError::Json { .. }));
    }

    #[test]
    fn damaged_charsmap_is_refused() {
        let count = |b: &[u8]| walk_charsmap(b, |_, _| ());
        assert!(count(&[1, 0]).is_err());
        // trie size 8 but only 4 bytes follow
        assert!(count(&[8, 0, 0, 0, 0, 0, 0, 0]).is_err());
        // a real charsmap with its string area cut off
        let dir = &fixture_dirs()[0];
        let root = read_json(&dir.join("tokenizer.json")).unwrap();
        let b64 = root["normalizer"]["precompiled_charsmap"].as_str().unwrap();
        let blob = base64_decode(b64).unwrap();
        let trie_size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        assert!(count(&blob[..4 + trie_size + 10]).is_err());
        assert!(count(&blob).unwrap() > 0);
    }
}
