//! `generic_attention_f32`: multi-head scaled-dot-product attention, flash-attention style.

use rayon::prelude::*;

use crate::expf::exp_f32;
pub use crate::params::{AttentionParams, MAX_HEAD_DIM};

/// Keys per tile of the online softmax.
pub const KEY_TILE: usize = 64;
/// Query rows per task (they share each key/value tile while it is in cache).
pub const QUERY_TILE: usize = 4;
/// The widest head of the compact task state ([`BlockState`]`<SMALL_HEAD_DIM>`, every head of
/// PixArt's DiT and T5): its rows take a quarter of the memory of [`MAX_HEAD_DIM`]'s, so a task
/// holds four times as many rows ([`SMALL_TASK_ROWS`]) in the same stack.
pub const SMALL_HEAD_DIM: usize = 128;

/// `generic_attention_f32`: for every head `h` and query row `i`,
/// `s_j = scale·(q·k_j) + bias[h, i, j] + (1 − key_mask[j])·masked_value`,
/// `out[i, h·head_dim ..][..head_dim] = Σ_j softmax(s)_j · v_j` (torch
/// `scaled_dot_product_attention` with an additive mask; T5Attention with its position bias).
///
/// Shapes: `key_mask` `[lk]` (1 keep, 0 drop), `bias` `[heads, lq, lk]`, `out`
/// `[lq, heads·head_dim]`; `q_src`/`kv_src` as described by [`AttentionParams`].
///
/// Keys after the last kept one are not visited ([`visited_keys`]); the others are visited in
/// tiles of 64 with an online softmax (running maximum and sum, rescaled
/// when the maximum grows; Milakov & Gimelshein 2018, FlashAttention): the `[lq, lk]` score
/// matrix is never stored and nothing is allocated. `q·k` is one fused multiply-add per head
/// channel in increasing order from `0.0` (the GEMM driver's order), `acc += w·v` one fused
/// multiply-add per key in increasing order, and `exp` is [`crate::expf::exp_f32`], so SIMD
/// twins (keys or channels in lanes) match it bit for bit. The order of every sum is fixed by
/// the key tile size, so the result is identical for any thread count. Parallel over blocks of
/// up to 128 query rows (all heads of a row are in the same task because `out` rows interleave
/// heads); per head, each key tile is packed once per task (keys side by side, [`pack_keys`])
/// and met by the task's blocks of 4 rows (for heads of at most [`SMALL_HEAD_DIM`] channels in
/// two phases, all blocks' scores and then all blocks' value sums:
/// [`AttentionOps::phases_small`]).
pub fn attention(
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    attention_with(&GENERIC_ATTENTION, p, q_src, kv_src, key_mask, bias, out)
}

/// The per-ISA part of the attention driver: up to [`QUERY_TILE`] query rows of one head
/// against one key tile (the online softmax step of each row). Tiling, key packing, the
/// parallel split and the final division stay in [`attention_with`]. A SIMD `block_tile` must
/// give, for every row, exactly the bits of [`generic_row_tile`] (tested).
#[derive(Clone, Copy, Debug)]
pub struct AttentionOps {
    /// Name for logs.
    pub name: &'static str,
    /// The step for rows `0..b.nq` of the block; row `r`'s state is `acc[r][..head_dim]`,
    /// `run_max[r]`, `run_sum[r]`; the tile's keys come packed ([`pack_keys`]).
    pub block_tile: BlockTileFn,
    /// The same step on the compact state, for heads of at most [`SMALL_HEAD_DIM`] channels
    /// (the same function instantiated for the smaller `acc` rows).
    pub block_tile_small: BlockTileFn<SMALL_HEAD_DIM>,
    /// Packs a key tile exactly as [`pack_keys`] does (data movement only), or, for the bf16
    /// step, as [`crate::attention_bf16::pack_key_pairs`].
    pub pack_keys: PackKeysFn,
    /// Packs a value tile: [`pack_values`], or [`crate::attention_bf16::pack_value_pairs`].
    pub pack_values: PackKeysFn,
    /// The step of the compact state in two phases, if the ISA has them: the scores and the
    /// online softmax (the weights left in [`BlockState::scores`], each row's correction in
    /// [`BlockState::corr`]), then the value sums ([`BlockValuesFn`]). The driver then runs the
    /// first phase for all of a task's blocks against a key tile, then the second, so the packed
    /// keys and the packed values each stay in the L1 data cache while the blocks pass over
    /// them (36 KiB for both at 72 channels, more than a 32 KiB L1: with one step per block both
    /// were read from L2 for every block). The bits are the step's: `block_tile_small` must be
    /// the two phases one after the other.
    pub phases_small: Option<Phases<SMALL_HEAD_DIM>>,
}

