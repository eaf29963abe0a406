//! The complete generic (scalar, portable) kernel table.
//!
//! Kernels take slices and plain parameter structs; they never see `Op`. Every SIMD or CUDA
//! kernel elsewhere has its twin here, and tests compare them.
#![forbid(unsafe_code)]

pub mod quant;
