//! The quantized panel tile on AMX-INT8 (`tdpbssd`, Intel Sapphire Rapids and later): the
//! weight operands and the f32 scaling of [`super::qgemm`]'s VNNI tile, 16 activation rows ×
//! 32 columns per call, so every output is bit-identical to [`edge_kernels::linear`].
//!
//! Per 32-element block `b` and 16-column group `g`:
//! - the weights are the VNNI tile's slots (eight k-steps of `16 columns × 4 bytes` of signed
//!   values, read in place or from scratch as [`Vnni`] arranges them), which is exactly an AMX
//!   `B` tile of 8 rows × 64 bytes;
//! - the activation rows are quantized as the generic kernel does and kept signed (no `+128`
//!   bias: `tdpbssd` multiplies signed by signed, so the VNNI tile's corrections `−128·Σw` are
//!   not needed), the `A` tile being the 16 rows' 32 quants of the block; a row holds its
//!   blocks' widened scales first and then all its quants (`qgemm::act_offsets`' split layout),
//!   so that a block's 32 quants never straddle a cache line;
//! - `C = 0; tdpbssd C, A, B` gives the 16 × 16 block sums `Σ q·w`, exact in i32 (|sum| ≤
//!   32·128·127; integer addition is associative, so AMX's internal order cannot change a bit);
//! - `C` is stored to a 1 KiB buffer and each row's 16 sums are converted, scaled and added to
//!   the f32 accumulators in the generic order ([`super::qgemm::block_acc`]), block after
//!   block.
//!
//! Two blocks are in flight in two sets of accumulator tiles: at step `b` block `b + 2`'s
//! products are issued and block `b + 1`'s sums stored, into a ring of [`SLOTS`] buffers; every
//! [`CHUNK`] blocks the stored chunk is scaled row by row, so a row's two accumulators stay in
//! registers across the chunk (all 16 rows' accumulators fill the 32 vector registers: scaled
//! block by block they went to the stack and back per block). The tiles are
//! configured per call (`ldtilecfg`) and released at its end (`tilerelease`); the table exists
//! only where Linux granted this process the tile data state (`super::amx_granted`). Intel's
//! ISA extensions reference defines `TDPBSSD`, `TILELOADD`, `TILESTORED` and `LDTILECFG`.

use std::arch::asm;
use std::arch::x86_64::*;

use std::mem::MaybeUninit;

use super::qgemm::{
    GroupSrc, Panel, Scaling, TileSums, Vnni, ACT_BLOCK, GROUP_BLOCK, MAX_R, MIN_AT, SCALE_AT,
};
use edge_kernels::WeightRef;
use edge_schema::DType;

/// Activation rows per tile call: one AMX `A` tile of 16 rows.
const R: usize = 16;
/// Whether a call of `m` activation rows and `k` features takes this tile rather than the VNNI
/// one: at least one full tile of rows and 8 blocks per call (the tile configuration and the
/// two-block pipeline's start cost more than the VNNI tile's few blocks; `kbench 2 "linear
/// q8_0"`: 16 × 192 × 768 and 300 × 64 × 64 ran 0.85–0.9× the VNNI speed on AMX, the shapes
/// with `k` ≥ 1152 1.1–1.3×).
pub(crate) fn pays(m: usize, k: usize) -> bool {
    m >= R && k >= 256
}

/// Columns per group: one `C` tile's 16 i32 lanes.
const GROUP: usize = 16;

/// The AMX-INT8 tile: 16 rows, groups of 16 columns, [`Vnni`]'s operands.
pub(crate) struct Amx;

impl Panel for Amx {
    const GROUP: usize = GROUP;
    const GROUP_BLOCK: usize = GROUP_BLOCK;
    const R: usize = R;
    const INTERLEAVED16X4: bool = true;

    /// The generic quants, signed (`tdpbssd` multiplies signed by signed), every block's head
    /// first and then every block's quants (`act_offsets`' split layout).
    fn quantize_row(w: DType, x: &[f32], dst: &mut [u8]) {
        super::qgemm::quantize_row_avx512::<0, true>(w, x, dst)
    }

