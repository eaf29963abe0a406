//! The complete generic (portable, safe Rust) kernel table: the oracle for every SIMD and
//! CUDA kernel.
//!
//! Kernels take slices and plain parameter structs; they never see `Op`: [`call`] is the one
//! place where an op and its shapes become a [`Call`] with those parameters. Every SIMD or CUDA
//! kernel elsewhere has its twin here, and tests compare them. This crate depends only on
//! `edge-schema` (for [`DType`](edge_schema::DType)) and never on the graph, planner or runtime.
//!
//! Conventions shared by all kernels:
//! - Tensors are contiguous, row-major, f32, shapes written outermost-first (PyTorch order).
//! - Weights arrive as raw bytes ([`WeightRef`]); `F32` weights are viewed in place and must be
//!   4-byte aligned (plans align weight sections to 64 bytes). Scratch memory comes from the
//!   caller (the planned arena), 4-byte aligned; kernels allocate no buffers.
//! - Preconditions are asserted once per call with a message; inner loops only `debug_assert!`.
//! - Work runs on rayon's global pool (see [`init_threads`]). Every output element is computed
//!   by exactly one task and every reduction has a fixed order, so results are bit-identical
//!   for any thread count.
#![forbid(unsafe_code)]

mod attention;
pub mod attention_bf16;
pub mod bf16dot;
pub mod call;
pub mod contract;
mod conv;
pub mod cpu;
mod elementwise;
mod embed;
pub mod expf;
mod gemm;
mod layout;
mod linear;
mod norm;
pub mod pack;
mod params;
pub mod quant;
mod table;
mod weights;
mod winograd;

pub use attention::{
    attention, attention_with, generic_row_tile, pack_keys, pack_values, softmax_step, tile_max,
    tile_sum, touch_worker_stacks, visited_keys, AttentionOps, AttentionParams, BlockState,
    BlockTileFn, BlockValuesFn, KeyTile, PackKeysFn, Phases, QueryBlock, RowState,
    GENERIC_ATTENTION, KEY_TILE, MAX_HEAD_DIM, QUERY_TILE, SMALL_HEAD_DIM, SUM_LANES,
};
pub use attention_bf16::{attention_bf16, GENERIC_ATTENTION_BF16};
pub use call::{Axes, Call};
pub use conv::{
    conv2d, conv2d_direct, conv2d_scratch_bytes, conv2d_with, winograd_applies, Conv2dParams,
    WINOGRAD_MIN_CHANNELS,
};
/// Elements per task of the element-wise kernels (each output element depends only on its own
/// inputs, so SIMD twins may split the same way or any other).
pub use elementwise::CHUNK as ELEMENTWISE_CHUNK;
pub use elementwise::{
    add, gated_residual, gelu_tanh, gelu_tanh_f32, gelu_tanh_in_place, modulate, mul, relu, scale,
    silu, silu_f32, tanh, GELU_KAPPA, GELU_SQRT_2_OVER_PI,
};
pub use embed::{embedding, t5_position_bias, t5_relative_position_bucket, timestep_embedding};
pub use gemm::{
    pack_panel, F32Tile, PackFn, TileFn, GENERIC_TILE, KC, MAX_BLOCK_ROWS, MAX_TILE_COLS,
    MAX_TILE_ROWS, PACK_FEATURES, PANEL_SLOTS,
};
pub use layout::{concat_axis, concat_part, permute, slice_axis, upsample_nearest2x, MAX_RANK};
pub use linear::{
    finish_rows, linear, linear_plain, linear_scratch_bytes, panel_cols, quant_panel_bytes,
    quant_panel_cols, quant_panel_cols_within, quant_scratch_layout, QUANT_ACT_BLOCK_BYTES,
    QUANT_PANEL_BLOCK_BYTES, QUANT_PANEL_COLS, QUANT_PANEL_MAX_BYTES,
};
pub use norm::{
    group_norm, group_norm_apply, group_norm_stats, lane_sum, layer_norm, layer_norm_value,
    rms_norm, GroupStats,
};
pub use table::{
    generic, AttentionFn, BinaryFn, Conv2dFn, Conv2dScratchFn, EpilogueFn, GatedResidualFn,
    GroupNormApplyFn, GroupNormStatsFn, Kernel, KernelTable, LayerNormFn, LinearFn,
    LinearScratchFn, ModulateFn, RmsNormFn, UnaryFn, UpsampleFn,
};
pub use weights::WeightRef;

/// Builds rayon's global thread pool with `n` threads (0 = one per core), reporting why it could
/// not (for instance the OS refused to start a thread). Call it before any kernel runs: once a
/// pool exists this returns an error too.
pub fn start_threads(n: usize) -> Result<(), String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| e.to_string())
}

/// Runs `f` on a thread of rayon's global pool and returns its result: directly when the
/// caller is already one, else handed to the pool while the caller waits. A caller that runs
/// many kernels in a row (a stage's steps) should run them through this: every kernel then
/// forks and joins from inside the pool, instead of handing each of its parallel loops over
/// from an outside thread and sleeping until it is done (each hand-over wakes the caller and
/// the workers again, and on a machine with as many workers as cores the idle workers' spinning
/// competes with the caller's serial work between kernels). A PixArt-Σ denoiser evaluation at
/// 512² on 2 threads ran 1.07-1.12× as fast this way (BENCHMARKS.md, twenty-fourth session).
/// Results never depend on where `f` runs. A panic in `f` reaches the caller.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

/// Builds rayon's global thread pool with `n` threads (0 = rayon's default, one per core).
///
/// Returns `true` if this call built the pool, `false` if the global pool already existed
/// (an earlier call, or a kernel that already ran and started rayon's default pool); the
/// existing pool then stays. Results never depend on the thread count.
pub fn init_threads(n: usize) -> bool {
    start_threads(n).is_ok()
}

#[cfg(test)]
mod tests {
    /// `on_pool` moves work from an outside thread (a test's) onto the pool, runs it directly
    /// when already there, and hands back the result.
    #[test]
    fn on_pool_runs_on_a_pool_thread() {
        assert!(rayon::current_thread_index().is_none());
        let (inside, nested) = super::on_pool(|| {
            let me = rayon::current_thread_index();
            (me, super::on_pool(rayon::current_thread_index))
        });
        assert!(inside.is_some());
        assert_eq!(nested, inside, "a nested call runs where it is");
    }
}
