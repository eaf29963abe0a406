//! f32 register tiles of the shared GEMM driver ([`edge_kernels::F32Tile`]): one output column
//! per lane, one `vfmadd` per input feature in increasing order, exactly the generic order.
//!
//! The driver hands a packed panel (`panel[t·cols + c]`), so a feature's `cols` weights are one
//! or more vector loads and the activation is a broadcast: lane `c` of accumulator `r` computes
//! `acc[r][c] = fma(x[r][t], w[t][c], acc[r][c])`, the generic `f32::mul_add` chain.

use std::arch::x86_64::*;

use edge_kernels::{F32Tile, WeightRef};
use edge_schema::DType;

use super::vmath::{mask, transpose16, transpose8};

/// AVX2 + FMA: 6 rows × 16 columns (12 ymm accumulators, 2 weight vectors, 1 broadcast); the
/// rows left after a block's whole tiles go in one tile of 2 to 5 rows (`any_rows`). Blocks of
/// 256 features: the panel block is then 16 KiB, and on the Zen 3 host the driver's work per
/// call (rows, prefetch, checks, the accumulators' loads and stores) took about an eighth of
/// the F16 NFE's `linear` samples at 128 (`perf`; `kbench 1 "linear f16"`, 8 alternations:
/// 1.08–1.14× at 256, BENCHMARKS.md, "AVX2 feature blocks").
pub(crate) const AVX2: F32Tile = F32Tile {
    name: "avx2_f32_6x16",
    rows: 6,
    cols: 16,
    run: avx2_tile,
    pack: pack_avx2,
    any_rows: true,
    kc: 256,
};

/// AVX-512: 6 rows × 64 columns (24 zmm accumulators, 4 weight vectors, 1 broadcast); the
/// rows left after a block's whole tiles go in one tile of 2 to 5 rows (`any_rows`: a 1-row
/// call has 4 independent accumulators, fewer than the `vfmadd` latency hides).
pub(crate) const AVX512: F32Tile = F32Tile {
    name: "avx512_f32_6x64",
    rows: 6,
    cols: 64,
    run: avx512_tile,
    pack: pack_avx512,
    any_rows: true,
    kc: edge_kernels::KC,
};

/// Features of each row that a tile prefetches for its next register tile (two cache lines;
/// `kbench 1 "linear f16"`, m = 1024: the whole `KC` slice measured 1–2 % slower, one to four
/// lines alike).
const PREFETCH_X: usize = 32;

/// One `prefetcht0` per 64-byte line of the first [`PREFETCH_X`] features of the rows of `x` that
/// the register tile after `(r0, nr)` reads: the next tile's rows of this feature block, or after
/// the block's last tile the first tile's rows from feature `kc` on (the next feature block's
/// head, which the driver reaches after this feature block's panels). Each tile's `rows × kc` slice starts short new
/// streams that the hardware prefetchers pick up too late (BENCHMARKS.md, "prefetch").
#[inline(always)]
fn prefetch_next(xs: &[&[f32]], r0: usize, nr: usize, rows: usize, kc: usize) {
    let (n0, from) = if r0 + nr < xs.len() {
        (r0 + nr, 0)
    } else {
        (0, kc)
    };
    for x in &xs[n0..(n0 + rows).min(xs.len())] {
        let head = x.get(from..).unwrap_or(&[]);
        for line in head[..head.len().min(PREFETCH_X)].chunks(16) {
            // SAFETY: `prefetcht0` (SSE, part of x86-64) only hints the cache: it never faults,
            // and the address lies inside the row.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr() as *const i8) };
        }
    }
}

/// Calls `$rc::<R>($args)` for `R` = `$rows`, 1 to 6 (the tiles' const-generic row counts).
macro_rules! by_rows {
    ($rc:ident, $rows:expr, ($($arg:expr),*)) => {
        match $rows {
            6 => $rc::<6>($($arg),*),
            5 => $rc::<5>($($arg),*),
            4 => $rc::<4>($($arg),*),
            3 => $rc::<3>($($arg),*),
            2 => $rc::<2>($($arg),*),
            _ => $rc::<1>($($arg),*),
        }
    };
}

