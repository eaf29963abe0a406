//! Every CUDA kernel against its `kernels/generic` twin on ragged sizes, on the first GPU
//! (`scripts/test-cuda` on a machine with one). Element-wise ops, the F32/F16/BF16 and Q8_0
//! matrix products and the Q8_0 activation quantizer must give the generic bits; norms and
//! attention agree within the stated bounds. Without a driver or GPU each test says so and
//! passes, unless `EDGE_REQUIRE_GPU` is set (as `scripts/test-cuda` without `--compile-only`
//! does), which makes that a failure.
#![cfg(feature = "driver")]
#![allow(unsafe_code)]

use edge_kernels::{AttentionParams, WeightRef};
use edge_kernels_cuda::gpu::{Arg, Gpu};
use edge_schema::DType;

/// The GPU with the kernels compiled here by NVRTC, or, when `EDGE_CUDA_PTX_DIR` is set, read
/// from `$EDGE_CUDA_PTX_DIR/ARCH/NAME.ptx` as `scripts/test-cuda --compile-only` writes them
/// (a machine with a GPU but without NVRTC 12).
fn gpu() -> Option<Gpu> {
    Gpu::for_tests()
}

/// SplitMix64 values in `[-scale, scale)`.
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `wf` stored as `dtype` (F32, F16 or BF16) with the kernels' dtype code (0, 1, 2).
fn stored(dtype: DType, wf: &[f32]) -> (Vec<u8>, i32) {
    match dtype {
        DType::F32 => (wf.iter().flat_map(|v| v.to_le_bytes()).collect(), 0),
        DType::F16 => (
            wf.iter()
                .flat_map(|v| edge_kernels::quant::fp32_to_fp16(*v).to_le_bytes())
                .collect(),
            1,
        ),
        _ => (
            wf.iter()
                .flat_map(|v| edge_kernels::quant::fp32_to_bf16(*v).to_le_bytes())
                .collect(),
            2,
        ),
    }
}

/// The generic kernels' `x[m, k] · w[n, k]ᵀ (+ bias)` for a row-major `w` of `dtype`.
#[allow(clippy::too_many_arguments)]
fn generic_linear(
    x: &[f32],
    dtype: DType,
    w: &[u8],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let mut want = vec![0f32; m * n];
    let mut scratch = vec![0u8; edge_kernels::linear_scratch_bytes(dtype, m, k)];
    edge_kernels::linear(
        x,
        WeightRef::row_major(dtype, w),
        bias,
        &mut want,
        m,
        k,
        n,
        &mut scratch,
        None,
    );
    want
}

/// A generic element-wise kernel.
type Unary = fn(&[f32], &mut [f32]);

/// Launches a float-weight product kernel of signature `(x, w, dtype, bias, out, m, k, n)` with
/// `tile × tile` outputs per block of 256 threads; `[x, bias, out]` are f32 device buffers.
///
/// # Safety
/// `x` holds `m·k` f32, `w` `n·k` values of the dtype `code` names, `bias` `n` and `out` `m·n`,
/// and `name` has that signature and tile.
unsafe fn float_linear(
    g: &Gpu,
    name: &str,
    tile: usize,
    [x, bias, out]: [&cudarc::driver::CudaSlice<f32>; 3],
    w: &cudarc::driver::CudaSlice<u8>,
    code: i32,
    (m, k, n): (usize, usize, usize),
) -> Result<(), String> {
    // SAFETY: the caller's contract is the kernel's.
    unsafe {
        g.launch(name)?.run(
            (n.div_ceil(tile) as u32, m.div_ceil(tile) as u32),
            256,
            &[
                Arg::F32s(x),
                Arg::Bytes(w),
                Arg::I32(code),
                Arg::F32s(bias),
                Arg::F32s(out),
                Arg::U64(m as u64),
                Arg::U64(k as u64),
                Arg::U64(n as u64),
            ],
        )
    }
}

fn blocks(n: usize) -> u32 {
    n.div_ceil(256).min(65_535) as u32
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: element {i}: {g:e} on the GPU, {w:e} generic"
        );
    }
}

