//! Tokenizer end to end: load each fixture's `tokenizer/` folder with the planner, build the
//! runtime tokenizer from the spec, and compare with the reference ids written by HF
//! `T5TokenizerFast` and sentencepiece (`reference/tokens.safetensors`, fixtures README §2, §3
//! and §5.1-5.2; demo README §6).

use edge_planner::load::tokenizer::{load_tokenizer_dir, load_tokenizer_json};
use edge_runtime::tokenizer::{preprocess, Tokenizer};
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// `(tokenizer folder, reference folder)` of the two fixtures and the demo.
fn cases() -> Vec<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fx = root.join("tests/fixtures");
    vec![
        (
            fx.join("pixart-sigma-tiny/tokenizer"),
            fx.join("pixart-sigma-tiny/reference"),
        ),
        (
            fx.join("pixart-alpha-tiny/tokenizer"),
            fx.join("pixart-alpha-tiny/reference"),
        ),
        (
            root.join("demo/pixart-shapes-64/tokenizer"),
            root.join("demo/reference"),
        ),
    ]
}

struct Reference {
    manifest: Value,
    tokens: Vec<u8>,
}

impl Reference {
    fn read(dir: &Path) -> Self {
        let manifest = std::fs::read(dir.join("manifest.json")).expect("manifest.json");
        Reference {
            manifest: serde_json::from_slice(&manifest).expect("manifest.json is JSON"),
            tokens: std::fs::read(dir.join("tokens.safetensors")).expect("tokens.safetensors"),
        }
    }

    /// An int32 tensor as `(shape, values)`.
    fn i32_tensor(&self, name: &str) -> (Vec<usize>, Vec<i32>) {
        let st = SafeTensors::deserialize(&self.tokens).expect("tokens.safetensors parses");
        let t = st.tensor(name).unwrap_or_else(|_| panic!("tensor {name}"));
        assert_eq!(t.dtype(), safetensors::Dtype::I32, "{name}");
        let values = t
            .data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (t.shape().to_vec(), values)
    }

    fn max_len(&self) -> usize {
        self.manifest["max_sequence_length"]
            .as_u64()
            .expect("max_sequence_length") as usize
    }

    fn prompts(&self) -> &[Value] {
        self.manifest["prompts"].as_array().expect("prompts")
    }
}

fn as_u32(v: &[i32]) -> Vec<u32> {
    v.iter()
        .map(|&x| u32::try_from(x).expect("id >= 0"))
        .collect()
}

/// Checks every prompt of one fixture against `tokenizer`.
fn check_against_reference(tokenizer: &Tokenizer, reference: &Reference, what: &str) {
    let max_len = reference.max_len();
    let (shape, input_ids) = reference.i32_tensor("input_ids");
    let (mask_shape, attention_mask) = reference.i32_tensor("attention_mask");
    let prompts = reference.prompts();
    assert_eq!(
        shape,
        vec![prompts.len(), max_len],
        "{what}: input_ids shape"
    );
    assert_eq!(mask_shape, shape, "{what}: attention_mask shape");

    for (row, prompt) in prompts.iter().enumerate() {
        let id = prompt["id"].as_str().expect("prompt id");
        let text = prompt["text"].as_str().expect("prompt text");
        let ctx = format!("{what}, prompt {id:?}");

        let pre = preprocess(text);
        assert_eq!(pre, prompt["preprocessed"].as_str().unwrap(), "{ctx}");

        let ids = tokenizer.encode(&pre);
        let (_, hf) = reference.i32_tensor(&format!("hf_ids_untruncated.{id}"));
        assert_eq!(ids, as_u32(&hf), "{ctx}: untruncated ids vs HF");

        let (_, spm) = reference.i32_tensor(&format!("spm_ids_untruncated.{id}"));
        if prompt["spm_matches_hf"].as_bool() == Some(true) {
            assert_eq!(ids, as_u32(&spm), "{ctx}: untruncated ids vs sentencepiece");
        } else {
            // README §2: HF matches `<extra_id_0>` and `</s>` literally, sentencepiece does
            // not; the runtime follows HF.
            assert_ne!(
                ids,
                as_u32(&spm),
                "{ctx}: expected to differ from sentencepiece"
            );
        }

        let padded = tokenizer.encode_padded(text, max_len);
        let want_ids = &input_ids[row * max_len..(row + 1) * max_len];
        let want_mask = &attention_mask[row * max_len..(row + 1) * max_len];
        assert_eq!(padded.ids, want_ids, "{ctx}: padded ids");
        let mask: Vec<i32> = padded.mask.iter().map(|&m| m as i32).collect();
        assert_eq!(mask, want_mask, "{ctx}: attention mask");
        assert_eq!(padded.n_untruncated, hf.len(), "{ctx}");
        assert_eq!(padded.truncated, hf.len() > max_len, "{ctx}");
        if let Some(t) = prompt.get("truncated").and_then(Value::as_bool) {
            assert_eq!(padded.truncated, t, "{ctx}: truncated flag");
        }
    }
}

#[test]
fn tokenizer_json_matches_reference_ids() {
    for (tok_dir, ref_dir) in cases() {
        let reference = Reference::read(&ref_dir);
        let spec = load_tokenizer_dir(&tok_dir).expect("load tokenizer folder");
        let tokenizer = Tokenizer::new(&spec).expect("tokenizer from spec");
        check_against_reference(&tokenizer, &reference, &tok_dir.display().to_string());

        let spec = load_tokenizer_json(&tok_dir.join("tokenizer.json")).expect("tokenizer.json");
        let tokenizer = Tokenizer::new(&spec).expect("tokenizer from spec");
        check_against_reference(&tokenizer, &reference, "tokenizer.json alone");
    }
}

/// Real PixArt folders ship `spiece.model` without `tokenizer.json`: the spec built from it
/// (with the folder's `tokenizer_config.json`) must tokenise exactly like HF.
#[test]
fn spiece_model_folder_matches_reference_ids() {
    for (tok_dir, ref_dir) in cases() {
        let reference = Reference::read(&ref_dir);
        let tmp = tempfile::tempdir().expect("temp dir");
        for f in ["spiece.model", "tokenizer_config.json"] {
            std::fs::copy(tok_dir.join(f), tmp.path().join(f)).expect("copy tokenizer file");
        }
        let spec = load_tokenizer_dir(tmp.path()).expect("load spiece.model folder");
        let tokenizer = Tokenizer::new(&spec).expect("tokenizer from spec");
        check_against_reference(&tokenizer, &reference, "spiece.model folder");
    }
}
