//! Model configurations parsed from the `config.json` files that diffusers
//! (`PixArtTransformer2DModel`, `AutoencoderKL`) and transformers (`T5EncoderModel`) write.
//!
//! Absent keys take the defaults of the constructors in diffusers 0.42
//! (`models/transformers/pixart_transformer_2d.py`, `models/autoencoders/autoencoder_kl.py`) and
//! transformers 5 (`models/t5/configuration_t5.py`). Settings that change the network in ways
//! the builders do not implement are rejected with a [`ConfigError`] that names the key, the
//! value found and what is supported.

use serde_json::{Map, Value};

/// Why a `config.json` cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The document is not a JSON object.
    #[error("{model} config: the document is not a JSON object")]
    NotAnObject { model: &'static str },
    /// A key holds a value of the wrong JSON type or out of range.
    #[error("{model} config: `{key}` is {found}, expected {expected}")]
    BadValue {
        model: &'static str,
        key: String,
        found: String,
        expected: String,
    },
    /// A valid setting that the graph builders do not implement.
    #[error("{model} config: `{key}` = {found} is not supported (supported: {supported})")]
    Unsupported {
        model: &'static str,
        key: String,
        found: String,
        supported: String,
    },
    /// Values that are individually valid but do not fit together.
    #[error("{model} config: {msg}")]
    Inconsistent { model: &'static str, msg: String },
}

/// Typed access to one config object, with the model name for errors.
struct Obj<'a> {
    model: &'static str,
    map: &'a Map<String, Value>,
}

fn describe(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(80).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}

impl<'a> Obj<'a> {
    fn new(model: &'static str, v: &'a Value) -> Result<Self, ConfigError> {
        match v {
            Value::Object(map) => Ok(Obj { model, map }),
            _ => Err(ConfigError::NotAnObject { model }),
        }
    }

    fn bad(&self, key: &str, v: &Value, expected: &str) -> ConfigError {
        ConfigError::BadValue {
            model: self.model,
            key: key.into(),
            found: describe(v),
            expected: expected.into(),
        }
    }

    fn unsupported(
        &self,
        key: &str,
        found: impl std::fmt::Display,
        supported: &str,
    ) -> ConfigError {
        ConfigError::Unsupported {
            model: self.model,
            key: key.into(),
            found: found.to_string(),
            supported: supported.into(),
        }
    }

    fn inconsistent(&self, msg: String) -> ConfigError {
        ConfigError::Inconsistent {
            model: self.model,
            msg,
        }
    }

