//! Model-file formats on the compile side: GGUF transformers (F16, Q8_0, Q4_0) in the
//! original PixArt layout replacing a folder's transformer, an original-layout safetensors
//! conversion of a diffusers transformer, `--quant` plans, and clear errors for bad files.
//!
//! Expected values come from the fixtures: `gguf_<T>_transformer_sq_t999_cat` and
//! `pipeline_gguf_<T>_dpm_4_cat_64x64` (diffusers with the GGUF weights dequantised by gguf-py).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use edge_e2e::*;
use edge_planner::compile::{compile_inputs, compile_inputs_to_file, Compiled, ComponentFiles};
use edge_planner::load::gguf::GgufFile;
use edge_planner::pack::PackPolicy;
use edge_planner::CompileOptions;
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{GenerateParams, Plan, Session};
use edge_schema::plan::{Isa, ModelFamily, PackLayout, Target};
use edge_schema::DType;

const SIGMA: &str = "pixart-sigma-tiny";
const ALPHA: &str = "pixart-alpha-tiny";
const GGUF_PREFIX: &str = "model.diffusion_model.";

fn gguf(name: &str, ty: &str) -> PathBuf {
    fixture(&format!("{name}/gguf/{name}-{ty}.gguf"))
}

fn opts(quant: Option<DType>) -> CompileOptions {
    CompileOptions {
        sizes: vec![(64, 64)],
        policy: PackPolicy {
            default: quant,
            rules: vec![],
        },
        ..Default::default()
    }
}

fn with_model(path: &Path) -> ComponentFiles {
    ComponentFiles {
        diffusion_model: Some(path.to_path_buf()),
        ..Default::default()
    }
}

/// Compiles and assembles; returns the compiled tables and the verified plan.
fn build(dir: Option<&Path>, files: &ComponentFiles, quant: Option<DType>) -> (Compiled, Plan) {
    let mut c = compile_inputs(dir, files, &opts(quant)).unwrap_or_else(|e| panic!("compile: {e}"));
    let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble");
    let plan = Plan::from_bytes(&bytes).expect("plan verifies");
    (c, plan)
}

fn compile_err(dir: Option<&Path>, files: &ComponentFiles) -> String {
    match compile_inputs(dir, files, &opts(None)) {
        Ok(_) => panic!("compiling {:?} should fail", files.diffusion_model),
        Err(e) => {
            eprintln!("expected error: {e}");
            e.to_string()
        }
    }
}

/// The denoiser output (noise half) for `transformer_sq_t999_cat`'s inputs.
fn transformer_sq_t999(plan: &Plan, name: &str) -> Vec<f32> {
    let r = read_safetensors(&fixture(&format!(
        "{name}/reference/transformer_sq_t999_cat.safetensors"
    )));
    let x = &r["hidden_states"];
    let mut s = Session::new(plan, edge_kernels::generic(), None).unwrap();
    let size = plan.meta().size(64, 64).expect("64x64").clone();
    let mut out = vec![0f32; x.data.len()];
    let cond = edge_runtime::pipeline::condition(
        &mut s,
        r["encoder_hidden_states"].data.clone(),
        r["encoder_attention_mask"].data.clone(),
    )
    .unwrap();
    edge_runtime::pipeline::denoise(
        &mut s,
        &size,
        &x.data,
        r["timestep"].data[0],
        &cond,
        &mut out,
    )
    .unwrap();
    out
}

/// The first 4 (noise) channels of a `[1, 8, h, w]` reference output.
fn noise_half(r: &RefTensor) -> Vec<f32> {
    r.data[..r.data.len() / 2].to_vec()
}

fn gguf_transformer_ref(name: &str, ty: &str) -> Vec<f32> {
    let r = read_safetensors(&fixture(&format!(
        "{name}/reference/gguf_{ty}_transformer_sq_t999_cat.safetensors"
    )));
    noise_half(&r["output"])
}

/// Final latents of the 4-step DPM++ run from `reference`'s initial noise (prompt "a lovely cat",
/// CFG 4.5, 64×64).
fn dpm4_latents(plan: &Plan, name: &str, reference: &str) -> (Vec<f32>, Vec<f32>) {
    let r = read_safetensors(&fixture(&format!(
        "{name}/reference/{reference}.safetensors"
    )));
    let mut s = Session::new(plan, edge_kernels::generic(), None).unwrap();
    let params = GenerateParams {
        prompt: "a lovely cat".into(),
        negative_prompt: String::new(),
        steps: 4,
        cfg_scale: 4.5,
        method: SamplingMethod::DpmPp2m,
        seed: 0,
        width: 64,
        height: 64,
        rng: Default::default(),
        karras: None,
        init_latents: Some(r["initial_noise"].data.clone()),
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    let out = edge_runtime::generate(&mut s, &params, &mut |_| {}).unwrap();
    (out.latents, r["final_latents"].data.clone())
}

/// Plan tensor bytes by entry name.
fn table_bytes<'a>(c: &'a Compiled, name: &str) -> (&'a [u8], DType) {
    let i = c
        .table
        .entries
        .iter()
        .position(|e| e.name == name)
        .unwrap_or_else(|| panic!("plan has no tensor {name}"));
    (&c.table.data[i], c.table.entries[i].dtype)
}

