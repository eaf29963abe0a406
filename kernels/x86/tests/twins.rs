//! Every x86 table ([`edge_kernels_x86::variants`]: `avx2`, `avx512`, `avx512+vnni`,
//! `avx512+vnni+bf16`, as this CPU
//! allows) against the generic kernels on random inputs with ragged shapes: `linear` for every
//! weight type (the accelerated ones and the forwarded ones) and `conv2d`, all **bit-identical**
//! (`to_bits` equality of every output element).
//!
//! A path this CPU lacks is skipped with a message on stderr, never silently;
//! `EDGE_X86_EXPECT=avx2|avx512|avx512+vnni|avx512+vnni+bf16` makes
//! `reports_the_paths_this_cpu_has` fail unless that path is present (CI sets it on its AVX-512
//! VNNI machines).

use edge_kernels::cpu::features;
use edge_kernels::WeightRef;
use edge_kernels::{conv2d_scratch_bytes, linear_scratch_bytes, quant, Conv2dParams, KernelTable};
use edge_schema::DType;
use zerocopy::IntoBytes;

/// xorshift64* in [-1, 1).
struct Rng(u64);

impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

fn tables() -> Vec<(&'static str, KernelTable)> {
    let v = edge_kernels_x86::variants(&features());
    for want in [
        "avx2",
        "avx512",
        "avx512+vnni",
        "avx512+vnni+bf16",
        "avx512+vnni+bf16+amx",
    ] {
        if !v.iter().any(|(n, _)| *n == want) {
            eprintln!(
                "skipped: this CPU has no {want} path ({})",
                features().summary()
            );
        }
    }
    v
}

/// Weights quantized row by row into a 4-byte-aligned buffer of exactly `n` rows.
fn weights(dtype: DType, w: &[f32], n: usize, k: usize) -> (Vec<u32>, usize) {
    let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
    let mut buf = vec![0u32; (n * row).div_ceil(4)];
    for (src, dst) in w
        .chunks(k)
        .zip(buf.as_mut_bytes()[..n * row].chunks_mut(row))
    {
        quant::quantize_row(dtype, src, dst);
    }
    (buf, n * row)
}

#[allow(clippy::too_many_arguments)]
fn run_linear(
    t: &KernelTable,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    epilogue: Option<edge_kernels::EpilogueFn>,
) -> Vec<f32> {
    let mut scratch = vec![0u64; linear_scratch_bytes(w.dtype, m, k).div_ceil(8)];
    let mut out = vec![f32::NAN; m * n];
    (t.linear.run)(
        x,
        w,
        bias,
        &mut out,
        m,
        k,
        n,
        scratch.as_mut_bytes(),
        epilogue,
    );
    out
}

fn assert_bits(label: &str, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{label} {what}: element {i}: {g} vs generic {w}"
        );
    }
}

#[test]
fn linear_matches_generic_bit_for_bit() {
    let generic = edge_kernels::generic();
    let plain = [
        (1, 1, 1),
        (1, 7, 9),
        (2, 9, 17),
        (4, 8, 3),
        (5, 33, 8),
        (9, 100, 13),
        (13, 64, 70),
        (70, 23, 19),
        // Past one cache block of features (128; 256 for the AVX2 tile) and one column block
        // (64), few and many rows.
        (3, 300, 150),
        (8, 129, 64),
        (6, 1, 65),
        (70, 260, 131),
        (14, 530, 40),
    ];
    let blocks = [
        (4, 32, 16),
        (4, 32, 1),
        (5, 64, 17),
        (8, 96, 64),
        (9, 160, 65),
        (13, 64, 130),
        (37, 96, 33),
        (70, 256, 7),
        (3, 64, 20),
        (1, 32, 3),
        // 16 and 17 rows, and past the panel driver's few-rows path (8 register tiles) with a
        // task's clamped last rows; at least 256 features, where the AMX table takes its tile.
        (16, 288, 33),
        (17, 256, 16),
        (150, 320, 40),
        // Many rows over two panels of the driver (128 columns at k = 4608: a panel within
        // 1 MiB, `many_rows_panel_cols`), the second one ragged.
        (50, 4608, 200),
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for (label, t) in tables() {
        for dtype in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q4K,
            DType::Q6K,
        ] {
            let shapes: Vec<(usize, usize, usize)> = match dtype.block_size() {
                1 => plain.to_vec(),
                32 => blocks.to_vec(),
                _ => vec![(5, 256, 9), (12, 512, 17)],
            };
            for (m, k, n) in shapes {
                let x = rng.vec(m * k, 2.0);
                let w = rng.vec(n * k, 0.5);
                let bias = rng.vec(n, 1.0);
                let (buf, len) = weights(dtype, &w, n, k);
                let wr = WeightRef::row_major(dtype, &buf.as_bytes()[..len]);
                for b in [None, Some(bias.as_slice())] {
                    let want = run_linear(&generic, &x, wr, b, m, k, n, None);
                    let got = run_linear(&t, &x, wr, b, m, k, n, None);
                    let what = format!("linear {dtype:?} m={m} k={k} n={n} bias={}", b.is_some());
                    assert_bits(label, &what, &got, &want);
                }
            }
        }
    }
}

