//! Quantized `linear` for the 32-element ggml block types on AVX-512 VNNI: weights repacked
//! panel by panel into the `vpdpbusd` layout, activations quantized once per row, exact integer
//! block sums, and the generic kernel's f32 scaling order, so every output is bit-identical to
//! [`edge_kernels::linear`].
//!
//! Method (the layout of tinyBLAS / ggml's repacked CPU kernels, not their code):
//! - Each activation row is quantized with the generic `quantize_activation_row` (`Q8_0` for
//!   `Q8_0`/`Q4_0`/`Q5_0` weights, `Q8_1` for `Q4_1`/`Q5_1`), then its quants are biased to
//!   unsigned, `u = q + 128` (one XOR with 0x80), which `vpdpbusd` needs in its first operand,
//!   and its blocks' f16 scale and sum are stored widened to f32 ([`ACT_BLOCK`]), so the tile
//!   broadcasts them with a load instead of converting them per row and block.
//! - Weights are repacked [`edge_kernels::quant_panel_cols`] columns at a time into scratch:
//!   per group of 16 columns and block, eight k-steps of `16 columns × 4 bytes` of signed
//!   values (the values ggml's generic dot multiplies, [`quant::block32_values`]), then 16 f32
//!   scales, 16 i32 corrections `−128 · Σ w` and 16 f32 minimums. One block-group is 704 bytes.
//! - The integer block sum `Σ u·w − 128·Σ w = Σ q·w` is exact in i32 (|sum| ≤ 32·128·127), as is
//!   its conversion to f32 (< 2²⁴). The f32 terms are then formed and added per block in the
//!   generic order: `Q8_0`, `Q5_0`: `sumf = fma(sumi, dw · da, sumf)` (one `vfmadd`); `Q4_0`:
//!   `sumf + (sumi · dw) · da`; `Q4_1`, `Q5_1`: `sumf + ((dw · da) · sumi + mw · sa)`; `sumf`
//!   starts at 0 and takes the blocks in order, then the bias is added. IEEE multiplication is
//!   commutative, so lane order does not matter.
//! - `Q8_0` weights of a `--target x86_64-avx512` plan ([`PackLayout::Interleaved16x4`]) already
//!   hold the eight k-steps of each 16-row group and block, with the 16 f16 scales before them:
//!   only the scales (widened) and the corrections go to scratch, and the quants are read in
//!   place by calls with few rows or copied (one `memcpy` per block, no transposition) by the
//!   others; the last `n mod 16` rows are row-major and repacked as above.
//! - A register tile is 6 activation rows × 32 columns (12 integer and 12 f32 accumulators);
//!   each k-step loads the two 16-column weight vectors once and broadcasts 4 activation bytes
//!   per row. `Q8_0` panels are packed with gathers, the other types block by block through
//!   [`quant::block32_values`].

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, Ordering};

use edge_kernels::{quant, EpilogueFn, WeightRef, QUANT_PANEL_BLOCK_BYTES};
use edge_schema::plan::PackLayout;
use edge_schema::DType;
use rayon::prelude::*;

use super::vmath::round_half_away16;

/// Columns per zmm group.
const GROUP: usize = 16;
/// Most activation rows of any [`Panel`]'s register tile.
pub(crate) const MAX_R: usize = 16;
/// Most columns of one tile call (two groups of the widest [`Panel`]).
pub(crate) const MAX_COLS: usize = 2 * GROUP;
/// One tile call's results: `res[r][c]` for row `r < Panel::R` and column `c < 2·Panel::GROUP`.
pub(crate) type TileSums = [[f32; MAX_COLS]; MAX_R];
/// Bytes of one block of one 16-column group in the panel.
pub(crate) const GROUP_BLOCK: usize = GROUP * QUANT_PANEL_BLOCK_BYTES;
/// Offsets inside a group block.
pub(crate) const SCALE_AT: usize = 512;
pub(crate) const CORR_AT: usize = 576;
pub(crate) const MIN_AT: usize = 640;
/// Activation rows per register tile.
const R: usize = 6;

/// `out`'s elements, written by tasks that own disjoint columns ([`linear`]'s few-rows path).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: the pointer is only written through `OutPtr::write`, at elements that one task alone
// owns while `out` is exclusively borrowed by `linear`.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// [`Panel::store`] into elements `i .. i + len` of the output.
    ///
    /// # Safety
    /// Elements `i .. i + len` are inside the output and no other thread writes or reads them
    /// meanwhile; `len ≤ 32` and `bias`, if any, holds `len` values. `epilogue` then runs on
    /// the written elements.
    unsafe fn write_sums<P: Panel>(
        self,
        i: usize,
        sums: &[f32; MAX_COLS],
        bias: Option<&[f32]>,
        len: usize,
        epilogue: Option<EpilogueFn>,
    ) {
        // SAFETY: the caller's contract (the elements are this task's alone).
        let dst = unsafe { std::slice::from_raw_parts_mut(self.0.add(i), len) };
        P::store(dst, sums, bias);
        if let Some(e) = epilogue {
            e(dst);
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn store_sums_impl(
    dst: *mut f32,
    sums: &[f32; MAX_COLS],
    bias: Option<*const f32>,
    len: usize,
) {
    for lo in (0..len).step_by(GROUP) {
        let m = super::vmath::mask((len - lo).min(GROUP));
        // SAFETY: the caller's bounds: lanes `lo .. lo + 16` of `sums`, masked to `len`
        // elements of `dst` and `bias`.
        unsafe {
            let mut v = _mm512_loadu_ps(sums.as_ptr().add(lo));
            if let Some(b) = bias {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b.add(lo)));
            }
            _mm512_mask_storeu_ps(dst.add(lo), m, v);
        }
    }
}

/// Blocks ahead of the packing that each weight row is prefetched (816 bytes: the T5-XXL encode
/// of a 16-token prompt, weights from DRAM, measured 0.54 s at 8, 0.37–0.39 s at 16–32, 0.44–0.55
/// s at 48).
const PREFETCH_BLOCKS: usize = 24;

/// How the f32 term of a block is formed (the generic `vec_dot` of each type).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scaling {
    /// `sumf = fma(sumi, dw · da, sumf)` (`Q8_0`, `Q5_0`).
    SumiTimesScales,
    /// `(sumi · dw) · da` (`Q4_0`).
    SumiThenScales,
    /// `(dw · da) · sumi + mw · sa` (`Q4_1`, `Q5_1`).
    WithMin,
}

pub(crate) fn scaling(d: DType) -> Option<Scaling> {
    match d {
        DType::Q8_0 | DType::Q5_0 => Some(Scaling::SumiTimesScales),
        DType::Q4_0 => Some(Scaling::SumiThenScales),
        DType::Q4_1 | DType::Q5_1 => Some(Scaling::WithMin),
        _ => None,
    }
}

