//! ggml quantization: the scalar reference quantizers, dequantizers and dot products of every
//! block type in [`edge_schema::blocks`], and the byte-level entry points that the matmul
//! kernels and the planner's packer call.
//!
//! Everything here is a port of ggml (github.com/ggml-org/ggml, commit d99724f2):
//! `quantize_row_*_ref`, `dequantize_row_*` and the helpers `nearest_int`, `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants` from `src/ggml-quants.c`; the dot products from the
//! `ggml_vec_dot_*_generic` functions of `src/ggml-cpu/quants.c` and `ggml_vec_dot_{f32,f16,bf16}`
//! of `src/ggml-cpu/vec.cpp`. The order of every floating-point operation is kept, so results
//! are bit-identical to ggml compiled without floating-point contraction (and to gguf-py's
//! numpy ports, which the fixture tests check byte for byte). No importance matrix is used.
//!
//! Rows are 1-D: `x.len()` elements (a multiple of the block size) ↔ `x.len() / BLOCK_SIZE`
//! blocks. The typed functions assert that the lengths agree; the byte-level functions also
//! accept block bytes at any alignment (aligned input is viewed in place through zerocopy,
//! misaligned input is copied block by block first).

use std::borrow::Cow;

use edge_schema::blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1, GgmlBlock, QK4_0, QK4_1, QK5_0, QK5_1, QK8_0, QK8_1, QK_K,
};
use edge_schema::plan::PackLayout;
use edge_schema::DType;

use crate::weights::WeightRef;

// ---------------------------------------------------------------------------------------------
// Byte-level API
// ---------------------------------------------------------------------------------------------

/// The format an activation row is converted to before it is dotted with a weight row (ggml's
/// `vec_dot_type`). `Q8_1` and `Q8K` exist only as activations, so they are not [`DType`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// Plain little-endian f32 (weights `F32`).
    F32,
    /// f16 bits (weights `F16`).
    F16,
    /// bf16 bits (weights `BF16`).
    BF16,
    /// [`BlockQ8_0`] (weights `Q4_0`, `Q5_0`, `Q8_0`).
    Q8_0,
    /// [`BlockQ8_1`] (weights `Q4_1`, `Q5_1`).
    Q8_1,
    /// [`BlockQ8K`] (weights `Q2_K` … `Q6_K`).
    Q8K,
}

impl ActFormat {
    /// Elements per block (1 for the plain formats).
    pub const fn block_size(self) -> usize {
        match self {
            ActFormat::F32 | ActFormat::F16 | ActFormat::BF16 => 1,
            ActFormat::Q8_0 => QK8_0,
            ActFormat::Q8_1 => QK8_1,
            ActFormat::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            ActFormat::F32 => 4,
            ActFormat::F16 | ActFormat::BF16 => 2,
            ActFormat::Q8_0 => BlockQ8_0::TYPE_SIZE,
            ActFormat::Q8_1 => BlockQ8_1::TYPE_SIZE,
            ActFormat::Q8K => BlockQ8K::TYPE_SIZE,
        }
    }

    /// ggml's name of the format (`q8_0`, `q8_1`, `q8_K`, …).
    pub const fn name(self) -> &'static str {
        match self {
            ActFormat::F32 => "f32",
            ActFormat::F16 => "f16",
            ActFormat::BF16 => "bf16",
            ActFormat::Q8_0 => "q8_0",
            ActFormat::Q8_1 => "q8_1",
            ActFormat::Q8K => "q8_K",
        }
    }
}

/// The activation format ggml pairs with weight type `w` (its `vec_dot_type`): `Q8_0` for
/// `Q4_0`/`Q5_0`/`Q8_0`, `Q8_1` for `Q4_1`/`Q5_1`, `Q8K` for the K-quants, and the weight's own
/// type for `F32`/`F16`/`BF16`.
///
/// Panics for `I32`, which is not a matmul weight type.
pub fn activation_type(w: DType) -> ActFormat {
    match w {
        DType::F32 => ActFormat::F32,
        DType::F16 => ActFormat::F16,
        DType::BF16 => ActFormat::BF16,
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => ActFormat::Q8_0,
        DType::Q4_1 | DType::Q5_1 => ActFormat::Q8_1,
        DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => ActFormat::Q8K,
        DType::I32 => panic!("activation_type: i32 is not a matmul weight type"),
    }
}

/// Bytes of one activation row of `k` elements in [`activation_type`]`(w)`.
///
/// Panics when `k` is not a multiple of that format's block size, or for `I32`.
pub fn activation_row_bytes(w: DType, k: usize) -> usize {
    let a = activation_type(w);
    assert!(
        k.is_multiple_of(a.block_size()),
        "activation_row_bytes: k = {k} is not a multiple of the {} block size {}",
        a.name(),
        a.block_size()
    );
    k / a.block_size() * a.type_size()
}

/// Converts one activation row `x` (`[k]` f32) to [`activation_type`]`(w)` in `out`
/// (exactly [`activation_row_bytes`]`(w, k)` bytes, any alignment): ggml's `from_float` of the
/// `vec_dot_type` (`quantize_row_q8_0_ref`, `quantize_row_q8_1_ref`, `quantize_row_q8_K_ref`,
/// or an f16/bf16/f32 conversion).
///
/// Panics when the lengths do not agree or `k` is not a whole number of blocks.
pub fn quantize_activation_row(w: DType, x: &[f32], out: &mut [u8]) {
    let a = activation_type(w);
    let bytes = activation_row_bytes(w, x.len());
    assert_eq!(
        out.len(),
        bytes,
        "quantize_activation_row: output has {} bytes, expected {bytes} for {} elements of {}",
        out.len(),
        x.len(),
        a.name()
    );
    match a {
        ActFormat::F32 => encode_f32(x, out),
        ActFormat::F16 => encode_f16(x, out),
        ActFormat::BF16 => encode_bf16(x, out),
        ActFormat::Q8_0 => with_blocks_mut(out, |y| quantize_row_q8_0(x, y)),
        ActFormat::Q8_1 => with_blocks_mut(out, |y| quantize_row_q8_1(x, y)),
        ActFormat::Q8K => with_blocks_mut(out, |y| quantize_row_q8_k(x, y)),
    }
}

/// One weight block of a 32-element block type as the integer values its `vec_dot` multiplies:
/// `(w, d, m)` with `w[j]` the signed value that ggml's generic dot product multiplies by
/// activation element `j` (`Q8_0`: `qs[j]`; `Q4_0`: nibble − 8; `Q5_0`: 5-bit value − 16;
/// `Q4_1`/`Q5_1`: the unsigned value), `d` the block scale and `m` the block minimum (`Q4_1`,
/// `Q5_1`; 0 otherwise), both widened exactly from f16. `bytes` holds exactly one block.
///
/// Panics for any other type or a wrong length.
pub fn block32_values(w: DType, bytes: &[u8]) -> ([i8; 32], f32, f32) {
    assert_eq!(
        Some(bytes.len() as u64),
        w.bytes_for(32),
        "block32_values: {} bytes is not one {w} block of 32",
        bytes.len()
    );
    let h = |i: usize| fp16_to_fp32(u16::from_le_bytes([bytes[i], bytes[i + 1]]));
    let mut v = [0i8; 32];
    let nib = |v: &mut [i8; 32], qs: &[u8], off: i8| {
        for j in 0..16 {
            v[j] = (qs[j] & 0x0F) as i8 - off;
            v[j + 16] = (qs[j] >> 4) as i8 - off;
        }
    };
    let five = |v: &mut [i8; 32], qh: &[u8], qs: &[u8], off: i32| {
        let mut q = [0u8; 16];
        q.copy_from_slice(qs);
        let vals = q5_values(&q, [qh[0], qh[1], qh[2], qh[3]]);
        for j in 0..32 {
            v[j] = (vals[j] - off) as i8;
        }
    };
    match w {
        DType::Q8_0 => {
            for j in 0..32 {
                v[j] = bytes[2 + j] as i8;
            }
            (v, h(0), 0.0)
        }
        DType::Q4_0 => {
            nib(&mut v, &bytes[2..18], 8);
            (v, h(0), 0.0)
        }
        DType::Q4_1 => {
            nib(&mut v, &bytes[4..20], 0);
            (v, h(0), h(2))
        }
        DType::Q5_0 => {
            five(&mut v, &bytes[2..6], &bytes[6..22], 16);
            (v, h(0), 0.0)
        }
        DType::Q5_1 => {
            five(&mut v, &bytes[4..8], &bytes[8..24], 0);
            (v, h(0), h(2))
        }
        other => panic!("block32_values: {other:?} is not a 32-element ggml block type"),
    }
}

