//! The kernel table: named function pointers the runtime calls through.

use edge_schema::DType;

use crate::{AttentionParams, Conv2dParams, GroupStats, WeightRef};

/// [`crate::linear`]'s signature: `(x, w, bias, out, m, k, n, scratch, epilogue)`.
pub type LinearFn = fn(
    &[f32],
    WeightRef<'_>,
    Option<&[f32]>,
    &mut [f32],
    usize,
    usize,
    usize,
    &mut [u8],
    Option<EpilogueFn>,
);
/// A fused GEMM epilogue: an element-wise op applied in place, `x[i] = f(x[i])`, with the bits
/// of the op's own slot (e.g. [`KernelTable::gelu_tanh_in_place`] for `gelu_tanh`). A `linear`
/// kernel calls it on blocks of its output as it finishes them, in any order and from any
/// thread.
pub type EpilogueFn = fn(&mut [f32]);
/// [`crate::linear_scratch_bytes`]'s signature: `(w_dtype, m, k) -> bytes`.
pub type LinearScratchFn = fn(DType, usize, usize) -> usize;
/// [`crate::conv2d`]'s signature: `(p, x, w, bias, out, scratch)`.
pub type Conv2dFn = fn(&Conv2dParams, &[f32], WeightRef<'_>, Option<&[f32]>, &mut [f32], &mut [u8]);
/// [`crate::conv2d_scratch_bytes`]'s signature.
pub type Conv2dScratchFn = fn(&Conv2dParams, DType) -> usize;
/// [`crate::attention`]'s signature: `(p, q_src, kv_src, key_mask, bias, out)`.
pub type AttentionFn =
    fn(&AttentionParams, &[f32], &[f32], Option<&[f32]>, Option<&[f32]>, &mut [f32]);
/// [`crate::group_norm_stats`]'s signature: `(x, c, hw, groups, eps, stats)`.
pub type GroupNormStatsFn = fn(&[f32], usize, usize, usize, f32, &mut [GroupStats]);
/// [`crate::group_norm_apply`]'s signature: `(x, c, hw, groups, stats, weight, bias, out)`.
pub type GroupNormApplyFn =
    fn(&[f32], usize, usize, usize, &[GroupStats], &[f32], &[f32], &mut [f32]);
/// [`crate::layer_norm`]'s signature: `(x, m, d, eps, weight, bias, out)`.
pub type LayerNormFn = fn(&[f32], usize, usize, f32, Option<&[f32]>, Option<&[f32]>, &mut [f32]);
/// [`crate::rms_norm`]'s signature: `(x, m, d, eps, weight, out)`.
pub type RmsNormFn = fn(&[f32], usize, usize, f32, &[f32], &mut [f32]);
/// An element-wise map `(x, out)` such as [`crate::silu`].
pub type UnaryFn = fn(&[f32], &mut [f32]);
/// A broadcast binary op `(a, b, out)` such as [`crate::add`].
pub type BinaryFn = fn(&[f32], &[f32], &mut [f32]);
/// [`crate::modulate`]'s signature: `(x, m, d, shift, scale, out)`.
pub type ModulateFn = fn(&[f32], usize, usize, &[f32], &[f32], &mut [f32]);
/// [`crate::upsample_nearest2x`]'s signature: `(x, c, h, w, out)`.
pub type UpsampleFn = fn(&[f32], usize, usize, usize, &mut [f32]);
/// [`crate::gated_residual`]'s signature: `(x, y, m, d, gate, out)`.
pub type GatedResidualFn = fn(&[f32], &[f32], usize, usize, &[f32], &mut [f32]);

/// One slot of the table: the function and the name reported by [`KernelTable::names`]
/// (`{isa}_{op}_{dtype}[_{tile}]`, e.g. `generic_linear_f32`).
#[derive(Clone, Copy, Debug)]
pub struct Kernel<F> {
    /// Kernel name for logs.
    pub name: &'static str,
    /// The kernel.
    pub run: F,
}

/// The hot kernels by slot. [`generic`] fills every slot; SIMD crates copy it and overwrite
/// the slots they accelerate (`best() = generic()` + plugs). Call a slot as
/// `(table.linear.run)(x, w, bias, out, m, k, n, scratch)`.
#[derive(Clone, Copy, Debug)]
pub struct KernelTable {
    /// `out = x · wᵀ + bias`, every weight type.
    pub linear: Kernel<LinearFn>,
    /// Scratch bytes of `linear`.
    pub linear_scratch_bytes: Kernel<LinearScratchFn>,
    /// 2-D convolution.
    pub conv2d: Kernel<Conv2dFn>,
    /// Scratch bytes of `conv2d`.
    pub conv2d_scratch_bytes: Kernel<Conv2dScratchFn>,
    /// Multi-head attention.
    pub attention: Kernel<AttentionFn>,
    /// Multi-head attention with bf16-pair products ([`crate::attention_bf16`], the ops a plan
    /// marks `bf16_products`).
    pub attention_bf16: Kernel<AttentionFn>,
    /// torch GroupNorm, statistics half (see [`KernelTable::group_norm`]).
    pub group_norm_stats: Kernel<GroupNormStatsFn>,
    /// torch GroupNorm, normalization half with given statistics.
    pub group_norm_apply: Kernel<GroupNormApplyFn>,
    /// torch LayerNorm.
    pub layer_norm: Kernel<LayerNormFn>,
    /// T5LayerNorm.
    pub rms_norm: Kernel<RmsNormFn>,
    /// GELU, tanh approximation.
    pub gelu_tanh: Kernel<UnaryFn>,
    /// GELU, tanh approximation, in place on the calling thread: the epilogue of a `linear`
    /// with [`edge_schema::op::Epilogue::GeluTanh`] (the bits of `gelu_tanh`).
    pub gelu_tanh_in_place: Kernel<EpilogueFn>,
    /// SiLU.
    pub silu: Kernel<UnaryFn>,
    /// ReLU.
    pub relu: Kernel<UnaryFn>,
    /// tanh.
    pub tanh: Kernel<UnaryFn>,
    /// Broadcast add.
    pub add: Kernel<BinaryFn>,
    /// Broadcast multiply.
    pub mul: Kernel<BinaryFn>,
    /// `x · (1 + scale) + shift`.
    pub modulate: Kernel<ModulateFn>,
    /// `x + gate · y`.
    pub gated_residual: Kernel<GatedResidualFn>,
    /// Nearest-neighbour 2× upsample of `[c, h, w]`.
    pub upsample_nearest2x: Kernel<UpsampleFn>,
}

impl KernelTable {
    /// `(slot, kernel name)` for every slot, in declaration order, for logging the choice.
    pub fn names(&self) -> [(&'static str, &'static str); 20] {
        [
            ("linear", self.linear.name),
            ("linear_scratch_bytes", self.linear_scratch_bytes.name),
            ("conv2d", self.conv2d.name),
            ("conv2d_scratch_bytes", self.conv2d_scratch_bytes.name),
            ("attention", self.attention.name),
            ("attention_bf16", self.attention_bf16.name),
            ("group_norm_stats", self.group_norm_stats.name),
            ("group_norm_apply", self.group_norm_apply.name),
            ("layer_norm", self.layer_norm.name),
            ("rms_norm", self.rms_norm.name),
            ("gelu_tanh", self.gelu_tanh.name),
            ("gelu_tanh_in_place", self.gelu_tanh_in_place.name),
            ("silu", self.silu.name),
            ("relu", self.relu.name),
            ("tanh", self.tanh.name),
            ("add", self.add.name),
            ("mul", self.mul.name),
            ("modulate", self.modulate.name),
            ("gated_residual", self.gated_residual.name),
            ("upsample_nearest2x", self.upsample_nearest2x.name),
        ]
    }

    /// torch `nn.GroupNorm(groups, c, eps, affine=True)` through this table: the
    /// `group_norm_stats` slot, then `group_norm_apply` (shapes as [`crate::group_norm`]). A
    /// tile normalised by `group_norm_apply` with statistics of the whole tensor therefore gets
    /// exactly the values this gives for the whole tensor. Allocates nothing up to 256 groups.
    #[allow(clippy::too_many_arguments)]
    pub fn group_norm(
        &self,
        x: &[f32],
        c: usize,
        hw: usize,
        groups: usize,
        eps: f32,
        weight: &[f32],
        bias: &[f32],
        out: &mut [f32],
    ) {
        crate::contract::group_norm(x, c, hw, groups, weight, bias, out);
        crate::norm::with_group_stats(groups, |stats| {
            (self.group_norm_stats.run)(x, c, hw, groups, eps, stats);
            (self.group_norm_apply.run)(x, c, hw, groups, stats, weight, bias, out);
        });
    }
}

/// The complete generic table: every slot holds this crate's kernel.
pub fn generic() -> KernelTable {
    KernelTable {
        linear: Kernel {
            name: "generic_linear_f32",
            run: crate::linear,
        },
        linear_scratch_bytes: Kernel {
            name: "generic_linear_f32",
            run: crate::linear_scratch_bytes,
        },
        conv2d: Kernel {
            name: "generic_conv2d_f32",
            run: crate::conv2d,
        },
        conv2d_scratch_bytes: Kernel {
            name: "generic_conv2d_f32",
            run: crate::conv2d_scratch_bytes,
        },
        attention: Kernel {
            name: "generic_attention_f32",
            run: crate::attention,
        },
        attention_bf16: Kernel {
            name: "generic_attention_bf16_pairs",
            run: crate::attention_bf16,
        },
        group_norm_stats: Kernel {
            name: "generic_group_norm_stats_f64",
            run: crate::group_norm_stats,
        },
        group_norm_apply: Kernel {
            name: "generic_group_norm_apply_f32",
            run: crate::group_norm_apply,
        },
        layer_norm: Kernel {
            name: "generic_layer_norm_f32",
            run: crate::layer_norm,
        },
        rms_norm: Kernel {
            name: "generic_rms_norm_f32",
            run: crate::rms_norm,
        },
        gelu_tanh: Kernel {
            name: "generic_gelu_tanh_f32",
            run: crate::gelu_tanh,
        },
        gelu_tanh_in_place: Kernel {
            name: "generic_gelu_tanh_f32_in_place",
            run: crate::gelu_tanh_in_place,
        },
        silu: Kernel {
            name: "generic_silu_f32",
            run: crate::silu,
        },
        relu: Kernel {
            name: "generic_relu_f32",
            run: crate::relu,
        },
        tanh: Kernel {
            name: "generic_tanh_f32",
            run: crate::tanh,
        },
        add: Kernel {
            name: "generic_add_f32",
            run: crate::add,
        },
        mul: Kernel {
            name: "generic_mul_f32",
            run: crate::mul,
        },
        modulate: Kernel {
            name: "generic_modulate_f32",
            run: crate::modulate,
        },
        gated_residual: Kernel {
            name: "generic_gated_residual_f32",
            run: crate::gated_residual,
        },
        upsample_nearest2x: Kernel {
            name: "generic_upsample_nearest2x_f32",
            run: crate::upsample_nearest2x,
        },
    }
}