/// `BF16` weights in `PackLayout::Bf16Pairs16` (what `--target x86_64-avx512bf16` plans hold):
/// every table gives the generic kernel's bits (`vdpbf16ps` on the `avx512+vnni+bf16` table, the
/// generic kernel elsewhere) for whole groups of 16 columns, row-major tail columns, a tile's
/// rows and fewer, the few-rows (column tasks) and many-rows paths, `k` not a multiple of 16
/// (the activation rounding's scalar tail), and activations with rounding ties, subnormals
/// and large magnitudes.
#[test]
fn bf16_pairs_match_generic_bit_for_bit() {
    use edge_schema::plan::PackLayout;
    let generic = edge_kernels::generic();
    let shapes = [
        (1, 2, 1),
        (1, 32, 16),
        (3, 18, 17),
        (6, 96, 33),
        (7, 40, 64),
        (13, 256, 48),
        (25, 62, 130),
        (49, 64, 16),
        (70, 160, 5),
        (100, 96, 80),
    ];
    let mut rng = Rng(0xB0F1_6B0F_16B0_F160);
    for (label, t) in tables() {
        for &(m, k, n) in &shapes {
            let mut x = rng.vec(m * k, 2.0);
            // Ties of the bf16 rounding, the special values and subnormals.
            for (i, v) in x.iter_mut().enumerate().step_by(7) {
                *v = match i % 5 {
                    0 => 1.0 + 2f32.powi(-8),
                    1 => f32::from_bits(0x0000_8001),
                    2 => -3.0 * 2f32.powi(-130),
                    3 => 1.5e-38,
                    _ => *v * 1e20,
                };
            }
            let w = rng.vec(n * k, 0.5);
            let bias = rng.vec(n, 1.0);
            let (buf, len) = weights(DType::BF16, &w, n, k);
            let mut packed = vec![0u8; len];
            edge_kernels::pack::repack(
                PackLayout::Bf16Pairs16,
                DType::BF16,
                &buf.as_bytes()[..len],
                n,
                k,
                &mut packed,
            );
            let wp = WeightRef {
                dtype: DType::BF16,
                bytes: &packed,
                layout: PackLayout::Bf16Pairs16,
            };
            for b in [None, Some(bias.as_slice())] {
                let want = run_linear(&generic, &x, wp, b, m, k, n, None);
                let got = run_linear(&t, &x, wp, b, m, k, n, None);
                let what = format!("bf16 pairs m={m} k={k} n={n} bias={}", b.is_some());
                assert_bits(label, &what, &got, &want);
            }
        }
    }
}