fn avx2_tile(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32], ld: usize) {
    AVX2.check_args(xs, panel, kc, acc, ld);
    AVX2.each_row_tile(xs.len(), |r0, nr| {
        prefetch_next(xs, r0, nr, AVX2.rows, kc);
        let (rows, acc) = (&xs[r0..r0 + nr], &mut acc[r0 * ld..]);
        // SAFETY: AVX2 and FMA are the features these functions enable; this tile is put in a
        // kernel table only by `crate::x86_64` after `edge_kernels::cpu::features()` reported
        // both. Every row holds `kc` f32, the panel `16·kc` and `acc` from row `r0` on the
        // `(nr − 1)·ld + 16` it writes (`F32Tile::check_args` asserted them for all the rows).
        unsafe { by_rows!(avx2_rc, nr, (rows, panel, kc, acc, ld)) }
    });
}

/// # Safety
/// AVX2 and FMA present; `xs` has `R` rows of ≥ `kc` f32, `panel` ≥ `16·kc`, `acc` ≥ `(R − 1)·ld + 16`.
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_rc<const R: usize>(
    xs: &[&[f32]],
    panel: &[f32],
    kc: usize,
    acc: &mut [f32],
    ld: usize,
) {
    const C: usize = 2;
    let mut a = [[_mm256_setzero_ps(); C]; R];
    let ap = acc.as_mut_ptr();
    for (r, ar) in a.iter_mut().enumerate() {
        for (c, v) in ar.iter_mut().enumerate() {
            // SAFETY: `r·ld + 8c + 8 ≤ (R − 1)·ld + 16 ≤ acc.len()` (the caller's guarantee).
            *v = unsafe { _mm256_loadu_ps(ap.add(r * ld + 8 * c)) };
        }
    }
    let xp: [*const f32; R] = std::array::from_fn(|r| xs[r].as_ptr());
    let mut wp = panel.as_ptr();
    for t in 0..kc {
        // SAFETY: `t < kc`: panel row `t` is inside the panel and every `xs[r]` holds ≥ `kc` f32.
        unsafe {
            let w0 = _mm256_loadu_ps(wp);
            let w1 = _mm256_loadu_ps(wp.add(8));
            for r in 0..R {
                let xb = _mm256_broadcast_ss(&*xp[r].add(t));
                a[r][0] = _mm256_fmadd_ps(xb, w0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(xb, w1, a[r][1]);
            }
            wp = wp.add(16);
        }
    }
    for (r, ar) in a.iter().enumerate() {
        for (c, v) in ar.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm256_storeu_ps(ap.add(r * ld + 8 * c), *v) };
        }
    }
}

fn avx512_tile(xs: &[&[f32]], panel: &[f32], kc: usize, acc: &mut [f32], ld: usize) {
    AVX512.check_args(xs, panel, kc, acc, ld);
    AVX512.each_row_tile(xs.len(), |r0, nr| {
        prefetch_next(xs, r0, nr, AVX512.rows, kc);
        let (rows, acc) = (&xs[r0..r0 + nr], &mut acc[r0 * ld..]);
        // SAFETY: AVX-512F is the only feature these functions enable (its `vfmadd` forms are
        // part of the foundation); this tile is put in a kernel table only by `crate::x86_64`
        // after `edge_kernels::cpu::features()` reported AVX-512F. Every row holds `kc` f32, the
        // panel `64·kc` and `acc` from row `r0` on the `(nr − 1)·ld + 64` it writes (asserted
        // for all the rows above).
        unsafe { by_rows!(avx512_rc, nr, (rows, panel, kc, acc, ld)) }
    });
}

/// # Safety
/// AVX-512F present; `xs` has `R` rows of ≥ `kc` f32, `panel` ≥ `64·kc`, `acc` ≥ `(R − 1)·ld + 64`.
#[target_feature(enable = "avx512f")]
unsafe fn avx512_rc<const R: usize>(
    xs: &[&[f32]],
    panel: &[f32],
    kc: usize,
    acc: &mut [f32],
    ld: usize,
) {
    const C: usize = 4;
    let mut a = [[_mm512_setzero_ps(); C]; R];
    let ap = acc.as_mut_ptr();
    for (r, ar) in a.iter_mut().enumerate() {
        for (c, v) in ar.iter_mut().enumerate() {
            // SAFETY: `r·ld + 16c + 16 ≤ (R − 1)·ld + 64 ≤ acc.len()` (the caller's guarantee).
            *v = unsafe { _mm512_loadu_ps(ap.add(r * ld + 16 * c)) };
        }
    }
    let xp: [*const f32; R] = std::array::from_fn(|r| xs[r].as_ptr());
    let mut wp = panel.as_ptr();
    for t in 0..kc {
        // SAFETY: `t < kc`: panel row `t` is inside the panel and every `xs[r]` holds ≥ `kc` f32.
        unsafe {
            let w: [__m512; C] = std::array::from_fn(|c| _mm512_loadu_ps(wp.add(16 * c)));
            for r in 0..R {
                let xb = _mm512_set1_ps(*xp[r].add(t));
                for c in 0..C {
                    a[r][c] = _mm512_fmadd_ps(xb, w[c], a[r][c]);
                }
            }
            wp = wp.add(64);
        }
    }
    for (r, ar) in a.iter().enumerate() {
        for (c, v) in ar.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(ap.add(r * ld + 16 * c), *v) };
        }
    }
}