fn within(what: &str, got: &[f32], want: &[f32], rel: f32) {
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}: element {i}: {g:e} on the GPU, {w:e} generic (bound {rel} × {scale:e})"
        );
    }
}

#[test]
fn elementwise_kernels_give_the_generic_bits() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    for n in [1usize, 31, 1000, 4097] {
        let x = values(n as u64, n, 12.0);
        let dx = g.upload(&x)?;
        let unary: [(&str, Unary); 4] = [
            ("edge_silu", edge_kernels::silu),
            ("edge_gelu_tanh", edge_kernels::gelu_tanh),
            ("edge_tanh_k", edge_kernels::tanh),
            ("edge_relu", edge_kernels::relu),
        ];
        for (k, f) in unary {
            let out = g.zeros::<f32>(n)?;
            // SAFETY: (x, out, n) as the kernel declares; both buffers hold n values.
            unsafe {
                g.launch(k)?.run(
                    (blocks(n), 1),
                    256,
                    &[Arg::F32s(&dx), Arg::F32s(&out), Arg::U64(n as u64)],
                )?
            };
            let mut want = vec![0f32; n];
            f(&x, &mut want);
            same_bits(&format!("{k} n={n}"), &g.download(&out)?[..n], &want);
        }
        // Binary ops with `b` broadcast over rows of d.
        let d = [1usize, 7, n]
            .into_iter()
            .filter(|d| n % d == 0)
            .max()
            .unwrap_or(1);
        let b = values(7, d, 3.0);
        let db = g.upload(&b)?;
        for (k, f) in [
            (
                "edge_add",
                edge_kernels::add as fn(&[f32], &[f32], &mut [f32]),
            ),
            ("edge_mul", edge_kernels::mul),
        ] {
            let out = g.zeros::<f32>(n)?;
            // SAFETY: (a, b, out, n, nb) as declared; a and out hold n values, b holds d.
            unsafe {
                g.launch(k)?.run(
                    (blocks(n), 1),
                    256,
                    &[
                        Arg::F32s(&dx),
                        Arg::F32s(&db),
                        Arg::F32s(&out),
                        Arg::U64(n as u64),
                        Arg::U64(d as u64),
                    ],
                )?
            };
            let mut want = vec![0f32; n];
            f(&x, &b, &mut want);
            same_bits(&format!("{k} n={n} d={d}"), &g.download(&out)?[..n], &want);
        }
        let m = n / d;
        let (shift, scale) = (values(11, d, 1.0), values(13, d, 1.0));
        let (ds, dc) = (g.upload(&shift)?, g.upload(&scale)?);
        let out = g.zeros::<f32>(n)?;
        // SAFETY: (x, shift, scale, out, m, d) as declared.
        unsafe {
            g.launch("edge_modulate")?.run(
                (blocks(n), 1),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::F32s(&ds),
                    Arg::F32s(&dc),
                    Arg::F32s(&out),
                    Arg::U64(m as u64),
                    Arg::U64(d as u64),
                ],
            )?
        };
        let mut want = vec![0f32; n];
        edge_kernels::modulate(&x, m, d, &shift, &scale, &mut want);
        same_bits("edge_modulate", &g.download(&out)?[..n], &want);
    }
    Ok(())
}

