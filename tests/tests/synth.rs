//! Synthetic pipelines (`edgeplan synth`): the small preset runs synth → compile → generate;
//! the real presets' tensor lists have the parameter counts of the released models.

use edge_e2e::*;
use edge_runtime::{GenerateParams, Plan, Session};
use edge_synth::{self as synth, SynthOptions, WeightDType};

fn spread(v: impl Iterator<Item = f32>) -> (f32, f32) {
    v.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    })
}

#[test]
fn small_preset_compiles_and_generates_finite_images() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pixart-small");
    let preset = synth::preset("pixart-sigma-small").unwrap();
    let opts = SynthOptions {
        seed: 11,
        dtype: WeightDType::F16,
        tokenizer_from: Some(demo("pixart-shapes-64")),
        force: false,
    };
    let report = synth::synthesize(&preset, &dir, &opts).unwrap();
    assert!(report.weight_files >= 4, "{report:?}");

    let bytes = compiled_plan(&dir, &[(64, 64)], Some(32));
    let plan = Plan::from_bytes(&bytes).unwrap();
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let params = GenerateParams {
        seed: 5,
        ..edge_e2e::demo_params(2)
    };
    let out = edge_runtime::generate(&mut s, &params, &mut |_| {}).unwrap();
    assert_eq!(out.latents.len(), 4 * 8 * 8);
    assert!(
        out.latents.iter().all(|v| v.is_finite()),
        "non-finite latents"
    );
    let (lo, hi) = spread(out.latents.iter().copied());
    assert!(hi - lo > 1e-3, "constant latents {lo}..{hi}");
    // Random weights predict noise unrelated to the true noise; the first DPM-Solver++ step
    // turns that error into x0 = (x − σ·ε̂)/α with σ/α ≈ 157 at t = 999 (linear betas), times
    // the guidance scale, so latents of a few hundred to a few thousand are expected. Bound
    // far above that but far below anything that has overflowed.
    assert!(lo > -1e5 && hi < 1e5, "latents out of range {lo}..{hi}");
    assert_eq!(out.rgb.len(), 64 * 64 * 3);
    let (lo, hi) = spread(out.rgb.iter().map(|&b| f32::from(b)));
    assert!(hi > lo, "constant image {lo}..{hi}");
}

/// Parameter counts of the released models, derived by hand from their published configs:
///
/// - PixArt-Σ XL-2 (d = 1152, 28 blocks, caption 4096, patch 2, 4 → 8 channels):
///   patch embed 1152·16 + 1152 = 19,584; timestep MLP 1152·256 + 1152 + 1152² + 1152 =
///   1,624,320; adaLN linear 6912·1152 + 6912 = 7,969,536; caption MLP 1152·4096 + 1152 +
///   1152² + 1152 = 6,048,000; per block 6·1152 + 8·(1152² + 1152) + (4608·1152 + 4608) +
///   (1152·4608 + 1152) = 21,255,552, × 28 = 595,155,456; final table 2304; proj_out
///   32·1152 + 32 = 36,896; total 610,856,096.
/// - T5 v1.1 XXL encoder (d 4096, 64 heads × 64, d_ff 10240, 24 blocks, vocabulary 32128):
///   embedding 131,596,288; per block 4·4096² + 3·4096·10240 + 2·4096 = 192,946,176, × 24 =
///   4,630,708,224; relative bias 32·64 = 2048; final norm 4096; total 4,762,310,656.
/// - SDXL VAE (AutoencoderKL 128/256/512/512, 2 ResNets per block): 83,653,863, the count
///   `sum(p.numel() for p in AutoencoderKL(...).parameters())` gives for the SD/SDXL VAE
///   (encoder 34,163,592 + decoder 49,490,179 + quant convs 72 + 20).
#[test]
fn real_preset_has_the_released_parameter_counts() {
    let p = synth::preset("pixart-sigma-xl2-1024").unwrap();
    assert_eq!(p.transformer.parameter_count(), 610_856_096);
    assert_eq!(p.text_encoder.parameter_count(), 4_762_310_656);
    assert_eq!(p.vae.parameter_count(), 83_653_863);
    let part = |prefix: &str| -> u64 {
        p.vae
            .tensors
            .iter()
            .filter(|t| t.name.starts_with(prefix))
            .map(|t| t.numel())
            .sum()
    };
    assert_eq!(part("encoder."), 34_163_592);
    assert_eq!(part("decoder."), 49_490_179);
    assert_eq!(part("quant_conv.") + part("post_quant_conv."), 92);
}
