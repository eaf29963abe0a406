//! The x86-64 kernel tables, built from the features `edge_kernels::cpu` detected.

mod attention;
mod bf16dot;
mod norm;
pub(crate) mod peak;
mod qgemm;
mod qgemm_amx;
mod qgemm_avx2;
mod tile;
mod vmath;

use edge_kernels::cpu::Features;
use edge_kernels::{conv2d_with, generic, linear_plain, Kernel, KernelTable, WeightRef};
use edge_schema::plan::PackLayout;
use edge_schema::DType;

/// Which panel tile serves the quantized 32-element block types.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QuantTile {
    /// `vpmaddubsw` / `vpmaddwd`, 4 rows × 8 columns ([`qgemm_avx2`]).
    Avx2,
    /// `vpdpbusd`, 6 rows × 32 columns ([`qgemm`]).
    Vnni,
    /// AMX `tdpbssd`, 16 rows × 32 columns ([`qgemm_amx`]), for calls of at least 16 rows
    /// and 256 features ([`qgemm_amx::pays`]); the VNNI tile for the others.
    Amx,
}

/// What distinguishes the x86 tables: the f32 tile, the attention step, and the panel
/// tile of the quantized 32-element block types.
trait Isa {
    const SILU: Kernel<edge_kernels::UnaryFn>;
    const GELU: Kernel<edge_kernels::UnaryFn>;
    /// GELU in place: the epilogue a fused `linear` calls (`gelu_tanh_in_place` slot).
    const GELU_IN_PLACE: Kernel<edge_kernels::EpilogueFn>;
    const TILE: edge_kernels::F32Tile;
    const ATTENTION: edge_kernels::AttentionOps;
    const QUANT: QuantTile;
    /// Whether `vdpbf16ps` serves [`PackLayout::Bf16Pairs16`] weights ([`bf16dot`]).
    const BF16: bool = false;
}

struct Avx2;
struct Avx512;
struct Avx512Vnni;
struct Avx512Bf16;
struct Avx512Amx;

impl Isa for Avx2 {
    const SILU: Kernel<edge_kernels::UnaryFn> = Kernel {
        name: "avx2_silu_f32_x8",
        run: vmath::silu_avx2,
    };
    const GELU: Kernel<edge_kernels::UnaryFn> = Kernel {
        name: "avx2_gelu_tanh_f32_x8",
        run: vmath::gelu_avx2,
    };
    const GELU_IN_PLACE: Kernel<edge_kernels::EpilogueFn> = Kernel {
        name: "avx2_gelu_tanh_f32_x8_in_place",
        run: vmath::gelu_in_place_avx2,
    };
    const TILE: edge_kernels::F32Tile = tile::AVX2;
    const ATTENTION: edge_kernels::AttentionOps = attention::AVX2;
    const QUANT: QuantTile = QuantTile::Avx2;
}

impl Isa for Avx512 {
    const SILU: Kernel<edge_kernels::UnaryFn> = Kernel {
        name: "avx512_silu_f32_x16",
        run: vmath::silu_avx512,
    };
    const GELU: Kernel<edge_kernels::UnaryFn> = Kernel {
        name: "avx512_gelu_tanh_f32_x16",
        run: vmath::gelu_avx512,
    };
    const GELU_IN_PLACE: Kernel<edge_kernels::EpilogueFn> = Kernel {
        name: "avx512_gelu_tanh_f32_x16_in_place",
        run: vmath::gelu_in_place_avx512,
    };
    const TILE: edge_kernels::F32Tile = tile::AVX512;
    const ATTENTION: edge_kernels::AttentionOps = attention::AVX512;
    const QUANT: QuantTile = QuantTile::Avx2;
}

/// The AVX-512 table plus the VNNI panel kernel.
impl Isa for Avx512Vnni {
    const SILU: Kernel<edge_kernels::UnaryFn> = Avx512::SILU;
    const GELU: Kernel<edge_kernels::UnaryFn> = Avx512::GELU;
    const GELU_IN_PLACE: Kernel<edge_kernels::EpilogueFn> = Avx512::GELU_IN_PLACE;
    const TILE: edge_kernels::F32Tile = Avx512::TILE;
    const ATTENTION: edge_kernels::AttentionOps = Avx512::ATTENTION;
    const QUANT: QuantTile = QuantTile::Vnni;
}