#[test]
fn plain_and_q8_0_linear_give_the_generic_bits() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    for (m, k, n) in [
        (1usize, 32usize, 1usize),
        (5, 64, 70),
        (70, 288, 131),
        (3, 1152, 64),
    ] {
        let x = values(1, m * k, 2.0);
        let wf = values(2, n * k, 0.5);
        let bias = values(3, n, 1.0);
        let dx = g.upload(&x)?;
        let dbias = g.upload(&bias)?;
        for (dtype, code) in [(DType::F32, 0i32), (DType::F16, 1), (DType::BF16, 2)] {
            let (bytes, _) = stored(dtype, &wf);
            let dw = g.upload(&bytes)?;
            let out = g.zeros::<f32>(m * n)?;
            // SAFETY: x holds m·k f32, w n·k values of `dtype`, bias n and out m·n.
            unsafe {
                float_linear(
                    &g,
                    "edge_linear_plain",
                    64,
                    [&dx, &dbias, &out],
                    &dw,
                    code,
                    (m, k, n),
                )?
            };
            let want = generic_linear(&x, dtype, &bytes, Some(&bias), m, k, n);
            same_bits(
                &format!("edge_linear_plain {dtype:?} {m}x{k}x{n}"),
                &g.download(&out)?[..m * n],
                &want,
            );
        }
        // Q8_0: activations quantized on the GPU, then the integer block sums.
        let nb = k / 32;
        let mut wq = vec![0u8; n * nb * 34];
        edge_kernels::quant::quantize_row(DType::Q8_0, &wf, &mut wq);
        let dwq = g.upload(&wq)?;
        let xq = g.zeros::<u8>(m * nb * 34)?;
        // SAFETY: (x, q, blocks) as declared; x holds m·k values, q m·nb·34 bytes.
        unsafe {
            g.launch("edge_quantize_q8_0")?.run(
                (blocks(m * nb), 1),
                256,
                &[Arg::F32s(&dx), Arg::Bytes(&xq), Arg::U64((m * nb) as u64)],
            )?
        };
        let mut want_q = vec![0u8; m * nb * 34];
        edge_kernels::quant::quantize_row(DType::Q8_0, &x, &mut want_q);
        assert_eq!(
            g.download(&xq)?[..m * nb * 34],
            want_q[..],
            "edge_quantize_q8_0 {m}x{k}"
        );
        let out = g.zeros::<f32>(m * n)?;
        // SAFETY: (xq, w, bias, out, m, k, n) as declared.
        unsafe {
            g.launch("edge_linear_q8_0")?.run(
                (n.div_ceil(64) as u32, m.div_ceil(4) as u32),
                256,
                &[
                    Arg::Bytes(&xq),
                    Arg::Bytes(&dwq),
                    Arg::F32s(&dbias),
                    Arg::F32s(&out),
                    Arg::U64(m as u64),
                    Arg::U64(k as u64),
                    Arg::U64(n as u64),
                ],
            )?
        };
        let mut want = vec![0f32; m * n];
        let mut scratch = vec![0u8; edge_kernels::linear_scratch_bytes(DType::Q8_0, m, k)];
        let wr = WeightRef::row_major(DType::Q8_0, &wq);
        edge_kernels::linear(&x, wr, Some(&bias), &mut want, m, k, n, &mut scratch, None);
        same_bits(
            &format!("edge_linear_q8_0 {m}x{k}x{n}"),
            &g.download(&out)?[..m * n],
            &want,
        );
    }
    Ok(())
}

#[test]
fn norms_agree_with_generic_within_1e_5() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    for (m, d) in [(1usize, 1usize), (3, 77), (5, 1152)] {
        let x = values(5, m * d, 4.0);
        let (w, b) = (values(6, d, 1.0), values(7, d, 1.0));
        let (dx, dw, db) = (g.upload(&x)?, g.upload(&w)?, g.upload(&b)?);
        let out = g.zeros::<f32>(m * d)?;
        // SAFETY: (x, weight, bias, out, d, eps) as declared; m blocks of 256 threads, x and
        // out hold m·d values.
        unsafe {
            g.launch("edge_layer_norm")?.run(
                (m as u32, 1),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::F32s(&dw),
                    Arg::F32s(&db),
                    Arg::F32s(&out),
                    Arg::U64(d as u64),
                    Arg::F32(1e-6),
                ],
            )?
        };
        let mut want = vec![0f32; m * d];
        edge_kernels::layer_norm(&x, m, d, 1e-6, Some(&w), Some(&b), &mut want);
        within("edge_layer_norm", &g.download(&out)?[..m * d], &want, 1e-5);
        let out = g.zeros::<f32>(m * d)?;
        // SAFETY: (x, weight, out, d, eps) as declared.
        unsafe {
            g.launch("edge_rms_norm")?.run(
                (m as u32, 1),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::F32s(&dw),
                    Arg::F32s(&out),
                    Arg::U64(d as u64),
                    Arg::F32(1e-6),
                ],
            )?
        };
        let mut want = vec![0f32; m * d];
        edge_kernels::rms_norm(&x, m, d, 1e-6, &w, &mut want);
        within("edge_rms_norm", &g.download(&out)?[..m * d], &want, 1e-5);
    }
    Ok(())
}

