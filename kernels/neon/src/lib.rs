//! NEON kernels for aarch64, plugged into the generic kernel table.
//!
//! [`variants`] returns [`edge_kernels::generic`] with the slots this crate accelerates replaced
//! (the process-wide choice among them is `edge_kernels_cpu::best`):
//! on aarch64 (where Advanced SIMD is part of the baseline) the `linear` slot becomes a NEON
//! kernel for every weight type a plan can hold: `F32`, `F16`, `BF16`, `Q8_0`, `Q4_0`, `Q4_1`,
//! `Q5_0`, `Q5_1` and the K-quants `Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`;
//! when the CPU reports the `dotprod` extension at run time (`is_aarch64_feature_detected!`,
//! detected once), the quantized dot products use `sdot`, and with `i8mm` the `Q8_0`/`Q4_0` ones
//! use `smmla` on 2 rows × 2 columns (the other quantized types keep their `sdot` kernels in the
//! `i8mm` table); `Q8_0`/`Q4_0` weights repacked in `PackLayout::Interleaved4x8` are read by
//! kernels that load each `smmla` weight operand (or `sdot` row pair) with one 16-byte load.
//! The `silu`, `gelu_tanh` and `tanh` slots become four-lane NEON kernels over the generic
//! polynomial `exp` (`relu` a four-lane compare and select);
//! `layer_norm` and `rms_norm` compute their f64 statistics in NEON f64 lanes. The
//! `attention` slot is the generic online-softmax driver with a NEON step (`q·k` with keys in
//! lanes, `exp`, `acc = fma(w, v, acc)` with channels in lanes); `add`, `mul`, `modulate` and
//! `gated_residual` are four-lane versions of the generic broadcast ops. `linear` with
//! `F32`/`F16`/`BF16` weights and `conv2d` are the generic blocked GEMM driver (and its packed
//! im2col) with the NEON 6×16 f32 tile, `group_norm` computes its f64
//! statistics in NEON f64 lanes and `upsample_nearest2x` doubles rows with NEON `zip`/stores.
//! Only the two scratch-size slots stay generic (the planner sizes the arena with them, and the
//! NEON kernels fit in it). Argument checks are the generic ones ([`edge_kernels::contract`]).
//! On every other architecture [`variants`] is only `generic()`.
//!
//! Kernel names follow `{isa}_{op}_{dtype}_{tile}`; since one `linear` slot serves every weight
//! type, its name uses the dtype `any` and [`linear_variant_name`] gives the kernel used per
//! weight type.
//!
//! Numerics (each kernel is tested against its generic twin in `tests/`):
//! - `F32`/`F16`/`BF16` weights (the halves widened exactly): the generic GEMM driver's order,
//!   one fused multiply-add per input feature in increasing index (one output column per lane
//!   of `fmla`), then the bias: bit-identical.
//! - `Q8_0`/`Q4_0` weights, row-major or in `PackLayout::Interleaved4x8` (4 weight rows
//!   stored together block by block, 8-byte quant chunks of two rows side by side; read by
//!   dedicated kernels `neon_linear_{q8_0,q4_0}_{base,dotprod,i8mm}_x4`, see
//!   [`linear_layout_variant_name`], with the `n mod 4` row-major tail rows on the row-major
//!   kernels): activations quantized once per row with
//!   [`edge_kernels::quant::quantize_activation_row`]; per block the integer dot product is
//!   exact and the f32 scaling is done in the generic kernel's order (`Q8_0`: `sumf =
//!   fma(sumi, dw·da, sumf)`; `Q4_0`: ggml's `ggml_vec_dot_q4_0_q8_0_generic` in
//!   `src/ggml-cpu/quants.c`), so these results are bit-identical to the generic kernel in both
//!   layouts. Other weight types must be
//!   row-major (as for the generic kernel, any other layout panics).
//! - `Q4_1`/`Q5_0`/`Q5_1` weights: as `Q4_0` (activations `Q8_1`/`Q8_0`), exact integer block
//!   sums and the generic f32 scaling (`(dx·dy)·sumi + mx·sy`; `Q5_0` fused like `Q8_0`):
//!   bit-identical.
//! - K-quant weights (activations `Q8_K`, `ggml_vec_dot_q*_K_q8_K_generic`): the ARMv8.0 kernels
//!   (`neon_linear_q*_k_base`) keep the generic kernel's eight integer lanes (element index mod
//!   8) and its f32 lane sums: bit-identical. The `sdot` kernels (`neon_linear_q*_k_dotprod`)
//!   compute each block's exact integer total and add one f32 term per block: `Q2_K` stays
//!   bit-identical (its generic form is one term per block); `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`
//!   differ from the generic kernel by f32 rounding only, at most `(3·nb + 16)·u·T` for `nb`
//!   blocks, `u = 2⁻²⁴` and `T` the sum of the absolute f32 terms (tested; measured ≤ `0.6·u·T`).
//! - `silu`, `gelu_tanh`, `tanh`: the generic formulas over the generic `exp` polynomial, lane by
//!   lane in the same operation order (the formulas unfused, `exp`'s steps fused as the generic
//!   `exp_f32` fuses them): bit-identical. `relu`: bit-identical.
//! - `layer_norm`, `rms_norm`, `group_norm`: f64 statistics in four lanes, the order of
//!   [`edge_kernels::lane_sum`] (squares unfused): bit-identical.
//! - `conv2d`: the generic driver with the NEON f32 tile (weights converted exactly to f32
//!   first), then the bias: bit-identical.
//! - `upsample_nearest2x`: data movement only, bit-identical.
//! - `attention`: the generic step's operations in lanes (`q·k` fused in channel order, the
//!   generic `exp`, `tile_sum`, `acc = fma(w, v, acc)` in key order): bit-identical.
//!
//! So every slot is bit-identical to the generic kernel except the `sdot` K-quant kernels
//! (`Q3_K`…`Q6_K`, within the bound above): a plan without K-quant weights gives the same bytes
//! on an ARM board as on the x86 workstation (`scripts/test-aarch64` compares them with `cmp`).
//! - `add`, `mul`, `modulate`, `gated_residual`: the generic single f32 operations per element,
//!   unfused and in the same order: bit-identical to the generic kernels.
//!
//! All `unsafe` code lives in `src/aarch64/`.
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(not(target_arch = "aarch64"), forbid(unsafe_code))]

