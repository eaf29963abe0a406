//! Bytes → the planner's LoRA reader (`LoraFile::open`, via a scratch file), then matched to
//! a small model's layer table and merged into a weight: every outcome is a value or an
//! error, never a panic.
#![no_main]

use std::collections::BTreeMap;

use edge_planner::lora::{LoraFile, LoraMerge};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::write_scratch("lora.safetensors", data);
    let Ok(file) = LoraFile::open(&path) else {
        return;
    };
    let layers = BTreeMap::from([
        ("transformer_blocks.0.attn1.to_q.weight".to_string(), [64u64, 64]),
        ("transformer_blocks.0.attn1.to_out.0.weight".to_string(), [64, 64]),
        ("transformer_blocks.0.ff.net.0.proj.weight".to_string(), [256, 64]),
    ]);
    if let Ok(merge) = LoraMerge::bind(vec![(file, 0.8)], &layers) {
        for (name, [o, i]) in &layers {
            let mut w = vec![0f32; (o * i) as usize];
            merge.apply(name, &mut w);
        }
    }
});
