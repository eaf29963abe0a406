//! Embeddings: timestep sinusoid, T5 buckets (structure), token lookup.

mod common;

use common::*;
use edge_kernels::{
    embedding, t5_position_bias, t5_relative_position_bucket, timestep_embedding, WeightRef,
};
use edge_schema::DType;

#[test]
fn timestep_embedding_matches_f64_formula() {
    let t = [0.0f32, 1.0, 250.0, 999.0];
    for (dim, flip, shift) in [(256, true, 0.0f32), (7, false, 1.0), (32, false, 1.0)] {
        let mut out = vec![f32::NAN; t.len() * dim];
        timestep_embedding(&t, dim, flip, shift, 10000.0, &mut out);
        let half = dim / 2;
        for (r, &tv) in t.iter().enumerate() {
            for k in 0..half {
                let f = (-(10000f64.ln()) * k as f64 / (half as f64 - f64::from(shift))).exp();
                let e = f64::from(tv) * f;
                let (s, c) = (e.sin(), e.cos());
                let (first, second) = if flip { (c, s) } else { (s, c) };
                // f32 rounding of the frequency is amplified by t (|t·Δf| ≤ t·f·2⁻²³·few).
                let tol = 1e-6 + 4.0 * e.abs() * f64::from(f32::EPSILON);
                assert!(
                    (f64::from(out[r * dim + k]) - first).abs() <= tol,
                    "dim {dim} t {tv} k {k}"
                );
                assert!(
                    (f64::from(out[r * dim + half + k]) - second).abs() <= tol,
                    "dim {dim} t {tv} k {k}"
                );
            }
            if dim % 2 == 1 {
                assert_eq!(out[r * dim + dim - 1], 0.0);
            }
        }
    }
}

#[test]
fn t5_buckets_structure() {
    // Exact buckets for small offsets; positive offsets in the upper half when bidirectional.
    for r in 0..8 {
        assert_eq!(t5_relative_position_bucket(-r, true, 32, 128), r as usize);
        assert_eq!(
            t5_relative_position_bucket(r, true, 32, 128),
            if r == 0 { 0 } else { 16 + r as usize }
        );
    }
    // Saturates at the last bucket of each half.
    assert_eq!(t5_relative_position_bucket(-1000, true, 32, 128), 15);
    assert_eq!(t5_relative_position_bucket(1000, true, 32, 128), 31);
    // Unidirectional: positive offsets fold to 0.
    assert_eq!(t5_relative_position_bucket(5, false, 32, 128), 0);
    assert_eq!(t5_relative_position_bucket(-1000, false, 32, 128), 31);
    // Monotone in |offset|.
    let mut last = 0;
    for r in 0..300 {
        let b = t5_relative_position_bucket(-r, true, 32, 128);
        assert!(b >= last);
        last = b;
    }
}

#[test]
fn t5_position_bias_gathers_table_rows() {
    let mut rng = Rng::new(60);
    let (heads, nb) = (3, 32);
    let table = rng.vec(nb * heads, 1.0);
    let (lq, lk) = (5, 9);
    let mut out = vec![0.0; heads * lq * lk];
    t5_position_bias(&table, heads, lq, lk, nb, 128, true, &mut out);
    for h in 0..heads {
        for i in 0..lq {
            for j in 0..lk {
                let b = t5_relative_position_bucket(j as i32 - i as i32, true, nb, 128);
                assert_eq!(out[(h * lq + i) * lk + j], table[b * heads + h]);
            }
        }
    }
}

#[test]
fn embedding_lookup_for_plain_types() {
    let mut rng = Rng::new(61);
    let (v, d) = (11, 6);
    let table = rng.vec(v * d, 1.0);
    let ids = [0, 10, 3, 3];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (bytes, vals) = match dtype {
            DType::F32 => (f32_bytes(&table), table.clone()),
            DType::F16 => f16_bytes(&table),
            _ => bf16_bytes(&table),
        };
        let mut out = vec![0.0; ids.len() * d];
        embedding(
            WeightRef::row_major(dtype, bytes.bytes()),
            &ids,
            d,
            &mut out,
        );
        for (t, &id) in ids.iter().enumerate() {
            assert_eq!(
                &out[t * d..(t + 1) * d],
                &vals[id as usize * d..(id as usize + 1) * d]
            );
        }
    }
}

#[test]
#[should_panic(expected = "outside the vocabulary")]
fn embedding_rejects_out_of_range_id() {
    let bytes = f32_bytes(&[0.0; 12]);
    let mut out = vec![0.0; 4];
    embedding(
        WeightRef::row_major(DType::F32, bytes.bytes()),
        &[3],
        4,
        &mut out,
    );
}
