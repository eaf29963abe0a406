//! Image to image against the `img2img/` fixtures (README §13): the VAE encode of the input
//! image (the distribution's mode, scaled), and the pipeline runs (DPM-Solver++ at strength
//! 0.6 and 0.3, Euler at 0.6) with the stored noise and with the noise drawn from seed 2024;
//! plans without an encoder and strengths that leave no step are refused.

use std::collections::HashMap;

use edge_e2e::*;
use edge_planner::CompileOptions;
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{GenerateParams, InitImage, Plan, Session};

fn plan(encoder: bool) -> (Plan, usize) {
    let opts = CompileOptions {
        sizes: vec![(64, 64)],
        vae_encoder: encoder,
        ..Default::default()
    };
    fixture_plan("pixart-sigma-tiny", &opts)
}

fn input_rgb() -> Vec<u8> {
    let bytes = std::fs::read(fixture("img2img/input_A_64x64.png")).unwrap();
    let (w, h, rgb) = edge_runtime::image::decode_png_rgb(&bytes, "input_A_64x64.png").unwrap();
    assert_eq!((w, h), (64, 64));
    rgb
}

#[test]
fn vae_encode_gives_the_reference_moments_and_init_latents() {
    let (plan, _) = plan(true);
    let r = read_safetensors(&fixture("img2img/vae_enc_input_A_64x64.safetensors"));
    let rgb = input_rgb();
    // The preprocessing is VaeImageProcessor.preprocess's, bit for bit.
    let image = edge_runtime::image::rgb8_to_vae_input(&rgb, 64, 64);
    assert_eq!(image, r["image"].data, "preprocessed image");
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let size = plan.meta().size(64, 64).unwrap().clone();
    let ours = edge_runtime::pipeline::encode_image(&mut s, &size, &rgb).unwrap();
    let e = rel_max_err(&ours, &r["init_latents"].data);
    eprintln!("VAE encode: init latents rel max err {e:e}");
    assert!(e < 1e-3, "{e}");
    let e = rel_max_err(
        &ours,
        &r["latent_mode"]
            .data
            .iter()
            .map(|x| x * 0.13025)
            .collect::<Vec<_>>(),
    );
    assert!(e < 1e-3, "{e}");
}

struct Run {
    name: &'static str,
    method: SamplingMethod,
    steps: usize,
    strength: f64,
}

const RUNS: [Run; 3] = [
    Run {
        name: "dpm_10_s0.6_cat_64x64",
        method: SamplingMethod::DpmPp2m,
        steps: 10,
        strength: 0.6,
    },
    Run {
        name: "dpm_10_s0.3_cat_64x64",
        method: SamplingMethod::DpmPp2m,
        steps: 10,
        strength: 0.3,
    },
    Run {
        name: "euler_8_s0.6_cat_64x64",
        method: SamplingMethod::Euler,
        steps: 8,
        strength: 0.6,
    },
];

fn params(run: &Run, noise: Option<Vec<f32>>) -> GenerateParams {
    GenerateParams {
        prompt: "a lovely cat".into(),
        negative_prompt: String::new(),
        steps: run.steps,
        cfg_scale: 4.5,
        method: run.method,
        seed: 2024,
        width: 64,
        height: 64,
        rng: Default::default(),
        karras: None,
        init_latents: noise,
        init_image: Some(InitImage {
            rgb: input_rgb(),
            strength: run.strength,
        }),
        decoder: Default::default(),
        preview: None,
    }
}

fn reference(run: &Run) -> HashMap<String, RefTensor> {
    read_safetensors(&fixture(&format!(
        "img2img/pipeline_{}.safetensors",
        run.name
    )))
}

#[test]
fn img2img_runs_match_the_reference_with_given_and_seeded_noise() {
    let (plan, _) = plan(true);
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    for run in &RUNS {
        let r = reference(run);
        let mut steps = 0;
        let out = edge_runtime::generate(
            &mut s,
            &params(run, Some(r["noise"].data.clone())),
            &mut |p| {
                if let edge_runtime::Progress::Step { total, .. } = p {
                    steps = total;
                }
            },
        )
        .unwrap();
        assert_eq!(
            steps,
            r["timesteps_used"].data.len(),
            "{}: steps run",
            run.name
        );
        let e = rel_max_err(&out.latents, &r["final_latents"].data);
        eprintln!("img2img {}: final latents rel max err {e:e}", run.name);
        assert!(e < 1e-3, "{}: {e}", run.name);
        assert_png_close(run.name, &out.rgb, &r["image_uint8"].data);
        // The seed's noise is the stored noise (torch.Generator("cpu").manual_seed(2024)).
        let seeded = edge_runtime::generate(&mut s, &params(run, None), &mut |_| {}).unwrap();
        assert_eq!(seeded.latents, out.latents, "{}: seeded run", run.name);
    }
}

#[test]
fn img2img_is_refused_without_an_encoder_or_a_step() {
    let (with, with_len) = plan(true);
    let (without, without_len) = plan(false);
    eprintln!(
        "pixart-sigma-tiny 64x64 plan: {with_len} bytes with the VAE encoder, {without_len} without"
    );
    assert!(without.meta().sizes[0].encoder_stage.is_none());
    assert!(with_len > without_len);
    let run = &RUNS[0];
    let mut s = Session::new(&without, edge_kernels::generic(), None).unwrap();
    let e = edge_runtime::generate(&mut s, &params(run, None), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("no VAE encoder"), "{e}");
    let mut s = Session::new(&with, edge_kernels::generic(), None).unwrap();
    let mut p = params(run, None);
    p.init_image.as_mut().unwrap().strength = 0.05;
    let e = edge_runtime::generate(&mut s, &p, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--strength 0.05") && e.contains("no denoising step"),
        "{e}"
    );
    // Python's int(10 · 0.7) = int(7.000000000000001) = 7, so t_start = 3; through f32 (0.7 →
    // 0.69999999) it would be 6 and t_start 4. Heun's order 2 doubles the begin index.
    assert_eq!(
        edge_runtime::sampler::img2img_begin(10, 0.7, SamplingMethod::DpmPp2m).unwrap(),
        3
    );
    assert_eq!(
        edge_runtime::sampler::img2img_begin(10, 0.6, SamplingMethod::Heun).unwrap(),
        8
    );
}
