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
//! **Blocking.** The caller packs the weight columns transposed into panels of `tile.cols`
//! (`panel[t·cols + c] = w[j0 + c, t]`, [`crate::linear`] [`crate::panel_cols`] at a time into its
//! scratch, [`crate::conv2d`] in its im2col), so the tile reads `cols` consecutive floats per
//! feature. From 8 rows on, when the pool has at most [`PANEL_SLOTS`] threads, the callers run
//! **column tasks** ([`gemm_column_tasks`]): each task packs the next block of columns into its
//! own scratch slot and runs every row over it, so a panel never leaves its core's caches and
//! a call forks once. Otherwise ([`gemm`]) all threads pack one shared panel, then the output
//! is split into row blocks (one task each) or, for fewer than 8 rows, column blocks. Inside a
//! task the driver walks blocks of [`KC`] input features and, in each, the panels, the running
//! sums of the task's rows held in a buffer on its stack.

use std::sync::Mutex;

use rayon::prelude::*;

use crate::table::EpilogueFn;

/// Input features per cache block of the generic, NEON and AVX-512 tiles ([`F32Tile::kc`]): a
/// packed panel block is `KC · cols` f32 (at most 32 KiB, so that it stays in a 48 KiB L1 data
/// cache while a task's row tiles pass over it; 256 measured 9–18 % slower on the VAE
/// convolutions and the f32 linear of `kbench` with the AVX-512 tile's 64 columns, 64 no
/// faster).
pub const KC: usize = 128;
/// Largest number of rows of `x` a [`F32Tile`] may declare.
pub const MAX_TILE_ROWS: usize = 8;
/// Most rows of `x` in one [`F32Tile::run`] call: the driver's row blocks of 8 register tiles.
pub const MAX_BLOCK_ROWS: usize = 8 * MAX_TILE_ROWS;
/// Largest number of output columns a [`F32Tile`] may declare; `cols` must divide it.
pub const MAX_TILE_COLS: usize = 64;

/// [`F32Tile::run`]'s signature: `(xs, panel, kc, acc, ld)`.
pub type TileFn = fn(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32], ld: usize);

/// [`F32Tile::pack`]'s signature: `(w, wrow, j0, valid, t0, kc, cols, dst)` packs features
/// `t0 .. t0 + kc` of weight rows (output columns) `j0 .. j0 + cols` of the row-major `w`
/// (`F32`, `F16` or `BF16`, rows of `wrow` bytes), converted exactly to f32, into
/// `dst[t·cols + c]` (`dst.len() == kc · cols`); columns `c ≥ valid` are zeros. Conversions
/// are exact, so every implementation writes the same bits as [`pack_panel`].
pub type PackFn = fn(
    w: crate::WeightRef<'_>,
    wrow: usize,
    j0: usize,
    valid: usize,
    t0: usize,
    kc: usize,
    cols: usize,
    dst: &mut [f32],
);

/// The portable [`PackFn`]: each column's features converted
/// (`crate::weights::convert_row`), then written `cols` apart.
#[allow(clippy::too_many_arguments)]
pub fn pack_panel(
    w: crate::WeightRef<'_>,
    wrow: usize,
    j0: usize,
    valid: usize,
    t0: usize,
    kc: usize,
    cols: usize,
    dst: &mut [f32],
) {
    assert!(dst.len() == kc * cols && kc <= PACK_FEATURES && valid <= cols);
    let esz = w.dtype.bytes_for(1).unwrap_or(4) as usize;
    let mut row = [0f32; PACK_FEATURES];
    for c in 0..cols {
        if c < valid {
            let src = &w.bytes[(j0 + c) * wrow + t0 * esz..][..kc * esz];
            crate::weights::convert_row(w.dtype, src, &mut row[..kc]);
            for (t, &v) in row[..kc].iter().enumerate() {
                dst[t * cols + c] = v;
            }
        } else {
            for t in 0..kc {
                dst[t * cols + c] = 0.0;
            }
        }
    }
}

/// Input features per packing task of the f32 `linear` (at most what one [`PackFn`] call
/// packs).
pub const PACK_FEATURES: usize = 256;

