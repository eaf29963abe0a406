//! The device runtime: mmap and verify a plan, run its stages on one arena, sample, decode,
//! write the image. Depends only on `edge-schema` and the kernel crates.
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod sampler;
pub mod tokenizer;