/// The dot product of one weight row (`k` elements of type `w`, `w_row` holding exactly
/// `w.bytes_for(k)` bytes) with one activation row prepared by [`quantize_activation_row`]
/// (`act_row`, exactly [`activation_row_bytes`]`(w, k)` bytes). Any alignment.
///
/// The arithmetic is ggml's `ggml_vec_dot_{w}_{vec_dot_type}` (generic version).
/// Panics when a length does not match or `w` is `I32`.
pub fn vec_dot(w: DType, k: usize, w_row: &[u8], act_row: &[u8]) -> f32 {
    let wb = row_bytes(w, k);
    assert_eq!(
        w_row.len(),
        wb,
        "vec_dot: weight row has {} bytes, expected {wb} for {k} {w}",
        w_row.len()
    );
    let ab = activation_row_bytes(w, k);
    assert_eq!(
        act_row.len(),
        ab,
        "vec_dot: activation row has {} bytes, expected {ab}",
        act_row.len()
    );
    match w {
        DType::F32 => vec_dot_f32(&decode_f32(w_row), &decode_f32(act_row)),
        DType::F16 => vec_dot_f16(&decode_u16(w_row), &decode_u16(act_row)),
        DType::BF16 => vec_dot_bf16(&decode_u16(w_row), &decode_u16(act_row)),
        DType::Q4_0 => vec_dot_q4_0_q8_0(&view(w_row), &view(act_row)),
        DType::Q4_1 => vec_dot_q4_1_q8_1(&view(w_row), &view(act_row)),
        DType::Q5_0 => vec_dot_q5_0_q8_0(&view(w_row), &view(act_row)),
        DType::Q5_1 => vec_dot_q5_1_q8_1(&view(w_row), &view(act_row)),
        DType::Q8_0 => vec_dot_q8_0_q8_0(&view(w_row), &view(act_row)),
        DType::Q2K => vec_dot_q2_k_q8_k(&view(w_row), &view(act_row)),
        DType::Q3K => vec_dot_q3_k_q8_k(&view(w_row), &view(act_row)),
        DType::Q4K => vec_dot_q4_k_q8_k(&view(w_row), &view(act_row)),
        DType::Q5K => vec_dot_q5_k_q8_k(&view(w_row), &view(act_row)),
        DType::Q6K => vec_dot_q6_k_q8_k(&view(w_row), &view(act_row)),
        DType::I32 => panic!("vec_dot: i32 is not a matmul weight type"),
    }
}

/// Converts `dst.len()` elements stored as `w` in `src` (exactly `w.bytes_for(dst.len())`
/// bytes, little-endian, any alignment) to f32: ggml's `to_float` (`dequantize_row_*`, the
/// f16/bf16 conversions). `I32` values are converted with `as f32`.
///
/// Panics when `src.len()` does not match or `dst.len()` is not a whole number of blocks.
pub fn dequantize_row(w: DType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let b = row_bytes(w, n);
    assert_eq!(
        src.len(),
        b,
        "dequantize_row: source has {} bytes, expected {b} for {n} {w}",
        src.len()
    );
    match w {
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::I32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
        DType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = fp16_to_fp32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        DType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_fp32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        DType::Q4_0 => dequantize_row_q4_0(&view(src), dst),
        DType::Q4_1 => dequantize_row_q4_1(&view(src), dst),
        DType::Q5_0 => dequantize_row_q5_0(&view(src), dst),
        DType::Q5_1 => dequantize_row_q5_1(&view(src), dst),
        DType::Q8_0 => dequantize_row_q8_0(&view(src), dst),
        DType::Q2K => dequantize_row_q2_k(&view(src), dst),
        DType::Q3K => dequantize_row_q3_k(&view(src), dst),
        DType::Q4K => dequantize_row_q4_k(&view(src), dst),
        DType::Q5K => dequantize_row_q5_k(&view(src), dst),
        DType::Q6K => dequantize_row_q6_k(&view(src), dst),
    }
}

/// Stores `src` (`[n]` f32) as type `w` in `dst` (exactly `w.bytes_for(n)` bytes, any
/// alignment): the planner's packer. Quantized types use ggml's reference quantizers
/// (`quantize_row_*_ref`, bit-exact with ggml and gguf-py), `F16`/`BF16` round to nearest even
/// as `GGML_FP32_TO_FP16` / `GGML_FP32_TO_BF16` do, `F32` copies.
///
/// Panics for `I32` or when a length does not match.
pub fn quantize_row(w: DType, src: &[f32], dst: &mut [u8]) {
    let n = src.len();
    let b = row_bytes(w, n);
    assert_eq!(
        dst.len(),
        b,
        "quantize_row: destination has {} bytes, expected {b} for {n} {w}",
        dst.len()
    );
    match w {
        DType::F32 => encode_f32(src, dst),
        DType::F16 => encode_f16(src, dst),
        DType::BF16 => encode_bf16(src, dst),
        DType::Q4_0 => with_blocks_mut(dst, |y| quantize_row_q4_0(src, y)),
        DType::Q4_1 => with_blocks_mut(dst, |y| quantize_row_q4_1(src, y)),
        DType::Q5_0 => with_blocks_mut(dst, |y| quantize_row_q5_0(src, y)),
        DType::Q5_1 => with_blocks_mut(dst, |y| quantize_row_q5_1(src, y)),
        DType::Q8_0 => with_blocks_mut(dst, |y| quantize_row_q8_0(src, y)),
        DType::Q2K => with_blocks_mut(dst, |y| quantize_row_q2_k(src, y)),
        DType::Q3K => with_blocks_mut(dst, |y| quantize_row_q3_k(src, y)),
        DType::Q4K => with_blocks_mut(dst, |y| quantize_row_q4_k(src, y)),
        DType::Q5K => with_blocks_mut(dst, |y| quantize_row_q5_k(src, y)),
        DType::Q6K => with_blocks_mut(dst, |y| quantize_row_q6_k(src, y)),
        DType::I32 => panic!("quantize_row: cannot store f32 values as i32"),
    }
}

/// Bytes of `n` elements of `w`; panics when `n` is not a whole number of blocks.
fn row_bytes(w: DType, n: usize) -> usize {
    match w.bytes_for(n as u64) {
        Some(b) => b as usize,
        None => panic!(
            "{n} elements are not a whole number of {w} blocks of {}",
            w.block_size()
        ),
    }
}

/// Blocks of `bytes`, borrowed when aligned and copied otherwise. The caller has checked the
/// length, so the `None` arm is unreachable in practice.
fn view<B: GgmlBlock>(bytes: &[u8]) -> Cow<'_, [B]> {
    match B::cow_from_bytes(bytes) {
        Some(c) => c,
        None => panic!(
            "{} bytes are not a whole number of {} blocks",
            bytes.len(),
            B::NAME
        ),
    }
}

/// Runs `f` on `out` viewed as blocks; when `out` is misaligned, on a copy written back after.
fn with_blocks_mut<B: GgmlBlock>(out: &mut [u8], f: impl FnOnce(&mut [B])) {
    assert!(
        out.len().is_multiple_of(B::TYPE_SIZE),
        "{} bytes are not a whole number of {} blocks",
        out.len(),
        B::NAME
    );
    if let Some(blocks) = B::slice_from_bytes_mut(out) {
        f(blocks);
        return;
    }
    let mut tmp = vec![B::zeroed(); out.len() / B::TYPE_SIZE];
    f(&mut tmp);
    out.copy_from_slice(B::slice_as_bytes(&tmp));
}

fn encode_f32(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

fn encode_f16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&fp32_to_fp16(*v).to_le_bytes());
    }
}

fn encode_bf16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&fp32_to_bf16(*v).to_le_bytes());
    }
}

