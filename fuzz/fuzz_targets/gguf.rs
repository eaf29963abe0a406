//! Bytes → `GgufFile::from_bytes`, then every key and every tensor read (raw bytes and the
//! `TensorSource` view).
#![no_main]

use edge_planner::load::gguf::GgufFile;
use edge_planner::load::TensorSource;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) {
        for (k, v) in &g.metadata {
            let _ = (
                g.get_str(k),
                v.as_u64(),
                v.as_i64(),
                v.as_f64(),
                v.as_bool(),
            );
        }
        for t in &g.tensors {
            if let Some(b) = g.tensor_bytes(&t.name) {
                assert_eq!(b.len() as u64, t.n_bytes, "{}", t.name);
            }
        }
        for name in g.names() {
            let _ = g.tensor(&name);
        }
        let _ = format!("{g:?}");
    }
});