fn qkv_name(n: usize) -> String {
    ["to_q", "to_k", "to_v"]
        .map(|p| format!("transformer_blocks.{n}.attn1.{p}.weight"))
        .join("+")
}

fn kv_name(n: usize) -> String {
    ["to_k", "to_v"]
        .map(|p| format!("transformer_blocks.{n}.attn2.{p}.weight"))
        .join("+")
}

// ---------------------------------------------------------------------------------------------
// (a) GGUF F16 replacing the folder's transformer
// ---------------------------------------------------------------------------------------------

#[test]
fn gguf_f16_diffusion_model_matches_reference() {
    let folder = fixture(SIGMA);
    let (_, plan) = build(Some(&folder), &with_model(&gguf(SIGMA, "F16")), None);
    let ours = transformer_sq_t999(&plan, SIGMA);
    assert_close(
        "F16 GGUF transformer sq_t999",
        &ours,
        &gguf_transformer_ref(SIGMA, "F16"),
        1e-4,
    );

    // The whole pipeline stays close to the float32 plan's (F16 weights: manifest gives
    // 4.2e-4 rel-L2 for one forward against float32).
    let (_, f32_plan) = build(Some(&folder), &ComponentFiles::default(), None);
    let (lat16, _) = dpm4_latents(&plan, SIGMA, "pipeline_dpm_4_cat_64x64");
    let (lat32, reference) = dpm4_latents(&f32_plan, SIGMA, "pipeline_dpm_4_cat_64x64");
    let d = rel_l2(&lat16, &lat32);
    eprintln!(
        "F16 GGUF dpm_4 latents: rel L2 vs F32 plan {d:e}; F32 plan vs diffusers {:e}",
        rel_l2(&lat32, &reference)
    );
    assert!(
        d < 1.5e-3,
        "F16 GGUF latents rel L2 vs F32 plan {d:e} (measured 7.4e-4)"
    );
}

// ---------------------------------------------------------------------------------------------
// (b) Quantized GGUF: pass-through bytes, forward and pipeline vs the dequantised references
// ---------------------------------------------------------------------------------------------

/// `(type, transformer bound (× max(1, max|ref|)), pipeline rel-L2 bound)`: twice the values
/// measured (see BENCHMARKS.md, "Quantized plans"); our matmuls also quantize activations to
/// Q8_0, which the dequantised-weight references do not.
fn quantized_case(ty: &str, dtype: DType, fwd_bound: f64, pipe_bound: f64) {
    let folder = fixture(SIGMA);
    let path = gguf(SIGMA, ty);
    let (c, plan) = build(Some(&folder), &with_model(&path), None);

    // Fused quantized tensors pass through unchanged (no requantization).
    let g = GgufFile::open(&path).unwrap();
    for n in 0..2 {
        for (plan_name, orig) in [
            (qkv_name(n), "attn.qkv"),
            (kv_name(n), "cross_attn.kv_linear"),
        ] {
            let gname = format!("{GGUF_PREFIX}blocks.{n}.{orig}.weight");
            let (bytes, d) = table_bytes(&c, &plan_name);
            assert_eq!(d, dtype, "{plan_name} stored type");
            assert_eq!(g.tensor_info(&gname).unwrap().dtype, dtype);
            assert!(
                bytes == g.tensor_bytes(&gname).unwrap(),
                "{plan_name} bytes differ from {gname}"
            );
        }
    }
    let (bytes, d) = table_bytes(&c, "transformer_blocks.1.ff.net.0.proj.weight");
    assert_eq!(d, dtype);
    assert!(
        bytes
            == g.tensor_bytes(&format!("{GGUF_PREFIX}blocks.1.mlp.fc1.weight"))
                .unwrap()
    );

    let ours = transformer_sq_t999(&plan, SIGMA);
    let reference = gguf_transformer_ref(SIGMA, ty);
    let rel = max_abs_diff(&ours, &reference) / max_abs(&reference).max(1.0);
    eprintln!(
        "{ty} GGUF transformer sq_t999: max abs diff / max(1, max|ref|) = {rel:e}, rel L2 {:e}",
        rel_l2(&ours, &reference)
    );
    assert_close(
        &format!("{ty} GGUF transformer sq_t999"),
        &ours,
        &reference,
        fwd_bound,
    );

    let (lat, reference) =
        dpm4_latents(&plan, SIGMA, &format!("pipeline_gguf_{ty}_dpm_4_cat_64x64"));
    let d = rel_l2(&lat, &reference);
    eprintln!("{ty} GGUF dpm_4 final latents: rel L2 vs diffusers {d:e}");
    assert!(
        d <= pipe_bound,
        "{ty} GGUF dpm_4 latents rel L2 {d:e} > {pipe_bound:e}"
    );
}

#[test]
fn gguf_q8_0_passes_through_and_matches_reference() {
    quantized_case("Q8_0", DType::Q8_0, Q8_FWD, Q8_PIPE);
}

#[test]
fn gguf_q4_0_passes_through_and_matches_reference() {
    quantized_case("Q4_0", DType::Q4_0, Q4_FWD, Q4_PIPE);
}