/// The AVX-512 VNNI table plus the AVX512_BF16 kernel of [`PackLayout::Bf16Pairs16`] weights.
impl Isa for Avx512Bf16 {
    const SILU: Kernel<edge_kernels::UnaryFn> = Avx512::SILU;
    const GELU: Kernel<edge_kernels::UnaryFn> = Avx512::GELU;
    const GELU_IN_PLACE: Kernel<edge_kernels::EpilogueFn> = Avx512::GELU_IN_PLACE;
    const TILE: edge_kernels::F32Tile = Avx512::TILE;
    const ATTENTION: edge_kernels::AttentionOps = Avx512::ATTENTION;
    const QUANT: QuantTile = QuantTile::Vnni;
    const BF16: bool = true;
}

/// The AVX512_BF16 table with the AMX-INT8 tile for the quantized block types.
impl Isa for Avx512Amx {
    const SILU: Kernel<edge_kernels::UnaryFn> = Avx512::SILU;
    const GELU: Kernel<edge_kernels::UnaryFn> = Avx512::GELU;
    const GELU_IN_PLACE: Kernel<edge_kernels::EpilogueFn> = Avx512::GELU_IN_PLACE;
    const TILE: edge_kernels::F32Tile = Avx512::TILE;
    const ATTENTION: edge_kernels::AttentionOps = Avx512::ATTENTION;
    const QUANT: QuantTile = QuantTile::Amx;
    const BF16: bool = true;
}

/// `{avx2,avx512,avx512vnni}_linear_any`: `F32`/`F16`/`BF16` through the shared GEMM driver
/// with `I`'s tile; row-major `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` weights with at least one
/// register tile of activation rows (4 for AVX2, 6 for VNNI; any for VNNI's `Interleaved16x4`
/// `Q8_0`) through `I`'s panel tile; everything else forwards to the generic kernel.
fn linear<I: Isa>(
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
    if I::BF16 && w.layout == PackLayout::Bf16Pairs16 {
        bf16dot::linear(x, w, bias, out, m, k, n, scratch);
        return edge_kernels::finish_rows(out, n, epilogue);
    }
    let panel = match I::QUANT {
        QuantTile::Amx if qgemm_amx::pays(m, k) && qgemm::handles::<qgemm_amx::Amx>(&w, m, k) => {
            Some(qgemm::linear::<qgemm_amx::Amx> as PanelLinear)
        }
        QuantTile::Vnni | QuantTile::Amx if qgemm::handles::<qgemm::Vnni>(&w, m, k) => {
            Some(qgemm::linear::<qgemm::Vnni> as PanelLinear)
        }
        QuantTile::Avx2 if qgemm::handles::<qgemm_avx2::Avx2>(&w, m, k) => {
            Some(qgemm::linear::<qgemm_avx2::Avx2> as PanelLinear)
        }
        // Every x86 table has AVX2 and FMA: the 7-bit layout's tile serves them all (VNNI's
        // `vpdpbusd` would gain nothing from 7-bit activations).
        _ if qgemm::handles::<qgemm_avx2::Avx2A7>(&w, m, k) => {
            Some(qgemm::linear::<qgemm_avx2::Avx2A7> as PanelLinear)
        }
        _ => None,
    };
    if let Some(run) = panel {
        let wrow = edge_kernels::contract::linear(x, w, bias, out, m, k, n, scratch.len());
        if n > 0 {
            run(x, w, wrow, bias, out, m, k, n, scratch, epilogue);
        }
        return;
    }
    match w.dtype {
        DType::F32 | DType::F16 | DType::BF16 if w.layout == PackLayout::RowMajor => {
            linear_plain(&I::TILE, x, w, bias, out, m, k, n, scratch, epilogue)
        }
        _ => edge_kernels::linear(x, w, bias, out, m, k, n, scratch, epilogue),
    }
}