/// A register-tile microkernel of the blocked f32 GEMM driver: the only per-ISA part of the f32
/// `linear` and `conv2d` kernels.
///
/// `run(xs, panel, kc, acc, ld)` gets a block of `xs.len()` rows of `x` (1 to [`MAX_BLOCK_ROWS`]),
/// each starting at the block's first feature and at least `kc` f32 long (the driver passes each
/// row to its end, so a tile may prefetch the next feature block's head past `kc`: reads only),
/// a packed panel of `kc × cols` f32 (`panel[t·cols + c]` is output column `c`'s weight for
/// feature `t`), and the block's accumulators `acc[r·ld + c]` (`r < xs.len()`, `c < cols`,
/// `ld ≥ cols`; read and written). For every `r`, `c` and `t = 0..kc` in increasing order it must
/// compute `acc[r·ld + c] = fma(xs[r][t], panel[t·cols + c], acc[r·ld + c])` with one rounding
/// (module doc): a SIMD tile keeps each column in a lane, so the bits are the generic tile's for
/// any `rows × cols` (tested for every twin). A SIMD tile walks the block in register tiles of
/// `rows` ([`F32Tile::each_row_tile`]) inside the call, so the driver pays one indirect call, one
/// argument check and one slice setup per panel block, not per register tile (those took 6–8 %
/// of the AVX2 `linear f16` samples when the driver called once per register tile:
/// BENCHMARKS.md, "row blocks in the tile").
#[derive(Clone, Copy, Debug)]
pub struct F32Tile {
    /// Name for logs, `{isa}_{dtype}_{rows}x{cols}`.
    pub name: &'static str,
    /// Rows of `x` per register tile, `1..=MAX_TILE_ROWS`.
    pub rows: usize,
    /// Output columns per tile; divides [`MAX_TILE_COLS`].
    pub cols: usize,
    /// The microkernel.
    pub run: TileFn,
    /// Packs weight columns into this tile's panels ([`pack_panel`] or a SIMD twin).
    pub pack: PackFn,
    /// Whether the register tile also takes `2 .. rows` rows: the rows left after a block's
    /// whole register tiles then go in one pass instead of one at a time (a one-row tile has
    /// few independent accumulators; same bits either way). See [`F32Tile::each_row_tile`].
    pub any_rows: bool,
    /// Input features per cache block, the `kc` of each [`F32Tile::run`] call (at least 1):
    /// [`KC`], or more for a narrow tile whose `kc · cols` panel block stays small (each call
    /// loads and stores its accumulators, so longer calls cost less per feature). Any value
    /// gives the same bits: a partial sum passes through memory exactly.
    pub kc: usize,
}

impl F32Tile {
    /// Asserts what [`F32Tile::run`] may rely on: 1 to [`MAX_BLOCK_ROWS`] rows in `xs`, each
    /// holding `kc` f32 or more, a panel of `kc · cols`, `ld ≥ cols` and `acc` the
    /// `(xs.len() − 1)·ld + cols` elements it writes. SIMD tiles call it before their unchecked
    /// loads.
    pub fn check_args(&self, xs: &[&[f32]], panel: &[f32], kc: usize, acc: &[f32], ld: usize) {
        let c = self.cols;
        assert!(
            (1..=MAX_BLOCK_ROWS).contains(&xs.len())
                && ld >= c
                && acc.len() >= (xs.len() - 1) * ld + c,
            "{}: {} rows, ld {ld}, {} accumulators",
            self.name,
            xs.len(),
            acc.len()
        );
        assert!(panel.len() >= kc * c && xs.iter().all(|s| s.len() >= kc));
    }

    /// Calls `f(r0, nr)` for the register tiles of a block of `n` rows, in row order: whole
    /// tiles of `rows`, then the rest in one tile of `n mod rows` rows ([`F32Tile::any_rows`])
    /// or in tiles of one row.
    #[inline(always)]
    pub fn each_row_tile(&self, n: usize, mut f: impl FnMut(usize, usize)) {
        let mut r0 = 0;
        while r0 < n {
            let nr = if n - r0 >= self.rows {
                self.rows
            } else if self.any_rows {
                n - r0
            } else {
                1
            };
            f(r0, nr);
            r0 += nr;
        }
    }

