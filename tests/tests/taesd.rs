//! The tiny decoder (`edgeplan compile --taesd`) against the `taesd/` fixtures (README §15):
//! decodes of both cases, the 4-step pipeline run decoded with it, and previews (the last
//! preview of the clean estimate is the final image).

use edge_e2e::*;
use edge_planner::compile::{compile_inputs, ComponentFiles};
use edge_planner::CompileOptions;
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{Decoder, GenerateParams, Plan, PreviewSpec, Session};

fn plan(taesd: bool) -> (Plan, usize) {
    let opts = CompileOptions {
        sizes: vec![(64, 64), (64, 96)],
        taesd: taesd.then(|| fixture("taesd/taesd-tiny")),
        ..Default::default()
    };
    fixture_plan("pixart-sigma-tiny", &opts)
}

#[test]
fn tiny_decoder_stage_decodes_like_autoencoder_tiny() {
    let (_, without_len) = plan(false);
    let (plan, with_len) = plan(true);
    eprintln!("pixart-sigma-tiny plan (64x64, 64x96): {with_len} bytes with the tiny decoder, {without_len} without");
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    for (case, w, h) in [("dec_64x64", 64, 64), ("dec_w64_h96", 64, 96)] {
        let r = read_safetensors(&fixture(&format!("taesd/{case}.safetensors")));
        let size = plan.meta().size(w, h).unwrap().clone();
        let image = edge_runtime::pipeline::decode_tiny(&mut s, &size, &r["latents"].data).unwrap();
        let e = rel_max_err(&image, &r["image"].data);
        eprintln!("tiny decoder {case}: rel max err {e:e}");
        assert!(e < 1e-3, "{case}: {e}");
        let rgb = edge_runtime::image::to_rgb8(&image, w as usize, h as usize);
        assert_png_close(case, &rgb, &r["image_uint8"].data);
    }
}

fn params(decoder: Decoder, preview: Option<PreviewSpec>) -> GenerateParams {
    let noise = read_safetensors(&fixture(
        "pixart-sigma-tiny/reference/pipeline_dpm_4_cat_64x64.safetensors",
    ));
    GenerateParams {
        decoder,
        preview,
        ..cat_params(
            4,
            SamplingMethod::DpmPp2m,
            Some(noise["initial_noise"].data.clone()),
        )
    }
}

#[test]
fn pipeline_with_the_tiny_decoder_matches_diffusers_and_previews_end_on_the_image() {
    let (plan, _) = plan(true);
    let r = read_safetensors(&fixture("taesd/pipeline_taesd_dpm_4_cat_64x64.safetensors"));
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let out = edge_runtime::generate(&mut s, &params(Decoder::Tiny, None), &mut |_| {}).unwrap();
    let e = rel_max_err(&out.latents, &r["final_latents"].data);
    eprintln!("taesd pipeline: final latents rel max err {e:e}");
    assert!(e < 1e-3, "{e}");
    assert_png_close("taesd pipeline", &out.rgb, &r["image_uint8"].data);

    for noisy in [false, true] {
        let mut seen = Vec::new();
        let spec = PreviewSpec {
            decoder: Decoder::Tiny,
            interval: 3,
            noisy,
        };
        let with = edge_runtime::generate_previewing(
            &mut s,
            &params(Decoder::Tiny, Some(spec)),
            &mut |_| edge_runtime::Flow::Continue,
            &mut |p| {
                seen.push((p.step, p.total, p.rgb.to_vec()));
                Ok(())
            },
        )
        .unwrap();
        // Every 3rd step and the last; previews change nothing.
        let steps: Vec<(usize, usize)> = seen.iter().map(|(s, t, _)| (*s, *t)).collect();
        assert_eq!(steps, vec![(3, 4), (4, 4)], "noisy={noisy}");
        assert_eq!(with.latents, out.latents);
        // DPM-Solver++'s last step lands on its clean estimate: both previews of the last
        // step show the final image.
        assert_eq!(seen[1].2, out.rgb, "noisy={noisy}");
        assert_ne!(seen[0].2, out.rgb);
    }
    // A VAE preview decodes with the VAE.
    let vae = edge_runtime::generate(&mut s, &params(Decoder::Vae, None), &mut |_| {}).unwrap();
    let mut last = Vec::new();
    edge_runtime::generate_previewing(
        &mut s,
        &params(
            Decoder::Tiny,
            Some(PreviewSpec {
                decoder: Decoder::Vae,
                interval: 4,
                noisy: false,
            }),
        ),
        &mut |_| edge_runtime::Flow::Continue,
        &mut |p| {
            last = p.rgb.to_vec();
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(last, vae.rgb);
}

#[test]
fn the_tiny_decoder_is_refused_when_the_plan_lacks_it() {
    let (plan, _) = plan(false);
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let e = edge_runtime::generate(&mut s, &params(Decoder::Tiny, None), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no tiny decoder") && e.contains("--taesd"),
        "{e}"
    );
    let opts = CompileOptions {
        sizes: vec![(64, 64)],
        taesd: Some(fixture("pixart-sigma-tiny/vae")),
        ..Default::default()
    };
    let e = compile_inputs(
        Some(&fixture("pixart-sigma-tiny")),
        &ComponentFiles::default(),
        &opts,
    )
    .err()
    .expect("an AutoencoderKL is not a tiny decoder")
    .to_string();
    assert!(
        e.contains("--taesd") && e.contains("AutoencoderTiny"),
        "{e}"
    );
}