    fn prepare_group(
        w: WeightRef<'_>,
        wrow: usize,
        bb: usize,
        n: usize,
        j0: usize,
        in_place: bool,
        dst: &mut [u8],
    ) {
        // The corrections are for `vpdpbusd`'s unsigned activations: not computed.
        super::qgemm::prepare_group_slot::<false>(w, wrow, bb, n, j0, in_place, dst)
    }

    fn group_src<'a>(
        w: &WeightRef<'a>,
        n: usize,
        panel: &'a [u8],
        g: usize,
        p0: usize,
        nb: usize,
        in_place: bool,
    ) -> GroupSrc<'a> {
        Vnni::group_src(w, n, panel, g, p0, nb, in_place)
    }

    fn store(dst: &mut [f32], sums: &[f32; super::qgemm::MAX_COLS], bias: Option<&[f32]>) {
        Vnni::store(dst, sums, bias)
    }

    fn tile(
        _w: DType,
        kind: Scaling,
        acts: &[&[u8]; MAX_R],
        srcs: &[GroupSrc<'_>],
        nb: usize,
        res: &mut TileSums,
    ) {
        super::qgemm::check_tile_operands(acts, nb, ACT_BLOCK, srcs);
        // SAFETY: the kernel table holds this tile only when AVX-512F/BW and AMX-INT8 were
        // detected and Linux granted the tile data state (`super::amx_granted`); every tile
        // load and store below stays inside `acts[r]` (`nb · ACT_BLOCK` bytes: block `b < nb`'s
        // 32 quants at `8·nb + 32·b` (`act_offsets::<true>`), for all 16 rows: read with one stride only
        // where the rows are that far apart, else copied; its head at `8·b`),
        // inside each group's quants (block `b` at `b · qstride`, 512 bytes) and meta (block
        // `b`, `GROUP_BLOCK` bytes), and inside the local buffers, as asserted above.
        unsafe {
            super::qgemm::by_kind_and_groups!(amx_tile, kind, srcs.len(), (acts, srcs, nb, res))
        }
    }
}

/// `LDTILECFG`'s 64-byte operand: palette 1; two sets of accumulators `C` (16 rows × 64
/// bytes: `tmm0`, `tmm1` for the two groups of even blocks, `tmm2`, `tmm3` for odd blocks),
/// the activations' `A` (16 rows × 32 bytes: `tmm4` even, `tmm5` odd blocks) and the groups'
/// `B` (8 rows × 64 bytes: `tmm6`, `tmm7`).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const fn tile_config() -> TileConfig {
    let mut c = [0u8; 64];
    c[0] = 1;
    // (register, rows, bytes per row): bytes per row at 16 + 2·t (u16), rows at 48 + t.
    let tiles = [
        (0, 16, 64),
        (1, 16, 64),
        (2, 16, 64),
        (3, 16, 64),
        (4, 16, 32),
        (5, 16, 32),
        (6, 8, 64),
        (7, 8, 64),
    ];
    let mut i = 0;
    while i < tiles.len() {
        let (t, rows, colsb) = tiles[i];
        c[16 + 2 * t] = colsb;
        c[48 + t] = rows;
        i += 1;
    }
    TileConfig(c)
}

static CONFIG: TileConfig = tile_config();

/// Blocks scaled together, row by row (`KBENCH_M=1024 kbench 2 "linear q8_0"`, GFLOP/s at
/// 1024 × {1152 × 4608, 4608 × 1152, 1152 × 1152}: chunks of 2 in 4 slots 1083–1171 /
/// 1174–1254 / 1146–1253, of 4 in 8 slots 1071–1128 / 1079–1122 / 1120–1165, of 8 in 16 slots
/// 880–995).
const CHUNK: usize = 2;
/// Slots of stored sums: a chunk and the block stored in its last step.
const SLOTS: usize = 4;
const _: () = assert!(CHUNK < SLOTS && SLOTS.is_power_of_two());