/// `Q8_0` weights in `PackLayout::Interleaved16x4` (what `--target x86_64-avx512` plans hold):
/// every table gives the generic kernel's bits on the row-major matrix, for whole groups of 16
/// columns read in place, row-major tail columns, fewer rows than a tile, the few-rows path and
/// the many-rows path.
#[test]
fn interleaved16x4_q8_0_matches_row_major_generic() {
    use edge_schema::plan::PackLayout;
    let generic = edge_kernels::generic();
    let shapes = [
        (1, 32, 16),
        (3, 64, 17),
        (6, 96, 33),
        (13, 256, 48),
        (49, 64, 130),
        (70, 160, 5),
        (100, 96, 64),
        (2, 1024, 1040),
        (16, 256, 32),
        (161, 288, 49),
    ];
    let mut rng = Rng(0x51F1_5EED_0DD5_1234);
    for (label, t) in tables() {
        for &(m, k, n) in &shapes {
            let x = rng.vec(m * k, 2.0);
            let w = rng.vec(n * k, 0.5);
            let bias = rng.vec(n, 1.0);
            let (buf, len) = weights(DType::Q8_0, &w, n, k);
            let rm = &buf.as_bytes()[..len];
            let mut packed = vec![0u8; len];
            edge_kernels::pack::repack(
                PackLayout::Interleaved16x4,
                DType::Q8_0,
                rm,
                n,
                k,
                &mut packed,
            );
            let wi = WeightRef {
                dtype: DType::Q8_0,
                bytes: &packed,
                layout: PackLayout::Interleaved16x4,
            };
            for b in [None, Some(bias.as_slice())] {
                let want = run_linear(
                    &generic,
                    &x,
                    WeightRef::row_major(DType::Q8_0, rm),
                    b,
                    m,
                    k,
                    n,
                    None,
                );
                let got = run_linear(&t, &x, wi, b, m, k, n, None);
                let what = format!(
                    "linear Q8_0 Interleaved16x4 m={m} k={k} n={n} bias={}",
                    b.is_some()
                );
                assert_bits(label, &what, &got, &want);
            }
        }
    }
}

/// `Q8_0` weights in `PackLayout::Interleaved8x4A7` (`--activation-bits 7` plans): every table
/// (all take the AVX2 7-bit tile) gives the generic kernel's bits on the same layout, for whole
/// groups of 8 columns, row-major tail columns, fewer rows than a tile, the few-rows and the
/// many-rows paths; and on activation rows with exact ties, ±∞, NaN, subnormal (zero-scale)
/// blocks and weight blocks of −128 and 127 (the extremes of the biased `vpmaddubsw` operand).
#[test]
fn interleaved8x4a7_q8_0_matches_generic() {
    use edge_schema::plan::PackLayout;
    let generic = edge_kernels::generic();
    let shapes = [
        (1, 32, 8),
        (3, 64, 9),
        (4, 96, 17),
        (7, 256, 24),
        (13, 256, 47),
        (49, 64, 130),
        (70, 160, 5),
        (100, 96, 64),
        (2, 1024, 1040),
        (161, 288, 49),
        (33, 1152, 40),
    ];
    let mut rng = Rng(0xA7A7_5EED_0DD5_4321);
    for (label, t) in tables() {
        for (si, &(m, k, n)) in shapes.iter().enumerate() {
            let mut x = rng.vec(m * k, 2.0);
            if si == 3 {
                for (i, v) in x.iter_mut().enumerate() {
                    let (row, e) = (i / k, i % k);
                    *v = match (row, e / 32, e % 32) {
                        // amax 63: d = 1, every x = j + ½ a tie.
                        (0, 0, 0) => 63.0,
                        (0, 0, j) => j as f32 - 15.5,
                        (1, 1, 3) => f32::INFINITY,
                        (2, 2, 5) => f32::NAN,
                        (3, 3, j) => f32::from_bits(0x0000_4000 + j as u32 * 97),
                        (4, 4, j) => -f32::from_bits(0x0000_0100 + j as u32),
                        _ => *v,
                    };
                }
            }
            let w = rng.vec(n * k, 0.5);
            let bias = rng.vec(n, 1.0);
            let (mut buf, len) = weights(DType::Q8_0, &w, n, k);
            if si == 3 {
                // Block 0 of rows 0 and 9: every quant −128; block 1 of row 1: every quant 127.
                let wrow = k / 32 * 34;
                for row in [0, 9] {
                    buf.as_mut_bytes()[row * wrow + 2..row * wrow + 34].fill(0x80);
                }
                buf.as_mut_bytes()[wrow + 36..wrow + 68].fill(0x7F);
            }
            let rm = &buf.as_bytes()[..len];
            let mut packed = vec![0u8; len];
            let a7 = PackLayout::Interleaved8x4A7;
            edge_kernels::pack::repack(a7, DType::Q8_0, rm, n, k, &mut packed);
            let wi = WeightRef {
                dtype: DType::Q8_0,
                bytes: &packed,
                layout: a7,
            };
            for b in [None, Some(bias.as_slice())] {
                let want = run_linear(&generic, &x, wi, b, m, k, n, None);
                let got = run_linear(&t, &x, wi, b, m, k, n, None);
                let what = format!(
                    "linear Q8_0 Interleaved8x4A7 m={m} k={k} n={n} bias={}",
                    b.is_some()
                );
                for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.to_bits() == r.to_bits() || (g.is_nan() && r.is_nan()),
                        "{label} {what}: element {i}: {g} vs generic {r}"
                    );
                }
                if si != 3 {
                    assert_bits(label, &what, &got, &want);
                }
            }
        }
    }
}

