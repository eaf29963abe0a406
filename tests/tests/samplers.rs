//! The samplers beyond DPM-Solver++ and Euler against diffusers' own runs
//! (`tests/fixtures/samplers/`, README §10 of the shared set): the real pixart-sigma-tiny
//! pipeline, "a lovely cat", 64×64, with Euler ancestral, Heun, KDPM2 (`dpm2`), DDIM, LCM,
//! UniPC and DPM-Solver++ with karras sigmas.
//! Deterministic samplers start from the stored initial noise; the stochastic ones (Euler
//! ancestral, LCM) draw it and every step's noise from `torch.Generator("cpu").manual_seed(7)`.
//! Checked: the schedule (timesteps, sigmas, midpoints), the final latents within
//! 1e-3 × max(1, max|ref|) and the PNG within one level on ≥ 99.5 % of values, 3 everywhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use edge_e2e::{assert_close, compiled_plan, fixture, read_safetensors};
use edge_runtime::rng::NoiseRng;
use edge_runtime::sampler::{Sampler, SamplingMethod};
use edge_runtime::{GenerateParams, Plan, Session};
use edge_schema::scheduler::SchedulerConfig;

/// The worst relative difference, `|a − b| / max(1e-6, |b|)`.
fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths");
    a.iter()
        .zip(b)
        .filter(|(_, y)| !y.is_nan())
        .map(|(x, y)| f64::from((x - y).abs()) / f64::from(y.abs()).max(1e-6))
        .fold(0.0, f64::max)
}

fn run(key: &str, method: SamplingMethod, steps: usize, cfg: f32, stochastic: bool) {
    run_with(key, method, steps, cfg, stochastic, false);
}