/// One accumulator set's integer sums as stored: per group, 16 rows × 16 i32.
type SetSums = [[[i32; GROUP]; R]; 2];

/// 64-byte aligned scratch of the tile call.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// One block's integer sums for `G` groups into accumulator set `P` (0: `tmm0`/`tmm1`, 1:
/// `tmm2`/`tmm3`): `C = 0; C += A·B` (`tdpbssd`: signed × signed) with `A` 16 rows of 32
/// quants at `a`, `sa` bytes apart, and `quants[g]` 512 bytes.
///
/// Safety: the tiles are configured ([`CONFIG`]); the operands are readable as stated.
#[inline(always)]
unsafe fn issue<const P: usize, const G: usize>(a: *const u8, sa: usize, quants: [*const u8; G]) {
    // SAFETY: as the caller guarantees; every tile instruction reads only its operands.
    unsafe {
        match (P, G) {
            (0, 2) => asm!(
                "tileloadd tmm4, [{a} + {sa}*1]",
                "tilezero tmm0",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tdpbssd tmm0, tmm4, tmm6",
                "tilezero tmm1",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbssd tmm1, tmm4, tmm7",
                a = in(reg) a, sa = in(reg) sa, b0 = in(reg) quants[0],
                b1 = in(reg) quants[G - 1], sb = in(reg) 64usize,
                options(nostack, readonly),
            ),
            (0, _) => asm!(
                "tileloadd tmm4, [{a} + {sa}*1]",
                "tilezero tmm0",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tdpbssd tmm0, tmm4, tmm6",
                a = in(reg) a, sa = in(reg) sa, b0 = in(reg) quants[0], sb = in(reg) 64usize,
                options(nostack, readonly),
            ),
            (_, 2) => asm!(
                "tileloadd tmm5, [{a} + {sa}*1]",
                "tilezero tmm2",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tdpbssd tmm2, tmm5, tmm6",
                "tilezero tmm3",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbssd tmm3, tmm5, tmm7",
                a = in(reg) a, sa = in(reg) sa, b0 = in(reg) quants[0],
                b1 = in(reg) quants[G - 1], sb = in(reg) 64usize,
                options(nostack, readonly),
            ),
            _ => asm!(
                "tileloadd tmm5, [{a} + {sa}*1]",
                "tilezero tmm2",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tdpbssd tmm2, tmm5, tmm6",
                a = in(reg) a, sa = in(reg) sa, b0 = in(reg) quants[0], sb = in(reg) 64usize,
                options(nostack, readonly),
            ),
        }
    }
}

/// Stores accumulator set `P`'s `G` tiles to `out[g]` (16 rows × 16 i32 each).
///
/// Safety: the tiles are configured and hold a block's sums ([`issue`]); `out` is writable for
/// two `[[i32; 16]; 16]` (it may be uninitialised).
#[inline(always)]
unsafe fn store<const P: usize, const G: usize>(out: *mut [[i32; GROUP]; R]) {
    let o0 = out as *mut i32;
    let o1 = out.wrapping_add(1) as *mut i32;
    // SAFETY: each store writes 16 rows of 64 bytes, 64 bytes apart: one `[[i32; 16]; 16]`.
    unsafe {
        match (P, G) {
            (0, 2) => asm!(
                "tilestored [{o0} + {s}*1], tmm0",
                "tilestored [{o1} + {s}*1], tmm1",
                o0 = in(reg) o0, o1 = in(reg) o1, s = in(reg) 64usize, options(nostack),
            ),
            (0, _) => asm!(
                "tilestored [{o0} + {s}*1], tmm0",
                o0 = in(reg) o0, s = in(reg) 64usize, options(nostack),
            ),
            (_, 2) => asm!(
                "tilestored [{o0} + {s}*1], tmm2",
                "tilestored [{o1} + {s}*1], tmm3",
                o0 = in(reg) o0, o1 = in(reg) o1, s = in(reg) 64usize, options(nostack),
            ),
            _ => asm!(
                "tilestored [{o0} + {s}*1], tmm2",
                o0 = in(reg) o0, s = in(reg) 64usize, options(nostack),
            ),
        }
    }
}

