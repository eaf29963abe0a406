//! One model file of unknown kind opened as tensors (GGUF or safetensors, original PixArt
//! names presented under diffusers names) or as a tokenizer.

use std::path::Path;

use super::gguf::GgufFile;
use super::original::OriginalLayout;
use super::safetensors::open_safetensors_any;
use super::{tokenizer, LoadError, TensorSource};
use crate::error::Result;

/// Whether `path` is a GGUF file (extension `.gguf` or the magic `GGUF`).
pub(crate) fn is_gguf(path: &Path) -> bool {
    if path
        .extension()
        .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// What a GGUF file's `pixart.*` metadata says about the transformer config.
#[derive(Clone, Debug, Default)]
pub(crate) struct GgufHints {
    pub heads: Option<usize>,
    pub sample_size: Option<usize>,
    pub interpolation_scale: Option<f64>,
    pub norm_eps: Option<f64>,
}

/// Opens one weights file: GGUF ([`GgufFile::open`]) or safetensors
/// ([`open_safetensors_any`]); original-layout PixArt names are presented under diffusers
/// names ([`OriginalLayout::wrap_if_original`]).
pub(crate) fn open_weights(path: &Path) -> Result<(Box<dyn TensorSource>, GgufHints)> {
    if is_gguf(path) {
        let f = GgufFile::open(path).map_err(LoadError::from)?;
        let count = |k: &str| f.get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
        let hints = GgufHints {
            heads: count("pixart.attention.head_count"),
            sample_size: count("pixart.sample_size"),
            interpolation_scale: f.get("pixart.interpolation_scale").and_then(|v| v.as_f64()),
            norm_eps: f.get("pixart.norm_eps").and_then(|v| v.as_f64()),
        };
        Ok((OriginalLayout::wrap_if_original(Box::new(f)), hints))
    } else {
        let src = open_safetensors_any(path)?;
        Ok((OriginalLayout::wrap_if_original(src), GgufHints::default()))
    }
}

pub(crate) fn load_tokenizer_file(path: &Path) -> Result<edge_schema::tokenizer::TokenizerSpec> {
    let json = path
        .extension()
        .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case("json"));
    let spec = if json {
        tokenizer::load_tokenizer_json(path)
    } else {
        tokenizer::load_spiece_model(path)
    };
    Ok(spec.map_err(LoadError::from)?)
}