#[test]
fn linear_extremes_match_generic() {
    // Saturated quants (|q| = 127 and the −128 a foreign GGUF may hold), zero blocks and large
    // magnitudes: the integer sums must stay exact.
    let generic = edge_kernels::generic();
    let (m, k, n) = (6, 128, 40);
    let mut x = vec![0f32; m * k];
    for (i, v) in x.iter_mut().enumerate() {
        *v = match i % 5 {
            0 => 1e4,
            1 => -1e4,
            2 => 0.0,
            _ => (i as f32).sin(),
        };
    }
    let w: Vec<f32> = (0..n * k)
        .map(|i| if i % 3 == 0 { -3.0 } else { 3.0 })
        .collect();
    for (label, t) in tables() {
        let (mut buf, len) = weights(DType::Q8_0, &w, n, k);
        // Block 0 of row 0: every quant −128.
        buf.as_mut_bytes()[2..34].fill(0x80);
        let wr = WeightRef::row_major(DType::Q8_0, &buf.as_bytes()[..len]);
        let want = run_linear(&generic, &x, wr, None, m, k, n, None);
        let got = run_linear(&t, &x, wr, None, m, k, n, None);
        assert_bits(label, "linear Q8_0 extremes", &got, &want);
    }
}

/// The largest block sums of the 4- and 5-bit types, which the AVX2 tile adds in 16-bit lanes
/// over a block: weights all −1 (`Q5_0` value −16, `Q4_0` −8, `Q4_1` 0 with the minimum),
/// activations all −1 or all +1 (quants ∓127), so every product has the largest magnitude and
/// one sign (`Q5_0`: 16 products of 16·127 per lane, 32512).
#[test]
fn largest_narrow_block_sums_match_generic() {
    let generic = edge_kernels::generic();
    let (m, k, n) = (8, 96, 17);
    for sign in [-1.0f32, 1.0] {
        let x = vec![sign; m * k];
        let w: Vec<f32> = (0..n * k)
            .map(|i| if i % 97 == 5 { 0.5 } else { -1.0 })
            .collect();
        for (label, t) in tables() {
            for dtype in [
                DType::Q5_0,
                DType::Q4_0,
                DType::Q4_1,
                DType::Q5_1,
                DType::Q8_0,
            ] {
                let (buf, len) = weights(dtype, &w, n, k);
                let wr = WeightRef::row_major(dtype, &buf.as_bytes()[..len]);
                let want = run_linear(&generic, &x, wr, None, m, k, n, None);
                let got = run_linear(&t, &x, wr, None, m, k, n, None);
                assert_bits(
                    label,
                    &format!("linear {dtype:?} largest sums x={sign}"),
                    &got,
                    &want,
                );
            }
        }
    }
}