fn decode_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn decode_u16(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// f16 / bf16
// ---------------------------------------------------------------------------------------------

/// `GGML_FP32_TO_FP16`: IEEE half bits, round to nearest even, overflow to ±inf; NaN becomes
/// `sign | 0x7E00` (ggml `ggml_compute_fp32_to_fp16`).
pub fn fp32_to_fp16(x: f32) -> u16 {
    if x.is_nan() {
        return ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7E00;
    }
    half::f16::from_f32(x).to_bits()
}

/// `GGML_FP16_TO_FP32`: exact widening of half bits.
pub fn fp16_to_fp32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// `GGML_FP32_TO_BF16` (ggml `ggml_compute_fp32_to_bf16`, gguf-py `__quantize_bf16_array`):
/// the high 16 bits rounded to nearest even; a NaN keeps its high bits with the quiet bit
/// (0x40) forced on.
pub fn fp32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// `GGML_BF16_TO_FP32`: exact widening of bf16 bits.
pub fn bf16_to_fp32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the quantizers (ggml-quants.c)
// ---------------------------------------------------------------------------------------------

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this are all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// C's `MAX(a, b)` macro (`a > b ? a : b`), kept for its NaN behaviour.
#[inline]
fn cmax<T: PartialOrd>(a: T, b: T) -> T {
    if a > b {
        a
    } else {
        b
    }
}

/// C's `MIN(a, b)` macro (`a < b ? a : b`).
#[inline]
fn cmin<T: PartialOrd>(a: T, b: T) -> T {
    if a < b {
        a
    } else {
        b
    }
}

/// ggml `nearest_int`: round to nearest, ties to even, by adding 1.5·2²³ (valid for
/// `|fval| <= 4194303`).
#[inline]
fn nearest_int(fval: f32) -> i32 {
    debug_assert!(fval.abs() <= 4194303.0 || !fval.is_finite());
    let val = fval + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// ggml `make_qx_quants` with `qw = NULL`: symmetric quantization of `x` to `L[i] - nmax`,
/// `L[i]` in `0..2·nmax`, searching 18 scales around `-nmax/max` for the least weighted
/// squared error (weights chosen by `rmse_type`). Returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], rmse_type: i32) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for i in 0..n {
            let l = nearest_int(iscale * x[i]);
            l_out[i] = (nmax + cmax(-nmax, cmin(nmax - 1, l))) as i8;
        }
        return 1.0 / iscale;
    }
    let mut rmse_type = rmse_type;
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let weight = |v: f32| -> f32 {
        match rmse_type {
            1 => v * v,
            2 => 1.0,
            3 => v.abs(),
            _ => v.abs().sqrt(),
        }
    };
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let mut l = nearest_int(iscale * x[i]);
        l = cmax(-nmax, cmin(nmax - 1, l));
        l_out[i] = (l + nmax) as i8;
        let w = weight(x[i]);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = cmax(-nmax, cmin(nmax - 1, nearest_int(iscale * x[i])));
            let w = weight(x[i]);
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + cmax(-nmax, cmin(nmax - 1, l))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml `make_q3_quants`: symmetric quantization to `L[i] - nmax` refined by coordinate
/// descent on the `x²`-weighted error (when `do_rmse`). Returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        for i in 0..n {
            let l = cmax(-nmax, cmin(nmax - 1, nearest_int(iscale * x[i])));
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = cmax(-nmax, cmin(nmax - 1, nearest_int(x[i] * sl2 / slx)));
                    if new_l != l_out[i] as i32 {
                        let nf = new_l as f32;
                        slx += w * x[i] * nf;
                        sl2 += w * nf * nf;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in l_out[..n].iter_mut() {
            *l += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        let l = cmax(-nmax, cmin(nmax - 1, nearest_int(iscale * x[i])));
        l_out[i] = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// ggml `make_qkx2_quants`: asymmetric quantization `x ≈ scale·L - min` with `L` in
/// `0..=nmax`, trying `nstep + 1` scales `(rmin + rdelta·is + nmax)/(max - min)` and keeping
/// the one with the least weighted error (absolute if `use_mad`, squared otherwise).
/// Returns `(scale, min)` where `min >= 0` is subtracted (ggml's `the_min`).
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = cmax(0, cmin(nmax, l)) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0f32;
        let mut sum_l2 = 0f32;
        let mut sum_xl = 0f32;
        for i in 0..n {
            let l = cmax(0, cmin(nmax, nearest_int(iscale * (x[i] - min))));
            l_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml `get_scale_min_k4`: the 6-bit scale and min of group `j` (0..8) of a Q4_K/Q5_K block.
#[inline]
fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 16 six-bit scales of a Q3_K block (0..64, subtract 32 for the signed value), unpacked as
/// `dequantize_row_q3_K` does with its `kmask` words.
fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let tmp = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let words = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (w, o) in words.iter().zip(out.chunks_exact_mut(4)) {
        for (b, v) in w.to_le_bytes().iter().zip(o.iter_mut()) {
            *v = *b as i8;
        }
    }
    out
}

fn check_len(what: &str, x: usize, blocks: usize, qk: usize) {
    assert_eq!(
        x,
        blocks * qk,
        "{what}: {x} elements for {blocks} blocks of {qk}"
    );
}

// ---------------------------------------------------------------------------------------------
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q8_1
// ---------------------------------------------------------------------------------------------

/// ggml `quantize_row_q4_0_ref`: `d = max/-8` where `max` is the signed value of largest
/// magnitude, `q = min(15, trunc(x/d + 8.5))`. `x`: `[y.len()·32]`.
pub fn quantize_row_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    check_len("quantize_row_q4_0", x.len(), y.len(), QK4_0);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK4_0)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        for j in 0..QK4_0 / 2 {
            let x0 = x[j] * id;
            let x1 = x[QK4_0 / 2 + j] * id;
            let xi0 = cmin(15, (x0 + 8.5) as i8) as u8;
            let xi1 = cmin(15, (x1 + 8.5) as i8) as u8;
            b.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

/// ggml `quantize_row_q4_1_ref`: `d = (max - min)/15`, `m = min`,
/// `q = min(15, trunc((x - min)/d + 0.5))`. `x`: `[y.len()·32]`.
pub fn quantize_row_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    check_len("quantize_row_q4_1", x.len(), y.len(), QK4_1);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK4_1)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        b.m = fp32_to_fp16(min);
        for j in 0..QK4_1 / 2 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[QK4_1 / 2 + j] - min) * id;
            let xi0 = cmin(15, (x0 + 0.5) as i8) as u8;
            let xi1 = cmin(15, (x1 + 0.5) as i8) as u8;
            b.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

/// The `min`/`max` scan of `quantize_row_q4_1_ref` / `q5_1_ref` (starting from ±`FLT_MAX`).
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// ggml `quantize_row_q5_0_ref`: `d = max/-16`, `q = min(31, trunc(x/d + 16.5))`, fifth bits
/// in `qh`. `x`: `[y.len()·32]`.
pub fn quantize_row_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    check_len("quantize_row_q5_0", x.len(), y.len(), QK5_0);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK5_0)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            let x0 = x[j] * id;
            let x1 = x[QK5_0 / 2 + j] * id;
            let xi0 = cmin(31, (x0 + 16.5) as i8) as u8;
            let xi1 = cmin(31, (x1 + 16.5) as i8) as u8;
            b.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_0 / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// ggml `quantize_row_q5_1_ref`: `d = (max - min)/31`, `m = min`,
/// `q = trunc((x - min)/d + 0.5)`. `x`: `[y.len()·32]`.
pub fn quantize_row_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    check_len("quantize_row_q5_1", x.len(), y.len(), QK5_1);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK5_1)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        b.m = fp32_to_fp16(min);
        let mut qh = 0u32;
        for j in 0..QK5_1 / 2 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[QK5_1 / 2 + j] - min) * id;
            let xi0 = (x0 + 0.5) as u8;
            let xi1 = (x1 + 0.5) as u8;
            b.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_1 / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// ggml `quantize_row_q8_0_ref`: `d = absmax/127`, `q = round(x/d)` (half away from zero).
