//! The samplers against diffusers 0.42: schedule tables (`scheduler_tables.safetensors`) and
//! whole sampling loops replayed from the pipeline traces (`pipeline_*.safetensors`), feeding
//! the recorded guided noise predictions to our `step`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use edge_planner::load::scheduler::load_scheduler_config;
use edge_runtime::sampler::{schedule, train_tables, Sampler, SamplerError, SamplingMethod};
use edge_schema::scheduler::SchedulerConfig;
use safetensors::{Dtype, SafeTensors};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

const FIXTURES: [&str; 2] = [
    "tests/fixtures/pixart-sigma-tiny",
    "tests/fixtures/pixart-alpha-tiny",
];

fn config(model_dir: &Path) -> SchedulerConfig {
    load_scheduler_config(&model_dir.join("scheduler/scheduler_config.json")).unwrap()
}

/// A tensor of the file as f64 values (f32, f64, i64 and i32 tensors).
fn values(st: &SafeTensors<'_>, name: &str) -> Vec<f64> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("tensor {name}: {e}"));
    let d = t.data();
    match t.dtype() {
        Dtype::F32 => d
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        Dtype::F64 => d
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::I64 => d
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        Dtype::I32 => d
            .chunks_exact(4)
            .map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        other => panic!("tensor {name}: unexpected dtype {other:?}"),
    }
}

fn f32s(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), Dtype::F32, "{name}");
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn shape(st: &SafeTensors<'_>, name: &str) -> Vec<usize> {
    st.tensor(name).unwrap().shape().to_vec()
}

/// ‖a − b‖ / ‖b‖ in f64.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (f64::from(x) - f64::from(y)).powi(2);
        den += f64::from(y).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Largest |a − b| / max(|b|, tiny) over the elements.
fn max_rel(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = (f64::from(x) - y).abs();
            if y == 0.0 {
                d
            } else {
                d / y.abs()
            }
        })
        .fold(0.0, f64::max)
}

