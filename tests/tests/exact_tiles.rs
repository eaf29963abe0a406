//! Exact tiled VAE decoding (GroupNorm statistics of the whole image, see
//! `edge_schema::tiles`): from the same latents, the tiled decode equals the whole-image
//! decode bit for bit, on the fixtures' references and on the demo model, for square and
//! non-square images, several window sizes, and windows that hold only background, with the
//! activations between GroupNorms held in memory or in a spill file; the blended tiles of
//! before do not (their difference is printed for the record).

use edge_e2e::*;
use edge_planner::tiling::{TileHold, TileMode, TileRequest};
use edge_planner::CompileOptions;
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{GenerateParams, Plan, Session};

fn plan(model: &std::path::Path, w: u32, h: u32, tiling: TileRequest) -> Plan {
    let opts = CompileOptions {
        sizes: vec![(w, h)],
        tiling,
        ..Default::default()
    };
    let mut c = edge_planner::compile_folder(model, &opts)
        .unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    Plan::from_bytes(&edge_planner::write::assemble(&mut c.meta, &c.table).unwrap()).unwrap()
}

fn tiles(mode: TileMode, w: u32, h: u32) -> TileRequest {
    TileRequest {
        mode,
        size: Some((w, h)),
        ..Default::default()
    }
}

/// Exact tiles whose held activations live in a spill file.
fn spilled(w: u32, h: u32) -> TileRequest {
    TileRequest {
        hold: TileHold::File,
        ..tiles(TileMode::Exact, w, h)
    }
}

