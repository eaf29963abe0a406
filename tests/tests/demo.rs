//! The shipped demo model (`demo/pixart-shapes-64`, trained): numbers against its diffusers
//! references, and content of images generated from our own seeded noise (demo README §7).

use edge_e2e::*;
use edge_runtime::{GenerateParams, Plan, Session};

const PALETTE: [(&str, [f64; 3]); 7] = [
    ("red", [225.0, 30.0, 30.0]),
    ("green", [30.0, 170.0, 50.0]),
    ("blue", [35.0, 70.0, 225.0]),
    ("yellow", [245.0, 215.0, 35.0]),
    ("white", [245.0, 245.0, 245.0]),
    ("black", [15.0, 15.0, 15.0]),
    ("gray", [128.0, 128.0, 128.0]),
];

fn nearest(c: [f64; 3]) -> &'static str {
    PALETTE
        .iter()
        .min_by(|a, b| {
            let da: f64 = (0..3).map(|i| (a.1[i] - c[i]).powi(2)).sum();
            let db: f64 = (0..3).map(|i| (b.1[i] - c[i]).powi(2)).sum();
            da.total_cmp(&db)
        })
        .map(|p| p.0)
        .unwrap_or("?")
}

/// Mean colour of the pixels selected by `pick(y, x)`, and the per-channel std.
fn region(rgb: &[u8], pick: impl Fn(usize, usize) -> bool) -> ([f64; 3], [f64; 3]) {
    let mut sum = [0f64; 3];
    let mut sq = [0f64; 3];
    let mut n = 0f64;
    for y in 0..64 {
        for x in 0..64 {
            if pick(y, x) {
                for c in 0..3 {
                    let v = f64::from(rgb[(y * 64 + x) * 3 + c]);
                    sum[c] += v;
                    sq[c] += v * v;
                }
                n += 1.0;
            }
        }
    }
    let mean = sum.map(|s| s / n);
    let std = [0, 1, 2].map(|c| (sq[c] / n - mean[c] * mean[c]).max(0.0).sqrt());
    (mean, std)
}

/// The demo README §7 check: centre colour, border colour, plain border.
fn check_content(rgb: &[u8], centre: (usize, usize), want_centre: &str, want_border: &str) {
    let (c0, c1) = centre;
    let (cm, _) = region(rgb, |y, x| (c0..=c1).contains(&y) && (c0..=c1).contains(&x));
    let (bm, bs) = region(rgb, |y, x| !(4..60).contains(&y) || !(4..60).contains(&x));
    assert_eq!(nearest(cm), want_centre, "centre mean {cm:?}");
    assert_eq!(nearest(bm), want_border, "border mean {bm:?}");
    assert!(bs.iter().all(|&s| s < 10.0), "border not plain: std {bs:?}");
}

fn demo_plan() -> Plan {
    let bytes = compiled_plan(&demo("pixart-shapes-64"), &[(64, 64)], None);
    Plan::from_bytes(&bytes).unwrap()
}

fn params(prompt: &str, seed: u64, init: Option<Vec<f32>>) -> GenerateParams {
    GenerateParams {
        prompt: prompt.into(),
        seed,
        init_latents: init,
        ..edge_e2e::demo_params(20)
    }
}

#[test]
fn demo_matches_diffusers_from_identical_noise() {
    let plan = demo_plan();
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    for (run, prompt) in [
        ("redcircle", "a large red circle on a blue background"),
        (
            "yellowsquare",
            "a small yellow square on a black background",
        ),
        ("empty", ""),
    ] {
        let r = read_safetensors(&demo(&format!(
            "reference/pipeline_dpm_20_{run}_64x64.safetensors"
        )));
        let out = edge_runtime::generate(
            &mut s,
            &params(prompt, 0, Some(r["initial_noise"].data.clone())),
            &mut |_| {},
        )
        .unwrap();
        let rel = rel_l2(&out.latents, &r["final_latents"].data);
        assert!(rel < 1e-4, "{run}: final latents rel L2 {rel:e}");
        let img = &r["image_uint8"].data;
        let worst = out
            .rgb
            .iter()
            .zip(img)
            .map(|(&a, &b)| (f32::from(a) - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1.0, "{run}: PNG differs by {worst} levels");
    }
}

#[test]
fn demo_images_from_our_noise_show_the_prompt() {
    let plan = demo_plan();
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    for seed in [0u64, 1, 2] {
        let out = edge_runtime::generate(
            &mut s,
            &params("a large red circle on a blue background", seed, None),
            &mut |_| {},
        )
        .unwrap();
        check_content(&out.rgb, (24, 39), "red", "blue");
        let out = edge_runtime::generate(
            &mut s,
            &params("a small yellow square on a black background", seed, None),
            &mut |_| {},
        )
        .unwrap();
        check_content(&out.rgb, (28, 35), "yellow", "black");
    }
}

/// A guidance scale that overflows f32 ends the run with the step it diverged at and the
/// guidance scale named, and no image (the runtime's check; the CLI bounds the scale before).
#[test]
fn diverging_guidance_names_the_step() {
    let plan = demo_plan();
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let mut p = params("a large red circle on a blue background", 1, None);
    p.cfg_scale = 1e38;
    p.steps = 4;
    let err = edge_runtime::generate(&mut s, &p, &mut |_| {}).unwrap_err();
    assert!(
        matches!(err, edge_runtime::Error::Diverged { step: 1..=4, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("diverged") && msg.contains("guidance scale"),
        "{msg}"
    );
}