/// What the panel driver [`linear`] needs from one ISA's quantized tile: the VNNI kernel of
/// this file ([`Vnni`]) and the AVX2 one (`super::qgemm_avx2::Avx2`). Both read the same
/// widened activation blocks ([`ACT_BLOCK`] bytes: f32 scale, f32 sum, 32 quants, biased or
/// not as the tile needs) and slots of repacked weight groups, and give the generic kernel's
/// bits.
pub(crate) trait Panel {
    /// Columns per group (one register of integer sums per activation row).
    const GROUP: usize;
    /// Bytes of one block of one group in a scratch slot (at most
    /// `GROUP · QUANT_PANEL_BLOCK_BYTES`, what the planner reserved per column and block).
    const GROUP_BLOCK: usize;
    /// Activation rows per register tile (at most [`MAX_R`]).
    const R: usize;
    /// Whether `Q8_0` weights in [`PackLayout::Interleaved16x4`] are served (VNNI only).
    const INTERLEAVED16X4: bool;
    /// Whether this tile serves `Q8_0` weights in [`PackLayout::Interleaved8x4A7`] (with 7-bit
    /// activations) and nothing else (`super::qgemm_avx2::Avx2A7`).
    const A7: bool = false;
    /// Quantizes one activation row `x` (`[k]`) for weights of type `w` into `dst` (`k / 32`
    /// widened blocks), the generic quantizer's values.
    fn quantize_row(w: DType, x: &[f32], dst: &mut [u8]);
    /// Fills the scratch slot `dst` (`nb` group blocks) of the group of columns
    /// `j0 .. j0 + GROUP` (zeros past `n`).
    fn prepare_group(
        w: WeightRef<'_>,
        wrow: usize,
        bb: usize,
        n: usize,
        j0: usize,
        in_place: bool,
        dst: &mut [u8],
    );
    /// Where group `g` of a panel starting at column `p0` takes its operands from: by default
    /// its scratch slot ([`GroupSrc::in_slot`]).
    fn group_src<'a>(
        _w: &WeightRef<'a>,
        _n: usize,
        panel: &'a [u8],
        g: usize,
        _p0: usize,
        nb: usize,
        _in_place: bool,
    ) -> GroupSrc<'a> {
        GroupSrc::in_slot(panel, g, nb, Self::GROUP_BLOCK)
    }
    /// `dst[c] = sums[c] + bias[c]` (or `sums[c]` without bias) for `c < dst.len() ≤
    /// MAX_COLS`: the generic kernel's final addition.
    fn store(dst: &mut [f32], sums: &[f32; MAX_COLS], bias: Option<&[f32]>) {
        assert!(dst.len() <= MAX_COLS && bias.is_none_or(|b| b.len() == dst.len()));
        for (c, d) in dst.iter_mut().enumerate() {
            *d = bias.map_or(sums[c], |b| sums[c] + b[c]);
        }
    }
    /// `res[r][c]` = the block-summed dot product of activation row `acts[r]` (`r < R`) with
    /// column `c` of the groups `srcs` (one or two) of weights of type `w`.
    fn tile(
        w: DType,
        kind: Scaling,
        acts: &[&[u8]; MAX_R],
        srcs: &[GroupSrc<'_>],
        nb: usize,
        res: &mut TileSums,
    );
}

/// The AVX-512 VNNI tile of this file: 16-column groups, 6 rows, quants biased to unsigned.
pub(crate) struct Vnni;

impl Panel for Vnni {
    const GROUP: usize = GROUP;
    const GROUP_BLOCK: usize = GROUP_BLOCK;
    const R: usize = R;
    const INTERLEAVED16X4: bool = true;

    fn quantize_row(w: DType, x: &[f32], dst: &mut [u8]) {
        quantize_row_avx512::<0x80, false>(w, x, dst)
    }

    /// The slot's scales, corrections and minimums, and — unless the quants are read
    /// `in_place` from [`PackLayout::Interleaved16x4`] weights ([`plan_group`]) — its quants,
    /// repacked from row-major weights or copied from `Interleaved16x4` ones.
    fn prepare_group(
        w: WeightRef<'_>,
        wrow: usize,
        bb: usize,
        n: usize,
        j0: usize,
        in_place: bool,
        dst: &mut [u8],
    ) {
        prepare_group_slot::<true>(w, wrow, bb, n, j0, in_place, dst)
    }

    /// Quants read `in_place` from the plan's [`PackLayout::Interleaved16x4`] weights for whole
    /// groups ([`plan_group`]), from the slot otherwise. In place pays with few activation rows
    /// (each group's quants are read by few row tiles: the T5 encode of a prompt, 0.83 → 0.60 s
    /// measured); with many, the tile measured about 10 % slower reading the mapped weights than
    /// its scratch copy, so those calls copy.
    fn group_src<'a>(
        w: &WeightRef<'a>,
        n: usize,
        panel: &'a [u8],
        g: usize,
        p0: usize,
        nb: usize,
        in_place: bool,
    ) -> GroupSrc<'a> {
        let slot = GroupSrc::in_slot(panel, g, nb, GROUP_BLOCK);
        match in_place
            .then(|| plan_group(w, n, p0 + g * GROUP, nb))
            .flatten()
        {
            Some(src) => GroupSrc {
                quants: &src[32..],
                qstride: PLAN_GROUP_BLOCK,
                ..slot
            },
            None => slot,
        }
    }

    /// 16 lanes at a time.
    fn store(dst: &mut [f32], sums: &[f32; MAX_COLS], bias: Option<&[f32]>) {
        let len = dst.len();
        assert!(len <= MAX_COLS && bias.is_none_or(|b| b.len() == len));
        // SAFETY: AVX-512F is present (the table holding this kernel requires it); the masked
        // loads and stores stay below `len` in `dst` and `bias`, and `sums` holds 32 f32.
        unsafe { store_sums_impl(dst.as_mut_ptr(), sums, bias.map(|b| b.as_ptr()), len) }
    }

    fn tile(
        _w: DType,
        kind: Scaling,
        acts: &[&[u8]; MAX_R],
        srcs: &[GroupSrc<'_>],
        nb: usize,
        res: &mut TileSums,
    ) {
        tile(kind, acts, ACT_BLOCK, ACT_QUANTS_AT, srcs, nb, res)
    }
}

