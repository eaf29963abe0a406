//! The position-encoding kernels of `edge-kernels` against the pixart-sigma-tiny fixtures:
//! T5 relative-position buckets and bias (`t5_trace.safetensors`, computed by transformers) and
//! the timestep sinusoid (`transformer_trace_ns_t500_long.safetensors`, computed by diffusers).

use std::path::Path;

use edge_e2e::{fixture, read_safetensors};
use edge_kernels::{t5_position_bias, t5_relative_position_bucket, timestep_embedding};

/// `(num_buckets, max_distance, heads)` from the T5 config of the fixture.
fn t5_config() -> (usize, usize, usize) {
    let path = fixture("pixart-sigma-tiny/text_encoder/config.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let field = |name: &str| {
        v[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: field {name} missing or not an integer", path.display()))
            as usize
    };
    (
        field("relative_attention_num_buckets"),
        field("relative_attention_max_distance"),
        field("num_heads"),
    )
}

/// The block-0 relative attention bias table `[num_buckets, heads]`, from the shard that the
/// index names.
fn relative_attention_table() -> Vec<f32> {
    const NAME: &str = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    let dir = fixture("pixart-sigma-tiny/text_encoder");
    let index_path = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index_path)
        .unwrap_or_else(|e| panic!("{}: {e}", index_path.display()));
    let index: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", index_path.display()));
    let shard = index["weight_map"][NAME]
        .as_str()
        .unwrap_or_else(|| panic!("{}: weight_map has no {NAME}", index_path.display()));
    let tensors = read_safetensors(&dir.join(Path::new(shard)));
    tensors
        .get(NAME)
        .unwrap_or_else(|| panic!("{shard}: no tensor {NAME}"))
        .data
        .clone()
}

#[test]
fn relative_position_buckets_match_transformers() {
    let (num_buckets, max_distance, _) = t5_config();
    let trace = read_safetensors(&fixture("pixart-sigma-tiny/reference/t5_trace.safetensors"));
    let rel = &trace["relative_position"].data;
    let buckets = &trace["relative_position_bucket"].data;
    assert_eq!(rel.len(), 599, "relative positions −299…299");
    for (&r, &b) in rel.iter().zip(buckets) {
        let ours = t5_relative_position_bucket(r as i32, true, num_buckets, max_distance);
        assert_eq!(ours, b as usize, "relative position {r}");
    }
}

#[test]
fn position_bias_16x16_matches_compute_bias() {
    let (num_buckets, max_distance, heads) = t5_config();
    let table = relative_attention_table();
    assert_eq!(table.len(), num_buckets * heads);
    let trace = read_safetensors(&fixture("pixart-sigma-tiny/reference/t5_trace.safetensors"));
    let want = &trace["position_bias_16x16"];
    assert_eq!(want.shape, vec![1, heads, 16, 16]);
    let mut out = vec![0.0; heads * 16 * 16];
    t5_position_bias(
        &table,
        heads,
        16,
        16,
        num_buckets,
        max_distance,
        true,
        &mut out,
    );
    // A gather: the values must be the table's, bit for bit.
    for (i, (a, b)) in out.iter().zip(&want.data).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "element {i}: {a} vs {b}");
    }
}

#[test]
fn timestep_sinusoid_matches_diffusers() {
    let case = read_safetensors(&fixture(
        "pixart-sigma-tiny/reference/transformer_ns_t500_long.safetensors",
    ));
    let trace = read_safetensors(&fixture(
        "pixart-sigma-tiny/reference/transformer_trace_ns_t500_long.safetensors",
    ));
    let t = &case["timestep"].data;
    let want = &trace["timestep_sinusoid"];
    assert_eq!(want.shape, vec![t.len(), 256]);
    // PixArt: Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0), max_period 10000.
    let mut out = vec![0.0; t.len() * 256];
    timestep_embedding(t, 256, true, 0.0, 10000.0, &mut out);
    // Values are in [−1, 1]. torch evaluates exp with SLEEF (≤ 1 ulp, not always correctly
    // rounded): at t = 500, k = 13 its frequency is one f32 ulp above the correctly rounded
    // exp(−ln(10⁴)·13/128) that libm returns, which moves the angle by t·ulp(f) ≈ 1.5e-5.
    // Every element must agree to 1e-6, or to that one-ulp bound on a few elements at most.
    let mut loose = 0;
    for (i, (a, b)) in out.iter().zip(&want.data).enumerate() {
        let diff = (f64::from(*a) - f64::from(*b)).abs();
        if diff <= 1e-6 {
            continue;
        }
        loose += 1;
        let (row, k) = (i / 256, i % 128);
        let freq = (-(10000f64.ln()) * k as f64 / 128.0).exp();
        let one_ulp = f64::from(t[row]) * freq * f64::from(f32::EPSILON) * 1.01 + 1e-6;
        assert!(
            diff <= one_ulp,
            "element {i}: {a} vs {b}, difference {diff} > {one_ulp}"
        );
    }
    assert!(loose <= 4, "{loose} elements differ by more than 1e-6");
}