    fn check(&self) {
        assert!(
            (1..=MAX_TILE_ROWS).contains(&self.rows)
                && self.cols >= 1
                && MAX_TILE_COLS.is_multiple_of(self.cols)
                && self.kc >= 1,
            "gemm: tile {} is {}x{} with blocks of {} features: rows must be 1..={MAX_TILE_ROWS}, \
             cols divide {MAX_TILE_COLS} and blocks hold a feature or more",
            self.name,
            self.rows,
            self.cols,
            self.kc
        );
    }
}

/// The portable tile: 4 rows × 16 columns, `f32::mul_add` per element.
pub const GENERIC_TILE: F32Tile = F32Tile {
    name: "generic_f32_4x16",
    rows: 4,
    cols: 16,
    run: generic_tile,
    pack: pack_panel,
    any_rows: false,
    kc: KC,
};

fn generic_tile(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32], ld: usize) {
    const C: usize = 16;
    assert!(panel.len() >= kc * C && ld >= C && acc.len() >= (xs.len() - 1) * ld + C);
    for (r, x) in xs.iter().enumerate() {
        let a = &mut acc[r * ld..r * ld + C];
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
    /// `dst[c] = sums[c] + bias` for output row `i` and columns `jj = c0 + c` (`sums` and `dst`
    /// of one length): the driver's last step, one ordinary addition per element, the `match`
    /// outside the element loops so that they vectorize.
    #[inline(always)]
    fn write_row(&self, sums: &[f32], i: usize, c0: usize, dst: &mut [f32]) {
        match self {
            Bias::None => dst.copy_from_slice(sums),
            Bias::PerCol(b) => {
                for ((o, &s), &bj) in dst.iter_mut().zip(sums).zip(&b[c0..c0 + sums.len()]) {
                    *o = s + bj;
                }
            }
            Bias::PerRow(b) => {
                let bi = b[i];
                for (o, &s) in dst.iter_mut().zip(sums) {
                    *o = s + bi;
                }
            }
        }
    }
}

/// Rows of `out` per task in the row-parallel path (a function of `m` and the tile only).
fn row_block(m: usize, rows: usize) -> usize {
    m.div_ceil(16).next_multiple_of(rows).clamp(rows, 8 * rows)
}

/// Output columns per block of the driver (one task's panels; the few-rows path's task).
pub(crate) const COL_BLOCK: usize = MAX_TILE_COLS;

/// `out[i, j0 + jj] = dot(x[i, ..], w[jj, ..]) + bias` for `i < m`, `jj < nb`, with `tile`, in
/// the order of the module doc.
///
/// `x` is `[m, k]`; the `nb` weight columns come packed: `nb.div_ceil(tile.cols)` panels of
/// `k × cols` f32 (panel `p`, feature `t`, column `c` at `(p·k + t)·cols + c`; lanes past `nb`
/// are read but their sums are dropped). `out` is `[m, n]` and only columns `j0..j0 + nb` are
/// written. Parallel over row blocks of `out`, or over column blocks when `m < 8`; the split
/// depends on the shapes only. `epilogue` (a fused element-wise op) runs in place on each
/// output row's block of at most [`COL_BLOCK`] columns once its sums and bias are written,
/// while they are in cache.
pub(crate) fn gemm(
    tile: &F32Tile,
    x: &[f32],
    m: usize,
    k: usize,
    panels: &[f32],
    nb: usize,
    j0: usize,
    n: usize,
    bias: Bias<'_>,
    epilogue: Option<EpilogueFn>,
    out: &mut [f32],
) {
    tile.check();
    debug_assert!(x.len() >= m * k && out.len() >= m * n && j0 + nb <= n);
    if m == 0 || nb == 0 {
        return;
    }
    assert!(
        panels.len() >= nb.div_ceil(tile.cols) * k * tile.cols,
        "gemm: packed panels too short"
    );
    let out = &mut out[..m * n];
    if m < 8 {
        // Few rows: each row on its own, tasks over its column blocks.
        for (i, row) in out.chunks_mut(n).enumerate() {
            row[j0..j0 + nb]
                .par_chunks_mut(COL_BLOCK)
                .enumerate()
                .for_each(|(cb, cols)| {
                    let c0 = cb * COL_BLOCK;
                    let mut res = [0f32; COL_BLOCK];
                    run_block(tile, x, i, 1, k, panels, c0, cols.len(), &mut res);
                    bias.write_row(&res[..cols.len()], i, c0, cols);
                    if let Some(e) = epilogue {
                        e(cols);
                    }
                });
        }
        return;
    }
    let rb = row_block(m, tile.rows);
    out.par_chunks_mut(rb * n)
        .enumerate()
        .for_each(|(b, rows_out)| {
            let mut rows: Vec<&mut [f32]> = rows_out
                .chunks_mut(n)
                .map(|r| &mut r[j0..j0 + nb])
                .collect();
            rows_into(tile, x, b * rb, k, panels, nb, bias, epilogue, &mut rows);
        });
}

/// Panel slots of a column-task scratch (`gemm_column_tasks`): at most this many tasks run at
/// once, so the split is used only when the pool has no more threads.
pub const PANEL_SLOTS: usize = 4;

/// Fewest rows of `x` for which the callers choose column tasks.
pub(crate) const COLUMN_TASK_ROWS: usize = 8;

/// Panels (or im2col tiles) a scratch holds for a product with `m` rows: one per column task
/// ([`PANEL_SLOTS`]) from [`COLUMN_TASK_ROWS`] rows on, else one.
pub(crate) fn scratch_slots(m: usize) -> usize {
    if m >= COLUMN_TASK_ROWS {
        PANEL_SLOTS
    } else {
        1
    }
}

/// Whether [`gemm_column_tasks`] suits `m` rows and `blocks` column blocks with `slots` scratch
/// slots on `threads` threads: at least [`COLUMN_TASK_ROWS`] rows, a slot for every thread
/// (and at least two), and enough blocks to share evenly (at least 4 per thread, or a multiple
/// of the thread count). Either choice gives the same bits; this only decides the speed.
pub(crate) fn column_tasks(m: usize, blocks: usize, slots: usize, threads: usize) -> bool {
    m >= COLUMN_TASK_ROWS
        && slots >= threads.max(2)
        && (blocks >= 4 * threads || (blocks >= threads && blocks.is_multiple_of(threads)))
}

/// `out[i, j] = dot(x[i, ..], column j) + bias` for all `i < m`, `j < n` (`out` `[m, n]`) by
/// column tasks: one task per slot of `slots` (each `block.div_ceil(tile.cols) · k · tile.cols`
/// f32) takes the next `block` columns not yet taken, has `fill(j0, nb, panels)` pack columns
/// `j0 .. j0 + nb` into its slot (the driver's panel layout, see [`gemm`]), and runs every row
/// over them; `bias_for(j0, nb)` gives their [`Bias`]. Each panel is then written and read by
/// one core, with one fork-join per call. (Packing one shared panel with every thread and then
/// splitting its rows moved each panel's lines between the cores' caches and cost two
/// fork-joins per panel: BENCHMARKS.md, "column tasks".) Same per-element sequence and bits as
/// [`gemm`] for any thread count and slot count; `epilogue` as in [`gemm`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_column_tasks<'b>(
    tile: &F32Tile,
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    block: usize,
    slots: &mut [f32],
    fill: impl Fn(usize, usize, &mut [f32]) + Sync,
    bias_for: impl Fn(usize, usize) -> Bias<'b> + Sync,
    epilogue: Option<EpilogueFn>,
    out: &mut [f32],
) {
    tile.check();
    let slot_len = block.div_ceil(tile.cols) * k * tile.cols;
    assert!(block > 0 && slot_len > 0 && slots.len() >= slot_len && x.len() >= m * k);
    assert!(out.len() == m * n, "gemm: output is not [m, n]");
    // The columns not yet taken, of every row; a task takes the next block's columns off the
    // front of each row under the lock (O(m) slice splits), then works without it.
    struct Untaken<'o> {
        j0: usize,
        rows: Vec<&'o mut [f32]>,
    }
    let untaken = Mutex::new(Untaken {
        j0: 0,
        rows: out.chunks_mut(n).collect(),
    });
    slots.par_chunks_exact_mut(slot_len).for_each(|slot| {
        let mut mine: Vec<&mut [f32]> = Vec::with_capacity(m);
        loop {
            let (j0, nb) = {
                let mut u = untaken.lock().unwrap_or_else(|e| e.into_inner());
                let j0 = u.j0;
                if j0 >= n {
                    break;
                }
                let nb = block.min(n - j0);
                u.j0 += nb;
                mine.clear();
                for row in u.rows.iter_mut() {
                    let (taken, rest) = std::mem::take(row).split_at_mut(nb);
                    *row = rest;
                    mine.push(taken);
                }
                (j0, nb)
            };
            let panels = &mut slot[..nb.div_ceil(tile.cols) * k * tile.cols];
            fill(j0, nb, panels);
            let bias = bias_for(j0, nb);
            rows_into(tile, x, 0, k, panels, nb, bias, epilogue, &mut mine);
        }
    });
}