    /// The value of `key`, `None` when absent or `null`.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A positive integer; `None` when absent or `null`.
    fn opt_count(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.bad(key, v, "a positive integer")),
            },
        }
    }

    /// A positive integer, `default` when absent or `null`.
    fn count(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        Ok(self.opt_count(key)?.unwrap_or(default))
    }

    /// A finite number; `None` when absent or `null`.
    fn opt_number(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.bad(key, v, "a finite number")),
            },
        }
    }

    /// A finite positive number, `default` when absent or `null`.
    fn positive(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        match (self.opt_number(key)?, self.get(key)) {
            (None, _) => Ok(default),
            (Some(x), _) if x > 0.0 => Ok(x),
            (Some(_), v) => Err(self.bad(key, v.unwrap_or(&Value::Null), "a positive number")),
        }
    }

    /// A boolean; `None` when absent or `null`.
    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(key, v, "true or false")),
        }
    }

    fn boolean(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        Ok(self.opt_bool(key)?.unwrap_or(default))
    }

    /// A string; `None` when absent or `null`.
    fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.bad(key, v, "a string")),
        }
    }

    /// Requires the string at `key` (or `default`) to be `want`.
    fn require_str(&self, key: &str, default: &str, want: &str) -> Result<(), ConfigError> {
        let s = self.opt_str(key)?.unwrap_or(default);
        if s == want {
            Ok(())
        } else {
            Err(self.unsupported(key, format!("{s:?}"), &format!("{want:?}")))
        }
    }

    /// A non-empty list of positive integers, `default` when absent or `null`.
    fn counts(&self, key: &str, default: &[usize]) -> Result<Vec<usize>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(default.to_vec());
        };
        let expected = "a non-empty list of positive integers";
        let items = v.as_array().ok_or_else(|| self.bad(key, v, expected))?;
        if items.is_empty() {
            return Err(self.bad(key, v, expected));
        }
        items
            .iter()
            .map(|x| match x.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Ok(n),
                _ => Err(self.bad(key, v, expected)),
            })
            .collect()
    }

    /// A list of strings, `None` when absent or `null`.
    fn opt_strs(&self, key: &str) -> Result<Option<Vec<&'a str>>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let expected = "a list of strings";
        let items = v.as_array().ok_or_else(|| self.bad(key, v, expected))?;
        items
            .iter()
            .map(|x| x.as_str().ok_or_else(|| self.bad(key, v, expected)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

const PIXART: &str = "PixArtTransformer2DModel";
const T5: &str = "T5EncoderModel";
const VAE: &str = "AutoencoderKL";
const TINY: &str = "AutoencoderTiny";

/// `PixArtTransformer2DModel` settings (diffusers 0.42), with defaults and derived values
/// resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct PixArtConfig {
    /// Attention heads per block (default 16).
    pub num_attention_heads: usize,
    /// Channels per head (default 72); `inner_dim = heads · head_dim`.
    pub attention_head_dim: usize,
    /// Latent channels in (default 4).
    pub in_channels: usize,
    /// Output channels (default 8; `null` means `in_channels`). Either `in_channels` or
    /// `2 · in_channels` (learned sigma).
    pub out_channels: usize,
    /// Transformer blocks (default 28).
    pub num_layers: usize,
    /// Width of the keys/values of cross-attention (default 1152; `null` means `inner_dim`).
    pub cross_attention_dim: usize,
    /// Whether the attention projections have biases (default true).
    pub attention_bias: bool,
    /// Native latent size (default 128); sets the position-embedding base size.
    pub sample_size: usize,
    /// Patch size in latent pixels (default 2).
    pub patch_size: usize,
    /// LayerNorm epsilon inside the blocks (default 1e-6; the final norm always uses 1e-6).
    pub norm_eps: f32,
    /// Position-embedding interpolation scale: the config value, or
    /// `max(sample_size // 64, 1)` when absent or `null`.
    pub interpolation_scale: f64,
    /// α micro-conditions (resolution, aspect ratio): the config value, or
    /// `sample_size == 128` when absent or `null` (as diffusers decides).
    pub use_additional_conditions: bool,
    /// Width of the text-encoder states; `None` means no caption projection (the context is
    /// then used as is, with width `cross_attention_dim`).
    pub caption_channels: Option<usize>,
}

impl PixArtConfig {
    /// Parses a diffusers `transformer/config.json`.
    ///
    /// Errors: wrong JSON types; `norm_type` other than `ada_norm_single`, `activation_fn`
    /// other than `gelu-approximate`, `attention_type` other than `default`,
    /// `norm_elementwise_affine` or `only_cross_attention` true; `out_channels` not
    /// `in_channels` or `2 · in_channels`; `inner_dim` not a multiple of 4 (2-D sin-cos table)
    /// or, with micro-conditions, of 3; a caption projection whose width differs from
    /// `cross_attention_dim`.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let o = Obj::new(PIXART, v)?;
        o.require_str("norm_type", "ada_norm_single", "ada_norm_single")?;
        o.require_str("activation_fn", "gelu-approximate", "gelu-approximate")?;
        o.require_str("attention_type", "default", "default")?;
        if o.boolean("norm_elementwise_affine", false)? {
            return Err(o.unsupported("norm_elementwise_affine", true, "false"));
        }
        if o.boolean("only_cross_attention", false)? {
            return Err(o.unsupported("only_cross_attention", true, "false"));
        }
        let num_attention_heads = o.count("num_attention_heads", 16)?;
        let attention_head_dim = o.count("attention_head_dim", 72)?;
        let inner = num_attention_heads * attention_head_dim;
        let in_channels = o.count("in_channels", 4)?;
        let out_channels = match o.map.get("out_channels") {
            None => 8,
            Some(Value::Null) => in_channels,
            Some(_) => o.count("out_channels", 8)?,
        };
        if out_channels != in_channels && out_channels != 2 * in_channels {
            return Err(o.unsupported(
                "out_channels",
                out_channels,
                &format!("in_channels ({in_channels}) or 2 · in_channels"),
            ));
        }
        let cross_attention_dim = match o.map.get("cross_attention_dim") {
            None => 1152,
            Some(Value::Null) => inner,
            Some(_) => o.count("cross_attention_dim", 1152)?,
        };
        let sample_size = o.count("sample_size", 128)?;
        let patch_size = o.count("patch_size", 2)?;
        let norm_eps = o.positive("norm_eps", 1e-6)? as f32;
        let interpolation_scale = match o.opt_number("interpolation_scale")? {
            None => (sample_size / 64).max(1) as f64,
            Some(_) => o.positive("interpolation_scale", 1.0)?,
        };
        let use_additional_conditions = o
            .opt_bool("use_additional_conditions")?
            .unwrap_or(sample_size == 128);
        let caption_channels = o.opt_count("caption_channels")?;
        if !inner.is_multiple_of(4) {
            return Err(o.inconsistent(format!(
                "inner dim {num_attention_heads}·{attention_head_dim} = {inner} must be a multiple of 4 for the 2-D sin-cos position embedding"
            )));
        }
        if use_additional_conditions && !inner.is_multiple_of(3) {
            return Err(o.inconsistent(format!(
                "inner dim {inner} must be divisible by 3 when `use_additional_conditions` is on (resolution and aspect-ratio embeddings are inner/3 each)"
            )));
        }
        if caption_channels.is_some() && cross_attention_dim != inner {
            return Err(o.inconsistent(format!(
                "`cross_attention_dim` = {cross_attention_dim} must equal the inner dim {inner}: the caption projection outputs inner-dim states"
            )));
        }
        Ok(PixArtConfig {
            num_attention_heads,
            attention_head_dim,
            in_channels,
            out_channels,
            num_layers: o.count("num_layers", 28)?,
            cross_attention_dim,
            attention_bias: o.boolean("attention_bias", true)?,
            sample_size,
            patch_size,
            norm_eps,
            interpolation_scale,
            use_additional_conditions,
            caption_channels,
        })
    }

    /// `num_attention_heads · attention_head_dim`, the token width.
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// `sample_size // patch_size`: the token grid the position table is normalised to.
    pub fn base_size(&self) -> usize {
        self.sample_size / self.patch_size
    }
}

