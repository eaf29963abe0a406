//! The argument contracts of the kernel-table slots: the checks every implementation of a slot
//! (generic, NEON, …) performs once per call, with the same panic messages, before any work.
//! Keeping them in one place keeps every twin's contract identical to the oracle's.
//!
//! Each function panics with a message naming the argument and the expected shape (outermost
//! first) when a precondition does not hold, and returns what the checks computed.

use edge_schema::plan::PackLayout;

use crate::params::{conv2d_scratch_bytes, AttentionParams, Conv2dParams, MAX_HEAD_DIM};
use crate::weights::{row_bytes, WeightRef};
use crate::{linear_scratch_bytes, pack};

/// [`crate::linear`]: `x` `[m, k]`, `out` `[m, n]`, `w` `[n, k]` of `w.dtype` (whole blocks per
/// row), `bias` `[n]`, at least `linear_scratch_bytes(w.dtype, m, k)` bytes of scratch, and a
/// layout the weight type can have. Returns the bytes of one row-major weight row.
pub fn linear(
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &[f32],
    m: usize,
    k: usize,
    n: usize,
    scratch_len: usize,
) -> usize {
    assert_eq!(
        x.len(),
        m * k,
        "linear: x has {} elements, expected m·k = {m}·{k}",
        x.len()
    );
    assert_eq!(
        out.len(),
        m * n,
        "linear: out has {} elements, expected m·n = {m}·{n}",
        out.len()
    );
    let wrow = row_bytes(w.dtype, k, "linear weight");
    assert_eq!(
        w.bytes.len(),
        n * wrow,
        "linear: weight has {} bytes, expected [{n}, {k}] {:?} = {} bytes",
        w.bytes.len(),
        w.dtype,
        n * wrow
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            n,
            "linear: bias has {} elements, expected n = {n}",
            b.len()
        );
    }
    let need = linear_scratch_bytes(w.dtype, m, k);
    assert!(
        scratch_len >= need,
        "linear: scratch has {scratch_len} bytes, needs {need} for {:?} weights, m={m}, k={k}",
        w.dtype
    );
    assert!(
        pack::holds(w.layout, w.dtype),
        "linear: {:?} weights cannot be in layout {:?}",
        w.dtype,
        w.layout
    );
    wrow
}

/// [`crate::conv2d`]: `x` `[cin, h, w]`, `out` `[cout, oh, ow]`, row-major weights `[cout, cin,
/// kh, kw]` of `w.dtype`, `bias` `[cout]`, at least `conv2d_scratch_bytes(p, w.dtype)` bytes of
/// scratch. Returns the bytes of one weight row (`cin·kh·kw` elements).
pub fn conv2d(
    p: &Conv2dParams,
    x: &[f32],
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    out: &[f32],
    scratch_len: usize,
) -> usize {
    let (oh, ow) = p.out_hw();
    let kk = p.patch_len();
    assert_eq!(
        x.len(),
        p.cin * p.h * p.w,
        "conv2d: x has {} elements, expected [{}, {}, {}]",
        x.len(),
        p.cin,
        p.h,
        p.w
    );
    assert_eq!(
        out.len(),
        p.cout * oh * ow,
        "conv2d: out has {} elements, expected [{}, {oh}, {ow}]",
        out.len(),
        p.cout
    );
    assert_eq!(
        w.layout,
        PackLayout::RowMajor,
        "conv2d: weights must be row-major"
    );
    let wrow = row_bytes(w.dtype, kk, "conv2d weight");
    assert_eq!(
        w.bytes.len(),
        p.cout * wrow,
        "conv2d: weight has {} bytes, expected [{}, {}, {}, {}] {:?}",
        w.bytes.len(),
        p.cout,
        p.cin,
        p.kh,
        p.kw,
        w.dtype
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            p.cout,
            "conv2d: bias has {} elements, expected cout = {}",
            b.len(),
            p.cout
        );
    }
    let need = conv2d_scratch_bytes(p, w.dtype);
    assert!(
        scratch_len >= need,
        "conv2d: scratch has {scratch_len} bytes, needs {need} for {p:?}"
    );
    wrow
}

/// [`crate::attention`]: `1 ≤ head_dim ≤ MAX_HEAD_DIM`, `lk ≥ 1`, `out` `[lq, heads·head_dim]`,
/// sources long enough for the strides and offsets, `key_mask` `[lk]`, `bias` `[heads, lq, lk]`.
pub fn attention(
    p: &AttentionParams,
    q_src: &[f32],
    kv_src: &[f32],
    key_mask: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &[f32],
) {
    let hd = p.head_dim;
    let width = p.heads * hd;
    assert!(
        (1..=MAX_HEAD_DIM).contains(&hd),
        "attention: head_dim {hd} outside 1..={MAX_HEAD_DIM}"
    );
    assert!(p.lk > 0, "attention: lk must be ≥ 1");
    assert_eq!(
        out.len(),
        p.lq * width,
        "attention: out has {} elements, expected [{}, {width}]",
        out.len(),
        p.lq
    );
    if p.lq > 0 {
        let need = (p.lq - 1) * p.q_stride + p.q_offset + width;
        assert!(
            q_src.len() >= need,
            "attention: q_src has {} elements, needs {need} for {p:?}",
            q_src.len()
        );
    }
    let need_kv = (p.lk - 1) * p.kv_stride + p.k_offset.max(p.v_offset) + width;
    assert!(
        kv_src.len() >= need_kv,
        "attention: kv_src has {} elements, needs {need_kv} for {p:?}",
        kv_src.len()
    );
    if let Some(m) = key_mask {
        assert_eq!(
            m.len(),
            p.lk,
            "attention: key_mask has {} elements, expected lk = {}",
            m.len(),
            p.lk
        );
    }
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            p.heads * p.lq * p.lk,
            "attention: bias has {} elements, expected [{}, {}, {}]",
            b.len(),
            p.heads,
            p.lq,
            p.lk
        );
    }
}

