//! The aarch64 kernels, run-time feature detection and the table variants.

mod attention;
mod binary;
mod elementwise;
mod kquant;
mod norm;
mod quant;
mod tile;
mod upsample;

use edge_kernels::{generic, Kernel, KernelTable, WeightRef};
use edge_schema::plan::PackLayout;
use edge_schema::DType;

use quant::IntPath;

/// Slot name of the `linear` kernel with ARMv8.0 integer dot products.
const LINEAR_BASE: &str = "neon_linear_any_base";
/// Slot name of the `linear` kernel with `sdot` integer dot products.
const LINEAR_DOTPROD: &str = "neon_linear_any_dotprod";
/// Slot name of the `linear` kernel with `smmla` integer matrix products.
const LINEAR_I8MM: &str = "neon_linear_any_i8mm";

use crate::features;

/// `generic()` with the ARMv8.0 NEON slots.
fn base_table() -> KernelTable {
    let mut t = generic();
    t.linear = Kernel {
        name: LINEAR_BASE,
        run: linear_on::<BASE>,
    };
    t.silu = Kernel {
        name: "neon_silu_f32_x4",
        run: elementwise::silu,
    };
    t.gelu_tanh = Kernel {
        name: "neon_gelu_tanh_f32_x4",
        run: elementwise::gelu_tanh,
    };
    t.gelu_tanh_in_place = Kernel {
        name: "neon_gelu_tanh_f32_x4_in_place",
        run: elementwise::gelu_tanh_in_place,
    };
    t.relu = Kernel {
        name: "neon_relu_f32_x4",
        run: elementwise::relu,
    };
    t.tanh = Kernel {
        name: "neon_tanh_f32_x4",
        run: elementwise::tanh,
    };
    t.layer_norm = Kernel {
        name: "neon_layer_norm_f64x2",
        run: norm::layer_norm,
    };
    t.rms_norm = Kernel {
        name: "neon_rms_norm_f64x2",
        run: norm::rms_norm,
    };
    t.conv2d = Kernel {
        name: "neon_conv2d_f32_6x16",
        run: conv2d,
    };
    t.group_norm_stats = Kernel {
        name: "neon_group_norm_stats_f64x2",
        run: norm::group_norm_stats,
    };
    t.group_norm_apply = Kernel {
        name: "neon_group_norm_apply_f64x2",
        run: norm::group_norm_apply,
    };
    t.upsample_nearest2x = Kernel {
        name: "neon_upsample_nearest2x_f32_x4",
        run: upsample::upsample_nearest2x,
    };
    t.attention = Kernel {
        name: "neon_attention_f32_4q",
        run: attention::attention,
    };
    t.add = Kernel {
        name: "neon_add_f32_x4",
        run: binary::add,
    };
    t.mul = Kernel {
        name: "neon_mul_f32_x4",
        run: binary::mul,
    };
    t.modulate = Kernel {
        name: "neon_modulate_f32_x4",
        run: binary::modulate,
    };
    t.gated_residual = Kernel {
        name: "neon_gated_residual_f32_x4",
        run: binary::gated_residual,
    };
    t
}

/// `generic()` with the `dotprod` slots, if the CPU has `FEAT_DotProd`.
fn dotprod_table() -> Option<KernelTable> {
    features().dotprod.then(|| {
        let mut t = base_table();
        t.linear = Kernel {
            name: LINEAR_DOTPROD,
            run: linear_on::<DOTPROD>,
        };
        t
    })
}

/// `generic()` with the `i8mm` slots, if the CPU has `FEAT_I8MM`.
fn i8mm_table() -> Option<KernelTable> {
    features().i8mm.then(|| {
        let mut t = base_table();
        t.linear = Kernel {
            name: LINEAR_I8MM,
            run: linear_on::<I8MM>,
        };
        t
    })
}

pub(crate) fn variants() -> Vec<(&'static str, KernelTable)> {
    let mut v = vec![("neon", base_table())];
    if let Some(t) = dotprod_table() {
        v.push(("neon+dotprod", t));
    }
    if let Some(t) = i8mm_table() {
        v.push(("neon+i8mm", t));
    }
    v
}

pub(crate) fn linear_layout_variant_name(
    table: &KernelTable,
    dtype: DType,
    layout: PackLayout,
) -> &'static str {
    if layout == PackLayout::RowMajor {
        return linear_variant_name(table, dtype);
    }
    assert!(
        edge_kernels::pack::holds(layout, dtype),
        "linear: {dtype:?} weights cannot be in layout {layout:?}"
    );
    if matches!(
        layout,
        PackLayout::Interleaved16x4 | PackLayout::Interleaved8x4A7
    ) {
        return "generic_linear_f32";
    }
    if layout == PackLayout::Bf16Pairs16 {
        return "generic_linear_bf16_pairs";
    }
    match (table.linear.name, dtype) {
        (LINEAR_BASE, DType::Q8_0) => "neon_linear_q8_0_base_x4",
        (LINEAR_DOTPROD, DType::Q8_0) => "neon_linear_q8_0_dotprod_x4",
        (LINEAR_I8MM, DType::Q8_0) => "neon_linear_q8_0_i8mm_x4",
        (LINEAR_BASE, _) => "neon_linear_q4_0_base_x4",
        (LINEAR_DOTPROD, _) => "neon_linear_q4_0_dotprod_x4",
        (LINEAR_I8MM, _) => "neon_linear_q4_0_i8mm_x4",
        _ => "generic_linear_f32",
    }
}

