//! Every `linear` variant of this crate ([`edge_kernels_neon::variants`]: the ARMv8.0 table
//! and, when the CPU has them, the `dotprod` and `i8mm` tables) against its generic twin
//! [`edge_kernels::linear`] on random inputs with ragged shapes.
//!
//! - `F32`/`F16` weights: `|neon − generic| ≤ 1e-5 · (Σ_c |x·w| + |bias|)` per element (both
//!   are f32 dot products in different fixed orders; the bound is a few hundred f32 ulps of the
//!   sum of absolute products, far above the rounding of k ≤ 100 terms).
//! - `Q8_0`/`Q4_0` weights: bit-identical (exact integer block sums, same f32 scaling order).
//! - Other weight types (`Q4_K`, …) are forwarded to the generic kernel: bit-identical.
//!
//! Run under qemu with `QEMU_CPU=max` (dotprod and i8mm present) and `QEMU_CPU=cortex-a72`
//! (both absent);
//! `EDGE_NEON_EXPECT=i8mm|dotprod|base` makes `reports_and_checks_the_chosen_path` assert the choice.

use edge_kernels::{quant, KernelTable, WeightRef};
use edge_kernels_neon::{best, features, linear_variant_name, variants};
use edge_schema::DType;
use zerocopy::IntoBytes;

/// xorshift64* in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

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
        WeightRef {
            dtype,
            bytes: wbytes,
        },
        bias,
        &mut out,
        m,
        k,
        n,
        scratch.as_mut_bytes(),
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
fn linear_f32_matches_generic() {
    check_dtype(DType::F32, &[1, 3, 17, 100], false);
}

#[test]
fn linear_f16_matches_generic() {
    check_dtype(DType::F16, &[1, 3, 17, 100], false);
}

#[test]
fn linear_q8_0_matches_generic_bitwise() {
    check_dtype(DType::Q8_0, &[32, 64, 96, 128, 160, 192, 224], true);
}

#[test]
fn linear_q4_0_matches_generic_bitwise() {
    check_dtype(DType::Q4_0, &[32, 64, 96, 128, 160, 192, 224], true);
}

/// Types without a NEON kernel go through the generic `linear` unchanged.
#[test]
fn forwarded_types_match_generic_bitwise() {
    for dtype in [DType::Q4K, DType::Q6K, DType::BF16, DType::Q5_0] {
        let k = 256;
        check_dtype(dtype, &[k], true);
    }
}

/// Results do not depend on the number of threads (fixed reduction order per element).
#[test]
fn thread_count_does_not_change_results() {
    let (m, k, n) = (37, 100, 45);
    let mut rng = Rng(7);
    for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
        let kk = if dtype.is_quantized() { 128 } else { k };
        let xs = rng.vec(m * kk, 1.0);
        let w = rng.vec(n * kk, 1.0);
        let wbuf = pack(dtype, &w, n, kk);
        let row = dtype.bytes_for(kk as u64).expect("whole blocks") as usize;
        let wbytes = &wbuf.as_bytes()[..n * row];
        for (label, table) in variants() {
            let on = |threads: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("thread pool")
                    .install(|| run(&table, &xs, dtype, wbytes, None, m, kk, n))
            };
            let one = on(1);
            let three = on(3);
            assert!(
                one.iter()
                    .zip(&three)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label} {dtype:?}: 1 thread and 3 threads differ"
            );
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
        for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4K] {
            println!(
                "  linear {dtype:?} -> {}",
                linear_variant_name(&table, dtype)
            );
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
    } else {
        assert_eq!(t.linear.name, generic.linear.name);
    }
    // Every slot other than these stays generic.
    let neon = ["linear", "silu", "gelu_tanh", "layer_norm", "rms_norm"];
    for ((slot, a), (_, b)) in t.names().iter().zip(generic.names()) {
        if cfg!(target_arch = "aarch64") && neon.contains(slot) {
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