/// `x`: `[y.len()·32]`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    check_len("quantize_row_q8_0", x.len(), y.len(), QK8_0);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK8_0)) {
        let amax = x.iter().fold(0f32, |a, v| cmax(a, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
    }
}

/// The activation quantizer of [`edge_schema::plan::PackLayout::Interleaved8x4A7`] weights:
/// ggml's `quantize_row_q8_0_ref` with 7-bit values — `d = amax / 63`, `id = 1/d` (0 for
/// `d = 0`), the block scale `fp16(d)`, each quant `round(x·id)` (half away from zero)
/// clamped to −63..=63 (the clamp only acts where `d` is subnormal and `1/d` overflows, or on
/// ±∞; NaN gives 0 as in [`quantize_row_q8_0`]). `x`: `[y.len()·32]`; the blocks are ggml's
/// `block_q8_0`, multiplied by [`vec_dot_q8_0_q8_0`] as 8-bit ones are. Relative rounding error
/// per value up to `1/126` of the block's `amax` (8-bit: `1/254`).
pub fn quantize_row_q8_0_a7(x: &[f32], y: &mut [BlockQ8_0]) {
    check_len("quantize_row_q8_0_a7", x.len(), y.len(), QK8_0);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK8_0)) {
        let amax = x.iter().fold(0f32, |a, v| cmax(a, v.abs()));
        let d = amax / 63.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = ((v * id).round() as i8).clamp(-A7_MAX, A7_MAX);
        }
    }
}

/// Largest magnitude of a 7-bit activation quant ([`quantize_row_q8_0_a7`]).
pub const A7_MAX: i8 = 63;

/// One activation row `x` (`[k]`, `k` a multiple of 32) quantized for weights `w` into `out`
/// (`k / 32` `block_q8_0`s for the 7-bit activations of
/// [`edge_schema::plan::PackLayout::Interleaved8x4A7`] weights, [`quantize_activation_row`]
/// for every other layout). Panics on a length mismatch.
pub fn quantize_activation_row_for(w: &WeightRef<'_>, x: &[f32], out: &mut [u8]) {
    if w.layout != PackLayout::Interleaved8x4A7 {
        return quantize_activation_row(w.dtype, x, out);
    }
    let bytes = activation_row_bytes(DType::Q8_0, x.len());
    assert_eq!(
        out.len(),
        bytes,
        "quantize_activation_row_for: output has {} bytes, expected {bytes} for {} elements of \
         7-bit q8_0",
        out.len(),
        x.len()
    );
    with_blocks_mut(out, |y| quantize_row_q8_0_a7(x, y))
}

/// ggml `quantize_row_q8_1_ref`: as Q8_0, plus `s = d·Σq` (f16; `d` unrounded f32).
/// `x`: `[y.len()·32]`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    check_len("quantize_row_q8_1", x.len(), y.len(), QK8_1);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK8_1)) {
        let amax = x.iter().fold(0f32, |a, v| cmax(a, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.s = fp32_to_fp16(sum as f32 * d);
    }
}

/// ggml `dequantize_row_q4_0`: `y = (q - 8)·d`. `y`: `[x.len()·32]`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    check_len("dequantize_row_q4_0", y.len(), x.len(), QK4_0);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = fp16_to_fp32(b.d);
        for j in 0..QK4_0 / 2 {
            y[j] = ((b.qs[j] & 0x0F) as i32 - 8) as f32 * d;
            y[j + QK4_0 / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// ggml `dequantize_row_q4_1`: `y = q·d + m`. `y`: `[x.len()·32]`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    check_len("dequantize_row_q4_1", y.len(), x.len(), QK4_1);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let d = fp16_to_fp32(b.d);
        let m = fp16_to_fp32(b.m);
        for j in 0..QK4_1 / 2 {
            y[j] = (b.qs[j] & 0x0F) as f32 * d + m;
            y[j + QK4_1 / 2] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// The 5-bit quants of a Q5_0/Q5_1 block, element order.
fn q5_values(qs: &[u8; 16], qh: [u8; 4]) -> [i32; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut out = [0i32; 32];
    for j in 0..16 {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        out[j] = ((qs[j] & 0x0F) | xh0) as i32;
        out[j + 16] = ((qs[j] >> 4) | xh1) as i32;
    }
    out
}

/// ggml `dequantize_row_q5_0`: `y = (q - 16)·d`. `y`: `[x.len()·32]`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    check_len("dequantize_row_q5_0", y.len(), x.len(), QK5_0);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = fp16_to_fp32(b.d);
        for (o, q) in y.iter_mut().zip(q5_values(&b.qs, b.qh)) {
            *o = (q - 16) as f32 * d;
        }
    }
}

/// ggml `dequantize_row_q5_1`: `y = q·d + m`. `y`: `[x.len()·32]`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    check_len("dequantize_row_q5_1", y.len(), x.len(), QK5_1);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let d = fp16_to_fp32(b.d);
        let m = fp16_to_fp32(b.m);
        for (o, q) in y.iter_mut().zip(q5_values(&b.qs, b.qh)) {
            *o = q as f32 * d + m;
        }
    }
}

/// ggml `dequantize_row_q8_0`: `y = q·d`. `y`: `[x.len()·32]`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    check_len("dequantize_row_q8_0", y.len(), x.len(), QK8_0);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = fp16_to_fp32(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Dequantizes a Q8_1 activation row (`y = q·d`; ggml has no `dequantize_row_q8_1`, this is
/// its `to_float` twin for tests). `y`: `[x.len()·32]`.
pub fn dequantize_row_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    check_len("dequantize_row_q8_1", y.len(), x.len(), QK8_1);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK8_1)) {
        let d = fp16_to_fp32(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// K-quants
// ---------------------------------------------------------------------------------------------

/// ggml `quantize_row_q8_K_ref`: `d = max/-127` (f32) where `max` is the signed value of
/// largest magnitude, `q = min(127, nearest_int(-127·x/max))`, `bsums` per 16.
/// `x`: `[y.len()·256]`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    check_len("quantize_row_q8_K", x.len(), y.len(), QK_K);
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; QK_K];
            b.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = cmin(127, nearest_int(iscale * v)) as i8;
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i32).sum::<i32>() as i16;
        }
        b.d = 1.0 / iscale;
    }
}

/// ggml `dequantize_row_q8_K`: `y = d·q`. `y`: `[x.len()·256]`.
pub fn dequantize_row_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    check_len("dequantize_row_q8_K", y.len(), x.len(), QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}

/// Packs 256 two-bit values as `block_q2_K.qs` / `block_q3_K.qs` do: byte `32·h + l` of the
/// output holds elements `128h + l + 32s` in bits `2s..2s+2`.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// ggml `quantize_row_q2_K_ref`: per group of 16 `make_qkx2_quants(nmax 3, |x| weights, MAD)`,
/// 4-bit scales and mins under f16 `d`, `dmin`. `x`: `[y.len()·256]`.
pub fn quantize_row_q2_k(x: &[f32], y: &mut [BlockQ2K]) {
    check_len("quantize_row_q2_K", x.len(), y.len(), QK_K);
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut max_scale = 0f32;
        let mut max_min = 0f32;
        for j in 0..QK_K / 16 {
            let xg = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xg) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(
                3,
                xg,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut l_aux,
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = fp32_to_fp16(max_scale / Q4SCALE);
        } else {
            b.scales = [0; QK_K / 16];
            b.d = fp32_to_fp16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                let lm = nearest_int(iscale * mins[j]);
                b.scales[j] |= (lm << 4) as u8;
            }
            b.dmin = fp32_to_fp16(max_min / Q4SCALE);
        } else {
            b.dmin = fp32_to_fp16(0.0);
        }
        for j in 0..QK_K / 16 {
            let d = fp16_to_fp32(b.d) * (b.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = fp16_to_fp32(b.dmin) * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / d);
                l[16 * j + ii] = cmax(0, cmin(3, q)) as u8;
            }
        }
        pack_2bit(&l, &mut b.qs);
    }
}