pub(crate) fn linear_variant_name(table: &KernelTable, dtype: DType) -> &'static str {
    let path = match table.linear.name {
        LINEAR_BASE => IntPath::Base,
        LINEAR_DOTPROD => IntPath::DotProd,
        LINEAR_I8MM => IntPath::I8mm,
        _ => return "generic_linear_f32",
    };
    match (dtype, path) {
        (DType::F32, _) => "neon_linear_f32_6x16",
        (DType::F16, _) => "neon_linear_f16_6x16",
        (DType::BF16, _) => "neon_linear_bf16_6x16",
        (DType::Q8_0, IntPath::Base) => "neon_linear_q8_0_base",
        (DType::Q8_0, IntPath::DotProd) => "neon_linear_q8_0_dotprod",
        (DType::Q8_0, IntPath::I8mm) => "neon_linear_q8_0_i8mm_2x4",
        (DType::Q4_0, IntPath::Base) => "neon_linear_q4_0_base",
        (DType::Q4_0, IntPath::DotProd) => "neon_linear_q4_0_dotprod",
        (DType::Q4_0, IntPath::I8mm) => "neon_linear_q4_0_i8mm_2x4",
        (d, p) => kquant::variant_name(d, p).unwrap_or("generic_linear_f32"),
    }
}

/// `neon_linear_any_{base,dotprod,i8mm}`: [`edge_kernels::linear`]'s contract for every
/// weight type, with the integer dot products of `PATH` ([`IntPath`] as `u8`: ARMv8.0,
/// `sdot`, `smmla`). The `dotprod` and `i8mm` forms panic if the CPU lacks the feature; they
/// are only put in a table when it is detected.
fn linear_on<const PATH: u8>(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
    epilogue: Option<edge_kernels::EpilogueFn>,
) {
    let path = match PATH {
        BASE => IntPath::Base,
        DOTPROD => IntPath::DotProd,
        _ => IntPath::I8mm,
    };
    linear(path, x, w, bias, out, m, k, n, scratch, epilogue);
}

/// [`linear_on`]'s `PATH` values.
const BASE: u8 = 0;
const DOTPROD: u8 = 1;
const I8MM: u8 = 2;

/// `neon_conv2d_f32_6x16`: the generic im2col driver with the NEON f32 tile (the generic bits).
fn conv2d(
    p: &edge_kernels::Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    edge_kernels::conv2d_with(&tile::NEON, p, x, w, bias, out, scratch)
}

/// Checks the shapes exactly as [`edge_kernels::linear`] does, then dispatches on the weight
/// type. `epilogue`: in cache through the shared GEMM driver (F32/F16/BF16); after the product
/// for the quantized kernels ([`edge_kernels::finish_rows`], same bits).
#[allow(clippy::too_many_arguments)]
fn linear(
    path: IntPath,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut [u8],
    epilogue: Option<edge_kernels::EpilogueFn>,
) {
    // The x86 VNNI, AVX2 7-bit and AVX512_BF16 layouts have no NEON kernel: the generic one
    // reads them (same bits).
    if (!matches!(
        w.dtype,
        DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0
    ) && !kquant::handles(w.dtype))
        || matches!(
            w.layout,
            PackLayout::Interleaved16x4 | PackLayout::Bf16Pairs16 | PackLayout::Interleaved8x4A7
        )
    {
        return edge_kernels::linear(x, w, bias, out, m, k, n, scratch, epilogue);
    }
    edge_kernels::contract::linear(x, w, bias, out, m, k, n, scratch.len());
    if m == 0 || n == 0 {
        return;
    }
    match w.dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            edge_kernels::linear_plain(&tile::NEON, x, w, bias, out, m, k, n, scratch, epilogue)
        }
        d if kquant::handles(d) => {
            kquant::linear_kquant(path, d, x, w.bytes, bias, out, m, k, n, scratch);
            edge_kernels::finish_rows(out, n, epilogue);
        }
        _ => {
            quant::linear_quant(
                path, w.dtype, w.layout, x, w.bytes, bias, out, m, k, n, scratch,
            );
            edge_kernels::finish_rows(out, n, epilogue);
        }
    }
}
