//! Winograd F(2×2, 3×3) for the 3×3 stride-1 convolutions of [`crate::conv2d`] (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016): 16 products per 2×2
//! output tile and channel pair instead of 36, so the VAE's convolutions do 2.25 times fewer
//! multiply-adds than the direct (im2col) form.
//!
//! **The arithmetic**, the same on every CPU target (the transforms are this file's scalar
//! code on every target; the products are the shared f32 GEMM driver's, whose tiles give the
//! generic bits). With `d` the 4×4 input patch of an output tile (zero outside the input),
//! `g` the 3×3 kernel of one (output, input) channel pair, and sums evaluated left to right:
//!
//! - kernel: `h[a][·] = G·g` over `ky`, then `u[a][b] = h·Gᵀ` over `kx`, with `G·(g0, g1, g2) =
//!   (g0, ((g0 + g1) + g2)·½, ((g0 − g1) + g2)·½, g2)`;
//! - input: `t[a][·] = Bᵀ·d` over rows, then `v[a][b] = t·B` over columns, with `Bᵀ·(d0, d1,
//!   d2, d3) = (d0 − d2, d1 + d2, d2 − d1, d1 − d3)`;
//! - products: `m[a][b] = Σ_ci u[a][b]·v[a][b]`, one fused multiply-add per input channel in
//!   increasing order from `0.0` (the GEMM driver's order, one GEMM per point `(a, b)`);
//! - output: `s[i][·] = Aᵀ·m` over rows, then `y[i][j] = s·A` over columns, with `Aᵀ·(m0, m1,
//!   m2, m3) = ((m0 + m1) + m2, (m1 − m2) − m3)`; then `out = y + bias` (one addition).
//!
//! Each output depends only on its own 3×3 receptive field (the rows and columns of `d` that
//! `y[i][j]` reads are `i..i + 3`, `j..j + 3`), but the expression differs with the output's
//! position `(i, j)` in its tile: the tiles are anchored at the output's origin, so a window of
//! the image gives the whole image's bits only if it starts at an even row and column (the exact
//! VAE tiles do: `edge_schema::tiles::axis_windows`).
//!
//! **The work split.** Output tiles are taken in blocks of up to [`BLOCK_TILES`] (whole rows of
//! tiles when a row holds at most that many, else runs of one row); column tasks (one per
//! scratch slot, at most [`PANEL_SLOTS`]) take the next block under a lock with its output
//! rows, transform its patches into the 16 points' packed panels in their own slot, and run
//! every output channel over them. The bits do not depend on the split or the thread count.

use std::sync::Mutex;

use rayon::prelude::*;

use crate::gemm::{run_block, F32Tile, COL_BLOCK, MAX_TILE_ROWS, PANEL_SLOTS};
use crate::params::Conv2dParams;
use crate::weights::{convert_row, f32_view_mut, WeightRef};

/// Transform points of a tile (4×4).
const POINTS: usize = 16;
/// Output tiles per block: the lanes of a block's panels (one driver column block).
pub(crate) const BLOCK_TILES: usize = COL_BLOCK;
/// Output channels per pass over a block's panels (the driver's row block for the widest tile).
const ROW_PASS: usize = 8 * MAX_TILE_ROWS;
/// Fewest input channels for which [`crate::conv2d`] takes this path (the products' `k`; with
/// fewer the direct form's `9·cin` is short already).
pub const WINOGRAD_MIN_CHANNELS: usize = 8;

/// Whether [`crate::conv2d`] computes `p` by Winograd F(2×2, 3×3): a 3×3 kernel, stride 1 and
/// at least [`WINOGRAD_MIN_CHANNELS`] input channels (any padding, any number of output
/// channels: the VAE's 128 → 3 output convolution is 3 times faster so, `kbench`). A function
/// of the shapes only.
pub fn winograd_applies(p: &Conv2dParams) -> bool {
    p.kh == 3 && p.kw == 3 && p.stride_h == 1 && p.stride_w == 1 && p.cin >= WINOGRAD_MIN_CHANNELS
}

