//! `linear` against an f64 reference, for every plain weight type and the ggml block types.

mod common;

use common::*;
use edge_kernels::{linear, linear_scratch_bytes, quant, WeightRef};
use edge_schema::DType;

/// `Σ_c x[i,c]·w[j,c] + b[j]` in f64, and `Σ |x·w| + |b|` for the tolerance.
fn reference(
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            let mut a = 0.0f64;
            for c in 0..k {
                let p = f64::from(x[i * k + c]) * f64::from(w[j * k + c]);
                s += p;
                a += p.abs();
            }
            if let Some(b) = b {
                s += f64::from(b[j]);
                a += f64::from(b[j]).abs();
            }
            out[i * n + j] = s;
            mag[i * n + j] = a;
        }
    }
    (out, mag)
}

/// Weight bytes of `dtype` for `w` and the values they really hold.
fn plain_weight(dtype: DType, w: &[f32]) -> (AlignedBytes, Vec<f32>) {
    match dtype {
        DType::F32 => (f32_bytes(w), w.to_vec()),
        DType::F16 => f16_bytes(w),
        DType::BF16 => bf16_bytes(w),
        _ => unreachable!(),
    }
}

fn run(
    dtype: DType,
    wb: &AlignedBytes,
    x: &[f32],
    b: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * n];
    let mut scratch = AlignedBytes::zeroed(linear_scratch_bytes(dtype, m, k));
    linear(
        x,
        WeightRef::row_major(dtype, wb.bytes()),
        b,
        &mut out,
        m,
        k,
        n,
        scratch.bytes_mut(),
        None,
    );
    out
}