/// [`AttentionOps::phases_small`]: the scores phase (a [`BlockTileFn`] that leaves the
/// weights and corrections in the state) and the value phase.
pub type Phases<const D: usize> = (BlockTileFn<D>, BlockValuesFn<D>);

/// The value phase of a two-phase step: for rows `0..b.nq`, `acc ·= corr` (skipped when it is 1)
/// and `acc = fma(w_j, v_j, acc)` for the tile's keys in order, with the weights and corrections
/// that the scores phase left in `st`.
pub type BlockValuesFn<const D: usize = MAX_HEAD_DIM> =
    fn(b: &QueryBlock<'_>, st: &mut BlockState<D>);

/// [`AttentionOps::pack_keys`]'s signature: [`pack_keys`]'s.
pub type PackKeysFn =
    fn(p: &AttentionParams, kv_src: &[f32], h: usize, j0: usize, nk: usize, dst: &mut [f32]);

/// [`AttentionOps::block_tile`]'s signature: `(block, packed keys, state)`, the state's rows
/// `D` f32 long (`head_dim ≤ D`).
pub type BlockTileFn<const D: usize = MAX_HEAD_DIM> =
    fn(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>);

/// Packs keys `j0 .. j0 + nk` of head `h` side by side: `dst[d·KEY_TILE + c]` is channel `d` of
/// key `j0 + c` for `d < head_dim`, `c < nk`; lanes `nk..KEY_TILE` are zero. `dst` holds at
/// least `head_dim · KEY_TILE` f32.
pub fn pack_keys(
    p: &AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let hd = p.head_dim;
    let dst = &mut dst[..hd * KEY_TILE];
    if nk < KEY_TILE {
        dst.fill(0.0);
    }
    for c in 0..nk {
        let key = p.key_row(kv_src, h, j0 + c);
        for (d, &v) in key.iter().enumerate() {
            dst[d * KEY_TILE + c] = v;
        }
    }
}

/// Copies the values of keys `j0 .. j0 + nk` of head `h` one after the other: `dst[c·head_dim +
/// d]` is channel `d` of value `j0 + c` (`[nk, head_dim]`, outermost first). Every query block
/// of a task then reads the tile's values from one contiguous run instead of rows a whole token
/// apart (which share few cache sets); data movement only.
pub fn pack_values(
    p: &AttentionParams,
    kv_src: &[f32],
    h: usize,
    j0: usize,
    nk: usize,
    dst: &mut [f32],
) {
    let hd = p.head_dim;
    for (c, row) in dst[..nk * hd].chunks_exact_mut(hd).enumerate() {
        row.copy_from_slice(p.value_row(kv_src, h, j0 + c));
    }
}

/// Query rows `i0 .. i0 + nq` of head `h` and the key tile `j0 .. j0 + nk` they meet.
#[derive(Clone, Copy, Debug)]
pub struct QueryBlock<'a> {
    /// The attention's geometry.
    pub p: &'a AttentionParams,
    /// The query source.
    pub q_src: &'a [f32],
    /// The key/value source.
    pub kv_src: &'a [f32],
    /// The key mask `[lk]`, if any.
    pub key_mask: Option<&'a [f32]>,
    /// The additive bias `[heads, lq, lk]`, if any.
    pub bias: Option<&'a [f32]>,
    /// Head.
    pub h: usize,
    /// First query row.
    pub i0: usize,
    /// Query rows (1..=[`QUERY_TILE`]).
    pub nq: usize,
    /// First key of the tile.
    pub j0: usize,
    /// Keys in the tile (1..=[`KEY_TILE`]).
    pub nk: usize,
    /// The tile's values as the step's [`AttentionOps::pack_values`] packed them (at least
    /// `[nk, head_dim]`; [`pack_values`]: exactly that, row after row).
    pub values: &'a [f32],
}