/// f32 of one column task's slot: the 16 points' panels of a block (`16 · cin · BLOCK_TILES`)
/// and the products of one pass of output channels (`16 · ROW_PASS · COL_BLOCK`).
fn slot_floats(p: &Conv2dParams) -> usize {
    POINTS * p.cin * BLOCK_TILES + POINTS * ROW_PASS * COL_BLOCK
}

/// Scratch bytes of the Winograd path: the transformed kernels (`16 · cout · cin` f32) and
/// [`PANEL_SLOTS`] slots.
pub(crate) fn scratch_bytes(p: &Conv2dParams) -> usize {
    4 * (POINTS * p.cout * p.cin + PANEL_SLOTS * slot_floats(p))
}

/// The output tiles `[ty0, ty0 + nty) × [tx0, tx0 + ntx)` of one block.
#[derive(Clone, Copy)]
struct Block {
    ty0: usize,
    tx0: usize,
    nty: usize,
    ntx: usize,
}

/// The blocks of an output of `tiles_y × tiles_x` tiles, in the order they are handed out.
struct Blocks {
    tiles_y: usize,
    tiles_x: usize,
    /// Rows of tiles per block when a row fits in one block (else 0: runs of one row).
    rows: usize,
}

impl Blocks {
    fn new(oh: usize, ow: usize) -> Self {
        let (tiles_y, tiles_x) = (oh.div_ceil(2), ow.div_ceil(2));
        let rows = if tiles_x <= BLOCK_TILES {
            BLOCK_TILES / tiles_x
        } else {
            0
        };
        Blocks {
            tiles_y,
            tiles_x,
            rows,
        }
    }

    fn count(&self) -> usize {
        if self.rows > 0 {
            self.tiles_y.div_ceil(self.rows)
        } else {
            self.tiles_y * self.tiles_x.div_ceil(BLOCK_TILES)
        }
    }

    fn get(&self, b: usize) -> Block {
        if self.rows > 0 {
            let ty0 = b * self.rows;
            Block {
                ty0,
                tx0: 0,
                nty: self.rows.min(self.tiles_y - ty0),
                ntx: self.tiles_x,
            }
        } else {
            let per_row = self.tiles_x.div_ceil(BLOCK_TILES);
            let tx0 = (b % per_row) * BLOCK_TILES;
            Block {
                ty0: b / per_row,
                tx0,
                nty: 1,
                ntx: BLOCK_TILES.min(self.tiles_x - tx0),
            }
        }
    }
}

/// The first `n` elements of `*s`, which keeps the rest.
fn take<'o>(s: &mut &'o mut [f32], n: usize) -> &'o mut [f32] {
    let (head, rest) = std::mem::take(s).split_at_mut(n);
    *s = rest;
    head
}

/// The output rows not yet handed out, per output channel.
struct Untaken<'o> {
    next: usize,
    /// Each channel's plane from its first row not yet handed out.
    planes: Vec<&'o mut [f32]>,
    /// Runs of one tile row: each channel's two output rows from the first column not yet
    /// handed out (the second empty past the last output row).
    open: Vec<[&'o mut [f32]; 2]>,
}

