//! `conv2d` against a direct f64 convolution.

mod common;

use common::*;
use edge_kernels::{
    conv2d, conv2d_direct, conv2d_scratch_bytes, winograd_applies, Conv2dParams, WeightRef,
};
use edge_schema::DType;

fn reference(p: &Conv2dParams, x: &[f32], w: &[f32], b: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let (oh, ow) = p.out_hw();
    let mut out = vec![0.0; p.cout * oh * ow];
    let mut mag = vec![0.0; p.cout * oh * ow];
    for co in 0..p.cout {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut s = b.map_or(0.0, |b| f64::from(b[co]));
                let mut a = s.abs();
                for ci in 0..p.cin {
                    for ky in 0..p.kh {
                        for kx in 0..p.kw {
                            let iy = (oy * p.stride_h + ky) as i64 - p.pad_top as i64;
                            let ix = (ox * p.stride_w + kx) as i64 - p.pad_left as i64;
                            if iy < 0 || ix < 0 || iy >= p.h as i64 || ix >= p.w as i64 {
                                continue;
                            }
                            let xv = f64::from(x[(ci * p.h + iy as usize) * p.w + ix as usize]);
                            let wv = f64::from(w[((co * p.cin + ci) * p.kh + ky) * p.kw + kx]);
                            s += xv * wv;
                            a += (xv * wv).abs();
                        }
                    }
                }
                out[(co * oh + oy) * ow + ox] = s;
                mag[(co * oh + oy) * ow + ox] = a;
            }
        }
    }
    (out, mag)
}

fn params(
    cin: usize,
    h: usize,
    w: usize,
    cout: usize,
    k: usize,
    stride: usize,
    pads: [usize; 4],
) -> Conv2dParams {
    Conv2dParams {
        cin,
        h,
        w,
        cout,
        kh: k,
        kw: k,
        stride_h: stride,
        stride_w: stride,
        pad_top: pads[0],
        pad_bottom: pads[1],
        pad_left: pads[2],
        pad_right: pads[3],
    }
}

fn cases() -> Vec<Conv2dParams> {
    vec![
        params(3, 5, 7, 4, 3, 1, [1, 1, 1, 1]),
        params(4, 8, 12, 64, 2, 2, [0, 0, 0, 0]), // PixArt patch embedding (patch 2)
        params(5, 9, 9, 3, 3, 2, [0, 1, 0, 1]),   // Downsample2D: pad right/bottom 1, stride 2
        params(17, 6, 5, 33, 1, 1, [0, 0, 0, 0]), // 1×1 (quant_conv, shortcut)
        params(33, 17, 17, 5, 3, 1, [1, 1, 1, 1]), // 289 output pixels: several im2col tiles
        params(2, 4, 3, 1, 3, 1, [2, 0, 1, 3]),   // asymmetric padding on every side
        // One padded side at a time (a swapped top/bottom or left/right shows as a shift),
        // with stride 2 and non-square kernels' worth of rows and columns.
        params(3, 7, 6, 4, 3, 1, [1, 0, 0, 0]),
        params(3, 7, 6, 4, 3, 1, [0, 1, 0, 0]),
        params(3, 7, 6, 4, 3, 1, [0, 0, 1, 0]),
        params(3, 7, 6, 4, 3, 1, [0, 0, 0, 1]),
        params(2, 8, 9, 3, 3, 2, [1, 0, 2, 0]),
        params(2, 9, 8, 3, 3, 2, [0, 2, 0, 1]),
        params(1, 1, 1, 1, 1, 1, [0, 0, 0, 0]),
        // Padding wider than the input: runs of lanes wholly inside the left or right padding.
        params(2, 5, 3, 3, 3, 1, [2, 2, 4, 4]),
        params(2, 6, 1, 2, 1, 1, [0, 0, 5, 5]),
        params(3, 40, 7, 3, 3, 1, [1, 1, 9, 2]),
        // Winograd F(2×2, 3×3) (3×3, stride 1, ≥ 8 input channels): odd output sizes (half tiles),
        // blocks of several tile rows, runs of one tile row (more than 64 tiles across),
        // no padding, asymmetric and wide padding.
        params(8, 5, 7, 8, 3, 1, [1, 1, 1, 1]),
        params(9, 13, 11, 17, 3, 1, [1, 1, 1, 1]),
        params(16, 3, 150, 9, 3, 1, [1, 1, 1, 1]),
        params(8, 9, 9, 8, 3, 1, [0, 0, 0, 0]),
        params(8, 7, 6, 9, 3, 1, [2, 0, 1, 3]),
        params(12, 40, 7, 10, 3, 1, [1, 1, 9, 2]),
        params(8, 3, 259, 8, 3, 1, [1, 1, 1, 1]),
        params(10, 7, 9, 3, 3, 1, [1, 1, 1, 1]), // few output channels (the VAE's conv_out)
    ]
}

fn run(
    p: &Conv2dParams,
    dtype: DType,
    wb: &AlignedBytes,
    x: &[f32],
    b: Option<&[f32]>,
) -> Vec<f32> {
    let (oh, ow) = p.out_hw();
    let mut out = vec![f32::NAN; p.cout * oh * ow];
    let mut scratch = AlignedBytes::zeroed(conv2d_scratch_bytes(p, dtype));
    conv2d(
        p,
        x,
        WeightRef::row_major(dtype, wb.bytes()),
        b,
        &mut out,
        scratch.bytes_mut(),
    );
    out
}