/// `out_rows[r][jj] = epilogue(dot(x[i0 + r, ..], column jj) + bias)` for every
/// `r < out_rows.len()` and the `nb` columns of `panels` (`out_rows[r]` is row `i0 + r`'s slice
/// of them), on the calling thread: rows in blocks of `8 · tile.rows`, each block over the
/// panels in [`COL_BLOCK`]s. A row-split task of [`gemm`] is one such block; a column task, all
/// rows.
#[allow(clippy::too_many_arguments)]
fn rows_into(
    tile: &F32Tile,
    x: &[f32],
    i0: usize,
    k: usize,
    panels: &[f32],
    nb: usize,
    bias: Bias<'_>,
    epilogue: Option<EpilogueFn>,
    out_rows: &mut [&mut [f32]],
) {
    assert!(out_rows.iter().all(|r| r.len() == nb));
    assert!(
        panels.len() >= nb.div_ceil(tile.cols) * k * tile.cols,
        "gemm: packed panels too short"
    );
    let rb = 8 * tile.rows;
    let mut acc = [0f32; 8 * MAX_TILE_ROWS * COL_BLOCK];
    for (bi, block) in out_rows.chunks_mut(rb).enumerate() {
        let (b0, rows) = (i0 + bi * rb, block.len());
        for c0 in (0..nb).step_by(COL_BLOCK) {
            let cn = COL_BLOCK.min(nb - c0);
            let res = &mut acc[..rows * COL_BLOCK];
            res.fill(0.0);
            run_block(tile, x, b0, rows, k, panels, c0, cn, res);
            for (r, dst) in block.iter_mut().enumerate() {
                let sums = &res[r * COL_BLOCK..][..cn];
                let dst = &mut dst[c0..c0 + cn];
                bias.write_row(sums, b0 + r, c0, dst);
                if let Some(e) = epilogue {
                    e(dst);
                }
            }
        }
    }
}