/// [`qgemm::linear`]'s signature.
type PanelLinear = fn(
    &[f32],
    WeightRef<'_>,
    usize,
    Option<&[f32]>,
    &mut [f32],
    usize,
    usize,
    usize,
    &mut [u8],
    Option<edge_kernels::EpilogueFn>,
);

fn attention_on<I: Isa>(
    p: &edge_kernels::AttentionParams,
    q: &[f32],
    kv: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    edge_kernels::attention_with(&I::ATTENTION, p, q, kv, key_mask, bias, out)
}

fn conv2d_on<I: Isa>(
    p: &edge_kernels::Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut [u8],
) {
    conv2d_with(&I::TILE, p, x, w, bias, out, scratch)
}

/// `generic()` with `I`'s slots.
fn table<I: Isa>(linear_name: &'static str, conv_name: &'static str) -> KernelTable {
    let mut t = generic();
    t.linear = Kernel {
        name: linear_name,
        run: linear::<I>,
    };
    t.conv2d = Kernel {
        name: conv_name,
        run: conv2d_on::<I>,
    };
    t.attention = Kernel {
        name: I::ATTENTION.name,
        run: attention_on::<I>,
    };
    // Every x86 table requires AVX2 (each `*_table` below checks it).
    t.layer_norm = Kernel {
        name: "avx2_layer_norm_f64x4",
        run: norm::layer_norm,
    };
    t.rms_norm = Kernel {
        name: "avx2_rms_norm_f64x4",
        run: norm::rms_norm,
    };
    t.silu = I::SILU;
    t.gelu_tanh = I::GELU;
    t.gelu_tanh_in_place = I::GELU_IN_PLACE;
    t
}

/// Slot names of the three `linear` kernels.
const LINEAR_AVX2: &str = "avx2_linear_any";
const LINEAR_AVX512: &str = "avx512_linear_any";
const LINEAR_AVX512_VNNI: &str = "avx512vnni_linear_any";
const LINEAR_AVX512_BF16: &str = "avx512bf16_linear_any";
const LINEAR_AVX512_AMX: &str = "amx_linear_any";

/// AVX2 with FMA (the f32 tile) and F16C (its `F16` weight packing; every AVX2 CPU has it).
fn avx2_table(f: &Features) -> Option<KernelTable> {
    (f.avx2 && f.fma && f.f16c).then(|| table::<Avx2>(LINEAR_AVX2, "avx2_conv2d_f32_6x16"))
}

/// AVX-512F without VNNI; its quantized panel tile is the AVX2 one (every AVX-512 CPU has
/// AVX2 and FMA, checked all the same).
fn avx512_table(f: &Features) -> Option<KernelTable> {
    (f.avx512f && f.avx2 && f.fma).then(|| table::<Avx512>(LINEAR_AVX512, "avx512_conv2d_f32_6x64"))
}

fn avx512_vnni_table(f: &Features) -> Option<KernelTable> {
    (f.avx512f && f.avx512bw && f.avx512vnni && f.avx2 && f.fma)
        .then(|| table::<Avx512Vnni>(LINEAR_AVX512_VNNI, "avx512_conv2d_f32_6x64"))
}

/// The VNNI table, plus `vdpbf16ps` for [`PackLayout::Bf16Pairs16`] weights and for the
/// attention ops a plan marks `bf16_products`.
fn avx512_bf16_table(f: &Features) -> Option<KernelTable> {
    (f.avx512f && f.avx512bw && f.avx512vnni && f.avx512bf16 && f.avx2 && f.fma).then(|| {
        with_bf16_attention(table::<Avx512Bf16>(
            LINEAR_AVX512_BF16,
            "avx512_conv2d_f32_6x64",
        ))
    })
}

/// The AVX512_BF16 table with AMX-INT8 for the quantized block types, where cpuid reports
/// AMX-INT8 (`Features::amxint8`) and this process may use it ([`amx_granted`]).
fn avx512_amx_table(f: &Features) -> Option<KernelTable> {
    (f.avx512f
        && f.avx512bw
        && f.avx512vnni
        && f.avx512bf16
        && f.avx2
        && f.fma
        && f.amxint8
        && amx_granted())
    .then(|| {
        with_bf16_attention(table::<Avx512Amx>(
            LINEAR_AVX512_AMX,
            "avx512_conv2d_f32_6x64",
        ))
    })
}

