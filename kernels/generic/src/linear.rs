//! `generic_linear_f32`: `out = x · wᵀ + bias` for every weight storage type.

use edge_schema::DType;
use rayon::prelude::*;

use edge_schema::plan::PackLayout;

use crate::gemm::{
    column_tasks, gemm, gemm_column_tasks, scratch_slots, Bias, F32Tile, GENERIC_TILE,
    MAX_TILE_COLS, PACK_FEATURES, PANEL_SLOTS,
};
use crate::table::EpilogueFn;
use crate::weights::{f32_view, f32_view_mut, WeightRef};
use crate::{contract, pack, quant};

/// Bytes of f32 panels one column task of [`linear`] packs at most (`F32`/`F16`/`BF16`): every
/// row block of the task passes over all of them, so they should stay in a 2 MiB L2 beside the
/// block's activation rows.
const TASK_PANEL_BYTES: usize = 1 << 20;

/// Weight rows (output columns) a column task of [`linear`] packs to f32 panels at a time
/// (`F32`/`F16`/`BF16` weights, `k` input features): as many 64-column panels as fit
/// [`TASK_PANEL_BYTES`], 1 to 4 (3 for PixArt's `k = 1152`, 1 for `k = 4608`). A wider task
/// reads its rows of `x` once for all its panels instead of once per panel (`x` of a PixArt-Σ
/// 512² `linear` is 4.7 MB or more, beyond L2): the F16 NFE's `linear f16` took 6574–6629 ms
/// per 3 NFEs against 6824–6934 with one panel, its `linear+gelu_tanh` 2708–2711 against
/// 2959–3028; 4 panels for every `k` made the `k = 4608` products slower (4.7 MB of panels,
/// beyond L2), and for `k = 1152` were no faster than 3 (`kbench 2 "linear f16"`):
/// BENCHMARKS.md. The same bits for any width.
pub fn panel_cols(k: usize) -> usize {
    let panel = MAX_TILE_COLS * k.max(1) * 4;
    (TASK_PANEL_BYTES / panel).clamp(1, 4) * MAX_TILE_COLS
}

/// Granularity of the weight columns (rows of `w`) that a blocked quantized `linear` kernel
/// repacks at a time for the 32-element block types (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`):
/// the scratch of [`linear_scratch_bytes`] holds one panel of [`quant_panel_cols`] columns
/// after the quantized activations.
pub const QUANT_PANEL_COLS: usize = 64;

/// Largest repacked panel in bytes (more columns per panel: fewer pack/compute phases per op).
pub const QUANT_PANEL_MAX_BYTES: usize = 2 << 20;

/// Most columns of one repacked panel.
pub const QUANT_PANEL_MAX_COLS: usize = 512;

/// Columns of one repacked panel for `k` input features: as many multiples of
/// [`QUANT_PANEL_COLS`] as fit [`QUANT_PANEL_MAX_BYTES`], at least one and at most
/// [`QUANT_PANEL_MAX_COLS`].
pub fn quant_panel_cols(k: usize) -> usize {
    quant_panel_cols_within(k, QUANT_PANEL_MAX_BYTES)
}

/// [`quant_panel_cols`] for panels of at most `max_bytes` instead of [`QUANT_PANEL_MAX_BYTES`]
/// (at least one multiple of [`QUANT_PANEL_COLS`], at most [`QUANT_PANEL_MAX_COLS`]), for a
/// driver that packs less than the scratch holds at a time.
pub fn quant_panel_cols_within(k: usize, max_bytes: usize) -> usize {
    let per_col = (k / 32).max(1) * QUANT_PANEL_BLOCK_BYTES;
    (max_bytes / per_col / QUANT_PANEL_COLS * QUANT_PANEL_COLS)
        .clamp(QUANT_PANEL_COLS, QUANT_PANEL_MAX_COLS)
}

/// Bytes per weight column and 32-element block of a repacked quantized panel: 32 bytes of
/// signed 8-bit values, the f32 block scale, an i32 correction term and the f32 block minimum.
pub const QUANT_PANEL_BLOCK_BYTES: usize = 44;