/// The order the GEMM driver defines for every ISA (`gemm.rs`): per output element one
/// accumulator from `0.0`, `acc = fma(x[c], w[c], acc)` for `c = 0..k` in order, then `+ bias`.
/// Shapes cross the driver's feature blocks (128), column blocks (64), its few-rows path and,
/// on pools of 1, 2, 3 and 5 threads, both its row split and its column tasks (which it picks
/// by the thread count and the number of column tasks, 1 to 4 panels of 64 wide (`panel_cols`,
/// narrowed until the tasks share evenly): 5 threads is more than the scratch
/// has panel slots).
#[test]
fn plain_types_follow_the_fused_sequential_order_bit_for_bit() {
    let mut rng = Rng::new(0x5EED_F00D);
    for (m, k, n, threads) in [
        (1, 5, 3, 2),
        (3, 300, 150, 2),
        (7, 129, 65, 2),
        (8, 128, 64, 2),
        (70, 260, 131, 1),
        (70, 260, 131, 2),
        (70, 260, 131, 3),
        (40, 300, 520, 2),
        (9, 33, 200, 3),
        (40, 300, 520, 5),
    ] {
        let x = rng.vec(m * k, 2.0);
        let w = rng.vec(n * k, 0.5);
        let bias = rng.vec(n, 1.0);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (wb, wv) = plain_weight(dtype, &w);
            for b in [None, Some(bias.as_slice())] {
                let got = with_threads(threads, || run(dtype, &wb, &x, b, m, k, n));
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = 0f32;
                        for c in 0..k {
                            acc = x[i * k + c].mul_add(wv[j * k + c], acc);
                        }
                        let want = b.map_or(acc, |b| acc + b[j]);
                        assert_eq!(
                            got[i * n + j].to_bits(),
                            want.to_bits(),
                            "{dtype:?} m={m} k={k} n={n}, {threads} threads, at ({i}, {j}): {} vs {want}",
                            got[i * n + j]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn plain_types_match_f64_reference_on_ragged_shapes() {
    let mut rng = Rng::new(1);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for &m in &SIZES {
            for &k in &SIZES {
                for &n in &SIZES {
                    let x = rng.vec(m * k, 1.0);
                    let w = rng.vec(n * k, 0.5);
                    let bias = rng.vec(n, 1.0);
                    let b = ((m + k + n) % 2 == 0).then_some(bias.as_slice());
                    let (wb, wv) = plain_weight(dtype, &w);
                    let got = run(dtype, &wb, &x, b, m, k, n);
                    let (want, mag) = reference(&x, &wv, b, m, k, n);
                    assert_close(&format!("{dtype:?} m={m} k={k} n={n}"), &got, &want, |i| {
                        1e-6 * mag[i] + 1e-30
                    });
                }
            }
        }
    }
}

#[test]
fn large_panels_and_row_blocks() {
    // n > 64 (several F16 panels) and m > 64 (several row blocks of the tall path).
    let mut rng = Rng::new(2);
    for dtype in [DType::F32, DType::F16] {
        let (m, k, n) = (150, 72, 200);
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 0.5);
        let bias = rng.vec(n, 1.0);
        let (wb, wv) = plain_weight(dtype, &w);
        let got = run(dtype, &wb, &x, Some(&bias), m, k, n);
        let (want, mag) = reference(&x, &wv, Some(&bias), m, k, n);
        assert_close(&format!("{dtype:?}"), &got, &want, |i| 1e-6 * mag[i]);
    }
}

#[test]
fn identical_for_any_thread_count() {
    let mut rng = Rng::new(3);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (m, k, n) in [(1, 100, 130), (5, 33, 64), (100, 17, 100), (33, 64, 5)] {
            let x = rng.vec(m * k, 1.0);
            let w = rng.vec(n * k, 0.5);
            let bias = rng.vec(n, 1.0);
            let (wb, _) = plain_weight(dtype, &w);
            assert_thread_invariant(&format!("{dtype:?} {m}x{k}x{n}"), || {
                run(dtype, &wb, &x, Some(&bias), m, k, n)
            });
        }
    }
}

/// Every ggml block type, with its block size.
fn quantized_types() -> Vec<(DType, usize)> {
    DType::ALL
        .into_iter()
        .filter(|d| d.is_quantized())
        .map(|d| (d, d.block_size()))
        .collect()
}

/// Random `[n, k]` weights quantized row by row with ggml's reference quantizer
/// (`quant::quantize_row`), and the values they hold (`quant::dequantize_row`).
fn random_quant_weight(
    rng: &mut Rng,
    dtype: DType,
    n: usize,
    k: usize,
) -> (AlignedBytes, Vec<f32>) {
    let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
    let mut bytes = vec![0u8; n * row];
    let mut deq = vec![0.0f32; n * k];
    for j in 0..n {
        let w = rng.vec(k, 0.5);
        quant::quantize_row(dtype, &w, &mut bytes[j * row..(j + 1) * row]);
        quant::dequantize_row(
            dtype,
            &bytes[j * row..(j + 1) * row],
            &mut deq[j * k..(j + 1) * k],
        );
    }
    (AlignedBytes::from_bytes(&bytes), deq)
}

#[test]
fn quantized_equals_ggml_vec_dot_composition() {
    let mut rng = Rng::new(4);
    for (dtype, bs) in quantized_types() {
        for (m, kb, n) in [(1, 1, 5), (3, 2, 17), (17, 1, 33), (9, 3, 100)] {
            let k = kb * bs;
            let x = rng.vec(m * k, 1.0);
            let bias = rng.vec(n, 1.0);
            let (wb, _) = random_quant_weight(&mut rng, dtype, n, k);
            let got = run(dtype, &wb, &x, Some(&bias), m, k, n);
            let arow = quant::activation_row_bytes(dtype, k);
            let wrow = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
            for i in 0..m {
                let mut act = vec![0u8; arow];
                quant::quantize_activation_row(dtype, &x[i * k..(i + 1) * k], &mut act);
                for j in 0..n {
                    let want =
                        quant::vec_dot(dtype, k, &wb.bytes()[j * wrow..(j + 1) * wrow], &act)
                            + bias[j];
                    assert_eq!(
                        got[i * n + j].to_bits(),
                        want.to_bits(),
                        "{dtype:?} m={m} k={k} n={n} ({i},{j})"
                    );
                }
            }
        }
    }
}

#[test]
fn quantized_close_to_f64_reference_of_dequantized_weights() {
    // The only error left is the 8-bit quantization of the activations (ggml's vec_dot_type):
    // per element at most half a step (row max / 127) times Σ|w|, plus the f16 rounding of the
    // Q8_0 block scale (relative 2⁻¹¹ of the row max).
    let mut rng = Rng::new(5);
    for (dtype, bs) in quantized_types() {
        let (m, k, n) = (7, 2 * bs, 19);
        let x = rng.vec(m * k, 1.0);
        let (wb, deq) = random_quant_weight(&mut rng, dtype, n, k);
        let got = run(dtype, &wb, &x, None, m, k, n);
        let (want, _) = reference(&x, &deq, None, m, k, n);
        for i in 0..m {
            let xmax = x[i * k..(i + 1) * k]
                .iter()
                .fold(0.0f32, |a, v| a.max(v.abs()));
            for j in 0..n {
                let wabs: f64 = deq[j * k..(j + 1) * k]
                    .iter()
                    .map(|v| f64::from(v.abs()))
                    .sum();
                let tol = f64::from(xmax) * (0.5 / 127.0 + 1e-3) * wabs + 1e-5;
                let e = (f64::from(got[i * n + j]) - want[i * n + j]).abs();
                assert!(
                    e <= tol,
                    "{dtype:?} ({i},{j}): got {}, want {}, tol {tol}",
                    got[i * n + j],
                    want[i * n + j]
                );
            }
        }
    }
}

#[test]
fn quantized_identical_for_any_thread_count() {
    let mut rng = Rng::new(6);
    let (m, k, n) = (10, 64, 130);
    let x = rng.vec(m * k, 1.0);
    let (wb, _) = random_quant_weight(&mut rng, DType::Q8_0, n, k);
    assert_thread_invariant("q8_0", || run(DType::Q8_0, &wb, &x, None, m, k, n));
}

#[test]
fn scratch_sizes() {
    // One column task's f32 panels (as many 64-column panels as fit 1 MiB, 1 to 4) per slot
    // from 8 rows on, one task's below.
    assert_eq!(edge_kernels::PANEL_SLOTS, 4);
    assert_eq!(edge_kernels::panel_cols(64), 256);
    assert_eq!(edge_kernels::panel_cols(1152), 192);
    assert_eq!(edge_kernels::panel_cols(4608), 64);
    assert_eq!(edge_kernels::panel_cols(100_000), 64);
    assert_eq!(linear_scratch_bytes(DType::F32, 100, 64), 4 * 256 * 64 * 4);
    assert_eq!(
        linear_scratch_bytes(DType::F16, 8, 1152),
        4 * 192 * 1152 * 4
    );
    assert_eq!(linear_scratch_bytes(DType::F16, 8, 4608), 4 * 64 * 4608 * 4);
    assert_eq!(linear_scratch_bytes(DType::BF16, 7, 64), 256 * 64 * 4);
    // Quantized activations (for the 32-element block types room for the SIMD twins' widened
    // blocks, 40 bytes per 32 values; rounded up to 64 bytes), then one repacked panel of up to
    // 512 weight columns (at most 2 MiB, at least 64 columns) for the 32-element block types
    // (used by the SIMD twins).
    assert_eq!(edge_kernels::QUANT_ACT_BLOCK_BYTES, 40);
    assert!(quant::activation_row_bytes(DType::Q4_1, 64) <= 2 * 40);
    assert_eq!(
        linear_scratch_bytes(DType::Q8_0, 3, 64),
        (3 * 2 * 40usize).next_multiple_of(64) + 512 * 2 * 44
    );
    assert_eq!(edge_kernels::quant_panel_cols(1152), 512);
    assert_eq!(edge_kernels::quant_panel_cols(4608), 320);
    assert_eq!(edge_kernels::quant_panel_cols(1 << 20), 64);
    assert_eq!(
        linear_scratch_bytes(DType::Q4K, 3, 256),
        (3 * quant::activation_row_bytes(DType::Q4K, 256)).next_multiple_of(64)
    );
}

#[test]
#[should_panic(expected = "linear: weight has")]
fn wrong_weight_length_panics_with_message() {
    let x = vec![0.0f32; 4];
    let w = f32_bytes(&[0.0; 7]);
    let mut out = vec![0.0f32; 4];
    linear(
        &x,
        WeightRef::row_major(DType::F32, w.bytes()),
        None,
        &mut out,
        2,
        2,
        2,
        &mut [],
        None,
    );
}

#[test]
#[should_panic(expected = "cannot be viewed as f32")]
fn misaligned_f32_weight_panics_with_message() {
    let x = vec![0.0f32; 2];
    let w = f32_bytes(&[0.0; 3]);
    let mut out = vec![0.0f32; 1];
    let bytes = &w.bytes()[..12];
    let mut shifted = AlignedBytes::zeroed(13);
    shifted.bytes_mut()[1..].copy_from_slice(bytes);
    linear(
        &x,
        WeightRef::row_major(DType::F32, &shifted.bytes()[1..9]),
        None,
        &mut out,
        1,
        2,
        1,
        AlignedBytes::zeroed(linear_scratch_bytes(DType::F32, 1, 2)).bytes_mut(),
        None,
    );
}

#[test]
fn misaligned_f16_weights_give_the_same_result() {
    // F16 rows are read byte-wise when they are not 2-aligned: same values, same order.
    let mut rng = Rng::new(7);
    let (m, k, n) = (9, 33, 70);
    let x = rng.vec(m * k, 1.0);
    let (wb, _) = f16_bytes(&rng.vec(n * k, 0.5));
    let aligned = run(DType::F16, &wb, &x, None, m, k, n);
    let mut shifted = AlignedBytes::zeroed(wb.bytes().len() + 1);
    shifted.bytes_mut()[1..].copy_from_slice(wb.bytes());
    let mut out = vec![0.0; m * n];
    let mut scratch = AlignedBytes::zeroed(linear_scratch_bytes(DType::F16, m, k));
    let w = WeightRef::row_major(DType::F16, &shifted.bytes()[1..]);
    linear(&x, w, None, &mut out, m, k, n, scratch.bytes_mut(), None);
    assert_eq!(aligned, out);
}

/// `Interleaved4x8` (`Q8_0`, `Q4_0`) and `Interleaved16x4` (`Q8_0`) weights
/// (`edge_kernels::pack`) give bit-identical results to the same matrix row-major, on ragged
/// row counts (groups plus a row-major tail, or no group at all) and block counts; other types
/// in those layouts are refused.
#[test]
fn interleaved_q8_0_q4_0_match_row_major_bitwise() {
    use edge_kernels::pack::repack;
    use edge_schema::plan::PackLayout;
    let mut rng = Rng::new(7);
    for (layout, dtype) in [
        (PackLayout::Interleaved4x8, DType::Q8_0),
        (PackLayout::Interleaved4x8, DType::Q4_0),
        (PackLayout::Interleaved16x4, DType::Q8_0),
    ] {
        for n in [1, 3, 4, 5, 8, 13, 16, 21, 32, 35] {
            for k in [32, 96] {
                for m in [1, 3] {
                    let w = rng.vec(n * k, 1.0);
                    let x = rng.vec(m * k, 2.0);
                    let row = dtype.bytes_for(k as u64).unwrap() as usize;
                    let mut rm = vec![0u8; n * row];
                    for (src, dst) in w.chunks(k).zip(rm.chunks_mut(row)) {
                        quant::quantize_row(dtype, src, dst);
                    }
                    let mut il = vec![0u8; rm.len()];
                    repack(layout, dtype, &rm, n, k, &mut il);
                    let mut scratch = AlignedBytes::zeroed(linear_scratch_bytes(dtype, m, k));
                    let mut a = vec![0f32; m * n];
                    let mut b = vec![0f32; m * n];
                    linear(
                        &x,
                        WeightRef::row_major(dtype, &rm),
                        None,
                        &mut a,
                        m,
                        k,
                        n,
                        scratch.bytes_mut(),
                        None,
                    );
                    let wi = WeightRef {
                        dtype,
                        bytes: &il,
                        layout,
                    };
                    linear(&x, wi, None, &mut b, m, k, n, scratch.bytes_mut(), None);
                    assert!(
                        a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                        "{layout:?} {dtype:?} n={n} k={k} m={m}"
                    );
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "linear: Q4K weights cannot be in layout Interleaved4x8")]
fn interleaved_k_quant_is_refused() {
    let w = vec![0u8; 4 * 144];
    let mut out = vec![0f32; 4];
    let mut scratch = AlignedBytes::zeroed(linear_scratch_bytes(DType::Q4K, 1, 256));
    let wi = WeightRef {
        dtype: DType::Q4K,
        bytes: &w,
        layout: edge_schema::plan::PackLayout::Interleaved4x8,
    };
    linear(
        &[0.0; 256],
        wi,
        None,
        &mut out,
        1,
        256,
        4,
        scratch.bytes_mut(),
        None,
    );
}

/// `linear` with an epilogue (the GELU a plan fuses into a product, `Epilogue::GeluTanh`) gives
/// the product's bits followed by the `gelu_tanh` op's, on every path of the generic kernel: the
/// GEMM driver's row split, column tasks and few-rows column blocks (F32/F16/BF16), the ggml
/// `vec_dot` path of every block type and the BF16 pairs layout, with and without bias.
#[test]
fn fused_gelu_epilogue_is_the_product_then_the_op() {
    use edge_kernels::{gelu_tanh, gelu_tanh_in_place};
    use edge_schema::plan::PackLayout;
    let mut rng = Rng::new(17);
    let mut cases: Vec<(DType, usize)> = vec![(DType::F32, 1), (DType::F16, 1), (DType::BF16, 1)];
    cases.extend(quantized_types());
    for (dtype, bs) in cases {
        for (m, kb, n) in [(1, 2, 70), (5, 3, 9), (9, 2, 130), (40, 1, 65)] {
            let k = kb * bs.max(32);
            let x = rng.vec(m * k, 2.0);
            let bias = rng.vec(n, 1.0);
            let (wb, _) = if dtype.is_quantized() {
                random_quant_weight(&mut rng, dtype, n, k)
            } else {
                plain_weight(dtype, &rng.vec(n * k, 0.5))
            };
            let mut layouts = vec![PackLayout::RowMajor];
            if dtype == DType::BF16 {
                layouts.push(PackLayout::Bf16Pairs16);
            }
            for layout in layouts {
                let mut packed = Vec::new();
                let w = edge_kernels::pack::in_layout(layout, dtype, wb.bytes(), n, k, &mut packed);
                for b in [None, Some(bias.as_slice())] {
                    let mut scratch = AlignedBytes::zeroed(linear_scratch_bytes(dtype, m, k));
                    let mut plain = vec![f32::NAN; m * n];
                    linear(&x, w, b, &mut plain, m, k, n, scratch.bytes_mut(), None);
                    let mut want = vec![0f32; m * n];
                    gelu_tanh(&plain, &mut want);
                    let mut got = vec![f32::NAN; m * n];
                    let epi = Some(gelu_tanh_in_place as edge_kernels::EpilogueFn);
                    linear(&x, w, b, &mut got, m, k, n, scratch.bytes_mut(), epi);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{dtype:?} {layout:?} m={m} k={k} n={n} bias={}",
                        b.is_some()
                    );
                }
            }
        }
    }
}

/// `Q8_0` weights in `PackLayout::Interleaved8x4A7` (`edgeplan compile --activation-bits 7`):
/// every output is `quant::vec_dot` of the row-major weight row with the activation row
/// quantized by `quant::quantize_row_q8_0_a7` (7-bit values), plus the bias — not the 8-bit
/// result — on whole groups of 8 rows and row-major tails.
#[test]
fn q8_0_with_7_bit_activations_is_vec_dot_of_the_7_bit_row() {
    use edge_schema::plan::PackLayout;
    let mut rng = Rng::new(41);
    let mut differs = 0;
    for (m, k, n) in [(1, 32, 8), (3, 64, 9), (5, 96, 23), (9, 256, 17)] {
        let x = rng.vec(m * k, 1.0);
        let bias = rng.vec(n, 1.0);
        let (wb, _) = random_quant_weight(&mut rng, DType::Q8_0, n, k);
        let mut packed = Vec::new();
        let w = edge_kernels::pack::in_layout(
            PackLayout::Interleaved8x4A7,
            DType::Q8_0,
            wb.bytes(),
            n,
            k,
            &mut packed,
        );
        let mut out = vec![f32::NAN; m * n];
        let mut scratch = AlignedBytes::zeroed(linear_scratch_bytes(DType::Q8_0, m, k));
        linear(
            &x,
            w,
            Some(&bias),
            &mut out,
            m,
            k,
            n,
            scratch.bytes_mut(),
            None,
        );
        let eight = run(DType::Q8_0, &wb, &x, Some(&bias), m, k, n);
        let wrow = k / 32 * 34;
        for i in 0..m {
            let mut act = vec![0u8; k / 32 * 34];
            quant::quantize_activation_row_for(&w, &x[i * k..(i + 1) * k], &mut act);
            assert!(act
                .chunks(34)
                .all(|b| b[2..].iter().all(|&q| (q as i8).abs() <= 63)));
            for j in 0..n {
                let want =
                    quant::vec_dot(DType::Q8_0, k, &wb.bytes()[j * wrow..(j + 1) * wrow], &act)
                        + bias[j];
                assert_eq!(
                    out[i * n + j].to_bits(),
                    want.to_bits(),
                    "m={m} k={k} n={n} ({i},{j})"
                );
                differs += usize::from(out[i * n + j] != eight[i * n + j]);
            }
        }
    }
    assert!(
        differs > 0,
        "7-bit activations gave the 8-bit results everywhere"
    );
}

/// `quantize_row_q8_0_a7`: `d = amax / 63` (its f16), quants `round(x / d)` in −63..=63, ties
/// away from zero, 0 for an all-zero block, and the clamp where `1/d` overflows.
#[test]
fn seven_bit_activation_quants() {
    use edge_schema::blocks::BlockQ8_0;
    let mut x = [0f32; 64];
    for (i, v) in x[..32].iter_mut().enumerate() {
        // amax 63: d = 1, so x = j + ½ is an exact tie.
        *v = if i == 0 { 63.0 } else { i as f32 - 16.5 };
    }
    // Block 1: subnormal values (d's f16 is 0, 1/d overflows: every quant clamps to ±63).
    for (i, v) in x[32..].iter_mut().enumerate() {
        *v = f32::from_bits(1 + i as u32) * if i % 2 == 0 { 1.0 } else { -1.0 };
    }
    let zero = BlockQ8_0 { d: 0, qs: [0; 32] };
    let mut b = [zero; 2];
    quant::quantize_row_q8_0_a7(&x, &mut b);
    assert_eq!(quant::fp16_to_fp32(b[0].d), 1.0);
    assert_eq!(b[0].qs[0], 63);
    for i in 1..32 {
        let t = i as f32 - 16.5;
        assert_eq!(b[0].qs[i], t.round() as i8, "element {i}");
    }
    assert_eq!(b[1].d, 0);
    assert!(b[1].qs.iter().all(|q| q.abs() <= 63), "{:?}", b[1].qs);
    let mut z = [zero; 1];
    quant::quantize_row_q8_0_a7(&[0.0; 32], &mut z);
    assert_eq!((z[0].d, z[0].qs), (0, [0; 32]));
}