impl<'a> QueryBlock<'a> {
    /// Asserts what an [`AttentionOps::block_tile`] may rely on: `1 ≤ nq ≤ QUERY_TILE`,
    /// `1 ≤ nk ≤ KEY_TILE`, `head_dim ≤ D` (the state's row length), `keys` holding
    /// `head_dim · KEY_TILE` f32, and `values` the tile's `nk · head_dim` (query, bias and mask
    /// rows are reached through bounds-checked slices). SIMD steps call it before their
    /// unchecked loads.
    pub fn check_step<const D: usize>(&self, keys: &[f32], st: &BlockState<D>) {
        self.check_values(st);
        assert!(keys.len() >= self.p.head_dim * KEY_TILE);
    }

    /// [`Self::check_step`] without the keys: what a value phase ([`BlockValuesFn`]) relies on.
    pub fn check_values<const D: usize>(&self, _st: &BlockState<D>) {
        let hd = self.p.head_dim;
        assert!((1..=QUERY_TILE).contains(&self.nq) && (1..=KEY_TILE).contains(&self.nk));
        assert!(hd <= D);
        assert!(
            self.values.len() >= self.nk * hd,
            "attention: packed values shorter than the tile"
        );
    }

    /// The block's [`QUERY_TILE`] query rows (`[head_dim]` each); rows from `nq` on repeat the
    /// last one, so a SIMD step may run all of them and store only the first `nq`.
    pub fn queries(&self) -> [&'a [f32]; QUERY_TILE] {
        std::array::from_fn(|r| {
            self.p
                .query_row(self.q_src, self.h, self.i0 + r.min(self.nq - 1))
        })
    }

    /// Row `r` (`< nq`) as a [`KeyTile`].
    pub fn row(&self, r: usize) -> KeyTile<'a> {
        let p = self.p;
        let i = self.i0 + r;
        KeyTile {
            p,
            q: p.query_row(self.q_src, self.h, i),
            kv_src: self.kv_src,
            values: self.values,
            h: self.h,
            j0: self.j0,
            nk: self.nk,
            bias: self.bias.map(|b| &b[(self.h * p.lq + i) * p.lk..][..p.lk]),
            key_mask: self.key_mask,
        }
    }
}

/// The running state of the block's rows and its score scratch, for heads of at most `D`
/// channels ([`MAX_HEAD_DIM`], or [`SMALL_HEAD_DIM`] for the compact state).
#[derive(Debug)]
pub struct BlockState<const D: usize = MAX_HEAD_DIM> {
    /// Per row, `Σ_j w_j · v_j` so far (first `head_dim` elements), rescaled to the row's
    /// current maximum.
    pub acc: [[f32; D]; QUERY_TILE],
    /// Per row, the largest score so far (−∞ before the first tile).
    pub run_max: [f32; QUERY_TILE],
    /// Per row, `Σ_j w_j` so far.
    pub run_sum: [f32; QUERY_TILE],
    /// Per row, the tile's scores (then weights).
    pub scores: [[f32; KEY_TILE]; QUERY_TILE],
    /// Per row, the tile's correction `exp(m − m')` between the phases of a two-phase step
    /// ([`AttentionOps::phases_small`]).
    pub corr: [f32; QUERY_TILE],
    /// The block's query rows as a step keeps them from the first key tile of a head to the
    /// last (`D` u32 slots per pair of rows: row `r`'s `⌈head_dim/2⌉` bf16 pairs from `r·D/2`;
    /// the AVX-512 BF16 step rounds them once per head instead of once per key tile), valid
    /// while [`BlockState::queries_ready`] is set.
    pub query_pairs: [[u32; D]; QUERY_TILE / 2],
    /// Whether [`BlockState::query_pairs`] holds this head's rows ([`BlockState::reset`] clears
    /// it).
    pub queries_ready: bool,
}

impl<const D: usize> BlockState<D> {
    /// Back to the state before the first key tile (the first `head_dim` accumulators of every
    /// row are zeroed).
    pub fn reset(&mut self, head_dim: usize) {
        for a in &mut self.acc {
            a[..head_dim].fill(0.0);
        }
        self.run_max = [f32::NEG_INFINITY; QUERY_TILE];
        self.run_sum = [0.0; QUERY_TILE];
        self.queries_ready = false;
    }

