//! The operations a plan's steps execute.
//!
//! An [`Op`] carries only attributes; the shapes of its inputs and outputs come from the stage's
//! value table. All tensors are contiguous row-major with shapes written **outermost-first**
//! (PyTorch order). The runtime matches on `Op` and calls kernel-table slots; kernels never
//! see this enum.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;

/// One operation. The doc of each variant lists its inputs in order, then its output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Row gather: inputs `[table [v, d] (weight), ids [l] (I32)]` → `[l, d]`.
    Embedding,
    /// `epilogue(x · wᵀ + bias)`: inputs `[x [m, k], w [n, k], bias [n]?]` → `[m, n]`.
    /// `x` may have more leading axes; they are flattened into `m`. The [`Epilogue`] is an
    /// element-wise op the planner fused into the product (decided when the plan is built):
    /// the kernel applies it to each block of outputs as it finishes them, with the bits of
    /// the op run on its own.
    Linear { has_bias: bool, epilogue: Epilogue },
    /// T5LayerNorm: inputs `[x [m, d], weight [d]]` → `x · rsqrt(mean(x²) + eps) · weight`.
    RmsNorm { eps: f32 },
    /// LayerNorm over the last axis: inputs `[x [m, d], weight [d]?, bias [d]?]` (both or none).
    LayerNorm { eps: f32, affine: bool },
    /// GroupNorm: inputs `[x [c, h, w], weight [c], bias [c]]` → `[c, h, w]` (torch.nn.GroupNorm).
    GroupNorm { groups: u32, eps: f32 },
    /// adaLN modulation: inputs `[x [m, d], table [r, d]]` →
    /// `x · (1 + table[scale_row]) + table[shift_row]`.
    Modulate { shift_row: u32, scale_row: u32 },
    /// Gated residual: inputs `[x [m, d], y [m, d], table [r, d]]` → `x + table[gate_row] · y`.
    GatedResidual { gate_row: u32 },
    /// `a + b`, with `b`'s shape a suffix of `a`'s (broadcast over leading axes).
    Add,
    /// `a · b`, broadcast as [`Op::Add`].
    Mul,
    /// `x · factor`.
    Scale { factor: f32 },
    /// `x · sigmoid(x)`.
    Silu,
    /// GELU with the tanh approximation (torch `approximate="tanh"`, transformers `gelu_new`).
    GeluTanh,
    /// `max(x, 0)` (torch `nn.ReLU`; −0 and NaN pass through as torch gives them: `x` when not
    /// below 0).
    Relu,
    /// `tanh(x)` (torch `tanh`), in the kernels' one arithmetic (`edge_kernels::expf::tanh_f32`).
    Tanh,
    /// Multi-head attention reading q/k/v in place from (possibly fused) projections:
    /// inputs `[q_src [lq, q_stride], kv_src [lk, kv_stride], key_mask [lk]?, bias [heads, lq, lk]?]`
    /// → `[lq, heads · head_dim]`. Head `h` of query row `i` is
    /// `q_src[i, q_offset + h·head_dim ..][..head_dim]`, likewise keys at `k_offset` and values at
    /// `v_offset` of `kv_src`. Scores are `scale · q·k + bias + (1 − mask)·masked_value`.
    /// With `bf16_products` (`edgeplan compile --attention-products bf16`), `q·k` and the
    /// weights' products with the values take the bf16-pair arithmetic of `vdpbf16ps`
    /// (`edge_kernels::attention_bf16` defines it); otherwise every product is f32.
    Attention {
        heads: u32,
        head_dim: u32,
        scale: f32,
        q_offset: u32,
        k_offset: u32,
        v_offset: u32,
        has_mask: bool,
        masked_value: f32,
        has_bias: bool,
        bf16_products: bool,
    },
    /// 2-D convolution: inputs `[x [cin, h, w], w [cout, cin, kh, kw], bias [cout]?]` →
    /// `[cout, oh, ow]`; `pad` is `[top, bottom, left, right]` (zero padding).
    Conv2d {
        stride: [u32; 2],
        pad: [u32; 4],
        has_bias: bool,
    },
    /// Nearest-neighbour 2× upsampling: `[c, h, w]` → `[c, 2h, 2w]`.
    UpsampleNearest2x,
    /// Axis permutation (torch.permute): output axis `i` is input axis `perm[i]`; ≤ 6 axes.
    Permute { perm: Vec<u8> },
    /// Same elements, new shape (the output's).
    Reshape,
    /// `[.., n, ..]` → `[.., len, ..]` starting at `start` along `axis`.
    Slice { axis: u8, start: u64, len: u64 },
    /// Concatenation of all inputs along `axis`. Inputs are f32, or all of one cache type
    /// (F16, Q8_0) when `axis` is 0, the outermost: then each input's bytes follow the
    /// previous input's. The planner may place the inputs inside the output's slot, where
    /// the step copies nothing (in-place concatenation).
    Concat { axis: u8 },
    /// Stores f32 rows as a cache type: `x [.., w]` (f32) → `[.., w]` of `dtype` (F16 rounds
    /// to nearest even; Q8_0 is ggml's `quantize_row_q8_0_ref`, bit-exact with gguf-py),
    /// `w` a whole number of `dtype` blocks.
    Quantize { dtype: DType },
    /// Rows `start..start + len` of `x [rows, w]` (F32, F16 or Q8_0), as f32 `[len, w]`
    /// (ggml's `get_rows` on a contiguous range; exact for F32 and F16, Q8_0 dequantized as
    /// `dequantize_row_q8_0`).
    Rows { start: u64, len: u64 },
    /// Sinusoidal timestep embedding (diffusers `get_timestep_embedding`):
    /// `t [n]` → `[n, dim]` with `dim` from the output shape.
    TimestepEmbedding {
        flip_sin_to_cos: bool,
        downscale_freq_shift: f32,
        max_period: f32,
    },
    /// T5 relative position bias (transformers `T5Attention.compute_bias`):
    /// inputs `[table [num_buckets, heads]]` → `[heads, lq, lk]`.
    T5PositionBias {
        num_buckets: u32,
        max_distance: u32,
        bidirectional: bool,
    },
}

