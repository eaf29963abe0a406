//! Model-file readers: safetensors (single and sharded), GGUF, diffusers pipeline folders,
//! JSON configs, tokenizer files, scheduler configs.
//!
//! Every reader presents tensors through [`TensorSource`]: a name (as written in the file),
//! a [`DType`], a shape written **outermost-first** (PyTorch order; GGUF's `ne` is reversed on
//! read) and the raw little-endian bytes.

pub(crate) mod file;
pub mod folder;
pub mod gguf;
pub mod original;
pub mod safetensors;
pub mod scheduler;
pub mod tokenizer;

use edge_schema::DType;

/// One tensor as stored in a model file.
#[derive(Clone, Debug)]
pub struct RawTensor<'a> {
    /// Storage type (F32, F16, BF16 or a ggml block type).
    pub dtype: DType,
    /// Shape, outermost-first (PyTorch order).
    pub shape: Vec<usize>,
    /// Raw little-endian bytes, exactly `dtype.bytes_for(shape.product())` long.
    pub data: &'a [u8],
}

/// A set of named tensors read from one or more files.
pub trait TensorSource: Send + Sync {
    /// The tensor called `name`, or `Ok(None)` when the source has no such tensor.
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>, LoadError>;
    /// All tensor names, sorted.
    fn names(&self) -> Vec<String>;
    /// A human-readable description of where the tensors come from (file paths), for errors.
    fn describe(&self) -> String;
    /// One stored tensor that holds all of `parts` (diffusers names) concatenated along
    /// axis 0 in that order, when the source stores them fused (e.g. the original PixArt
    /// `attn.qkv` for `[to_q, to_k, to_v]`); `Ok(None)` otherwise. Lets quantized fused
    /// tensors pass through unchanged. Default: `Ok(None)`.
    fn fused(&self, parts: &[String]) -> Result<Option<RawTensor<'_>>, LoadError> {
        let _ = parts;
        Ok(None)
    }
    /// The name under which the file stores tensor `name` when it differs from `name`
    /// (for error messages). Default: `None`.
    fn stored_name(&self, name: &str) -> Option<String> {
        let _ = name;
        None
    }
    /// The name of the whole stored tensor that holds `name` (the fused tensor, without a row
    /// range, when `name` is rows of one), when it differs from `name`. Default:
    /// [`TensorSource::stored_name`].
    fn stored_whole_name(&self, name: &str) -> Option<String> {
        self.stored_name(name)
    }
}

/// Errors of reading model files. Each names the file (and tensor) concerned.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid safetensors file: {reason}")]
    Safetensors { path: String, reason: String },
    #[error("{path}: {reason}")]
    Json { path: String, reason: String },
    #[error("{path}: tensor `{tensor}` has dtype {dtype}, which is not supported (expected F32, F16 or BF16)")]
    UnsupportedDType {
        path: String,
        tensor: String,
        dtype: String,
    },
    #[error("{path}: tensor `{tensor}` is listed in the shard index but missing from {shard}")]
    MissingInShard {
        path: String,
        tensor: String,
        shard: String,
    },
    #[error("{path}: {reason}")]
    Folder { path: String, reason: String },
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error(transparent)]
    Scheduler(#[from] scheduler::SchedulerLoadError),
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerLoadError),
}

/// Converts a tensor of a float type (F32, F16, BF16, or any ggml block type) to f32 values.
pub fn to_f32(t: &RawTensor<'_>) -> Vec<f32> {
    let n: usize = t.shape.iter().product();
    let mut out = vec![0f32; n];
    edge_kernels::quant::dequantize_row(t.dtype, t.data, &mut out);
    out
}