    /// A state before the first key tile.
    pub fn new() -> Self {
        BlockState {
            acc: [[0.0; D]; QUERY_TILE],
            run_max: [f32::NEG_INFINITY; QUERY_TILE],
            run_sum: [0.0; QUERY_TILE],
            scores: [[0.0; KEY_TILE]; QUERY_TILE],
            corr: [1.0; QUERY_TILE],
            query_pairs: [[0; D]; QUERY_TILE / 2],
            queries_ready: false,
        }
    }

    /// Row `r`'s state, for [`generic_row_tile`].
    pub fn row(&mut self, r: usize, head_dim: usize) -> (RowState<'_>, &mut [f32; KEY_TILE]) {
        (
            RowState {
                acc: &mut self.acc[r][..head_dim],
                run_max: &mut self.run_max[r],
                run_sum: &mut self.run_sum[r],
            },
            &mut self.scores[r],
        )
    }
}

/// One query row of one head and the key tile `j0 .. j0 + nk` it meets.
#[derive(Clone, Copy, Debug)]
pub struct KeyTile<'a> {
    /// The attention's geometry.
    pub p: &'a AttentionParams,
    /// The query row of head `h`, `[head_dim]`.
    pub q: &'a [f32],
    /// The key/value source.
    pub kv_src: &'a [f32],
    /// The tile's values packed by [`pack_values`], `[nk, head_dim]`.
    pub values: &'a [f32],
    /// Head.
    pub h: usize,
    /// First key of the tile.
    pub j0: usize,
    /// Keys in the tile (1..=[`KEY_TILE`]).
    pub nk: usize,
    /// This row's additive bias `[lk]` (`bias[h, i, ..]`), if any.
    pub bias: Option<&'a [f32]>,
    /// The key mask `[lk]`, if any.
    pub key_mask: Option<&'a [f32]>,
}

impl KeyTile<'_> {
    /// Key `j` of head `h`, `[head_dim]`.
    #[inline]
    pub fn key(&self, j: usize) -> &[f32] {
        self.p.key_row(self.kv_src, self.h, j)
    }

    /// Value `j` (`j0 ≤ j < j0 + nk`) of head `h`, `[head_dim]`, from the packed tile.
    #[inline]
    pub fn value(&self, j: usize) -> &[f32] {
        let hd = self.p.head_dim;
        &self.values[(j - self.j0) * hd..][..hd]
    }

    /// The score of key `j` from its dot product with the query:
    /// `scale·dot + bias[j] + (1 − mask[j])·masked_value`, in that order.
    #[inline]
    pub fn score(&self, j: usize, dot: f32) -> f32 {
        let mut v = self.p.scale * dot;
        if let Some(b) = self.bias {
            v += b[j];
        }
        if let Some(m) = self.key_mask {
            v += (1.0 - m[j]) * self.p.masked_value;
        }
        v
    }
}

/// The running state of one query row: `acc` `[head_dim]` (unnormalised output), the running
/// maximum score and the running sum of weights.
#[derive(Debug)]
pub struct RowState<'a> {
    /// `Σ_j w_j · v_j` so far, rescaled to the current maximum.
    pub acc: &'a mut [f32],
    /// Largest score so far (−∞ before the first tile).
    pub run_max: &'a mut f32,
    /// `Σ_j w_j` so far.
    pub run_sum: &'a mut f32,
}

/// The portable step: [`generic_row_tile`] for each row of the block.
pub const GENERIC_ATTENTION: AttentionOps = AttentionOps {
    name: "generic_attention_f32",
    block_tile: generic_block_tile,
    block_tile_small: generic_block_tile,
    pack_keys,
    pack_values,
    phases_small: Some((generic_block_scores, generic_block_values)),
};

impl<const D: usize> Default for BlockState<D> {
    fn default() -> Self {
        Self::new()
    }
}

/// [`GENERIC_ATTENTION`]'s step: its two phases one after the other ([`generic_row_tile`] for
/// each row).
fn generic_block_tile<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    generic_block_scores(b, keys, st);
    generic_block_values(b, st);
}

