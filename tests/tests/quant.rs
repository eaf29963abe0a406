//! The ggml block formats against gguf-py's reference vectors
//! (`fixtures/gguf-quant-vectors/`, fixtures README §7).
//!
//! For F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, `quantize_row(input_f32)` must equal
//! `T.bytes` byte for byte and `dequantize_row(T.bytes)` must equal `T.dequant` bit for bit.
//! For Q2_K … Q6_K only the dequantization has a reference.

use std::path::PathBuf;

use edge_kernels::quant::{
    activation_row_bytes, dequantize_row, quantize_activation_row, quantize_row, vec_dot,
};
use edge_schema::DType;
use safetensors::{Dtype, SafeTensors};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf-quant-vectors")
}

struct Vectors {
    bytes: Vec<u8>,
    manifest: serde_json::Value,
}

impl Vectors {
    fn load() -> Vectors {
        let dir = fixture_dir();
        let bytes = std::fs::read(dir.join("quant_vectors.safetensors"))
            .expect("read quant_vectors.safetensors");
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("manifest.json")).expect("read manifest.json"),
        )
        .expect("parse manifest.json");
        Vectors { bytes, manifest }
    }

    fn st(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("parse quant_vectors.safetensors")
    }

    fn rows(&self) -> usize {
        self.manifest["rows"].as_u64().expect("manifest.rows") as usize
    }

    fn cols(&self) -> usize {
        self.manifest["cols"].as_u64().expect("manifest.cols") as usize
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        let st = self.st();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), Dtype::F32, "{name}");
        assert_eq!(t.shape(), &[self.rows(), self.cols()], "{name}");
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn u8s(&self, name: &str) -> Vec<u8> {
        let st = self.st();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), Dtype::U8, "{name}");
        assert_eq!(t.shape()[0], self.rows(), "{name}");
        t.data().to_vec()
    }
}

/// Manifest type key (`Q4_0`, `Q2_K`, `BF16`) → DType.
fn dtype_of(key: &str) -> DType {
    DType::from_name(key).unwrap_or_else(|| panic!("manifest type {key} is not a DType"))
}

fn types_with_mode(v: &Vectors, quantize: bool) -> Vec<String> {
    let types = v.manifest["types"].as_object().expect("manifest.types");
    types
        .iter()
        .filter(|(_, t)| t["mode"].as_str().unwrap_or("").starts_with("quantize") == quantize)
        .map(|(k, _)| k.clone())
        .collect()
}

/// Manifest block and type sizes agree with DType.
#[test]
fn manifest_sizes_agree_with_dtype() {
    let v = Vectors::load();
    let types = v.manifest["types"].as_object().expect("manifest.types");
    assert_eq!(types.len(), 12);
    for (key, t) in types {
        let d = dtype_of(key);
        assert_eq!(
            t["block_size"].as_u64(),
            Some(d.block_size() as u64),
            "{key}"
        );
        assert_eq!(t["type_size"].as_u64(), Some(d.type_size() as u64), "{key}");
        assert_eq!(
            t["bytes_per_row"].as_u64(),
            d.bytes_for(v.cols() as u64),
            "{key}"
        );
    }
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() {
    let v = Vectors::load();
    let input = v.f32s("input_f32");
    let names = types_with_mode(&v, true);
    assert_eq!(names.len(), 7, "{names:?}");
    for key in names {
        let d = dtype_of(&key);
        let expected = v.u8s(&format!("{key}.bytes"));
        let row_bytes = d.bytes_for(v.cols() as u64).expect("row bytes") as usize;
        assert_eq!(expected.len(), v.rows() * row_bytes, "{key}");
        for (r, (x, want)) in input
            .chunks_exact(v.cols())
            .zip(expected.chunks_exact(row_bytes))
            .enumerate()
        {
            let mut got = vec![0u8; row_bytes];
            quantize_row(d, x, &mut got);
            if got != want {
                let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "{key} row {r} ({}): first differing byte {first}: got {} want {}",
                    v.manifest["row_kinds"][r], got[first], want[first]
                );
            }
        }
    }
}

#[test]
fn dequantize_matches_gguf_py_exactly() {
    let v = Vectors::load();
    let types = v.manifest["types"].as_object().expect("manifest.types");
    for key in types.keys() {
        let d = dtype_of(key);
        let bytes = v.u8s(&format!("{key}.bytes"));
        let want = v.f32s(&format!("{key}.dequant"));
        let mut got = vec![0f32; want.len()];
        let row_bytes = bytes.len() / v.rows();
        for (src, dst) in bytes
            .chunks_exact(row_bytes)
            .zip(got.chunks_exact_mut(v.cols()))
        {
            dequantize_row(d, src, dst);
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{key} element {i} (row {}): got {g} want {w}",
                i / v.cols()
            );
        }
    }
}

/// The K-quant fixture bytes are valid blocks: the dot product of each with a quantized
/// activation agrees with the f64 dot of the reference dequantization within the activation's
/// Q8_K rounding (half a quant step per element).
#[test]
fn k_quant_vec_dot_against_reference_dequant() {
    let v = Vectors::load();
    let input = v.f32s("input_f32");
    let act_row = &input[..v.cols()];
    for key in types_with_mode(&v, false) {
        let d = dtype_of(&key);
        let bytes = v.u8s(&format!("{key}.bytes"));
        let deq = v.f32s(&format!("{key}.dequant"));
        let row_bytes = bytes.len() / v.rows();
        let mut act = vec![0u8; activation_row_bytes(d, v.cols())];
        quantize_activation_row(d, act_row, &mut act);
        let amax = act_row.iter().fold(0f32, |a, x| a.max(x.abs())) as f64;
        for (r, (w, wd)) in bytes
            .chunks_exact(row_bytes)
            .zip(deq.chunks_exact(v.cols()))
            .enumerate()
        {
            let exact: f64 = wd
                .iter()
                .zip(act_row)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            let wsum: f64 = wd.iter().map(|a| (*a as f64).abs()).sum();
            let tol = wsum * amax / 127.0 * 0.5 + 1e-4 * exact.abs() + 1e-6;
            let got = vec_dot(d, v.cols(), w, &act) as f64;
            assert!(
                (got - exact).abs() <= tol,
                "{key} row {r}: {got} vs {exact} (tol {tol})"
            );
        }
    }
}