/// `out = conv2d(p, x, w, bias)` by Winograd F(2×2, 3×3) (module doc) with `tile`; the caller
/// has checked the arguments ([`crate::contract::conv2d`]) and that
/// [`winograd_applies`]`(p)`; `scratch` holds at least [`scratch_bytes`] bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv2d(
    tile: &F32Tile,
    p: &Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    debug_assert!(winograd_applies(p));
    let (oh, ow) = p.out_hw();
    let (cin, cout) = (p.cin, p.cout);
    let scratch = f32_view_mut(&mut scratch[..scratch_bytes(p)], "conv2d scratch");
    let (u, slots) = scratch.split_at_mut(POINTS * cout * cin);
    transform_kernels(p, w, u);
    let u: &[f32] = u;

    let blocks = Blocks::new(oh, ow);
    let nblocks = blocks.count();
    let untaken = Mutex::new(Untaken {
        next: 0,
        planes: out.chunks_mut(oh * ow).collect(),
        open: Vec::new(),
    });
    let rb = 8 * tile.rows;
    slots.par_chunks_exact_mut(slot_floats(p)).for_each(|slot| {
        let (v, m) = slot.split_at_mut(POINTS * cin * BLOCK_TILES);
        // This block's output rows: channel `co`'s row `r` (from the block's first output
        // row) at `mine[co·nrows + r]`, from the block's first output column.
        let mut mine: Vec<&mut [f32]> = Vec::new();
        loop {
            let (blk, nrows) = {
                let mut un = untaken.lock().unwrap_or_else(|e| e.into_inner());
                if un.next >= nblocks {
                    break;
                }
                let blk = blocks.get(un.next);
                un.next += 1;
                mine.clear();
                let oy0 = 2 * blk.ty0;
                let nrows = (2 * blk.nty).min(oh - oy0);
                let un = &mut *un;
                if blocks.rows > 0 {
                    for plane in un.planes.iter_mut() {
                        mine.extend(take(plane, nrows * ow).chunks_mut(ow));
                    }
                } else {
                    if blk.tx0 == 0 {
                        un.open.clear();
                        for plane in un.planes.iter_mut() {
                            let first = take(plane, ow);
                            let second = take(plane, if nrows > 1 { ow } else { 0 });
                            un.open.push([first, second]);
                        }
                    }
                    let cols = (2 * blk.ntx).min(ow - 2 * blk.tx0);
                    for [first, second] in un.open.iter_mut() {
                        mine.push(take(first, cols));
                        let n = cols.min(second.len());
                        mine.push(take(second, n));
                    }
                }
                (blk, if blocks.rows > 0 { nrows } else { 2 })
            };
            let lanes = blk.nty * blk.ntx;
            let panel_floats = lanes.div_ceil(tile.cols) * tile.cols * cin;
            transform_inputs(p, x, blk, tile.cols, v);
            for b0 in (0..cout).step_by(rb) {
                let rows = rb.min(cout - b0);
                for (pt, mp) in m.chunks_exact_mut(ROW_PASS * COL_BLOCK).enumerate() {
                    let res = &mut mp[..rows * COL_BLOCK];
                    res.fill(0.0);
                    let panels = &v[pt * cin * BLOCK_TILES..][..panel_floats];
                    let upt = &u[pt * cout * cin..][..cout * cin];
                    run_block(tile, upt, b0, rows, cin, panels, 0, lanes, res);
                }
                let outs = &mut mine[b0 * nrows..(b0 + rows) * nrows];
                transform_outputs(m, rows, blk, nrows, bias.map(|b| &b[b0..b0 + rows]), outs);
            }
        }
    });
}

/// `u[pt·cout·cin + co·cin + ci]` = point `pt` of the transformed kernel of `(co, ci)` (module
/// doc), each point's `[cout, cin]` matrix row-major (the GEMM's rows). Per output channel its
/// weight row is converted whole, then each step runs over the input channels (vectorises).
fn transform_kernels(p: &Conv2dParams, w: WeightRef<'_>, u: &mut [f32]) {
    const CO_BLOCK: usize = 8;
    let (cin, cout) = (p.cin, p.cout);
    let wrow = w.bytes.len() / cout;
    // Per block of output channels, its rows of every point's matrix.
    let mut parts: Vec<Vec<&mut [f32]>> = (0..cout.div_ceil(CO_BLOCK))
        .map(|_| Vec::with_capacity(POINTS))
        .collect();
    for upt in u.chunks_mut(cout * cin) {
        for (part, rows) in parts.iter_mut().zip(upt.chunks_mut(CO_BLOCK * cin)) {
            part.push(rows);
        }
    }
    parts.into_par_iter().enumerate().for_each(|(bi, mut dst)| {
        // One converted row `[cin, 3, 3]`, then `G·g` per kernel column: `h[a·3 + kx][ci]`.
        let mut g = vec![0f32; 9 * cin];
        let mut h = vec![0f32; 12 * cin];
        for r in 0..dst[0].len() / cin {
            let co = bi * CO_BLOCK + r;
            convert_row(w.dtype, &w.bytes[co * wrow..(co + 1) * wrow], &mut g);
            for kx in 0..3 {
                let (h0, rest) = h.split_at_mut(3 * cin);
                let (h1, rest) = rest.split_at_mut(3 * cin);
                let (h2, h3) = rest.split_at_mut(3 * cin);
                let hs = [h0, h1, h2, h3];
                let [h0, h1, h2, h3] = hs.map(|hb| &mut hb[kx * cin..(kx + 1) * cin]);
                for (ci, gk) in g.chunks_exact(9).enumerate() {
                    let c = g_transform([gk[kx], gk[3 + kx], gk[6 + kx]]);
                    h0[ci] = c[0];
                    h1[ci] = c[1];
                    h2[ci] = c[2];
                    h3[ci] = c[3];
                }
            }
            for a in 0..4 {
                let ha = &h[a * 3 * cin..(a + 1) * 3 * cin];
                let (k0, k1, k2) = (&ha[..cin], &ha[cin..2 * cin], &ha[2 * cin..]);
                let [d0, d1, d2, d3] = &mut dst[a * 4..a * 4 + 4] else {
                    unreachable!("16 points")
                };
                let rows = [d0, d1, d2, d3].map(|d| &mut d[r * cin..(r + 1) * cin]);
                let [u0, u1, u2, u3] = rows;
                for ci in 0..cin {
                    let c = g_transform([k0[ci], k1[ci], k2[ci]]);
                    u0[ci] = c[0];
                    u1[ci] = c[1];
                    u2[ci] = c[2];
                    u3[ci] = c[3];
                }
            }
        }
    });
}