/// [`Vnni::prepare_group`], and with `CORR = false` the same slot without the corrections
/// `−128 · Σ w` of [`PackLayout::Interleaved16x4`] groups (the AMX tile multiplies signed by
/// signed and never reads them; their `vpdpbusd` sums took a third of the slot's preparation).
#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare_group_slot<const CORR: bool>(
    w: WeightRef<'_>,
    wrow: usize,
    bb: usize,
    n: usize,
    j0: usize,
    in_place: bool,
    dst: &mut [u8],
) {
    let nb = dst.len() / GROUP_BLOCK;
    match plan_group(&w, n, j0, nb) {
        // SAFETY: AVX-512F/BW/VNNI were detected before this kernel was put in a table; `src`
        // holds `nb` plan group blocks and `dst` `nb` slots.
        Some(src) => unsafe { meta_group_q8_0::<CORR>(src, dst, !in_place) },
        None => pack_group(w, wrow, bb, n, j0, dst),
    }
}

/// Whether [`linear`] with `P`'s tile handles weights of this type in this layout (row-major
/// 32-element block types, and `Interleaved16x4` `Q8_0` where `P` reads it); the caller
/// forwards every other case to the generic kernel.
pub(crate) fn handles<P: Panel>(w: &WeightRef<'_>, m: usize, k: usize) -> bool {
    let layout_ok = match w.layout {
        PackLayout::RowMajor => !P::A7,
        PackLayout::Interleaved16x4 => P::INTERLEAVED16X4 && w.dtype == DType::Q8_0,
        PackLayout::Interleaved8x4A7 => P::A7 && w.dtype == DType::Q8_0,
        PackLayout::Interleaved4x8 | PackLayout::Bf16Pairs16 => false,
    };
    // Few rows are left to the generic kernel when the weights must be repacked at run time;
    // in place, the tile's clamped rows cost less than the generic dot products (which gather
    // the blocks of a plan layout one by one).
    let rows_ok = m >= P::R || (w.layout != PackLayout::RowMajor && m >= 1);
    scaling(w.dtype).is_some() && layout_ok && rows_ok && k >= 32
}

/// Where one group's operands come from: its quants (`qstride` bytes from block to block, the
/// eight k-steps of a block contiguous) and its per-block f32 scales (and, for VNNI, i32
/// corrections) and f32 minimums (`meta`, `Panel::GROUP_BLOCK` bytes per block).
#[derive(Clone, Copy)]
pub(crate) struct GroupSrc<'a> {
    pub(crate) quants: &'a [u8],
    pub(crate) qstride: usize,
    pub(crate) meta: &'a [u8],
}

impl<'a> GroupSrc<'a> {
    /// Group `g`'s scratch slot of `panel` (`nb` blocks of `group_block` bytes per group), for
    /// the quants and the meta both.
    pub(crate) fn in_slot(panel: &'a [u8], g: usize, nb: usize, group_block: usize) -> Self {
        let slot = &panel[g * nb * group_block..(g + 1) * nb * group_block];
        GroupSrc {
            quants: slot,
            qstride: group_block,
            meta: slot,
        }
    }
}

/// Bytes per block of one group of [`PackLayout::Interleaved16x4`] (16 f16 scales, 512 quants).
const PLAN_GROUP_BLOCK: usize = 32 + 512;

/// The plan bytes (`nb` blocks of [`PLAN_GROUP_BLOCK`]) of the 16-column group starting at
/// column `j0` when `w` is in [`PackLayout::Interleaved16x4`] and the group is whole (the last
/// `n mod 16` rows are row-major); `None` otherwise.
fn plan_group<'a>(w: &WeightRef<'a>, n: usize, j0: usize, nb: usize) -> Option<&'a [u8]> {
    (w.layout == PackLayout::Interleaved16x4 && j0 + GROUP <= n / GROUP * GROUP).then(|| {
        let start = j0 / GROUP * nb * PLAN_GROUP_BLOCK;
        &w.bytes[start..start + nb * PLAN_GROUP_BLOCK]
    })
}