fn run_with(
    key: &str,
    method: SamplingMethod,
    steps: usize,
    cfg: f32,
    stochastic: bool,
    karras: bool,
) {
    // A key with a folder names its set; the others are in `samplers/`.
    let file = if key.contains('/') {
        key.replacen('/', "/pipeline_", 1)
    } else {
        format!("samplers/pipeline_{key}")
    };
    let r = read_safetensors(&fixture(&format!("{file}.safetensors")));
    // The schedule, against what diffusers' scheduler held.
    let mut config = SchedulerConfig::pixart();
    config.use_karras_sigmas = karras;
    let s = Sampler::new(&config, method, steps, 256).unwrap();
    let ts = &r["timesteps"].data;
    assert_eq!(
        s.timesteps().len(),
        ts.len(),
        "{key}: timesteps {:?}",
        s.timesteps()
    );
    assert!(
        max_rel(s.timesteps(), ts) < 1e-6,
        "{key}: timesteps {:?} vs {ts:?}",
        s.timesteps()
    );
    if let Some(sig) = r.get("sigmas") {
        let ours = &s.sigmas()[..sig.data.len().min(s.sigmas().len())];
        assert!(
            max_rel(ours, &sig.data[..ours.len()]) < 1e-6,
            "{key}: sigmas {ours:?} vs {:?}",
            sig.data
        );
    }
    if let Some(ip) = r.get("sigmas_interpol") {
        let ours = &s.schedule().sigmas_interpol;
        let n = ip.data.len().min(ours.len());
        assert!(
            max_rel(&ours[1..n], &ip.data[1..n]) < 1e-6,
            "{key}: midpoints {ours:?} vs {:?}",
            ip.data
        );
    }
    let noise = &r["initial_noise"];
    let bytes = compiled_plan(&fixture("pixart-sigma-tiny"), &[(64, 64)], None);
    let plan = Plan::from_bytes(&bytes).unwrap();
    let mut session = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let params = GenerateParams {
        prompt: "a lovely cat".into(),
        negative_prompt: String::new(),
        steps,
        cfg_scale: cfg,
        method,
        seed: 7,
        width: 64,
        height: 64,
        rng: NoiseRng::TorchCpu,
        karras: Some(karras),
        init_latents: (!stochastic).then(|| noise.data.clone()),
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    let out = edge_runtime::generate(&mut session, &params, &mut |_| {}).unwrap();
    let refl = &r["final_latents"].data;
    let err = edge_e2e::rel_max_err(&out.latents, refl);
    eprintln!("{key}: final latents max |diff| / max(1, max|ref|) = {err:.2e}");
    assert_close(&format!("{key} final latents"), &out.latents, refl, 1e-3);
    edge_e2e::assert_png_close(key, &out.rgb, &r["image_uint8"].data);
}

#[test]
fn euler_ancestral() {
    for n in [4, 8, 20] {
        run(
            &format!("euler_a_{n}_cat_64x64"),
            SamplingMethod::EulerAncestral,
            n,
            4.5,
            true,
        );
    }
}

#[test]
fn heun() {
    for n in [4, 8] {
        run(
            &format!("heun_{n}_cat_64x64"),
            SamplingMethod::Heun,
            n,
            4.5,
            false,
        );
    }
}

#[test]
fn dpm2() {
    for n in [4, 8] {
        run(
            &format!("kdpm2_{n}_cat_64x64"),
            SamplingMethod::Dpm2,
            n,
            4.5,
            false,
        );
    }
}

#[test]
fn ddim() {
    for n in [4, 8] {
        run(
            &format!("ddim_{n}_cat_64x64"),
            SamplingMethod::Ddim,
            n,
            4.5,
            false,
        );
    }
}

#[test]
fn dpm_karras() {
    for n in [4, 8] {
        run_with(
            &format!("dpm_karras_{n}_cat_64x64"),
            SamplingMethod::DpmPp2m,
            n,
            4.5,
            false,
            true,
        );
    }
}

/// Karras sigmas for euler, heun and dpm2 against diffusers' runs with `use_karras_sigmas`
/// (`samplers-karras/`, made here: README §16).
#[test]
fn k_samplers_with_karras_sigmas() {
    for (key, method) in [
        ("euler_karras", SamplingMethod::Euler),
        ("heun_karras", SamplingMethod::Heun),
        ("kdpm2_karras", SamplingMethod::Dpm2),
    ] {
        for n in [4, 8] {
            run_with(
                &format!("samplers-karras/{key}_{n}_cat_64x64"),
                method,
                n,
                4.5,
                false,
                true,
            );
        }
    }
}

#[test]
fn unipc() {
    for n in [4, 8, 20] {
        run(
            &format!("unipc_{n}_cat_64x64"),
            SamplingMethod::UniPc,
            n,
            4.5,
            false,
        );
    }
}

#[test]
fn lcm() {
    run("lcm_4_g0_cat_64x64", SamplingMethod::Lcm, 4, 0.0, true);
    run("lcm_4_g1_cat_64x64", SamplingMethod::Lcm, 4, 1.0, true);
    run("lcm_8_g0_cat_64x64", SamplingMethod::Lcm, 8, 0.0, true);
}

#[test]
fn lcm_scalings_match_diffusers_tables() {
    let t = read_safetensors(&fixture("samplers/scheduler_tables.safetensors"));
    for n in [1usize, 4, 8, 20] {
        let s = Sampler::new(&SchedulerConfig::pixart(), SamplingMethod::Lcm, n, 1).unwrap();
        let ts = &t[&format!("lcm.{n}.timesteps")].data;
        assert_eq!(s.timesteps(), &ts[..], "lcm {n} timesteps");
        let (cs, co): (Vec<f32>, Vec<f32>) = s
            .timesteps()
            .iter()
            .map(|&x| edge_runtime::sampler::lcm_scalings(x))
            .unzip();
        assert!(
            max_rel(&cs, &t[&format!("lcm.{n}.c_skip")].data) < 1e-6,
            "lcm {n} c_skip {cs:?}"
        );
        assert!(
            max_rel(&co, &t[&format!("lcm.{n}.c_out")].data) < 1e-6,
            "lcm {n} c_out {co:?}"
        );
    }
}

/// `pixart-sigma-tiny-lcm/` (shared README §11): the scheduler class comes from the folder.
/// Only `model_index.json`, `scheduler/` and `reference/` are kept here; the other
/// components are byte copies of `pixart-sigma-tiny/`, from which the folder is assembled.
#[test]
fn an_lcm_folder_defaults_to_lcm_and_matches_its_reference() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("pixart-sigma-tiny-lcm");
    std::fs::create_dir(&folder).unwrap();
    let copy_dir = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    for c in ["text_encoder", "tokenizer", "transformer", "vae"] {
        copy_dir(&fixture(&format!("pixart-sigma-tiny/{c}")), &folder.join(c));
    }
    copy_dir(
        &fixture("pixart-sigma-tiny-lcm/scheduler"),
        &folder.join("scheduler"),
    );
    std::fs::copy(
        fixture("pixart-sigma-tiny-lcm/model_index.json"),
        folder.join("model_index.json"),
    )
    .unwrap();
    let bytes = compiled_plan(&folder, &[(64, 64)], None);
    let plan = Plan::from_bytes(&bytes).unwrap();
    let class = plan.meta().scheduler.class;
    assert_eq!(class, edge_schema::scheduler::SchedulerClass::Lcm);
    let method = SamplingMethod::for_class(class);
    assert_eq!(method, SamplingMethod::Lcm);
    let r = read_safetensors(&fixture(
        "pixart-sigma-tiny-lcm/reference/pipeline_lcm_4_cat_64x64.safetensors",
    ));
    let mut session = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let params = GenerateParams {
        prompt: "a lovely cat".into(),
        negative_prompt: String::new(),
        steps: 4,
        cfg_scale: 0.0,
        method,
        seed: 1234,
        width: 64,
        height: 64,
        rng: NoiseRng::TorchCpu,
        karras: None,
        init_latents: None,
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    let out = edge_runtime::generate(&mut session, &params, &mut |_| {}).unwrap();
    assert_close(
        "lcm folder final latents",
        &out.latents,
        &r["final_latents"].data,
        1e-3,
    );
    let img = &r["image_uint8"];
    let worst = out
        .rgb
        .iter()
        .zip(&img.data)
        .map(|(&a, &b)| (i32::from(a) - b as i32).abs())
        .max()
        .unwrap();
    assert!(worst <= 1, "lcm folder: PNG off by {worst} levels");
}

/// Replays diffusers' guided model outputs (`trace.noise_pred`) through our step from the same
/// latents, call by call.
fn replay(key: &str, method: SamplingMethod, steps: usize) -> f64 {
    let r = read_safetensors(&fixture(&format!("samplers/pipeline_{key}.safetensors")));
    let before = &r["trace.latents_before_step"];
    let after = &r["trace.latents_after_step"];
    let eps = &r["trace.noise_pred"];
    let calls = before.shape[0];
    let n = before.data.len() / calls;
    let mut s = Sampler::new(&SchedulerConfig::pixart(), method, steps, n).unwrap();
    let mut worst = 0f64;
    for c in 0..calls {
        let e = &eps.data[c * n..(c + 1) * n];
        let mut xi = before.data[c * n..(c + 1) * n].to_vec();
        s.step(c, e, &mut xi).unwrap();
        let want = &after.data[c * n..(c + 1) * n];
        let err = edge_e2e::rel_max_err(&xi, want);
        worst = worst.max(err);
    }
    worst
}

#[test]
fn scheduler_steps_replay_diffusers_outputs() {
    for (key, m, n) in [
        ("unipc_4_cat_64x64", SamplingMethod::UniPc, 4),
        ("unipc_8_cat_64x64", SamplingMethod::UniPc, 8),
        ("unipc_20_cat_64x64", SamplingMethod::UniPc, 20),
        ("heun_8_cat_64x64", SamplingMethod::Heun, 8),
        ("kdpm2_8_cat_64x64", SamplingMethod::Dpm2, 8),
        ("ddim_8_cat_64x64", SamplingMethod::Ddim, 8),
    ] {
        let w = replay(key, m, n);
        assert!(w < 1e-4, "{key}: step replay off by {w:.2e}");
    }
}
