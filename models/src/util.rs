//! Small layer helpers shared by the builders: each declares its checkpoint weights
//! (`{prefix}.weight`, `{prefix}.bias`) and appends one node named after the layer.

use edge_graph::schema::op::Op;
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
    let rows = out_each * prefixes.len();
    let ws: Vec<String> = prefixes.iter().map(|p| format!("{p}.weight")).collect();
    let w = g.weight_concat(&ws, &[rows, inp], WeightKind::Matrix)?;
    if bias {
        let bs: Vec<String> = prefixes.iter().map(|p| format!("{p}.bias")).collect();
        let b = g.weight_concat(&bs, &[rows], WeightKind::Vector)?;
        g.op(name, Op::Linear { has_bias: true }, &[x, w, b])
    } else {
        g.op(name, Op::Linear { has_bias: false }, &[x, w])
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