/// The checks of a SIMD [`edge_kernels::PackFn`] whose transposes take `lanes` columns at a
/// time: plain weights, `dst` of `kc × cols` values (`cols` a multiple of `lanes`), every
/// column `j0 .. j0 + valid` holding features `t0 .. t0 + kc`. Returns the element size.
#[allow(clippy::too_many_arguments)]
fn pack_checks(
    name: &str,
    w: &WeightRef<'_>,
    wrow: usize,
    j0: usize,
    valid: usize,
    t0: usize,
    kc: usize,
    cols: usize,
    lanes: usize,
    dst_len: usize,
) -> usize {
    let esz = match w.dtype {
        DType::F32 => 4,
        DType::F16 | DType::BF16 => 2,
        other => panic!("{name}: {other:?} weights are not F32, F16 or BF16"),
    };
    assert!(
        dst_len == kc * cols && cols.is_multiple_of(lanes) && valid <= cols,
        "{name}: {dst_len} panel values for {kc} features × {cols} columns ({valid} valid)"
    );
    assert!(
        valid == 0 || (j0 + valid - 1) * wrow + (t0 + kc) * esz <= w.bytes.len(),
        "{name}: columns {j0}..{} features {t0}..{} outside the weight",
        j0 + valid,
        t0 + kc
    );
    esz
}

/// [`edge_kernels::PackFn`] on AVX2 (with F16C): 8 columns × 8 features at a time are loaded
/// (converted exactly: `vcvtph2ps` for `F16`, a 16-bit shift for `BF16`), transposed in
/// registers and stored as 8 panel rows; the same bits as [`edge_kernels::pack_panel`], which it
/// is tested against.
#[allow(clippy::too_many_arguments)]
fn pack_avx2(
    w: WeightRef<'_>,
    wrow: usize,
    j0: usize,
    valid: usize,
    t0: usize,
    kc: usize,
    cols: usize,
    dst: &mut [f32],
) {
    let esz = pack_checks("pack_avx2", &w, wrow, j0, valid, t0, kc, cols, 8, dst.len());
    // SAFETY: the table holding this tile was built after AVX2, FMA and F16C were detected
    // (`crate::x86_64::avx2_table`); every read lies inside row `j0 + c < j0 + valid` between
    // features `t0` and `t0 + kc` (asserted above) and every store inside `dst`.
    unsafe {
        pack_avx2_impl(
            w.dtype,
            w.bytes.as_ptr(),
            wrow,
            esz,
            j0,
            valid,
            t0,
            kc,
            cols,
            dst,
        )
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
unsafe fn pack_avx2_impl(
    dtype: DType,
    bytes: *const u8,
    wrow: usize,
    esz: usize,
    j0: usize,
    valid: usize,
    t0: usize,
    kc: usize,
    cols: usize,
    dst: &mut [f32],
) {
    let out = dst.as_mut_ptr();
    for c0 in (0..cols).step_by(8) {
        for tb in (0..kc).step_by(8) {
            let nt = (kc - tb).min(8);
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, ri) in r.iter_mut().enumerate() {
                let c = c0 + i;
                if c >= valid {
                    continue;
                }
                // SAFETY: features `t0 + tb .. t0 + tb + nt` of row `j0 + c` (the caller's
                // bounds); a partial block is copied through a zeroed buffer.
                let p = unsafe { bytes.add((j0 + c) * wrow + (t0 + tb) * esz) };
                // SAFETY: `p` points at `nt` values of the row (above); a full block of 8 is
                // read directly, a partial one copied into a zeroed buffer first.
                *ri = unsafe {
                    match dtype {
                        DType::F32 => {
                            if nt == 8 {
                                _mm256_loadu_ps(p as *const f32)
                            } else {
                                let mut v = [0f32; 8];
                                std::ptr::copy_nonoverlapping(p, v.as_mut_ptr() as *mut u8, 4 * nt);
                                _mm256_loadu_ps(v.as_ptr())
                            }
                        }
                        _ => {
                            let mut half = [0u16; 8];
                            let bits = if nt == 8 {
                                _mm_loadu_si128(p as *const __m128i)
                            } else {
                                std::ptr::copy_nonoverlapping(
                                    p,
                                    half.as_mut_ptr() as *mut u8,
                                    2 * nt,
                                );
                                _mm_loadu_si128(half.as_ptr() as *const __m128i)
                            };
                            if dtype == DType::F16 {
                                _mm256_cvtph_ps(bits)
                            } else {
                                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                                    bits,
                                )))
                            }
                        }
                    }
                };
            }
            let t = transpose8(r);
            for (i, ti) in t.iter().enumerate().take(nt) {
                // SAFETY: `(tb + i)·cols + c0 + 8 ≤ kc·cols = dst.len()`.
                unsafe { _mm256_storeu_ps(out.add((tb + i) * cols + c0), *ti) };
            }
        }
    }
}