/// The `linear` slot for `handles()` cases, after `edge_kernels::contract::linear` passed.
///
/// Callers guarantee AVX-512F, AVX-512BW and AVX-512 VNNI (checked when the table was built).
/// `epilogue` runs on each row's columns of a pair of groups (few rows) or of a panel (many
/// rows) as soon as a row tile has written them, while they are in cache.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear<P: Panel>(
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
    let Some(kind) = scaling(w.dtype) else {
        unreachable!("qgemm::linear called for {:?}", w.dtype)
    };
    let nb = k / 32;
    let bb = wrow / nb;
    // Widened activation blocks (`QUANT_ACT_BLOCK_BYTES`): f32 scale, f32 sum, 32 quants.
    let arow = nb * ACT_BLOCK;
    let (group, group_block, rt) = (P::GROUP, P::GROUP_BLOCK, P::R);
    let (act_len, panel_len) = edge_kernels::quant_scratch_layout(w.dtype, m, k);
    let (acts, rest) = scratch.split_at_mut(act_len);
    let panel = &mut rest[..panel_len];
    let acts = &mut acts[..m * arow];
    acts.par_chunks_mut(arow)
        .zip(x.par_chunks(k))
        .for_each(|(dst, src)| P::quantize_row(w.dtype, src, dst));
    let acts = &*acts;
    if m <= 8 * rt {
        // Few rows (a prompt's tokens): each worker owns a slot of two groups in the panel
        // scratch and takes the next pair of column groups not yet taken, packs it and runs
        // every row tile over it, so the panel is used while it is in cache, the work splits
        // evenly and a call forks once (a fork-join per panel of columns cost the T5 encode
        // its threads' wake-ups: BENCHMARKS.md, "one fork per call"). Each pair's columns are
        // written by the worker that took it alone; which worker that is changes no bit.
        let pair_bytes = 2 * nb * group_block;
        let pairs = n.div_ceil(2 * group);
        let slots = (panel.len() / pair_bytes)
            .min(rayon::current_num_threads())
            .min(pairs);
        assert!(slots > 0, "qgemm: scratch holds no pair of column groups");
        let next = AtomicUsize::new(0);
        let dst = OutPtr(out.as_mut_ptr());
        panel[..slots * pair_bytes]
            .par_chunks_exact_mut(pair_bytes)
            .for_each(|slot| loop {
                let pi = next.fetch_add(1, Ordering::Relaxed);
                if pi >= pairs {
                    break;
                }
                let j0 = pi * 2 * group;
                let pair = (n - j0).div_ceil(group).min(2);
                let valid = (n - j0).min(pair * group);
                let pg = &mut slot[..pair * nb * group_block];
                for (g, gdst) in pg.chunks_mut(nb * group_block).enumerate() {
                    P::prepare_group(w, wrow, bb, n, j0 + g * group, true, gdst);
                }
                let pg = &*pg;
                let srcs: [GroupSrc<'_>; 2] =
                    std::array::from_fn(|g| P::group_src(&w, n, pg, g.min(pair - 1), j0, nb, true));
                let mut res: TileSums = [[0f32; MAX_COLS]; MAX_R];
                for r0 in (0..m).step_by(rt) {
                    let ap: [&[u8]; MAX_R] = std::array::from_fn(|r| {
                        let i = (r0 + r).min(m - 1);
                        &acts[i * arow..(i + 1) * arow]
                    });
                    P::tile(w.dtype, kind, &ap, &srcs[..pair], nb, &mut res);
                    for (r, row) in res.iter().enumerate().take(rt.min(m - r0)) {
                        let b = bias.map(|b| &b[j0..j0 + valid]);
                        // SAFETY: `(r0 + r)·n + j0 + valid ≤ m·n = out.len()` (`r0 + r < m`,
                        // `j0 + valid ≤ n`), and the columns `j0 .. j0 + valid` belong to the
                        // worker that took this pair alone (each pair is taken once), so no
                        // two workers write the same element and nothing reads `out`.
                        unsafe { dst.write_sums::<P>((r0 + r) * n + j0, row, b, valid, epilogue) };
                    }
                }
            });
        return;
    }
    // Tasks of at most 4 register tiles: each walks the whole panel once per tile whatever its
    // size, so smaller tasks lose no reuse and even out the workers' shares at the panel's join
    // (10 tiles: 18 tasks for 1024 rows; 4: 43, 1.02-1.05x in an in-process A/B on Zen 5).
    let rows_per_task = (m / 8).next_multiple_of(rt).clamp(rt, 4 * rt);
    let pcols = many_rows_panel_cols(k);
    for p0 in (0..n).step_by(pcols) {
        let ncols = pcols.min(n - p0);
        let groups = ncols.div_ceil(group);
        let panel = &mut panel[..groups * nb * group_block];
        panel
            .par_chunks_mut(nb * group_block)
            .enumerate()
            .for_each(|(g, dst)| P::prepare_group(w, wrow, bb, n, p0 + g * group, false, dst));
        let panel = &*panel;
        out.par_chunks_mut(rows_per_task * n)
            .enumerate()
            .for_each(|(t, rows_out)| {
                let i0 = t * rows_per_task;
                let rows = rows_out.len() / n;
                let mut res: TileSums = [[0f32; MAX_COLS]; MAX_R];
                for r0 in (0..rows).step_by(rt) {
                    let ap: [&[u8]; MAX_R] = std::array::from_fn(|r| {
                        let i = i0 + (r0 + r).min(rows - 1);
                        &acts[i * arow..(i + 1) * arow]
                    });
                    for g0 in (0..groups).step_by(2) {
                        let pair = (groups - g0).min(2);
                        let srcs: [GroupSrc<'_>; 2] = std::array::from_fn(|g| {
                            P::group_src(&w, n, panel, g0 + g.min(pair - 1), p0, nb, false)
                        });
                        P::tile(w.dtype, kind, &ap, &srcs[..pair], nb, &mut res);
                        for r in 0..rt.min(rows - r0) {
                            let base = (r0 + r) * n + p0 + g0 * group;
                            let valid = (ncols - g0 * group).min(pair * group);
                            let j0 = p0 + g0 * group;
                            P::store(
                                &mut rows_out[base..base + valid],
                                &res[r],
                                bias.map(|b| &b[j0..j0 + valid]),
                            );
                        }
                    }
                    if let Some(e) = epilogue {
                        for r in 0..rt.min(rows - r0) {
                            e(&mut rows_out[(r0 + r) * n + p0..][..ncols]);
                        }
                    }
                }
            });
    }
}

/// Most bytes of the repacked panel that [`linear`]'s many-row path packs at a time: its
/// tasks walk the whole panel once per register tile of rows, so a panel within a core's L2
/// (1 MiB on Zen 4 and Zen 5) is read from there rather than from the last-level cache. The
/// scratch ([`edge_kernels::quant_panel_bytes`]) stays sized for [`edge_kernels::quant_panel_cols`], whose
/// larger panels give the few-rows path one slot per worker.
const MANY_ROWS_PANEL_BYTES: usize = 1 << 20;

/// Columns per panel of [`linear`]'s many-row path: [`edge_kernels::quant_panel_cols`]'s rule within
/// [`MANY_ROWS_PANEL_BYTES`] ([`edge_kernels::quant_panel_cols_within`]). Only `k` ≥ 2048 is affected (`k = 1152` already takes 512 columns, 811 KB). Same bits
/// for any panel width: each output's blocks are summed in order within one tile call. PixArt's
/// `k = 4608` products (the MLP's second): 320 → 128 columns, 1.10× as fast on Zen 5
/// (in-process A/B, BENCHMARKS.md).
fn many_rows_panel_cols(k: usize) -> usize {
    edge_kernels::quant_panel_cols_within(k, MANY_ROWS_PANEL_BYTES)
}

/// One activation row quantized for the AVX-512 tiles (AVX-512F/BW present: they sit only in
/// tables that require them): [`quantize_q8_0_wide`] for `Q8_0` activations,
/// [`widen_activation_row`] otherwise, each quant XORed with `FLIP` (0x80 for `vpdpbusd`'s
/// unsigned operand, 0 for AMX's signed one), in the [`act_offsets`] layout `SPLIT`. `dst`
/// holds `x.len() / 32` widened blocks.
pub(crate) fn quantize_row_avx512<const FLIP: u8, const SPLIT: bool>(
    w: DType,
    x: &[f32],
    dst: &mut [u8],
) {
    if quant::activation_type(w) == quant::ActFormat::Q8_0 {
        // SAFETY: AVX-512F/BW were detected before the calling tile was put in a table; `dst`
        // holds `k / 32` blocks of ACT_BLOCK bytes for the `k` values of `x` (the activation
        // region of `quant_scratch_layout`).
        unsafe { quantize_q8_0_wide::<FLIP, SPLIT>(x, dst) };
        return;
    }
    widen_activation_row::<SPLIT>(w, x, dst, FLIP);
}

/// Where a widened activation row of `nb` blocks keeps block `b`'s head (its f32 scale and
/// sum, 8 bytes) and its 32 quants: interleaved, [`ACT_BLOCK`] bytes per block, head then
/// quants (the VNNI and AVX2 tiles), or `SPLIT`, every head and then every block's quants
/// (the AMX tile: with rows starting on 32-byte boundaries — the arena's 64-byte scratch and
/// `k` a multiple of 128, every PixArt and T5 width — a block's quants then never cross a cache
/// line, and a `tileloadd` row across two lines costs 16 instead of 6 ticks: `amxprobe`).
/// Returns the two byte offsets.
#[inline]
pub(crate) fn act_offsets<const SPLIT: bool>(nb: usize, b: usize) -> (usize, usize) {
    if SPLIT {
        (8 * b, 8 * nb + 32 * b)
    } else {
        (b * ACT_BLOCK, b * ACT_BLOCK + ACT_QUANTS_AT)
    }
}