#[test]
fn attention_agrees_with_generic_within_1e_5() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    for (lq, lk, heads, hd, masked) in [
        (1usize, 1usize, 1usize, 8usize, false),
        (37, 53, 3, 72, true),
        (16, 300, 16, 72, true),
    ] {
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
            masked_value: -10_000.0,
        };
        let q = values(8, lq * d, 1.0);
        let kv = values(9, lk * 2 * d, 1.0);
        let mask: Vec<f32> = (0..lk)
            .map(|j| if masked && j % 5 == 4 { 0.0 } else { 1.0 })
            .collect();
        let (dq, dkv, dm) = (g.upload(&q)?, g.upload(&kv)?, g.upload(&mask)?);
        let out = g.zeros::<f32>(lq * d)?;
        let warps = lq * heads;
        // SAFETY: the argument list of edge_attention; one warp per (row, head), 4 warps per
        // block; q holds lq·d, kv lk·2d, mask lk and out lq·d values.
        unsafe {
            g.launch("edge_attention")?.run(
                (warps.div_ceil(4) as u32, 1),
                128,
                &[
                    Arg::F32s(&dq),
                    Arg::F32s(&dkv),
                    if masked { Arg::F32s(&dm) } else { Arg::Null },
                    Arg::Null,
                    Arg::F32s(&out),
                    Arg::U64(lq as u64),
                    Arg::U64(lk as u64),
                    Arg::U32(heads as u32),
                    Arg::U32(hd as u32),
                    Arg::F32(p.scale),
                    Arg::U64(p.q_stride as u64),
                    Arg::U64(0),
                    Arg::U64(p.kv_stride as u64),
                    Arg::U64(0),
                    Arg::U64(d as u64),
                    Arg::F32(p.masked_value),
                ],
            )?
        };
        let mut want = vec![0f32; lq * d];
        edge_kernels::attention(&p, &q, &kv, masked.then_some(&mask[..]), None, &mut want);
        within(
            &format!("edge_attention {lq}x{lk} {heads}x{hd}"),
            &g.download(&out)?[..lq * d],
            &want,
            1e-5,
        );
    }
    Ok(())
}