/// The scores phase of [`GENERIC_ATTENTION`]'s two-phase step: [`generic_row_scores`] for each
/// row of the block, its correction kept in `st.corr`.
fn generic_block_scores<const D: usize>(b: &QueryBlock<'_>, keys: &[f32], st: &mut BlockState<D>) {
    for r in 0..b.nq {
        let t = b.row(r);
        let (mut row, scores) = st.row(r, b.p.head_dim);
        let c = generic_row_scores(&t, keys, &mut row, scores);
        st.corr[r] = c;
    }
}

/// The value phase of [`GENERIC_ATTENTION`]'s two-phase step: [`generic_row_values`] for each
/// row of the block with the correction and weights the scores phase left.
fn generic_block_values<const D: usize>(b: &QueryBlock<'_>, st: &mut BlockState<D>) {
    for r in 0..b.nq {
        let t = b.row(r);
        let c = st.corr[r];
        let (mut row, weights) = st.row(r, b.p.head_dim);
        generic_row_values(&t, c, &mut row, weights);
    }
}

/// The online softmax step that defines the bits: scores `s_j` ([`KeyTile::score`] of
/// `dot_j = fma(q[hd−1], k_j[hd−1], … fma(q[0], k_j[0], 0.0))`, `keys` packed by
/// [`pack_keys`]), `m' = max(m, max_j s_j)`, `c = exp_f32(m − m')`, `acc ·= c` (skipped when
/// `c = 1`), the weights `w_j = exp_f32(s_j − m')`, `sum = sum·c + tile_sum(w)`
/// ([`tile_sum`]), and for each key in order `acc[d] = fma(w_j, v_j[d], acc[d])`.
pub fn generic_row_tile(t: &KeyTile<'_>, keys: &[f32], st: &mut RowState<'_>, scores: &mut [f32]) {
    let correction = generic_row_scores(t, keys, st, scores);
    generic_row_values(t, correction, st, scores);
}

/// The first part of [`generic_row_tile`]: the dot products, then [`softmax_step`] (the
/// weights in `scores[..nk]`, the running maximum and sum updated); returns the correction.
pub fn generic_row_scores(
    t: &KeyTile<'_>,
    keys: &[f32],
    st: &mut RowState<'_>,
    scores: &mut [f32],
) -> f32 {
    let hd = t.p.head_dim;
    let mut dots = [0.0f32; KEY_TILE];
    for (d, &qd) in t.q[..hd].iter().enumerate() {
        let kd = &keys[d * KEY_TILE..][..t.nk];
        for (a, &kv) in dots.iter_mut().zip(kd) {
            *a = qd.mul_add(kv, *a);
        }
    }
    softmax_step(t, &dots[..t.nk], st, scores)
}

/// The rest of [`generic_row_tile`]: `acc ·= correction` (skipped when it is 1), then
/// `acc[d] = fma(w_j, v_j[d], acc[d])` for the tile's keys in order (`weights[..nk]`).
pub fn generic_row_values(
    t: &KeyTile<'_>,
    correction: f32,
    st: &mut RowState<'_>,
    weights: &[f32],
) {
    if correction != 1.0 {
        for x in st.acc.iter_mut() {
            *x *= correction;
        }
    }
    for (jj, &w) in weights[..t.nk].iter().enumerate() {
        for (x, &vv) in st.acc.iter_mut().zip(t.value(t.j0 + jj)) {
            *x = w.mul_add(vv, *x);
        }
    }
}

/// The online softmax part of a step, shared by both arithmetics: the scores of the tile's
/// `dots` ([`KeyTile::score`]), `m' = max(m, max_j s_j)`, the weights `w_j = exp_f32(s_j − m')`
/// written to `scores[..nk]`, `sum = sum·c + tile_sum(w)` and `run_max = m'`; returns
/// `c = exp_f32(m − m')`, by which the caller rescales `acc` before adding the tile's values.
pub fn softmax_step(
    t: &KeyTile<'_>,
    dots: &[f32],
    st: &mut RowState<'_>,
    scores: &mut [f32],
) -> f32 {
    let s = &mut scores[..t.nk];
    for (c, sj) in s.iter_mut().enumerate() {
        *sj = t.score(t.j0 + c, dots[c]);
    }
    let new_max = tile_max(*st.run_max, s);
    let correction = exp_f32(*st.run_max - new_max);
    for sj in s.iter_mut() {
        *sj = exp_f32(*sj - new_max);
    }
    *st.run_sum = *st.run_sum * correction + tile_sum(s);
    *st.run_max = new_max;
    correction
}