/// ggml `dequantize_row_q2_K`: `y = (d·sc)·q - dmin·m`. `y`: `[x.len()·256]`.
pub fn dequantize_row_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    check_len("dequantize_row_q2_K", y.len(), x.len(), QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        let min = fp16_to_fp32(b.dmin);
        let mut out = y.iter_mut();
        let mut is = 0;
        for half in 0..2 {
            let q = &b.qs[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let sc = b.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &qb in &q[16 * part..16 * part + 16] {
                        if let Some(o) = out.next() {
                            *o = dl * ((qb >> shift) & 3) as f32 - ml;
                        }
                    }
                }
            }
        }
    }
}

/// ggml `quantize_row_q3_K_ref`: per group of 16 `make_q3_quants(nmax 4, rmse)`, 6-bit signed
/// scales under f16 `d`, 3-bit quants (high bit in `hmask`). `x`: `[y.len()·256]`.
pub fn quantize_row_q3_k(x: &[f32], y: &mut [BlockQ3K]) {
    check_len("quantize_row_q3_K", x.len(), y.len(), QK_K);
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut max_scale = 0f32;
        let mut amax = 0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(
                4,
                &x[16 * j..16 * j + 16],
                &mut l[16 * j..16 * j + 16],
                true,
            );
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..QK_K / 16 {
                let mut ls = nearest_int(iscale * scales[j]) as i8;
                ls = cmax(-32, cmin(31, ls)) + 32;
                if j < 8 {
                    b.scales[j] = (ls & 0xF) as u8;
                } else {
                    b.scales[j - 8] |= ((ls & 0xF) << 4) as u8;
                }
                ls >>= 4;
                b.scales[j % 4 + 8] |= (ls << (2 * (j / 4))) as u8;
            }
            b.d = fp32_to_fp16(1.0 / iscale);
        } else {
            b.d = fp32_to_fp16(0.0);
        }
        for j in 0..QK_K / 16 {
            let lo = if j < 8 {
                b.scales[j] & 0xF
            } else {
                b.scales[j - 8] >> 4
            };
            let sc = (lo | (((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32;
            let d = fp16_to_fp32(b.d) * sc as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d);
                l[16 * j + ii] = (cmax(-4, cmin(3, q)) + 4) as i8;
            }
        }
        b.hmask = [0; QK_K / 8];
        let mut m = 0;
        let mut hm = 1u8;
        for lj in l.iter_mut() {
            if *lj > 3 {
                b.hmask[m] |= hm;
                *lj -= 4;
            }
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm <<= 1;
            }
        }
        let mut lu = [0u8; QK_K];
        for (u, &v) in lu.iter_mut().zip(&l) {
            *u = v as u8;
        }
        pack_2bit(&lu, &mut b.qs);
    }
}