/// Bytes of one widened activation block ([`edge_kernels::QUANT_ACT_BLOCK_BYTES`]): the
/// block's f16 scale `d` widened to f32 at 0, its f16 sum `s` (`Q8_1`; 0 for `Q8_0`) widened at
/// 4, then the 32 quants biased to unsigned (`q ^ 0x80`) at [`ACT_QUANTS_AT`]. Widening is
/// exact, so the tile's f32 terms are the generic ones; a scale is then one broadcast load
/// (the f16 conversion took two of the tile's vector operations per row and block).
pub(crate) const ACT_BLOCK: usize = edge_kernels::QUANT_ACT_BLOCK_BYTES;
/// Offset of the quants in a widened activation block.
pub(crate) const ACT_QUANTS_AT: usize = 8;

/// One row of `x` quantized as the generic [`quant::quantize_activation_row`] does for weights
/// of type `w` (ggml's `Q8_0` or `Q8_1` blocks), block by block, and stored widened
/// ([`ACT_BLOCK`] bytes per block, in the [`act_offsets`] layout `SPLIT`) in `dst`, each quant
/// XORed with `flip` (0x80: biased to unsigned for `vpdpbusd`; 0: signed).
pub(crate) fn widen_activation_row<const SPLIT: bool>(
    w: DType,
    x: &[f32],
    dst: &mut [u8],
    flip: u8,
) {
    assert!(dst.len() == x.len() / 32 * ACT_BLOCK);
    let nb = x.len() / 32;
    for (b, v) in x.chunks_exact(32).enumerate() {
        widen_block(w, v, dst, act_offsets::<SPLIT>(nb, b), flip);
    }
}

/// [`widen_activation_row`] for one block `v` of 32 values: its head at `at.0` and its quants at
/// `at.1` in `dst`.
fn widen_block(w: DType, v: &[f32], dst: &mut [u8], at: (usize, usize), flip: u8) {
    let ggml = quant::activation_row_bytes(w, 32);
    assert!((34..=36).contains(&ggml));
    let mut blk = [0u8; 36];
    quant::quantize_activation_row(w, v, &mut blk[..ggml]);
    let s = (ggml == 36).then(|| u16::from_le_bytes([blk[2], blk[3]]));
    put_scales(
        &mut dst[at.0..at.0 + 8],
        u16::from_le_bytes([blk[0], blk[1]]),
        s,
    );
    for (o, &q) in dst[at.1..at.1 + 32].iter_mut().zip(&blk[ggml - 32..ggml]) {
        *o = q ^ flip;
    }
}

/// Writes a widened block's head: the f16 scale `d` and sum `s` (0 without one) as f32.
pub(crate) fn put_scales(out: &mut [u8], d: u16, s: Option<u16>) {
    let s = s.map_or(0.0, quant::fp16_to_fp32);
    out[..4].copy_from_slice(&quant::fp16_to_fp32(d).to_le_bytes());
    out[4..ACT_QUANTS_AT].copy_from_slice(&s.to_le_bytes());
}

/// f32 elements ahead of the current block that [`quantize_q8_0_wide`] prefetches (1 KiB: its
/// activations stream from L3 or memory, block by block; 2 and 4 KiB measured no better:
/// BENCHMARKS.md, "the Q8_0 activation quantizer's prefetch").
const PF_AHEAD: usize = 256;

/// ggml's `quantize_row_q8_0_ref` (the generic [`quant::quantize_activation_row`] for `Q8_0`),
/// 32 values per block in two zmm, stored widened ([`ACT_BLOCK`]: the f16 scale's f32 value,
/// 0, the quants biased to unsigned, `q ^ 0x80 = q + 128`, as the VNNI tile reads them):
/// `amax` of `|x|` (a maximum: order-free without NaN), `d = amax / 127`, `id = 1/d` (0 for
/// `d = 0`) and the f16 scale in the generic scalar code, `round(x·id)` half away from zero by
/// [`round_half_away16`] (exact; it replaced `t + (|x·id − t| ≥ ½ ? ±1 : 0)` with `t =
/// trunc(x·id)`, 5 vector operations fewer per 16 values: a 1024 × 4608 × 16 product, mostly
/// this quantizer, ran 1.10× as fast on one thread, in-process A/B on Zen 5). A block holding
/// NaN or ±∞ takes the generic scalar path ([`widen_activation_row`]: its fold and `as i8`
/// saturation).
///
/// # Safety
/// AVX-512F and BW present; `dst.len() == src.len() / 32 · ACT_BLOCK`, `src.len()` a multiple
/// of 32.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_q8_0_wide<const FLIP: u8, const SPLIT: bool>(src: &[f32], dst: &mut [u8]) {
    assert!(src.len().is_multiple_of(32) && dst.len() == src.len() / 32 * ACT_BLOCK);
    let nb = src.len() / 32;
    let sign = _mm512_set1_epi32(i32::MIN);
    for (bi, x) in src.chunks_exact(32).enumerate() {
        let (head, quants) = act_offsets::<SPLIT>(nb, bi);
        // A hint (`prefetcht0` never faults, even past the row's end) for the blocks to come.
        let ahead = x.as_ptr().wrapping_add(PF_AHEAD) as *const i8;
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        // SAFETY: `x` holds 32 f32.
        let (v0, v1) = unsafe {
            (
                _mm512_loadu_ps(x.as_ptr()),
                _mm512_loadu_ps(x.as_ptr().add(16)),
            )
        };
        let abs =
            |v: __m512| _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(v)));
        let (a0, a1) = (abs(v0), abs(v1));
        let inf = _mm512_set1_ps(f32::INFINITY);
        // Not finite: NaN (unordered) or |x| = ∞.
        let bad =
            _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a0, inf) | _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a1, inf);
        if bad != 0 {
            widen_block(DType::Q8_0, x, dst, (head, quants), FLIP);
            continue;
        }
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_scales(&mut dst[head..head + 8], quant::fp32_to_fp16(d), None);
        let idv = _mm512_set1_ps(id);
        // `roundf(x·id)`, half away from zero (|x·id| ≤ 127), then biased by `FLIP`.
        let flip = _mm512_set1_epi32(i32::from(FLIP));
        let round = |v: __m512| _mm512_xor_si512(round_half_away16(_mm512_mul_ps(v, idv)), flip);
        let (q0, q1) = (round(v0), round(v1));
        let q = &mut dst[quants..quants + 32];
        // SAFETY: the block's 32 quant bytes (`q`, bounds-checked above): two stores of 16.
        unsafe {
            _mm_storeu_si128(q.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(
                q.as_mut_ptr().add(16) as *mut __m128i,
                _mm512_cvtepi32_epi8(q1),
            );
        }
    }
}

