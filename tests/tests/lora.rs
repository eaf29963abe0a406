//! LoRA merged at plan time (`edgeplan compile --lora FILE[:MULTIPLIER]`) against the
//! `lora/` fixtures (README §14): PEFT's unmerged forward and its 4-step pipeline run at
//! m = 0.8 and m = 1, PEFT's merged weights, both key formats, and one-line errors for bad
//! files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use edge_e2e::*;
use edge_planner::compile::{compile_inputs, Compiled, ComponentFiles};
use edge_planner::lora::LoraRequest;
use edge_planner::CompileOptions;
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{Plan, Session};
use edge_schema::DType;

const PEFT: &str = "lora/pixart-sigma-tiny-lora-r4.peft.safetensors";
const KOHYA: &str = "lora/pixart-sigma-tiny-lora-r4.kohya.safetensors";

fn compile(loras: &[(&Path, f32)], quant: Option<DType>) -> edge_planner::Result<Compiled> {
    let opts = CompileOptions {
        sizes: vec![(64, 64)],
        loras: loras
            .iter()
            .map(|&(p, m)| LoraRequest {
                path: p.to_path_buf(),
                multiplier: m,
            })
            .collect(),
        policy: edge_planner::pack::PackPolicy {
            default: quant,
            rules: vec![],
        },
        ..Default::default()
    };
    compile_inputs(
        Some(&fixture("pixart-sigma-tiny")),
        &ComponentFiles::default(),
        &opts,
    )
}

fn plan_of(loras: &[(&Path, f32)]) -> (Compiled, Plan) {
    let mut c = compile(loras, None).unwrap_or_else(|e| panic!("compile: {e}"));
    let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble");
    let plan = Plan::from_bytes(&bytes).expect("plan verifies");
    (c, plan)
}

/// The noise half of the denoiser output for the sq_t999 inputs.
fn forward(plan: &Plan, r: &HashMap<String, RefTensor>) -> Vec<f32> {
    let mut s = Session::new(plan, edge_kernels::generic(), None).unwrap();
    let size = plan.meta().size(64, 64).expect("64x64").clone();
    let x = &r["hidden_states"];
    let mut out = vec![0f32; x.data.len()];
    // The LoRA file copies the inputs but not the mask: it is the base reference's.
    let base = read_safetensors(&fixture(
        "pixart-sigma-tiny/reference/transformer_sq_t999_cat.safetensors",
    ));
    assert_eq!(
        base["encoder_hidden_states"].data,
        r["encoder_hidden_states"].data
    );
    let cond = edge_runtime::pipeline::condition(
        &mut s,
        r["encoder_hidden_states"].data.clone(),
        base["encoder_attention_mask"].data.clone(),
    )
    .unwrap();
    edge_runtime::pipeline::denoise(&mut s, &size, &x.data, 999.0, &cond, &mut out).unwrap();
    out
}

fn noise_half(t: &RefTensor) -> Vec<f32> {
    t.data[..t.data.len() / 2].to_vec()
}

/// The rows of part `part` of the plan tensor whose name lists it.
fn merged_rows(c: &Compiled, part: &str) -> Vec<f32> {
    let i = c
        .table
        .entries
        .iter()
        .position(|e| e.name.split('+').any(|p| p == part))
        .unwrap_or_else(|| panic!("plan has no tensor holding {part}"));
    let e = &c.table.entries[i];
    assert_eq!(e.dtype, DType::F32, "{part}");
    let parts: Vec<&str> = e.name.split('+').collect();
    let k = parts.iter().position(|p| *p == part).unwrap();
    let all: Vec<f32> = c.table.data[i]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let n = all.len() / parts.len();
    all[k * n..(k + 1) * n].to_vec()
}