fn decode(plan: &Plan, latents: &[f32]) -> Vec<f32> {
    let mut s = Session::new(plan, edge_kernels_cpu::best(), None).unwrap();
    let size = plan.meta().sizes[0].clone();
    edge_runtime::pipeline::decode_latents(&mut s, &size, latents).unwrap()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Mean and max |difference| in 0…255 levels, and the share of values within one level.
fn levels(a: &[f32], b: &[f32], w: usize, h: usize) -> (f64, u8, f64) {
    let (pa, pb) = (
        edge_runtime::image::to_rgb8(a, w, h),
        edge_runtime::image::to_rgb8(b, w, h),
    );
    let d: Vec<u8> = pa.iter().zip(&pb).map(|(x, y)| x.abs_diff(*y)).collect();
    let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64;
    let within = d.iter().filter(|&&v| v <= 1).count() as f64 / d.len() as f64;
    (mean, d.iter().copied().max().unwrap_or(0), within)
}

#[test]
fn fixture_exact_tiles_equal_the_whole_decode() {
    for (model, reference, (w, h)) in [
        ("pixart-sigma-tiny", "vae_dec_64x64", (64, 64)),
        ("pixart-alpha-tiny", "vae_dec_64x64", (64, 64)),
        ("pixart-alpha-tiny", "vae_dec_w64_h96", (64, 96)),
    ] {
        let m = fixture(model);
        let r = read_safetensors(&fixture(&format!(
            "{model}/reference/{reference}.safetensors"
        )));
        let lat = &r["latents"].data;
        let whole = decode(&plan(&m, w, h, TileRequest::default()), lat);
        assert_close(
            &format!("{model} {reference} whole"),
            &whole,
            &r["image"].data,
            1e-4,
        );
        for (tw, th) in [(40, 40), (48, 48), (56, 40), (40, 64)] {
            let p = plan(&m, w, h, tiles(TileMode::Exact, tw, th));
            let t = p.meta().sizes[0].decoder_tiling.clone().expect("tiled");
            let sync = t.sync.clone().expect("exact tiles");
            assert_eq!(
                sync.halo_latent, 2,
                "{model}: 1.5 latent pixels of context, rounded up"
            );
            assert_eq!(sync.held, edge_schema::plan::HeldIn::Memory);
            let img = decode(&p, lat);
            assert!(
                same_bits(&img, &whole),
                "{model} {w}x{h} in {tw}x{th} exact tiles: max |diff| {}",
                max_abs_diff(&img, &whole)
            );
            let p = plan(&m, w, h, spilled(tw, th));
            let held = p.meta().sizes[0]
                .decoder_tiling
                .as_ref()
                .and_then(|t| t.sync.as_ref());
            assert_eq!(held.map(|s| s.held), Some(edge_schema::plan::HeldIn::File));
            assert!(
                same_bits(&decode(&p, lat), &whole),
                "{model} {w}x{h} in {tw}x{th} exact tiles held in a file differ"
            );
        }
    }
}

/// Final latents of a 4-step demo run (the denoiser of `p`, which has one size).
fn demo_latents(p: &Plan, prompt: &str, w: u32, h: u32) -> Vec<f32> {
    let mut s = Session::new(p, edge_kernels_cpu::best(), None).unwrap();
    let params = GenerateParams {
        prompt: prompt.into(),
        negative_prompt: String::new(),
        steps: 4,
        cfg_scale: 4.5,
        method: SamplingMethod::DpmPp2m,
        seed: 3,
        width: w,
        height: h,
        rng: Default::default(),
        karras: None,
        init_latents: None,
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    edge_runtime::generate(&mut s, &params, &mut |_| {})
        .unwrap()
        .latents
}

#[test]
fn demo_exact_tiles_equal_the_whole_decode_and_blended_tiles_do_not() {
    let m = demo("pixart-shapes-64");
    for ((w, h), prompt, windows) in [
        (
            (128, 128),
            "a large red circle on a blue background",
            vec![(64, 64), (96, 96), (48, 80)],
        ),
        (
            (192, 128),
            "a small green triangle on a gray background at the left",
            vec![(64, 64), (128, 64)],
        ),
    ] {
        let whole_plan = plan(&m, w, h, TileRequest::default());
        let lat = demo_latents(&whole_plan, prompt, w, h);
        let whole = decode(&whole_plan, &lat);
        for (tw, th) in windows {
            let exact = decode(&plan(&m, w, h, tiles(TileMode::Exact, tw, th)), &lat);
            assert!(
                same_bits(&exact, &whole),
                "{w}x{h} in {tw}x{th} exact tiles differ"
            );
            let exact = decode(&plan(&m, w, h, spilled(tw, th)), &lat);
            assert!(
                same_bits(&exact, &whole),
                "{w}x{h} in {tw}x{th} exact tiles held in a file differ"
            );
            let blend = decode(&plan(&m, w, h, tiles(TileMode::Blend, tw, th)), &lat);
            let (mean, max, within) = levels(&blend, &whole, w as usize, h as usize);
            eprintln!(
                "{w}x{h}, {tw}x{th} blended tiles vs whole: mean {mean:.2} levels, max {max}, {:.1}% within one level (exact: identical)",
                within * 100.0
            );
            assert!(max > 1, "blended tiles should differ from the whole decode");
        }
    }
}

#[test]
fn exact_windows_too_small_for_the_halo_are_refused() {
    let m = fixture("pixart-sigma-tiny");
    let opts = CompileOptions {
        sizes: vec![(64, 64)],
        tiling: tiles(TileMode::Exact, 32, 32),
        ..Default::default()
    };
    let err = edge_planner::compile_folder(&m, &opts)
        .err()
        .expect("a 32 px window has no core inside a 16 px halo")
        .to_string();
    assert!(
        err.contains("--vae-tile-size") && err.contains("halo") && err.contains("40"),
        "{err}"
    );
}

/// Under a budget too small for the held activations in memory: `auto` spills them to a file,
/// while an explicit `--vae-tile-hold memory` (with or without a tile size) is refused naming
/// the way out instead of falling back to blended tiles or writing a plan that cannot run.
#[test]
fn hold_choices_under_a_tight_budget() {
    let m = demo("pixart-shapes-64");
    let compile = |hold: TileHold, size: Option<(u32, u32)>| {
        let opts = CompileOptions {
            sizes: vec![(512, 512)],
            max_ram: Some(170 << 20),
            tiling: TileRequest {
                hold,
                size,
                ..Default::default()
            },
            ..Default::default()
        };
        edge_planner::compile_folder(&m, &opts)
    };
    let auto = compile(TileHold::Auto, None).expect("auto fits by spilling");
    let sync = auto.meta.sizes[0]
        .decoder_tiling
        .as_ref()
        .and_then(|t| t.sync.clone())
        .expect("exact tiles");
    assert_eq!(sync.held, edge_schema::plan::HeldIn::File);
    for size in [None, Some((128, 128))] {
        let err = compile(TileHold::Memory, size)
            .err()
            .unwrap_or_else(|| panic!("memory hold with {size:?} fits a 170M budget?"))
            .to_string();
        assert!(
            err.contains("--max-ram") && err.contains("--vae-tile-hold auto"),
            "{size:?}: {err}"
        );
    }
}