#[cfg(target_arch = "aarch64")]
mod aarch64;

use edge_kernels::KernelTable;
use edge_schema::plan::PackLayout;
use edge_schema::DType;

/// Every table variant this CPU can run, baseline first and the fastest (the `i8mm` table, else
/// the `dotprod` one, else ARMv8.0; what `edge_kernels_cpu::best` picks on aarch64) last, each with a
/// short label (`"generic"`, `"neon"`, `"neon+dotprod"`, `"neon+i8mm"`). Tests run all of them,
/// so a CPU with `dotprod` and `i8mm` exercises the ARMv8.0, `sdot` and `smmla` paths. On other
/// architectures: only `("generic", generic())`.
pub fn variants() -> Vec<(&'static str, KernelTable)> {
    #[cfg(target_arch = "aarch64")]
    {
        aarch64::variants()
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        vec![("generic", edge_kernels::generic())]
    }
}

/// The kernel that the `linear` slot of `table` uses for weights of type `dtype`, by name
/// (`neon_linear_q8_0_dotprod`, `neon_linear_f32_6x16`, …, or `generic_linear_f32` for types it
/// forwards to the generic kernel and for tables that are not from this crate).
pub fn linear_variant_name(table: &KernelTable, dtype: DType) -> &'static str {
    #[cfg(target_arch = "aarch64")]
    {
        aarch64::linear_variant_name(table, dtype)
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = (table, dtype);
        "generic_linear_f32"
    }
}

/// The kernel that the `linear` slot of `table` uses for weights of type `dtype` stored in
/// `layout`: [`linear_variant_name`] for [`PackLayout::RowMajor`]; for `Q8_0`/`Q4_0` in
/// [`PackLayout::Interleaved4x8`] the interleaved kernels `neon_linear_{q8_0,q4_0}_{base,dotprod,i8mm}_x4`
/// (`generic_linear_f32` for tables that are not from this crate). Panics, with the `linear`
/// kernels' message, for a type that cannot be in `layout`.
pub fn linear_layout_variant_name(
    table: &KernelTable,
    dtype: DType,
    layout: PackLayout,
) -> &'static str {
    #[cfg(target_arch = "aarch64")]
    {
        aarch64::linear_layout_variant_name(table, dtype, layout)
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        assert!(
            edge_kernels::pack::holds(layout, dtype),
            "linear: {dtype:?} weights cannot be in layout {layout:?}"
        );
        let _ = table;
        if layout == PackLayout::Bf16Pairs16 {
            "generic_linear_bf16_pairs"
        } else {
            "generic_linear_f32"
        }
    }
}

/// CPU features that select a kernel variant: the process's one detection
/// ([`edge_kernels::cpu::Features`]; the aarch64 fields are `false` elsewhere).
pub use edge_kernels::cpu::Features;

/// The features the variants are chosen from ([`edge_kernels::cpu::features`]).
pub fn features() -> Features {
    edge_kernels::cpu::features()
}