// Measured (generic kernels): Q8_0 forward 7.18e-3, pipeline 2.44e-2; Q4_0 forward 7.90e-3,
// pipeline 2.37e-2. Bounds are twice these.
const Q8_FWD: f64 = 1.5e-2;
const Q8_PIPE: f64 = 4.9e-2;
const Q4_FWD: f64 = 1.6e-2;
const Q4_PIPE: f64 = 4.8e-2;

// ---------------------------------------------------------------------------------------------
// (c) The same transformer in the original layout (safetensors) gives the same plan
// ---------------------------------------------------------------------------------------------

/// A safetensors tensor held in memory.
struct Owned {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &Owned {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn read_all(path: &Path) -> BTreeMap<String, Owned> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                Owned {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                    data: t.data().to_vec(),
                },
            )
        })
        .collect()
}

fn write_all(path: &Path, tensors: &BTreeMap<String, Owned>) {
    let views: Vec<(&String, &Owned)> = tensors.iter().collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Writes `tensors` (all F32) as a minimal GGUF v3 file: no metadata, default alignment 32,
/// `ne` the reversed PyTorch shape (the layout of the `gguf` Python package's writer).
fn write_gguf_f32(path: &Path, tensors: &BTreeMap<String, Owned>) {
    fn align(x: usize) -> usize {
        x.div_ceil(32) * 32
    }
    let mut head: Vec<u8> = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes());
    let mut offset = 0usize;
    for (name, t) in tensors {
        assert_eq!(t.dtype, safetensors::Dtype::F32, "{name}");
        head.extend_from_slice(&(name.len() as u64).to_le_bytes());
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            head.extend_from_slice(&(d as u64).to_le_bytes());
        }
        head.extend_from_slice(&0u32.to_le_bytes());
        head.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = align(offset + t.data.len());
    }
    head.resize(align(head.len()), 0);
    for t in tensors.values() {
        head.extend_from_slice(&t.data);
        head.resize(align(head.len()), 0);
    }
    std::fs::write(path, head).unwrap();
}

/// Concatenates tensors along axis 0.
fn cat0(parts: &[&Owned]) -> Owned {
    let mut shape = parts[0].shape.clone();
    shape[0] = parts.iter().map(|p| p.shape[0]).sum();
    Owned {
        dtype: parts[0].dtype,
        shape,
        data: parts.iter().flat_map(|p| p.data.iter().copied()).collect(),
    }
}

/// Converts a diffusers PixArt transformer (names → tensors) to the original layout, as the
/// fixture README §6 tabulates it.
fn to_original(d: &BTreeMap<String, Owned>, prefix: &str) -> BTreeMap<String, Owned> {
    let mut out = BTreeMap::new();
    let mut put = |name: String, t: Owned| {
        out.insert(format!("{prefix}{name}"), t);
    };
    let copy = |n: &str| -> Owned {
        let t = &d[n];
        Owned {
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: t.data.clone(),
        }
    };
    for sfx in ["weight", "bias"] {
        for (orig, diff) in [
            ("x_embedder.proj", "pos_embed.proj"),
            (
                "t_embedder.mlp.0",
                "adaln_single.emb.timestep_embedder.linear_1",
            ),
            (
                "t_embedder.mlp.2",
                "adaln_single.emb.timestep_embedder.linear_2",
            ),
            ("t_block.1", "adaln_single.linear"),
            ("y_embedder.y_proj.fc1", "caption_projection.linear_1"),
            ("y_embedder.y_proj.fc2", "caption_projection.linear_2"),
            ("final_layer.linear", "proj_out"),
        ] {
            put(format!("{orig}.{sfx}"), copy(&format!("{diff}.{sfx}")));
        }
    }
    put(
        "final_layer.scale_shift_table".into(),
        copy("scale_shift_table"),
    );
    let depth = (0..)
        .take_while(|n| d.contains_key(&format!("transformer_blocks.{n}.scale_shift_table")))
        .count();
    assert!(depth > 0);
    for n in 0..depth {
        let b = format!("transformer_blocks.{n}");
        put(
            format!("blocks.{n}.scale_shift_table"),
            copy(&format!("{b}.scale_shift_table")),
        );
        for sfx in ["weight", "bias"] {
            let p = |s: &str| &d[&format!("{b}.{s}.{sfx}")];
            put(
                format!("blocks.{n}.attn.qkv.{sfx}"),
                cat0(&[p("attn1.to_q"), p("attn1.to_k"), p("attn1.to_v")]),
            );
            put(
                format!("blocks.{n}.cross_attn.kv_linear.{sfx}"),
                cat0(&[p("attn2.to_k"), p("attn2.to_v")]),
            );
            for (orig, diff) in [
                ("attn.proj", "attn1.to_out.0"),
                ("cross_attn.q_linear", "attn2.to_q"),
                ("cross_attn.proj", "attn2.to_out.0"),
                ("mlp.fc1", "ff.net.0.proj"),
                ("mlp.fc2", "ff.net.2"),
            ] {
                put(
                    format!("blocks.{n}.{orig}.{sfx}"),
                    copy(&format!("{b}.{diff}.{sfx}")),
                );
            }
        }
    }
    out
}

