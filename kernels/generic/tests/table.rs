//! The kernel table: complete, named, and calling the same kernels.

mod common;

use common::*;
use edge_kernels::{generic, silu, WeightRef};
use edge_schema::DType;

#[test]
fn generic_table_names_every_slot() {
    let t = generic();
    let names = t.names();
    let mut slots: Vec<&str> = names.iter().map(|(s, _)| *s).collect();
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), names.len(), "slot names are unique");
    for needed in [
        "linear",
        "conv2d",
        "attention",
        "group_norm_stats",
        "group_norm_apply",
        "layer_norm",
        "rms_norm",
        "gelu_tanh",
        "silu",
    ] {
        assert!(slots.contains(&needed), "slot {needed}");
    }
    assert!(names.iter().all(|(_, k)| k.starts_with("generic_")));
}

#[test]
fn slots_call_the_kernels() {
    let t = generic();
    let mut rng = Rng::new(70);
    let x = rng.vec(100, 4.0);
    let (mut a, mut b) = (vec![0.0; 100], vec![0.0; 100]);
    (t.silu.run)(&x, &mut a);
    silu(&x, &mut b);
    assert_eq!(a, b);

    let w = rng.vec(30, 1.0);
    let wb = f32_bytes(&w);
    let mut out = vec![0.0; 30];
    let need = (t.linear_scratch_bytes.run)(DType::F32, 10, 10);
    let mut scratch = vec![0u8; need];
    (t.linear.run)(
        &x,
        WeightRef::row_major(DType::F32, wb.bytes()),
        None,
        &mut out,
        10,
        10,
        3,
        &mut scratch,
        None,
    );
    let want: f32 = (0..10).map(|c| x[c] * w[c]).sum();
    assert!((out[0] - want).abs() < 1e-5);
}
