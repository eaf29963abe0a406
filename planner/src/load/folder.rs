//! The diffusers pipeline folder, as `DiffusionPipeline.save_pretrained()` writes it
//! (diffusers `pipelines/pipeline_utils.py`, `configuration_utils.py`):
//!
//! ```text
//! <root>/model_index.json            {"_class_name": "PixArtSigmaPipeline",
//!                                     "transformer": ["diffusers", "PixArtTransformer2DModel"], ...}
//! <root>/transformer/config.json + diffusion_pytorch_model.safetensors (or a shard index)
//! <root>/text_encoder/config.json + model.safetensors (or model.safetensors.index.json + shards)
//! <root>/vae/config.json + diffusion_pytorch_model.safetensors
//! <root>/tokenizer/                  spiece.model, tokenizer.json, ...
//! <root>/scheduler/scheduler_config.json
//! ```
//!
//! JSON configs are read with [`read_json_config`], which accepts the non-finite number tokens
//! Python's `json` module writes (`NaN`, `Infinity`, `-Infinity`).

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::safetensors::open_safetensors_any;
use super::{LoadError, TensorSource};

/// One model component of a pipeline folder (`transformer`, `text_encoder`, `vae`).
pub struct Component {
    /// The component's folder (`<root>/<name>`).
    pub dir: PathBuf,
    /// The class named for this component in `model_index.json`
    /// (e.g. `PixArtTransformer2DModel`, `T5EncoderModel`, `AutoencoderKL`).
    pub class_name: String,
    /// `<dir>/config.json`, read with [`read_json_config`].
    pub config: Value,
    /// The component's weights (single safetensors file or sharded), names as in the file.
    pub tensors: Box<dyn TensorSource>,
}

impl fmt::Debug for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Component")
            .field("dir", &self.dir)
            .field("class_name", &self.class_name)
            .field("tensors", &self.tensors.describe())
            .finish_non_exhaustive()
    }
}

/// A diffusers pipeline folder with the components a PixArt pipeline needs.
///
/// Only the layout is checked here (files present, JSON well formed, weights readable);
/// whether the classes and configs are ones the planner supports is decided by the caller.
#[derive(Debug)]
pub struct PipelineFolder {
    /// The folder that holds `model_index.json`.
    pub root: PathBuf,
    /// `model_index.json → _class_name` (e.g. `PixArtSigmaPipeline`, `PixArtAlphaPipeline`).
    pub pipeline_class: String,
    /// `<root>/transformer`.
    pub transformer: Component,
    /// `<root>/text_encoder`.
    pub text_encoder: Component,
    /// `<root>/vae`.
    pub vae: Component,
    /// `<root>/tokenizer` (a folder; its files are read by the tokenizer loader).
    pub tokenizer_dir: PathBuf,
    /// `<root>/scheduler/scheduler_config.json` (exists; read by the scheduler loader).
    pub scheduler_config: PathBuf,
}