/// The VNNI kernel's own Q8_0 activation quantizer against ggml's reference rounding: exact
/// halves (`x·id = ±0.5, ±2.5, …` round away from zero), blocks whose scale is exactly 1, and
/// blocks holding ±∞ or NaN (which take the generic path).
#[test]
fn q8_0_activation_rounding_and_non_finite_blocks_match_generic() {
    let generic = edge_kernels::generic();
    let (m, k, n) = (6, 128, 20);
    let mut x = vec![0f32; m * k];
    for (i, v) in x.iter_mut().enumerate() {
        let (row, e) = (i / k, i % k);
        *v = match (row, e % 32) {
            // amax 127 gives d = 1 and id = 1: every half is an exact tie.
            (0 | 1, 0) => 127.0,
            (0 | 1, j) => (j as f32 - 16.0) + 0.5 * if row == 0 { 1.0 } else { -1.0 },
            (2, j) if e < 32 => {
                if j == 3 {
                    f32::INFINITY
                } else {
                    j as f32
                }
            }
            (3, j) if e < 32 => {
                if j == 5 {
                    f32::NEG_INFINITY
                } else {
                    -(j as f32)
                }
            }
            (4, j) if e >= 96 => {
                if j == 7 {
                    f32::NAN
                } else {
                    j as f32 * 0.25
                }
            }
            _ => ((i * 7919) % 1000) as f32 / 37.0 - 13.0,
        };
    }
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0)
        .collect();
    for (label, t) in tables() {
        let (buf, len) = weights(DType::Q8_0, &w, n, k);
        let wr = WeightRef::row_major(DType::Q8_0, &buf.as_bytes()[..len]);
        let want = run_linear(&generic, &x, wr, None, m, k, n, None);
        let got = run_linear(&t, &x, wr, None, m, k, n, None);
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == r.to_bits() || (g.is_nan() && r.is_nan()),
                "{label} linear Q8_0 activation quantizer: element {i}: {g} vs generic {r}"
            );
        }
        // Rows without non-finite values are plain numbers, equal bit for bit.
        assert_bits(label, "finite rows", &got[..2 * n], &want[..2 * n]);
    }
}

/// Activation blocks so small that their f16 scale is 0 (`d = amax / 127` subnormal, so
/// `id = 1/d` overflows and ggml's quants saturate to ±127 and −128) against weights holding
/// −128: the AVX2 tile's `vpmaddubsw` sums of such blocks may be wrong, and must change no
/// output bit (the block's scale is 0), for `Q8_0` (`Q8_0` activations) and `Q4_1` (`Q8_1`).
#[test]
fn zero_scale_activation_blocks_match_generic() {
    let generic = edge_kernels::generic();
    let (m, k, n) = (9, 128, 24);
    let mut x = vec![0f32; m * k];
    for (i, v) in x.iter_mut().enumerate() {
        let (row, e) = (i / k, i % k);
        let sign = if (i * 7) % 3 == 0 { -1.0 } else { 1.0 };
        *v = if (row + e / 32) % 2 == 0 {
            // Subnormal values: amax / 127 is subnormal too.
            sign * f32::from_bits(0x0000_4000 + (i as u32 * 97) % 0x3000)
        } else {
            sign * ((i * 13) % 29) as f32 / 7.0
        };
    }
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0)
        .collect();
    for (label, t) in tables() {
        for dtype in [DType::Q8_0, DType::Q4_1] {
            let (mut buf, len) = weights(dtype, &w, n, k);
            if dtype == DType::Q8_0 {
                // Blocks 0 and 1 of rows 0 and 5: every quant −128.
                for row in [0, 5] {
                    let at = row * (k / 32) * 34;
                    buf.as_mut_bytes()[at + 2..at + 34].fill(0x80);
                    buf.as_mut_bytes()[at + 36..at + 68].fill(0x80);
                }
            }
            let wr = WeightRef::row_major(dtype, &buf.as_bytes()[..len]);
            for b in [None, Some(&w[..n])] {
                let want = run_linear(&generic, &x, wr, b, m, k, n, None);
                let got = run_linear(&t, &x, wr, b, m, k, n, None);
                assert_bits(
                    label,
                    &format!("linear {dtype:?} zero-scale blocks"),
                    &got,
                    &want,
                );
            }
        }
    }
}