#[test]
fn matches_direct_f64_reference() {
    let mut rng = Rng::new(10);
    for p in cases() {
        for dtype in [DType::F32, DType::F16] {
            let x = rng.vec(p.cin * p.h * p.w, 1.0);
            let w = rng.vec(p.cout * p.cin * p.kh * p.kw, 0.5);
            let bias = rng.vec(p.cout, 1.0);
            let (wb, wv) = match dtype {
                DType::F32 => (f32_bytes(&w), w.clone()),
                _ => f16_bytes(&w),
            };
            for b in [None, Some(bias.as_slice())] {
                let got = run(&p, dtype, &wb, &x, b);
                let (want, mag) = reference(&p, &x, &wv, b);
                assert_close(&format!("{p:?} {dtype:?}"), &got, &want, |i| {
                    1e-6 * mag[i] + 1e-30
                });
            }
        }
    }
}

#[test]
fn out_hw_follows_torch() {
    assert_eq!(params(3, 64, 64, 3, 3, 2, [0, 1, 0, 1]).out_hw(), (32, 32));
    assert_eq!(params(3, 64, 64, 3, 3, 1, [1, 1, 1, 1]).out_hw(), (64, 64));
    assert_eq!(params(4, 8, 12, 3, 2, 2, [0, 0, 0, 0]).out_hw(), (4, 6));
}

#[test]
fn identical_for_any_thread_count() {
    let mut rng = Rng::new(11);
    // Winograd (several blocks, and runs of one tile row), then the direct form.
    for p in [
        params(33, 17, 17, 9, 3, 1, [1, 1, 1, 1]),
        params(8, 6, 300, 8, 3, 1, [1, 1, 1, 1]),
        params(5, 17, 17, 9, 3, 1, [1, 1, 1, 1]),
    ] {
        let x = rng.vec(p.cin * p.h * p.w, 1.0);
        let w = rng.vec(p.cout * p.cin * 9, 0.5);
        let bias = rng.vec(p.cout, 1.0);
        let wb = f32_bytes(&w);
        assert_thread_invariant("conv2d", || run(&p, DType::F32, &wb, &x, Some(&bias)));
    }
}

#[test]
fn winograd_takes_3x3_stride_1_with_8_input_channels() {
    assert!(winograd_applies(&params(8, 4, 4, 8, 3, 1, [1, 1, 1, 1])));
    assert!(winograd_applies(&params(
        512,
        64,
        64,
        512,
        3,
        1,
        [0, 0, 0, 0]
    )));
    assert!(winograd_applies(&params(
        128,
        64,
        64,
        3,
        3,
        1,
        [1, 1, 1, 1]
    )));
    assert!(!winograd_applies(&params(7, 4, 4, 8, 3, 1, [1, 1, 1, 1])));
    assert!(!winograd_applies(&params(8, 9, 9, 8, 3, 2, [0, 1, 0, 1])));
    assert!(!winograd_applies(&params(8, 4, 4, 8, 1, 1, [0, 0, 0, 0])));
}

/// The Winograd form stays as close to the f64 convolution as the direct form: its largest
/// error, relative to `Σ|x·w|`, within 4 times the direct form's on the VAE's magnitudes.
#[test]
fn winograd_is_as_accurate_as_the_direct_form() {
    let mut rng = Rng::new(12);
    for p in [
        params(128, 20, 36, 64, 3, 1, [1, 1, 1, 1]),
        params(512, 9, 9, 16, 3, 1, [1, 1, 1, 1]),
    ] {
        let x = rng.vec(p.cin * p.h * p.w, 3.0);
        let w = rng.vec(p.cout * p.cin * 9, 0.05);
        let wb = f32_bytes(&w);
        let got = run(&p, DType::F32, &wb, &x, None);
        let (oh, ow) = p.out_hw();
        let mut direct = vec![0f32; p.cout * oh * ow];
        conv2d_direct(
            &p,
            &x,
            WeightRef::row_major(DType::F32, wb.bytes()),
            None,
            &mut direct,
        );
        let (want, mag) = reference(&p, &x, &w, None);
        let worst = |v: &[f32]| {
            v.iter()
                .zip(&want)
                .zip(&mag)
                .map(|((&g, &w), &m)| (f64::from(g) - w).abs() / m)
                .fold(0.0, f64::max)
        };
        let (wino, dir) = (worst(&got), worst(&direct));
        eprintln!("{p:?}: largest error / Σ|x·w|: winograd {wino:.2e}, direct {dir:.2e}");
        assert!(
            wino <= 4.0 * dir.max(1e-8),
            "winograd {wino:e}, direct {dir:e}"
        );
    }
}

#[test]
#[should_panic(expected = "conv2d: scratch has")]
fn short_scratch_panics_with_message() {
    let p = params(2, 4, 4, 2, 3, 1, [1, 1, 1, 1]);
    let wb = f32_bytes(&[0.0; 36]);
    let mut out = vec![0.0; 32];
    conv2d(
        &p,
        &[0.0; 32],
        WeightRef::row_major(DType::F32, wb.bytes()),
        None,
        &mut out,
        &mut [],
    );
}
