//! End-to-end checks against diffusers: every stage of a plan compiled from the fixture
//! pipelines, and whole pipeline runs from the fixtures' initial noise.

use edge_e2e::*;
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::Executor;
use edge_runtime::{GenerateParams, Plan, Session, StageInput};

const SIZES: [(u32, u32); 3] = [(64, 64), (64, 96), (96, 64)];

fn plan_for(name: &str) -> Plan {
    let bytes = compiled_plan(&fixture(name), &SIZES, None);
    Plan::from_bytes(&bytes).expect("plan verifies")
}

fn t5_matches(name: &str) {
    let plan = plan_for(name);
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let tokens = read_safetensors(&fixture(&format!("{name}/reference/tokens.safetensors")));
    let t5 = read_safetensors(&fixture(&format!("{name}/reference/t5.safetensors")));
    let ids = &tokens["input_ids"];
    let mask = &tokens["attention_mask"];
    let refh = &t5["last_hidden_state"];
    let (n, l) = (ids.shape[0], ids.shape[1]);
    let d = refh.shape[2];
    assert_eq!(plan.meta().text.max_sequence_length as usize, l);
    for row in 0..n {
        let id: Vec<i32> = ids.data[row * l..(row + 1) * l]
            .iter()
            .map(|&x| x as i32)
            .collect();
        let m = &mask.data[row * l..(row + 1) * l];
        let mut out = vec![0f32; l * d];
        s.run_stage(
            plan.meta().text_stage,
            &[StageInput::I32(&id), StageInput::F32(m)],
            &mut [&mut out],
        )
        .unwrap();
        assert_close(
            &format!("{name} t5 row {row}"),
            &out,
            &refh.data[row * l * d..(row + 1) * l * d],
            1e-4,
        );
    }
}

#[test]
fn t5_sigma() {
    t5_matches("pixart-sigma-tiny");
}

#[test]
fn t5_alpha() {
    t5_matches("pixart-alpha-tiny");
}