#[test]
fn peft_lora_forward_matches_peft_and_its_merged_weights() {
    let r = read_safetensors(&fixture(
        "lora/transformer_sq_t999_cat_lora_m0.8.safetensors",
    ));
    let (c, plan) = plan_of(&[(&fixture(PEFT), 0.8)]);
    for part in [
        "transformer_blocks.0.attn1.to_q.weight",
        "transformer_blocks.0.ff.net.0.proj.weight",
    ] {
        let ours = merged_rows(&c, part);
        let theirs = &r[&format!("merged_weight.{part}")].data;
        let d = max_abs_diff(&ours, theirs);
        eprintln!("{part}: max |ours − PEFT merge| = {d:e}");
        assert!(d <= 1e-6 * max_abs(theirs).max(1.0), "{part}: {d}");
    }
    let ours = forward(&plan, &r);
    let unmerged = noise_half(&r["output"]);
    let merged = noise_half(&r["output_merged"]);
    let without = noise_half(&r["output_no_lora"]);
    let e = rel_max_err(&ours, &unmerged);
    eprintln!(
        "forward m=0.8: rel max err vs PEFT unmerged {e:e}, vs PEFT merged {:e}; the LoRA changes it by {:e}",
        rel_max_err(&ours, &merged),
        rel_max_err(&without, &unmerged)
    );
    assert!(e < 1e-3, "{e}");
    assert!(rel_max_err(&ours, &merged) < 1e-4);
    // The LoRA is applied: the output is far from the unadapted one.
    assert!(rel_max_err(&without, &ours) > 0.05);
    let info = &c.meta.model.loras;
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].file, "pixart-sigma-tiny-lora-r4.peft.safetensors");
    assert_eq!((info[0].layers, info[0].rank), (20, 4));
    assert_eq!(info[0].multiplier, 0.8);
    assert_eq!(info[0].format, "peft");
    let file = std::fs::read(fixture(PEFT)).unwrap();
    assert_eq!(info[0].blake3, *blake3::hash(&file).as_bytes());
}

#[test]
fn kohya_and_peft_files_give_the_same_plan_weights() {
    let (peft, _) = plan_of(&[(&fixture(PEFT), 0.8)]);
    let (kohya, _) = plan_of(&[(&fixture(KOHYA), 0.8)]);
    assert_eq!(peft.table.entries.len(), kohya.table.entries.len());
    for (i, e) in peft.table.entries.iter().enumerate() {
        assert_eq!(
            peft.table.data[i], kohya.table.data[i],
            "{}: kohya and PEFT merges differ",
            e.name
        );
    }
    assert_eq!(kohya.meta.model.loras[0].format, "kohya");
}

fn pipeline(plan: &Plan, r: &HashMap<String, RefTensor>) -> Vec<f32> {
    let mut s = Session::new(plan, edge_kernels::generic(), None).unwrap();
    let params = cat_params(
        4,
        SamplingMethod::DpmPp2m,
        Some(r["initial_noise"].data.clone()),
    );
    let out = edge_runtime::generate(&mut s, &params, &mut |_| {}).unwrap();
    assert_png_close("lora pipeline image", &out.rgb, &r["image_uint8"].data);
    out.latents
}

#[test]
fn lora_pipeline_runs_match_peft_at_both_multipliers() {
    for (m, file) in [(0.8, PEFT), (1.0, KOHYA)] {
        let r = read_safetensors(&fixture(&format!(
            "lora/pipeline_dpm_4_cat_64x64_lora_m{}.safetensors",
            if m == 1.0 {
                "1".to_string()
            } else {
                m.to_string()
            }
        )));
        let (_, plan) = plan_of(&[(&fixture(file), m)]);
        let ours = pipeline(&plan, &r);
        let e = rel_max_err(&ours, &r["final_latents"].data);
        eprintln!(
            "lora m={m} ({file}): final latents rel max err {e:e} (vs merged reference {:e})",
            rel_max_err(&ours, &r["final_latents_merged"].data)
        );
        assert!(e < 1e-3, "m={m}: {e}");
        assert!(rel_max_err(&ours, &r["final_latents_no_lora"].data) > 0.05);
    }
}

