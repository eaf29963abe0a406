//! Every `linear` variant of this crate ([`edge_kernels_neon::variants`]: the ARMv8.0 table
//! and, when the CPU has them, the `dotprod` and `i8mm` tables) against its generic twin
//! [`edge_kernels::linear`] on random inputs with ragged shapes.
//!
//! - `F32`/`F16`/`BF16` weights: bit-identical (the shared GEMM driver with the NEON tile: one
//!   fused multiply-add per feature in order, as the generic tile).
//! - `Q8_0`/`Q4_0` weights: bit-identical (exact integer block sums, same f32 scaling order),
//!   row-major and in `PackLayout::Interleaved4x8` (compared with the generic kernel on the
//!   row-major bytes); other types marked interleaved panic with the generic kernel's message.
//! - `Q4_1`/`Q5_0`/`Q5_1` weights, every variant, and every K-quant on the ARMv8.0 (`base`)
//!   kernels: bit-identical (exact integer sums in the generic kernel's lanes, same f32 order).
//!   `Q2_K` is bit-identical on the `dotprod` kernel too (one exact integer sum per block, as
//!   the generic kernel).
//! - `Q3_K`/`Q4_K`/`Q5_K`/`Q6_K` on the `dotprod` kernels (also used by the `i8mm` table): the
//!   integer block totals are exact but the f32 accumulation is one term per block instead of
//!   eight lane sums. Both results are within `γ_{2·nb+2}·T` of the exact sum of the same
//!   rounded terms (`nb` blocks, `T = Σ |d·sc·q·q8| + Σ |dmin·min·q8|`, the terms' absolute
//!   sum), so `|neon − generic| ≤ (3·nb + 16)·u·T + 2u·(|neon| + |generic|)` (`u = 2⁻²⁴`; the
//!   last term covers the rounding of the bias addition). `T` is computed from the weights
//!   dequantized with `dmin` (resp. `d`) zeroed and the activation's `Q8_K` quants.
//! - No weight type is forwarded to the generic kernel (`every_weight_type_has_a_neon_kernel`).
//!
//! Run under qemu with `QEMU_CPU=max` (dotprod and i8mm present) and `QEMU_CPU=cortex-a72`
//! (both absent);
//! `EDGE_NEON_EXPECT=i8mm|dotprod|base` makes `reports_and_checks_the_chosen_path` assert the choice.

mod common;
use common::{best, Rng};

use edge_kernels::{pack, quant, KernelTable, WeightRef};
use edge_kernels_neon::{features, linear_layout_variant_name, linear_variant_name, variants};
use edge_schema::plan::PackLayout;
use edge_schema::DType;
use zerocopy::IntoBytes;

/// Weight bytes in a 4-byte-aligned buffer (`F32` weights are viewed in place by the generic
/// kernel).
fn pack(dtype: DType, w: &[f32], n: usize, k: usize) -> Vec<u32> {
    let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
    let mut buf = vec![0u32; (n * row).div_ceil(4)];
    let bytes = &mut buf.as_mut_bytes()[..n * row];
    for (src, dst) in w.chunks(k).zip(bytes.chunks_mut(row)) {
        quant::quantize_row(dtype, src, dst);
    }
    buf
}

/// Runs `table.linear` with a fresh aligned scratch; returns `out`.
fn run(
    table: &KernelTable,
    x: &[f32],
    dtype: DType,
    wbytes: &[u8],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let need = (table.linear_scratch_bytes.run)(dtype, m, k);
    let mut scratch = vec![0u32; need.div_ceil(4)];
    let mut out = vec![f32::NAN; m * n];
    (table.linear.run)(
        x,
        WeightRef::row_major(dtype, wbytes),
        bias,
        &mut out,
        m,
        k,
        n,
        scratch.as_mut_bytes(),
        None,
    );
    out
}

