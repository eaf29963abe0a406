//! Helpers for the end-to-end tests: fixture paths, safetensors readers, comparison metrics,
//! and compiled plans cached per test binary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `tests/fixtures/<rel>`.
pub fn fixture(rel: &str) -> PathBuf {
    repo().join("tests/fixtures").join(rel)
}

/// `demo/<rel>`.
pub fn demo(rel: &str) -> PathBuf {
    repo().join("demo").join(rel)
}

/// A tensor read from a reference file, converted to f64 for comparisons.
#[derive(Clone, Debug)]
pub struct RefTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Reads every tensor of a safetensors file (F32, F64, I32, I64 and U8 converted to f32).
pub fn read_safetensors(path: &Path) -> HashMap<String, RefTensor> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = HashMap::new();
    for (name, t) in st.tensors() {
        let d = t.data();
        let data: Vec<f32> = match t.dtype() {
            safetensors::Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            safetensors::Dtype::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                .collect(),
            safetensors::Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            safetensors::Dtype::U8 => d.iter().map(|&b| f32::from(b)).collect(),
            safetensors::Dtype::F64 => d
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            other => panic!(
                "{}: tensor {name} has unsupported dtype {other:?}",
                path.display()
            ),
        };
        out.insert(
            name.clone(),
            RefTensor {
                shape: t.shape().to_vec(),
                data,
            },
        );
    }
    out
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs())
        .fold(0.0, f64::max)
}

/// Largest absolute value.
pub fn max_abs(a: &[f32]) -> f64 {
    a.iter().map(|&x| f64::from(x).abs()).fold(0.0, f64::max)
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Compiles `model` for `sizes` once per test binary and returns the plan bytes.
pub fn compiled_plan(model: &Path, sizes: &[(u32, u32)], seq: Option<u32>) -> Vec<u8> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let key = format!("{}|{sizes:?}|{seq:?}", model.display());
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(b) = cache.lock().unwrap().get(&key) {
        return b.clone();
    }
    let opts = edge_planner::CompileOptions {
        sizes: sizes.to_vec(),
        max_sequence_length: seq,
        ..Default::default()
    };
    let mut c = edge_planner::compile_folder(model, &opts)
        .unwrap_or_else(|e| panic!("compiling {}: {e}", model.display()));
    let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble");
    cache.lock().unwrap().insert(key, bytes.clone());
    bytes
}

/// Checks `ours` against `reference` as the issue states for single forwards:
/// max |diff| ≤ tol × max(1, max |reference|).
pub fn assert_close(what: &str, ours: &[f32], reference: &[f32], tol: f64) {
    let d = max_abs_diff(ours, reference);
    let bound = tol * max_abs(reference).max(1.0);
    assert!(
        d <= bound,
        "{what}: max abs diff {d:e} exceeds {bound:e} (max |ref| {:e})",
        max_abs(reference)
    );
}

/// Checks an RGB8 image against the reference's `image_uint8` (as f32 levels): at least
/// 99.5 % of the channel values within one level, none more than 3 off.
pub fn assert_png_close(what: &str, ours: &[u8], reference: &[f32]) {
    assert_eq!(ours.len(), reference.len(), "{what}: image sizes differ");
    let (mut over_one, mut worst) = (0usize, 0i32);
    for (&a, &b) in ours.iter().zip(reference) {
        let d = (i32::from(a) - b as i32).abs();
        worst = worst.max(d);
        over_one += usize::from(d > 1);
    }
    let within = 1.0 - over_one as f64 / ours.len() as f64;
    assert!(
        within >= 0.995 && worst <= 3,
        "{what}: {within:.4} of channel values within 1 level, worst {worst}"
    );
}

/// `max |ours − reference| / max(1, max |reference|)`, the figure the closing notes quote.
pub fn rel_max_err(ours: &[f32], reference: &[f32]) -> f64 {
    max_abs_diff(ours, reference) / max_abs(reference).max(1.0)
}

/// The fixtures' run: "a lovely cat" / "", guidance 4.5, 64×64, `steps` steps of `method`
/// from the unit noise `init` (seed 0, torch's generator for anything it draws).
pub fn cat_params(
    steps: usize,
    method: edge_runtime::sampler::SamplingMethod,
    init: Option<Vec<f32>>,
) -> edge_runtime::GenerateParams {
    edge_runtime::GenerateParams {
        prompt: "a lovely cat".into(),
        seed: 0,
        method,
        init_latents: init,
        ..demo_params(steps)
    }
}

/// Compiles the fixture pipeline `name` with `opts` and opens the assembled plan (verified);
/// also returns the plan's length in bytes.
pub fn fixture_plan(
    name: &str,
    opts: &edge_planner::CompileOptions,
) -> (edge_runtime::Plan, usize) {
    let mut c = edge_planner::compile::compile_inputs(
        Some(&fixture(name)),
        &edge_planner::compile::ComponentFiles::default(),
        opts,
    )
    .unwrap_or_else(|e| panic!("compile {name}: {e}"));
    let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble");
    let len = bytes.len();
    (
        edge_runtime::Plan::from_bytes(&bytes).expect("plan verifies"),
        len,
    )
}

/// `steps` DPM steps of the demo model at 64×64 from seed 7, with guidance.
pub fn demo_params(steps: usize) -> edge_runtime::GenerateParams {
    edge_runtime::GenerateParams {
        prompt: "a large red circle on a blue background".into(),
        negative_prompt: String::new(),
        steps,
        cfg_scale: 4.5,
        method: edge_runtime::sampler::SamplingMethod::DpmPp2m,
        seed: 7,
        width: 64,
        height: 64,
        rng: Default::default(),
        karras: None,
        init_latents: None,
        init_image: None,
        decoder: Default::default(),
        preview: None,
    }
}

/// The fixture pipeline `name` compiled for 64×64 and 64×96 with matrices of type `quant`
/// (`None`: as stored), opened and verified.
pub fn sized_plan(name: &str, quant: Option<edge_schema::DType>) -> edge_runtime::Plan {
    let opts = edge_planner::CompileOptions {
        sizes: vec![(64, 64), (64, 96)],
        policy: edge_planner::pack::PackPolicy {
            default: quant,
            rules: Vec::new(),
        },
        ..Default::default()
    };
    let mut c = edge_planner::compile_folder(&fixture(name), &opts).expect("compiles");
    let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble");
    edge_runtime::Plan::from_bytes(&bytes).expect("plan verifies")
}
