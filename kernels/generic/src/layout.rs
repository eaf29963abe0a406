//! Data movement: nearest upsampling, permute, slice and concat along an axis.
//!
//! These copy values without arithmetic, so any work split gives identical bytes.

use rayon::prelude::*;
use zerocopy::IntoBytes;

/// Largest rank [`permute`] accepts.
pub const MAX_RANK: usize = 6;

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// `generic_upsample_nearest2x_f32`: torch `F.interpolate(x, scale_factor=2, mode="nearest")`:
/// `out[ch, y, x] = x[ch, y / 2, x / 2]`. Shapes: `x` `[c, h, w]`, `out` `[c, 2h, 2w]`.
pub fn upsample_nearest2x(x: &[f32], c: usize, h: usize, w: usize, out: &mut [f32]) {
    crate::contract::upsample_nearest2x(x, c, h, w, out);
    if c * h * w == 0 {
        return;
    }
    out.par_chunks_mut(4 * w)
        .enumerate()
        .for_each(|(pair, rows)| {
            let (ch, y) = (pair / h, pair % h);
            let src = &x[(ch * h + y) * w..][..w];
            let (top, bottom) = rows.split_at_mut(2 * w);
            for (d, &v) in top.chunks_mut(2).zip(src) {
                d[0] = v;
                d[1] = v;
            }
            bottom.copy_from_slice(top);
        });
}

/// `generic_permute_f32`: torch `x.permute(perm).contiguous()`: `out` has shape
/// `[shape[perm[0]], …, shape[perm[r−1]]]` and `out[i_0, …] = x[j]` where `j[perm[a]] = i_a`.
/// `shape` has at most [`MAX_RANK`] axes and `perm` is a permutation of `0..shape.len()`.
pub fn permute(x: &[f32], shape: &[usize], perm: &[usize], out: &mut [f32]) {
    let rank = shape.len();
    assert!(rank <= MAX_RANK, "permute: rank {rank} exceeds {MAX_RANK}");
    assert_eq!(
        perm.len(),
        rank,
        "permute: perm {perm:?} does not match shape {shape:?}"
    );
    let mut seen = [false; MAX_RANK];
    for &a in perm {
        assert!(
            a < rank && !seen[a],
            "permute: {perm:?} is not a permutation of 0..{rank}"
        );
        seen[a] = true;
    }
    let n = numel(shape);
    assert_eq!(
        x.len(),
        n,
        "permute: x has {} elements, shape {shape:?} needs {n}",
        x.len()
    );
    assert_eq!(
        out.len(),
        n,
        "permute: out has {} elements, expected {n}",
        out.len()
    );
    if n == 0 {
        return;
    }
    // Input strides, then the output's shape and the input stride of each output axis.
    let mut in_stride = [0usize; MAX_RANK];
    let mut s = 1;
    for a in (0..rank).rev() {
        in_stride[a] = s;
        s *= shape[a];
    }
    let mut oshape = [1usize; MAX_RANK];
    let mut ostride_in = [0usize; MAX_RANK];
    for (i, &a) in perm.iter().enumerate() {
        oshape[i] = shape[a];
        ostride_in[i] = in_stride[a];
    }
    const CHUNK: usize = 1 << 14;
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        // Multi-index of the chunk's first output element.
        let mut idx = [0usize; MAX_RANK];
        let mut rem = c * CHUNK;
        for a in (0..rank).rev() {
            idx[a] = rem % oshape[a];
            rem /= oshape[a];
        }
        let mut src: usize = (0..rank).map(|a| idx[a] * ostride_in[a]).sum();
        for d in dst.iter_mut() {
            *d = x[src];
            // Odometer increment over the output axes, last axis fastest.
            let mut a = rank;
            while a > 0 {
                a -= 1;
                idx[a] += 1;
                src += ostride_in[a];
                if idx[a] < oshape[a] {
                    break;
                }
                src -= idx[a] * ostride_in[a];
                idx[a] = 0;
            }
        }
    });
}

/// Splits `shape` around `axis` into `(outer, extent, inner)` element counts.
fn split_axis(shape: &[usize], axis: usize, what: &str) -> (usize, usize, usize) {
    assert!(
        axis < shape.len(),
        "{what}: axis {axis} out of range for shape {shape:?}"
    );
    (
        numel(&shape[..axis]),
        shape[axis],
        numel(&shape[axis + 1..]),
    )
}