#[test]
fn scale_gated_residual_and_upsample_give_the_generic_bits() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    for (m, d) in [(1usize, 1usize), (3, 77), (17, 1152)] {
        let n = m * d;
        let (x, y, gate) = (values(21, n, 3.0), values(22, n, 3.0), values(23, d, 1.0));
        let (dx, dy, dg) = (g.upload(&x)?, g.upload(&y)?, g.upload(&gate)?);
        let out = g.zeros::<f32>(n)?;
        // SAFETY: (x, factor, out, n) as declared; x and out hold n values.
        unsafe {
            g.launch("edge_scale")?.run(
                (blocks(n), 1),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::F32(0.18215),
                    Arg::F32s(&out),
                    Arg::U64(n as u64),
                ],
            )?
        };
        let mut want = vec![0f32; n];
        edge_kernels::scale(&x, 0.18215, &mut want);
        same_bits("edge_scale", &g.download(&out)?[..n], &want);
        let out = g.zeros::<f32>(n)?;
        // SAFETY: (x, y, gate, out, m, d) as declared; x, y, out hold m·d values, gate d.
        unsafe {
            g.launch("edge_gated_residual")?.run(
                (blocks(n), 1),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::F32s(&dy),
                    Arg::F32s(&dg),
                    Arg::F32s(&out),
                    Arg::U64(m as u64),
                    Arg::U64(d as u64),
                ],
            )?
        };
        edge_kernels::gated_residual(&x, &y, m, d, &gate, &mut want);
        same_bits("edge_gated_residual", &g.download(&out)?[..n], &want);
        // Upsampling of m channels of a 1 × d image... and of d channels of 1 × m.
        for (c, h, w) in [(m, 1, d), (d.min(40), m, 3)] {
            let x = values(24, c * h * w, 2.0);
            let dx = g.upload(&x)?;
            let out = g.zeros::<f32>(4 * c * h * w)?;
            // SAFETY: (x, out, c, h, w) as declared; x holds c·h·w values, out 4·c·h·w.
            unsafe {
                g.launch("edge_upsample_nearest2x")?.run(
                    (blocks(4 * c * h * w), 1),
                    256,
                    &[
                        Arg::F32s(&dx),
                        Arg::F32s(&out),
                        Arg::U64(c as u64),
                        Arg::U64(h as u64),
                        Arg::U64(w as u64),
                    ],
                )?
            };
            let mut want = vec![0f32; 4 * c * h * w];
            edge_kernels::upsample_nearest2x(&x, c, h, w, &mut want);
            same_bits(
                &format!("edge_upsample_nearest2x {c}x{h}x{w}"),
                &g.download(&out)?[..4 * c * h * w],
                &want,
            );
        }
    }
    Ok(())
}

#[test]
fn group_norm_agrees_with_generic_within_1e_5() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    for (c, hw, groups) in [(4usize, 1usize, 2usize), (32, 37, 32), (64, 1000, 32)] {
        let x = values(31, c * hw, 5.0);
        let (w, b) = (values(32, c, 1.0), values(33, c, 1.0));
        let (dx, dw, db) = (g.upload(&x)?, g.upload(&w)?, g.upload(&b)?);
        let out = g.zeros::<f32>(c * hw)?;
        // SAFETY: (x, weight, bias, out, c, hw, groups, eps) as declared; one block of 256
        // threads per group; x and out hold c·hw values, weight and bias c.
        unsafe {
            g.launch("edge_group_norm")?.run(
                (groups as u32, 1),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::F32s(&dw),
                    Arg::F32s(&db),
                    Arg::F32s(&out),
                    Arg::U64(c as u64),
                    Arg::U64(hw as u64),
                    Arg::U64(groups as u64),
                    Arg::F32(1e-6),
                ],
            )?
        };
        let mut want = vec![0f32; c * hw];
        edge_kernels::group_norm(&x, c, hw, groups, 1e-6, &w, &b, &mut want);
        within(
            &format!("edge_group_norm {c}x{hw}/{groups}"),
            &g.download(&out)?[..c * hw],
            &want,
            1e-5,
        );
    }
    Ok(())
}

/// Whether `g` has the tensor-core kernels (sm_80 and later); says so when it does not.
fn has_mma(g: &Gpu) -> bool {
    let yes = g.arch != edge_kernels_cuda::Arch::Sm72;
    if !yes {
        eprintln!(
            "skipped on {}: the mma kernels need sm_80 or later",
            g.label
        );
    }
    yes
}