fn diffusers_transformer(name: &str) -> BTreeMap<String, Owned> {
    read_all(&fixture(&format!(
        "{name}/transformer/diffusion_pytorch_model.safetensors"
    )))
}

#[test]
fn original_layout_safetensors_gives_identical_plan() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture(SIGMA);
    let (base, base_plan) = build(Some(&folder), &ComponentFiles::default(), None);
    let d = diffusers_transformer(SIGMA);
    for prefix in ["", GGUF_PREFIX] {
        let path = dir.path().join(format!("orig{}.safetensors", prefix.len()));
        write_all(&path, &to_original(&d, prefix));
        let (c, plan) = build(Some(&folder), &with_model(&path), None);
        assert_eq!(c.table.entries.len(), base.table.entries.len());
        for (i, e) in base.table.entries.iter().enumerate() {
            assert_eq!(c.table.entries[i].name, e.name);
            assert_eq!(c.table.entries[i].dtype, e.dtype, "{}", e.name);
            assert!(
                c.table.data[i] == base.table.data[i],
                "{} bytes differ (prefix {prefix:?})",
                e.name
            );
        }
        let a = transformer_sq_t999(&plan, SIGMA);
        let b = transformer_sq_t999(&base_plan, SIGMA);
        assert!(a == b, "transformer outputs differ (prefix {prefix:?})");
    }
    // The same original-layout tensors as a GGUF F32 file (sd.cpp names): identical again.
    let path = dir.path().join("orig-F32.gguf");
    write_gguf_f32(&path, &to_original(&d, GGUF_PREFIX));
    let (c, plan) = build(Some(&folder), &with_model(&path), None);
    for (i, e) in base.table.entries.iter().enumerate() {
        assert_eq!(c.table.entries[i].dtype, e.dtype, "{}", e.name);
        assert!(
            c.table.data[i] == base.table.data[i],
            "{} bytes differ (gguf)",
            e.name
        );
    }
    let (la, _) = dpm4_latents(&plan, SIGMA, "pipeline_dpm_4_cat_64x64");
    let (lb, _) = dpm4_latents(&base_plan, SIGMA, "pipeline_dpm_4_cat_64x64");
    assert!(la == lb, "GGUF F32 latents differ");
    // The folder's own weights given explicitly as a diffusers-layout file: also identical.
    let path = fixture(&format!(
        "{SIGMA}/transformer/diffusion_pytorch_model.safetensors"
    ));
    let (c, plan) = build(Some(&folder), &with_model(&path), None);
    assert!(c.table.data == base.table.data);
    let (la, _) = dpm4_latents(&plan, SIGMA, "pipeline_dpm_4_cat_64x64");
    let (lb, _) = dpm4_latents(&base_plan, SIGMA, "pipeline_dpm_4_cat_64x64");
    assert!(la == lb, "latents differ");
}

// ---------------------------------------------------------------------------------------------
// (d) --quant plans of the folders; fallbacks listed by inspect
// ---------------------------------------------------------------------------------------------

fn quant_plan(name: &str, quant: DType) -> (Compiled, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.plan");
    let c = compile_inputs_to_file(
        Some(&fixture(name)),
        &ComponentFiles::default(),
        &opts(Some(quant)),
        &out,
    )
    .unwrap_or_else(|e| panic!("{name} --quant {quant}: {e}"));
    let bytes = std::fs::read(&out).unwrap();
    Plan::from_bytes(&bytes).expect("plan verifies");
    let meta = edge_planner::inspect::read_meta(&bytes).unwrap();
    (c, edge_planner::inspect::summary(&meta, bytes.len() as u64))
}

#[test]
fn quant_flags_on_folders() {
    // Sigma: hidden 64, T5 d_model 32, d_ff 64: q8_0 / q4_0 fit every matrix; q4_k (256)
    // falls back to q4_0 everywhere.
    for (q, stored) in [
        (DType::Q8_0, DType::Q8_0),
        (DType::Q4_0, DType::Q4_0),
        (DType::Q4K, DType::Q4_0),
    ] {
        let (c, summary) = quant_plan(SIGMA, q);
        let (_, d) = table_bytes(&c, &qkv_name(0));
        assert_eq!(d, stored, "sigma --quant {q}");
        if q == stored {
            assert!(summary.contains("notes: none"), "{summary}");
        } else {
            assert!(
                summary.contains(&format!("asked {q}, stored {stored}")),
                "{summary}"
            );
        }
    }
    // Alpha: hidden 48 is not a multiple of 32, so its transformer matrices fall back to f16.
    let (c, summary) = quant_plan("pixart-alpha-tiny", DType::Q8_0);
    assert_eq!(table_bytes(&c, &qkv_name(0)).1, DType::F16);
    assert!(!c.table.fallbacks.is_empty());
    assert!(
        summary.contains(&format!("{}: asked q8_0, stored f16", qkv_name(0))),
        "{summary}"
    );
}

// ---------------------------------------------------------------------------------------------
// (e) Bad inputs
// ---------------------------------------------------------------------------------------------