impl PipelineFolder {
    /// Opens the pipeline folder `dir`: reads `model_index.json`, the `config.json` and
    /// weights of `transformer`, `text_encoder` and `vae`, and checks that `tokenizer/` and
    /// `scheduler/scheduler_config.json` exist.
    ///
    /// Errors (each names the path and what was expected):
    /// - [`LoadError::Io`]: `dir` or `model_index.json` cannot be read;
    /// - [`LoadError::Folder`]: `dir` is not a folder, a component folder or file is missing,
    ///   a component folder has no weights;
    /// - [`LoadError::Json`]: malformed JSON, or `model_index.json` lacks `_class_name` or a
    ///   component entry of the form `["<library>", "<class>"]`;
    /// - any error of [`open_safetensors_any`] for the weights.
    pub fn open(dir: &Path) -> Result<PipelineFolder, LoadError> {
        let meta = std::fs::metadata(dir).map_err(|source| LoadError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(LoadError::Folder {
                path: dir.display().to_string(),
                reason: "not a folder (expected a diffusers pipeline folder with model_index.json)"
                    .to_string(),
            });
        }
        let index_path = dir.join("model_index.json");
        if !index_path.is_file() {
            return Err(LoadError::Folder {
                path: index_path.display().to_string(),
                reason: "missing (expected the model_index.json of a diffusers pipeline folder)"
                    .to_string(),
            });
        }
        let index = read_json_config(&index_path)?;
        let pipeline_class = index
            .get("_class_name")
            .and_then(Value::as_str)
            .ok_or_else(|| LoadError::Json {
                path: index_path.display().to_string(),
                reason: "expected a string field `_class_name` (e.g. \"PixArtSigmaPipeline\")"
                    .to_string(),
            })?
            .to_string();

        let transformer = open_component(dir, &index_path, &index, "transformer")?;
        let text_encoder = open_component(dir, &index_path, &index, "text_encoder")?;
        let vae = open_component(dir, &index_path, &index, "vae")?;

        component_class(&index_path, &index, "tokenizer")?;
        let tokenizer_dir = dir.join("tokenizer");
        if !tokenizer_dir.is_dir() {
            return Err(missing(&tokenizer_dir, "the tokenizer folder"));
        }
        component_class(&index_path, &index, "scheduler")?;
        let scheduler_config = dir.join("scheduler").join("scheduler_config.json");
        if !scheduler_config.is_file() {
            return Err(missing(&scheduler_config, "the scheduler's configuration"));
        }

        Ok(PipelineFolder {
            root: dir.to_path_buf(),
            pipeline_class,
            transformer,
            text_encoder,
            vae,
            tokenizer_dir,
            scheduler_config,
        })
    }
}

fn missing(path: &Path, what: &str) -> LoadError {
    LoadError::Folder {
        path: path.display().to_string(),
        reason: format!("missing (expected {what})"),
    }
}

/// The class of component `name` in `model_index.json`: the second element of
/// `"<name>": ["<library>", "<class>"]`.
fn component_class(index_path: &Path, index: &Value, name: &str) -> Result<String, LoadError> {
    let entry = index.get(name).and_then(Value::as_array);
    let class = match entry.map(Vec::as_slice) {
        Some([library, class]) if library.is_string() => class.as_str(),
        _ => None,
    };
    class.map(str::to_string).ok_or_else(|| LoadError::Json {
        path: index_path.display().to_string(),
        reason: format!(
            "expected a component entry `\"{name}\": [\"<library>\", \"<class>\"]`, found {}",
            index
                .get(name)
                .map_or("nothing".to_string(), Value::to_string)
        ),
    })
}

fn open_component(
    root: &Path,
    index_path: &Path,
    index: &Value,
    name: &str,
) -> Result<Component, LoadError> {
    let class_name = component_class(index_path, index, name)?;
    let dir = root.join(name);
    if !dir.is_dir() {
        return Err(missing(
            &dir,
            &format!("the {name} component folder ({class_name})"),
        ));
    }
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(missing(
            &config_path,
            &format!("the {name} configuration ({class_name})"),
        ));
    }
    let config = read_json_config(&config_path)?;
    let tensors = open_safetensors_any(&dir)?;
    Ok(Component {
        dir,
        class_name,
        config,
        tensors,
    })
}

/// Reads a JSON configuration file as diffusers / transformers write it.
///
/// Python's `json.dump` writes non-finite floats as the bare tokens `NaN`, `Infinity` and
/// `-Infinity` (diffusers' `scheduler_config.json` has `"lambda_min_clipped": -Infinity`),
/// which strict JSON does not allow and `serde_json::Value` cannot hold. Outside string
/// literals, these tokens are replaced by the **strings** `"NaN"`, `"Infinity"` and
/// `"-Infinity"` (the convention of the fixtures' `manifest.json`); a consumer that expects a
/// number must accept those strings. Everything else must be strict JSON.
///
/// Errors: [`LoadError::Io`] when the file cannot be read; [`LoadError::Json`] naming the
/// file, line and column when it is not valid JSON.
pub fn read_json_config(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_json_config(&text).map_err(|e| LoadError::Json {
        path: path.display().to_string(),
        reason: format!("not valid JSON: {e}"),
    })
}

/// Parses JSON text with the non-finite tokens of Python's `json` module, as
/// [`read_json_config`] describes (the tokens become the strings `"NaN"`, `"Infinity"`,
/// `"-Infinity"`).
pub fn parse_json_config(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str(&quote_non_finite(text))
}

