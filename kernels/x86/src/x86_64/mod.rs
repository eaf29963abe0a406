//! The x86-64 kernel tables, built from the features `edge_kernels::cpu` detected.

mod attention;
mod qgemm;
mod tile;

use edge_kernels::cpu::Features;
use edge_kernels::{conv2d_with, generic, linear_plain, Kernel, KernelTable, WeightRef};
use edge_schema::plan::PackLayout;
use edge_schema::DType;

/// `avx2_linear_any`: `F32`/`F16`/`BF16` through the shared GEMM driver with the AVX2 tile;
/// other weight types forward to the generic kernel.
fn linear_avx2(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    match w.dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            linear_plain(&tile::AVX2, x, w, bias, out, m, k, n, scratch)
        }
        _ => edge_kernels::linear(x, w, bias, out, m, k, n, scratch),
    }
}

/// `avx512_linear_any`: as [`linear_avx2`] with the AVX-512 tile.
fn linear_avx512(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    match w.dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            linear_plain(&tile::AVX512, x, w, bias, out, m, k, n, scratch)
        }
        _ => edge_kernels::linear(x, w, bias, out, m, k, n, scratch),
    }
}

/// `avx512vnni_linear_any`: [`linear_avx512`] plus the VNNI panel kernel for row-major
/// `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` weights with at least 4 activation rows.
fn linear_avx512_vnni(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
) {
    if !qgemm::handles(&w, m, k) {
        return linear_avx512(x, w, bias, out, m, k, n, scratch);
    }
    let wrow = edge_kernels::contract::linear(x, w, bias, out, m, k, n, scratch.len());
    if n == 0 {
        return;
    }
    qgemm::linear(x, w, wrow, bias, out, m, k, n, scratch);
}

fn attention_avx2(
    p: &edge_kernels::AttentionParams,
    q: &[f32],
    kv: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    edge_kernels::attention_with(&attention::AVX2, p, q, kv, key_mask, bias, out)
}

fn attention_avx512(
    p: &edge_kernels::AttentionParams,
    q: &[f32],
    kv: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    edge_kernels::attention_with(&attention::AVX512, p, q, kv, key_mask, bias, out)
}

fn conv2d_avx2(
    p: &edge_kernels::Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    conv2d_with(&tile::AVX2, p, x, w, bias, out, scratch)
}

fn conv2d_avx512(
    p: &edge_kernels::Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    conv2d_with(&tile::AVX512, p, x, w, bias, out, scratch)
}

/// Slot names of the three `linear` kernels.
const LINEAR_AVX2: &str = "avx2_linear_any";
const LINEAR_AVX512: &str = "avx512_linear_any";
const LINEAR_AVX512_VNNI: &str = "avx512vnni_linear_any";

fn avx2_table(f: &Features) -> Option<KernelTable> {
    f.avx2.then(|| {
        let mut t = generic();
        t.linear = Kernel {
            name: LINEAR_AVX2,
            run: linear_avx2,
        };
        t.conv2d = Kernel {
            name: "avx2_conv2d_f32_4x3",
            run: conv2d_avx2,
        };
        t.attention = Kernel {
            name: attention::AVX2.name,
            run: attention_avx2,
        };
        t
    })
}

fn avx512_table(f: &Features) -> Option<KernelTable> {
    f.avx512f.then(|| {
        let mut t = generic();
        t.linear = Kernel {
            name: LINEAR_AVX512,
            run: linear_avx512,
        };
        t.conv2d = Kernel {
            name: "avx512_conv2d_f32_6x8",
            run: conv2d_avx512,
        };
        t.attention = Kernel {
            name: attention::AVX512.name,
            run: attention_avx512,
        };
        t
    })
}

fn avx512_vnni_table(f: &Features) -> Option<KernelTable> {
    (f.avx512vnni && f.avx512bw)
        .then(|| avx512_table(f))
        .flatten()
        .map(|mut t| {
            t.linear = Kernel {
                name: LINEAR_AVX512_VNNI,
                run: linear_avx512_vnni,
            };
            t
        })
}

pub(crate) fn variants(f: &Features) -> Vec<(&'static str, KernelTable)> {
    [
        ("avx2", avx2_table(f)),
        ("avx512", avx512_table(f)),
        ("avx512+vnni", avx512_vnni_table(f)),
    ]
    .into_iter()
    .filter_map(|(n, t)| t.map(|t| (n, t)))
    .collect()
}

pub(crate) fn linear_variant_name(
    table: &KernelTable,
    dtype: DType,
    layout: PackLayout,
) -> Option<&'static str> {
    let plain = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
    let q32 = layout == PackLayout::RowMajor
        && matches!(
            dtype,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1
        );
    match table.linear.name {
        LINEAR_AVX2 if plain => Some(tile::AVX2.name),
        LINEAR_AVX512 | LINEAR_AVX512_VNNI if plain => Some(tile::AVX512.name),
        LINEAR_AVX512_VNNI if q32 => Some("avx512vnni_linear_q32_panel_4x32"),
        LINEAR_AVX2 | LINEAR_AVX512 | LINEAR_AVX512_VNNI => Some("generic_linear_f32"),
        _ => None,
    }
}