fn transformer_matches(name: &str) {
    let plan = plan_for(name);
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    for case in [
        "sq_t999_cat",
        "sq_t500_cat",
        "ns_t999_cat",
        "ns_t500_long",
        "sq_t999_cfgbatch",
    ] {
        let r = read_safetensors(&fixture(&format!(
            "{name}/reference/transformer_{case}.safetensors"
        )));
        let x = &r["hidden_states"];
        let (b, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let size = plan
            .meta()
            .size((w * 8) as u32, (h * 8) as u32)
            .unwrap_or_else(|| panic!("plan lacks {}x{}", w * 8, h * 8))
            .clone();
        let ctx = &r["encoder_hidden_states"];
        let (l, dc) = (ctx.shape[1], ctx.shape[2]);
        let mask = &r["encoder_attention_mask"];
        let out_ref = &r["output_noise"];
        for bi in 0..b {
            let lat = &x.data[bi * c * h * w..(bi + 1) * c * h * w];
            let cond = edge_runtime::pipeline::condition(
                &mut s,
                ctx.data[bi * l * dc..(bi + 1) * l * dc].to_vec(),
                mask.data[bi * l..(bi + 1) * l].to_vec(),
            )
            .unwrap();
            let mut out = vec![0f32; c * h * w];
            edge_runtime::pipeline::denoise(
                &mut s,
                &size,
                lat,
                r["timestep"].data[bi],
                &cond,
                &mut out,
            )
            .unwrap();
            assert_close(
                &format!("{name} transformer {case} batch {bi}"),
                &out,
                &out_ref.data[bi * c * h * w..(bi + 1) * c * h * w],
                1e-4,
            );
        }
    }
}

#[test]
fn transformer_sigma() {
    transformer_matches("pixart-sigma-tiny");
}

#[test]
fn transformer_alpha() {
    transformer_matches("pixart-alpha-tiny");
}

fn vae_matches(name: &str) {
    let plan = plan_for(name);
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    for case in ["dec_64x64", "dec_w64_h96"] {
        let r = read_safetensors(&fixture(&format!(
            "{name}/reference/vae_{case}.safetensors"
        )));
        let lat = &r["latents"];
        let (h, w) = (lat.shape[2], lat.shape[3]);
        let size = plan
            .meta()
            .size((w * 8) as u32, (h * 8) as u32)
            .unwrap()
            .clone();
        let img = &r["image"];
        let mut out = vec![0f32; img.data.len()];
        s.run_stage(
            size.decoder_stage,
            &[StageInput::F32(&lat.data)],
            &mut [&mut out],
        )
        .unwrap();
        assert_close(&format!("{name} vae {case}"), &out, &img.data, 1e-4);
    }
}

#[test]
fn vae_sigma() {
    vae_matches("pixart-sigma-tiny");
}

#[test]
fn vae_alpha() {
    vae_matches("pixart-alpha-tiny");
}

/// Runs a whole pipeline from the fixture's initial noise and compares final latents and PNG.
fn pipeline_matches(name: &str, run: &str, method: SamplingMethod, steps: usize, cfg: f32) {
    let plan = plan_for(name);
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let r = read_safetensors(&fixture(&format!(
        "{name}/reference/pipeline_{run}.safetensors"
    )));
    let noise = &r["initial_noise"];
    let (h, w) = (noise.shape[2], noise.shape[3]);
    let params = GenerateParams {
        prompt: "a lovely cat".into(),
        negative_prompt: String::new(),
        steps,
        cfg_scale: cfg,
        method,
        seed: 0,
        width: (w * 8) as u32,
        height: (h * 8) as u32,
        rng: Default::default(),
        karras: None,
        init_latents: Some(noise.data.clone()),
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    let out = edge_runtime::generate(&mut s, &params, &mut |_| {}).unwrap();
    let refl = &r["final_latents"];
    assert_close(
        &format!("{name} {run} final latents"),
        &out.latents,
        &refl.data,
        1e-3,
    );
    edge_e2e::assert_png_close(&format!("{name} {run}"), &out.rgb, &r["image_uint8"].data);
}

#[test]
fn pipeline_sigma_dpm_4() {
    pipeline_matches(
        "pixart-sigma-tiny",
        "dpm_4_cat_64x64",
        SamplingMethod::DpmPp2m,
        4,
        4.5,
    );
}

#[test]
fn pipeline_sigma_dpm_20() {
    pipeline_matches(
        "pixart-sigma-tiny",
        "dpm_20_cat_64x64",
        SamplingMethod::DpmPp2m,
        20,
        4.5,
    );
}

#[test]
fn pipeline_sigma_euler_4() {
    pipeline_matches(
        "pixart-sigma-tiny",
        "euler_4_cat_64x64",
        SamplingMethod::Euler,
        4,
        4.5,
    );
}

#[test]
fn pipeline_sigma_nonsquare() {
    pipeline_matches(
        "pixart-sigma-tiny",
        "dpm_4_cat_w64_h96",
        SamplingMethod::DpmPp2m,
        4,
        4.5,
    );
}

#[test]
fn pipeline_sigma_nocfg() {
    pipeline_matches(
        "pixart-sigma-tiny",
        "dpm_4_cat_nocfg_64x64",
        SamplingMethod::DpmPp2m,
        4,
        1.0,
    );
}

#[test]
fn pipeline_alpha_dpm_4() {
    pipeline_matches(
        "pixart-alpha-tiny",
        "dpm_4_cat_64x64",
        SamplingMethod::DpmPp2m,
        4,
        4.5,
    );
}

#[test]
fn pipeline_alpha_dpm_20() {
    pipeline_matches(
        "pixart-alpha-tiny",
        "dpm_20_cat_64x64",
        SamplingMethod::DpmPp2m,
        20,
        4.5,
    );
}

#[test]
fn pipeline_alpha_euler_4() {
    pipeline_matches(
        "pixart-alpha-tiny",
        "euler_4_cat_64x64",
        SamplingMethod::Euler,
        4,
        4.5,
    );
}

#[test]
fn pipeline_alpha_nonsquare() {
    pipeline_matches(
        "pixart-alpha-tiny",
        "dpm_4_cat_w64_h96",
        SamplingMethod::DpmPp2m,
        4,
        4.5,
    );
}

/// Short prompts run a shorter text encoder: the real tokens' states are bit-identical to the
/// full-length encoder's, and the denoiser output does not change when the padded rows are
/// zero instead of T5's states for padding.
#[test]
fn text_buckets_are_exact() {
    let plan = plan_for("pixart-sigma-tiny");
    assert!(!plan.meta().text_buckets.is_empty());
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let tok = edge_runtime::tokenizer::Tokenizer::new(&plan.meta().tokenizer).unwrap();
    let (bucketed, mask, _) =
        edge_runtime::pipeline::encode_text(&mut s, &tok, "a lovely cat").unwrap();
    let l = plan.meta().text.max_sequence_length as usize;
    let d = bucketed.len() / l;
    let enc = tok.encode_padded("a lovely cat", l);
    let mut full = vec![0f32; l * d];
    s.run_stage(
        plan.meta().text_stage,
        &[StageInput::I32(&enc.ids), StageInput::F32(&enc.mask)],
        &mut [&mut full],
    )
    .unwrap();
    let real = mask.iter().filter(|&&m| m > 0.0).count();
    assert!(real < 16);
    assert_eq!(
        &bucketed[..real * d],
        &full[..real * d],
        "real token states differ"
    );
    assert!(bucketed[16 * d..].iter().all(|&v| v == 0.0));
    let size = plan.meta().size(64, 64).unwrap().clone();
    let lat: Vec<f32> = (0..4 * 8 * 8).map(|i| (i as f32 * 0.1).sin()).collect();
    let mut a = vec![0f32; lat.len()];
    let mut b = vec![0f32; lat.len()];
    let ca = edge_runtime::pipeline::condition(&mut s, bucketed, mask.clone()).unwrap();
    let cb = edge_runtime::pipeline::condition(&mut s, full, mask).unwrap();
    edge_runtime::pipeline::denoise(&mut s, &size, &lat, 999.0, &ca, &mut a).unwrap();
    edge_runtime::pipeline::denoise(&mut s, &size, &lat, 999.0, &cb, &mut b).unwrap();
    assert_eq!(a, b, "denoiser output depends on padded rows");
}

/// `--check-finite`: a NaN in the latents passes silently through the VAE decoder (NaN pixels)
/// unless the check is on; then the run fails at the first step whose output holds it, naming
/// the stage, the step and its op.
#[test]
fn check_finite_names_the_first_step_that_produces_nan() {
    let plan = plan_for("pixart-sigma-tiny");
    let size = plan.meta().size(64, 64).unwrap().clone();
    let stage = &plan.meta().stages[size.decoder_stage as usize];
    let mut lat = vec![0.1f32; 4 * 8 * 8];
    lat[77] = f32::NAN;
    let n = 3 * 64 * 64;
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let mut out = vec![0f32; n];
    s.run_stage(
        size.decoder_stage,
        &[StageInput::F32(&lat)],
        &mut [&mut out],
    )
    .unwrap();
    assert!(
        out.iter().any(|v| v.is_nan()),
        "unchecked: NaN reaches the image"
    );
    s.set_check_finite(true);
    let e = s
        .run_stage(
            size.decoder_stage,
            &[StageInput::F32(&lat)],
            &mut [&mut out],
        )
        .unwrap_err();
    let edge_runtime::Error::NonFinite {
        stage: st,
        step,
        op,
        what,
    } = &e
    else {
        panic!("expected NonFinite, got {e}");
    };
    assert_eq!(st, &stage.name);
    // The first step that reads the latents.
    let first = stage
        .steps
        .iter()
        .position(|p| p.inputs.contains(&stage.inputs[0]))
        .unwrap();
    assert_eq!(*step, first, "{e}");
    assert_eq!(op, stage.steps[first].op.name());
    assert!(what.starts_with("NaN at element"), "{e}");
    assert!(
        e.to_string().contains(&format!("step {first} ({op})")),
        "{e}"
    );
}