/// `T5EncoderModel` settings (transformers 5 `T5Config`), with defaults resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct T5Config {
    /// Rows of `shared.weight` (default 32128); may exceed the tokenizer's size.
    pub vocab_size: usize,
    /// Hidden width (default 512).
    pub d_model: usize,
    /// Channels per head (default 64).
    pub d_kv: usize,
    /// Feed-forward width (default 2048).
    pub d_ff: usize,
    /// Encoder blocks (default 6).
    pub num_layers: usize,
    /// Attention heads (default 8).
    pub num_heads: usize,
    /// Relative-position buckets (default 32).
    pub relative_attention_num_buckets: usize,
    /// Largest distance with its own logarithmic bucket (default 128).
    pub relative_attention_max_distance: usize,
    /// RMSNorm epsilon (default 1e-6).
    pub layer_norm_epsilon: f32,
}

impl T5Config {
    /// Parses a transformers `text_encoder/config.json`.
    ///
    /// Only the T5 v1.1 feed-forward `feed_forward_proj = "gated-gelu"` (activation
    /// `gelu_new`) is supported. transformers' default for an absent key is `"relu"` (T5 v1.0),
    /// which is rejected like any other value.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let o = Obj::new(T5, v)?;
        let ffp = o.opt_str("feed_forward_proj")?.unwrap_or("relu");
        if ffp != "gated-gelu" {
            return Err(o.unsupported(
                "feed_forward_proj",
                format!("{ffp:?}"),
                "\"gated-gelu\" (T5 v1.1: wo(gelu_new(wi_0 x) · wi_1 x))",
            ));
        }
        if o.boolean("is_decoder", false)? {
            return Err(o.unsupported("is_decoder", true, "false (encoder only)"));
        }
        let cfg = T5Config {
            vocab_size: o.count("vocab_size", 32128)?,
            d_model: o.count("d_model", 512)?,
            d_kv: o.count("d_kv", 64)?,
            d_ff: o.count("d_ff", 2048)?,
            num_layers: o.count("num_layers", 6)?,
            num_heads: o.count("num_heads", 8)?,
            relative_attention_num_buckets: o.count("relative_attention_num_buckets", 32)?,
            relative_attention_max_distance: o.count("relative_attention_max_distance", 128)?,
            layer_norm_epsilon: o.positive("layer_norm_epsilon", 1e-6)? as f32,
        };
        if cfg.relative_attention_num_buckets < 4 {
            return Err(o.unsupported(
                "relative_attention_num_buckets",
                cfg.relative_attention_num_buckets,
                "at least 4 (half exact, half logarithmic per direction)",
            ));
        }
        Ok(cfg)
    }

    /// `num_heads · d_kv`, the width of q, k and v.
    pub fn inner_dim(&self) -> usize {
        self.num_heads * self.d_kv
    }
}

