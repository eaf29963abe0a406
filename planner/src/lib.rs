//! The offline planner: reads published model files, builds each stage's graph, folds, cuts
//! into segments, lays out the arena, packs weights and writes a `.plan` (steps run in the
//! order the model builders emit them).
//!
//! Pipeline: [`load`] (safetensors, sharded index, GGUF, diffusers folder) → `edge_models`
//! graph builders → [`lower`] (weights into the tensor table, liveness and the [`arena`]
//! layout, cut markers into segments) → [`pack`] (weight types) → [`write`] (sections,
//! digests, header, atomic write). Never depends on the runtime.
#![deny(unsafe_code)]

pub mod arena;
pub mod budget;
pub mod compile;
pub mod cuda_place;
pub mod decoder;
pub mod encoder;
pub mod error;
pub mod files;
pub mod inspect;
pub mod load;
pub mod lora;
pub mod lower;
pub mod pack;
pub mod progress;
pub mod resolve;
pub mod sign;
pub mod table;
pub mod tiling;
pub mod write;

pub use compile::{a7_refusal, compile_folder, compile_to_file, CompileOptions, Compiled};
pub use error::{PlanError, Result};
