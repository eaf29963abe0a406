//! x86-64 kernels plugged into the generic kernel table: AVX2 and AVX-512 register tiles for the
//! shared blocked f32 GEMM driver (`linear` with `F32`/`F16`/`BF16` weights and `conv2d`) and
//! AVX2, AVX-512 VNNI and AMX-INT8 panel kernels for the quantized 32-element block types.
//!
//! [`variants`] lists every table this CPU can run, from the features
//! [`edge_kernels::cpu::features`] detected once per process: `avx2` (AVX2, FMA and F16C),
//! `avx512` (AVX-512F), `avx512+vnni` (AVX-512F, BW and VNNI), `avx512+vnni+bf16` (and
//! AVX512_BF16: `vdpbf16ps` for bf16 products), `avx512+vnni+bf16+amx` (and AMX-INT8, granted
//! by Linux: [`amx_granted`]); the last one is the fastest.
//! Slots this crate does not accelerate keep their generic kernels.
//!
//! Numerics: **bit-identical to the generic kernels** (tested in `tests/` on ragged sizes for
//! every variant this CPU has).
//! - f32 tiles and attention: one output column (or key, or head channel) per lane and one
//!   `vfmadd` per input feature in increasing order, the generic `f32::mul_add` chain
//!   ([`edge_kernels::F32Tile`] states the order); AVX2 6×16 and AVX-512 6×64 tiles over the
//!   driver's packed panels. The `avx2` table needs FMA too.
//! - Quantized: exact integer block sums on repacked weight panels (`vpdpbusd` with VNNI,
//!   `vpmaddubsw` + `vpmaddwd` on AVX2 and on AVX-512 without VNNI, `tdpbssd` tiles of 16
//!   rows with AMX where a call has at least 16 rows and 256 features) and the generic
//!   per-block f32 scaling order (see `x86_64/qgemm.rs`, `x86_64/qgemm_avx2.rs`,
//!   `x86_64/qgemm_amx.rs`). K-quants, the NEON interleaved packs and matrices with fewer
//!   activation rows than one register tile (6 for VNNI, 4 for AVX2) forward to the generic
//!   kernel.
//!
//! All `unsafe` code lives in `src/x86_64/`; off x86-64 the crate is `forbid(unsafe_code)` and
//! [`variants`] is empty.
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(not(target_arch = "x86_64"), forbid(unsafe_code))]

#[cfg(target_arch = "x86_64")]
mod x86_64;

use edge_kernels::cpu::Features;
use edge_kernels::KernelTable;
use edge_schema::plan::PackLayout;
use edge_schema::DType;

/// Every x86 table `features` allows, slowest first, each with a short label (`"avx2"`,
/// `"avx512"`, `"avx512+vnni"`). Empty off x86-64 or on a CPU without AVX2, FMA and F16C.
pub fn variants(features: &Features) -> Vec<(&'static str, KernelTable)> {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::variants(features)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = features;
        Vec::new()
    }
}

/// Whether this process may run AMX instructions (the OS saves the tile state and Linux granted
/// it; asked once, on the first call): the `avx512+vnni+bf16+amx` table needs it besides
/// `Features::amxint8`. False off x86-64.
pub fn amx_granted() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::amx_granted()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernel that the `linear` slot of `table` runs for weights of type `dtype` in `layout`
/// (`avx512_f32_6x64`, `avx512vnni_linear_q32_panel_6x32`, `generic_linear_f32` for types the
/// slot forwards), or `None` when `table` is not one of this crate's.
pub fn linear_variant_name(
    table: &KernelTable,
    dtype: DType,
    layout: PackLayout,
) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::linear_variant_name(table, dtype, layout)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (table, dtype, layout);
        None
    }
}

/// Peak throughput of one core of this CPU, as measured in this process: f32 arithmetic (unfused
/// multiply then add, and fused multiply-add — the f32 kernels' arithmetic — on the widest
/// vectors) and int8 dot products, in operations per second (2 per multiply-add). `None` where the CPU lacks the instructions (or off x86-64).
#[derive(Clone, Copy, Debug, Default)]
pub struct Peak {
    /// f32 `vmulps` + `vaddps` on zmm (ymm on AVX2 CPUs without AVX-512), per thread
    /// (element-wise kernels' unfused arithmetic).
    pub f32_ops: Option<f64>,
    /// f32 `vfmadd` on zmm (ymm without AVX-512), per thread (the f32 GEMM, convolution and
    /// attention kernels).
    pub f32_fma_ops: Option<f64>,
    /// `vpdpbusd` on zmm with AVX-512 VNNI; `vpmaddubsw` + `vpmaddwd` + `vpaddd` on ymm (the
    /// AVX2 quantized tile's dot) on AVX2 CPUs without AVX-512; per thread.
    pub int8_ops: Option<f64>,
    /// `vdpbf16ps` on zmm with AVX512_BF16 (bf16 multiply-adds ×2, 32 per instruction), per
    /// thread: the kernel of `PackLayout::Bf16Pairs16` weights.
    pub bf16_ops: Option<f64>,
    /// AMX `tdpbssd` on full tiles (16 × 16 × 64 int8 multiply-adds per instruction), per
    /// thread, where AMX-INT8 is present and granted: the `avx512+vnni+bf16+amx` table's
    /// quantized tile.
    pub amx_int8_ops: Option<f64>,
}

/// Measures [`Peak`] on the calling thread (about `iters` iterations of 12 independent chains;
/// 20 million take about a tenth of a second).
pub fn peak(features: &Features, iters: usize) -> Peak {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::peak::measure(features, iters)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (features, iters);
        Peak::default()
    }
}
