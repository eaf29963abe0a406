//! Model-file readers: safetensors (single and sharded), GGUF, diffusers pipeline folders,
//! JSON configs, tokenizer files, scheduler configs.

pub mod gguf;
pub mod scheduler;
pub mod tokenizer;
