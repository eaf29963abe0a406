//! The `conv2d` slot of every table variant ([`edge_kernels_neon::variants`]) against the
//! generic twin [`edge_kernels::conv2d`] on random inputs with ragged shapes: `cin`, `cout`,
//! `h`, `w` not multiples of 4, 1×1 and 3×3 kernels, strides 1 and 2, asymmetric padding (the
//! VAE encoder's `Downsample2D`: pad right 1, bottom 1, stride 2), several im2col tiles per call,
//! `F32`, `F16` and `BF16` weights, with and without bias. Scratch is exactly
//! [`edge_kernels::conv2d_scratch_bytes`] (the NEON kernel must not need more).
//!
//! Bit-identical: the NEON slot is the generic im2col driver with the NEON f32 tile, which keeps
//! the generic order (one fused multiply-add per patch element, in order, then the bias); the
//! largest relative difference is printed (`--nocapture`) and must be 0.

mod common;
use common::Rng;

use edge_kernels::{quant, Conv2dParams, KernelTable, WeightRef};
use edge_kernels_neon::variants;
use edge_schema::DType;
use zerocopy::IntoBytes;

/// `(cin, h, w, cout, k, stride, [top, bottom, left, right])`.
type Case = (usize, usize, usize, usize, usize, usize, [usize; 4]);

fn params(c: Case) -> Conv2dParams {
    let (cin, h, w, cout, k, s, [pt, pb, pl, pr]) = c;
    Conv2dParams {
        cin,
        h,
        w,
        cout,
        kh: k,
        kw: k,
        stride_h: s,
        stride_w: s,
        pad_top: pt,
        pad_bottom: pb,
        pad_left: pl,
        pad_right: pr,
    }
}

/// Weights `[cout, cin·kh·kw]` of `dtype` in a 4-byte-aligned buffer.
fn pack(dtype: DType, w: &[f32], rows: usize, k: usize) -> Vec<u32> {
    let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
    let mut buf = vec![0u32; (rows * row).div_ceil(4)];
    let bytes = &mut buf.as_mut_bytes()[..rows * row];
    for (src, dst) in w.chunks(k.max(1)).zip(bytes.chunks_mut(row.max(1))) {
        quant::quantize_row(dtype, src, dst);
    }
    buf
}

/// Runs `table.conv2d` with exactly `conv2d_scratch_bytes` bytes of aligned scratch.
fn run(
    table: &KernelTable,
    p: &Conv2dParams,
    x: &[f32],
    dtype: DType,
    wbytes: &[u8],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let need = edge_kernels::conv2d_scratch_bytes(p, dtype);
    let mut scratch = vec![0u32; need.div_ceil(4)];
    let (oh, ow) = p.out_hw();
    let mut out = vec![f32::NAN; p.cout * oh * ow];
    (table.conv2d.run)(
        p,
        x,
        WeightRef::row_major(dtype, wbytes),
        bias,
        &mut out,
        &mut scratch.as_mut_bytes()[..need],
    );
    out
}

/// `Σ |x·w|` over the receptive field of every output element, `[cout, oh, ow]`.
fn abs_products(p: &Conv2dParams, x: &[f32], wf: &[f32]) -> Vec<f32> {
    let (oh, ow) = p.out_hw();
    let mut s = vec![0.0f32; p.cout * oh * ow];
    for co in 0..p.cout {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut acc = 0.0f32;
                for ci in 0..p.cin {
                    for ky in 0..p.kh {
                        for kx in 0..p.kw {
                            let iy = (oy * p.stride_h + ky).checked_sub(p.pad_top);
                            let ix = (ox * p.stride_w + kx).checked_sub(p.pad_left);
                            if let (Some(iy), Some(ix)) = (iy, ix) {
                                if iy < p.h && ix < p.w {
                                    let wv = wf[((co * p.cin + ci) * p.kh + ky) * p.kw + kx];
                                    acc += (x[(ci * p.h + iy) * p.w + ix] * wv).abs();
                                }
                            }
                        }
                    }
                }
                s[(co * oh + oy) * ow + ox] = acc;
            }
        }
    }
    s
}

/// Every variant against the generic kernel on `cases` with weights of `dtype`.
fn check(dtype: DType, cases: &[Case]) {
    let generic = edge_kernels::generic();
    let mut rng = Rng(0x51_7CC1_B727_220A ^ dtype as u64);
    let mut compared = 0;
    let mut worst = 0.0f32;
    for (ci, &c) in cases.iter().enumerate() {
        let p = params(c);
        let kk = p.cin * p.kh * p.kw;
        let x = rng.vec(p.cin * p.h * p.w, 2.0);
        let w = rng.vec(p.cout * kk, 0.5);
        let wbuf = pack(dtype, &w, p.cout, kk);
        let row = dtype.bytes_for(kk as u64).expect("whole blocks") as usize;
        let wbytes = &wbuf.as_bytes()[..p.cout * row];
        let mut wf = vec![0.0f32; p.cout * kk];
        for (src, dst) in wbytes.chunks(row.max(1)).zip(wf.chunks_mut(kk.max(1))) {
            quant::dequantize_row(dtype, src, dst);
        }
        let bias_v = rng.vec(p.cout, 1.0);
        for bias in [Some(&bias_v[..]), None] {
            let want = run(&generic, &p, &x, dtype, wbytes, bias);
            let abs = abs_products(&p, &x, &wf);
            let npix = want.len() / p.cout.max(1);
            for (label, table) in variants() {
                let got = run(&table, &p, &x, dtype, wbytes, bias);
                for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                    let b = bias.map_or(0.0, |b| b[i / npix].abs());
                    worst = worst.max((g - r).abs() / (abs[i] + b + f32::MIN_POSITIVE));
                    assert_eq!(
                        g.to_bits(),
                        r.to_bits(),
                        "{label} {} {dtype:?} case {ci} {p:?} bias={} [{i}]: {g} vs generic {r}",
                        table.conv2d.name,
                        bias.is_some(),
                    );
                }
                compared += 1;
            }
        }
    }
    assert!(compared >= 2 * cases.len());
    eprintln!("conv2d {dtype:?}: max |neon − generic| / (Σ|x·w| + |bias|) = {worst:.2e}");
}