/// Scratch bytes [`linear`] needs for weights of type `w_dtype`, `m` activation rows and `k`
/// input features: for `F32`/`F16`/`BF16`, `panel_cols(k)·k·4` per task's panels of weight rows
/// converted to f32 and packed for the GEMM driver ([`panel_cols`]), [`PANEL_SLOTS`] of them from
/// 8 rows on (one per column task of [`linear`]), one below; `m · quant::activation_row_bytes(w_dtype, k)` for quantized types (each activation
/// row quantized once, ggml's `vec_dot_type`), plus, for the 32-element block types,
/// [`quant_panel_bytes`]`(k)` for the repacked weight panel that the SIMD twins use (the
/// generic kernel leaves it unused; the planner sizes every plan for the fastest twin).
pub fn linear_scratch_bytes(w_dtype: DType, m: usize, k: usize) -> usize {
    match w_dtype {
        // BF16 also for the pairs of `PackLayout::Bf16Pairs16` weights (the call knows the type,
        // not the layout): every row's activations as bf16 pairs.
        DType::BF16 => (scratch_slots(m) * panel_cols(k) * k * 4)
            .max(crate::bf16dot::pairs_scratch_bytes(m, k)),
        DType::F32 | DType::F16 => scratch_slots(m) * panel_cols(k) * k * 4,
        d if d.is_quantized() => {
            let (acts, panel) = quant_scratch_layout(d, m, k);
            acts + panel
        }
        other => panic!("linear_scratch_bytes: weights of type {other:?} are not supported"),
    }
}

/// How [`linear_scratch_bytes`] lays out the scratch of quantized weights: `(activation
/// region, panel region)` in bytes. The activations come first, the region rounded up to 64
/// bytes: `m` rows of `quant::activation_row_bytes(w_dtype, k)` (what the generic kernel
/// writes), or for the 32-element block types `m` rows of `k / 32` blocks of
/// [`QUANT_ACT_BLOCK_BYTES`] if that is more (room for the SIMD twins' widened blocks); the
/// repacked panel ([`quant_panel_bytes`], 32-element block types only; 0 otherwise) follows.
pub fn quant_scratch_layout(w_dtype: DType, m: usize, k: usize) -> (usize, usize) {
    let ggml = quant::activation_row_bytes(w_dtype, k);
    let (row, panel) = if w_dtype.block_size() == 32 {
        (
            ggml.max(k / 32 * QUANT_ACT_BLOCK_BYTES),
            quant_panel_bytes(k),
        )
    } else {
        (ggml, 0)
    };
    ((m * row).next_multiple_of(64), panel)
}

/// Bytes per 32-element activation block that a SIMD twin of the 32-element block types may use
/// in the activation region of [`quant_scratch_layout`]: the block's scale and sum widened to
/// f32, then its 32 quants (the x86 VNNI kernel's layout: a scale is then one broadcast load).
pub const QUANT_ACT_BLOCK_BYTES: usize = 40;

/// Bytes of one repacked panel of [`quant_panel_cols`]`(k)` weight columns of `k` elements
/// (`k / 32` blocks of [`QUANT_PANEL_BLOCK_BYTES`] per column).
pub fn quant_panel_bytes(k: usize) -> usize {
    quant_panel_cols(k) * (k / 32) * QUANT_PANEL_BLOCK_BYTES
}

/// `generic_linear_f32`: `out[i, j] = Σ_c x[i, c] · w[j, c] + bias[j]` (torch `nn.Linear`).
///
/// Shapes: `x` `[m, k]` f32, `w` `[n, k]` (torch `Linear.weight`) of type `F32`, `F16`, `BF16`
/// or any ggml block type, `bias` `[n]`, `out` `[m, n]`. `scratch` holds at least
/// [`linear_scratch_bytes`]`(w.dtype, m, k)` bytes and is 4-byte aligned.
///
/// Plain types accumulate in f32 in the order of the crate's GEMM driver: one accumulator per
/// output element from `0.0`, one fused multiply-add per input feature in increasing index,
/// then the bias. Quantized weights follow ggml's
/// `ggml_compute_forward_mul_mat` (ggml-cpu.c): each activation row is quantized once to the
/// weight type's `vec_dot_type`, then every output element is one `quant::vec_dot`; the weight
/// matrix is never dequantized. Results are identical for any thread count.
///
/// `epilogue` (a fused element-wise op, e.g. [`crate::gelu_tanh_in_place`]) is applied to every
/// output element after its bias, with the bits of the op run on its own: the GEMM driver
/// applies it to each block of outputs as it finishes them (in cache), the other paths to each
/// row once the row is written ([`finish_rows`]).
///
/// Panics (once per call, with a message) when a length does not match the shapes, when `k` is
/// not a whole number of blocks, or when `F32` weights are not 4-byte aligned.
#[allow(clippy::too_many_arguments)]
pub fn linear(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
    epilogue: Option<EpilogueFn>,
) {
    let wrow = contract::linear(x, w, bias, out, m, k, n, scratch.len());
    if m == 0 || n == 0 {
        return;
    }
    match w.dtype {
        DType::BF16 if w.layout == PackLayout::Bf16Pairs16 => {
            crate::bf16dot::linear_pairs(x, w, bias, out, m, k, n, scratch);
            finish_rows(out, n, epilogue);
        }
        DType::F32 | DType::F16 | DType::BF16 => plain(
            &GENERIC_TILE,
            x,
            w,
            wrow,
            bias,
            out,
            m,
            k,
            n,
            scratch,
            epilogue,
        ),
        d if d.is_quantized() => linear_quant(x, w, wrow, bias, out, m, k, n, scratch, epilogue),
        other => panic!("linear: weights of type {other:?} are not supported"),
    }
}