/// Byte offset of the ggml type id of tensor `name` in a GGUF file (after its name, n_dims
/// and ne).
fn type_id_offset(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("tensor record");
    let p = at + key.len();
    let n_dims = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
    p + 4 + 8 * n_dims
}

#[test]
fn gguf_unknown_type_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read(gguf(SIGMA, "Q8_0")).unwrap();
    let name = format!("{GGUF_PREFIX}blocks.0.attn.qkv.weight");

    let mut bad = src.clone();
    let at = type_id_offset(&bad, &name);
    assert_eq!(
        u32::from_le_bytes(bad[at..at + 4].try_into().unwrap()),
        8,
        "q8_0 type id"
    );
    bad[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
    let p = dir.path().join("unknown.gguf");
    std::fs::write(&p, &bad).unwrap();
    let e = compile_err(Some(&fixture(SIGMA)), &with_model(&p));
    assert!(e.contains(&name) && e.contains("type id 77"), "{e}");

    let p = dir.path().join("truncated.gguf");
    std::fs::write(&p, &src[..src.len() - 100]).unwrap();
    let e = compile_err(Some(&fixture(SIGMA)), &with_model(&p));
    assert!(
        e.contains("truncated.gguf") && e.contains("file has"),
        "{e}"
    );
}

#[test]
fn original_layout_errors_name_tensor_and_shape() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture(SIGMA);
    let d = diffusers_transformer(SIGMA);

    // A missing block tensor.
    let mut o = to_original(&d, GGUF_PREFIX);
    o.remove(&format!("{GGUF_PREFIX}blocks.1.attn.proj.weight"));
    let p = dir.path().join("missing.safetensors");
    write_all(&p, &o);
    let e = compile_err(Some(&folder), &with_model(&p));
    assert!(
        e.contains("transformer_blocks.1.attn1.to_out.0.weight")
            && e.contains("blocks.1.attn.proj.weight")
            && e.contains("[64, 64]"),
        "{e}"
    );

    // A fused tensor with the wrong shape.
    let mut o = to_original(&d, "");
    let kv = o.get_mut("blocks.0.cross_attn.kv_linear.weight").unwrap();
    kv.shape = vec![64, 128];
    let p = dir.path().join("shape.safetensors");
    write_all(&p, &o);
    let e = compile_err(Some(&folder), &with_model(&p));
    assert!(
        e.contains("blocks.0.cross_attn.kv_linear.weight")
            && e.contains("[64, 128]")
            && e.contains("[128, 64]"),
        "{e}"
    );

    // A plain tensor with the wrong shape.
    let mut o = to_original(&d, "");
    let fc = o.get_mut("blocks.1.mlp.fc2.weight").unwrap();
    fc.shape = vec![256, 64];
    let p = dir.path().join("fc2.safetensors");
    write_all(&p, &o);
    let e = compile_err(Some(&folder), &with_model(&p));
    assert!(
        e.contains("blocks.1.mlp.fc2.weight") && e.contains("[64, 256]"),
        "{e}"
    );

    // Without a folder the head count is needed (no GGUF metadata in a safetensors file).
    let p = dir.path().join("orig.safetensors");
    write_all(&p, &to_original(&d, ""));
    let files = ComponentFiles {
        diffusion_model: Some(p),
        t5xxl: Some(fixture(&format!(
            "{SIGMA}/text_encoder/model.safetensors.index.json"
        ))),
        vae: Some(fixture(&format!(
            "{SIGMA}/vae/diffusion_pytorch_model.safetensors"
        ))),
        tokenizer: Some(fixture(&format!("{SIGMA}/tokenizer/spiece.model"))),
        ..Default::default()
    };
    let e = compile_err(None, &files);
    assert!(e.contains("--heads"), "{e}");
}

