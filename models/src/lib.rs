//! Graph builders for the three networks of a PixArt-α/Σ pipeline, matching the numerics of
//! diffusers 0.42 and transformers 5:
//!
//! * [`t5::build_t5_encoder`]: the T5 v1.1 encoder (`T5EncoderModel`), ids + mask → hidden states;
//! * [`pixart::build_pixart_denoiser`]: `PixArtTransformer2DModel`, one batch-1 forward that
//!   returns the noise prediction;
//! * [`vae::build_vae_decoder`] (also split into [`vae::build_vae_decoder_head`] and
//!   [`vae::build_vae_decoder_tail`] for tiles) / [`vae::build_vae_encoder`] (also split into
//!   [`vae::build_vae_encoder_down`] and [`vae::build_vae_encoder_mid`]): `AutoencoderKL`'s
//!   decoder and encoder;
//! * [`taesd::build_tiny_decoder`] / [`taesd::build_tiny_encoder`]: `AutoencoderTiny` (TAESD,
//!   TAESDXL), the preview decoder.
//!
//! Configurations come from the published `config.json` files ([`config`]). Every graph names
//! its weights with the diffusers / transformers checkpoint names (fused projections are
//! row concatenations of those), has static shapes, and carries cut markers at block
//! boundaries. This crate depends only on `edge-graph` (and through it `edge-schema`); it never
//! depends on the planner or the runtime.
#![forbid(unsafe_code)]

pub mod config;
pub mod infer;
pub mod original;
pub mod pixart;
pub mod t5;
pub mod taesd;
mod util;
pub mod vae;

pub use config::{ConfigError, PixArtConfig, T5Config, TinyVaeConfig, VaeConfig};
pub use pixart::{
    build_pixart_cross_kv, build_pixart_denoiser, build_pixart_denoiser_cached, cross_kv_shape,
    cross_kv_width, pos_embed_2d, MicroConditions,
};
pub use t5::build_t5_encoder;
pub use taesd::{build_tiny_decoder, build_tiny_encoder};
pub use vae::{
    build_vae_decoder, build_vae_decoder_head, build_vae_decoder_tail, build_vae_encoder,
    build_vae_encoder_down, build_vae_encoder_mid,
};

/// Why a model graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The configuration is unusable (the error names the model, key and what is supported).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Building the graph failed (the error names the graph and node); a builder bug or a
    /// configuration whose sizes do not fit together.
    #[error(transparent)]
    Graph(#[from] edge_graph::Error),
    /// A requested size does not fit the model.
    #[error("{model}: {msg}")]
    Size { model: &'static str, msg: String },
    /// A PixArt-α model that needs the resolution / aspect-ratio micro-conditions was built
    /// without them.
    #[error("{model}: the config uses additional conditions (resolution, aspect ratio) but none were given")]
    MissingMicroConditions { model: &'static str },
    /// A config could not be inferred from tensor shapes (the message names the tensor and
    /// file, or the flag that would supply what shapes cannot say).
    #[error("{0}")]
    Infer(String),
}
