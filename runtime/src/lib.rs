//! The device runtime: mmap and verify a plan, run its stages on one arena, sample, decode,
//! write the image.
//!
//! Depends only on `edge-schema`, the kernel crates and a few small libraries (memmap2,
//! zerocopy, png); never on the planner, graph, models, safetensors, clap or anyhow.
//! `unsafe` exists for three concerns: the `mmap` call and its page advice in [`plan`], the
//! `SIGBUS` guard of the mapping in `guard`, and the allocator setting in [`alloc`]; with the
//! `cuda` feature, kernel launches in `cuda` (their argument lists).
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

#[allow(unsafe_code)]
pub mod alloc;
pub mod budget;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;
pub mod error;
pub mod executor;
#[allow(unsafe_code)]
mod guard;
mod held;
pub mod host;
pub mod image;
pub mod parameters;
pub mod pipeline;
pub mod plan;
pub mod profile;
pub mod residency;
pub mod rng;
pub mod sampler;
pub mod session;
pub mod sign;
pub mod stream;
pub mod target;
pub mod tiling;
pub mod tokenizer;

pub use error::{BudgetSource, Error, Result};
pub use executor::Executor;
pub use pipeline::{
    generate, generate_previewing, generate_with, Decoder, Flow, GenerateParams, Generated,
    InitImage, Preview, PreviewSpec, Progress,
};
pub use plan::Plan;
pub use session::{Session, StageInput};
pub use sign::{SignatureError, TrustedKey};
