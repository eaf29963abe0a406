//! Bytes → `ShardedSafetensors::open` as `model.safetensors.index.json`, in a scratch folder
//! that also holds two small valid shards (`a.safetensors` with tensors `x`, `y`;
//! `b.safetensors` with `z`), so that well-formed indexes reach the shard checks.
#![no_main]

use edge_planner::load::safetensors::ShardedSafetensors;
use edge_planner::load::TensorSource;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

/// A safetensors file holding F32 tensors `names`, each of shape [2].
fn shard(names: &[&str]) -> Vec<u8> {
    let mut header = String::from("{");
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{n}\":{{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[{},{}]}}",
            i * 8,
            i * 8 + 8
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(0u8, names.len() * 8));
    out
}

fuzz_target!(|data: &[u8]| {
    static SHARDS: std::sync::Once = std::sync::Once::new();
    SHARDS.call_once(|| {
        common::write_scratch("a.safetensors", &shard(&["x", "y"]));
        common::write_scratch("b.safetensors", &shard(&["z"]));
    });
    let path = common::write_scratch("model.safetensors.index.json", data);
    if let Ok(s) = ShardedSafetensors::open(&path) {
        for name in s.names() {
            let _ = s.tensor(&name);
        }
    }
});