#[test]
fn q8_0_tensor_core_product_gives_the_generic_bits() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    if !has_mma(&g) {
        return Ok(());
    }
    for (m, k, n) in [
        (1usize, 32usize, 1usize),
        (5, 64, 70),
        (70, 288, 131),
        (130, 1152, 200),
        (300, 4096, 64),
    ] {
        let x = values(41, m * k, 3.0);
        let wf = values(42, n * k, 0.5);
        let bias = values(43, n, 1.0);
        let nb = k / 32;
        let mut wq = vec![0u8; n * nb * 34];
        edge_kernels::quant::quantize_row(DType::Q8_0, &wf, &mut wq);
        let (dx, dw, db) = (g.upload(&x)?, g.upload(&wq)?, g.upload(&bias)?);
        // The weights split on the GPU; the activations quantized straight into the split form.
        let (wqs, wd) = (g.zeros::<u8>(n * k)?, g.zeros::<f32>(n * nb)?);
        let (xqs, xd) = (g.zeros::<u8>(m * k)?, g.zeros::<f32>(m * nb)?);
        // SAFETY: (src, qs, d, blocks): src holds n·nb blocks of 34 bytes, qs n·k bytes, d n·nb.
        unsafe {
            g.launch("edge_q8_0_split")?.run(
                (blocks(n * nb), 1),
                256,
                &[
                    Arg::Bytes(&dw),
                    Arg::Bytes(&wqs),
                    Arg::F32s(&wd),
                    Arg::U64((n * nb) as u64),
                ],
            )?
        };
        // SAFETY: (x, qs, d, blocks): x holds m·k values, qs m·k bytes, d m·nb.
        unsafe {
            g.launch("edge_quantize_q8_0_split")?.run(
                (blocks(m * nb), 1),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::Bytes(&xqs),
                    Arg::F32s(&xd),
                    Arg::U64((m * nb) as u64),
                ],
            )?
        };
        // The split activations hold the CPU quantizer's values.
        let mut want_q = vec![0u8; m * nb * 34];
        edge_kernels::quant::quantize_row(DType::Q8_0, &x, &mut want_q);
        let (got_q, got_d) = (g.download(&xqs)?, g.download(&xd)?);
        for b in 0..m * nb {
            let blk = &want_q[b * 34..(b + 1) * 34];
            let d = edge_kernels::quant::fp16_to_fp32(u16::from_le_bytes([blk[0], blk[1]]));
            assert_eq!(
                got_d[b].to_bits(),
                d.to_bits(),
                "edge_quantize_q8_0_split scale {b}"
            );
            assert_eq!(
                got_q[b * 32..(b + 1) * 32],
                blk[2..],
                "edge_quantize_q8_0_split quants {b}"
            );
        }
        for with_bias in [true, false] {
            let out = g.zeros::<f32>(m * n)?;
            // SAFETY: (xq, xd, wq, wd, bias, out, m, k, n): 128 × 128 outputs per block of 256
            // threads; the buffers hold the split forms above.
            unsafe {
                g.launch("edge_linear_q8_0_mma")?.run(
                    (n.div_ceil(128) as u32, m.div_ceil(128) as u32),
                    256,
                    &[
                        Arg::Bytes(&xqs),
                        Arg::F32s(&xd),
                        Arg::Bytes(&wqs),
                        Arg::F32s(&wd),
                        if with_bias { Arg::F32s(&db) } else { Arg::Null },
                        Arg::F32s(&out),
                        Arg::U64(m as u64),
                        Arg::U64(k as u64),
                        Arg::U64(n as u64),
                    ],
                )?
            };
            let want = generic_linear(
                &x,
                DType::Q8_0,
                &wq,
                with_bias.then_some(&bias[..]),
                m,
                k,
                n,
            );
            same_bits(
                &format!("edge_linear_q8_0_mma {m}x{k}x{n} bias {with_bias}"),
                &g.download(&out)?[..m * n],
                &want,
            );
        }
    }
    Ok(())
}

