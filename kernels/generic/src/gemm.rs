//! The blocked f32 GEMM driver behind [`crate::linear`] (`F32`, `F16`, `BF16` weights) and
//! [`crate::conv2d`], shared by every ISA: only the register tile ([`F32Tile`]) is per-ISA.
//!
//! **The order of every sum.** Each output element is one dot product with a single
//! accumulator that starts at `0.0` and takes one fused multiply-add per input feature in
//! increasing index, `acc = fma(x[t], w[t], acc)` for `t = 0, 1, …, k − 1` (one rounding per
//! step, IEEE 754 `fusedMultiplyAdd`, Rust's `f32::mul_add`), then the bias is added with one
//! ordinary addition. Nothing else touches the value, so the result does not depend on the
//! register tile, the cache blocking (partial sums pass through memory as f32, exactly), the
//! thread count or the ISA: a SIMD tile computes each output column in its own lane and gives
//! exactly these bits (NEON `fmla`, x86 `vfmadd`). This is the order of a textbook GEMM
//! microkernel (ggml's and BLIS's f32 kernels accumulate the same way along `k` per lane), so
//! it costs a SIMD twin nothing.
//!
//! **Blocking.** The driver splits the output into row blocks (one task each) or, for fewer
//! than 8 rows, column blocks; inside a task it walks panels of `tile.cols` output columns and
//! blocks of [`KC`] input features. The weight rows of a panel are packed transposed
//! (`panel[t·cols + c] = w[j0 + c, k0 + t]`) into a buffer on the task's stack, so the tile
//! reads `cols` consecutive floats per feature; callers that can lay out their operand that
//! way themselves (the im2col of [`crate::conv2d`]) pass whole packed panels instead.

use rayon::prelude::*;

/// Input features per cache block: a packed panel block is `KC · cols` f32 (at most 32 KiB).
pub const KC: usize = 128;
/// Largest number of rows of `x` a [`F32Tile`] may declare.
pub const MAX_TILE_ROWS: usize = 8;
/// Largest number of output columns a [`F32Tile`] may declare; `cols` must divide it.
pub const MAX_TILE_COLS: usize = 64;
/// Kept for callers of the previous interface: the largest tile side.
pub const MAX_TILE: usize = MAX_TILE_COLS;

/// [`F32Tile::run`]'s signature: `(xs, panel, kc, acc)`.
pub type TileFn = fn(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32]);

/// A register-tile microkernel of the blocked f32 GEMM driver: the only per-ISA part of the f32
/// `linear` and `conv2d` kernels.
///
/// `run(xs, panel, kc, acc)` gets `xs.len()` rows of `x` (either `rows` or 1), each at least
/// `kc` f32 (the driver passes them from the block's first feature), a packed panel of `kc × cols`
/// f32 (`panel[t·cols + c]` is output column `c`'s weight for feature `t`), and the tile's
/// accumulators `acc[r·cols + c]` (`xs.len() × cols`, read and written). For every `r`, `c` and
/// `t = 0..kc` in increasing order it must compute `acc[r·cols + c] = fma(xs[r][t], panel[t·cols +
/// c], acc[r·cols + c])` with one rounding (module doc): a SIMD tile keeps each column in a lane,
/// so the bits are the generic tile's for any `rows × cols` (tested for every twin).
#[derive(Clone, Copy, Debug)]
pub struct F32Tile {
    /// Name for logs, `{isa}_{dtype}_{rows}x{cols}`.
    pub name: &'static str,
    /// Rows of `x` per tile, `1..=MAX_TILE_ROWS`.
    pub rows: usize,
    /// Output columns per tile; divides [`MAX_TILE_COLS`].
    pub cols: usize,
    /// The microkernel.
    pub run: TileFn,
}