#[test]
fn diffusers_layout_errors_name_the_part() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture(SIGMA);

    // A missing part of a fused projection.
    let mut d = diffusers_transformer(SIGMA);
    d.remove("transformer_blocks.0.attn1.to_k.weight");
    let p = dir.path().join("nok.safetensors");
    write_all(&p, &d);
    let e = compile_err(Some(&folder), &with_model(&p));
    assert!(
        e.contains("transformer_blocks.0.attn1.to_k.weight") && e.contains("[64, 64]"),
        "{e}"
    );

    // Parts whose shapes disagree.
    let mut d = diffusers_transformer(SIGMA);
    let v = d.get_mut("transformer_blocks.1.attn2.to_v.weight").unwrap();
    v.shape = vec![32, 128];
    let p = dir.path().join("badv.safetensors");
    write_all(&p, &d);
    let e = compile_err(Some(&folder), &with_model(&p));
    assert!(
        e.contains("transformer_blocks.1.attn2.to_v.weight")
            && e.contains("[32, 128]")
            && e.contains("[64, 64]"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Without a folder: four role files, configs inferred from shapes and GGUF metadata
// ---------------------------------------------------------------------------------------------

/// The four role files of fixture `name` (its F16 GGUF transformer, T5 shards, VAE,
/// tokenizer.json) with the VAE's GroupNorm `groups` given (shapes cannot tell them).
fn role_files(name: &str, groups: usize) -> ComponentFiles {
    ComponentFiles {
        diffusion_model: Some(gguf(name, "F16")),
        t5xxl: Some(fixture(&format!(
            "{name}/text_encoder/model.safetensors.index.json"
        ))),
        vae: Some(fixture(&format!(
            "{name}/vae/diffusion_pytorch_model.safetensors"
        ))),
        tokenizer: Some(fixture(&format!("{name}/tokenizer/tokenizer.json"))),
        vae_norm_groups: Some(groups),
        ..Default::default()
    }
}

/// Compiles `name` from its four role files (F16 GGUF transformer) and checks the plan equals
/// the folder + `--diffusion-model` plan; the fixture VAEs' GroupNorm groups (not inferable
/// from shapes) are given, heads and sample size come from the GGUF's `pixart.*` keys.
fn folderless_matches_folder(name: &str, groups: usize, family: ModelFamily, scale: f32) {
    let folder = fixture(name);
    let model = gguf(name, "F16");
    let (base, base_plan) = build(Some(&folder), &with_model(&model), None);
    let files = ComponentFiles {
        family: (family == ModelFamily::PixArtSigma).then_some(family),
        ..role_files(name, groups)
    };
    let (c, plan) = build(None, &files, None);
    assert_eq!(c.meta.model.family, family);
    assert_eq!(
        c.meta.scheduler, base.meta.scheduler,
        "built-in scheduler config"
    );
    // The default scale of the detected family equals the fixture's VAE config.
    assert_eq!(c.meta.vae.scaling_factor, scale);
    assert_eq!(base.meta.vae.scaling_factor, scale);
    assert!(
        c.table.data == base.table.data,
        "{name}: tensor bytes differ"
    );
    let (la, _) = dpm4_latents(&plan, name, "pipeline_dpm_4_cat_64x64");
    let (lb, _) = dpm4_latents(&base_plan, name, "pipeline_dpm_4_cat_64x64");
    assert!(la == lb, "{name}: latents differ");
}

#[test]
fn folderless_compile_matches_folder_sigma() {
    folderless_matches_folder(SIGMA, 8, ModelFamily::PixArtSigma, 0.13025);
}

#[test]
fn folderless_compile_matches_folder_alpha() {
    folderless_matches_folder(ALPHA, 16, ModelFamily::PixArtAlpha, 0.18215);
}

/// α GGUF files (micro-condition embedders `csize_embedder`, `ar_embedder`; Q8_0 mixes Q8_0
/// and F16 matrices because hidden 48 is not a multiple of 32).
#[test]
fn gguf_alpha_matches_reference() {
    let folder = fixture(ALPHA);
    let (_, plan) = build(Some(&folder), &with_model(&gguf(ALPHA, "F16")), None);
    let ours = transformer_sq_t999(&plan, ALPHA);
    assert_close(
        "alpha F16 GGUF transformer sq_t999",
        &ours,
        &gguf_transformer_ref(ALPHA, "F16"),
        1e-4,
    );

    let path = gguf(ALPHA, "Q8_0");
    let (c, plan) = build(Some(&folder), &with_model(&path), None);
    let g = GgufFile::open(&path).unwrap();
    let gname = format!("{GGUF_PREFIX}blocks.0.attn.qkv.weight");
    let (bytes, d) = table_bytes(&c, &qkv_name(0));
    assert_eq!(d, g.tensor_info(&gname).unwrap().dtype);
    assert!(bytes == g.tensor_bytes(&gname).unwrap());
    let ours = transformer_sq_t999(&plan, ALPHA);
    let reference = gguf_transformer_ref(ALPHA, "Q8_0");
    let rel = max_abs_diff(&ours, &reference) / max_abs(&reference).max(1.0);
    eprintln!("alpha Q8_0 GGUF transformer sq_t999: max abs diff / max(1, max|ref|) = {rel:e}");
    assert_close(
        "alpha Q8_0 GGUF transformer sq_t999",
        &ours,
        &reference,
        ALPHA_Q8_FWD,
    );
}

/// Twice the measured 2.46e-3 (generic kernels).
const ALPHA_Q8_FWD: f64 = 4.9e-3;

// ---------------------------------------------------------------------------------------------
// (f) Target-specific packs
// ---------------------------------------------------------------------------------------------

/// `--target aarch64-neon` repacks the Q8_0 / Q4_0 linear weights into `Interleaved4x8`
/// (every matrix with at least 4 rows that is only a linear weight: transformer, cross-K/V and
/// T5 projections), `--target x86_64-avx512` the Q8_0 ones with at least 16 rows into
/// `Interleaved16x4`; everything else stays row-major, and the plan run on this machine with the
/// generic kernels gives bit-identical latents to the same model compiled for the generic
/// target (the generic kernels read every layout in the same arithmetic order). This is what
/// `edgeplan verify` relies on to check a device's plan before it is flashed.
#[test]
fn target_plans_repack_linear_weights_and_run_identically_here() {
    let arm = Target {
        isa: Isa::Aarch64,
        features: vec!["neon".into()],
    };
    let x86 = Target {
        isa: Isa::X86_64,
        features: ["avx512f", "avx512bw", "avx512vnni"]
            .map(String::from)
            .to_vec(),
    };
    for (target, layout, q, rows, label) in [
        (
            &arm,
            PackLayout::Interleaved4x8,
            DType::Q8_0,
            4,
            "interleaved 4x8",
        ),
        (
            &arm,
            PackLayout::Interleaved4x8,
            DType::Q4_0,
            4,
            "interleaved 4x8",
        ),
        (
            &x86,
            PackLayout::Interleaved16x4,
            DType::Q8_0,
            16,
            "interleaved 16x4",
        ),
    ] {
        let generic = build(Some(&fixture(SIGMA)), &ComponentFiles::default(), Some(q));
        let mut o = opts(Some(q));
        o.target = target.clone();
        let mut c = compile_inputs(Some(&fixture(SIGMA)), &ComponentFiles::default(), &o)
            .unwrap_or_else(|e| panic!("compile: {e}"));
        let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble");
        let packed = Plan::from_bytes(&bytes).expect("target plan verifies");

        let mut repacked = 0;
        for (e, g) in c.table.entries.iter().zip(&generic.0.table.entries) {
            assert_eq!((&e.name, e.dtype, &e.shape), (&g.name, g.dtype, &g.shape));
            let expect = e.dtype == q && e.shape.len() == 2 && e.shape[0] >= rows;
            if e.layout == layout {
                assert!(expect, "{} {:?} {:?} repacked", e.name, e.dtype, e.shape);
                repacked += 1;
            } else {
                assert!(
                    !expect,
                    "{} {:?} {:?} left row-major",
                    e.name, e.dtype, e.shape
                );
            }
        }
        assert!(
            repacked >= 20,
            "{target} {q}: only {repacked} tensors repacked"
        );
        let summary = edge_planner::inspect::summary(&c.meta, bytes.len() as u64);
        assert!(
            summary.contains(&format!("{} ({label})", q.name())),
            "{summary}"
        );

        let (want, _) = dpm4_latents(&generic.1, SIGMA, "pipeline_dpm_4_cat_64x64");
        let (got, _) = dpm4_latents(&packed, SIGMA, "pipeline_dpm_4_cat_64x64");
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{target} {q}: the target plan's latents differ from the generic plan's"
        );
    }
}

/// `--target x86_64-avx512` with no `Q8_0` matrix to repack (here `--quant f16`) says so in a
/// plan note: the plan still demands the AVX-512 features, for nothing.
#[test]
fn avx512_target_without_q8_0_weights_says_so() {
    let mut o = opts(Some(DType::F16));
    o.target = Target {
        isa: Isa::X86_64,
        features: ["avx512f", "avx512bw", "avx512vnni"]
            .map(String::from)
            .to_vec(),
    };
    let c = compile_inputs(Some(&fixture(SIGMA)), &ComponentFiles::default(), &o)
        .unwrap_or_else(|e| panic!("compile: {e}"));
    assert!(c
        .table
        .entries
        .iter()
        .all(|e| e.layout == PackLayout::RowMajor));
    let notes = c.meta.notes.join("\n");
    assert!(
        notes.contains("no Q8_0 linear weight") && notes.contains("--target x86_64"),
        "{notes}"
    );
}

// ---------------------------------------------------------------------------------------------
// What no file states is said, what no graph uses is reported, non-finite weights are named
// ---------------------------------------------------------------------------------------------

/// Without a folder, a family the weights cannot tell must be given; every value no file
/// states is in the plan's notes (and so in `edgeplan compile`'s output and `inspect`).
#[test]
fn folderless_compiles_name_every_assumed_value() {
    let e = compile_err(None, &role_files(SIGMA, 8));
    assert!(
        e.contains("--family sigma") && e.contains("--family alpha") && e.contains("0.13025"),
        "{e}"
    );
    let files = ComponentFiles {
        family: Some(ModelFamily::PixArtSigma),
        ..role_files(SIGMA, 8)
    };
    let (c, _) = build(None, &files, None);
    let notes = c.meta.notes.join("\n");
    for needle in [
        "GroupNorm groups 8 (--vae-norm-groups)",
        "scaling factor 0.13025 (the SDXL VAE of PixArt-Σ",
        "4 attention heads (GGUF pixart.attention.head_count)",
        "sample size 8 (GGUF pixart.sample_size)",
        "T5 v1.1",
        "DPMSolverMultistepScheduler",
    ] {
        assert!(notes.contains(needle), "{needle:?} not in notes:\n{notes}");
    }
    let summary = edge_planner::inspect::summary(&c.meta, 0);
    assert!(summary.contains("GroupNorm groups 8"), "{summary}");
    assert!(summary.contains("assumed VAE config"), "{summary}");

    // A family that contradicts the weights is refused; α is recognised by its embedders.
    let alpha = role_files(ALPHA, 16);
    let e = compile_err(
        None,
        &ComponentFiles {
            family: Some(ModelFamily::PixArtSigma),
            ..alpha.clone()
        },
    );
    assert!(
        e.contains("--family sigma") && e.contains("PixArt-α"),
        "{e}"
    );
    let (c, _) = build(None, &alpha, None);
    assert!(
        c.meta.notes.join("\n").contains("assumed family PixArt-α"),
        "{:?}",
        c.meta.notes
    );

    // A safetensors transformer has no sample-size key: the flag is required.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dit.safetensors");
    write_all(&p, &diffusers_transformer(SIGMA));
    let files = ComponentFiles {
        diffusion_model: Some(p),
        heads: Some(4),
        family: Some(ModelFamily::PixArtSigma),
        ..role_files(SIGMA, 8)
    };
    let e = compile_err(None, &files);
    assert!(e.contains("--sample-size"), "{e}");
}

/// Copies the fixture folder `name` into `dst` (files only, recursively).
fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// A config with fewer layers than the weights, and tensors under names the model does not
/// have, are reported (diffusers warns about unused checkpoint weights too); a folder the
/// config matches reports nothing.
#[test]
fn unused_checkpoint_tensors_are_reported() {
    let (c, _) = build(Some(&fixture(SIGMA)), &ComponentFiles::default(), None);
    assert!(
        !c.meta.notes.iter().any(|n| n.contains("not used")),
        "{:?}",
        c.meta.notes
    );
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("m");
    copy_tree(&fixture(SIGMA), &folder);
    let cfg_path = folder.join("transformer/config.json");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        cfg.replace("\"num_layers\": 2", "\"num_layers\": 1"),
    )
    .unwrap();
    let (c, _) = build(Some(&folder), &ComponentFiles::default(), None);
    let notes = c.meta.notes.join("\n");
    assert!(
        notes.contains("warning:")
            && notes.contains("transformer tensors")
            && notes.contains("transformer_blocks.1.attn1.to_q.weight"),
        "{notes}"
    );
    assert!(!notes.contains("transformer_blocks.0."), "{notes}");

    // An extra tensor in the VAE under a name no graph reads (the encoder is not reported).
    let mut v = read_all(&folder.join("vae/diffusion_pytorch_model.safetensors"));
    let extra = Owned {
        dtype: safetensors::Dtype::F32,
        shape: vec![2],
        data: vec![0; 8],
    };
    v.insert("decoder.conv_out.weight_typo".into(), extra);
    write_all(&folder.join("vae/diffusion_pytorch_model.safetensors"), &v);
    let (c, _) = build(Some(&folder), &ComponentFiles::default(), None);
    let notes = c.meta.notes.join("\n");
    assert!(
        notes.contains("1 VAE tensors") && notes.contains("decoder.conv_out.weight_typo"),
        "{notes}"
    );
    assert!(!notes.contains("encoder.conv_in"), "{notes}");
}

