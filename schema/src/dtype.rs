//! Element and block types of tensors in a plan.
//!
//! Quantized types are the ggml block formats (`ggml-common.h`): a row of `n` elements is
//! stored as `n / block_size` consecutive blocks of `type_size` bytes each.

use serde::{Deserialize, Serialize};

/// The storage type of a tensor. The numeric ids in `ggml_type_id` are ggml's `enum ggml_type`
/// (GGUF files store them), so GGUF tensors map onto this enum without a table elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

impl DType {
    /// Every type, in declaration order.
    pub const ALL: [DType; 14] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];

    /// Elements per block (1 for plain types; 32 for Q4_0..Q8_0; 256 for K-quants).
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => 256,
        }
    }

    /// Bytes per block (ggml `type_size`).
    pub const fn type_size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    /// Whether this is a ggml block-quantized type.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number of blocks or
    /// the product overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }

    /// ggml's numeric type id (`enum ggml_type` in ggml.h), as stored in GGUF files.
    pub const fn ggml_type_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2K => 10,
            DType::Q3K => 11,
            DType::Q4K => 12,
            DType::Q5K => 13,
            DType::Q6K => 14,
            DType::I32 => 26,
            DType::BF16 => 30,
        }
    }

    /// The inverse of [`DType::ggml_type_id`]; `None` for ids this project does not know.
    pub fn from_ggml_type_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.ggml_type_id() == id)
    }

    /// Lower-case name as used on the command line and by ggml (`q8_0`, `q4_k`, `f16`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }

    /// Parses [`DType::name`] (case-insensitive).
    pub fn from_name(s: &str) -> Option<DType> {
        let l = s.to_ascii_lowercase();
        DType::ALL.into_iter().find(|d| d.name() == l)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