/// Repacks columns `j0..j0 + 16` (zeros past `n`) of the row-major weight into `dst`
/// (`nb` group blocks of [`GROUP_BLOCK`] bytes).
fn pack_group(w: WeightRef<'_>, wrow: usize, bb: usize, n: usize, j0: usize, dst: &mut [u8]) {
    if w.dtype == DType::Q8_0 {
        assert!(dst.len().is_multiple_of(GROUP_BLOCK) && w.bytes.len() == n * wrow);
        // SAFETY: the table holding this kernel was built only after AVX-512F/BW/VNNI were
        // detected (`crate::x86_64::avx512_vnni_table`); the loads read only columns `j < n`
        // of blocks `b < dst.len() / GROUP_BLOCK ≤ wrow / 34` (asserted above and by the
        // caller's `contract::linear`), i.e. inside `w.bytes`.
        return unsafe { pack_group_q8_0(w.bytes, wrow, n, j0, dst) };
    }
    pack_group_values(
        w,
        wrow,
        bb,
        n,
        j0,
        GROUP,
        GROUP_BLOCK,
        dst,
        |gb, c, v, d, mn| {
            let sum: i32 = v.iter().map(|&q| i32::from(q)).sum();
            gb[SCALE_AT + 4 * c..][..4].copy_from_slice(&d.to_le_bytes());
            gb[CORR_AT + 4 * c..][..4].copy_from_slice(&(-128 * sum).to_le_bytes());
            gb[MIN_AT + 4 * c..][..4].copy_from_slice(&mn.to_le_bytes());
        },
    );
}

/// The portable repacking of a group of `group` columns `j0 ..` (zeros past `n`) of row-major
/// 32-element block weights into `dst` (`group_block` bytes per block): per block, the values
/// [`quant::block32_values`] gives, in eight k-steps of `group` columns × 4 bytes, and
/// `meta(group_block_bytes, c, values, d, m)` for the per-column rest of the block.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_group_values(
    w: WeightRef<'_>,
    wrow: usize,
    bb: usize,
    n: usize,
    j0: usize,
    group: usize,
    group_block: usize,
    dst: &mut [u8],
    mut meta: impl FnMut(&mut [u8], usize, &[i8; 32], f32, f32),
) {
    for (b, gb) in dst.chunks_exact_mut(group_block).enumerate() {
        for c in 0..group {
            let j = j0 + c;
            let (v, d, mn) = if j < n {
                quant::block32_values(w.dtype, &w.bytes[j * wrow + b * bb..][..bb])
            } else {
                ([0i8; 32], 0.0, 0.0)
            };
            for s in 0..8 {
                for e in 0..4 {
                    gb[(s * group + c) * 4 + e] = v[s * 4 + e] as u8;
                }
            }
            meta(gb, c, &v, d, mn);
        }
    }
}

/// Where dword `s` (bytes `4s..4s + 4` of the quants) of column `c` lies after `stage` steps of
/// the 16 × 8 dword transpose in [`pack_group_q8_0`], as (register, lane). Stage 0: column pairs
/// in registers (`c / 2`), lane `8·(c mod 2) + s`; stages 1–3 each exchange one register bit
/// (the column's bits 3, 2, 1) with a bit of the step `s`, so that after stage 3 register `s`
/// holds the 16 columns in lanes. Each stage is one two-source permute per output register.
const fn transpose_place(stage: usize, c: usize, s: usize) -> (usize, usize) {
    let (c0, c1, c2, c3) = (c & 1, (c >> 1) & 1, (c >> 2) & 1, (c >> 3) & 1);
    let (s0, s1, s2) = (s & 1, (s >> 1) & 1, (s >> 2) & 1);
    match stage {
        0 => (c >> 1, (c0 << 3) | s),
        1 => (
            (s2 << 2) | (c2 << 1) | c1,
            (c0 << 3) | (c3 << 2) | (s1 << 1) | s0,
        ),
        2 => (
            (s2 << 2) | (s1 << 1) | c1,
            (c0 << 3) | (c3 << 2) | (c2 << 1) | s0,
        ),
        _ => (s, c),
    }
}

/// The `vpermt2d` lane indices of output register `reg` of transpose stage `stage` (1–3): lane
/// `l` takes lane `i` of the input register whose exchanged bit is 0 (index `i`) or of the one
/// whose bit is 1 (index `16 + i`).
const fn transpose_index(stage: usize, reg: usize) -> [u32; 16] {
    let bit = 1 << (3 - stage);
    let mut idx = [0u32; 16];
    let mut c = 0;
    while c < 16 {
        let mut s = 0;
        while s < 8 {
            let (r, l) = transpose_place(stage, c, s);
            if r == reg {
                let (r0, l0) = transpose_place(stage - 1, c, s);
                idx[l] = (l0 + if r0 & bit != 0 { 16 } else { 0 }) as u32;
            }
            s += 1;
        }
        c += 1;
    }
    idx
}

/// [`transpose_index`] for every stage and output register.
const TRANSPOSE: [[[u32; 16]; 8]; 3] = {
    let mut t = [[[0u32; 16]; 8]; 3];
    let mut st = 0;
    while st < 3 {
        let mut r = 0;
        while r < 8 {
            t[st][r] = transpose_index(st + 1, r);
            r += 1;
        }
        st += 1;
    }
    t
};