/// Compares every variant with the generic kernel for one weight type over ragged shapes.
fn check_dtype(dtype: DType, ks: &[usize], exact: bool) {
    let generic = edge_kernels::generic();
    let ms = [1, 2, 7, 8, 9, 13, 21];
    let ns = [1, 3, 5, 9, 33, 67];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ dtype as u64);
    let mut cases = 0;
    for &k in ks {
        for (mi, &m) in ms.iter().enumerate() {
            let n = ns[(mi + k) % ns.len()];
            let x = rng.vec(m * k, 2.0);
            let w = rng.vec(n * k, 0.5);
            let wbuf = pack(dtype, &w, n, k);
            let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
            let wbytes = &wbuf.as_bytes()[..n * row];
            let bias_v = rng.vec(n, 1.0);
            let bias = (mi % 2 == 0).then_some(&bias_v[..]);
            let want = run(&generic, &x, dtype, wbytes, bias, m, k, n);
            // The f32 weights the generic kernel actually multiplies (for the tolerance).
            let mut wf = vec![0f32; n * k];
            if !dtype.is_quantized() {
                for (src, dst) in wbytes.chunks(row).zip(wf.chunks_mut(k)) {
                    quant::dequantize_row(dtype, src, dst);
                }
            }
            for (label, table) in variants() {
                let got = run(&table, &x, dtype, wbytes, bias, m, k, n);
                for i in 0..m {
                    for j in 0..n {
                        let (g, r) = (got[i * n + j], want[i * n + j]);
                        if exact {
                            assert_eq!(
                                g.to_bits(),
                                r.to_bits(),
                                "{label} {dtype:?} m={m} k={k} n={n} [{i},{j}]: {g} vs generic {r}"
                            );
                        } else {
                            let abs: f32 = (0..k)
                                .map(|c| (x[i * k + c] * wf[j * k + c]).abs())
                                .sum::<f32>()
                                + bias.map_or(0.0, |b| b[j].abs());
                            let tol = 1e-5 * abs + f32::MIN_POSITIVE;
                            assert!(
                                (g - r).abs() <= tol,
                                "{label} {dtype:?} m={m} k={k} n={n} [{i},{j}]: {g} vs generic \
                                 {r}, |diff| {} > {tol}",
                                (g - r).abs()
                            );
                        }
                    }
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= ks.len() * ms.len());
}

#[test]
fn linear_f32_matches_generic_bitwise() {
    check_dtype(DType::F32, &[1, 3, 17, 100, 130, 300], true);
}

#[test]
fn linear_f16_matches_generic_bitwise() {
    check_dtype(DType::F16, &[1, 3, 17, 100, 130, 300], true);
}

#[test]
fn linear_q8_0_matches_generic_bitwise() {
    check_dtype(DType::Q8_0, &[32, 64, 96, 128, 160, 192, 224], true);
}

#[test]
fn linear_q4_0_matches_generic_bitwise() {
    check_dtype(DType::Q4_0, &[32, 64, 96, 128, 160, 192, 224], true);
}

#[test]
fn linear_bf16_matches_generic_bitwise() {
    check_dtype(DType::BF16, &[1, 3, 17, 100, 130, 300], true);
}

/// Runs `table.linear` on weights in `layout` with a fresh aligned scratch; returns `out`.
fn run_layout(
    table: &KernelTable,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let need = (table.linear_scratch_bytes.run)(w.dtype, m, k);
    let mut scratch = vec![0u32; need.div_ceil(4)];
    let mut out = vec![f32::NAN; m * n];
    (table.linear.run)(x, w, bias, &mut out, m, k, n, scratch.as_mut_bytes(), None);
    out
}

/// `Q8_0`/`Q4_0` weights in [`PackLayout::Interleaved4x8`] (made with
/// [`pack::interleave4x8`] from the row-major pack), every variant, against the generic kernel
/// on the row-major pack: bit-identical (the interleaved kernels compute each block's exact
/// integer sum and the generic f32 scaling per row, in block order). `n` covers no group at
/// all (`n < 4`), whole groups, a last single group in a column block (13, 70) and tail rows;
/// each case with and without bias.
fn check_interleaved(dtype: DType, name: &str) {
    let generic = edge_kernels::generic();
    let ks = [32, 96, 224];
    let ms = [1, 2, 3, 5, 9];
    let ns = [1, 3, 4, 5, 7, 8, 13, 66, 70];
    let mut rng = Rng(0x5851_F42D_4C95_7F2D ^ dtype as u64);
    let mut cases = 0;
    for &k in &ks {
        for &m in &ms {
            for &n in &ns {
                let x = rng.vec(m * k, 2.0);
                let w = rng.vec(n * k, 0.5);
                let wbuf = pack(dtype, &w, n, k);
                let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
                let rm = &wbuf.as_bytes()[..n * row];
                let mut il = vec![0u8; rm.len()];
                pack::interleave4x8(dtype, rm, n, k, &mut il);
                let packed = WeightRef {
                    dtype,
                    bytes: &il,
                    layout: PackLayout::Interleaved4x8,
                };
                let bias_v = rng.vec(n, 1.0);
                for bias in [None, Some(&bias_v[..])] {
                    let want = run(&generic, &x, dtype, rm, bias, m, k, n);
                    for (label, table) in variants() {
                        let expect = if cfg!(target_arch = "aarch64") {
                            let p = label.strip_prefix("neon+").unwrap_or("base");
                            format!("neon_linear_{name}_{p}_x4")
                        } else {
                            "generic_linear_f32".to_string()
                        };
                        assert_eq!(
                            linear_layout_variant_name(&table, dtype, PackLayout::Interleaved4x8),
                            expect,
                            "{label} {dtype:?}: kernel name"
                        );
                        let got = run_layout(&table, &x, packed, bias, m, k, n);
                        for i in 0..m {
                            for j in 0..n {
                                let (g, r) = (got[i * n + j], want[i * n + j]);
                                assert_eq!(
                                    g.to_bits(),
                                    r.to_bits(),
                                    "{label} {dtype:?} interleaved m={m} k={k} n={n} \
                                     bias={} [{i},{j}]: {g} vs generic row-major {r}",
                                    bias.is_some()
                                );
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 2 * ks.len() * ms.len() * ns.len());
}

#[test]
fn linear_q8_0_interleaved_matches_generic_bitwise() {
    check_interleaved(DType::Q8_0, "q8_0");
}

#[test]
fn linear_q4_0_interleaved_matches_generic_bitwise() {
    check_interleaved(DType::Q4_0, "q4_0");
}

/// Extreme interleaved weights: every quant at the end of its range (`Q8_0` −128 and 127,
/// `Q4_0` nibbles 0 and 15) against same-signed activations (block maxima quantized to ±127),
/// through every variant, bit-identical to the generic kernel on the row-major bytes. The
/// weight scale has a full 11-bit f16 significand so that the large integer sums make the f32
/// scaling round (a different operation order would show).
/// `Q8_0` weights in the x86 layout ([`PackLayout::Interleaved16x4`], what `--target
/// x86_64-avx512` plans hold) have no NEON kernel: every variant forwards them to the generic
/// kernel, which gives the row-major bits.
#[test]
fn x86_layout_goes_to_the_generic_kernel() {
    let generic = edge_kernels::generic();
    let mut rng = Rng(0x0DDB_1A5E_5BAD_5EED);
    for (m, k, n) in [(1, 32, 16), (3, 96, 17), (7, 64, 40)] {
        let x = rng.vec(m * k, 2.0);
        let w = rng.vec(n * k, 0.5);
        let wbuf = pack(DType::Q8_0, &w, n, k);
        let rm = &wbuf.as_bytes()[..n * 34 * (k / 32)];
        let mut il = vec![0u8; rm.len()];
        pack::repack(PackLayout::Interleaved16x4, DType::Q8_0, rm, n, k, &mut il);
        let packed = WeightRef {
            dtype: DType::Q8_0,
            bytes: &il,
            layout: PackLayout::Interleaved16x4,
        };
        let want = run(&generic, &x, DType::Q8_0, rm, None, m, k, n);
        for (label, table) in variants() {
            assert_eq!(
                linear_layout_variant_name(&table, DType::Q8_0, PackLayout::Interleaved16x4),
                "generic_linear_f32",
                "{label}"
            );
            let got = run_layout(&table, &x, packed, None, m, k, n);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label} m={m} k={k} n={n}"
            );
        }
    }
}

#[test]
fn interleaved_extreme_quants_match_generic() {
    let generic = edge_kernels::generic();
    let (m, k, n) = (3, 64, 9);
    let mut rng = Rng(0x2545_F491);
    for dtype in [DType::Q8_0, DType::Q4_0] {
        let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
        let bb = dtype.type_size();
        for (xv, q) in [
            (1.0f32, 0x80u8),
            (-1.0, 0x80),
            (1.0, 0x7F),
            (-3.0, 0xFF),
            (2.0, 0x00),
        ] {
            let mut rm = vec![q; n * row];
            // Scale 0x3BFF (f16 1 − 2⁻¹¹) on every block.
            for blk in rm.chunks_mut(bb) {
                blk[..2].copy_from_slice(&0x3BFFu16.to_le_bytes());
            }
            let mut il = vec![0u8; rm.len()];
            pack::interleave4x8(dtype, &rm, n, k, &mut il);
            let packed = WeightRef {
                dtype,
                bytes: &il,
                layout: PackLayout::Interleaved4x8,
            };
            let x: Vec<f32> = (0..m * k)
                .map(|_| xv * (0.25 + 0.75 * rng.next_f32().abs()))
                .collect();
            let want = run(&generic, &x, dtype, &rm, None, m, k, n);
            for (label, table) in variants() {
                let got = run_layout(&table, &x, packed, None, m, k, n);
                for (g, r) in got.iter().zip(&want) {
                    assert_eq!(
                        g.to_bits(),
                        r.to_bits(),
                        "{label} {dtype:?} x={xv} q={q:#x}: {g} vs generic {r}"
                    );
                }
            }
        }
    }
}

/// The panic message of `f`, which must panic.
fn panic_message(f: impl FnOnce()) -> String {
    let err =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Weights of a type that cannot be interleaved (plain, `Q4_1`, K-quants) but marked
/// [`PackLayout::Interleaved4x8`] panic in every variant with the generic kernel's message,
/// also when `m = 0`.
#[test]
fn interleaved_non_q8_q4_weights_panic_like_generic() {
    let generic = edge_kernels::generic();
    for dtype in [
        DType::Q4K,
        DType::Q6K,
        DType::Q4_1,
        DType::F32,
        DType::F16,
        DType::BF16,
    ] {
        let k = dtype.block_size().max(32);
        let n = 5;
        let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
        let wbuf = vec![0u32; (n * row).div_ceil(4)];
        let w = WeightRef {
            dtype,
            bytes: &wbuf.as_bytes()[..n * row],
            layout: PackLayout::Interleaved4x8,
        };
        let want = format!("linear: {dtype:?} weights cannot be in layout Interleaved4x8");
        for m in [0, 2] {
            let x = vec![0.5f32; m * k];
            let g = panic_message(|| {
                run_layout(&generic, &x, w, None, m, k, n);
            });
            assert_eq!(g, want, "generic {dtype:?} m={m}");
            for (label, table) in variants() {
                let got = panic_message(|| {
                    run_layout(&table, &x, w, None, m, k, n);
                });
                assert_eq!(got, want, "{label} {dtype:?} m={m}");
            }
        }
        let name = panic_message(|| {
            linear_layout_variant_name(&best(), dtype, PackLayout::Interleaved4x8);
        });
        assert_eq!(name, want, "linear_layout_variant_name {dtype:?}");
    }
}

/// An interleaved K-quant weight panics (the `Interleaved4x8` layout holds only `Q8_0`/`Q4_0`).
#[test]
#[should_panic(expected = "linear: Q4K weights cannot be in layout Interleaved4x8")]
fn interleaved_kquant_weight_panics() {
    let t = best();
    let (m, k, n) = (1, 256, 4);
    let mut out = vec![0f32; m * n];
    (t.linear.run)(
        &vec![0f32; m * k],
        WeightRef {
            dtype: DType::Q4K,
            bytes: &[0u8; 4 * 144],
            layout: PackLayout::Interleaved4x8,
        },
        None,
        &mut out,
        m,
        k,
        n,
        &mut [0u8; 4096],
        None,
    );
}

/// Every type a plan can store weights in (everything but `I32`) has a NEON `linear` kernel in
/// every variant on aarch64, so the planner need not refuse any type for `aarch64-neon`.
#[test]
fn every_weight_type_has_a_neon_kernel() {
    if !cfg!(target_arch = "aarch64") {
        return;
    }
    for (label, table) in variants() {
        for dtype in DType::ALL.into_iter().filter(|&d| d != DType::I32) {
            let name = linear_variant_name(&table, dtype);
            assert!(
                name.starts_with("neon_linear_"),
                "{label} {dtype:?}: {name}"
            );
        }
    }
}

/// The weight types of `kquant.rs`, with their element type name in kernel names.
const KQUANT_TYPES: [(DType, &str); 8] = [
    (DType::Q4K, "q4_k"),
    (DType::Q6K, "q6_k"),
    (DType::Q5K, "q5_k"),
    (DType::Q2K, "q2_k"),
    (DType::Q3K, "q3_k"),
    (DType::Q4_1, "q4_1"),
    (DType::Q5_0, "q5_0"),
    (DType::Q5_1, "q5_1"),
];

/// `Σ |d·sc·q·q8·d8|` over one output element, the absolute sum of the f32 terms the K-quant
/// dot products accumulate (see the module doc), for row `wrow` of `dtype` and the activation
/// row `xrow`.
fn kquant_abs_terms(dtype: DType, wrow: &[u8], xrow: &[f32]) -> f64 {
    let k = xrow.len();
    // Dequantized with one of the two super-block scales zeroed: the scale part and the min
    // part of every weight separately (types without mins: the weight itself, and zeros).
    let zeroed = |at: usize| {
        let mut w = wrow.to_vec();
        for blk in w.chunks_mut(dtype.type_size()) {
            blk[at..at + 2].fill(0);
        }
        let mut y = vec![0f32; k];
        quant::dequantize_row(dtype, &w, &mut y);
        y
    };
    let (scaled, mins) = match dtype {
        DType::Q4K | DType::Q5K => (zeroed(2), zeroed(0)),
        DType::Q2K => (zeroed(82), zeroed(80)),
        _ => {
            let mut y = vec![0f32; k];
            quant::dequantize_row(dtype, wrow, &mut y);
            (y, vec![0f32; k])
        }
    };
    let mut act = vec![0u8; quant::activation_row_bytes(dtype, k)];
    quant::quantize_activation_row(dtype, xrow, &mut act);
    let mut t = 0f64;
    for (b, blk) in act.chunks(292).enumerate() {
        let d8 = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]) as f64;
        for e in 0..256 {
            let q8 = blk[4 + e] as i8 as f64;
            let i = 256 * b + e;
            t += (scaled[i].abs() as f64 + mins[i].abs() as f64) * (q8 * d8).abs();
        }
    }
    t
}

/// Every variant against the generic kernel for one `kquant.rs` weight type, `m`, `n` over all
/// pairs of ragged sizes, with and without bias; checks the reported kernel name.
fn check_kquant(dtype: DType, name: &str) {
    let generic = edge_kernels::generic();
    let bs = dtype.block_size();
    let ks: Vec<usize> = if bs == 256 {
        vec![256, 512, 768]
    } else {
        vec![32, 96, 224]
    };
    let ms = [1, 2, 3, 5, 7, 9];
    let ns = [1, 3, 5, 7, 13, 66];
    let u = f32::EPSILON as f64 / 2.0;
    let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ dtype as u64);
    let (mut cases, mut bounded, mut differing, mut max_ratio) = (0, 0, 0, 0f64);
    for (ki, &k) in ks.iter().enumerate() {
        let nb = k / bs;
        for (mi, &m) in ms.iter().enumerate() {
            for (ni, &n) in ns.iter().enumerate() {
                let x = rng.vec(m * k, 2.0);
                let w = rng.vec(n * k, 0.5);
                let wbuf = pack(dtype, &w, n, k);
                let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
                let wbytes = &wbuf.as_bytes()[..n * row];
                let bias_v = rng.vec(n, 1.0);
                let bias = ((ki + mi + ni) % 2 == 0).then_some(&bias_v[..]);
                let want = run(&generic, &x, dtype, wbytes, bias, m, k, n);
                for (label, table) in variants() {
                    let kernel = linear_variant_name(&table, dtype);
                    let sdot = features().dotprod && label != "neon";
                    let expect = if cfg!(target_arch = "aarch64") {
                        format!(
                            "neon_linear_{name}_{}",
                            if sdot { "dotprod" } else { "base" }
                        )
                    } else {
                        "generic_linear_f32".to_string()
                    };
                    assert_eq!(kernel, expect, "{label} {dtype:?}: kernel name");
                    let exact = !sdot
                        || !matches!(dtype, DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K);
                    let got = run(&table, &x, dtype, wbytes, bias, m, k, n);
                    for i in 0..m {
                        for j in 0..n {
                            let (g, r) = (got[i * n + j], want[i * n + j]);
                            if exact {
                                assert_eq!(
                                    g.to_bits(),
                                    r.to_bits(),
                                    "{label} {dtype:?} m={m} k={k} n={n} [{i},{j}]: {g} vs \
                                     generic {r}"
                                );
                                continue;
                            }
                            let t = kquant_abs_terms(
                                dtype,
                                &wbytes[j * row..(j + 1) * row],
                                &x[i * k..(i + 1) * k],
                            );
                            let tol = (3 * nb + 16) as f64 * u * t * 1.0001
                                + 2.0 * u * (g.abs() as f64 + r.abs() as f64);
                            let diff = (g as f64 - r as f64).abs();
                            assert!(
                                g.is_finite() && diff <= tol,
                                "{label} {dtype:?} m={m} k={k} n={n} [{i},{j}]: {g} vs generic \
                                 {r}, |diff| {diff} > {tol}"
                            );
                            bounded += 1;
                            differing += usize::from(g.to_bits() != r.to_bits());
                            max_ratio = max_ratio.max(diff / (u * t).max(f64::MIN_POSITIVE));
                        }
                    }
                    cases += 1;
                }
            }
        }
    }
    println!(
        "{dtype:?}: {cases} cases, {bounded} elements under the f32 bound ({differing} not \
         bit-identical), max |diff| = {max_ratio:.2}·u·T"
    );
    assert!(cases >= ks.len() * ms.len() * ns.len());
}

#[test]
fn linear_q4_k_matches_generic() {
    check_kquant(DType::Q4K, "q4_k");
}

#[test]
fn linear_q6_k_matches_generic() {
    check_kquant(DType::Q6K, "q6_k");
}

#[test]
fn linear_q5_k_matches_generic() {
    check_kquant(DType::Q5K, "q5_k");
}

#[test]
fn linear_q2_k_matches_generic_bitwise() {
    check_kquant(DType::Q2K, "q2_k");
}

#[test]
fn linear_q3_k_matches_generic() {
    check_kquant(DType::Q3K, "q3_k");
}

#[test]
fn linear_q4_1_matches_generic_bitwise() {
    check_kquant(DType::Q4_1, "q4_1");
}

#[test]
fn linear_q5_0_matches_generic_bitwise() {
    check_kquant(DType::Q5_0, "q5_0");
}

#[test]
fn linear_q5_1_matches_generic_bitwise() {
    check_kquant(DType::Q5_1, "q5_1");
}

/// Extreme K-quant inputs: all-zero activations and weights, and constant rows (every quant at
/// the end of its range), through every variant.
#[test]
fn kquant_extreme_inputs_match_generic() {
    let generic = edge_kernels::generic();
    let (m, n) = (3, 5);
    for (dtype, _) in KQUANT_TYPES {
        let k = 2 * dtype.block_size();
        let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
        for (xv, wv) in [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (-3.0, 2.0), (5.0, -7.0)] {
            let x = vec![xv; m * k];
            let w = vec![wv; n * k];
            let wbuf = pack(dtype, &w, n, k);
            let wbytes = &wbuf.as_bytes()[..n * row];
            let want = run(&generic, &x, dtype, wbytes, None, m, k, n);
            for (label, table) in variants() {
                let got = run(&table, &x, dtype, wbytes, None, m, k, n);
                for (g, r) in got.iter().zip(&want) {
                    let tol = 1e-5 * r.abs();
                    assert!(
                        (g - r).abs() <= tol,
                        "{label} {dtype:?} x={xv} w={wv}: {g} vs generic {r}"
                    );
                }
            }
        }
    }
}

/// Wrong shapes panic with the generic kernel's messages.
#[test]
#[should_panic(expected = "is not a whole number of")]
fn kquant_ragged_k_panics_like_generic() {
    let t = best();
    let (m, k, n) = (1, 100, 2);
    let mut out = vec![0f32; m * n];
    (t.linear.run)(
        &vec![0f32; m * k],
        WeightRef::row_major(DType::Q4K, &[0u8; 288]),
        None,
        &mut out,
        m,
        k,
        n,
        &mut [0u8; 4096],
        None,
    );
}

/// Zero-sized `m`/`n` return without touching `out`, as the generic kernel.
#[test]
fn kquant_zero_sizes() {
    for (dtype, _) in KQUANT_TYPES {
        let k = dtype.block_size();
        let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
        let wbuf = pack(dtype, &vec![0.5f32; 3 * k], 3, k);
        let wbytes = &wbuf.as_bytes()[..3 * row];
        for (label, table) in variants() {
            let none = run(&table, &[], dtype, wbytes, None, 0, k, 3);
            assert!(none.is_empty(), "{label} {dtype:?} m=0");
            let x = vec![1f32; 2 * k];
            let none = run(&table, &x, dtype, &[], None, 2, k, 0);
            assert!(none.is_empty(), "{label} {dtype:?} n=0");
        }
    }
}

/// Results do not depend on the number of threads (fixed reduction order per element).
#[test]
fn thread_count_does_not_change_results() {
    let (m, k, n) = (37, 100, 45);
    let mut rng = Rng(7);
    let types = [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0]
        .into_iter()
        .chain(KQUANT_TYPES.map(|(d, _)| d));
    for dtype in types {
        let kk = if dtype.is_quantized() {
            2 * dtype.block_size().max(64)
        } else {
            k
        };
        let xs = rng.vec(m * kk, 1.0);
        let w = rng.vec(n * kk, 1.0);
        let wbuf = pack(dtype, &w, n, kk);
        let row = dtype.bytes_for(kk as u64).expect("whole blocks") as usize;
        let wbytes = &wbuf.as_bytes()[..n * row];
        let mut il = vec![0u8; wbytes.len()];
        let mut layouts = vec![WeightRef::row_major(dtype, wbytes)];
        if pack::interleaves(dtype) {
            pack::interleave4x8(dtype, wbytes, n, kk, &mut il);
            layouts.push(WeightRef {
                dtype,
                bytes: &il,
                layout: PackLayout::Interleaved4x8,
            });
        }
        for (label, table) in variants() {
            for &w in &layouts {
                let on = |threads: usize| {
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("thread pool")
                        .install(|| run_layout(&table, &xs, w, None, m, kk, n))
                };
                let one = on(1);
                let three = on(3);
                assert!(
                    one.iter()
                        .zip(&three)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{label} {dtype:?} {:?}: 1 thread and 3 threads differ",
                    w.layout
                );
            }
        }
    }
}

/// Prints which kernels run on this CPU and checks the choice against the detected features
/// (and against `EDGE_NEON_EXPECT`, set by `scripts/test-aarch64` per qemu CPU model).
#[test]
fn reports_and_checks_the_chosen_path() {
    let f = features();
    let t = best();
    println!("features: {f:?}");
    for (label, table) in variants() {
        println!("variant {label}: {:?}", table.names());
        let types = [
            DType::F32,
            DType::F16,
            DType::Q8_0,
            DType::Q4_0,
            DType::BF16,
        ]
        .into_iter()
        .chain(KQUANT_TYPES.map(|(d, _)| d));
        for dtype in types {
            println!(
                "  linear {dtype:?} -> {}",
                linear_variant_name(&table, dtype)
            );
            if pack::interleaves(dtype) {
                println!(
                    "  linear {dtype:?} Interleaved4x8 -> {}",
                    linear_layout_variant_name(&table, dtype, PackLayout::Interleaved4x8)
                );
            }
        }
    }
    println!("best: {:?}", t.names());
    let generic = edge_kernels::generic();
    if cfg!(target_arch = "aarch64") {
        let (want, q8) = if f.i8mm {
            ("neon_linear_any_i8mm", "neon_linear_q8_0_i8mm_2x4")
        } else if f.dotprod {
            ("neon_linear_any_dotprod", "neon_linear_q8_0_dotprod")
        } else {
            ("neon_linear_any_base", "neon_linear_q8_0_base")
        };
        assert_eq!(t.linear.name, want);
        assert_eq!(
            variants().len(),
            1 + usize::from(f.dotprod) + usize::from(f.i8mm)
        );
        assert_eq!(linear_variant_name(&t, DType::Q8_0), q8);
        let kq = if f.dotprod { "dotprod" } else { "base" };
        for (dtype, name) in KQUANT_TYPES {
            assert_eq!(
                linear_variant_name(&t, dtype),
                format!("neon_linear_{name}_{kq}")
            );
        }
        assert_eq!(
            linear_variant_name(&t, DType::BF16),
            "neon_linear_bf16_6x16"
        );
    } else {
        assert_eq!(t.linear.name, generic.linear.name);
    }
    // On aarch64 every kernel slot is NEON except these: the scratch-size slots stay generic (the
    // planner sizes the arena with the generic functions, so NEON kernels must fit them), and
    // so does `attention_bf16` (the bf16-pair products of `--attention-products bf16`, which
    // only x86's `vdpbf16ps` runs natively; the generic step defines them). Everything is
    // generic elsewhere.
    for ((slot, a), (_, b)) in t.names().iter().zip(generic.names()) {
        if cfg!(target_arch = "aarch64")
            && !slot.ends_with("_scratch_bytes")
            && *slot != "attention_bf16"
        {
            assert!(a.starts_with("neon_"), "slot {slot}: {a}");
        } else {
            assert_eq!(*a, b, "slot {slot}");
        }
    }
    match std::env::var("EDGE_NEON_EXPECT").as_deref() {
        Ok("i8mm") => assert!(f.i8mm && f.dotprod && t.linear.name.ends_with("_i8mm")),
        Ok("dotprod") => assert!(!f.i8mm && f.dotprod && t.linear.name.ends_with("_dotprod")),
        Ok("base") => assert!(!f.i8mm && !f.dotprod && t.linear.name.ends_with("_base")),
        Ok(other) => panic!("EDGE_NEON_EXPECT={other}: expected i8mm, dotprod or base"),
        Err(_) => {}
    }
}

/// A `linear` with the GELU fused into its epilogue (the table's `gelu_tanh_in_place` handed to
/// its `linear`, as the session does for `Epilogue::GeluTanh`) gives the bits of the same
/// variant's product followed by the generic `gelu_tanh` op, on every variant: the shared GEMM
/// driver with the NEON tile (F32/F16/BF16, few and many rows) and the quantized kernels (Q8_0,
/// Q4_0 row-major and interleaved, Q4_K), with and without bias. (Whether each product equals
/// the generic one, or stays within its bound for the K-quants on `dotprod`, the tests above
/// check.)
#[test]
fn fused_gelu_epilogue_matches_the_unfused_generic() {
    let generic = edge_kernels::generic();
    let mut rng = Rng(0x0DDB_A11C_AFE5_7EED);
    for (dtype, layout) in [
        (DType::F32, PackLayout::RowMajor),
        (DType::F16, PackLayout::RowMajor),
        (DType::BF16, PackLayout::RowMajor),
        (DType::Q8_0, PackLayout::RowMajor),
        (DType::Q8_0, PackLayout::Interleaved4x8),
        (DType::Q4_0, PackLayout::Interleaved4x8),
        (DType::Q4K, PackLayout::RowMajor),
    ] {
        let k = if dtype == DType::Q4K { 256 } else { 96 };
        for (m, n) in [(1, 70), (9, 33), (40, 130)] {
            let x = rng.vec(m * k, 2.0);
            let w = rng.vec(n * k, 0.5);
            let bias = rng.vec(n, 1.0);
            let wbuf = pack(dtype, &w, n, k);
            let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
            let rm = &wbuf.as_bytes()[..n * row];
            let mut packed = Vec::new();
            let wl = edge_kernels::pack::in_layout(layout, dtype, rm, n, k, &mut packed);
            for b in [None, Some(bias.as_slice())] {
                for (label, table) in variants() {
                    let need = (table.linear_scratch_bytes.run)(dtype, m, k);
                    let mut scratch = vec![0u32; need.div_ceil(4)];
                    let mut plain = vec![f32::NAN; m * n];
                    let s = scratch.as_mut_bytes();
                    (table.linear.run)(&x, wl, b, &mut plain, m, k, n, s, None);
                    let mut want = vec![0f32; m * n];
                    (generic.gelu_tanh.run)(&plain, &mut want);
                    let mut got = vec![f32::NAN; m * n];
                    let epi = Some(table.gelu_tanh_in_place.run);
                    (table.linear.run)(&x, wl, b, &mut got, m, k, n, scratch.as_mut_bytes(), epi);
                    for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            r.to_bits(),
                            "{label} linear+gelu {dtype:?} {layout:?} m={m} k={k} n={n} bias={} \
                             element {i}: {g} vs generic {r}",
                            b.is_some()
                        );
                    }
                }
            }
        }
    }
}