#[test]
fn f16_and_bf16_tensor_core_products_agree_with_generic_within_their_rounding() -> Result<(), String>
{
    let Some(g) = gpu() else { return Ok(()) };
    if !has_mma(&g) {
        return Ok(());
    }
    for (m, k, n) in [
        (1usize, 16usize, 1usize),
        (5, 77, 70),
        (70, 288, 131),
        (130, 1152, 200),
    ] {
        let x = values(51, m * k, 2.0);
        let wf = values(52, n * k, 0.5);
        let bias = values(53, n, 1.0);
        let (dx, db) = (g.upload(&x)?, g.upload(&bias)?);
        // Bounds: activations rounded to F16 (2⁻¹¹ relative) or BF16 (2⁻⁸), sums in f32.
        for (dtype, code, bound) in [(DType::F16, 1i32, 2e-3f32), (DType::BF16, 2, 1.5e-2)] {
            let (bytes, _) = stored(dtype, &wf);
            let dw = g.upload(&bytes)?;
            let out = g.zeros::<f32>(m * n)?;
            // SAFETY: x holds m·k f32, w n·k halves, bias n and out m·n; 128 × 128 outputs
            // per block of 256 threads.
            unsafe {
                float_linear(
                    &g,
                    "edge_linear_f16_mma",
                    128,
                    [&dx, &db, &out],
                    &dw,
                    code,
                    (m, k, n),
                )?
            };
            let want = generic_linear(&x, dtype, &bytes, Some(&bias), m, k, n);
            within(
                &format!("edge_linear_f16_mma {dtype:?} {m}x{k}x{n}"),
                &g.download(&out)?[..m * n],
                &want,
                bound,
            );
        }
    }
    Ok(())
}

#[test]
fn tensor_core_attention_agrees_with_generic_within_2e_3() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    if !has_mma(&g) {
        return Ok(());
    }
    for (lq, lk, heads, hd, masked, biased) in [
        (1usize, 1usize, 1usize, 8usize, false, false),
        (37, 53, 3, 72, true, false),
        (16, 300, 16, 72, true, false),
        (200, 130, 2, 64, false, true),
        (1024, 300, 16, 72, true, false),
        (129, 1024, 4, 80, false, false),
    ] {
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
            masked_value: -10_000.0,
        };
        let q = values(61, lq * d, 1.5);
        let kv = values(62, lk * 2 * d, 1.5);
        let mask: Vec<f32> = (0..lk)
            .map(|j| if masked && j % 5 == 4 { 0.0 } else { 1.0 })
            .collect();
        let bias = values(63, heads * lq * lk, 2.0);
        let (dq, dkv, dm, db) = (
            g.upload(&q)?,
            g.upload(&kv)?,
            g.upload(&mask)?,
            g.upload(&bias)?,
        );
        let out = g.zeros::<f32>(lq * d)?;
        // SAFETY: edge_attention_mma's argument list; 64 query rows per block of 128 threads,
        // one block row per head; q holds lq·d, kv lk·2d, mask lk, bias heads·lq·lk values.
        unsafe {
            g.launch("edge_attention_mma")?.run(
                (lq.div_ceil(64) as u32, heads as u32),
                128,
                &[
                    Arg::F32s(&dq),
                    Arg::F32s(&dkv),
                    if masked { Arg::F32s(&dm) } else { Arg::Null },
                    if biased { Arg::F32s(&db) } else { Arg::Null },
                    Arg::F32s(&out),
                    Arg::U64(lq as u64),
                    Arg::U64(lk as u64),
                    Arg::U32(heads as u32),
                    Arg::U32(hd as u32),
                    Arg::F32(p.scale),
                    Arg::U64(p.q_stride as u64),
                    Arg::U64(0),
                    Arg::U64(p.kv_stride as u64),
                    Arg::U64(0),
                    Arg::U64(d as u64),
                    Arg::F32(p.masked_value),
                ],
            )?
        };
        let mut want = vec![0f32; lq * d];
        edge_kernels::attention(
            &p,
            &q,
            &kv,
            masked.then_some(&mask[..]),
            biased.then_some(&bias[..]),
            &mut want,
        );
        within(
            &format!("edge_attention_mma {lq}x{lk} {heads}x{hd}"),
            &g.download(&out)?[..lq * d],
            &want,
            2e-3,
        );
    }
    Ok(())
}