/// Lanes of [`tile_sum`].
pub const SUM_LANES: usize = 16;

/// The sum of a tile's weights in a fixed order that 16 vector lanes compute directly: lane
/// `l` adds `w[l], w[l + 16], w[l + 32], …` in increasing index from `0.0`, then the lanes are
/// folded in halves, `lane[l] = lane[l] + lane[l + h]` for `h = 8, 4, 2, 1`; the result is lane
/// 0. (Zero lanes past the tile's keys change nothing: every weight is ≥ +0.)
#[inline]
pub fn tile_sum(w: &[f32]) -> f32 {
    let mut lanes = [0f32; SUM_LANES];
    for (j, &v) in w.iter().enumerate() {
        lanes[j % SUM_LANES] += v;
    }
    let mut h = SUM_LANES / 2;
    while h > 0 {
        for l in 0..h {
            lanes[l] += lanes[l + h];
        }
        h /= 2;
    }
    lanes[0]
}

/// `max(run_max, max_j s_j)` folded in index order with `f32::max` (NaN scores are skipped).
#[inline]
pub fn tile_max(run_max: f32, s: &[f32]) -> f32 {
    run_max.max(s.iter().copied().fold(f32::NEG_INFINITY, f32::max))
}

/// [`attention`] with the per-ISA pieces `ops`: same shapes, checks and bits for any `ops` that
/// honours the [`AttentionOps`] contract.
pub fn attention_with(
    ops: &AttentionOps,
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    crate::contract::attention(p, q_src, kv_src, key_mask, bias, out);
    let width = p.heads * p.head_dim;
    if p.lq == 0 || width == 0 {
        return;
    }
    // A task takes a share of the query rows (one per thread, at most what its state holds:
    // TASK_ROWS, or SMALL_TASK_ROWS for heads of at most SMALL_HEAD_DIM channels) and walks
    // the heads outermost; per head, each key tile is packed once and met by the task's blocks
    // of QUERY_TILE rows while it is in cache. Every row's arithmetic is the same in any task,
    // so the split changes no bit; fewer, larger tasks pack each tile fewer times (`kbench 2
    // attention`, 8 tasks of 128 rows → 2 of 512: BENCHMARKS.md, fourteenth session).
    let small = p.head_dim <= SMALL_HEAD_DIM;
    let most = if small { SMALL_TASK_ROWS } else { TASK_ROWS };
    let task_rows =
        p.lq.div_ceil(rayon::current_num_threads().max(1))
            .next_multiple_of(QUERY_TILE)
            .clamp(QUERY_TILE, most);
    let keys = visited_keys(p.lk, key_mask);
    out.par_chunks_mut(task_rows * width)
        .enumerate()
        .for_each(|(t, rows)| {
            let at = Attend {
                ops,
                p,
                q_src,
                kv_src,
                key_mask,
                bias,
                keys,
            };
            if small {
                attend_small(&at, t * task_rows, rows)
            } else {
                attend_full(&at, t * task_rows, rows)
            }
        });
}

/// The keys [`attention_with`] visits: `0 .. 1 + (the last j with key_mask[j] ≠ 0)`, all `lk`
/// without a mask or when no key is kept. The keys after the last kept one (a prompt's
/// padding: a 16-token prompt in a 300-token context keeps 16) are skipped, which is exact
/// wherever their weights underflow: a dropped key's score carries `masked_value` (−10000 in
/// PixArt's cross-attention, `f32::MIN` in T5), so its weight `exp(s − m')` is 0 (`exp_f32`
/// of anything below −104) and it cannot raise the maximum `m'`, unless a kept key's score is
/// within about `|masked_value|` of it. torch's softmax gives such keys weight 0 as well.
pub fn visited_keys(lk: usize, key_mask: Option<&[f32]>) -> usize {
    key_mask
        .and_then(|m| m[..lk].iter().rposition(|&x| x != 0.0))
        .map_or(lk, |j| j + 1)
}