/// Rewrites the bare tokens `NaN`, `Infinity`, `-Infinity` outside string literals as the
/// quoted strings. A token must end at a non-identifier character, so `NaNx` is left for the
/// JSON parser to reject.
fn quote_non_finite(text: &str) -> String {
    const TOKENS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 8);
    let mut copied = 0;
    let mut in_string = false;
    let mut escaped = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        let rest = &bytes[i..];
        let token = TOKENS.iter().find(|t| {
            rest.starts_with(t.as_bytes())
                && !rest
                    .get(t.len())
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
        });
        match token {
            Some(t) => {
                // `i` and `i + t.len()` border ASCII bytes, hence are char boundaries of `text`.
                out.push_str(&text[copied..i]);
                out.push('"');
                out.push_str(t);
                out.push('"');
                i += t.len();
                copied = i;
            }
            None => i += 1,
        }
    }
    out.push_str(&text[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::to_f32;

    fn repo(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
    }

    /// Copies a pipeline folder (components only, no `reference/` or `gguf/`) to a temp dir.
    fn copy_pipeline(rel: &str) -> tempfile::TempDir {
        let src = repo(rel);
        let dst = tempfile::tempdir().unwrap();
        std::fs::copy(
            src.join("model_index.json"),
            dst.path().join("model_index.json"),
        )
        .unwrap();
        for sub in [
            "transformer",
            "text_encoder",
            "vae",
            "tokenizer",
            "scheduler",
        ] {
            std::fs::create_dir(dst.path().join(sub)).unwrap();
            for entry in std::fs::read_dir(src.join(sub)).unwrap() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), dst.path().join(sub).join(entry.file_name())).unwrap();
            }
        }
        dst
    }

    fn config_usize(c: &Component, key: &str) -> usize {
        c.config[key].as_u64().unwrap() as usize
    }

    fn shape(c: &Component, name: &str) -> Vec<usize> {
        let t = c.tensors.tensor(name).unwrap().unwrap();
        assert_eq!(
            to_f32(&t).len(),
            t.shape.iter().product::<usize>(),
            "{name}"
        );
        t.shape
    }

    /// Shapes that follow from each component's config.json.
    fn check_shapes(p: &PipelineFolder) {
        let tr = &p.transformer;
        let hidden =
            config_usize(tr, "num_attention_heads") * config_usize(tr, "attention_head_dim");
        let (cin, patch) = (
            config_usize(tr, "in_channels"),
            config_usize(tr, "patch_size"),
        );
        assert_eq!(
            shape(tr, "pos_embed.proj.weight"),
            [hidden, cin, patch, patch]
        );
        assert_eq!(
            shape(tr, "caption_projection.linear_1.weight"),
            [hidden, config_usize(tr, "caption_channels")]
        );
        let n_layers = config_usize(tr, "num_layers");
        assert!(tr
            .tensors
            .tensor(&format!(
                "transformer_blocks.{}.attn1.to_q.weight",
                n_layers - 1
            ))
            .unwrap()
            .is_some());
        assert!(tr
            .tensors
            .tensor(&format!("transformer_blocks.{n_layers}.attn1.to_q.weight"))
            .unwrap()
            .is_none());

        let te = &p.text_encoder;
        assert_eq!(
            shape(te, "shared.weight"),
            [config_usize(te, "vocab_size"), config_usize(te, "d_model")]
        );
        assert_eq!(
            shape(te, "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"),
            [config_usize(te, "d_ff"), config_usize(te, "d_model")]
        );

        let vae = &p.vae;
        let block_out = vae.config["block_out_channels"].as_array().unwrap();
        let last = block_out[block_out.len() - 1].as_u64().unwrap() as usize;
        let latent = config_usize(vae, "latent_channels");
        assert_eq!(shape(vae, "decoder.conv_in.weight"), [last, latent, 3, 3]);
        assert_eq!(shape(vae, "post_quant_conv.weight"), [latent, latent, 1, 1]);

        assert!(p.tokenizer_dir.join("spiece.model").is_file());
        assert!(p.scheduler_config.is_file());
        assert_eq!(p.transformer.class_name, "PixArtTransformer2DModel");
        assert_eq!(p.text_encoder.class_name, "T5EncoderModel");
        assert_eq!(p.vae.class_name, "AutoencoderKL");
    }

    #[test]
    fn opens_sigma_fixture_with_sharded_t5() {
        let p = PipelineFolder::open(&repo("tests/fixtures/pixart-sigma-tiny")).unwrap();
        assert_eq!(p.pipeline_class, "PixArtSigmaPipeline");
        check_shapes(&p);
        let index = p.text_encoder.dir.join("model.safetensors.index.json");
        let v = read_json_config(&index).unwrap();
        let mut listed: Vec<String> = v["weight_map"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        listed.sort();
        assert_eq!(p.text_encoder.tensors.names(), listed);
        assert!(p
            .text_encoder
            .tensors
            .describe()
            .contains("model-00003-of-00003.safetensors"));
    }

    #[test]
    fn opens_alpha_fixture() {
        let p = PipelineFolder::open(&repo("tests/fixtures/pixart-alpha-tiny")).unwrap();
        assert_eq!(p.pipeline_class, "PixArtAlphaPipeline");
        check_shapes(&p);
        assert_eq!(
            p.transformer.config["use_additional_conditions"],
            Value::Bool(true)
        );
        assert!(p.transformer.config["interpolation_scale"].is_null());
        assert!(p
            .transformer
            .tensors
            .names()
            .iter()
            .any(|n| n.starts_with("adaln_single.emb.resolution_embedder.")));
    }

    #[test]
    fn opens_demo_with_single_file_t5() {
        let p = PipelineFolder::open(&repo("demo/pixart-shapes-64")).unwrap();
        assert_eq!(p.pipeline_class, "PixArtSigmaPipeline");
        check_shapes(&p);
        assert!(p
            .text_encoder
            .tensors
            .describe()
            .ends_with("model.safetensors"));
    }

    #[test]
    fn scheduler_config_non_finite_becomes_string() {
        let path = repo("tests/fixtures/pixart-sigma-tiny/scheduler/scheduler_config.json");
        assert!(serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap()).is_err());
        let v = read_json_config(&path).unwrap();
        assert_eq!(v["lambda_min_clipped"], Value::from("-Infinity"));
        assert_eq!(v["beta_start"].as_f64(), Some(0.0001));
        assert_eq!(v["_class_name"], Value::from("DPMSolverMultistepScheduler"));
        assert!(v["trained_betas"].is_null());
    }

    #[test]
    fn non_finite_tokens_only_outside_strings() {
        let v = parse_json_config(
            r#"{"a": NaN, "b": [Infinity, -Infinity], "c": "NaN -Infinity \" Infinity", "d": -1.5}"#,
        )
        .unwrap();
        assert_eq!(v["a"], Value::from("NaN"));
        assert_eq!(v["b"], serde_json::json!(["Infinity", "-Infinity"]));
        assert_eq!(v["c"], Value::from("NaN -Infinity \" Infinity"));
        assert_eq!(v["d"].as_f64(), Some(-1.5));
        assert!(parse_json_config(r#"{"a": NaNx}"#).is_err());
        assert!(parse_json_config(r#"{"a": nan}"#).is_err());
        assert!(parse_json_config("{\"é\": é Infinity}").is_err());
    }

    fn open_err(dir: &Path) -> LoadError {
        match PipelineFolder::open(dir) {
            Ok(p) => panic!("expected an error, opened {p:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn missing_shard_is_named() {
        let dir = copy_pipeline("tests/fixtures/pixart-sigma-tiny");
        let shard = dir
            .path()
            .join("text_encoder/model-00001-of-00003.safetensors");
        std::fs::remove_file(&shard).unwrap();
        let e = open_err(dir.path());
        assert!(matches!(e, LoadError::Io { .. }), "{e:?}");
        assert!(e.to_string().contains(&shard.display().to_string()), "{e}");
    }

    #[test]
    fn model_index_that_is_not_json() {
        let dir = copy_pipeline("tests/fixtures/pixart-alpha-tiny");
        let index = dir.path().join("model_index.json");
        std::fs::write(&index, "{\"_class_name\": \"PixArtAlphaPipeline\",").unwrap();
        match open_err(dir.path()) {
            LoadError::Json { path, reason } => {
                assert_eq!(path, index.display().to_string());
                assert!(reason.contains("line 1"), "{reason}");
            }
            e => panic!("expected Json, got {e:?}"),
        }
        std::fs::write(&index, "{\"_class_name\": \"PixArtAlphaPipeline\"}").unwrap();
        match open_err(dir.path()) {
            LoadError::Json { path, reason } => {
                assert_eq!(path, index.display().to_string());
                assert!(reason.contains("\"transformer\""), "{reason}");
            }
            e => panic!("expected Json, got {e:?}"),
        }
    }

    #[test]
    fn corrupt_and_truncated_weights_are_named() {
        let dir = copy_pipeline("tests/fixtures/pixart-alpha-tiny");
        let weights = dir.path().join("vae/diffusion_pytorch_model.safetensors");
        let bytes = std::fs::read(&weights).unwrap();
        std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
        match open_err(dir.path()) {
            LoadError::Safetensors { path, reason } => {
                assert_eq!(path, weights.display().to_string());
                assert!(reason.contains("truncated"), "{reason}");
            }
            e => panic!("expected Safetensors, got {e:?}"),
        }
        let mut bytes = bytes;
        bytes[8] = b'[';
        std::fs::write(&weights, &bytes).unwrap();
        match open_err(dir.path()) {
            LoadError::Safetensors { path, .. } => assert_eq!(path, weights.display().to_string()),
            e => panic!("expected Safetensors, got {e:?}"),
        }
    }

    #[test]
    fn missing_pieces_are_named() {
        let dir = copy_pipeline("tests/fixtures/pixart-sigma-tiny");
        let root = dir.path();

        std::fs::remove_file(root.join("transformer/diffusion_pytorch_model.safetensors")).unwrap();
        match open_err(root) {
            LoadError::Folder { path, reason } => {
                assert_eq!(path, root.join("transformer").display().to_string());
                assert!(
                    reason.contains("diffusion_pytorch_model.safetensors"),
                    "{reason}"
                );
                assert!(reason.contains("*.safetensors.index.json"), "{reason}");
            }
            e => panic!("expected Folder, got {e:?}"),
        }

        std::fs::remove_file(root.join("vae/config.json")).unwrap();
        std::fs::remove_dir_all(root.join("transformer")).unwrap();
        match open_err(root) {
            LoadError::Folder { path, reason } => {
                assert_eq!(path, root.join("transformer").display().to_string());
                assert!(reason.contains("PixArtTransformer2DModel"), "{reason}");
            }
            e => panic!("expected Folder, got {e:?}"),
        }
        copy_component("tests/fixtures/pixart-sigma-tiny", root, "transformer");
        match open_err(root) {
            LoadError::Folder { path, .. } => {
                assert_eq!(path, root.join("vae/config.json").display().to_string())
            }
            e => panic!("expected Folder, got {e:?}"),
        }
        copy_component("tests/fixtures/pixart-sigma-tiny", root, "vae");
        std::fs::remove_file(root.join("scheduler/scheduler_config.json")).unwrap();
        match open_err(root) {
            LoadError::Folder { path, .. } => assert_eq!(
                path,
                root.join("scheduler/scheduler_config.json")
                    .display()
                    .to_string()
            ),
            e => panic!("expected Folder, got {e:?}"),
        }

        std::fs::remove_file(root.join("model_index.json")).unwrap();
        match open_err(root) {
            LoadError::Folder { path, .. } => {
                assert_eq!(path, root.join("model_index.json").display().to_string())
            }
            e => panic!("expected Folder, got {e:?}"),
        }
        let gone = root.join("does-not-exist");
        match open_err(&gone) {
            LoadError::Io { path, .. } => assert_eq!(path, gone.display().to_string()),
            e => panic!("expected Io, got {e:?}"),
        }
    }

    fn copy_component(rel: &str, root: &Path, sub: &str) {
        let src = repo(rel).join(sub);
        std::fs::create_dir_all(root.join(sub)).unwrap();
        for entry in std::fs::read_dir(src).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), root.join(sub).join(entry.file_name())).unwrap();
        }
    }
}
