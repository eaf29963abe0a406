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
        // Windows start at even latent pixels (the Winograd convolutions' 2×2 tiles): a side
        // of 7 latent pixels (56) on 8 is taken as 6 (48).
        for (tw, th) in [(48, 48), (56, 48), (48, 64), (64, 56)] {
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
        err.contains("--vae-tile-size") && err.contains("halo") && err.contains("48"),
        "{err}"
    );
    // 40 px (5 latent pixels) is taken as 32 (even window starts), and the message says so.
    let opts = CompileOptions {
        tiling: tiles(TileMode::Exact, 40, 40),
        ..opts
    };
    let err = edge_planner::compile_folder(&m, &opts)
        .err()
        .expect("a 40 px window is taken as 32")
        .to_string();
    assert!(
        err.contains("taken as 32x32") && err.contains("48"),
        "{err}"
    );
    // A side that is shortened for its parity is named in the plan's notes.
    let opts = CompileOptions {
        tiling: tiles(TileMode::Exact, 56, 48),
        ..opts
    };
    let c = edge_planner::compile_folder(&m, &opts).expect("56x48 is taken as 48x48");
    let notes = c.meta.notes.join("\n");
    assert!(
        notes.contains("--vae-tile-size 56x48: the exact tiles are 48x48 image pixels"),
        "{notes}"
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

/// Blended tiles with GroupNorm statistics estimated on the reduced latent
/// (`--vae-tile-mode estimate`): against the whole-image decode from the same demo latents,
/// within the bounds `edge_schema::tiles::ESTIMATE_BOUND_LEVELS` states, and closer than the
/// tiles decoded alone, for square and non-square images, several tiles, overlaps and factors,
/// including tiles that hold only background.
#[test]
fn demo_estimated_statistics_stay_close_to_the_whole_decode() {
    let m = demo("pixart-shapes-64");
    for ((w, h), prompt, cases) in [
        (
            (128, 128),
            "a large red circle on a blue background",
            vec![
                ((64, 64), 0.5, 2),
                ((64, 64), 0.25, 4),
                ((96, 96), 0.5, 2),
                ((48, 80), 0.5, 4),
            ],
        ),
        (
            (192, 128),
            "a small green triangle on a gray background at the left",
            vec![((64, 64), 0.5, 2), ((64, 64), 0.5, 4), ((128, 64), 0.25, 4)],
        ),
        (
            (256, 256),
            "a large red circle on a blue background",
            vec![
                ((128, 128), 0.5, 8),
                ((96, 96), 0.25, 4),
                ((64, 64), 0.5, 2),
            ],
        ),
    ] {
        let whole_plan = plan(&m, w, h, TileRequest::default());
        let lat = demo_latents(&whole_plan, prompt, w, h);
        let whole = decode(&whole_plan, &lat);
        let peak = whole.iter().fold(0f32, |a, v| a.max(v.abs()));
        for ((tw, th), overlap, factor) in cases {
            let req = |mode| TileRequest {
                overlap: Some(overlap),
                estimate_factor: (mode == TileMode::Estimate).then_some(factor),
                ..tiles(mode, tw, th)
            };
            let p = plan(&m, w, h, req(TileMode::Estimate));
            let e = p.meta().sizes[0]
                .decoder_tiling
                .as_ref()
                .and_then(|t| t.estimate.clone())
                .expect("estimated statistics");
            assert_eq!(e.factor, factor);
            let est = decode(&p, &lat);
            let blend = decode(&plan(&m, w, h, req(TileMode::Blend)), &lat);
            let (mean, max, within) = levels(&est, &whole, w as usize, h as usize);
            let (bmean, bmax, _) = levels(&blend, &whole, w as usize, h as usize);
            let raw = max_abs_diff(&est, &whole) / f64::from(peak);
            eprintln!(
                "{w}x{h}, {tw}x{th} tiles, overlap {overlap}, 1/{factor}: estimate vs whole mean {mean:.2} levels, max {max}, {:.1}% within one level, max |diff| {raw:.3} of max |whole|; blended alone: mean {bmean:.2}, max {bmax}",
                within * 100.0
            );
            let &(_, bound_mean, bound_max) = edge_schema::tiles::ESTIMATE_BOUND_LEVELS
                .iter()
                .find(|b| factor <= b.0)
                .expect("a stated bound for every factor tested");
            assert!(
                mean <= bound_mean && max <= bound_max,
                "{w}x{h}, {tw}x{th}, 1/{factor}: mean {mean:.2} / max {max} beyond the stated {bound_mean} / {bound_max}"
            );
            assert!(
                mean < bmean && max < bmax,
                "{w}x{h}, {tw}x{th}, 1/{factor}: the estimate ({mean:.2} / {max}) is no closer than tiles alone ({bmean:.2} / {bmax})"
            );
        }
    }
}

fn encode(plan: &Plan, rgb: &[u8]) -> Vec<f32> {
    let mut s = Session::new(plan, edge_kernels_cpu::best(), None).unwrap();
    let size = plan.meta().sizes[0].clone();
    edge_runtime::pipeline::encode_image(&mut s, &size, rgb).unwrap()
}

/// An RGB test image `[h, w, 3]`: the demo model's whole decode of its own latents where given,
/// else smooth colour ramps with a sharp diagonal edge (not constant, so that every GroupNorm
/// has a real spread).
fn test_rgb(w: usize, h: usize) -> Vec<u8> {
    let mut rgb = Vec::with_capacity(3 * w * h);
    for y in 0..h {
        for x in 0..w {
            let edge = if x * h > y * w { 200 } else { 30 };
            rgb.extend([(x * 255 / w) as u8, (y * 255 / h) as u8, edge]);
        }
    }
    rgb
}

/// Exact encoder tiles (image to image): the init latents of the tiled encode equal the
/// whole-image encode's bit for bit, with the activations held in memory or in a spill file,
/// on the fixture's input image (whose whole encode matches diffusers' reference) and on the
/// demo model's own images, square and not, several windows.
#[test]
fn exact_encoder_tiles_equal_the_whole_encode() {
    let bytes = std::fs::read(fixture("img2img/input_A_64x64.png")).unwrap();
    let (_, _, input_a) = edge_runtime::image::decode_png_rgb(&bytes, "input_A_64x64.png").unwrap();
    let r = read_safetensors(&fixture("img2img/vae_enc_input_A_64x64.safetensors"));
    let demo_image = |w: u32, h: u32| {
        let m = demo("pixart-shapes-64");
        let p = plan(&m, w, h, TileRequest::default());
        let lat = demo_latents(
            &p,
            "a small green triangle on a gray background at the left",
            w,
            h,
        );
        edge_runtime::image::to_rgb8(&decode(&p, &lat), w as usize, h as usize)
    };
    type Case = (std::path::PathBuf, (u32, u32), Vec<u8>, Vec<(u32, u32)>);
    let cases: Vec<Case> = vec![
        (
            fixture("pixart-sigma-tiny"),
            (64, 64),
            input_a,
            vec![(48, 48), (48, 56), (56, 48)],
        ),
        (
            fixture("pixart-alpha-tiny"),
            (64, 96),
            test_rgb(64, 96),
            vec![(48, 48), (64, 48)],
        ),
        (
            demo("pixart-shapes-64"),
            (128, 128),
            demo_image(128, 128),
            vec![(48, 48), (64, 96)],
        ),
        (
            demo("pixart-shapes-64"),
            (192, 128),
            demo_image(192, 128),
            vec![(64, 64), (128, 48)],
        ),
    ];
    for (m, (w, h), rgb, windows) in cases {
        let whole_plan = plan(&m, w, h, TileRequest::default());
        assert!(whole_plan.meta().sizes[0].encoder_tiling.is_none());
        let whole = encode(&whole_plan, &rgb);
        if (w, h) == (64, 64) && m.ends_with("pixart-sigma-tiny") {
            let e = rel_max_err(&whole, &r["init_latents"].data);
            assert!(e < 1e-3, "whole encode against diffusers: {e}");
        }
        for (tw, th) in windows {
            for req in [tiles(TileMode::Exact, tw, th), spilled(tw, th)] {
                let p = plan(&m, w, h, req.clone());
                let t = p.meta().sizes[0]
                    .encoder_tiling
                    .clone()
                    .expect("encoder tiles");
                assert_eq!(
                    t.held == edge_schema::plan::HeldIn::File,
                    req.hold == TileHold::File
                );
                let tiled = encode(&p, &rgb);
                assert!(
                    same_bits(&tiled, &whole),
                    "{} {w}x{h} in {tw}x{th} encoder tiles ({:?}, halo {}): max |diff| {}",
                    m.display(),
                    t.held,
                    t.halo_latent,
                    max_abs_diff(&tiled, &whole)
                );
            }
        }
    }
}