/// An element-wise op fused into the end of a [`Op::Linear`] (a GEMM epilogue).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Epilogue {
    /// The product (and bias) alone.
    #[default]
    None,
    /// [`Op::GeluTanh`] of each output element (the feed-forward of a PixArt block, T5 v1.1's
    /// gated-GELU gate, PixArt's caption projection).
    GeluTanh,
}

impl Op {
    /// A plain product (no bias, no epilogue): `Op::Linear { has_bias, epilogue: None }`.
    pub fn linear(has_bias: bool) -> Op {
        Op::Linear {
            has_bias,
            epilogue: Epilogue::None,
        }
    }

    /// [`Op::name`], with a fused epilogue named after it (`linear+gelu_tanh`): for dumps and
    /// profiles, where a fused product is a kind of its own.
    pub fn label(&self) -> &'static str {
        match self {
            Op::Linear {
                epilogue: Epilogue::GeluTanh,
                ..
            } => "linear+gelu_tanh",
            op => op.name(),
        }
    }

    /// A short name for dumps and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embedding => "embedding",
            Op::Linear { .. } => "linear",
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::GroupNorm { .. } => "group_norm",
            Op::Modulate { .. } => "modulate",
            Op::GatedResidual { .. } => "gated_residual",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale { .. } => "scale",
            Op::Silu => "silu",
            Op::GeluTanh => "gelu_tanh",
            Op::Relu => "relu",
            Op::Tanh => "tanh",
            Op::Attention { .. } => "attention",
            Op::Conv2d { .. } => "conv2d",
            Op::UpsampleNearest2x => "upsample_nearest2x",
            Op::Permute { .. } => "permute",
            Op::Reshape => "reshape",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Quantize { .. } => "quantize",
            Op::Rows { .. } => "rows",
            Op::TimestepEmbedding { .. } => "timestep_embedding",
            Op::T5PositionBias { .. } => "t5_position_bias",
        }
    }

    /// The number of inputs this op takes, as `(min, max)`; `max == usize::MAX` for concat.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Embedding => (2, 2),
            Op::Linear { has_bias, .. } => {
                let n = 2 + usize::from(*has_bias);
                (n, n)
            }
            Op::RmsNorm { .. } => (2, 2),
            Op::LayerNorm { affine, .. } => {
                let n = if *affine { 3 } else { 1 };
                (n, n)
            }
            Op::GroupNorm { .. } => (3, 3),
            Op::Modulate { .. } => (2, 2),
            Op::GatedResidual { .. } => (3, 3),
            Op::Add | Op::Mul => (2, 2),
            Op::Scale { .. } | Op::Silu | Op::GeluTanh | Op::Relu | Op::Tanh => (1, 1),
            Op::Attention {
                has_mask, has_bias, ..
            } => {
                let n = 2 + usize::from(*has_mask) + usize::from(*has_bias);
                (n, n)
            }
            Op::Conv2d { has_bias, .. } => {
                let n = 2 + usize::from(*has_bias);
                (n, n)
            }
            Op::UpsampleNearest2x
            | Op::Permute { .. }
            | Op::Reshape
            | Op::Slice { .. }
            | Op::Quantize { .. }
            | Op::Rows { .. } => (1, 1),
            Op::Concat { .. } => (1, usize::MAX),
            Op::TimestepEmbedding { .. } => (1, 1),
            Op::T5PositionBias { .. } => (1, 1),
        }
    }
}