impl F32Tile {
    fn check(&self) {
        assert!(
            (1..=MAX_TILE_ROWS).contains(&self.rows)
                && self.cols >= 1
                && MAX_TILE_COLS.is_multiple_of(self.cols),
            "gemm: tile {} is {}x{}: rows must be 1..={MAX_TILE_ROWS} and cols divide {MAX_TILE_COLS}",
            self.name,
            self.rows,
            self.cols
        );
    }
}

/// The portable tile: 4 rows × 16 columns, `f32::mul_add` per element.
pub const GENERIC_TILE: F32Tile = F32Tile {
    name: "generic_f32_4x16",
    rows: 4,
    cols: 16,
    run: generic_tile,
};

fn generic_tile(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32]) {
    const C: usize = 16;
    assert!(panel.len() >= kc * C && acc.len() >= xs.len() * C);
    for (r, x) in xs.iter().enumerate() {
        let a = &mut acc[r * C..(r + 1) * C];
        for (t, &xv) in x[..kc].iter().enumerate() {
            let wt = &panel[t * C..(t + 1) * C];
            for (o, &wv) in a.iter_mut().zip(wt) {
                *o = xv.mul_add(wv, *o);
            }
        }
    }
}

/// Which bias is added to each output element.
#[derive(Clone, Copy)]
pub(crate) enum Bias<'a> {
    None,
    /// `bias[j]` for output column `j0 + jj`, indexed by `jj` (a slice of length `nb`).
    PerCol(&'a [f32]),
    /// `bias[i]` for output row `i` (length `m`).
    PerRow(&'a [f32]),
}

impl Bias<'_> {
    #[inline(always)]
    fn apply(&self, s: f32, i: usize, jj: usize) -> f32 {
        match self {
            Bias::None => s,
            Bias::PerCol(b) => s + b[jj],
            Bias::PerRow(b) => s + b[i],
        }
    }
}