/// What every task of [`attention_with`] reads: the step, the geometry, the sources and the
/// number of keys visited ([`visited_keys`]).
struct Attend<'a> {
    ops: &'a AttentionOps,
    p: &'a AttentionParams,
    q_src: &'a [f32],
    kv_src: &'a [f32],
    key_mask: Option<&'a [f32]>,
    bias: Option<&'a [f32]>,
    keys: usize,
}

/// A buffer on a cache-line boundary: the packed key and value tiles, whose 16-lane rows are
/// then each one cache line (a zmm load across two lines costs two cache accesses on Intel
/// cores: `kbench 2 attention` on a Xeon with AMX, self 154 → 168–170 GFLOP/s, cross 144 →
/// 153–157).
#[repr(C, align(64))]
struct Aligned64<T>(T);

/// One task of [`attention_with`]: every head (of at most `D` channels) of the query rows
/// `i_first ..` that `rows` (`[n, heads·head_dim]`, `n ≤ 4·NB`) holds. Its state (the
/// online-softmax state of `NB` blocks of rows and one packed key and value tile: about
/// 674 KiB for `D = MAX_HEAD_DIM`, `NB = 32`, and 583 KiB for `D = SMALL_HEAD_DIM`, `NB = 128`,
/// of which [`BlockState::query_pairs`] takes 128 KiB)
/// lives on the task's stack. `step` is the ops' step for that state; with `phases`
/// ([`AttentionOps::phases_small`]) each key tile meets all the blocks in the first phase, then
/// in the second.
fn attend_task<const D: usize, const NB: usize>(
    at: &Attend<'_>,
    step: BlockTileFn<D>,
    phases: Option<Phases<D>>,
    i_first: usize,
    rows: &mut [f32],
) {
    let &Attend {
        ops,
        p,
        q_src,
        kv_src,
        key_mask,
        bias,
        keys: lk,
    } = at;
    let width = p.heads * p.head_dim;
    let nrows = rows.len() / width;
    let nblocks = nrows.div_ceil(QUERY_TILE);
    assert!(nblocks <= NB && p.head_dim <= D);
    let mut states: [BlockState<D>; NB] = std::array::from_fn(|_| BlockState::new());
    let mut keys = Aligned64([[0f32; KEY_TILE]; D]);
    let mut values = Aligned64([[0f32; KEY_TILE]; D]);
    let (keys, values) = (keys.0.as_flattened_mut(), values.0.as_flattened_mut());
    for h in 0..p.heads {
        for st in &mut states[..nblocks] {
            st.reset(p.head_dim);
        }
        for j0 in (0..lk).step_by(KEY_TILE) {
            let nk = KEY_TILE.min(lk - j0);
            (ops.pack_keys)(p, kv_src, h, j0, nk, keys);
            (ops.pack_values)(p, kv_src, h, j0, nk, values);
            let values = &*values;
            let block = |bi: usize| QueryBlock {
                p,
                q_src,
                kv_src,
                key_mask,
                bias,
                h,
                i0: i_first + bi * QUERY_TILE,
                nq: QUERY_TILE.min(nrows - bi * QUERY_TILE),
                j0,
                nk,
                values,
            };
            let keys = &keys[..p.head_dim * KEY_TILE];
            match phases {
                Some((scores, sums)) => {
                    for (bi, st) in states[..nblocks].iter_mut().enumerate() {
                        scores(&block(bi), keys, st);
                    }
                    for (bi, st) in states[..nblocks].iter_mut().enumerate() {
                        sums(&block(bi), st);
                    }
                }
                None => {
                    for (bi, st) in states[..nblocks].iter_mut().enumerate() {
                        step(&block(bi), keys, st);
                    }
                }
            }
        }
        for (bi, st) in states[..nblocks].iter().enumerate() {
            let nq = QUERY_TILE.min(nrows - bi * QUERY_TILE);
            for r in 0..nq {
                let inv = st.run_sum[r];
                let dst = &mut rows[(bi * QUERY_TILE + r) * width + h * p.head_dim..][..p.head_dim];
                for (o, &a) in dst.iter_mut().zip(&st.acc[r][..p.head_dim]) {
                    *o = a / inv;
                }
            }
        }
    }
}