/// [`pack_group`] for `Q8_0` (34-byte blocks: f16 scale, 32 quants): per block, the 32 quant
/// bytes of each of the 16 columns are loaded whole (two columns per zmm) and transposed as a
/// 16 × 8 matrix of 4-byte words in three stages of two-source permutes ([`TRANSPOSE`]), which
/// gives the eight k-steps `16 columns × 4 bytes`; the column sums are `vpdpbusd` of those
/// words with bytes of 1; the 16 f16 scales are widened with `vcvtph2ps`. Columns `≥ n` are
/// zero, as in [`pack_group`]. The same bytes as [`quant::block32_values`] gives (tested through
/// the twins). (Gathering the words was 2–3× slower: each gather touches 16 rows.)
///
/// # Safety
/// AVX-512F, BW and VNNI must be present; `bytes` holds `n` rows of `wrow` bytes and `dst`
/// at most `wrow / 34` group blocks; `j0 < n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn pack_group_q8_0(bytes: &[u8], wrow: usize, n: usize, j0: usize, dst: &mut [u8]) {
    let valid = n.saturating_sub(j0).min(GROUP);
    // SAFETY: `j0 < n`, so row `j0` starts inside `bytes` (pointer arithmetic only).
    let base = unsafe { bytes.as_ptr().add(j0 * wrow) };
    let ones = _mm512_set1_epi8(1);
    let mut index = [[_mm512_setzero_si512(); 8]; 3];
    for (st, regs) in index.iter_mut().enumerate() {
        for (r, x) in regs.iter_mut().enumerate() {
            // SAFETY: each row of `TRANSPOSE` holds 16 u32.
            *x = unsafe { _mm512_loadu_si512(TRANSPOSE[st][r].as_ptr() as *const __m512i) };
        }
    }
    for (b, gb) in dst.chunks_exact_mut(GROUP_BLOCK).enumerate() {
        let mut scales = [0u16; GROUP];
        let mut rows = [_mm256_setzero_si256(); GROUP];
        for c in 0..valid {
            // SAFETY: column `j0 + c < n`, block `b < wrow / 34`: bytes `b·34 .. b·34 + 34` of
            // its row lie inside `bytes`.
            unsafe {
                let blk = base.add(c * wrow + b * 34);
                scales[c] = u16::from_le_bytes([*blk, *blk.add(1)]);
                rows[c] = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            }
            // A hint only (no access happens): the same row PREFETCH_BLOCKS blocks on, since
            // the hardware prefetchers do not follow 16 rows at once.
            _mm_prefetch::<_MM_HINT_T0>(
                base.wrapping_add(c * wrow + (b + PREFETCH_BLOCKS) * 34) as *const i8
            );
        }
        let mut v = [_mm512_setzero_si512(); 8];
        for (p, x) in v.iter_mut().enumerate() {
            *x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(rows[2 * p]), rows[2 * p + 1]);
        }
        for (st, idx) in index.iter().enumerate() {
            let bit = 1 << (2 - st);
            let mut next = [_mm512_setzero_si512(); 8];
            for (r, x) in next.iter_mut().enumerate() {
                *x = _mm512_permutex2var_epi32(v[r & !bit], idx[r], v[r | bit]);
            }
            v = next;
        }
        let mut sum = _mm512_setzero_si512();
        for (s, words) in v.iter().enumerate() {
            sum = _mm512_dpbusd_epi32(sum, ones, *words);
            // SAFETY: `gb` holds GROUP_BLOCK bytes; the store covers bytes `64s .. 64s + 64`.
            unsafe { _mm512_storeu_si512(gb.as_mut_ptr().add(s * 64) as *mut __m512i, *words) };
        }
        // SAFETY: `scales` holds 16 u16.
        let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(scales.as_ptr() as *const __m256i) });
        let corr = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum));
        // SAFETY: the three 64-byte stores lie at SCALE_AT, CORR_AT, MIN_AT < GROUP_BLOCK.
        unsafe {
            _mm512_storeu_ps(gb.as_mut_ptr().add(SCALE_AT) as *mut f32, d);
            _mm512_storeu_si512(gb.as_mut_ptr().add(CORR_AT) as *mut __m512i, corr);
            _mm512_storeu_ps(gb.as_mut_ptr().add(MIN_AT) as *mut f32, _mm512_setzero_ps());
        }
    }
}

/// The scratch slot of a group of [`PackLayout::Interleaved16x4`] weights (`src`: `nb` plan
/// group blocks of 16 f16 scales and eight 64-byte quant steps): per block the 16 scales
/// widened with `vcvtph2ps` (exact), with `CORR` the corrections `−128 · Σ w` of each column
/// (`vpdpbusd` of the steps with bytes of 1; without, those bytes are not written) and, with
/// `copy`, the quant steps themselves: the same bytes [`pack_group_q8_0`] writes, without its
/// transposition.
///
/// # Safety
/// AVX-512F, BW and VNNI must be present; `src.len() == nb · PLAN_GROUP_BLOCK` and
/// `dst.len() == nb · GROUP_BLOCK`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn meta_group_q8_0<const CORR: bool>(src: &[u8], dst: &mut [u8], copy: bool) {
    let nb = dst.len() / GROUP_BLOCK;
    assert!(src.len() == nb * PLAN_GROUP_BLOCK && dst.len() == nb * GROUP_BLOCK);
    let ones = _mm512_set1_epi8(1);
    for (blk, gb) in src
        .chunks_exact(PLAN_GROUP_BLOCK)
        .zip(dst.chunks_exact_mut(GROUP_BLOCK))
    {
        // SAFETY: `blk` holds PLAN_GROUP_BLOCK bytes (32 of scales, 8 steps of 64 quants) and
        // `gb` GROUP_BLOCK; the stores lie at SCALE_AT, CORR_AT, MIN_AT < GROUP_BLOCK.
        unsafe {
            if CORR {
                let mut sum = _mm512_setzero_si512();
                for s in 0..8 {
                    let words = _mm512_loadu_si512(blk.as_ptr().add(32 + 64 * s) as *const __m512i);
                    sum = _mm512_dpbusd_epi32(sum, ones, words);
                }
                let corr = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum));
                _mm512_storeu_si512(gb.as_mut_ptr().add(CORR_AT) as *mut __m512i, corr);
            }
            if copy {
                std::ptr::copy_nonoverlapping(blk.as_ptr().add(32), gb.as_mut_ptr(), 512);
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.as_ptr() as *const __m256i));
            _mm512_storeu_ps(gb.as_mut_ptr().add(SCALE_AT) as *mut f32, d);
            _mm512_storeu_ps(gb.as_mut_ptr().add(MIN_AT) as *mut f32, _mm512_setzero_ps());
        }
    }
}