/// Copies the 32 bytes at `at` of each of the 16 rows to `dst` (16 × 32 bytes): the `A` tile
/// of a call whose rows are not evenly spaced (a task's clamped last rows). Out of line, so
/// that the block loop of [`amx_tile`] stays small enough to be inlined whole.
///
/// Safety: every row holds `at + 32` bytes; `dst` is writable for 512 bytes.
#[cold]
#[inline(never)]
unsafe fn copy_rows(acts: &[&[u8]; MAX_R], at: usize, dst: *mut u8) {
    for (r, a) in acts.iter().take(R).enumerate() {
        // SAFETY: as the caller guarantees.
        unsafe { std::ptr::copy_nonoverlapping(a.as_ptr().add(at), dst.add(r * 32), 32) };
    }
}

/// `G` groups of 16 columns × 16 rows; `KIND` 0, 1, 2 = [`Scaling`] in declaration order.
/// Block `b + 1`'s integer sums are issued before block `b`'s are stored and scaled, into the
/// other accumulator set, so the matrix unit works while the vector unit scales.
///
/// Safety: AVX-512F/BW present, AMX-INT8 present and granted; the bounds `Amx::tile` asserts.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn amx_tile<const G: usize, const KIND: u8>(
    acts: &[&[u8]; MAX_R],
    srcs: &[GroupSrc<'_>],
    nb: usize,
    res: &mut TileSums,
) {
    // The 16 rows are read by one strided `tileloadd` where they are evenly spaced (every
    // call but a task's clamped last rows), else copied block by block.
    let a0 = acts[0].as_ptr();
    let stride = (acts[1].as_ptr() as usize).wrapping_sub(a0 as usize);
    let strided = (0..R)
        .all(|r| acts[r].as_ptr() as usize == (a0 as usize).wrapping_add(r.wrapping_mul(stride)));
    // Written before they are read (a copied block's rows before its `tileloadd`, a set's sums
    // by `tilestored` before the scaling loads them), so not initialised: zeroing them per
    // call cost about 1 % of a Q8_0 NFE.
    let mut abuf: MaybeUninit<Aligned<[[u8; R * 32]; 2]>> = MaybeUninit::uninit();
    let mut cbuf: MaybeUninit<Aligned<[SetSums; SLOTS]>> = MaybeUninit::uninit();
    let abuf = abuf.as_mut_ptr() as *mut [u8; R * 32];
    let cbuf = cbuf.as_mut_ptr() as *mut SetSums;
    // Block `b`'s quants at `qa + 32·b`, its head at `8·b` (`act_offsets::<true>`).
    let qa = 8 * nb;
    let qp: [*const u8; G] = std::array::from_fn(|g| srcs[g].quants.as_ptr());
    let qs: [usize; G] = std::array::from_fn(|g| srcs[g].qstride);
    let mp: [*const u8; G] = std::array::from_fn(|g| srcs[g].meta.as_ptr());
    let mut facc = [[_mm512_setzero_ps(); G]; R];
    // Issues block `b`'s sums into set `b mod 2`: its 16 activation rows (strided or copied)
    // and its quants per group.
    let issue_block = |b: usize| {
        // SAFETY: block `b < nb` of every row and group, as `Amx::tile` asserted; the tiles
        // are configured (below, before the first call); 16 rows of 32 bytes at `sa` lie
        // inside their rows, which are exactly that far apart, or in `abuf`.
        unsafe {
            let (a, sa) = if strided {
                (a0.add(qa + 32 * b), stride)
            } else {
                let dst = abuf.add(b % 2) as *mut u8;
                copy_rows(acts, qa + 32 * b, dst);
                (dst as *const u8, 32)
            };
            let quants = std::array::from_fn(|g| qp[g].add(b * qs[g]));
            if b.is_multiple_of(2) {
                issue::<0, G>(a, sa, quants)
            } else {
                issue::<1, G>(a, sa, quants)
            }
        }
    };
    let store_block = |b: usize| {
        // SAFETY: set `b mod 2` holds block `b`'s sums (issued before); `cbuf` has `SLOTS`
        // slots.
        unsafe {
            let slot = cbuf.add(b % SLOTS) as *mut [[i32; GROUP]; R];
            if b.is_multiple_of(2) {
                store::<0, G>(slot)
            } else {
                store::<1, G>(slot)
            }
        }
    };
    // SAFETY: CONFIG is a valid palette-1 configuration.
    unsafe { asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
    // Two blocks in flight: at step `b`, block `b + 2` is issued into the set block `b` used
    // (stored at step `b − 1`) and block `b + 1` is stored; at a chunk's last step `b` its
    // blocks `c0 ..= b`, all stored a step or more earlier, are scaled, so no load waits on the
    // tile store just issued.
    issue_block(0);
    if nb > 1 {
        issue_block(1);
    }
    store_block(0);
    for b in 0..nb {
        if b + 2 < nb {
            issue_block(b + 2);
        }
        if b + 1 < nb {
            store_block(b + 1);
        }
        if (b + 1) % CHUNK != 0 && b + 1 != nb {
            continue;
        }
        // Blocks `c0 ..= b`, each stored by `tilestored` a step or more earlier, are scaled row
        // by row: a row's accumulators stay in registers across the chunk.
        let c0 = b - b % CHUNK;
        let nc = b + 1 - c0;
        // SAFETY: block `c0 + j ≤ b < nb` of every group's meta, as asserted in `Amx::tile`.
        let (sc, mn) = unsafe {
            let mut sc = [[_mm512_setzero_ps(); G]; CHUNK];
            let mut mn = [[_mm512_setzero_ps(); G]; CHUNK];
            for j in 0..nc {
                for g in 0..G {
                    let blk = mp[g].add((c0 + j) * GROUP_BLOCK);
                    sc[j][g] = _mm512_loadu_ps(blk.add(SCALE_AT) as *const f32);
                    if KIND == 2 {
                        mn[j][g] = _mm512_loadu_ps(blk.add(MIN_AT) as *const f32);
                    }
                }
            }
            (sc, mn)
        };
        for (r, acc) in facc.iter_mut().enumerate() {
            let mut f = *acc;
            for j in 0..nc {
                let bj = c0 + j;
                // SAFETY: slot `bj mod SLOTS` holds block `bj`'s sums (stored, not yet
                // overwritten: only blocks `c0 ..= b + 1`, at most `CHUNK + 1 ≤ SLOTS`, were
                // stored since slot `c0 mod SLOTS` was); row `r`'s head of block `bj < nb` lies
                // inside `acts[r]`.
                unsafe {
                    let sums_at = &*cbuf.add(bj % SLOTS);
                    let (da, sa) = super::qgemm::act_head::<KIND>(acts[r].as_ptr().add(8 * bj));
                    for g in 0..G {
                        let sums = _mm512_load_si512(sums_at[g][r].as_ptr() as *const __m512i);
                        let s = _mm512_cvtepi32_ps(sums);
                        f[g] = super::qgemm::block_acc::<KIND>(f[g], s, sc[j][g], mn[j][g], da, sa);
                    }
                }
            }
            *acc = f;
        }
    }
    // SAFETY: the tile state configured above is released; nothing reads it after.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
    for r in 0..R {
        for g in 0..G {
            // SAFETY: `res[r]` holds 32 f32 and `g < G ≤ 2`.
            unsafe { _mm512_storeu_ps(res[r].as_mut_ptr().add(g * GROUP), facc[r][g]) };
        }
    }
}