/// Runs the deepest kernel task frame (an attention task) once on every thread of rayon's
/// global pool, on a one-element problem, so that the stack pages the kernels touch are
/// resident from now on: a caller that measures the process's memory afterwards (the run's
/// budget, `edge_runtime::budget::resolve`) counts them instead of finding them later.
pub fn touch_worker_stacks() {
    let p = AttentionParams {
        lq: 1,
        lk: 1,
        heads: 1,
        head_dim: 1,
        scale: 1.0,
        q_stride: 1,
        q_offset: 0,
        kv_stride: 2,
        k_offset: 0,
        v_offset: 1,
        masked_value: 0.0,
    };
    rayon::broadcast(|_| {
        let mut out = [0f32];
        let at = Attend {
            ops: &GENERIC_ATTENTION,
            p: &p,
            q_src: &[0.0],
            kv_src: &[0.0, 0.0],
            key_mask: None,
            bias: None,
            keys: 1,
        };
        // Both task frames (the compact state's and the full one's), so that whichever is
        // deeper is resident.
        attend_small(&at, 0, &mut out);
        attend_full(&at, 0, &mut out);
        std::hint::black_box(out);
    });
}

/// Most query rows per task of [`attention_with`].
const TASK_ROWS: usize = 128;
/// Most query rows per task of [`attention_with`] for heads of at most [`SMALL_HEAD_DIM`]
/// channels.
const SMALL_TASK_ROWS: usize = 512;

/// [`attend_task`] with the compact state ([`SMALL_HEAD_DIM`], [`SMALL_TASK_ROWS`]).
fn attend_small(at: &Attend<'_>, i_first: usize, rows: &mut [f32]) {
    let (step, phases) = (at.ops.block_tile_small, at.ops.phases_small);
    attend_task::<SMALL_HEAD_DIM, { SMALL_TASK_ROWS / QUERY_TILE }>(at, step, phases, i_first, rows)
}

/// [`attend_task`] with the full state ([`MAX_HEAD_DIM`], [`TASK_ROWS`]).
fn attend_full(at: &Attend<'_>, i_first: usize, rows: &mut [f32]) {
    let step = at.ops.block_tile;
    attend_task::<MAX_HEAD_DIM, { TASK_ROWS / QUERY_TILE }>(at, step, None, i_first, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compact state's task ([`SMALL_HEAD_DIM`], in two phases) and the full one (one step
    /// per block), and the compact state in one step, give the same bits for a head that both
    /// hold (the driver picks the compact one; the twins are compared with the generic step on
    /// it, so this pins it to the full state's one-step arithmetic).
    #[test]
    fn compact_and_full_task_states_agree() {
        let (lq, lk, heads, hd) = (45, 100, 2, 72);
        let d = heads * hd;
        let p = AttentionParams {
            lq,
            lk,
            heads,
            head_dim: hd,
            scale: 0.125,
            q_stride: d,
            q_offset: 0,
            kv_stride: 2 * d,
            k_offset: 0,
            v_offset: d,
            masked_value: -10000.0,
        };
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        let q: Vec<f32> = (0..lq * d).map(|_| next()).collect();
        let kv: Vec<f32> = (0..lk * 2 * d).map(|_| next()).collect();
        let mask: Vec<f32> = (0..lk).map(|j| f32::from(j % 7 != 3)).collect();
        let at = Attend {
            ops: &GENERIC_ATTENTION,
            p: &p,
            q_src: &q,
            kv_src: &kv,
            key_mask: Some(&mask),
            bias: None,
            keys: visited_keys(lk, Some(&mask)),
        };
        let mut small = vec![f32::NAN; lq * d];
        let mut full = vec![f32::NAN; lq * d];
        attend_small(&at, 0, &mut small);
        for (t, rows) in full.chunks_mut(TASK_ROWS * d).enumerate() {
            attend_full(&at, t * TASK_ROWS, rows);
        }
        // The compact state without the two phases: one step per block and key tile.
        let one_step = AttentionOps {
            phases_small: None,
            ..GENERIC_ATTENTION
        };
        assert!(GENERIC_ATTENTION.phases_small.is_some());
        let mut fused = vec![f32::NAN; lq * d];
        attend_small(
            &Attend {
                ops: &one_step,
                ..at
            },
            0,
            &mut fused,
        );
        assert!(small.iter().all(|x| x.is_finite()));
        for other in [&full, &fused] {
            assert!(small
                .iter()
                .zip(other)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