/// `G·(g0, g1, g2)` (module doc).
#[inline(always)]
fn g_transform([g0, g1, g2]: [f32; 3]) -> [f32; 4] {
    [g0, ((g0 + g1) + g2) * 0.5, ((g0 - g1) + g2) * 0.5, g2]
}

/// `Bᵀ·(d0, d1, d2, d3)` (module doc).
#[inline(always)]
fn b_transform([d0, d1, d2, d3]: [f32; 4]) -> [f32; 4] {
    [d0 - d2, d1 + d2, d2 - d1, d1 - d3]
}

/// `Aᵀ·(m0, m1, m2, m3)` (module doc).
#[inline(always)]
fn a_transform([m0, m1, m2, m3]: [f32; 4]) -> [f32; 2] {
    [(m0 + m1) + m2, (m1 - m2) - m3]
}

/// Writes the transformed input patches of block `blk` into `v`: point `pt`'s panels at
/// `v[pt·cin·BLOCK_TILES ..]`, lane `l` (tile `(ty0 + l / ntx, tx0 + l % ntx)`) of panel
/// `l / tc` at `(panel·cin + ci)·tc + l % tc`; lanes past the block's tiles are zeros.
///
/// Per input channel and tile row: the 4 input rows are copied (zeros outside the input), `Bᵀ`
/// is applied down the columns (`t[a][q]`, shared by the two tiles a column belongs to), then
/// `B` across each tile's 4 columns, lane by lane: the same operations in the same order as the
/// module doc's, written so that they vectorise.
fn transform_inputs(p: &Conv2dParams, x: &[f32], blk: Block, tc: usize, v: &mut [f32]) {
    const SPAN: usize = 2 * BLOCK_TILES + 2;
    let cin = p.cin;
    let lanes = blk.nty * blk.ntx;
    let padded = lanes.div_ceil(tc) * tc;
    let span = 2 * blk.ntx + 2;
    let mut rows = [[0f32; SPAN]; 4];
    let mut t = [[0f32; SPAN]; 4];
    let mut d = [[0f32; BLOCK_TILES]; 4];
    let mut vr = [[0f32; BLOCK_TILES]; POINTS];
    for ci in 0..cin {
        let plane = &x[ci * p.h * p.w..(ci + 1) * p.h * p.w];
        for ly in 0..blk.nty {
            let ty = blk.ty0 + ly;
            for (i, row) in rows.iter_mut().enumerate() {
                let dst = &mut row[..span];
                dst.fill(0.0);
                let Some(iy) = (2 * ty + i).checked_sub(p.pad_top).filter(|&iy| iy < p.h) else {
                    continue;
                };
                // Input column of `dst[q]`: 2·tx0 + q − pad_left.
                let base = 2 * blk.tx0;
                let lead = p.pad_left.saturating_sub(base).min(span);
                let first = (base + lead).saturating_sub(p.pad_left);
                let inside = p.w.saturating_sub(first).min(span - lead);
                dst[lead..lead + inside]
                    .copy_from_slice(&plane[iy * p.w + first..iy * p.w + first + inside]);
            }
            let [r0, r1, r2, r3] = &rows;
            for q in 0..span {
                let c = b_transform([r0[q], r1[q], r2[q], r3[q]]);
                for a in 0..4 {
                    t[a][q] = c[a];
                }
            }
            let n = blk.ntx;
            for a in 0..4 {
                for j in 0..4 {
                    for lx in 0..n {
                        d[j][lx] = t[a][2 * lx + j];
                    }
                }
                for lx in 0..n {
                    let r = b_transform([d[0][lx], d[1][lx], d[2][lx], d[3][lx]]);
                    for b in 0..4 {
                        vr[a * 4 + b][lx] = r[b];
                    }
                }
            }
            // Lanes ly·ntx .. + ntx, in runs that stay within one panel.
            let mut lx = 0;
            while lx < n {
                let l = ly * n + lx;
                let run = (tc - l % tc).min(n - lx);
                let at = (l / tc * cin + ci) * tc + l % tc;
                for (pt, src) in vr.iter().enumerate() {
                    v[pt * cin * BLOCK_TILES + at..][..run].copy_from_slice(&src[lx..lx + run]);
                }
                lx += run;
            }
        }
        if padded > lanes {
            let l = lanes;
            let at = (l / tc * cin + ci) * tc + l % tc;
            for pt in 0..POINTS {
                v[pt * cin * BLOCK_TILES + at..][..padded - lanes].fill(0.0);
            }
        }
    }
}