#[test]
fn two_loras_add_up_and_quantization_follows_the_merge() {
    // m = 0.5 twice is m = 1 once, up to rounding of the two sums.
    let (half, _) = plan_of(&[(&fixture(PEFT), 0.5), (&fixture(KOHYA), 0.5)]);
    let (one, _) = plan_of(&[(&fixture(PEFT), 1.0)]);
    let a = merged_rows(&half, "transformer_blocks.1.ff.net.2.weight");
    let b = merged_rows(&one, "transformer_blocks.1.ff.net.2.weight");
    assert!(max_abs_diff(&a, &b) < 1e-5 * max_abs(&b).max(1.0));
    assert_eq!(half.meta.model.loras.len(), 2);
    // With --quant q8_0 the merged weight is what gets quantized.
    let q = compile(&[(&fixture(PEFT), 1.0)], Some(DType::Q8_0)).unwrap();
    let i = q
        .table
        .entries
        .iter()
        .position(|e| e.name == "transformer_blocks.1.ff.net.2.weight")
        .unwrap();
    assert_eq!(q.table.entries[i].dtype, DType::Q8_0);
    let mut deq = vec![0f32; b.len()];
    edge_kernels::quant::dequantize_row(DType::Q8_0, &q.table.data[i], &mut deq);
    let amax = max_abs(&b);
    assert!(
        max_abs_diff(&deq, &b) <= amax / 100.0,
        "q8_0 of the merged weight"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad files
// ---------------------------------------------------------------------------------------------

/// Writes a safetensors file of f32 tensors.
fn write_lora(dir: &Path, name: &str, tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> PathBuf {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (
                n.to_string(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                    .unwrap(),
            )
        })
        .collect();
    let path = dir.join(name);
    safetensors::serialize_to_file(views, None, &path).unwrap();
    path
}

fn err_of(path: &Path) -> String {
    match compile(&[(path, 1.0)], None) {
        Ok(_) => panic!("{} should be refused", path.display()),
        Err(e) => {
            let s = e.to_string();
            eprintln!("expected error: {s}");
            assert!(!s.contains('\n'), "one line: {s}");
            assert!(
                s.contains(&path.display().to_string()),
                "names the file: {s}"
            );
            s
        }
    }
}

#[test]
fn bad_lora_files_get_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = |r: usize, i: usize| (vec![r, i], vec![0.01; r * i]);
    let key = "transformer.transformer_blocks.0.attn1.to_q";
    // Unknown layer.
    let (sa, va) = a(4, 64);
    let (sb, vb) = a(64, 4);
    let p = write_lora(
        d,
        "unknown.safetensors",
        &[
            (
                "transformer.transformer_blocks.7.attn1.to_q.lora_A.weight",
                sa.clone(),
                va.clone(),
            ),
            (
                "transformer.transformer_blocks.7.attn1.to_q.lora_B.weight",
                sb.clone(),
                vb.clone(),
            ),
        ],
    );
    let e = err_of(&p);
    assert!(
        e.contains("transformer.transformer_blocks.7.attn1.to_q") && e.contains("match no"),
        "{e}"
    );
    // Rank mismatch between A and B.
    let (sb3, vb3) = a(64, 3);
    let p = write_lora(
        d,
        "rank.safetensors",
        &[
            (&format!("{key}.lora_A.weight"), sa.clone(), va.clone()),
            (&format!("{key}.lora_B.weight"), sb3, vb3),
        ],
    );
    assert!(err_of(&p).contains("rank mismatch"));
    // Shapes of another model.
    let (sa2, va2) = a(4, 32);
    let p = write_lora(
        d,
        "shape.safetensors",
        &[
            (&format!("{key}.lora_A.weight"), sa2, va2),
            (&format!("{key}.lora_B.weight"), sb.clone(), vb.clone()),
        ],
    );
    assert!(err_of(&p).contains("another model"));
    // A half missing.
    let p = write_lora(
        d,
        "half.safetensors",
        &[(&format!("{key}.lora_A.weight"), sa.clone(), va.clone())],
    );
    assert!(err_of(&p).contains("needs both"));
    // No LoRA tensors at all (a checkpoint given as a LoRA).
    let p = write_lora(
        d,
        "model.safetensors",
        &[("transformer_blocks.0.attn1.to_q.weight", sb.clone(), vb)],
    );
    assert!(err_of(&p).contains("no LoRA tensors"));
    // LoHa.
    let p = write_lora(
        d,
        "loha.safetensors",
        &[
            (&format!("{key}.lora_A.weight"), sa.clone(), va.clone()),
            (&format!("{key}.hada_w1_a"), sa.clone(), va.clone()),
        ],
    );
    assert!(err_of(&p).contains("LoHa"));
    // Non-finite values.
    let mut vn = va.clone();
    vn[5] = f32::NAN;
    let p = write_lora(
        d,
        "nan.safetensors",
        &[
            (&format!("{key}.lora_A.weight"), sa.clone(), vn),
            (&format!("{key}.lora_B.weight"), sb, vec![0.01; 256]),
        ],
    );
    assert!(err_of(&p).contains("finite"));
    // Not a safetensors file.
    let p = d.join("junk.safetensors");
    std::fs::write(&p, b"not a safetensors file").unwrap();
    err_of(&p);
    // Missing file.
    err_of(&d.join("absent.safetensors"));
}