/// Ragged shapes covering both product paths (`cout` < 4 and channel blocks > 4), several
/// im2col tiles per call, every padding/stride combination the VAE uses, and the Winograd form.
const CASES: &[Case] = &[
    (3, 1, 1, 1, 1, 1, [0, 0, 0, 0]),
    (5, 3, 5, 3, 1, 1, [0, 0, 0, 0]),
    (13, 7, 9, 7, 1, 2, [0, 0, 0, 0]),
    (3, 3, 5, 17, 3, 1, [1, 1, 1, 1]),
    (5, 7, 9, 3, 3, 1, [1, 1, 1, 1]),
    (13, 17, 6, 7, 3, 2, [0, 1, 0, 1]),
    (5, 7, 9, 17, 3, 2, [0, 1, 0, 1]),
    (3, 17, 6, 1, 3, 2, [1, 1, 1, 1]),
    (13, 1, 1, 17, 3, 1, [1, 1, 1, 1]),
    (5, 3, 5, 67, 3, 1, [2, 0, 0, 3]),
    (13, 17, 17, 5, 3, 1, [1, 1, 1, 1]),
    (300, 7, 9, 17, 3, 1, [1, 1, 1, 1]),
    (4, 17, 17, 9, 1, 1, [0, 0, 0, 0]),
    // Winograd F(2×2, 3×3) (3×3, stride 1, ≥ 8 input channels): runs of one tile row (more than 64
    // tiles across), odd sizes with asymmetric padding, output channels past one row pass.
    (8, 5, 150, 8, 3, 1, [1, 1, 1, 1]),
    (16, 13, 11, 69, 3, 1, [1, 0, 2, 1]),
];

#[test]
fn conv2d_f32_matches_generic_bitwise() {
    check(DType::F32, CASES);
}

#[test]
fn conv2d_f16_matches_generic_bitwise() {
    check(DType::F16, CASES);
}

#[test]
fn conv2d_bf16_matches_generic_bitwise() {
    check(DType::BF16, &CASES[..8]);
}

/// Zero sizes: no output channels, no input channels (bias only), as the generic kernel.
#[test]
fn conv2d_zero_sizes_match_generic_bitwise() {
    let generic = edge_kernels::generic();
    let mut rng = Rng(3);
    for c in [
        (0, 5, 3, 7, 3, 1, [1, 1, 1, 1]),
        (3, 5, 3, 0, 3, 1, [1, 1, 1, 1]),
    ] {
        let p = params(c);
        let x = rng.vec(p.cin * p.h * p.w, 1.0);
        let bias_v = rng.vec(p.cout, 1.0);
        for dtype in [DType::F32, DType::F16] {
            for bias in [Some(&bias_v[..]), None] {
                let want = run(&generic, &p, &x, dtype, &[], bias);
                for (label, table) in variants() {
                    let got = run(&table, &p, &x, dtype, &[], bias);
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{label} {dtype:?} {p:?}"
                    );
                }
            }
        }
    }
}

/// Results do not depend on the number of threads (fixed reduction order per element).
#[test]
fn conv2d_thread_count_does_not_change_results() {
    let p = params((13, 17, 17, 37, 3, 1, [1, 1, 1, 1]));
    let kk = p.cin * p.kh * p.kw;
    let mut rng = Rng(9);
    let x = rng.vec(p.cin * p.h * p.w, 1.0);
    let w = rng.vec(p.cout * kk, 1.0);
    let bias = rng.vec(p.cout, 1.0);
    for dtype in [DType::F32, DType::F16] {
        let wbuf = pack(dtype, &w, p.cout, kk);
        let row = dtype.bytes_for(kk as u64).expect("whole blocks") as usize;
        let wbytes = &wbuf.as_bytes()[..p.cout * row];
        for (label, table) in variants() {
            let on = |threads: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("thread pool")
                    .install(|| run(&table, &p, &x, dtype, wbytes, Some(&bias)))
            };
            let (one, three) = (on(1), on(3));
            assert!(
                one.iter()
                    .zip(&three)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label} {dtype:?}: 1 thread and 3 threads differ"
            );
        }
    }
}

/// The same panics as the generic kernel for violated preconditions.
#[test]
#[should_panic(expected = "conv2d: scratch has")]
fn conv2d_rejects_short_scratch() {
    let p = params((3, 5, 5, 4, 3, 1, [1, 1, 1, 1]));
    let kk = p.cin * p.kh * p.kw;
    let w = vec![0.0f32; p.cout * kk];
    let x = vec![0.0f32; p.cin * p.h * p.w];
    let mut out = vec![0.0f32; p.cout * 25];
    let need = edge_kernels::conv2d_scratch_bytes(&p, DType::F32);
    let mut scratch = vec![0u32; need / 4 - 1];
    let table = variants().pop().expect("a variant").1;
    (table.conv2d.run)(
        &p,
        &x,
        WeightRef::row_major(DType::F32, w.as_bytes()),
        None,
        &mut out,
        scratch.as_mut_bytes(),
    );
}
