//! The plan-file vocabulary shared by the planner and the runtime.
//!
//! A plan is a fixed [`header::Header`] read with zerocopy, a postcard-encoded [`plan::PlanMeta`]
//! and an aligned region of packed weights. This crate defines those types, the ggml block
//! structs, the [`op::Op`] enum and the verifier that the runtime runs before trusting a plan.
//! It must not depend on any other crate of the workspace.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod blocks;
pub mod dtype;
pub mod error;
pub mod header;
#[cfg(feature = "io")]
pub mod io;
pub mod memory;
pub mod op;
pub mod plan;
pub mod scheduler;
pub mod tiles;
pub mod tokenizer;
pub mod verify;

pub use dtype::DType;
pub use error::{Error, Result};
