//! Data movement kernels against index-by-index references.

mod common;

use common::*;
use edge_kernels::{concat_axis, permute, slice_axis, upsample_nearest2x};

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// Unravels `flat` in `shape`.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = flat % shape[a];
        flat /= shape[a];
    }
    idx
}

#[test]
fn permute_matches_index_reference() {
    let mut rng = Rng::new(50);
    let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![5], vec![0]),
        (vec![3, 4], vec![1, 0]),
        (vec![2, 3, 4], vec![2, 0, 1]),
        // PixArt unpatchify: [h, w, p, q, c] -> [c, h, p, w, q]
        (vec![4, 6, 2, 2, 8], vec![4, 0, 2, 1, 3]),
        (vec![2, 3, 1, 4, 5, 2], vec![5, 3, 1, 0, 4, 2]),
        (vec![130, 129], vec![1, 0]), // more than one chunk of output
    ];
    for (shape, perm) in cases {
        let n: usize = shape.iter().product();
        let x = rng.vec(n, 1.0);
        let mut out = vec![0.0; n];
        permute(&x, &shape, &perm, &mut out);
        let oshape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
        let st = strides(&shape);
        for (o, v) in out.iter().enumerate() {
            let oi = unravel(o, &oshape);
            let mut src = 0;
            for (a, &pa) in perm.iter().enumerate() {
                src += oi[a] * st[pa];
            }
            assert_eq!(*v, x[src], "shape {shape:?} perm {perm:?} out {o}");
        }
    }
}

#[test]
#[should_panic(expected = "not a permutation")]
fn permute_rejects_repeated_axis() {
    let mut out = vec![0.0; 6];
    permute(&[0.0; 6], &[2, 3], &[1, 1], &mut out);
}

#[test]
fn slice_then_concat_roundtrips() {
    let mut rng = Rng::new(51);
    let shape = [3, 10, 4];
    let x = rng.vec(120, 1.0);
    for axis in 0..3 {
        let ext = shape[axis];
        let cut = ext / 3 + 1;
        let mut s1 = shape;
        s1[axis] = cut;
        let mut s2 = shape;
        s2[axis] = ext - cut;
        let mut a = vec![0.0; s1.iter().product()];
        let mut b = vec![0.0; s2.iter().product()];
        slice_axis(&x, &shape, axis, 0, cut, &mut a);
        slice_axis(&x, &shape, axis, cut, ext - cut, &mut b);
        // Check one slice element by element.
        for (o, v) in b.iter().enumerate() {
            let mut idx = unravel(o, &s2);
            idx[axis] += cut;
            let st = strides(&shape);
            let src: usize = idx.iter().zip(&st).map(|(i, s)| i * s).sum();
            assert_eq!(*v, x[src]);
        }
        let mut back = vec![0.0; 120];
        concat_axis(&[&a, &b], &[&s1, &s2], axis, &mut back);
        assert_eq!(back, x, "axis {axis}");
    }
}

#[test]
fn upsample_nearest2x_matches_reference() {
    let mut rng = Rng::new(52);
    for (c, h, w) in [(1, 1, 1), (3, 5, 7), (2, 8, 8)] {
        let x = rng.vec(c * h * w, 1.0);
        let mut out = vec![0.0; 4 * c * h * w];
        upsample_nearest2x(&x, c, h, w, &mut out);
        for ch in 0..c {
            for y in 0..2 * h {
                for xx in 0..2 * w {
                    assert_eq!(
                        out[(ch * 2 * h + y) * 2 * w + xx],
                        x[(ch * h + y / 2) * w + xx / 2]
                    );
                }
            }
        }
    }
}