/// From the products `m[pt·ROW_PASS·COL_BLOCK + r·COL_BLOCK + l]` of `rows` output channels
/// and the block's lanes, the outputs (module doc) plus the bias, into `outs[r·nrows + row]`
/// (the block's output rows of each channel, from its first output column): lane by lane, the
/// module doc's operations in its order.
fn transform_outputs(
    m: &[f32],
    rows: usize,
    blk: Block,
    nrows: usize,
    bias: Option<&[f32]>,
    outs: &mut [&mut [f32]],
) {
    let n = blk.ntx;
    let mut s = [[[0f32; BLOCK_TILES]; 4]; 2];
    let mut y = [[0f32; BLOCK_TILES]; 2];
    for r in 0..rows {
        let bv = bias.map_or(0.0, |b| b[r]);
        let chan = &mut outs[r * nrows..(r + 1) * nrows];
        for ly in 0..blk.nty {
            let l0 = r * COL_BLOCK + ly * n;
            let mp = |pt: usize| &m[pt * ROW_PASS * COL_BLOCK + l0..][..n];
            for b in 0..4 {
                let (m0, m1, m2, m3) = (mp(b), mp(4 + b), mp(8 + b), mp(12 + b));
                for lx in 0..n {
                    let c = a_transform([m0[lx], m1[lx], m2[lx], m3[lx]]);
                    s[0][b][lx] = c[0];
                    s[1][b][lx] = c[1];
                }
            }
            for (i, si) in s.iter().enumerate() {
                let Some(row) = chan.get_mut(2 * ly + i) else {
                    continue;
                };
                for lx in 0..n {
                    let c = a_transform([si[0][lx], si[1][lx], si[2][lx], si[3][lx]]);
                    y[0][lx] = c[0] + bv;
                    y[1][lx] = c[1] + bv;
                }
                let full = (row.len() / 2).min(n);
                for (lx, pair) in row[..2 * full].chunks_exact_mut(2).enumerate() {
                    pair[0] = y[0][lx];
                    pair[1] = y[1][lx];
                }
                if full < n && row.len() > 2 * full {
                    row[2 * full] = y[0][full];
                }
            }
        }
    }
}