/// `generic_slice_axis_f32`: torch `x.narrow(axis, start, len).contiguous()`. `x` has `shape`;
/// `out` has `shape` with `shape[axis]` replaced by `len`; `start + len ≤ shape[axis]`.
pub fn slice_axis(
    x: &[f32],
    shape: &[usize],
    axis: usize,
    start: usize,
    len: usize,
    out: &mut [f32],
) {
    let (outer, extent, inner) = split_axis(shape, axis, "slice_axis");
    assert!(
        start + len <= extent,
        "slice_axis: {start}..{} exceeds axis {axis} of {shape:?}",
        start + len
    );
    assert_eq!(
        x.len(),
        outer * extent * inner,
        "slice_axis: x has {} elements, shape {shape:?}",
        x.len()
    );
    assert_eq!(
        out.len(),
        outer * len * inner,
        "slice_axis: out has {} elements, expected {}",
        out.len(),
        outer * len * inner
    );
    if out.is_empty() {
        return;
    }
    out.par_chunks_mut(len * inner)
        .enumerate()
        .for_each(|(o, dst)| {
            dst.copy_from_slice(&x[(o * extent + start) * inner..][..len * inner]);
        });
}

/// One input of a concatenation, as bytes (any element type): `part` is `outer` rows of
/// `chunk = part.len() / outer` bytes, and row `o` is copied to `out[o·total + at ..][..chunk]`.
/// With `at` the sum of the earlier inputs' chunks, calling this for every input in order gives
/// torch `cat(parts, dim=axis)`, where `outer` is the product of the axes before `axis` and a
/// chunk the bytes of the rest ([`crate::Call::Concat`]).
pub fn concat_part(part: &[u8], outer: usize, at: usize, total: usize, out: &mut [u8]) {
    assert!(
        outer > 0 && part.len().is_multiple_of(outer),
        "concat_part: {} bytes are not {outer} rows",
        part.len()
    );
    let chunk = part.len() / outer;
    assert!(
        at + chunk <= total && out.len() == outer * total,
        "concat_part: chunk {at}..{} of rows of {total} bytes, out has {} bytes for {outer} rows",
        at + chunk,
        out.len()
    );
    if chunk == 0 {
        return;
    }
    for (o, src) in part.chunks_exact(chunk).enumerate() {
        out[o * total + at..][..chunk].copy_from_slice(src);
    }
}

/// `generic_concat_axis_f32`: torch `cat(parts, dim=axis)`. `parts[p]` has `shapes[p]`; all
/// shapes have the same rank and agree except along `axis`; `out` has the common shape with
/// `axis` extent equal to the sum of the parts' extents.
pub fn concat_axis(parts: &[&[f32]], shapes: &[&[usize]], axis: usize, out: &mut [f32]) {
    assert_eq!(
        parts.len(),
        shapes.len(),
        "concat_axis: {} parts but {} shapes",
        parts.len(),
        shapes.len()
    );
    assert!(!parts.is_empty(), "concat_axis: no parts");
    let first = shapes[0];
    let (outer, _, inner) = split_axis(first, axis, "concat_axis");
    let mut total = 0;
    for (p, (part, shape)) in parts.iter().zip(shapes).enumerate() {
        let same = shape.len() == first.len()
            && shape
                .iter()
                .zip(first)
                .enumerate()
                .all(|(a, (s, f))| a == axis || s == f);
        assert!(same, "concat_axis: part {p} has shape {shape:?}, incompatible with {first:?} along axis {axis}");
        assert_eq!(
            part.len(),
            numel(shape),
            "concat_axis: part {p} has {} elements, shape {shape:?}",
            part.len()
        );
        total += shape[axis];
    }
    assert_eq!(
        out.len(),
        outer * total * inner,
        "concat_axis: out has {} elements, expected {}",
        out.len(),
        outer * total * inner
    );
    if out.is_empty() {
        return;
    }
    // The runtime's byte copies ([`concat_part`]), one input after the other.
    let out = out.as_mut_bytes();
    let mut at = 0;
    for (part, shape) in parts.iter().zip(shapes) {
        let chunk = shape[axis] * inner * 4;
        concat_part(part.as_bytes(), outer, at, total * inner * 4, out);
        at += chunk;
    }
}
