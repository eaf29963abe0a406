//! Shared f32 dot-product tiles behind [`crate::linear`] and [`crate::conv2d`].
//!
//! Every output element is one dot product computed in a fixed order that does not depend on
//! the tile it is computed in nor on the thread that computes it: eight lane accumulators
//! `acc[l] += a[8c + l] * b[8c + l]` over the whole 8-element chunks in increasing `c`, a fixed
//! pairwise sum of the lanes `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`, then the tail
//! elements added one by one in increasing index, then the bias. Rust never contracts `a * b + c`
//! into a fused multiply-add, so the result is bit-identical for any tiling or thread count.

use rayon::prelude::*;

/// Lane accumulators per dot product.
pub(crate) const LANES: usize = 8;
/// Rows of `x` (output rows) in one register tile.
pub(crate) const TILE_R: usize = 4;
/// Rows of `w` (output columns) in one register tile.
pub(crate) const TILE_C: usize = 2;
/// Largest tile side, for the fixed-size tile buffer.
const TILE: usize = 4;

#[inline(always)]
fn reduce_lanes(a: &[f32; LANES]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

#[inline(always)]
fn lane_block(s: &[f32], base: usize) -> &[f32; LANES] {
    match <&[f32; LANES]>::try_from(&s[base..base + LANES]) {
        Ok(a) => a,
        Err(_) => unreachable!("a range of LANES elements converts to an array"),
    }
}

/// `out[r][c] = dot(xs[r][..k], ws[c][..k])` in the order described in the module doc.
#[inline(always)]
fn dot_tile<const R: usize, const C: usize>(
    xs: &[&[f32]; R],
    ws: &[&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    let full = k - k % LANES;
    let mut acc = [[[0.0f32; LANES]; C]; R];
    let mut base = 0;
    while base < full {
        let xv: [&[f32; LANES]; R] = std::array::from_fn(|r| lane_block(xs[r], base));
        let wv: [&[f32; LANES]; C] = std::array::from_fn(|c| lane_block(ws[c], base));
        for r in 0..R {
            for c in 0..C {
                for l in 0..LANES {
                    acc[r][c][l] += xv[r][l] * wv[c][l];
                }
            }
        }
        base += LANES;
    }
    let mut out = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut s = reduce_lanes(&acc[r][c]);
            for t in full..k {
                s += xs[r][t] * ws[c][t];
            }
            out[r][c] = s;
        }
    }
    out
}

/// Runs the `xs.len() × ws.len()` tile (each 1..=4) and stores it in `out[..r][..c]`.
fn tile_dyn(xs: &[&[f32]], ws: &[&[f32]], k: usize, out: &mut [[f32; TILE]; TILE]) {
    macro_rules! arm {
        ($r:literal, $c:literal) => {{
            let xa: [&[f32]; $r] = std::array::from_fn(|i| xs[i]);
            let wa: [&[f32]; $c] = std::array::from_fn(|i| ws[i]);
            let t = dot_tile::<$r, $c>(&xa, &wa, k);
            for r in 0..$r {
                out[r][..$c].copy_from_slice(&t[r]);
            }
        }};
    }
    match (xs.len(), ws.len()) {
        (4, 4) => arm!(4, 4),
        (4, 3) => arm!(4, 3),
        (4, 2) => arm!(4, 2),
        (4, 1) => arm!(4, 1),
        (3, 4) => arm!(3, 4),
        (3, 3) => arm!(3, 3),
        (3, 2) => arm!(3, 2),
        (3, 1) => arm!(3, 1),
        (2, 4) => arm!(2, 4),
        (2, 3) => arm!(2, 3),
        (2, 2) => arm!(2, 2),
        (2, 1) => arm!(2, 1),
        (1, 4) => arm!(1, 4),
        (1, 3) => arm!(1, 3),
        (1, 2) => arm!(1, 2),
        (1, 1) => arm!(1, 1),
        (r, c) => unreachable!("tile {r}x{c} outside 1..=4"),
    }
}

/// Largest register tile side a [`F32Tile`] may declare.
pub const MAX_TILE: usize = 8;

/// [`F32Tile::run`]'s signature: `(xs, ws, k, out)`.
pub type TileFn = fn(xs: &[&[f32]], ws: &[&[f32]], k: usize, out: &mut [f32]);

/// A register-tile microkernel of the blocked f32 GEMM driver behind `linear` (`F32`, `F16`,
/// `BF16` weights) and `conv2d`: the only per-ISA part of those kernels.
///
/// `run(xs, ws, k, out)` gets `rows` rows of `x` (or a single row, for matrix-vector shapes) and
/// `cols` rows of `w`, slices of exactly `k` f32 each (at a ragged edge the driver repeats the
/// last valid row, so a tile is otherwise full), and writes
/// `out[r · ws.len() + c] = dot(xs[r], ws[c])` for every `r < xs.len()`, `c < ws.len()`, where `dot` is the crate's fixed order: eight unfused lane sums
/// `acc[l] += x[8i + l] · w[8i + l]` over the whole 8-element chunks in increasing `i`, the
/// lanes reduced as `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`, then the `k mod 8` tail
/// added one product at a time in increasing index. Every implementation must give exactly these
/// bits (the SIMD twins are tested for it), so the tile shape never changes a result.
#[derive(Clone, Copy, Debug)]
pub struct F32Tile {
    /// Name for logs, `{isa}_{dtype}_{rows}x{cols}`.
    pub name: &'static str,
    /// Rows of `x` per tile, `1..=MAX_TILE`.
    pub rows: usize,
    /// Rows of `w` (output columns) per tile, `1..=MAX_TILE`.
    pub cols: usize,
    /// The microkernel.
    pub run: TileFn,
}