#[test]
fn conv2d_matches_generic_bit_for_bit() {
    let generic = edge_kernels::generic();
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let cases = [
        (3, 9, 7, 5, 3, 1, 1),
        (4, 8, 8, 13, 3, 1, 1),
        (5, 11, 6, 7, 1, 1, 0),
        (8, 10, 10, 9, 3, 2, 1),
        (16, 5, 9, 4, 3, 1, 0),
        (20, 17, 19, 9, 3, 1, 1),
        // Winograd F(2×2, 3×3): runs of one tile row, odd sizes, channels past one row pass.
        (8, 5, 150, 8, 3, 1, 1),
        (16, 13, 11, 69, 3, 1, 0),
    ];
    for (label, t) in tables() {
        for &(cin, h, w, cout, kk, stride, pad) in &cases {
            let p = Conv2dParams {
                cin,
                h,
                w,
                cout,
                kh: kk,
                kw: kk,
                stride_h: stride,
                stride_w: stride,
                pad_top: pad,
                pad_bottom: pad,
                pad_left: pad,
                pad_right: pad,
            };
            let (oh, ow) = p.out_hw();
            let x = rng.vec(cin * h * w, 1.5);
            let wt = rng.vec(cout * cin * kk * kk, 0.3);
            let bias = rng.vec(cout, 0.5);
            for dtype in [DType::F32, DType::F16] {
                let (buf, len) = weights(dtype, &wt, cout, cin * kk * kk);
                let wr = WeightRef::row_major(dtype, &buf.as_bytes()[..len]);
                let run = |t: &KernelTable| {
                    let mut scratch = vec![0u64; conv2d_scratch_bytes(&p, dtype).div_ceil(8)];
                    let mut out = vec![f32::NAN; cout * oh * ow];
                    (t.conv2d.run)(&p, &x, wr, Some(&bias), &mut out, scratch.as_mut_bytes());
                    out
                };
                assert_bits(
                    label,
                    &format!("conv2d {dtype:?} {p:?}"),
                    &run(&t),
                    &run(&generic),
                );
            }
        }
    }
}

#[test]
fn reports_the_paths_this_cpu_has() {
    let names: Vec<&str> = tables().iter().map(|(n, _)| *n).collect();
    eprintln!("cpu: {}; x86 tables: {names:?}", features().summary());
    if let Ok(want) = std::env::var("EDGE_X86_EXPECT") {
        assert!(
            names.contains(&want.as_str()),
            "EDGE_X86_EXPECT={want} but this CPU's x86 tables are {names:?} ({})",
            features().summary()
        );
    }
}

/// Both attention slots (`attention`, and `attention_bf16`: `vdpbf16ps` in the
/// `avx512+vnni+bf16` table) against the generic ones.
#[test]
fn attention_matches_generic_bit_for_bit() {
    use edge_kernels::AttentionParams;
    let generic = edge_kernels::generic();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    // (lq, lk, heads, head_dim, mask, bias)
    let cases = [
        (1, 1, 1, 1, false, false),
        (3, 5, 2, 7, true, false),
        (5, 70, 3, 8, false, true),
        (9, 65, 2, 17, true, true),
        (6, 130, 1, 72, true, false),
        (4, 64, 2, 33, false, false),
        (7, 67, 1, 130, true, false),
        (5, 70, 2, 128, true, true),
        (8, 20, 1, 512, false, false),
        (45, 100, 2, 72, true, false),
        (70, 300, 3, 24, false, true),
        (6, 66, 2, 120, false, true),
        (13, 200, 2, 72, true, true),
    ];
    for (label, t) in tables() {
        for (ci, &(lq, lk, heads, hd, use_mask, use_bias)) in cases.iter().enumerate() {
            let d = heads * hd;
            let p = AttentionParams {
                lq,
                lk,
                heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                q_stride: d,
                q_offset: 0,
                kv_stride: 2 * d,
                k_offset: 0,
                v_offset: d,
                masked_value: -10000.0,
            };
            let q = rng.vec(lq * d, 3.0);
            let mut kv = rng.vec(lk * 2 * d, 3.0);
            let mask: Vec<f32> = (0..lk)
                .map(|j| if j % 3 == 1 { 0.0 } else { 1.0 })
                .collect();
            let mut bias = rng.vec(heads * lq * lk, 2.0);
            if ci == cases.len() - 1 {
                // Keys from the second tile on score 100 higher: the first tile's sums are
                // rescaled by about e⁻¹⁰⁰, into the subnormal range (flushed in bf16 products).
                // Their values are near the smallest normal, so that the rescaled sums (or the
                // zeros they flush to) still change the result's bits.
                for (i, b) in bias.iter_mut().enumerate() {
                    if i % lk >= 64 {
                        *b += 100.0;
                    }
                }
                for row in kv.chunks_exact_mut(2 * d).skip(64) {
                    for v in &mut row[d..] {
                        *v *= 1e-37;
                    }
                }
            }
            for bf16 in [false, true] {
                let run = |t: &KernelTable| {
                    let mut out = vec![f32::NAN; lq * d];
                    let slot = if bf16 { t.attention_bf16 } else { t.attention };
                    (slot.run)(
                        &p,
                        &q,
                        &kv,
                        use_mask.then_some(mask.as_slice()),
                        use_bias.then_some(bias.as_slice()),
                        &mut out,
                    );
                    out
                };
                let what = if bf16 { "attention_bf16" } else { "attention" };
                assert_bits(label, &format!("{what} {p:?}"), &run(&t), &run(&generic));
            }
        }
    }
}