/// [`crate::group_norm`]: `groups` divides `c`, `x`/`out` `[c, hw]`, `weight`/`bias` `[c]`.
pub fn group_norm(
    x: &[f32],
    c: usize,
    hw: usize,
    groups: usize,
    weight: &[f32],
    bias: &[f32],
    out: &[f32],
) {
    assert!(
        groups > 0 && c.is_multiple_of(groups),
        "group_norm: {groups} groups do not divide {c} channels"
    );
    rows("group_norm", "x", x.len(), c, hw);
    rows("group_norm", "out", out.len(), c, hw);
    vector("group_norm", "weight", weight.len(), c);
    vector("group_norm", "bias", bias.len(), c);
}

/// [`crate::group_norm_stats`]: `groups` divides `c`, `x` `[c, hw]`, `stats` `[groups]`.
pub fn group_norm_stats<S>(x: &[f32], c: usize, hw: usize, groups: usize, stats: &[S]) {
    assert!(
        groups > 0 && c.is_multiple_of(groups),
        "group_norm: {groups} groups do not divide {c} channels"
    );
    rows("group_norm", "x", x.len(), c, hw);
    vector("group_norm", "stats", stats.len(), groups);
}

/// [`crate::layer_norm`]: `x`/`out` `[m, d]`, `weight`/`bias` `[d]` when given.
pub fn layer_norm(
    x: &[f32],
    m: usize,
    d: usize,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    out: &[f32],
) {
    rows("layer_norm", "x", x.len(), m, d);
    rows("layer_norm", "out", out.len(), m, d);
    for (name, v) in [("weight", weight), ("bias", bias)] {
        if let Some(v) = v {
            vector("layer_norm", name, v.len(), d);
        }
    }
}

/// [`crate::rms_norm`]: `x`/`out` `[m, d]`, `weight` `[d]`.
pub fn rms_norm(x: &[f32], m: usize, d: usize, weight: &[f32], out: &[f32]) {
    rows("rms_norm", "x", x.len(), m, d);
    rows("rms_norm", "out", out.len(), m, d);
    vector("rms_norm", "weight", weight.len(), d);
}

/// [`crate::upsample_nearest2x`]: `x` `[c, h, w]`, `out` `[c, 2h, 2w]`.
pub fn upsample_nearest2x(x: &[f32], c: usize, h: usize, w: usize, out: &[f32]) {
    assert_eq!(
        x.len(),
        c * h * w,
        "upsample_nearest2x: x has {} elements, expected [{c}, {h}, {w}]",
        x.len()
    );
    assert_eq!(
        out.len(),
        4 * c * h * w,
        "upsample_nearest2x: out has {} elements, expected [{c}, {}, {}]",
        out.len(),
        2 * h,
        2 * w
    );
}

/// Element-wise maps such as [`crate::silu`] (`what` names the kernel): `x` and `out` have the
/// same length.
pub fn unary(x: &[f32], out: &[f32], what: &str) {
    assert_eq!(
        x.len(),
        out.len(),
        "{what}: x has {} elements but out has {}",
        x.len(),
        out.len()
    );
}

/// Broadcast binary ops such as [`crate::add`] (`what` names the kernel): `out` as long as `a`,
/// and `b` a suffix of `a`'s shape (its length divides `a`'s; both empty allowed).
pub fn broadcast(a: &[f32], b: &[f32], out: &[f32], what: &str) {
    assert_eq!(
        a.len(),
        out.len(),
        "{what}: a has {} elements but out has {}",
        a.len(),
        out.len()
    );
    let d = b.len();
    assert!(
        (d == 0 && a.is_empty()) || (d > 0 && a.len().is_multiple_of(d)),
        "{what}: b has {d} elements, which does not divide a's {} (b must be a suffix of a's shape)",
        a.len()
    );
}

/// [`crate::modulate`]: `x`/`out` `[m, d]`, `shift`/`scale` `[d]`.
pub fn modulate(x: &[f32], m: usize, d: usize, shift: &[f32], scale: &[f32], out: &[f32]) {
    rows("modulate", "x", x.len(), m, d);
    rows("modulate", "out", out.len(), m, d);
    vector("modulate", "shift", shift.len(), d);
    vector("modulate", "scale", scale.len(), d);
}

/// [`crate::gated_residual`]: `x`/`y`/`out` `[m, d]`, `gate` `[d]`.
pub fn gated_residual(x: &[f32], y: &[f32], m: usize, d: usize, gate: &[f32], out: &[f32]) {
    rows("gated_residual", "x", x.len(), m, d);
    rows("gated_residual", "y", y.len(), m, d);
    rows("gated_residual", "out", out.len(), m, d);
    vector("gated_residual", "gate", gate.len(), d);
}

/// `{what}: {name} has N elements, expected [{m}, {d}]`.
fn rows(what: &str, name: &str, len: usize, m: usize, d: usize) {
    assert_eq!(
        len,
        m * d,
        "{what}: {name} has {len} elements, expected [{m}, {d}]"
    );
}

/// `{what}: {name} has N elements, expected {d}`.
fn vector(what: &str, name: &str, len: usize, d: usize) {
    assert_eq!(len, d, "{what}: {name} has {len} elements, expected {d}");
}