/// Maximum rank of any tensor in a plan.
pub const MAX_RANK: usize = 6;

/// Element count of `shape`, or `None` on overflow, a zero dimension, or a rank above [`MAX_RANK`].
pub fn numel(shape: &[u64]) -> Option<u64> {
    if shape.len() > MAX_RANK {
        return None;
    }
    shape.iter().try_fold(
        1u64,
        |acc, &d| {
            if d == 0 {
                None
            } else {
                acc.checked_mul(d)
            }
        },
    )
}

/// Types a step-independent cache (and so an arena value) may have: F32, F16, Q8_0.
pub fn is_cache_type(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::Q8_0)
}

fn is_float_weight(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

impl Op {
    /// Shape inference: the output shape and dtype for `inputs` (shape, dtype) pairs.
    ///
    /// `hint` is the output shape where the op cannot infer it alone (`Reshape`,
    /// `TimestepEmbedding`, `T5PositionBias`); it is ignored otherwise. Used by the graph
    /// builder and, with the recorded output as hint, by the plan verifier: it checks arity,
    /// ranks, dtypes, broadcast rules, offsets and overflow, so that kernels can trust the
    /// slices they receive.
    pub fn infer(
        &self,
        inputs: &[(&[u64], DType)],
        hint: Option<&[u64]>,
    ) -> Result<(Vec<u64>, DType), String> {
        let (lo, hi) = self.arity();
        if inputs.len() < lo || inputs.len() > hi {
            return Err(format!(
                "{} takes {lo}..={hi} inputs, got {}",
                self.name(),
                inputs.len()
            ));
        }
        for (i, (s, _)) in inputs.iter().enumerate() {
            if numel(s).is_none() {
                return Err(format!(
                    "{}: input {i} has an invalid shape {s:?} (zero dim, rank > {MAX_RANK} or overflow)",
                    self.name()
                ));
            }
        }
        let f32_in = |i: usize| -> Result<&[u64], String> {
            let (s, d) = inputs[i];
            if d != DType::F32 {
                return Err(format!("{}: input {i} must be f32, is {d}", self.name()));
            }
            Ok(s)
        };
        let need_hint = || -> Result<Vec<u64>, String> {
            hint.map(|h| h.to_vec())
                .ok_or_else(|| format!("{}: output shape must be given", self.name()))
        };
        let last = |s: &[u64]| -> u64 { s.last().copied().unwrap_or(1) };
        let out = match self {
            Op::Embedding => {
                let (t, td) = inputs[0];
                let (ids, idd) = inputs[1];
                if t.len() != 2 || !is_float_weight(td) {
                    return Err(format!(
                        "embedding table must be a 2-D float tensor, is {td} {t:?}"
                    ));
                }
                if ids.len() != 1 || idd != DType::I32 {
                    return Err(format!("embedding ids must be 1-D i32, are {idd} {ids:?}"));
                }
                vec![ids[0], t[1]]
            }
            Op::Linear { has_bias, .. } => {
                let x = f32_in(0)?;
                let (w, wd) = inputs[1];
                if w.len() != 2 || w[1] != last(x) {
                    return Err(format!(
                        "linear: weight {w:?} does not match input {x:?} (expected [n, {}])",
                        last(x)
                    ));
                }
                if w[1] % wd.block_size() as u64 != 0 || wd == DType::I32 {
                    return Err(format!(
                        "linear: weight type {wd} does not fit rows of {}",
                        w[1]
                    ));
                }
                if *has_bias && f32_in(2)? != [w[0]] {
                    return Err(format!("linear: bias must be [{}]", w[0]));
                }
                let mut o = x.to_vec();
                if let Some(l) = o.last_mut() {
                    *l = w[0];
                }
                o
            }
            Op::RmsNorm { .. } => {
                let x = f32_in(0)?;
                if f32_in(1)? != [last(x)] {
                    return Err(format!("rms_norm: weight must be [{}]", last(x)));
                }
                x.to_vec()
            }
            Op::LayerNorm { affine, .. } => {
                let x = f32_in(0)?;
                if *affine && (f32_in(1)? != [last(x)] || f32_in(2)? != [last(x)]) {
                    return Err(format!("layer_norm: weight and bias must be [{}]", last(x)));
                }
                x.to_vec()
            }
            Op::GroupNorm { groups, .. } => {
                let x = f32_in(0)?;
                if x.len() != 3 || *groups == 0 || x[0] % u64::from(*groups) != 0 {
                    return Err(format!(
                        "group_norm: input {x:?} must be [c, h, w] with c divisible by {groups}"
                    ));
                }
                if f32_in(1)? != [x[0]] || f32_in(2)? != [x[0]] {
                    return Err(format!("group_norm: weight and bias must be [{}]", x[0]));
                }
                x.to_vec()
            }
            Op::Modulate {
                shift_row,
                scale_row,
            } => {
                let x = f32_in(0)?;
                let t = f32_in(1)?;
                let rows = u64::from((*shift_row).max(*scale_row));
                if t.len() != 2 || t[1] != last(x) || rows >= t[0] {
                    return Err(format!(
                        "modulate: table {t:?} must be [r > {rows}, {}]",
                        last(x)
                    ));
                }
                x.to_vec()
            }
            Op::GatedResidual { gate_row } => {
                let x = f32_in(0)?;
                let y = f32_in(1)?;
                let t = f32_in(2)?;
                if x != y || t.len() != 2 || t[1] != last(x) || u64::from(*gate_row) >= t[0] {
                    return Err(format!(
                        "gated_residual: shapes {x:?}, {y:?}, table {t:?} do not agree"
                    ));
                }
                x.to_vec()
            }
            Op::Add | Op::Mul => {
                let a = f32_in(0)?;
                let b = f32_in(1)?;
                if b.len() > a.len() || a[a.len() - b.len()..] != *b {
                    return Err(format!("{}: {b:?} is not a suffix of {a:?}", self.name()));
                }
                a.to_vec()
            }
            Op::Scale { .. } | Op::Silu | Op::GeluTanh | Op::Relu | Op::Tanh => f32_in(0)?.to_vec(),
            Op::Attention {
                heads,
                head_dim,
                q_offset,
                k_offset,
                v_offset,
                has_mask,
                has_bias,
                ..
            } => {
                let q = f32_in(0)?;
                let kv = f32_in(1)?;
                if q.len() != 2 || kv.len() != 2 {
                    return Err(format!("attention: q {q:?} and kv {kv:?} must be 2-D"));
                }
                let width = u64::from(*heads) * u64::from(*head_dim);
                if width == 0 {
                    return Err("attention: zero heads or head_dim".into());
                }
                let fits =
                    |off: u32, w: u64| u64::from(off).checked_add(width).is_some_and(|e| e <= w);
                if !fits(*q_offset, q[1]) || !fits(*k_offset, kv[1]) || !fits(*v_offset, kv[1]) {
                    return Err(format!("attention: offsets {q_offset}/{k_offset}/{v_offset} + {width} exceed q {q:?} / kv {kv:?}"));
                }
                let mut i = 2;
                if *has_mask {
                    if f32_in(i)? != [kv[0]] {
                        return Err(format!("attention: mask must be [{}]", kv[0]));
                    }
                    i += 1;
                }
                if *has_bias && f32_in(i)? != [u64::from(*heads), q[0], kv[0]] {
                    return Err(format!(
                        "attention: bias must be [{heads}, {}, {}]",
                        q[0], kv[0]
                    ));
                }
                vec![q[0], width]
            }
            Op::Conv2d {
                stride,
                pad,
                has_bias,
            } => {
                let x = f32_in(0)?;
                let (w, wd) = inputs[1];
                if x.len() != 3 || w.len() != 4 || w[1] != x[0] || !is_float_weight(wd) {
                    return Err(format!("conv2d: input {x:?} and weight {wd} {w:?} do not agree ([cin,h,w] and [cout,cin,kh,kw])"));
                }
                if stride[0] == 0 || stride[1] == 0 {
                    return Err("conv2d: zero stride".into());
                }
                if *has_bias && f32_in(2)? != [w[0]] {
                    return Err(format!("conv2d: bias must be [{}]", w[0]));
                }
                let ph = x[1] + u64::from(pad[0]) + u64::from(pad[1]);
                let pw = x[2] + u64::from(pad[2]) + u64::from(pad[3]);
                if ph < w[2] || pw < w[3] {
                    return Err(format!(
                        "conv2d: kernel {w:?} larger than padded input {x:?}"
                    ));
                }
                vec![
                    w[0],
                    (ph - w[2]) / u64::from(stride[0]) + 1,
                    (pw - w[3]) / u64::from(stride[1]) + 1,
                ]
            }
            Op::UpsampleNearest2x => {
                let x = f32_in(0)?;
                if x.len() != 3 {
                    return Err(format!("upsample: input {x:?} must be [c, h, w]"));
                }
                vec![x[0], x[1] * 2, x[2] * 2]
            }
            Op::Permute { perm } => {
                let x = f32_in(0)?;
                let mut seen = [false; MAX_RANK];
                if perm.len() != x.len() {
                    return Err(format!("permute: {perm:?} does not match rank of {x:?}"));
                }
                let mut o = Vec::with_capacity(x.len());
                for &p in perm {
                    let p = usize::from(p);
                    if p >= x.len() || seen[p] {
                        return Err(format!("permute: {perm:?} is not a permutation"));
                    }
                    seen[p] = true;
                    o.push(x[p]);
                }
                o
            }
            Op::Reshape => {
                let x = f32_in(0)?;
                let o = need_hint()?;
                if numel(&o) != numel(x) {
                    return Err(format!("reshape: {x:?} and {o:?} differ in size"));
                }
                o
            }
            Op::Slice { axis, start, len } => {
                let x = f32_in(0)?;
                let a = usize::from(*axis);
                if a >= x.len() || *len == 0 || start.checked_add(*len).is_none_or(|e| e > x[a]) {
                    return Err(format!("slice: axis {a} {start}+{len} outside {x:?}"));
                }
                let mut o = x.to_vec();
                o[a] = *len;
                o
            }
            Op::Concat { axis } => {
                let a = usize::from(*axis);
                let (first, dt) = inputs[0];
                if dt != DType::F32 && !(a == 0 && is_cache_type(dt)) {
                    return Err(format!(
                        "concat: inputs of type {dt} concatenate only along axis 0 (f32 along any)"
                    ));
                }
                if a >= first.len() {
                    return Err(format!("concat: axis {a} outside {first:?}"));
                }
                let mut o = first.to_vec();
                for &(s, d) in &inputs[1..] {
                    let same = s.len() == first.len()
                        && s.iter()
                            .zip(first)
                            .enumerate()
                            .all(|(j, (p, q))| j == a || p == q);
                    if d != dt || !same {
                        return Err(format!(
                            "concat: {d} {s:?} does not match {dt} {first:?} off axis {a}"
                        ));
                    }
                    o[a] = o[a].checked_add(s[a]).ok_or("concat: overflow")?;
                }
                if numel(&o).is_none() || dt.bytes_for(numel(&o).unwrap_or(0)).is_none() {
                    return Err(format!("concat: output {o:?} is invalid"));
                }
                return Ok((o, dt));
            }
            Op::Quantize { dtype } => {
                let x = f32_in(0)?;
                if !is_cache_type(*dtype) || *dtype == DType::F32 {
                    return Err(format!(
                        "quantize: type {dtype} is not a cache type (f16, q8_0)"
                    ));
                }
                if last(x) % dtype.block_size() as u64 != 0 {
                    return Err(format!(
                        "quantize: rows of {} are not whole {dtype} blocks",
                        last(x)
                    ));
                }
                return Ok((x.to_vec(), *dtype));
            }
            Op::Rows { start, len } => {
                let (x, d) = inputs[0];
                if x.len() != 2
                    || !is_cache_type(d)
                    || x[1] % d.block_size() as u64 != 0
                    || *len == 0
                    || start.checked_add(*len).is_none_or(|e| e > x[0])
                {
                    return Err(format!(
                        "rows: {start}+{len} of {d} {x:?} (expected rows of a 2-D f32, f16 or q8_0 tensor)"
                    ));
                }
                vec![*len, x[1]]
            }
            Op::TimestepEmbedding { max_period, .. } => {
                let t = f32_in(0)?;
                let o = need_hint()?;
                if t.len() != 1
                    || o.len() != 2
                    || o[0] != t[0]
                    || !(max_period.is_finite() && *max_period > 1.0)
                {
                    return Err(format!(
                        "timestep_embedding: input {t:?} → {o:?} (expected [n] → [n, dim])"
                    ));
                }
                o
            }
            Op::T5PositionBias { num_buckets, .. } => {
                let t = f32_in(0)?;
                let o = need_hint()?;
                if t.len() != 2 || t[0] != u64::from(*num_buckets) || o.len() != 3 || o[0] != t[1] {
                    return Err(format!("t5_position_bias: table {t:?} → {o:?} (expected [{num_buckets}, heads] → [heads, lq, lk])"));
                }
                o
            }
        };
        if numel(&out).is_none() {
            return Err(format!("{}: output shape {out:?} is invalid", self.name()));
        }
        Ok((out, DType::F32))
    }
}