/// `AutoencoderKL` settings (diffusers 0.42), with defaults resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeConfig {
    /// Image channels into the encoder (default 3).
    pub in_channels: usize,
    /// Image channels out of the decoder (default 3).
    pub out_channels: usize,
    /// Channels of each resolution level, finest first (default `[64]`).
    pub block_out_channels: Vec<usize>,
    /// ResNets per encoder block; decoder blocks have one more (default 1).
    pub layers_per_block: usize,
    /// Latent channels (default 4).
    pub latent_channels: usize,
    /// GroupNorm groups everywhere (default 32).
    pub norm_num_groups: usize,
    /// The pipeline decodes `latents / scaling_factor` (default 0.18215).
    pub scaling_factor: f32,
    /// Whether `quant_conv` follows the encoder (default true).
    pub use_quant_conv: bool,
    /// Whether `post_quant_conv` precedes the decoder (default true).
    pub use_post_quant_conv: bool,
    /// Whether the mid blocks have their attention layer (default true).
    pub mid_block_add_attention: bool,
}

impl VaeConfig {
    /// Parses a diffusers `vae/config.json`.
    ///
    /// Errors: wrong JSON types; block types other than `DownEncoderBlock2D` /
    /// `UpDecoderBlock2D`, or lists whose length differs from `block_out_channels`; `act_fn`
    /// other than `silu`; channel counts not divisible by `norm_num_groups`.
    /// `shift_factor`, `latents_mean`/`latents_std` and `force_upcast` are not read: the PixArt
    /// pipelines ignore them.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let o = Obj::new(VAE, v)?;
        o.require_str("act_fn", "silu", "silu")?;
        let block_out_channels = o.counts("block_out_channels", &[64])?;
        let n = block_out_channels.len();
        for (key, want) in [
            ("down_block_types", "DownEncoderBlock2D"),
            ("up_block_types", "UpDecoderBlock2D"),
        ] {
            let types = o.opt_strs(key)?.unwrap_or_else(|| vec![want]);
            if let Some(bad) = types.iter().find(|t| **t != want) {
                return Err(o.unsupported(key, format!("{bad:?}"), &format!("{want:?}")));
            }
            if types.len() != n {
                return Err(o.inconsistent(format!(
                    "`{key}` has {} entries but `block_out_channels` has {n}",
                    types.len()
                )));
            }
        }
        let norm_num_groups = o.count("norm_num_groups", 32)?;
        if let Some(c) = block_out_channels
            .iter()
            .find(|&&c| !c.is_multiple_of(norm_num_groups))
        {
            return Err(o.inconsistent(format!(
                "block channel count {c} is not divisible by `norm_num_groups` = {norm_num_groups}"
            )));
        }
        Ok(VaeConfig {
            in_channels: o.count("in_channels", 3)?,
            out_channels: o.count("out_channels", 3)?,
            block_out_channels,
            layers_per_block: o.count("layers_per_block", 1)?,
            latent_channels: o.count("latent_channels", 4)?,
            norm_num_groups,
            scaling_factor: o.positive("scaling_factor", 0.18215)? as f32,
            use_quant_conv: o.boolean("use_quant_conv", true)?,
            use_post_quant_conv: o.boolean("use_post_quant_conv", true)?,
            mid_block_add_attention: o.boolean("mid_block_add_attention", true)?,
        })
    }

    /// Image pixels per latent pixel along each axis: `2^(len(block_out_channels) − 1)`.
    pub fn downscale_factor(&self) -> usize {
        1usize << (self.block_out_channels.len().saturating_sub(1)).min(16)
    }
}