/// Applies `epilogue` to every row of `out` (`[m, n]`), rows in parallel: the epilogue of the
/// kernels that do not apply it while their blocks are in cache (same bits: it is element-wise).
pub fn finish_rows(out: &mut [f32], n: usize, epilogue: Option<EpilogueFn>) {
    if let Some(e) = epilogue {
        out.par_chunks_mut(n.max(1)).for_each(e);
    }
}

/// [`linear`] for `F32`, `F16` and `BF16` weights with the f32 register tile `tile` (the
/// blocked GEMM driver that every ISA shares; the SIMD crates pass their own [`F32Tile`]).
/// Same shapes, scratch, checks and bits as [`linear`] for any tile that honours the
/// [`F32Tile`] contract.
///
/// Panics as [`linear`] does, and for a quantized weight type.
#[allow(clippy::too_many_arguments)]
pub fn linear_plain(
    tile: &F32Tile,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
    epilogue: Option<EpilogueFn>,
) {
    let wrow = contract::linear(x, w, bias, out, m, k, n, scratch.len());
    assert!(
        matches!(w.dtype, DType::F32 | DType::F16 | DType::BF16)
            && w.layout == PackLayout::RowMajor,
        "linear_plain: {:?} weights in {:?} are not row-major F32, F16 or BF16",
        w.dtype,
        w.layout
    );
    if m == 0 || n == 0 {
        return;
    }
    plain(tile, x, w, wrow, bias, out, m, k, n, scratch, epilogue);
}

/// `F32`/`F16`/`BF16`: packs [`panel_cols`] weight rows at a time into the tile's panels in
/// `scratch` (converted exactly to f32), then runs the GEMM driver on them.
#[allow(clippy::too_many_arguments)]
fn plain(
    tile: &F32Tile,
    x: &[f32],
    w: WeightRef<'_>,
    wrow: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
    epilogue: Option<EpilogueFn>,
) {
    if w.dtype == DType::F32 {
        // F32 weights are viewed in place everywhere else: keep their alignment contract.
        f32_view(w.bytes, "linear weight (F32)");
    }
    let tc = tile.cols;
    // The widest column task the scratch allows ([`panel_cols`]) whose tasks still share evenly
    // over the pool (`column_tasks`), narrower ones otherwise.
    let threads = rayon::current_num_threads();
    let task = (1..=panel_cols(k) / MAX_TILE_COLS).rev().find_map(|p| {
        let cols = p * MAX_TILE_COLS;
        let slots = (scratch.len() / (cols * k * 4).max(1)).min(PANEL_SLOTS);
        column_tasks(m, n.div_ceil(cols), slots, threads).then_some((cols, slots))
    });
    if let (true, Some((task_cols, slots))) = (k > 0, task) {
        // Column tasks (`gemm_column_tasks`): each packs its own `task_cols` weight rows. The
        // PixArt-Σ F16 linears of a 512² NFE: 7.31–7.64 → 6.48–6.68 s per 2 NFE, 2 threads.
        let slots = f32_view_mut(&mut scratch[..slots * task_cols * k * 4], "linear scratch");
        let fill = |j0: usize, nb: usize, panels: &mut [f32]| {
            for (p, dst) in panels.chunks_mut(k * tc).enumerate() {
                let valid = nb.saturating_sub(p * tc).min(tc);
                for (ci, chunk) in dst.chunks_mut(PACK_FEATURES * tc).enumerate() {
                    pack_features(tile, w, wrow, j0 + p * tc, valid, ci, chunk);
                }
            }
        };
        let bias_for =
            |j0: usize, nb: usize| bias.map_or(Bias::None, |b| Bias::PerCol(&b[j0..j0 + nb]));
        return gemm_column_tasks(
            tile, x, m, k, n, task_cols, slots, fill, bias_for, epilogue, out,
        );
    }
    let task_cols = panel_cols(k);
    let panel = f32_view_mut(&mut scratch[..task_cols * k * 4], "linear scratch");
    for j0 in (0..n).step_by(task_cols) {
        let nb = task_cols.min(n - j0);
        let np = nb.div_ceil(tc);
        let panels = &mut panel[..np * k * tc];
        if k > 0 {
            for (p, dst) in panels.chunks_mut(k * tc).enumerate() {
                let valid = nb.saturating_sub(p * tc).min(tc);
                dst.par_chunks_mut(PACK_FEATURES * tc)
                    .enumerate()
                    .for_each(|(ci, chunk)| {
                        pack_features(tile, w, wrow, j0 + p * tc, valid, ci, chunk)
                    });
            }
        }
        let b = bias.map_or(Bias::None, |b| Bias::PerCol(&b[j0..j0 + nb]));
        gemm(tile, x, m, k, panels, nb, j0, n, b, epilogue, out);
    }
}

