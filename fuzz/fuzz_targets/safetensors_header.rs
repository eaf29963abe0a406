//! Bytes → the planner's safetensors reader (`SafetensorsFile::open`, via a scratch file),
//! then every tensor read through `TensorSource::tensor`.
#![no_main]

use edge_planner::load::safetensors::SafetensorsFile;
use edge_planner::load::TensorSource;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::write_scratch("model.safetensors", data);
    if let Ok(f) = SafetensorsFile::open(&path) {
        for name in f.names() {
            if let Ok(Some(t)) = f.tensor(&name) {
                let elems: usize = t.shape.iter().product();
                assert_eq!(
                    Some(t.data.len() as u64),
                    t.dtype.bytes_for(elems as u64),
                    "{name}"
                );
            }
        }
    }
});