/// The portable tile: 4 rows of `x` × 2 rows of `w`, eight lanes in plain Rust.
pub const GENERIC_TILE: F32Tile = F32Tile {
    name: "generic_f32_4x2",
    rows: TILE_R,
    cols: TILE_C,
    run: generic_tile,
};

fn generic_tile(xs: &[&[f32]], ws: &[&[f32]], k: usize, out: &mut [f32]) {
    let mut t = [[0.0f32; TILE]; TILE];
    tile_dyn(xs, ws, k, &mut t);
    for r in 0..xs.len() {
        out[r * ws.len()..(r + 1) * ws.len()].copy_from_slice(&t[r][..ws.len()]);
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
    fn at(&self, i: usize, jj: usize) -> f32 {
        match self {
            Bias::None => 0.0,
            Bias::PerCol(b) => b[jj],
            Bias::PerRow(b) => b[i],
        }
    }

    #[inline(always)]
    fn apply(&self, s: f32, i: usize, jj: usize) -> f32 {
        match self {
            Bias::None => s,
            _ => s + self.at(i, jj),
        }
    }
}

/// Rows of `out` per task in the row-parallel path (a function of `m` only).
fn row_block(m: usize) -> usize {
    m.div_ceil(16).next_multiple_of(TILE_R).clamp(TILE_R, 64)
}

/// Columns per task in the column-parallel path used when `m` is small.
const COL_BLOCK: usize = 32;

/// `out[i, j0 + jj] = dot(x[i, ..], w[jj, ..]) + bias` for `i < m`, `jj < nb`, with `tile`.
///
/// `x` is `[m, k]`, `w` is `[nb, k]` (rows of a torch `Linear.weight`), `out` is `[m, n]` and
/// only columns `j0..j0 + nb` are written. Parallel over row blocks of `out`, or over column
/// blocks of each row when `m < 8`; the split depends on the shapes only.
pub(crate) fn gemm_nt(
    tile: &F32Tile,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    nb: usize,
    j0: usize,
    n: usize,
    bias: Bias<'_>,
    out: &mut [f32],
) {
    debug_assert!(x.len() >= m * k && w.len() >= nb * k && out.len() >= m * n);
    debug_assert!(j0 + nb <= n);
    let (tr, tc) = (tile.rows, tile.cols);
    assert!(
        (1..=MAX_TILE).contains(&tr) && (1..=MAX_TILE).contains(&tc),
        "gemm: tile {} is {tr}x{tc}, outside 1..={MAX_TILE}",
        tile.name
    );
    if m == 0 || nb == 0 {
        return;
    }
    let out = &mut out[..m * n];
    let wrow = |jj: usize| &w[jj.min(nb - 1) * k..][..k];
    if m < 8 {
        let col_block = COL_BLOCK.next_multiple_of(tc);
        out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            let xs = [&x[i * k..(i + 1) * k]];
            row[j0..j0 + nb]
                .par_chunks_mut(col_block)
                .enumerate()
                .for_each(|(cb, cols)| {
                    let mut t = [0.0f32; MAX_TILE * MAX_TILE];
                    for (jt, chunk) in cols.chunks_mut(tc).enumerate() {
                        let jj0 = cb * col_block + jt * tc;
                        let ws: [&[f32]; MAX_TILE] = std::array::from_fn(|c| wrow(jj0 + c));
                        (tile.run)(&xs, &ws[..tc], k, &mut t[..tc]);
                        for (c, o) in chunk.iter_mut().enumerate() {
                            *o = bias.apply(t[c], i, jj0 + c);
                        }
                    }
                });
        });
        return;
    }
    let rb = row_block(m).next_multiple_of(tr);
    out.par_chunks_mut(rb * n)
        .enumerate()
        .for_each(|(b, rows_out)| {
            let i0 = b * rb;
            let rows = rows_out.len() / n;
            let mut t = [0.0f32; MAX_TILE * MAX_TILE];
            for jj0 in (0..nb).step_by(tc) {
                let nc = tc.min(nb - jj0);
                let ws: [&[f32]; MAX_TILE] = std::array::from_fn(|c| wrow(jj0 + c));
                for r0 in (0..rows).step_by(tr) {
                    let nr = tr.min(rows - r0);
                    let xs: [&[f32]; MAX_TILE] = std::array::from_fn(|r| {
                        let i = i0 + (r0 + r).min(rows - 1);
                        &x[i * k..(i + 1) * k]
                    });
                    (tile.run)(&xs[..tr], &ws[..tc], k, &mut t[..tr * tc]);
                    for r in 0..nr {
                        let row = &mut rows_out[(r0 + r) * n + j0 + jj0..][..nc];
                        for (c, o) in row.iter_mut().enumerate() {
                            *o = bias.apply(t[r * tc + c], i0 + r0 + r, jj0 + c);
                        }
                    }
                }
            }
        });
}