/// Accumulates `res[r·COL_BLOCK + c] += dot(x[i0 + r], w[c0 + c])` (fused, in feature order, on
/// top of what `res` holds) for `r < rows` (at most [`MAX_BLOCK_ROWS`]), `c < cn` (`cn ≤
/// COL_BLOCK`, `c0` a multiple of it), reading the packed panels in place: one
/// [`F32Tile::run`] per feature block and panel (feature blocks outermost), with every row
/// from the block's first feature to its end.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_block(
    tile: &F32Tile,
    x: &[f32],
    i0: usize,
    rows: usize,
    k: usize,
    panels: &[f32],
    c0: usize,
    cn: usize,
    res: &mut [f32],
) {
    assert!(
        (1..=MAX_BLOCK_ROWS).contains(&rows) && x.len() >= (i0 + rows) * k,
        "gemm: a block of {rows} rows"
    );
    let tc = tile.cols;
    let mut xs: [&[f32]; MAX_BLOCK_ROWS] = [&[]; MAX_BLOCK_ROWS];
    // Feature blocks outermost: the rows' `kc`-feature slice is read by every panel while it
    // is in cache, instead of each panel streaming the rows' whole `k` (at k = 4608 the rows of
    // a block, 884 KiB, do not fit a 512 KiB L2). `linear f16`, m = 1024, the two orders
    // alternated call by call in one process (AVX2, KC 256, 2 threads): pair-ratio medians
    // 1.04–1.11 at k = 4608, 1.01–1.06 at k = 1152 (BENCHMARKS.md, "feature blocks outermost").
    for k0 in (0..k).step_by(tile.kc) {
        let kc = tile.kc.min(k - k0);
        for (r, xr) in xs[..rows].iter_mut().enumerate() {
            *xr = &x[(i0 + r) * k + k0..(i0 + r + 1) * k];
        }
        for p0 in (0..cn).step_by(tc) {
            let panel = &panels[(((c0 + p0) / tc) * k + k0) * tc..][..kc * tc];
            (tile.run)(&xs[..rows], panel, kc, &mut res[p0..], COL_BLOCK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_tasks_need_rows_slots_and_an_even_share() {
        // The PixArt-Σ linears and VAE convolutions on 2 threads take them.
        assert!(column_tasks(1024, 72, PANEL_SLOTS, 2));
        assert!(column_tasks(128, 1366, PANEL_SLOTS, 2));
        assert!(column_tasks(8, 2, PANEL_SLOTS, 1));
        // Too few rows, a slot short, more threads than slots, an uneven share.
        assert!(!column_tasks(7, 72, PANEL_SLOTS, 2));
        assert!(!column_tasks(1024, 72, 1, 1));
        assert!(!column_tasks(1024, 72, PANEL_SLOTS, PANEL_SLOTS + 1));
        assert!(!column_tasks(1024, 3, PANEL_SLOTS, 2));
        assert!(column_tasks(1024, 4, PANEL_SLOTS, 2));
    }

    /// Packs `w` (`[n, k]` row-major f32) columns `j0 .. j0 + nb` into the driver's panels.
    fn pack_cols(w: &[f32], k: usize, j0: usize, nb: usize, tc: usize, panels: &mut [f32]) {
        panels.fill(0.0);
        for c in 0..nb {
            for t in 0..k {
                panels[((c / tc) * k + t) * tc + c % tc] = w[(j0 + c) * k + t];
            }
        }
    }

    /// Column tasks give the row split's bits on ragged shapes, for any slot count and block.
    #[test]
    fn column_tasks_give_the_row_split_bits() {
        let mut s = 0x9E37_79B9u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        };
        let tile = GENERIC_TILE;
        let tc = tile.cols;
        for (m, k, n, block) in [
            (9usize, 300usize, 131usize, 64usize),
            (20, 129, 200, 48),
            (13, 17, 40, 16),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
            let bias: Vec<f32> = (0..n).map(|_| next()).collect();
            let mut all = vec![0f32; n.div_ceil(tc) * k * tc];
            pack_cols(&w, k, 0, n, tc, &mut all);
            let mut want = vec![0f32; m * n];
            gemm(
                &tile,
                &x,
                m,
                k,
                &all,
                n,
                0,
                n,
                Bias::PerCol(&bias),
                None,
                &mut want,
            );
            // The epilogue (a fused GELU) on each finished block: the bits of the op run on
            // its own after the product, on both paths and with any slot count.
            let fused: Vec<f32> = want.iter().map(|&v| crate::gelu_tanh_f32(v)).collect();
            let mut got = vec![f32::NAN; m * n];
            let epi: EpilogueFn = crate::gelu_tanh_in_place;
            gemm(
                &tile,
                &x,
                m,
                k,
                &all,
                n,
                0,
                n,
                Bias::PerCol(&bias),
                Some(epi),
                &mut got,
            );
            assert!(got
                .iter()
                .zip(&fused)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            for (slots, epilogue) in [
                (1, None),
                (2, None),
                (3, None),
                (1, Some(epi)),
                (2, Some(epi)),
            ] {
                let want = if epilogue.is_some() { &fused } else { &want };
                let slot_len = block.div_ceil(tc) * k * tc;
                let mut scratch = vec![0f32; slots * slot_len];
                let mut got = vec![f32::NAN; m * n];
                gemm_column_tasks(
                    &tile,
                    &x,
                    m,
                    k,
                    n,
                    block,
                    &mut scratch,
                    |j0, nb, panels| pack_cols(&w, k, j0, nb, tc, panels),
                    |j0, nb| Bias::PerCol(&bias[j0..j0 + nb]),
                    epilogue,
                    &mut got,
                );
                let same = got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                let fused = epilogue.is_some();
                assert!(
                    same,
                    "m={m} k={k} n={n} block={block} slots={slots} fused={fused}"
                );
            }
        }
    }
}