/// Where the driver finds the `nb` weight columns.
#[derive(Clone, Copy)]
pub(crate) enum Operand<'a> {
    /// `[nb, k]` row-major rows (a torch `Linear.weight` or a block of it); packed per task.
    Rows(&'a [f32]),
    /// Already packed: `nb.div_ceil(cols)` panels of `k × cols` f32 (`panel p`, feature `t`,
    /// column `c` at `(p·k + t)·cols + c`), lanes past `nb` zero.
    Panels(&'a [f32]),
}

/// Rows of `out` per task in the row-parallel path (a function of `m` and the tile only).
fn row_block(m: usize, rows: usize) -> usize {
    m.div_ceil(16).next_multiple_of(rows).clamp(rows, 64)
}

/// Output columns per task in the column-parallel path used when `m` is small.
const COL_BLOCK: usize = MAX_TILE_COLS;

/// `out[i, j0 + jj] = dot(x[i, ..], w[jj, ..]) + bias` for `i < m`, `jj < nb`, with `tile`, in
/// the order of the module doc.
///
/// `x` is `[m, k]`, the weights `nb` columns of `k` ([`Operand`]), `out` is `[m, n]` and only
/// columns `j0..j0 + nb` are written. Parallel over row blocks of `out`, or over column blocks
/// when `m < 8`; the split depends on the shapes only.
pub(crate) fn gemm(
    tile: &F32Tile,
    x: &[f32],
    m: usize,
    k: usize,
    w: Operand<'_>,
    nb: usize,
    j0: usize,
    n: usize,
    bias: Bias<'_>,
    out: &mut [f32],
) {
    tile.check();
    debug_assert!(x.len() >= m * k && out.len() >= m * n && j0 + nb <= n);
    if m == 0 || nb == 0 {
        return;
    }
    match w {
        Operand::Rows(r) => assert!(r.len() >= nb * k, "gemm: weight rows too short"),
        Operand::Panels(p) => assert!(
            p.len() >= nb.div_ceil(tile.cols) * k * tile.cols,
            "gemm: packed panels too short"
        ),
    }
    let out = &mut out[..m * n];
    if m < 8 {
        // Few rows: each row on its own, tasks over its column blocks.
        for (i, row) in out.chunks_mut(n).enumerate() {
            row[j0..j0 + nb]
                .par_chunks_mut(COL_BLOCK)
                .enumerate()
                .for_each(|(cb, cols)| {
                    let c0 = cb * COL_BLOCK;
                    let cn = cols.len();
                    let mut res = [0f32; COL_BLOCK];
                    run_block(tile, x, i, 1, k, w, c0, cn, nb, &mut res[..cn], cn);
                    for (c, o) in cols.iter_mut().enumerate() {
                        *o = bias.apply(res[c], i, c0 + c);
                    }
                });
        }
        return;
    }
    let rb = row_block(m, tile.rows);
    out.par_chunks_mut(rb * n)
        .enumerate()
        .for_each(|(b, rows_out)| {
            let i0 = b * rb;
            let rows = rows_out.len() / n;
            let mut acc = [0f32; 64 * COL_BLOCK];
            for c0 in (0..nb).step_by(COL_BLOCK) {
                let cn = COL_BLOCK.min(nb - c0);
                let res = &mut acc[..rows * cn];
                res.fill(0.0);
                run_block(tile, x, i0, rows, k, w, c0, cn, nb, res, cn);
                for r in 0..rows {
                    let dst = &mut rows_out[r * n + j0 + c0..][..cn];
                    for (c, o) in dst.iter_mut().enumerate() {
                        *o = bias.apply(res[r * cn + c], i0 + r, c0 + c);
                    }
                }
            }
        });
}

/// Accumulates `res[r·ld + c] += dot(x[i0 + r], w[c0 + c])` (fused, in feature order, on top of
/// what `res` holds) for `r < rows`, `c < cn` (`cn ≤ COL_BLOCK`, `c0` a multiple of it).
fn run_block(
    tile: &F32Tile,
    x: &[f32],
    i0: usize,
    rows: usize,
    k: usize,
    w: Operand<'_>,
    c0: usize,
    cn: usize,
    nb: usize,
    res: &mut [f32],
    ld: usize,
) {
    let (tr, tc) = (tile.rows, tile.cols);
    let mut packed = [0f32; KC * MAX_TILE_COLS];
    let mut t = [0f32; MAX_TILE_ROWS * MAX_TILE_COLS];
    for p0 in (0..cn).step_by(tc) {
        let nc = tc.min(cn - p0);
        let col = c0 + p0;
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let panel: &[f32] = match w {
                Operand::Rows(wr) => {
                    let dst = &mut packed[..kc * tc];
                    for c in 0..tc {
                        if c < nc {
                            let src = &wr[(col + c) * k + k0..][..kc];
                            for (tt, &v) in src.iter().enumerate() {
                                dst[tt * tc + c] = v;
                            }
                        } else {
                            for tt in 0..kc {
                                dst[tt * tc + c] = 0.0;
                            }
                        }
                    }
                    dst
                }
                Operand::Panels(ps) => {
                    let p = col / tc;
                    debug_assert!(col.is_multiple_of(tc) && col < nb.next_multiple_of(tc));
                    &ps[(p * k + k0) * tc..][..kc * tc]
                }
            };
            let mut r0 = 0;
            while r0 < rows {
                let nr = if rows - r0 >= tr { tr } else { 1 };
                for r in 0..nr {
                    t[r * tc..r * tc + nc].copy_from_slice(&res[(r0 + r) * ld + p0..][..nc]);
                }
                let xs: [&[f32]; MAX_TILE_ROWS] =
                    std::array::from_fn(|r| &x[(i0 + r0 + r.min(nr - 1)) * k + k0..][..kc]);
                (tile.run)(&xs[..nr], panel, kc, &mut t[..nr * tc]);
                for r in 0..nr {
                    res[(r0 + r) * ld + p0..][..nc].copy_from_slice(&t[r * tc..r * tc + nc]);
                }
                r0 += nr;
            }
        }
    }
}