/// Train tables: betas and `alphas_cumprod` bit for bit; sigmas to 1 ulp; lambda (computed by
/// torch's vectorised `log` over the whole table, which may differ from libm by an ulp, and
/// crossing zero) to 1e-6 absolute.
#[test]
fn train_tables_match_diffusers() {
    for fixture in FIXTURES {
        let dir = repo().join(fixture);
        let bytes = std::fs::read(dir.join("reference/scheduler_tables.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let t = train_tables(&config(&dir));
        for (name, ours) in [("betas", &t.betas), ("alphas_cumprod", &t.alphas_cumprod)] {
            let want = values(&st, name);
            let ours: Vec<f64> = ours.iter().map(|&v| f64::from(v)).collect();
            assert_eq!(ours, want, "{fixture} {name}");
        }
        let err = max_rel(&t.sigmas, &values(&st, "train_sigmas"));
        println!("{fixture} train_sigmas: max relative error {err:.3e}");
        assert!(
            err <= 1.2e-7,
            "{fixture} train_sigmas: max relative error {err:e}"
        );
        let want = values(&st, "dpm_lambda_t");
        let err = t
            .lambdas
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (f64::from(a) - b).abs())
            .fold(0.0, f64::max);
        println!("{fixture} dpm_lambda_t: max absolute error {err:.3e}");
        assert!(
            err <= 1e-6,
            "{fixture} dpm_lambda_t: max absolute error {err:e}"
        );
    }
}

#[test]
fn schedules_match_diffusers_tables() {
    for fixture in FIXTURES {
        let dir = repo().join(fixture);
        let cfg = config(&dir);
        let bytes = std::fs::read(dir.join("reference/scheduler_tables.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("reference/manifest.json")).unwrap(),
        )
        .unwrap();
        let mut worst = 0f64;
        for n in [1usize, 2, 3, 4, 8, 14, 15, 20, 25, 50] {
            for (prefix, method) in [
                ("dpm", SamplingMethod::DpmPp2m),
                ("euler", SamplingMethod::Euler),
            ] {
                let s = schedule(&cfg, method, n).unwrap();
                let want_t = values(&st, &format!("{prefix}.{n}.timesteps"));
                let ours_t: Vec<f64> = s.timesteps.iter().map(|&t| f64::from(t)).collect();
                assert_eq!(ours_t, want_t, "{fixture} {prefix}.{n}.timesteps");
                let want_s = values(&st, &format!("{prefix}.{n}.sigmas"));
                let err = max_rel(&s.sigmas, &want_s);
                worst = worst.max(err);
                assert!(
                    err <= 1e-6,
                    "{fixture} {prefix}.{n}.sigmas: relative error {err:e}\n{:?}\n{want_s:?}",
                    s.sigmas
                );
                if method == SamplingMethod::Euler {
                    let want = manifest["scheduler_tables"]["euler_init_noise_sigma"]
                        [n.to_string()]["euler_init_noise_sigma"]
                        .as_f64()
                        .unwrap();
                    // The manifest holds the float32 value as a decimal; compare in f32.
                    assert_eq!(
                        s.init_noise_sigma, want as f32,
                        "{fixture} euler {n} init_noise_sigma"
                    );
                } else {
                    assert_eq!(s.init_noise_sigma, 1.0);
                }
            }
        }
        println!("{fixture}: worst sigma relative error {worst:.3e}");
    }
}

/// Replays one pipeline trace through our sampler; returns the worst per-step relative L2 of
/// the latents and of the scaled model input.
fn replay(model_dir: &Path, trace: &Path) -> (f64, f64) {
    let name = trace.file_name().unwrap().to_string_lossy().into_owned();
    let method = if name.starts_with("pipeline_euler") {
        SamplingMethod::Euler
    } else {
        SamplingMethod::DpmPp2m
    };
    let bytes = std::fs::read(trace).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let noise_shape = shape(&st, "trace.noise_pred");
    let steps = noise_shape[0];
    let latent_len: usize = noise_shape[1..].iter().product();
    let cfg = config(model_dir);
    let mut sampler = Sampler::new(&cfg, method, steps, latent_len).unwrap();

    let want_t = values(&st, "timesteps");
    let ours_t: Vec<f64> = sampler.timesteps().iter().map(|&t| f64::from(t)).collect();
    assert_eq!(ours_t, want_t, "{name}: timesteps");
    let sig_err = max_rel(sampler.sigmas(), &values(&st, "sigmas"));
    assert!(sig_err <= 1e-6, "{name}: sigmas relative error {sig_err:e}");

    // The pipeline multiplies the given noise by init_noise_sigma.
    let noise = f32s(&st, "initial_noise");
    let start = f32s(&st, "latents_start");
    let scaled: Vec<f32> = noise
        .iter()
        .map(|&x| x * sampler.init_noise_sigma())
        .collect();
    let start_err = rel_l2(&scaled, &start);
    assert!(
        start_err <= 1e-7,
        "{name}: initial_noise · init_noise_sigma vs latents_start: {start_err:e}"
    );

    let eps = f32s(&st, "trace.noise_pred");
    let after = f32s(&st, "trace.latents_after_step");
    let before = f32s(&st, "trace.latents_before_step");
    let model_in = f32s(&st, "trace.latent_model_input");
    let timestep_in = values(&st, "trace.transformer_timestep");
    let batch = shape(&st, "trace.latent_model_input")[1];
    let mut latents = start;
    let mut scaled_in = vec![0f32; latent_len];
    let (mut worst_latents, mut worst_input) = (0f64, 0f64);
    for i in 0..steps {
        let cur = i * latent_len..(i + 1) * latent_len;
        let err = rel_l2(&latents, &before[cur.clone()]);
        assert!(
            err < 1e-5,
            "{name} step {i}: latents before the step differ by {err:e}"
        );
        sampler
            .scale_model_input(i, &latents, &mut scaled_in)
            .unwrap();
        for b in 0..batch {
            let row = (i * batch + b) * latent_len;
            let err = rel_l2(&scaled_in, &model_in[row..row + latent_len]);
            worst_input = worst_input.max(err);
            assert!(
                err < 1e-5,
                "{name} step {i} batch {b}: latent_model_input differs by {err:e}"
            );
            assert_eq!(
                f64::from(sampler.timesteps()[i]),
                timestep_in[i * batch + b],
                "{name} step {i}: transformer timestep"
            );
        }
        sampler.step(i, &eps[cur.clone()], &mut latents).unwrap();
        let err = rel_l2(&latents, &after[cur]);
        worst_latents = worst_latents.max(err);
        assert!(
            err < 1e-5,
            "{name} step {i}: latents after the step differ by {err:e}"
        );
    }
    let err = rel_l2(&latents, &f32s(&st, "final_latents"));
    assert!(err < 1e-5, "{name}: final latents differ by {err:e}");
    println!("{name}: {steps} steps, worst step latents rel-L2 {worst_latents:.3e}, model input {worst_input:.3e}, final {err:.3e}");
    (worst_latents, worst_input)
}

#[test]
fn pipeline_traces_replay() {
    let mut runs: Vec<(PathBuf, PathBuf)> = Vec::new();
    for fixture in FIXTURES {
        let dir = repo().join(fixture);
        for run in [
            "pipeline_dpm_4_cat_64x64",
            "pipeline_dpm_20_cat_64x64",
            "pipeline_euler_4_cat_64x64",
            "pipeline_dpm_4_cat_w64_h96",
        ] {
            runs.push((
                dir.clone(),
                dir.join(format!("reference/{run}.safetensors")),
            ));
        }
    }
    let sigma = repo().join(FIXTURES[0]);
    runs.push((
        sigma.clone(),
        sigma.join("reference/pipeline_dpm_4_cat_nocfg_64x64.safetensors"),
    ));
    let demo = repo().join("demo");
    runs.push((
        demo.join("pixart-shapes-64"),
        demo.join("reference/pipeline_dpm_20_redcircle_64x64.safetensors"),
    ));
    let (mut worst_latents, mut worst_input) = (0f64, 0f64);
    for (model, trace) in &runs {
        let (l, m) = replay(model, trace);
        worst_latents = worst_latents.max(l);
        worst_input = worst_input.max(m);
    }
    println!("all traces: worst per-step latents rel-L2 {worst_latents:.3e}, model input {worst_input:.3e}");
}

#[test]
fn bad_configs_and_names_are_refused() {
    let cfg = config(&repo().join(FIXTURES[0]));
    let err = "lms".parse::<SamplingMethod>().unwrap_err();
    assert!(matches!(err, SamplerError::UnknownMethod { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("lms") && msg.contains("dpm++2m") && msg.contains("euler"),
        "{msg}"
    );

    let mut bad = cfg.clone();
    bad.num_train_timesteps = 0;
    assert!(matches!(
        Sampler::new(&bad, SamplingMethod::DpmPp2m, 4, 256),
        Err(SamplerError::InvalidConfig(_))
    ));
    let mut bad = cfg.clone();
    bad.trained_betas = Some(vec![0.5; 10]);
    assert!(matches!(
        schedule(&bad, SamplingMethod::Euler, 4),
        Err(SamplerError::InvalidConfig(_))
    ));
    let mut bad = cfg.clone();
    bad.use_karras_sigmas = true;
    assert!(matches!(
        schedule(&bad, SamplingMethod::EulerAncestral, 4),
        Err(SamplerError::InvalidConfig(_))
    ));
    assert!(matches!(
        schedule(&cfg, SamplingMethod::DpmPp2m, 0),
        Err(SamplerError::BadSteps { .. })
    ));
    assert!(matches!(
        schedule(&cfg, SamplingMethod::DpmPp2m, 1001),
        Err(SamplerError::BadSteps { .. })
    ));
}

/// DPM-Solver++ 2M with `solver_type: "heun"` (no PixArt config uses it, so no pipeline trace
/// does): the guided model outputs of the Σ fixture's DPM runs replayed through diffusers'
/// scheduler with `solver_type="heun"` (`tests/fixtures/scripts/make_dpm_heun_traces.py`).
/// Each step's latents must match; the midpoint rule must not (so the test sees the branch).
#[test]
fn dpm_solver_heun_matches_diffusers() {
    let dir = repo().join(FIXTURES[0]);
    for steps in [4usize, 20] {
        let path = dir.join(format!(
            "reference/scheduler_dpm_heun_{steps}_cat_64x64.safetensors"
        ));
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let eps = f32s(&st, "trace.noise_pred");
        let after = f32s(&st, "trace.latents_after_step");
        let final_ref = f32s(&st, "final_latents");
        let n = final_ref.len();
        let run = |solver: edge_schema::scheduler::SolverType| {
            let mut cfg = config(&dir);
            cfg.solver_type = solver;
            let mut sampler = Sampler::new(&cfg, SamplingMethod::DpmPp2m, steps, n).unwrap();
            let want_t = values(&st, "timesteps");
            let ours_t: Vec<f64> = sampler.timesteps().iter().map(|&t| f64::from(t)).collect();
            assert_eq!(ours_t, want_t, "heun {steps}: timesteps");
            let mut latents = f32s(&st, "latents_start");
            let mut worst = 0f64;
            for i in 0..steps {
                let cur = i * n..(i + 1) * n;
                sampler.step(i, &eps[cur.clone()], &mut latents).unwrap();
                worst = worst.max(rel_l2(&latents, &after[cur]));
            }
            (worst, rel_l2(&latents, &final_ref))
        };
        let (worst, fin) = run(edge_schema::scheduler::SolverType::Heun);
        println!("dpm++2m heun {steps} steps: worst step rel-L2 {worst:.3e}, final {fin:.3e}");
        assert!(
            worst < 1e-5 && fin < 1e-5,
            "heun {steps}: {worst:e} / {fin:e}"
        );
        let (_, mid) = run(edge_schema::scheduler::SolverType::Midpoint);
        assert!(mid > 1e-3, "midpoint is indistinguishable here ({mid:e})");
    }
}

/// `--scheduler karras` for euler, heun and dpm2: the schedules diffusers 0.42.1 builds
/// (`tests/fixtures/karras_schedules.json`, made by
/// `tests/fixtures/scripts/make_karras_schedules.py`): timesteps, sigmas, KDPM2's midpoints
/// and `init_noise_sigma` for 1, 4, 8 and 20 steps.
#[test]
fn karras_schedules_of_the_k_samplers_match_diffusers() {
    let text = std::fs::read_to_string(edge_e2e::fixture("karras_schedules.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let list = |x: &serde_json::Value| -> Vec<f32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_f64().map_or(f32::NAN, |f| f as f32))
            .collect()
    };
    let close = |what: &str, ours: &[f32], theirs: &[f32]| {
        assert_eq!(ours.len(), theirs.len(), "{what}: {ours:?} vs {theirs:?}");
        for (a, b) in ours.iter().zip(theirs) {
            if b.is_nan() {
                continue;
            }
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                "{what}: {ours:?} vs {theirs:?}"
            );
        }
    };
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 12);
    for r in runs {
        let method: SamplingMethod = r["method"].as_str().unwrap().parse().unwrap();
        let n = r["steps"].as_u64().unwrap() as usize;
        let mut cfg = SchedulerConfig::pixart();
        cfg.use_karras_sigmas = true;
        let s = schedule(&cfg, method, n).unwrap();
        let what = format!("{method} karras {n}");
        close(
            &format!("{what} timesteps"),
            &s.timesteps,
            &list(&r["timesteps"]),
        );
        // diffusers' KDPM2 keeps two trailing zeros; the runtime's sigmas stop at one.
        let theirs = list(&r["sigmas"]);
        close(
            &format!("{what} sigmas"),
            &s.sigmas,
            &theirs[..s.sigmas.len().min(theirs.len())],
        );
        if let Some(ip) = r.get("sigmas_interpol") {
            let theirs = list(ip);
            let m = s.sigmas_interpol.len().min(theirs.len());
            close(
                &format!("{what} midpoints"),
                &s.sigmas_interpol[..m],
                &theirs[..m],
            );
        }
        let ins = r["init_noise_sigma"].as_f64().unwrap() as f32;
        assert!(
            (s.init_noise_sigma - ins).abs() <= 1e-6 * ins,
            "{what} init_noise_sigma"
        );
    }
}