/// `AutoencoderTiny` settings (diffusers 0.42; TAESD, TAESDXL), with defaults resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyVaeConfig {
    /// Image channels into the encoder (default 3).
    pub in_channels: usize,
    /// Image channels out of the decoder (default 3).
    pub out_channels: usize,
    /// Encoder stage widths, finest first (default `[64, 64, 64, 64]`).
    pub encoder_block_out_channels: Vec<usize>,
    /// Decoder stage widths, coarsest first (default `[64, 64, 64, 64]`).
    pub decoder_block_out_channels: Vec<usize>,
    /// `AutoencoderTinyBlock`s per encoder stage (default `[1, 3, 3, 3]`).
    pub num_encoder_blocks: Vec<usize>,
    /// `AutoencoderTinyBlock`s per decoder stage (default `[3, 3, 3, 1]`).
    pub num_decoder_blocks: Vec<usize>,
    /// Latent channels (default 4).
    pub latent_channels: usize,
    /// The pipeline decodes `latents / scaling_factor` (default 1.0).
    pub scaling_factor: f32,
}

impl TinyVaeConfig {
    /// Parses a diffusers `AutoencoderTiny` `config.json`.
    ///
    /// Errors: wrong JSON types; `act_fn` other than `relu`, `upsample_fn` other than
    /// `nearest`, `upsampling_scaling_factor` other than 2, a non-zero `shift_factor`; block
    /// lists of different lengths; encoder stages whose widths change (diffusers' stride-2
    /// convolutions keep the width).
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let o = Obj::new(TINY, v)?;
        o.require_str("act_fn", "relu", "relu")?;
        o.require_str("upsample_fn", "nearest", "nearest")?;
        if o.count("upsampling_scaling_factor", 2)? != 2 {
            return Err(o.unsupported(
                "upsampling_scaling_factor",
                o.count("upsampling_scaling_factor", 2)?,
                "2",
            ));
        }
        if let Some(x) = o.opt_number("shift_factor")? {
            if x != 0.0 {
                return Err(o.unsupported("shift_factor", x, "0"));
            }
        }
        let enc = o.counts("encoder_block_out_channels", &[64; 4])?;
        let dec = o.counts("decoder_block_out_channels", &[64; 4])?;
        let nenc = o.counts("num_encoder_blocks", &[1, 3, 3, 3])?;
        let ndec = o.counts("num_decoder_blocks", &[3, 3, 3, 1])?;
        let n = enc.len();
        if dec.len() != n || nenc.len() != n || ndec.len() != n {
            return Err(o.inconsistent(format!(
                "encoder_block_out_channels, decoder_block_out_channels, num_encoder_blocks and num_decoder_blocks have {}, {}, {} and {} entries; they must agree",
                n,
                dec.len(),
                nenc.len(),
                ndec.len()
            )));
        }
        if enc.windows(2).any(|w| w[0] != w[1]) {
            return Err(o.inconsistent(format!(
                "encoder_block_out_channels {enc:?} change width between stages; AutoencoderTiny's stride-2 convolutions keep it"
            )));
        }
        Ok(TinyVaeConfig {
            in_channels: o.count("in_channels", 3)?,
            out_channels: o.count("out_channels", 3)?,
            encoder_block_out_channels: enc,
            decoder_block_out_channels: dec,
            num_encoder_blocks: nenc,
            num_decoder_blocks: ndec,
            latent_channels: o.count("latent_channels", 4)?,
            scaling_factor: o.positive("scaling_factor", 1.0)? as f32,
        })
    }

    /// Image pixels per latent pixel along each axis: `2^(stages − 1)` (8 for TAESD).
    pub fn downscale_factor(&self) -> usize {
        1usize << (self.decoder_block_out_channels.len().saturating_sub(1)).min(16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pixart_defaults_follow_diffusers() {
        let c = PixArtConfig::from_json(&json!({"caption_channels": 4096})).unwrap();
        assert_eq!(c.inner_dim(), 1152);
        assert_eq!(c.cross_attention_dim, 1152);
        assert_eq!(c.out_channels, 8);
        assert_eq!(c.sample_size, 128);
        // sample_size 128: interpolation max(128 // 64, 1) and micro-conditions on.
        assert_eq!(c.interpolation_scale, 2.0);
        assert!(c.use_additional_conditions);
        let c =
            PixArtConfig::from_json(&json!({"sample_size": 64, "use_additional_conditions": null}))
                .unwrap();
        assert_eq!(c.interpolation_scale, 1.0);
        assert!(!c.use_additional_conditions);
        let c = PixArtConfig::from_json(&json!({"out_channels": null, "in_channels": 4})).unwrap();
        assert_eq!(c.out_channels, 4);
    }

    #[test]
    fn pixart_rejects_unsupported_settings_naming_the_key() {
        let e = PixArtConfig::from_json(&json!({"norm_type": "ada_norm_zero"})).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("norm_type") && s.contains("ada_norm_single"),
            "{s}"
        );
        let e = PixArtConfig::from_json(&json!({"num_layers": "28"})).unwrap_err();
        assert!(e.to_string().contains("num_layers"), "{e}");
        let e = PixArtConfig::from_json(&json!({"out_channels": 5})).unwrap_err();
        assert!(e.to_string().contains("out_channels"), "{e}");
        assert!(PixArtConfig::from_json(&json!([1, 2])).is_err());
    }

    #[test]
    fn t5_requires_gated_gelu() {
        let e = T5Config::from_json(&json!({})).unwrap_err();
        assert!(e.to_string().contains("feed_forward_proj"), "{e}");
        let c = T5Config::from_json(&json!({"feed_forward_proj": "gated-gelu"})).unwrap();
        assert_eq!((c.d_model, c.d_kv, c.num_heads, c.d_ff), (512, 64, 8, 2048));
        assert_eq!(c.layer_norm_epsilon, 1e-6);
    }

    #[test]
    fn vae_checks_block_types_and_groups() {
        let c = VaeConfig::from_json(&json!({})).unwrap();
        assert_eq!(c.block_out_channels, vec![64]);
        assert_eq!(c.downscale_factor(), 1);
        let e =
            VaeConfig::from_json(&json!({"up_block_types": ["AttnUpDecoderBlock2D"]})).unwrap_err();
        assert!(e.to_string().contains("up_block_types"), "{e}");
        let e = VaeConfig::from_json(&json!({"block_out_channels": [48], "norm_num_groups": 32}))
            .unwrap_err();
        assert!(e.to_string().contains("norm_num_groups"), "{e}");
    }
}