#[test]
fn silu_and_gelu_match_generic_bit_for_bit() {
    let generic = edge_kernels::generic();
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    // Ragged lengths, a wide range, and the special values.
    let mut x = rng.vec(40_000 + 13, 12.0);
    x.extend([
        0.0,
        -0.0,
        1e-8,
        -1e-8,
        88.0,
        -88.0,
        104.0,
        -104.0,
        1e30,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        5e-39,
    ]);
    for (label, t) in tables() {
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 33, x.len()] {
            let xs = &x[x.len() - n..];
            let mut a = vec![0f32; n];
            let mut b = vec![0f32; n];
            (t.silu.run)(xs, &mut a);
            (generic.silu.run)(xs, &mut b);
            assert_bits(label, &format!("silu n={n}"), &a, &b);
            (t.gelu_tanh.run)(xs, &mut a);
            (generic.gelu_tanh.run)(xs, &mut b);
            assert_bits(label, &format!("gelu_tanh n={n}"), &a, &b);
            let mut c = xs.to_vec();
            (t.gelu_tanh_in_place.run)(&mut c);
            assert_bits(label, &format!("gelu_tanh_in_place n={n}"), &c, &b);
        }
    }
}

/// A `linear` with the GELU fused into its epilogue (`Epilogue::GeluTanh`: the table's
/// `gelu_tanh_in_place` slot handed to its `linear`) gives the bits of the generic product
/// followed by the generic `gelu_tanh` op, on every table and path: the f32 GEMM driver (row
/// split, column tasks, the few-rows column blocks), the quantized panel tiles' few-rows and
/// many-rows paths (VNNI, AVX2, AMX from 256 features), `Interleaved16x4` weights read in
/// place and copied, the `vdpbf16ps` pairs and the generic fallbacks (K-quants), with and
/// without bias, on ragged shapes past one panel of columns.
#[test]
fn fused_gelu_epilogue_matches_the_unfused_generic() {
    use edge_schema::plan::PackLayout;
    let generic = edge_kernels::generic();
    let mut rng = Rng(0x0DDB_A11C_AFE5_7EED);
    let gelu = |v: Vec<f32>| {
        let mut out = vec![0f32; v.len()];
        (generic.gelu_tanh.run)(&v, &mut out);
        out
    };
    for (label, t) in tables() {
        for (dtype, layout) in [
            (DType::F32, PackLayout::RowMajor),
            (DType::F16, PackLayout::RowMajor),
            (DType::BF16, PackLayout::RowMajor),
            (DType::BF16, PackLayout::Bf16Pairs16),
            (DType::Q8_0, PackLayout::RowMajor),
            (DType::Q8_0, PackLayout::Interleaved16x4),
            (DType::Q4_0, PackLayout::RowMajor),
            (DType::Q4K, PackLayout::RowMajor),
        ] {
            let shapes: &[(usize, usize, usize)] = if dtype == DType::Q4K {
                &[(5, 256, 9), (40, 512, 33)]
            } else {
                &[
                    (1, 64, 9),
                    (7, 96, 70),
                    (16, 288, 33),
                    (70, 256, 131),
                    (150, 320, 600),
                ]
            };
            for &(m, k, n) in shapes {
                let x = rng.vec(m * k, 2.0);
                let w = rng.vec(n * k, 0.5);
                let bias = rng.vec(n, 1.0);
                let (buf, len) = weights(dtype, &w, n, k);
                let rm = &buf.as_bytes()[..len];
                let mut packed = Vec::new();
                let wl = edge_kernels::pack::in_layout(layout, dtype, rm, n, k, &mut packed);
                for b in [None, Some(bias.as_slice())] {
                    let want = gelu(run_linear(&generic, &x, wl, b, m, k, n, None));
                    let epi = Some(t.gelu_tanh_in_place.run);
                    let got = run_linear(&t, &x, wl, b, m, k, n, epi);
                    let what = format!(
                        "linear+gelu {dtype:?} {layout:?} m={m} k={k} n={n} bias={}",
                        b.is_some()
                    );
                    assert_bits(label, &what, &got, &want);
                }
            }
        }
    }
}