/// `res[r][c]` = the block-summed dot product of activation row `acts[r]` with column `c` of
/// the groups `srcs` (one or two groups of 16 columns).
fn tile(
    kind: Scaling,
    acts: &[&[u8]; MAX_R],
    ablock: usize,
    qoff: usize,
    srcs: &[GroupSrc<'_>],
    nb: usize,
    res: &mut TileSums,
) {
    check_tile_operands(&acts[..R], nb, ablock, srcs);
    assert!(qoff + 32 == ablock);
    // SAFETY: the kernel table holds this kernel only when AVX-512F/BW and VNNI were detected
    // (`crate::x86_64::table`); every pointer offset below stays inside `acts[r]` (block `b`
    // of `nb`, bytes `qoff..qoff + 32`, the f32 scale at 0 and, for Q8_1, the sum at 4), inside
    // each group's quants (block `b < nb` at `b · qstride`, 512 bytes) and inside its meta
    // (block `b < nb`, bytes `0..GROUP_BLOCK`), as asserted above.
    unsafe { by_kind_and_groups!(qtile, kind, srcs.len(), (acts, ablock, qoff, srcs, nb, res)) }
}

/// What the 16-column tiles ([`Vnni`], `super::qgemm_amx::Amx`) read, asserted: `nb` widened
/// activation blocks of `ablock` bytes per row, one or two groups, each with `nb` blocks of
/// meta and quants.
pub(crate) fn check_tile_operands(acts: &[&[u8]], nb: usize, ablock: usize, srcs: &[GroupSrc<'_>]) {
    assert!(acts.iter().all(|a| a.len() == nb * ablock));
    assert!(srcs.len() == 1 || srcs.len() == 2);
    for s in srcs {
        assert!(s.meta.len() >= nb * GROUP_BLOCK && s.qstride >= 512);
        assert!(s.quants.len() >= (nb - 1) * s.qstride + 512);
    }
}

/// Calls `$tile::<G, KIND>($args)` for the number of groups (`G`: 1 or 2) and the [`Scaling`]
/// (`KIND` 0, 1, 2 in declaration order): the tiles' const-generic instances.
macro_rules! by_kind_and_groups {
    ($tile:ident, $kind:expr, $groups:expr, ($($arg:expr),*)) => {
        match ($kind, $groups) {
            (Scaling::SumiTimesScales, 2) => $tile::<2, 0>($($arg),*),
            (Scaling::SumiTimesScales, _) => $tile::<1, 0>($($arg),*),
            (Scaling::SumiThenScales, 2) => $tile::<2, 1>($($arg),*),
            (Scaling::SumiThenScales, _) => $tile::<1, 1>($($arg),*),
            (Scaling::WithMin, 2) => $tile::<2, 2>($($arg),*),
            (Scaling::WithMin, _) => $tile::<1, 2>($($arg),*),
        }
    };
}
pub(crate) use by_kind_and_groups;

/// `G` groups of 16 columns × `R` rows; `KIND` 0, 1, 2 = [`Scaling`] in declaration order.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn qtile<const G: usize, const KIND: u8>(
    acts: &[&[u8]; MAX_R],
    ablock: usize,
    qoff: usize,
    srcs: &[GroupSrc<'_>],
    nb: usize,
    res: &mut TileSums,
) {
    let mut ap = [acts[0].as_ptr(); R];
    for (p, a) in ap.iter_mut().zip(acts) {
        *p = a.as_ptr();
    }
    let qp: [*const u8; G] = std::array::from_fn(|g| srcs[g].quants.as_ptr());
    let qs: [usize; G] = std::array::from_fn(|g| srcs[g].qstride);
    let mp: [*const u8; G] = std::array::from_fn(|g| srcs[g].meta.as_ptr());
    let mut facc = [[_mm512_setzero_ps(); G]; R];
    for b in 0..nb {
        // SAFETY: offsets as stated in `tile`: block `b < nb` of every group and row.
        unsafe {
            let mut blk = [mp[0]; G];
            let mut qb = [qp[0]; G];
            let mut iacc = [[_mm512_setzero_si512(); G]; R];
            for g in 0..G {
                blk[g] = mp[g].add(b * GROUP_BLOCK);
                qb[g] = qp[g].add(b * qs[g]);
                let corr = _mm512_loadu_si512(blk[g].add(CORR_AT) as *const __m512i);
                for r in 0..R {
                    iacc[r][g] = corr;
                }
            }
            let mut aq = [ap[0]; R];
            for r in 0..R {
                aq[r] = ap[r].add(b * ablock + qoff);
            }
            for s in 0..8 {
                let mut wv = [_mm512_setzero_si512(); G];
                for g in 0..G {
                    wv[g] = _mm512_loadu_si512(qb[g].add(s * 64) as *const __m512i);
                }
                for r in 0..R {
                    let a = _mm512_set1_epi32((aq[r].add(s * 4) as *const i32).read_unaligned());
                    for g in 0..G {
                        iacc[r][g] = _mm512_dpbusd_epi32(iacc[r][g], a, wv[g]);
                    }
                }
            }
            let mut sc = [_mm512_setzero_ps(); G];
            let mut mn = [_mm512_setzero_ps(); G];
            for g in 0..G {
                sc[g] = _mm512_loadu_ps(blk[g].add(SCALE_AT) as *const f32);
                if KIND == 2 {
                    mn[g] = _mm512_loadu_ps(blk[g].add(MIN_AT) as *const f32);
                }
            }
            for r in 0..R {
                let (da, sa) = act_head::<KIND>(ap[r].add(b * ablock));
                for g in 0..G {
                    let f = _mm512_cvtepi32_ps(iacc[r][g]);
                    facc[r][g] = block_acc::<KIND>(facc[r][g], f, sc[g], mn[g], da, sa);
                }
            }
        }
    }
    for r in 0..R {
        for g in 0..G {
            // SAFETY: `res[r]` holds 32 f32 and `g < G ≤ 2`.
            unsafe { _mm512_storeu_ps(res[r].as_mut_ptr().add(g * GROUP), facc[r][g]) };
        }
    }
}

/// An activation block's widened head at `ab` broadcast to 16 lanes: its f32 scale `da` and,
/// for `KIND` 2 ([`Scaling::WithMin`]), its f32 sum `sa` (else 0).
///
/// # Safety
/// AVX-512F present; `ab` points at 8 readable bytes (any alignment).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn act_head<const KIND: u8>(ab: *const u8) -> (__m512, __m512) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let da = _mm512_set1_ps((ab as *const f32).read_unaligned());
        let sa = if KIND == 2 {
            _mm512_set1_ps((ab.add(4) as *const f32).read_unaligned())
        } else {
            _mm512_setzero_ps()
        };
        (da, sa)
    }
}

/// The running sums `acc` of 16 columns after one more block, in the generic kernel's order
/// ([`Scaling`]; `KIND` 0, 1, 2 in its declaration order): `f` the exact integer block sums as
/// f32, `sc` the weights' scales, `mn` their minimums (`KIND` 2), `da` the activation block's
/// scale and `sa` its sum (`KIND` 2), the last two broadcast. `KIND` 0 is one fused
/// multiply-add (`fma(f, sc · da, acc)`); the others add their term to `acc`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn block_acc<const KIND: u8>(
    acc: __m512,
    f: __m512,
    sc: __m512,
    mn: __m512,
    da: __m512,
    sa: __m512,
) -> __m512 {
    match KIND {
        0 => _mm512_fmadd_ps(f, _mm512_mul_ps(sc, da), acc),
        1 => _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(f, sc), da)),
        _ => _mm512_add_ps(
            acc,
            _mm512_add_ps(
                _mm512_mul_ps(_mm512_mul_ps(sc, da), f),
                _mm512_mul_ps(mn, sa),
            ),
        ),
    }
}