/// ggml `dequantize_row_q3_K`: `y = (d·(sc - 32))·(q - 4·!hbit)`. `y`: `[x.len()·256]`.
pub fn dequantize_row_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    check_len("dequantize_row_q3_K", y.len(), x.len(), QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = fp16_to_fp32(b.d);
        let scales = q3k_scales(&b.scales);
        let mut out = y.iter_mut();
        let mut is = 0;
        let mut m = 1u8;
        for half in 0..2 {
            let q = &b.qs[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let dl = d_all * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for l in 16 * part..16 * part + 16 {
                        let v =
                            ((q[l] >> shift) & 3) as i32 - if b.hmask[l] & m != 0 { 0 } else { 4 };
                        if let Some(o) = out.next() {
                            *o = dl * v as f32;
                        }
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// Packs 8 six-bit scales and mins the way `quantize_row_q4_K_ref` / `q5_K_ref` do.
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], out: &mut [u8; 12]) {
    for j in 0..8 {
        if j < 4 {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            out[j - 4] |= (ls[j] >> 4) << 6;
            out[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// The shared first half of `quantize_row_q4_K_ref` / `q5_K_ref`: per group of 32,
/// `make_qkx2_quants` with weights `sqrt(mean(x²)) + |x|`; then 6-bit scales and mins under f16
/// `d`, `dmin`, and the final quants `L` (0..=nmax) recomputed from the rounded scales.
fn quantize_k4_scales(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    d: &mut u16,
    dmin: &mut u16,
    packed: &mut [u8; 12],
    l: &mut [u8; QK_K],
) {
    let mut l_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..QK_K / 32 {
        let xg = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xg {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xg) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xg,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut l_aux,
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        ls[j] = cmin(63, nearest_int(inv_scale * scales[j]) as u8);
        lm[j] = cmin(63, nearest_int(inv_min * mins[j]) as u8);
    }
    *packed = [0; 12];
    pack_scale_min_k4(&ls, &lm, packed);
    *d = fp32_to_fp16(max_scale / 63.0);
    *dmin = fp32_to_fp16(max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, packed);
        let dd = fp16_to_fp32(*d) * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = fp16_to_fp32(*dmin) * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dd);
            l[32 * j + ii] = cmax(0, cmin(nmax, q)) as u8;
        }
    }
}

/// ggml `quantize_row_q4_K_ref`: 8 groups of 32, `make_qkx2_quants(nmax 15, rmin -1, 20 steps)`.
/// `x`: `[y.len()·256]`.
pub fn quantize_row_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    check_len("quantize_row_q4_K", x.len(), y.len(), QK_K);
    let mut l = [0u8; QK_K];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        quantize_k4_scales(
            x,
            15,
            -1.0,
            20,
            &mut b.d,
            &mut b.dmin,
            &mut b.scales,
            &mut l,
        );
        for (h, q) in b.qs.chunks_exact_mut(32).enumerate() {
            for i in 0..32 {
                q[i] = l[64 * h + i] | (l[64 * h + i + 32] << 4);
            }
        }
    }
}

/// ggml `dequantize_row_q4_K`: `y = (d·sc)·q - dmin·m`. `y`: `[x.len()·256]`.
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    check_len("dequantize_row_q4_K", y.len(), x.len(), QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        let min = fp16_to_fp32(b.dmin);
        for (h, (q, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * h, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * h + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// ggml `quantize_row_q5_K_ref`: 8 groups of 32, `make_qkx2_quants(nmax 31, rmin -0.5,
/// 15 steps)`; fifth bits in `qh`. `x`: `[y.len()·256]`.
pub fn quantize_row_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    check_len("quantize_row_q5_K", x.len(), y.len(), QK_K);
    let mut l = [0u8; QK_K];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        quantize_k4_scales(
            x,
            31,
            -0.5,
            15,
            &mut b.d,
            &mut b.dmin,
            &mut b.scales,
            &mut l,
        );
        b.qh = [0; QK_K / 8];
        let (mut m1, mut m2) = (1u8, 2u8);
        for (h, ql) in b.qs.chunks_exact_mut(32).enumerate() {
            for j in 0..32 {
                let mut l1 = l[64 * h + j];
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                let mut l2 = l[64 * h + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

/// ggml `dequantize_row_q5_K`: `y = (d·sc)·q - dmin·m` with 5-bit `q`. `y`: `[x.len()·256]`.
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    check_len("dequantize_row_q5_K", y.len(), x.len(), QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        let min = fp16_to_fp32(b.dmin);
        let (mut u1, mut u2) = (1u8, 2u8);
        for (h, (ql, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * h, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * h + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                let hi1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let hi2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0xF) + hi1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) + hi2) as f32 - m2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

/// ggml `quantize_row_q6_K_ref`: per group of 16 `make_qx_quants(nmax 32, rmse_type 1)`,
/// signed 8-bit scales under f16 `d`, 6-bit quants. `x`: `[y.len()·256]`.
pub fn quantize_row_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    check_len("quantize_row_q6_K", x.len(), y.len(), QK_K);
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut max_scale = 0f32;
        let mut max_abs_scale = 0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                1,
            );
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = BlockQ6K::zeroed();
            b.d = fp32_to_fp16(0.0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = fp32_to_fp16(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            b.scales[ib] = cmin(127, nearest_int(iscale * scales[ib])) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = fp16_to_fp32(b.d) * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d);
                l[16 * j + ii] = (cmax(-32, cmin(31, q)) + 32) as i8;
            }
        }
        for h in 0..2 {
            let lb = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                let q1 = lb[i] as u8;
                let q2 = lb[i + 32] as u8;
                let q3 = lb[i + 64] as u8;
                let q4 = lb[i + 96] as u8;
                b.ql[64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                b.ql[64 * h + i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                b.qh[32 * h + i] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

/// The 256 signed 6-bit quants (`q - 32`) of a Q6_K block, element order.
fn q6k_values(b: &BlockQ6K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for h in 0..2 {
        let ql = &b.ql[64 * h..64 * h + 64];
        let qh = &b.qh[32 * h..32 * h + 32];
        let a = &mut a[128 * h..128 * h + 128];
        for l in 0..32 {
            a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    a
}

/// ggml `dequantize_row_q6_K`: `y = (d·sc)·(q - 32)`. `y`: `[x.len()·256]`.
pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    check_len("dequantize_row_q6_K", y.len(), x.len(), QK_K);
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        let q = q6k_values(b);
        for (i, (o, &q)) in y.iter_mut().zip(&q).enumerate() {
            *o = d * b.scales[i / 16] as f32 * q as f32;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dot products (ggml-cpu/quants.c `_generic`, ggml-cpu/vec.cpp)
// ---------------------------------------------------------------------------------------------

fn check_dot(what: &str, x: usize, y: usize) {
    assert_eq!(x, y, "{what}: {x} weight blocks but {y} activation blocks");
}

/// ggml `ggml_vec_dot_f32` (no SIMD): `Σ (f64)(x·y)` rounded to f32.
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    check_dot("vec_dot_f32", x.len(), y.len());
    let mut sum = 0f64;
    for (a, b) in x.iter().zip(y) {
        sum += (a * b) as f64;
    }
    sum as f32
}

/// ggml `ggml_vec_dot_f16` (no SIMD) over f16 bits: `Σ (f64)(x·y)` rounded to f32.
pub fn vec_dot_f16(x: &[u16], y: &[u16]) -> f32 {
    check_dot("vec_dot_f16", x.len(), y.len());
    let mut sum = 0f64;
    for (&a, &b) in x.iter().zip(y) {
        sum += (fp16_to_fp32(a) * fp16_to_fp32(b)) as f64;
    }
    sum as f32
}

/// ggml `ggml_vec_dot_bf16` (no SIMD) over bf16 bits: `Σ (f64)(x·y)` rounded to f32.
pub fn vec_dot_bf16(x: &[u16], y: &[u16]) -> f32 {
    check_dot("vec_dot_bf16", x.len(), y.len());
    let mut sum = 0f64;
    for (&a, &b) in x.iter().zip(y) {
        sum += (bf16_to_fp32(a) * bf16_to_fp32(b)) as f64;
    }
    sum as f32
}

/// ggml `ggml_vec_dot_q4_0_q8_0_generic`: `Σ_blocks sumi·dx·dy`.
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    check_dot("vec_dot_q4_0_q8_0", x.len(), y.len());
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..QK8_0 / 2 {
            s0 += ((a.qs[j] & 0x0F) as i32 - 8) * b.qs[j] as i32;
            s1 += ((a.qs[j] >> 4) as i32 - 8) * b.qs[j + QK8_0 / 2] as i32;
        }
        sumf += (s0 + s1) as f32 * fp16_to_fp32(a.d) * fp16_to_fp32(b.d);
    }
    sumf
}

/// ggml `ggml_vec_dot_q4_1_q8_1_generic`: `Σ_blocks (dx·dy)·sumi + mx·sy`.
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    check_dot("vec_dot_q4_1_q8_1", x.len(), y.len());
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..QK8_1 / 2 {
            s0 += (a.qs[j] & 0x0F) as i32 * b.qs[j] as i32;
            s1 += (a.qs[j] >> 4) as i32 * b.qs[j + QK8_1 / 2] as i32;
        }
        sumf += (fp16_to_fp32(a.d) * fp16_to_fp32(b.d)) * (s0 + s1) as f32
            + fp16_to_fp32(a.m) * fp16_to_fp32(b.s);
    }
    sumf
}

/// ggml `ggml_vec_dot_q5_0_q8_0_generic`'s `Σ_blocks (dx·dy)·sumi`, each block's term fused
/// into the running sum: `sumf = fma(sumi, dx·dy, sumf)` (one rounding per block where ggml's
/// generic C rounds twice; its AVX2 and NEON kernels fuse too). Same definition as
/// [`vec_dot_q8_0_q8_0`].
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    check_dot("vec_dot_q5_0_q8_0", x.len(), y.len());
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let q = q5_values(&a.qs, a.qh);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..QK8_0 / 2 {
            s0 += (q[j] - 16) * b.qs[j] as i32;
            s1 += (q[j + 16] - 16) * b.qs[j + QK8_0 / 2] as i32;
        }
        sumf = ((s0 + s1) as f32).mul_add(fp16_to_fp32(a.d) * fp16_to_fp32(b.d), sumf);
    }
    sumf
}

/// ggml `ggml_vec_dot_q5_1_q8_1_generic`: `Σ_blocks (dx·dy)·sumi + mx·sy`.
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    check_dot("vec_dot_q5_1_q8_1", x.len(), y.len());
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let q = q5_values(&a.qs, a.qh);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..QK8_1 / 2 {
            s0 += q[j] * b.qs[j] as i32;
            s1 += q[j + 16] * b.qs[j + QK8_1 / 2] as i32;
        }
        sumf += (fp16_to_fp32(a.d) * fp16_to_fp32(b.d)) * (s0 + s1) as f32
            + fp16_to_fp32(a.m) * fp16_to_fp32(b.s);
    }
    sumf
}

/// ggml `ggml_vec_dot_q8_0_q8_0_generic`'s `Σ_blocks sumi·(dx·dy)`, each block's term fused
/// into the running sum from 0: `sumf = fma(sumi, dx·dy, sumf)`, blocks in order. The integer
/// sum and its conversion are exact (|sumi| ≤ 32·128·127 < 2²⁴), so the rounding is that of
/// `dx·dy` and of one fused multiply-add per block, as every SIMD twin computes it (one
/// instruction, where ggml's generic C multiplies and adds separately; its AVX2 and NEON
/// kernels fuse too).
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    check_dot("vec_dot_q8_0_q8_0", x.len(), y.len());
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (&p, &q) in a.qs.iter().zip(&b.qs) {
            sumi += p as i32 * q as i32;
        }
        sumf = (sumi as f32).mul_add(fp16_to_fp32(a.d) * fp16_to_fp32(b.d), sumf);
    }
    sumf
}