/// Whether this process may run AMX instructions: the OS saves the tile configuration and
/// data state (`XCR0` bits 17 and 18) and Linux granted the tile data to the process
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, Linux 5.16+; without it the first
/// tile instruction raises `SIGILL`). Asked once per process; false off Linux.
pub(crate) fn amx_granted() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(|| {
        let osxsave = std::arch::x86_64::__cpuid(1).ecx >> 27 & 1 == 1;
        // SAFETY: `xgetbv` exists where cpuid reports OSXSAVE, checked first.
        osxsave && unsafe { xcr0() } >> 17 & 3 == 3 && request_tile_data()
    })
}

/// `XCR0`. Safety: the CPU reports OSXSAVE.
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE; register 0 always exists.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// Asks Linux for the AMX tile data state; true when granted.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM) takes a feature number and touches no memory of
    // this process; a kernel without it answers EINVAL.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Off Linux the permission is not asked for: no AMX table.
#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// `t` with `vdpbf16ps` in the `attention_bf16` slot.
fn with_bf16_attention(mut t: KernelTable) -> KernelTable {
    t.attention_bf16 = Kernel {
        name: attention::AVX512_BF16.name,
        run: attention_bf16_avx512,
    };
    t
}

fn attention_bf16_avx512(
    p: &edge_kernels::AttentionParams,
    q: &[f32],
    kv: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    edge_kernels::attention_with(&attention::AVX512_BF16, p, q, kv, key_mask, bias, out)
}

pub(crate) fn variants(f: &Features) -> Vec<(&'static str, KernelTable)> {
    [
        ("avx2", avx2_table(f)),
        ("avx512", avx512_table(f)),
        ("avx512+vnni", avx512_vnni_table(f)),
        ("avx512+vnni+bf16", avx512_bf16_table(f)),
        ("avx512+vnni+bf16+amx", avx512_amx_table(f)),
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
    let plain =
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16) && layout == PackLayout::RowMajor;
    let q32 = layout == PackLayout::RowMajor
        && matches!(
            dtype,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1
        );
    let vnni = matches!(table.linear.name, LINEAR_AVX512_VNNI | LINEAR_AVX512_BF16);
    let amx = table.linear.name == LINEAR_AVX512_AMX;
    let q8_16x4 = layout == PackLayout::Interleaved16x4 && dtype == DType::Q8_0;
    match table.linear.name {
        LINEAR_AVX512_BF16 | LINEAR_AVX512_AMX if layout == PackLayout::Bf16Pairs16 => {
            Some("avx512bf16_linear_pairs_6x64")
        }
        _ if layout == PackLayout::Bf16Pairs16 => Some("generic_linear_bf16_pairs"),
        LINEAR_AVX2 if plain => Some(tile::AVX2.name),
        LINEAR_AVX512 | LINEAR_AVX512_VNNI | LINEAR_AVX512_BF16 | LINEAR_AVX512_AMX if plain => {
            Some(tile::AVX512.name)
        }
        _ if amx && (q32 || q8_16x4) => {
            Some("amx_linear_q32_panel_16x32 (avx512vnni 6x32 below 16 rows or 256 features)")
        }
        _ if vnni && q32 => Some("avx512vnni_linear_q32_panel_6x32"),
        LINEAR_AVX2 | LINEAR_AVX512 if q32 => Some("avx2_linear_q32_panel_4x8"),
        _ if vnni && q8_16x4 => Some("avx512vnni_linear_q8_0_in_place_6x32"),
        LINEAR_AVX2 | LINEAR_AVX512 | LINEAR_AVX512_VNNI | LINEAR_AVX512_BF16
        | LINEAR_AVX512_AMX
            if layout == PackLayout::Interleaved8x4A7 && dtype == DType::Q8_0 =>
        {
            Some("avx2_linear_q8_0_a7_panel_4x8")
        }
        LINEAR_AVX2 | LINEAR_AVX512 | LINEAR_AVX512_VNNI | LINEAR_AVX512_BF16
        | LINEAR_AVX512_AMX => Some("generic_linear_f32"),
        _ => None,
    }
}