/// [`edge_kernels::PackFn`] on AVX-512F: 16 columns × 16 features at a time are loaded
/// (converted exactly: `vcvtph2ps` for `F16`, a 16-bit shift for `BF16`), transposed in registers
/// and stored as 16 panel rows; the same bits as [`edge_kernels::pack_panel`], which it is
/// tested against.
#[allow(clippy::too_many_arguments)]
fn pack_avx512(
    w: WeightRef<'_>,
    wrow: usize,
    j0: usize,
    valid: usize,
    t0: usize,
    kc: usize,
    cols: usize,
    dst: &mut [f32],
) {
    let esz = pack_checks(
        "pack_avx512",
        &w,
        wrow,
        j0,
        valid,
        t0,
        kc,
        cols,
        16,
        dst.len(),
    );
    // SAFETY: the table holding this tile was built after AVX-512F was detected
    // (`crate::x86_64::avx512_table`); every read lies inside row `j0 + c < j0 + valid` between
    // features `t0` and `t0 + kc` (asserted above) and every store inside `dst`.
    unsafe {
        pack_avx512_impl(
            w.dtype,
            w.bytes.as_ptr(),
            wrow,
            esz,
            j0,
            valid,
            t0,
            kc,
            cols,
            dst,
        )
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn pack_avx512_impl(
    dtype: DType,
    bytes: *const u8,
    wrow: usize,
    esz: usize,
    j0: usize,
    valid: usize,
    t0: usize,
    kc: usize,
    cols: usize,
    dst: &mut [f32],
) {
    let out = dst.as_mut_ptr();
    for c0 in (0..cols).step_by(16) {
        for tb in (0..kc).step_by(16) {
            let nt = (kc - tb).min(16);
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, ri) in r.iter_mut().enumerate() {
                let c = c0 + i;
                if c >= valid {
                    continue;
                }
                // SAFETY: features `t0 + tb .. t0 + tb + nt` of row `j0 + c` (the caller's
                // bounds); a partial block is copied through a zeroed buffer.
                let p = unsafe { bytes.add((j0 + c) * wrow + (t0 + tb) * esz) };
                // SAFETY: `p` points at `nt` values of the row (above); a full block of 16 is
                // read directly, a partial one copied into a zeroed buffer first.
                *ri = unsafe {
                    match dtype {
                        DType::F32 => _mm512_maskz_loadu_ps(mask(nt), p as *const f32),
                        _ => {
                            let mut half = [0u16; 16];
                            let bits = if nt == 16 {
                                _mm256_loadu_si256(p as *const __m256i)
                            } else {
                                std::ptr::copy_nonoverlapping(
                                    p,
                                    half.as_mut_ptr() as *mut u8,
                                    2 * nt,
                                );
                                _mm256_loadu_si256(half.as_ptr() as *const __m256i)
                            };
                            if dtype == DType::F16 {
                                _mm512_cvtph_ps(bits)
                            } else {
                                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                                    bits,
                                )))
                            }
                        }
                    }
                };
            }
            let t = transpose16(r);
            for (i, ti) in t.iter().enumerate().take(nt) {
                // SAFETY: `(tb + i)·cols + c0 + 16 ≤ kc·cols = dst.len()`.
                unsafe { _mm512_storeu_ps(out.add((tb + i) * cols + c0), *ti) };
            }
        }
    }
}
