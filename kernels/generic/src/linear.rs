//! `generic_linear_f32`: `out = x · wᵀ + bias` for every weight storage type.

use edge_schema::DType;
use rayon::prelude::*;

use edge_schema::plan::PackLayout;

use crate::gemm::{gemm_nt, Bias};
use crate::weights::{convert_row, f32_view, f32_view_mut, WeightRef};
use crate::{contract, pack, quant};

/// Weight rows converted to f32 at a time for `F16`/`BF16` weights.
const PANEL: usize = 64;

/// Scratch bytes [`linear`] needs for weights of type `w_dtype`, `m` activation rows and `k`
/// input features: 0 for `F32`; `64·k·4` for `F16`/`BF16` (a panel of 64 weight rows converted
/// to f32); `m · quant::activation_row_bytes(w_dtype, k)` for quantized types (each activation
/// row quantized once, ggml's `vec_dot_type`).
pub fn linear_scratch_bytes(w_dtype: DType, m: usize, k: usize) -> usize {
    match w_dtype {
        DType::F32 => 0,
        DType::F16 | DType::BF16 => PANEL * k * 4,
        d if d.is_quantized() => m * quant::activation_row_bytes(d, k),
        other => panic!("linear_scratch_bytes: weights of type {other:?} are not supported"),
    }
}

/// `generic_linear_f32`: `out[i, j] = Σ_c x[i, c] · w[j, c] + bias[j]` (torch `nn.Linear`).
///
/// Shapes: `x` `[m, k]` f32, `w` `[n, k]` (torch `Linear.weight`) of type `F32`, `F16`, `BF16`
/// or any ggml block type, `bias` `[n]`, `out` `[m, n]`. `scratch` holds at least
/// [`linear_scratch_bytes`]`(w.dtype, m, k)` bytes and is 4-byte aligned.
///
/// Plain types accumulate in f32 in the fixed order of the crate's dot tile (eight lane sums,
/// pairwise lane reduction, sequential tail, then the bias). Quantized weights follow ggml's
/// `ggml_compute_forward_mul_mat` (ggml-cpu.c): each activation row is quantized once to the
/// weight type's `vec_dot_type`, then every output element is one `quant::vec_dot`; the weight
/// matrix is never dequantized. Results are identical for any thread count.
///
/// Panics (once per call, with a message) when a length does not match the shapes, when `k` is
/// not a whole number of blocks, or when `F32` weights are not 4-byte aligned.
pub fn linear(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    let wrow = contract::linear(x, w, bias, out, m, k, n, scratch.len());
    if m == 0 || n == 0 {
        return;
    }
    match w.dtype {
        DType::F32 => {
            let wf = f32_view(w.bytes, "linear weight (F32)");
            let b = bias.map_or(Bias::None, Bias::PerCol);
            gemm_nt(x, m, k, wf, n, 0, n, b, out);
        }
        DType::F16 | DType::BF16 => linear_panels(x, w, wrow, bias, out, m, k, n, scratch),
        d if d.is_quantized() => linear_quant(x, w, wrow, bias, out, m, k, n, scratch),
        other => panic!("linear: weights of type {other:?} are not supported"),
    }
}

/// F16/BF16: converts `PANEL` weight rows at a time to f32 in `scratch`, then runs the f32 tile.
fn linear_panels(
    x: &[f32],
    w: WeightRef<'_>,
    wrow: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    let panel = f32_view_mut(&mut scratch[..PANEL * k * 4], "linear scratch");
    for j0 in (0..n).step_by(PANEL) {
        let nb = PANEL.min(n - j0);
        let wp = &mut panel[..nb * k];
        if k > 0 {
            wp.par_chunks_mut(k).enumerate().for_each(|(r, dst)| {
                let src = &w.bytes[(j0 + r) * wrow..(j0 + r + 1) * wrow];
                convert_row(w.dtype, src, dst);
            });
        }
        let b = bias.map_or(Bias::None, |b| Bias::PerCol(&b[j0..j0 + nb]));
        gemm_nt(x, m, k, wp, nb, j0, n, b, out);
    }
}

/// Columns of one output row per task in the quantized path.
const QUANT_COLS: usize = 64;

/// Quantized weights: ggml's vec_dot path.
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
) {
    let arow = quant::activation_row_bytes(w.dtype, k);
    let acts = &mut scratch[..m * arow];
    if k == 0 || arow == 0 {
        for row in out.chunks_mut(n) {
            for (j, o) in row.iter_mut().enumerate() {
                *o = bias.map_or(0.0, |b| b[j]);
            }
        }
        return;
    }
    acts.par_chunks_mut(arow)
        .zip(x.par_chunks(k))
        .for_each(|(dst, src)| quant::quantize_activation_row(w.dtype, src, dst));
    let acts = &*acts;
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let act = &acts[i * arow..(i + 1) * arow];
        row.par_chunks_mut(QUANT_COLS)
            .enumerate()
            .for_each(|(cb, cols)| {
                for (c, o) in cols.iter_mut().enumerate() {
                    let j = cb * QUANT_COLS + c;
                    let s = match w.layout {
                        PackLayout::RowMajor => {
                            quant::vec_dot(w.dtype, k, &w.bytes[j * wrow..(j + 1) * wrow], act)
                        }
                        _ => vec_dot_packed(w, n, k, j, act),
                    };
                    *o = match bias {
                        Some(b) => s + b[j],
                        None => s,
                    };
                }
            });
    });
}

/// `quant::vec_dot` of weight row `j` of a repacked `[n, k]` matrix (`Q8_0`/`Q4_0`, activation
/// row `act` in `Q8_0`): the row's blocks are gathered one at a time with [`pack::read_block`]
/// and dotted in block order, so the sum is accumulated exactly as for the row-major row
/// (`sumf += term` per block, starting from 0): bit-identical to [`PackLayout::RowMajor`].
fn vec_dot_packed(w: WeightRef<'_>, n: usize, k: usize, j: usize, act: &[u8]) -> f32 {
    let ab = quant::activation_row_bytes(w.dtype, 32);
    let bb = w.dtype.bytes_for(32).unwrap_or(0) as usize;
    let mut block = [0u8; pack::MAX_BLOCK_BYTES];
    let mut sumf = 0f32;
    for b in 0..k / 32 {
        pack::read_block(w.dtype, w.layout, w.bytes, n, k, j, b, &mut block[..bb]);
        sumf += quant::vec_dot(w.dtype, 32, &block[..bb], &act[b * ab..(b + 1) * ab]);
    }
    sumf
}