#[test]
fn conv2d_gives_the_generic_bits() -> Result<(), String> {
    use edge_kernels::Conv2dParams;
    let Some(g) = gpu() else { return Ok(()) };
    let conv = |cin, h, w, cout, k, s, pads: (usize, usize, usize, usize)| Conv2dParams {
        cin,
        h,
        w,
        cout,
        kh: k,
        kw: k,
        stride_h: s,
        stride_w: s,
        pad_top: pads.0,
        pad_bottom: pads.1,
        pad_left: pads.2,
        pad_right: pads.3,
    };
    for (p, dtype) in [
        (conv(5, 7, 9, 70, 3, 1, (1, 1, 1, 1)), DType::F32),
        (conv(64, 13, 11, 3, 1, 1, (0, 0, 0, 0)), DType::F16),
        (conv(8, 16, 15, 9, 3, 2, (0, 1, 0, 1)), DType::BF16),
        (conv(4, 32, 32, 130, 2, 2, (0, 0, 0, 0)), DType::F16),
    ] {
        let (oh, ow) = p.out_hw();
        let kk = p.cin * p.kh * p.kw;
        let x = values(71, p.cin * p.h * p.w, 2.0);
        let wf = values(72, p.cout * kk, 0.5);
        let bias = values(73, p.cout, 1.0);
        let (bytes, code) = stored(dtype, &wf);
        let (dx, dw, db) = (g.upload(&x)?, g.upload(&bytes)?, g.upload(&bias)?);
        let out = g.zeros::<f32>(p.cout * oh * ow)?;
        let u = |v: usize| Arg::U32(v as u32);
        // SAFETY: edge_conv2d's argument list; x holds cin·h·w values, w cout·cin·kh·kw of
        // `dtype`, bias cout, out cout·oh·ow; 64 × 64 outputs per block of 256 threads.
        unsafe {
            g.launch("edge_conv2d")?.run(
                ((oh * ow).div_ceil(64) as u32, p.cout.div_ceil(64) as u32),
                256,
                &[
                    Arg::F32s(&dx),
                    Arg::Bytes(&dw),
                    Arg::I32(code),
                    Arg::F32s(&db),
                    Arg::F32s(&out),
                    u(p.cin),
                    u(p.h),
                    u(p.w),
                    u(p.cout),
                    u(p.kh),
                    u(p.kw),
                    u(p.stride_h),
                    u(p.stride_w),
                    u(p.pad_top),
                    u(p.pad_left),
                    u(oh),
                    u(ow),
                ],
            )?
        };
        let mut want = vec![0f32; p.cout * oh * ow];
        // The direct (im2col) order: the CPU computes 3×3 stride-1 convolutions by Winograd
        // F(2×2, 3×3) since 2026-12-05; the CUDA kernel keeps the direct form's bits.
        let wr = WeightRef::row_major(dtype, &bytes);
        edge_kernels::conv2d_direct(&p, &x, wr, Some(&bias), &mut want);
        same_bits(
            &format!("edge_conv2d {p:?} {dtype:?}"),
            &g.download(&out)?[..want.len()],
            &want,
        );
    }
    Ok(())
}

#[test]
fn dequantize_gives_the_generic_bits() -> Result<(), String> {
    let Some(g) = gpu() else { return Ok(()) };
    for n in [32usize, 96, 4096] {
        let x = values(81, n, 7.0);
        for (dtype, code) in [
            (DType::F32, 0i32),
            (DType::F16, 1),
            (DType::BF16, 2),
            (DType::Q8_0, 3),
        ] {
            let mut bytes = vec![0u8; dtype.bytes_for(n as u64).unwrap() as usize];
            edge_kernels::quant::quantize_row(dtype, &x, &mut bytes);
            let src = g.upload(&bytes)?;
            let out = g.zeros::<f32>(n)?;
            // SAFETY: (src, dtype, out, n): src holds n values of `dtype`, out n f32.
            unsafe {
                g.launch("edge_dequantize")?.run(
                    (blocks(n), 1),
                    256,
                    &[
                        Arg::Bytes(&src),
                        Arg::I32(code),
                        Arg::F32s(&out),
                        Arg::U64(n as u64),
                    ],
                )?
            };
            let mut want = vec![0f32; n];
            edge_kernels::quant::dequantize_row(dtype, &bytes, &mut want);
            same_bits(
                &format!("edge_dequantize {dtype:?} n={n}"),
                &g.download(&out)?[..n],
                &want,
            );
        }
    }
    Ok(())
}