/// NaN or infinity in a weight is refused at compile time naming the file, the tensor and the
/// first index, in every storage type (F32, F16, and a ggml block whose scale is NaN).
#[test]
fn non_finite_weights_are_named_at_compile_time() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture(SIGMA);
    let name = "transformer_blocks.1.ff.net.2.weight";
    for (i, (dtype, bad)) in [
        (safetensors::Dtype::F32, f32::NAN.to_le_bytes().to_vec()),
        (
            safetensors::Dtype::F32,
            f32::INFINITY.to_le_bytes().to_vec(),
        ),
        (
            safetensors::Dtype::F16,
            half::f16::NEG_INFINITY.to_le_bytes().to_vec(),
        ),
        (
            safetensors::Dtype::BF16,
            half::bf16::NAN.to_le_bytes().to_vec(),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut d = diffusers_transformer(SIGMA);
        let t = d.get_mut(name).unwrap();
        let vals: Vec<f32> = t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let width = bad.len();
        t.data = match dtype {
            safetensors::Dtype::F16 => vals
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            safetensors::Dtype::BF16 => vals
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            _ => t.data.clone(),
        };
        t.dtype = dtype;
        let at = 37 + i;
        t.data[at * width..(at + 1) * width].copy_from_slice(&bad);
        let p = dir.path().join(format!("nan{i}.safetensors"));
        write_all(&p, &d);
        let e = compile_err(Some(&folder), &with_model(&p));
        assert!(
            e.contains(name)
                && e.contains(&format!("flat index {at}"))
                && e.contains(&format!("nan{i}.safetensors"))
                && e.contains("finite"),
            "{e}"
        );
    }
    // A Q8_0 GGUF block with a NaN scale: the first element of that block is named.
    let path = gguf(SIGMA, "Q8_0");
    let g = GgufFile::open(&path).unwrap();
    let gname = format!("{GGUF_PREFIX}blocks.0.attn.qkv.weight");
    let mut bytes = std::fs::read(&path).unwrap();
    let tb = g.tensor_bytes(&gname).unwrap();
    let off = bytes
        .windows(tb.len())
        .position(|w| w == tb)
        .expect("tensor data in the file");
    // Block 2 (bytes 68..102): its f16 scale becomes NaN.
    bytes[off + 68..off + 70].copy_from_slice(&half::f16::NAN.to_le_bytes());
    let p = dir.path().join("nan.gguf");
    std::fs::write(&p, &bytes).unwrap();
    let e = compile_err(Some(&folder), &with_model(&p));
    assert!(
        e.contains("flat index 64") && e.contains("nan.gguf") && e.contains("qkv"),
        "{e}"
    );
}