/// `layer_norm` and `rms_norm` (rows' statistics summed together in f64 lanes) against the
/// generic kernels: ragged row lengths (tails of 1 to 3 after the 4-element chunks, and of the
/// 8-wide RMSNorm apply), row counts that leave 1 to 3 rows after the groups of 4 and span
/// several tasks, rows of very different offsets and scales (the two-pass variance), with and
/// without LayerNorm's weight and bias.
#[test]
fn norms_match_generic_bit_for_bit() {
    let generic = edge_kernels::generic();
    let mut rng = Rng(0x0DDB_1A5E_5BAD_5EED);
    for (label, t) in tables() {
        for &(m, d) in &[
            (1, 1),
            (3, 5),
            (4, 4),
            (5, 7),
            (7, 9),
            (17, 66),
            (35, 1152),
            (6, 4099),
        ] {
            let mut x = rng.vec(m * d, 3.0);
            for (r, row) in x.chunks_mut(d).enumerate() {
                // Offsets up to 1e4 over spreads down to 1e-3: the second pass matters.
                let (shift, scale) = (1e4 * rng.f32(), 10f32.powi(r as i32 % 7 - 3));
                for v in row.iter_mut() {
                    *v = shift + *v * scale;
                }
            }
            if d >= 8 {
                // Cancelling lanes: in the generic order `(a₀ + a₂) + (a₁ + a₃)` the ±1e20 meet
                // first and the small values survive; in any other order they are lost, so the
                // statistics (and the outputs) would differ.
                x[..8].copy_from_slice(&[1e20, 1.0, -1e20, 1.0, 3.0, 5.0, 7.0, 9.0]);
            }
            let w = rng.vec(d, 2.0);
            let b = rng.vec(d, 1.0);
            for (wt, bs) in [
                (None, None),
                (Some(&w[..]), None),
                (Some(&w[..]), Some(&b[..])),
            ] {
                let mut got = vec![f32::NAN; m * d];
                let mut want = vec![f32::NAN; m * d];
                (t.layer_norm.run)(&x, m, d, 1e-6, wt, bs, &mut got);
                (generic.layer_norm.run)(&x, m, d, 1e-6, wt, bs, &mut want);
                let what = format!(
                    "layer_norm m={m} d={d} weight {} bias {}",
                    wt.is_some(),
                    bs.is_some()
                );
                assert_bits(label, &what, &got, &want);
            }
            let mut got = vec![f32::NAN; m * d];
            let mut want = vec![f32::NAN; m * d];
            (t.rms_norm.run)(&x, m, d, 1e-6, &w, &mut got);
            (generic.rms_norm.run)(&x, m, d, 1e-6, &w, &mut want);
            assert_bits(label, &format!("rms_norm m={m} d={d}"), &got, &want);
        }
    }
}