/// ggml `ggml_vec_dot_q2_K_q8_K_generic`: per block `dall·Σ sc·(q·q8) - dmin·Σ m·bsum`.
pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    check_dot("vec_dot_q2_K_q8_K", x.len(), y.len());
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut summs = 0i32;
        for j in 0..16 {
            summs += b.bsums[j] as i32 * (a.scales[j] >> 4) as i32;
        }
        let dall = b.d * fp16_to_fp32(a.d);
        let dmin = b.d * fp16_to_fp32(a.dmin);
        let mut isum = 0i32;
        let mut is = 0;
        let mut q8 = b.qs.chunks_exact(16);
        for half in 0..2 {
            let q2 = &a.qs[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let d = (a.scales[is] & 0xF) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    if let Some(q8) = q8.next() {
                        for (l, &v) in q8.iter().enumerate() {
                            isuml += v as i32 * ((q2[16 * part + l] >> shift) & 3) as i32;
                        }
                    }
                    isum += d * isuml;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Accumulates `aux32[l] += scale·q8[l]·a[l]` over 16-element groups, 8 lanes, as the K-quant
/// generic dot products do; `scale_of(g)` is the scale of 16-element group `g`.
fn accumulate_k_lanes(
    q8: &[i8; QK_K],
    a: &[i8; QK_K],
    scale_of: impl Fn(usize) -> i32,
) -> [i32; 8] {
    let mut aux32 = [0i32; 8];
    for (i, (q, v)) in q8.chunks_exact(8).zip(a.chunks_exact(8)).enumerate() {
        let scale = scale_of(i / 2);
        for l in 0..8 {
            aux32[l] += scale * (q[l] as i32 * v[l] as i32);
        }
    }
    aux32
}

/// ggml `ggml_vec_dot_q3_K_q8_K_generic` (8 f32 lane sums across blocks, summed at the end).
pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    check_dot("vec_dot_q3_K_q8_K", x.len(), y.len());
    let mut sums = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        let mut aux8 = [0i8; QK_K];
        let mut m = 1u8;
        let mut k = 0;
        for half in 0..2 {
            let q3 = &a.qs[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for l in 0..32 {
                    aux8[k + l] =
                        ((q3[l] >> shift) & 3) as i8 - if a.hmask[l] & m != 0 { 0 } else { 4 };
                }
                k += 32;
                m <<= 1;
            }
        }
        let scales = q3k_scales(&a.scales);
        let aux32 = accumulate_k_lanes(&b.qs, &aux8, |g| scales[g] as i32 - 32);
        let d = fp16_to_fp32(a.d) * b.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// The shared body of the Q4_K / Q5_K generic dot products given the 256 unsigned quants.
fn dot_k4(
    aux8: &[i8; QK_K],
    scales: &[u8; 12],
    d: u16,
    dmin: u16,
    b: &BlockQ8K,
    sums: &mut [f32; 8],
    sumf: &mut f32,
) {
    let mut sc = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        (sc[j], mins[j]) = get_scale_min_k4(j, scales);
    }
    let mut sumi = 0i32;
    for j in 0..QK_K / 16 {
        sumi += b.bsums[j] as i32 * mins[j / 2] as i32;
    }
    let aux32 = accumulate_k_lanes(&b.qs, aux8, |g| sc[g / 2] as i32);
    let d = fp16_to_fp32(d) * b.d;
    for l in 0..8 {
        sums[l] += d * aux32[l] as f32;
    }
    let dmin = fp16_to_fp32(dmin) * b.d;
    *sumf -= dmin * sumi as f32;
}

/// ggml `ggml_vec_dot_q4_K_q8_K_generic`.
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    check_dot("vec_dot_q4_K_q8_K", x.len(), y.len());
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut aux8 = [0i8; QK_K];
        for (h, q4) in a.qs.chunks_exact(32).enumerate() {
            for l in 0..32 {
                aux8[64 * h + l] = (q4[l] & 0xF) as i8;
                aux8[64 * h + l + 32] = (q4[l] >> 4) as i8;
            }
        }
        dot_k4(&aux8, &a.scales, a.d, a.dmin, b, &mut sums, &mut sumf);
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// ggml `ggml_vec_dot_q5_K_q8_K_generic`.
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    check_dot("vec_dot_q5_K_q8_K", x.len(), y.len());
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut aux8 = [0i8; QK_K];
        let mut m = 1u8;
        for (h, q4) in a.qs.chunks_exact(32).enumerate() {
            for l in 0..32 {
                aux8[64 * h + l] = (q4[l] & 0xF) as i8 + if a.qh[l] & m != 0 { 16 } else { 0 };
            }
            m <<= 1;
            for l in 0..32 {
                aux8[64 * h + l + 32] = (q4[l] >> 4) as i8 + if a.qh[l] & m != 0 { 16 } else { 0 };
            }
            m <<= 1;
        }
        dot_k4(&aux8, &a.scales, a.d, a.dmin, b, &mut sums, &mut sumf);
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// ggml `ggml_vec_dot_q6_K_q8_K_generic`.
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    check_dot("vec_dot_q6_K_q8_K", x.len(), y.len());
    let mut sums = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        let aux8 = q6k_values(a);
        let aux32 = accumulate_k_lanes(&b.qs, &aux8, |g| a.scales[g] as i32);
        let d = fp16_to_fp32(a.d) * b.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml `tests/test-quantize-fns.cpp` thresholds (same commit as the port).
    const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;
    const MAX_QUANTIZATION_TOTAL_ERROR_2BITS: f32 = 0.0075;
    const MAX_QUANTIZATION_TOTAL_ERROR_3BITS: f32 = 0.0040;
    const MAX_DOT_PRODUCT_ERROR: f32 = 0.02;
    const MAX_DOT_PRODUCT_ERROR_LOWBIT: f32 = 0.04;

    const WEIGHT_TYPES: [DType; 13] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];

    /// ggml `generate_data`: `0.1 + 2·cos(i + offset)`.
    fn generate_data(offset: f32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
            .collect()
    }

    /// ggml `array_rmse` (which is `sqrt(Σ diff²) / n`, not a true RMSE).
    fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
        let sum: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
            .sum();
        (sum.sqrt() as f32) / a.len() as f32
    }

    /// Deterministic pseudo-random normal-ish values (xorshift, sum of uniforms).
    fn random_data(seed: u64, n: usize, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        };
        (0..n)
            .map(|_| (next() + next() + next() - 1.5) * 2.0 * scale)
            .collect()
    }

    fn roundtrip(w: DType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let mut q = vec![0u8; w.bytes_for(x.len() as u64).unwrap() as usize];
        quantize_row(w, x, &mut q);
        let mut y = vec![0f32; x.len()];
        dequantize_row(w, &q, &mut y);
        (q, y)
    }

    fn dequant_act(w: DType, act: &[u8], k: usize) -> Vec<f32> {
        let mut y = vec![0f32; k];
        match activation_type(w) {
            ActFormat::Q8_1 => dequantize_row_q8_1(&view(act), &mut y),
            ActFormat::Q8K => dequantize_row_q8_k(&view(act), &mut y),
            ActFormat::Q8_0 => dequantize_row(DType::Q8_0, act, &mut y),
            ActFormat::F32 => dequantize_row(DType::F32, act, &mut y),
            ActFormat::F16 => dequantize_row(DType::F16, act, &mut y),
            ActFormat::BF16 => dequantize_row(DType::BF16, act, &mut y),
        }
        y
    }

    /// ggml `total_quantization_error` over `32·128` values of `generate_data(0)`, against the
    /// per-type thresholds of test-quantize-fns.
    #[test]
    fn total_quantization_error_within_ggml_thresholds() {
        let x = generate_data(0.0, 32 * 128);
        for w in WEIGHT_TYPES {
            let (_, y) = roundtrip(w, &x);
            let err = array_rmse(&x, &y);
            let max = match w {
                DType::Q2K => MAX_QUANTIZATION_TOTAL_ERROR_2BITS,
                DType::Q3K => MAX_QUANTIZATION_TOTAL_ERROR_3BITS,
                _ => MAX_QUANTIZATION_TOTAL_ERROR,
            };
            assert!(err < max, "{w}: total quantization error {err} >= {max}");
        }
    }

    /// Relative RMS round-trip error on Gaussian-like data: more bits, less error, and each
    /// K-quant at most its legacy sibling of equal bits (ggml's reason for the K-quants).
    #[test]
    fn relative_error_ordering() {
        let x = random_data(7, 256 * 16, 1.0);
        let rel = |w: DType| {
            let (_, y) = roundtrip(w, &x);
            let num: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                .sum();
            let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
            (num / den).sqrt()
        };
        let e: Vec<(DType, f64)> = WEIGHT_TYPES.iter().map(|&w| (w, rel(w))).collect();
        let get = |w: DType| e.iter().find(|(d, _)| *d == w).map(|(_, v)| *v).unwrap();
        assert!(get(DType::Q2K) > get(DType::Q3K), "{e:?}");
        assert!(get(DType::Q3K) > get(DType::Q4K), "{e:?}");
        assert!(get(DType::Q4K) > get(DType::Q5K), "{e:?}");
        assert!(get(DType::Q5K) > get(DType::Q6K), "{e:?}");
        assert!(get(DType::Q6K) > get(DType::Q8_0), "{e:?}");
        assert!(get(DType::Q4K) <= get(DType::Q4_1), "{e:?}");
        assert!(get(DType::Q5K) <= get(DType::Q5_1), "{e:?}");
        // 2^-(bits) scale: a 4-bit quantizer cannot do better than ~1/16 relative error on
        // Gaussian data, nor much worse than ~1/8.
        assert!((0.03..0.15).contains(&get(DType::Q4_0)), "{e:?}");
        assert!(
            get(DType::F16) < 1e-3 && get(DType::BF16) < 1e-2 && get(DType::F32) == 0.0,
            "{e:?}"
        );
    }

    /// Re-quantizing dequantized values reproduces the blocks exactly for the absmax-based
    /// formats (the scale is recovered exactly from the largest quant).
    #[test]
    fn requantize_is_stable_for_absmax_formats() {
        let x = random_data(11, 32 * 24, 3.0);
        for w in [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q5_0,
            DType::F16,
            DType::BF16,
        ] {
            let (q, y) = roundtrip(w, &x);
            let (q2, y2) = roundtrip(w, &y);
            assert_eq!(q, q2, "{w}");
            assert_eq!(y, y2, "{w}");
        }
        // The K-quants and min-based formats search their scales; re-quantizing their own
        // output must not lose accuracy against the first dequantization.
        for w in [
            DType::Q4_1,
            DType::Q5_1,
            DType::Q2K,
            DType::Q3K,
            DType::Q4K,
            DType::Q5K,
            DType::Q6K,
        ] {
            let (_, y) = roundtrip(w, &x);
            let (_, y2) = roundtrip(w, &y);
            let first = array_rmse(&x, &y);
            let second = array_rmse(&y, &y2);
            assert!(
                second <= first,
                "{w}: requantization error {second} > {first}"
            );
        }
    }

    /// ggml `dot_product_error` (weights from `generate_data(0)`, activations from
    /// `generate_data(1)`, `|vec_dot - Σ x·y| / n`).
    #[test]
    fn dot_product_error_within_ggml_thresholds() {
        let n = 32 * 128;
        let x = generate_data(0.0, n);
        let a = generate_data(1.0, n);
        let exact: f64 = x.iter().zip(&a).map(|(p, q)| (*p * *q) as f64).sum();
        for w in WEIGHT_TYPES {
            let mut wq = vec![0u8; w.bytes_for(n as u64).unwrap() as usize];
            quantize_row(w, &x, &mut wq);
            let mut aq = vec![0u8; activation_row_bytes(w, n)];
            quantize_activation_row(w, &a, &mut aq);
            let got = vec_dot(w, n, &wq, &aq);
            let err = (got - exact as f32).abs() / n as f32;
            let max = if w == DType::Q2K {
                MAX_DOT_PRODUCT_ERROR_LOWBIT
            } else {
                MAX_DOT_PRODUCT_ERROR
            };
            assert!(err < max, "{w}: dot product error {err} >= {max}");
        }
    }

    /// `vec_dot` equals the f64 dot product of the dequantized weight and activation rows up
    /// to f32 rounding of the block scale products (and, for Q8_1, the f16 rounding of the
    /// stored `s = d·Σq`), for 1, 3 and 7 blocks.
    #[test]
    fn vec_dot_matches_dequantized_reference() {
        for w in WEIGHT_TYPES {
            let bs = if w.is_quantized() { w.block_size() } else { 32 };
            for (blocks, seed) in [(1usize, 1u64), (3, 2), (7, 3)] {
                let k = blocks * bs;
                let x = random_data(seed, k, 1.0);
                let a = random_data(seed + 100, k, 2.0);
                let (wq, wd) = roundtrip(w, &x);
                let mut aq = vec![0u8; activation_row_bytes(w, k)];
                quantize_activation_row(w, &a, &mut aq);
                let ad = dequant_act(w, &aq, k);
                let reference: f64 = wd.iter().zip(&ad).map(|(p, q)| *p as f64 * *q as f64).sum();
                let magnitude: f64 = wd
                    .iter()
                    .zip(&ad)
                    .map(|(p, q)| (*p as f64 * *q as f64).abs())
                    .sum();
                let mut tol = 1e-5 * magnitude;
                if activation_type(w) == ActFormat::Q8_1 {
                    // mx·sy with sy rounded to f16: |m|·|s|·2⁻¹¹ per block.
                    let bb = view::<BlockQ8_1>(&aq);
                    for (i, blk) in bb.iter().enumerate() {
                        let m = wd[i * 32..(i + 1) * 32]
                            .iter()
                            .fold(f32::MAX, |p, v| p.min(*v))
                            .abs();
                        tol += (m * fp16_to_fp32(blk.s).abs()) as f64 / 1024.0;
                    }
                }
                let got = vec_dot(w, k, &wq, &aq) as f64;
                assert!(
                    (got - reference).abs() <= tol,
                    "{w} x{blocks}: vec_dot {got} vs reference {reference} (tol {tol})"
                );
            }
        }
    }

    /// The byte-level API gives the same bytes and values at odd (misaligned) offsets.
    #[test]
    fn byte_api_is_alignment_independent() {
        for w in WEIGHT_TYPES {
            let k = 3 * w.block_size().max(32);
            let x = random_data(5, k, 1.5);
            let a = random_data(6, k, 0.5);
            let wb = w.bytes_for(k as u64).unwrap() as usize;
            let ab = activation_row_bytes(w, k);
            let mut aligned = vec![0u8; wb];
            quantize_row(w, &x, &mut aligned);
            let mut buf = vec![0u8; wb + 1];
            quantize_row(w, &x, &mut buf[1..]);
            assert_eq!(&buf[1..], &aligned[..], "{w}");
            let mut act = vec![0u8; ab];
            quantize_activation_row(w, &a, &mut act);
            let mut abuf = vec![0u8; ab + 1];
            quantize_activation_row(w, &a, &mut abuf[1..]);
            assert_eq!(&abuf[1..], &act[..], "{w}");
            assert_eq!(
                vec_dot(w, k, &buf[1..], &abuf[1..]).to_bits(),
                vec_dot(w, k, &aligned, &act).to_bits(),
                "{w}"
            );
            let mut y1 = vec![0f32; k];
            let mut y2 = vec![0f32; k];
            dequantize_row(w, &aligned, &mut y1);
            dequantize_row(w, &buf[1..], &mut y2);
            assert_eq!(y1, y2, "{w}");
        }
    }

    /// Zero input gives zero blocks and zero output (the `d = 0` branches).
    #[test]
    fn zero_rows() {
        let x = vec![0f32; 512];
        for w in WEIGHT_TYPES {
            let (q, y) = roundtrip(w, &x);
            // Q4_0 / Q5_0 store d = 0/-8 = -0.0 and the offset quant 8 / 16; all others are zero.
            if !matches!(w, DType::Q4_0 | DType::Q5_0) {
                assert!(q.iter().all(|&b| b == 0), "{w}: {q:?}");
            }
            assert!(y.iter().all(|&v| v == 0.0), "{w}");
        }
        let mut act = vec![0u8; activation_row_bytes(DType::Q4K, 512)];
        quantize_activation_row(DType::Q4K, &x, &mut act);
        assert!(act.iter().all(|&b| b == 0));
    }

    /// ggml `nearest_int` rounds ties to even.
    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(127.4), 127);
    }

    /// bf16: round to nearest even on the low 16 bits, NaN quieted (ggml
    /// `ggml_compute_fp32_to_bf16`).
    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(fp32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (down).
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        // The next halfway case rounds up to the even mantissa.
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81);
        // A signalling NaN keeps its high bits and gets the quiet bit.
        assert_eq!(fp32_to_bf16(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(fp32_to_bf16(f32::from_bits(0xFF81_0000)), 0xFFC1);
        assert_eq!(fp32_to_bf16(f32::INFINITY), 0x7F80);
        // Rounding up past the largest finite bf16 gives infinity.
        assert_eq!(fp32_to_bf16(f32::MAX), 0x7F80);
        assert_eq!(bf16_to_fp32(0x3F80), 1.0);
        assert_eq!(fp32_to_fp16(f32::NAN) & 0x7FFF, 0x7E00);
        assert_eq!(fp32_to_fp16(65520.0), 0x7C00);
        assert_eq!(fp32_to_fp16(1.0 + 1.0 / 2048.0), 0x3C00);
    }

    #[test]
    fn activation_formats() {
        assert_eq!(activation_type(DType::Q4_0), ActFormat::Q8_0);
        assert_eq!(activation_type(DType::Q5_1), ActFormat::Q8_1);
        assert_eq!(activation_type(DType::Q6K), ActFormat::Q8K);
        assert_eq!(activation_row_bytes(DType::Q4_1, 64), 72);
        assert_eq!(activation_row_bytes(DType::Q3K, 512), 584);
        assert_eq!(activation_row_bytes(DType::F16, 5), 10);
        assert_eq!(ActFormat::Q8K.type_size(), 292);
    }
}