/// Packs chunk `ci` of [`PACK_FEATURES`] input features (as many as `chunk` holds rows of
/// `tile.cols`) of weight rows `col0 .. col0 + valid` into `chunk` with the tile's packer.
fn pack_features(
    tile: &F32Tile,
    w: WeightRef<'_>,
    wrow: usize,
    col0: usize,
    valid: usize,
    ci: usize,
    chunk: &mut [f32],
) {
    let tc = tile.cols;
    let kc = chunk.len() / tc;
    (tile.pack)(w, wrow, col0, valid, ci * PACK_FEATURES, kc, tc, chunk);
}

/// Columns of one output row per task in the quantized path.
const QUANT_COLS: usize = 64;

/// Quantized weights: ggml's vec_dot path (activations quantized by
/// [`quant::quantize_activation_row_for`]: 7-bit for [`PackLayout::Interleaved8x4A7`]).
#[allow(clippy::too_many_arguments)]
fn linear_quant(
    x: &[f32],
    w: WeightRef<'_>,
    wrow: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
    epilogue: Option<EpilogueFn>,
) {
    let arow = quant::activation_row_bytes(w.dtype, k);
    let acts = &mut scratch[..m * arow];
    if k == 0 || arow == 0 {
        for row in out.chunks_mut(n) {
            for (j, o) in row.iter_mut().enumerate() {
                *o = bias.map_or(0.0, |b| b[j]);
            }
        }
        return finish_rows(out, n, epilogue);
    }
    acts.par_chunks_mut(arow)
        .zip(x.par_chunks(k))
        .for_each(|(dst, src)| quant::quantize_activation_row_for(&w, src, dst));
    let acts = &*acts;
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let act = &acts[i * arow..(i + 1) * arow];
        row.par_chunks_mut(QUANT_COLS)
            .enumerate()
            .for_each(|(cb, cols)| {
                let packed = w.layout != PackLayout::RowMajor;
                let mut row = vec![0u8; if packed { wrow } else { 0 }];
                for (c, o) in cols.iter_mut().enumerate() {
                    let j = cb * QUANT_COLS + c;
                    let s = if packed {
                        vec_dot_packed(w, n, k, j, act, &mut row)
                    } else {
                        quant::vec_dot(w.dtype, k, &w.bytes[j * wrow..(j + 1) * wrow], act)
                    };
                    *o = match bias {
                        Some(b) => s + b[j],
                        None => s,
                    };
                }
                if let Some(e) = epilogue {
                    e(cols);
                }
            });
    });
}

/// `quant::vec_dot` of weight row `j` of a repacked `[n, k]` matrix (`Q8_0`/`Q4_0`, activation
/// row `act` in `Q8_0`): the row's blocks are gathered with [`pack::read_block`] into `row` (the
/// row-major row's `k / 32` blocks) and that row is dotted, so the sum is accumulated exactly
/// as for [`PackLayout::RowMajor`]: bit-identical.
fn vec_dot_packed(
    w: WeightRef<'_>,
    n: usize,
    k: usize,
    j: usize,
    act: &[u8],
    row: &mut [u8],
) -> f32 {
    let bb = w.dtype.bytes_for(32).unwrap_or(0) as usize;
    for (b, block) in row.chunks_exact_mut(bb).enumerate() {
        pack::read_block(w.dtype, w.layout, w.bytes, n, k, j, b, block);
    }
    quant::vec_dot(w.dtype, k, row, act)
}
