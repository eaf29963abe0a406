//! Small layer helpers shared by the builders: each declares its checkpoint weights
//! (`{prefix}.weight`, `{prefix}.bias`) and appends one node named after the layer.

use edge_graph::schema::op::{Epilogue, Op};
use edge_graph::{Graph, Result, ValueId, WeightKind};

/// `nn.Linear`: `x [.., inp]` → `[.., out]` with weight `{prefix}.weight [out, inp]` and,
/// when `bias`, `{prefix}.bias [out]`.
pub(crate) fn linear(
    g: &mut Graph,
    x: ValueId,
    prefix: &str,
    out: usize,
    inp: usize,
    bias: bool,
) -> Result<ValueId> {
    linear_fused(g, x, prefix, &[prefix.to_string()], out, inp, bias)
}

/// `nn.Linear` followed by GELU with the tanh approximation (`gelu_new`, torch
/// `approximate="tanh"`), as one node with the GELU fused into the product's epilogue
/// ([`Epilogue::GeluTanh`]): the weights of [`linear`], the node called `name`. The planner
/// always fuses the pair: the kernels apply the GELU to each block of outputs while it is in
/// cache, with the bits of [`Op::GeluTanh`] run on its own, and the product's output needs no
/// arena slot of its own.
pub(crate) fn linear_gelu(
    g: &mut Graph,
    x: ValueId,
    prefix: &str,
    name: &str,
    out: usize,
    inp: usize,
    bias: bool,
) -> Result<ValueId> {
    linear_with(
        g,
        x,
        name,
        &[prefix.to_string()],
        out,
        inp,
        bias,
        Epilogue::GeluTanh,
    )
}

/// Several `nn.Linear` layers over the same input fused into one: weights
/// `{p}.weight [out_each, inp]` (and biases) concatenated by rows in the order of `prefixes`;
/// output `[.., prefixes.len() · out_each]`. The node is called `name`.
pub(crate) fn linear_fused(
    g: &mut Graph,
    x: ValueId,
    name: &str,
    prefixes: &[String],
    out_each: usize,
    inp: usize,
    bias: bool,
) -> Result<ValueId> {
    linear_with(g, x, name, prefixes, out_each, inp, bias, Epilogue::None)
}

#[allow(clippy::too_many_arguments)]
fn linear_with(
    g: &mut Graph,
    x: ValueId,
    name: &str,
    prefixes: &[String],
    out_each: usize,
    inp: usize,
    bias: bool,
    epilogue: Epilogue,
) -> Result<ValueId> {
    let rows = out_each * prefixes.len();
    let ws: Vec<String> = prefixes.iter().map(|p| format!("{p}.weight")).collect();
    let w = g.weight_concat(&ws, &[rows, inp], WeightKind::Matrix)?;
    if bias {
        let bs: Vec<String> = prefixes.iter().map(|p| format!("{p}.bias")).collect();
        let b = g.weight_concat(&bs, &[rows], WeightKind::Vector)?;
        let op = Op::Linear {
            has_bias: true,
            epilogue,
        };
        g.op(name, op, &[x, w, b])
    } else {
        let op = Op::Linear {
            has_bias: false,
            epilogue,
        };
        g.op(name, op, &[x, w])
    }
}

/// `nn.Conv2d` with bias: `x [cin, h, w]` → `[cout, oh, ow]`, square kernel `k`,
/// weight `{prefix}.weight [cout, cin, k, k]`, bias `{prefix}.bias [cout]`;
/// `pad` is `[top, bottom, left, right]`.
pub(crate) fn conv2d(
    g: &mut Graph,
    x: ValueId,
    prefix: &str,
    cout: usize,
    k: usize,
    stride: u32,
    pad: [u32; 4],
) -> Result<ValueId> {
    let cin = g.dims(x).first().copied().unwrap_or(0);
    let w = g.weight(
        &format!("{prefix}.weight"),
        &[cout, cin, k, k],
        WeightKind::ConvKernel,
    )?;
    let b = g.weight(&format!("{prefix}.bias"), &[cout], WeightKind::Vector)?;
    g.op(
        prefix,
        Op::Conv2d {
            stride: [stride, stride],
            pad,
            has_bias: true,
        },
        &[x, w, b],
    )
}

/// `nn.GroupNorm` (affine): `x [c, h, w]` → `[c, h, w]`, weight and bias `{prefix}.{weight,bias} [c]`.
pub(crate) fn group_norm(
    g: &mut Graph,
    x: ValueId,
    prefix: &str,
    groups: usize,
    eps: f32,
) -> Result<ValueId> {
    let c = g.dims(x).first().copied().unwrap_or(0);
    let w = g.weight(&format!("{prefix}.weight"), &[c], WeightKind::Vector)?;
    let b = g.weight(&format!("{prefix}.bias"), &[c], WeightKind::Vector)?;
    g.op(
        prefix,
        Op::GroupNorm {
            groups: groups as u32,
            eps,
        },
        &[x, w, b],
    )
}
