//! Samplers: DPM-Solver++ 2M and Euler, rebuilt from the plan's [`SchedulerConfig`].
//!
//! The maths follows diffusers 0.42 `schedulers/scheduling_dpmsolver_multistep.py`
//! (`DPMSolverMultistepScheduler`, algorithm `dpmsolver++`, deterministic) and
//! `schedulers/scheduling_euler_discrete.py` (`EulerDiscreteScheduler` created `from_config` of
//! the same config, `s_churn = 0`). Tables are float32 where diffusers keeps float32 tensors
//! (betas, `alphas_cumprod`, sigmas, and the per-step scalars `alpha_t`, `sigma_t`, `lambda`)
//! and float64 where it works in numpy (`linspace`, `arange`, `interp`), and the operations are
//! done in diffusers' order, so the results agree to float32 rounding.
//!
//! Latents are flat `f32` slices (any layout; the samplers are element-wise). Every step is
//! given the epsilon / v / sample prediction the config's `prediction_type` names (after
//! classifier-free guidance) and updates the latents in place without allocating.

use std::fmt;
use std::str::FromStr;

use edge_schema::scheduler::{
    BetaSchedule, FinalSigmasType, PredictionType, SchedulerClass, SchedulerConfig, SolverType,
    TimestepSpacing,
};

/// Errors of building a schedule or running a sampler.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The sampler name is not one of [`SamplingMethod::ACCEPTED`].
    #[error("unknown sampling method {name:?} (accepted: {})", SamplingMethod::ACCEPTED.join(", "))]
    UnknownMethod { name: String },
    /// The plan's scheduler config failed [`SchedulerConfig::validate`].
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(String),
    /// The requested number of inference steps is out of range.
    #[error("{steps} inference steps requested (--steps); expected 1..={max} ({what})")]
    BadSteps {
        steps: usize,
        max: u32,
        /// What bounds the count.
        what: &'static str,
    },
    /// The schedule repeats a timestep (e.g. 1000 linspace steps over 1000 train timesteps
    /// round two of them to 500): a multistep solver would divide by a zero step.
    #[error("{steps} inference steps give the timestep {t} twice (steps {i} and {j}) with {method}; choose fewer steps")]
    RepeatedTimestep {
        steps: usize,
        t: f32,
        i: usize,
        j: usize,
        method: &'static str,
    },
    /// The config gives a noise schedule with an unusable value (e.g. betas whose cumulative
    /// product underflows to 0, making sigma infinite).
    #[error("the scheduler config gives an unusable noise schedule: {what}")]
    BadSchedule { what: String },
    /// A buffer passed to the sampler has the wrong length.
    #[error("{what} has {found} values, expected {expected}")]
    Length {
        what: &'static str,
        found: usize,
        expected: usize,
    },
    /// A stochastic sampler's step was given no noise, or noise of the wrong length.
    #[error("step {step} of {method} needs {expected} values of fresh noise")]
    Noise {
        step: usize,
        method: &'static str,
        expected: usize,
    },
    /// Steps must run in order from the first (0, or the begin index of image to image; a
    /// multistep solver keeps history); the first restarts.
    #[error(
        "step {found} called out of order: expected step {expected} of {steps} (or the first, to restart)"
    )]
    StepOrder {
        found: usize,
        expected: usize,
        steps: usize,
    },
    /// An image-to-image strength that is out of range or leaves no step.
    #[error("--strength {strength} with {steps} steps: {why}")]
    Strength {
        strength: f64,
        steps: usize,
        why: &'static str,
    },
}

/// The sampling algorithm the runtime runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplingMethod {
    /// DPM-Solver++ multistep (2M with PixArt's `solver_order = 2`), `DPMSolverMultistepScheduler`.
    DpmPp2m,
    /// Euler, `EulerDiscreteScheduler.from_config(config)`.
    Euler,
    /// Euler ancestral, `EulerAncestralDiscreteScheduler`: noise drawn at every step.
    EulerAncestral,
    /// Heun, `HeunDiscreteScheduler`: two denoiser calls per interval (2S − 1 in all).
    Heun,
    /// DPM2, `KDPM2DiscreteScheduler`: two calls per interval, the second at the interval's
    /// geometric midpoint (2S − 1 in all).
    Dpm2,
    /// DDIM, `DDIMScheduler` with eta 0 and its defaults (`clip_sample`, `set_alpha_to_one`).
    Ddim,
    /// LCM, `LCMScheduler` (50 original steps, timestep scaling 10): noise drawn before every
    /// step but the last.
    Lcm,
    /// UniPC, `UniPCMultistepScheduler` (B(h) = expm1 "bh2", data prediction, the UniC
    /// corrector after every step but the first, UniP predictor of the config's order).
    UniPc,
}

impl SamplingMethod {
    /// Every method.
    pub const ALL: [SamplingMethod; 8] = [
        SamplingMethod::DpmPp2m,
        SamplingMethod::Euler,
        SamplingMethod::EulerAncestral,
        SamplingMethod::Heun,
        SamplingMethod::Dpm2,
        SamplingMethod::Ddim,
        SamplingMethod::Lcm,
        SamplingMethod::UniPc,
    ];

    /// The names [`FromStr`] accepts (case-insensitive).
    pub const ACCEPTED: [&'static str; 11] = [
        "dpm++2m", "dpmpp2m", "dpm++", "dpmpp", "euler", "euler_a", "heun", "dpm2", "ddim", "lcm",
        "unipc",
    ];

    /// The canonical name (stable-diffusion.cpp's where it has one).
    pub const fn name(self) -> &'static str {
        match self {
            SamplingMethod::DpmPp2m => "dpm++2m",
            SamplingMethod::Euler => "euler",
            SamplingMethod::EulerAncestral => "euler_a",
            SamplingMethod::Heun => "heun",
            SamplingMethod::Dpm2 => "dpm2",
            SamplingMethod::Ddim => "ddim",
            SamplingMethod::Lcm => "lcm",
            SamplingMethod::UniPc => "unipc",
        }
    }

    /// The name AUTOMATIC1111's web UI (and its PNG `parameters`) gives the sampler.
    pub const fn a1111_name(self) -> &'static str {
        match self {
            SamplingMethod::DpmPp2m => "DPM++ 2M",
            SamplingMethod::Euler => "Euler",
            SamplingMethod::EulerAncestral => "Euler a",
            SamplingMethod::Heun => "Heun",
            SamplingMethod::Dpm2 => "DPM2",
            SamplingMethod::Ddim => "DDIM",
            SamplingMethod::Lcm => "LCM",
            SamplingMethod::UniPc => "UniPC",
        }
    }

    /// The sampler a plan's scheduler class names (its default: a PixArt-LCM folder's
    /// `LCMScheduler` gives [`SamplingMethod::Lcm`]).
    pub const fn for_class(class: SchedulerClass) -> SamplingMethod {
        match class {
            SchedulerClass::DpmSolverMultistep => SamplingMethod::DpmPp2m,
            SchedulerClass::EulerDiscrete => SamplingMethod::Euler,
            SchedulerClass::EulerAncestralDiscrete => SamplingMethod::EulerAncestral,
            SchedulerClass::HeunDiscrete => SamplingMethod::Heun,
            SchedulerClass::KDpm2Discrete => SamplingMethod::Dpm2,
            SchedulerClass::Ddim => SamplingMethod::Ddim,
            SchedulerClass::Lcm => SamplingMethod::Lcm,
            SchedulerClass::UniPcMultistep => SamplingMethod::UniPc,
        }
    }

    /// Whether `--scheduler karras` (diffusers' `use_karras_sigmas`) is implemented for the
    /// method: DPM-Solver++, Euler, Heun and DPM2 (diffusers 0.42's Euler ancestral has none).
    pub const fn supports_karras(self) -> bool {
        matches!(
            self,
            SamplingMethod::DpmPp2m
                | SamplingMethod::Euler
                | SamplingMethod::Heun
                | SamplingMethod::Dpm2
        )
    }

    /// diffusers' `scheduler.order`: denoiser calls per step (2 for Heun and DPM2, whose
    /// schedules hold two calls per interval).
    pub const fn order(self) -> usize {
        match self {
            SamplingMethod::Heun | SamplingMethod::Dpm2 => 2,
            _ => 1,
        }
    }

    /// Whether [`Sampler::step_with_noise`] needs fresh noise at step `i` of `steps`.
    pub const fn draws_noise(self, i: usize, steps: usize) -> bool {
        match self {
            SamplingMethod::EulerAncestral => true,
            SamplingMethod::Lcm => i + 1 < steps,
            _ => false,
        }
    }
}

impl fmt::Display for SamplingMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SamplingMethod {
    type Err = SamplerError;

    fn from_str(s: &str) -> Result<Self, SamplerError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "dpm++2m" | "dpmpp2m" | "dpm++" | "dpmpp" => Ok(SamplingMethod::DpmPp2m),
            "euler" => Ok(SamplingMethod::Euler),
            "euler_a" => Ok(SamplingMethod::EulerAncestral),
            "heun" => Ok(SamplingMethod::Heun),
            "dpm2" => Ok(SamplingMethod::Dpm2),
            "ddim" => Ok(SamplingMethod::Ddim),
            "lcm" => Ok(SamplingMethod::Lcm),
            "unipc" => Ok(SamplingMethod::UniPc),
            _ => Err(SamplerError::UnknownMethod {
                name: s.to_string(),
            }),
        }
    }
}

/// The training-time noise tables, each `[num_train_timesteps]`, float32 as in diffusers'
/// scheduler constructors.
#[derive(Clone, Debug)]
pub struct TrainTables {
    /// `betas`.
    pub betas: Vec<f32>,
    /// `alphas_cumprod = cumprod(1 − betas)` (torch's CPU cumprod accumulates in f64).
    pub alphas_cumprod: Vec<f32>,
    /// `sigmas = sqrt((1 − ᾱ) / ᾱ)` per train timestep.
    pub sigmas: Vec<f32>,
    /// DPM-Solver's `lambda_t = ln sqrt(ᾱ) − ln sqrt(1 − ᾱ)` (log-SNR / 2).
    pub lambdas: Vec<f32>,
}

/// Builds the train tables of `cfg`. Meaningful only for a config that passes
/// [`SchedulerConfig::validate`] (never panics otherwise).
pub fn train_tables(cfg: &SchedulerConfig) -> TrainTables {
    let n = cfg.num_train_timesteps as usize;
    let betas = match &cfg.trained_betas {
        Some(b) => b.clone(),
        None => match cfg.beta_schedule {
            BetaSchedule::Linear => {
                torch_linspace_f32(cfg.beta_start as f32, cfg.beta_end as f32, n)
            }
            BetaSchedule::ScaledLinear => {
                torch_linspace_f32(cfg.beta_start.sqrt() as f32, cfg.beta_end.sqrt() as f32, n)
                    .into_iter()
                    .map(|b| b * b)
                    .collect()
            }
            BetaSchedule::SquaredcosCapV2 => cosine_betas(n),
        },
    };
    let mut acc = 1.0f64;
    let alphas_cumprod: Vec<f32> = betas
        .iter()
        .map(|&b| {
            acc *= f64::from(1.0f32 - b);
            acc as f32
        })
        .collect();
    let sigmas = alphas_cumprod
        .iter()
        .map(|&a| ((1.0f32 - a) / a).sqrt())
        .collect();
    let lambdas = alphas_cumprod
        .iter()
        .map(|&a| a.sqrt().ln() - (1.0f32 - a).sqrt().ln())
        .collect();
    TrainTables {
        betas,
        alphas_cumprod,
        sigmas,
        lambdas,
    }
}

/// `torch.linspace(start, end, n, dtype=float32)` on the CPU (`RangeFactoriesKernel.cpp`): the
/// step is computed in f32, the first half counts up from `start`, the second half down from
/// `end`, each value one fused multiply-add (this reproduces torch's betas bit for bit).
fn torch_linspace_f32(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n <= 1 {
        return vec![start; n];
    }
    let step = (end - start) / (n - 1) as f32;
    let halfway = n / 2;
    (0..n)
        .map(|i| {
            if i < halfway {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - i - 1) as f32, end)
            }
        })
        .collect()
}

/// diffusers' `betas_for_alpha_bar(n, max_beta=0.999, "cosine")` (float64, then float32).
fn cosine_betas(n: usize) -> Vec<f32> {
    let alpha_bar = |t: f64| {
        ((t + 0.008) / 1.008 * std::f64::consts::PI / 2.0)
            .cos()
            .powi(2)
    };
    (0..n)
        .map(|i| {
            let t1 = i as f64 / n as f64;
            let t2 = (i + 1) as f64 / n as f64;
            (1.0 - alpha_bar(t2) / alpha_bar(t1)).min(0.999) as f32
        })
        .collect()
}

/// `np.linspace(start, stop, num)` in float64 (numpy ≥ 2: `i·step + start`, the last value
/// set to `stop`).
fn np_linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let div = (num - 1) as f64;
    let delta = stop - start;
    let step = delta / div;
    let mut y: Vec<f64> = (0..num)
        .map(|i| {
            if step == 0.0 {
                i as f64 / div * delta + start
            } else {
                i as f64 * step + start
            }
        })
        .collect();
    y[num - 1] = stop;
    y
}

/// `np.arange(start, stop, step)` in float64: `ceil((stop − start) / step)` values
/// `start + i·d` with `d = (start + step) − start` (numpy's fill rule).
fn np_arange(start: f64, stop: f64, step: f64) -> Vec<f64> {
    let len = ((stop - start) / step).ceil();
    if len.is_nan() || len < 1.0 {
        return Vec::new();
    }
    let len = len as usize;
    let d = (start + step) - start;
    (0..len)
        .map(|i| match i {
            0 => start,
            1 => start + step,
            _ => start + i as f64 * d,
        })
        .collect()
}

/// `np.interp(x, arange(len(fp)), fp)` (float64, clamped at both ends).
fn np_interp(x: f64, fp: &[f32]) -> f64 {
    let n = fp.len();
    let last = (n - 1) as f64;
    if x.is_nan() {
        return x;
    }
    if x > last {
        return f64::from(fp[n - 1]);
    }
    if x < 0.0 {
        return f64::from(fp[0]);
    }
    let j = x.floor() as usize;
    if j >= n - 1 {
        return f64::from(fp[n - 1]);
    }
    if x == j as f64 {
        return f64::from(fp[j]);
    }
    let (y0, y1) = (f64::from(fp[j]), f64::from(fp[j + 1]));
    let slope = (y1 - y0) / 1.0;
    let y = slope * (x - j as f64) + y0;
    if y.is_nan() {
        slope * (x - (j + 1) as f64) + y1
    } else {
        y
    }
}

/// An inference schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// The timestep fed to the denoiser at each step, `[S]`. DPM-Solver's are integers
    /// (diffusers int64) stored as f32; Euler's are floats.
    pub timesteps: Vec<f32>,
    /// Noise level before each step and after the last, `[S + 1]` (the last is 0 with
    /// `final_sigmas_type = "zero"`).
    pub sigmas: Vec<f32>,
    /// `init_noise_sigma`: the standard normal initial noise is multiplied by this.
    pub init_noise_sigma: f32,
    /// DPM2: the geometric midpoints, laid out like `sigmas` (`[S + 1]`); empty otherwise.
    pub sigmas_interpol: Vec<f32>,
    /// DDIM, LCM: the timestep each step lands on (`t_prev`; −1 or below: ᾱ = 1), `[S]`;
    /// empty otherwise.
    pub prev_timesteps: Vec<i64>,
}

/// Computes the schedule of `steps` inference steps (diffusers `set_timesteps`).
///
/// `S = timesteps.len()` equals `steps` except with `trailing` spacing under a finite
/// `lambda_min_clipped`, where diffusers' `arange` may give another count.
///
/// # Errors
/// [`SamplerError::InvalidConfig`] when `cfg` fails validation, [`SamplerError::BadSteps`] for
/// `steps` outside `1..=num_train_timesteps`, [`SamplerError::BadSchedule`] when a sigma is not
/// finite and positive.
pub fn schedule(
    cfg: &SchedulerConfig,
    method: SamplingMethod,
    steps: usize,
) -> Result<Schedule, SamplerError> {
    cfg.validate().map_err(SamplerError::InvalidConfig)?;
    let n = cfg.num_train_timesteps;
    if steps == 0 || steps > n as usize {
        return Err(SamplerError::BadSteps {
            steps,
            max: n,
            what: "the scheduler's num_train_timesteps",
        });
    }
    let tables = train_tables(cfg);
    let sigma_last = match cfg.final_sigmas_type {
        FinalSigmasType::Zero => 0.0,
        FinalSigmasType::SigmaMin => tables.sigmas[0],
    };
    if cfg.use_karras_sigmas && !method.supports_karras() {
        return Err(SamplerError::InvalidConfig(format!(
            "use_karras_sigmas: karras sigmas are implemented for dpm++2m, euler, heun and dpm2, not {method}"
        )));
    }
    let sched = match method {
        SamplingMethod::DpmPp2m if cfg.use_karras_sigmas => {
            dpm_karras_schedule(&tables, steps, sigma_last)
        }
        SamplingMethod::DpmPp2m | SamplingMethod::UniPc => {
            dpm_schedule(cfg, &tables, steps, sigma_last)
        }
        SamplingMethod::Euler if cfg.use_karras_sigmas => {
            k_karras_schedule(cfg, &tables, steps, sigma_last, false)
        }
        SamplingMethod::Euler | SamplingMethod::EulerAncestral => {
            euler_schedule(cfg, &tables, steps, sigma_last)
        }
        SamplingMethod::Heun => {
            let base = if cfg.use_karras_sigmas {
                k_karras_schedule(cfg, &tables, steps, 0.0, false)
            } else {
                euler_schedule(cfg, &tables, steps, 0.0)
            };
            heun_schedule(base, cfg)
        }
        SamplingMethod::Dpm2 => {
            let base = if cfg.use_karras_sigmas {
                k_karras_schedule(cfg, &tables, steps, 0.0, true)
            } else {
                euler_schedule(cfg, &tables, steps, 0.0)
            };
            dpm2_schedule(base, cfg, &tables)
        }
        SamplingMethod::Ddim => ddim_schedule(cfg, &tables, steps),
        SamplingMethod::Lcm => lcm_schedule(cfg, &tables, steps)?,
    };
    check_schedule(&sched)?;
    // Heun and DPM2 repeat timesteps by design (two calls per interval).
    if !matches!(method, SamplingMethod::Heun | SamplingMethod::Dpm2) {
        if let Some(i) =
            (1..sched.timesteps.len()).find(|&i| sched.timesteps[i] == sched.timesteps[i - 1])
        {
            return Err(SamplerError::RepeatedTimestep {
                steps,
                t: sched.timesteps[i],
                i,
                j: i + 1,
                method: method.name(),
            });
        }
    }
    Ok(sched)
}

fn dpm_schedule(
    cfg: &SchedulerConfig,
    tables: &TrainTables,
    steps: usize,
    sigma_last: f32,
) -> Schedule {
    let n = i64::from(cfg.num_train_timesteps);
    // torch.searchsorted(flip(lambda_t), lambda_min_clipped): a lower bound over the ascending
    // (flipped) lambdas, compared in float64 (the Python float promotes the search).
    let flipped = |i: usize| f64::from(tables.lambdas[tables.lambdas.len() - 1 - i]);
    let (mut lo, mut hi) = (0usize, tables.lambdas.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if flipped(mid) >= cfg.lambda_min_clipped {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let last_timestep = n - lo as i64;
    let timesteps: Vec<i64> = match cfg.timestep_spacing {
        TimestepSpacing::Linspace => {
            let mut t: Vec<i64> = np_linspace(0.0, (last_timestep - 1) as f64, steps + 1)
                .into_iter()
                .map(|v| v.round_ties_even() as i64)
                .collect();
            t.reverse();
            t.truncate(steps);
            t
        }
        TimestepSpacing::Leading => {
            let ratio = last_timestep.div_euclid(steps as i64 + 1);
            (1..=steps as i64)
                .rev()
                .map(|i| i * ratio + i64::from(cfg.steps_offset))
                .collect()
        }
        TimestepSpacing::Trailing => {
            let ratio = f64::from(cfg.num_train_timesteps) / steps as f64;
            np_arange(last_timestep as f64, 0.0, -ratio)
                .into_iter()
                .map(|v| v.round_ties_even() as i64 - 1)
                .collect()
        }
    };
    let mut sigmas: Vec<f32> = timesteps
        .iter()
        .map(|&t| np_interp(t as f64, &tables.sigmas) as f32)
        .collect();
    sigmas.push(sigma_last);
    Schedule {
        timesteps: timesteps.iter().map(|&t| t as f32).collect(),
        sigmas,
        init_noise_sigma: 1.0,
        sigmas_interpol: Vec::new(),
        prev_timesteps: Vec::new(),
    }
}

fn euler_schedule(
    cfg: &SchedulerConfig,
    tables: &TrainTables,
    steps: usize,
    sigma_last: f32,
) -> Schedule {
    let timesteps = k_timesteps(cfg, steps);
    let sigmas: Vec<f32> = timesteps
        .iter()
        .map(|&t| np_interp(f64::from(t), &tables.sigmas) as f32)
        .collect();
    k_schedule(timesteps, sigmas, sigma_last, cfg)
}

/// A k-diffusion schedule from its timesteps and sigmas `[S]`: the final sigma appended and
/// Euler's `init_noise_sigma`.
fn k_schedule(
    timesteps: Vec<f32>,
    mut sigmas: Vec<f32>,
    sigma_last: f32,
    cfg: &SchedulerConfig,
) -> Schedule {
    sigmas.push(sigma_last);
    Schedule {
        init_noise_sigma: euler_init_noise_sigma(&sigmas, cfg),
        timesteps,
        sigmas,
        sigmas_interpol: Vec::new(),
        prev_timesteps: Vec::new(),
    }
}

/// `EulerDiscreteScheduler.init_noise_sigma`: the largest sigma, or `sqrt(max² + 1)` with
/// `leading` spacing.
fn euler_init_noise_sigma(sigmas: &[f32], cfg: &SchedulerConfig) -> f32 {
    let max_sigma = sigmas.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    match cfg.timestep_spacing {
        TimestepSpacing::Linspace | TimestepSpacing::Trailing => max_sigma,
        TimestepSpacing::Leading => (max_sigma * max_sigma + 1.0).sqrt(),
    }
}

/// `use_karras_sigmas` of the k-diffusion schedulers (diffusers `EulerDiscreteScheduler`,
/// `HeunDiscreteScheduler`, `KDPM2DiscreteScheduler`): the Euler sigmas interpolated at the
/// spacing's timesteps (float64, as `np.interp`) give `σmax` (first) and `σmin` (last);
/// `σ_i = (σmax^{1/ρ} + i/(S−1)·(σmin^{1/ρ} − σmax^{1/ρ}))^ρ`, ρ = 7; timesteps `t(σ_i)` by
/// numpy's `_sigma_to_t`, as floats (Euler, Heun) or rounded (KDPM2, `round_timesteps`); then
/// the final sigma. Heun and KDPM2 double the result as without karras.
fn k_karras_schedule(
    cfg: &SchedulerConfig,
    tables: &TrainTables,
    steps: usize,
    sigma_last: f32,
    round_timesteps: bool,
) -> Schedule {
    let base = k_timesteps(cfg, steps);
    let in_sigmas: Vec<f64> = base
        .iter()
        .map(|&t| np_interp(f64::from(t), &tables.sigmas))
        .collect();
    let karras = karras_sigmas(in_sigmas[in_sigmas.len() - 1], in_sigmas[0], steps);
    let log_sigmas: Vec<f32> = tables.sigmas.iter().map(|s| s.ln()).collect();
    let timesteps: Vec<f32> = karras
        .iter()
        .map(|&s| {
            let t = sigma_to_t_f64(s, &log_sigmas);
            (if round_timesteps {
                t.round_ties_even()
            } else {
                t
            }) as f32
        })
        .collect();
    let sigmas: Vec<f32> = karras.iter().map(|&s| s as f32).collect();
    k_schedule(timesteps, sigmas, sigma_last, cfg)
}

/// Karras et al. (2022) sigmas (diffusers `_convert_to_karras`, float64 as numpy):
/// `σ_i = (σmax^{1/ρ} + i/(S−1)·(σmin^{1/ρ} − σmax^{1/ρ}))^ρ`, ρ = 7, `[steps]`.
fn karras_sigmas(sigma_min: f64, sigma_max: f64, steps: usize) -> Vec<f64> {
    let rho = 7.0f64;
    let (min_inv, max_inv) = (sigma_min.powf(1.0 / rho), sigma_max.powf(1.0 / rho));
    np_linspace(0.0, 1.0, steps)
        .into_iter()
        .map(|r| (max_inv + r * (min_inv - max_inv)).powf(rho))
        .collect()
}

/// The timesteps of the k-diffusion schedulers for `steps` steps and the config's spacing
/// (float32, as diffusers keeps them).
fn k_timesteps(cfg: &SchedulerConfig, steps: usize) -> Vec<f32> {
    let n = cfg.num_train_timesteps;
    match cfg.timestep_spacing {
        TimestepSpacing::Linspace => {
            let mut t: Vec<f32> = np_linspace(0.0, f64::from(n - 1), steps)
                .into_iter()
                .map(|v| v as f32)
                .collect();
            t.reverse();
            t
        }
        TimestepSpacing::Leading => {
            let ratio = (n as usize / steps) as f64;
            (0..steps)
                .rev()
                .map(|i| (i as f64 * ratio).round_ties_even() as f32 + cfg.steps_offset as f32)
                .collect()
        }
        TimestepSpacing::Trailing => {
            let ratio = f64::from(n) / steps as f64;
            np_arange(f64::from(n), 0.0, -ratio)
                .into_iter()
                .map(|v| v.round_ties_even() as f32 - 1.0)
                .collect()
        }
    }
}

/// `DPMSolverMultistepScheduler.set_timesteps` with `use_karras_sigmas`: `σ_i = (σmax^{1/ρ} +
/// i/(S−1)·(σmin^{1/ρ} − σmax^{1/ρ}))^ρ`, ρ = 7, between the train sigmas at t = N − 1 and
/// t = 0 (float64, as numpy), timesteps `round(t(σ_i))` by numpy's `_sigma_to_t`, then the
/// final sigma.
fn dpm_karras_schedule(tables: &TrainTables, steps: usize, sigma_last: f32) -> Schedule {
    let sig = &tables.sigmas;
    let karras = karras_sigmas(f64::from(sig[0]), f64::from(sig[sig.len() - 1]), steps);
    // numpy's log of the float32 train sigmas stays float32.
    let log_sigmas: Vec<f32> = sig.iter().map(|s| s.ln()).collect();
    let timesteps: Vec<f32> = karras
        .iter()
        .map(|&s| sigma_to_t_f64(s, &log_sigmas).round_ties_even() as f32)
        .collect();
    let mut sigmas: Vec<f32> = karras.iter().map(|&s| s as f32).collect();
    sigmas.push(sigma_last);
    Schedule {
        timesteps,
        sigmas,
        init_noise_sigma: 1.0,
        sigmas_interpol: Vec::new(),
        prev_timesteps: Vec::new(),
    }
}

/// diffusers' numpy `_sigma_to_t`: as [`sigma_to_t`] in float64 over float32 `log_sigmas`.
fn sigma_to_t_f64(sigma: f64, log_sigmas: &[f32]) -> f64 {
    let ls = sigma.max(1e-10).ln();
    let n = log_sigmas.len();
    let (mut low, mut count, mut best) = (0usize, 0usize, 0usize);
    for (i, &l) in log_sigmas.iter().enumerate() {
        if ls - f64::from(l) >= 0.0 {
            count += 1;
            if count > best {
                best = count;
                low = i;
            }
        }
    }
    let low = low.min(n - 2);
    let (lo, hi) = (f64::from(log_sigmas[low]), f64::from(log_sigmas[low + 1]));
    let w = ((lo - ls) / (lo - hi)).clamp(0.0, 1.0);
    (1.0 - w) * low as f64 + w * (low + 1) as f64
}

/// `init_noise_sigma` of the k-diffusion family: the largest sigma, or `sqrt(max² + 1)` with
/// `leading` spacing.
fn k_init_noise_sigma(sigmas: &[f32], cfg: &SchedulerConfig) -> f32 {
    let max_sigma = sigmas.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    match cfg.timestep_spacing {
        TimestepSpacing::Linspace | TimestepSpacing::Trailing => max_sigma,
        TimestepSpacing::Leading => (max_sigma * max_sigma + 1.0).sqrt(),
    }
}

/// `HeunDiscreteScheduler.set_timesteps`: the Euler schedule (final sigma 0) with every
/// timestep but the first and every sigma but the first and last doubled: timesteps `[2S − 1]`,
/// sigmas `[2S]`.
fn heun_schedule(e: Schedule, cfg: &SchedulerConfig) -> Schedule {
    let mut timesteps = vec![e.timesteps[0]];
    for &t in &e.timesteps[1..] {
        timesteps.extend([t, t]);
    }
    let n = e.sigmas.len();
    let mut sigmas = vec![e.sigmas[0]];
    for &s in &e.sigmas[1..n - 1] {
        sigmas.extend([s, s]);
    }
    sigmas.push(e.sigmas[n - 1]);
    Schedule {
        init_noise_sigma: k_init_noise_sigma(&sigmas, cfg),
        timesteps,
        sigmas,
        sigmas_interpol: Vec::new(),
        prev_timesteps: Vec::new(),
    }
}

/// `KDPM2DiscreteScheduler.set_timesteps`: midpoints `m_k = exp(lerp(ln s_k, ln s_{k−1}, ½))`
/// of the Euler sigmas `s` (final 0), both doubled as `cat(s[:1], s[1:].repeat(2), s[-1:])`
/// (`[2S + 2]`), timesteps `t_0, t(m_1), t_1, …, t(m_{S−1}), t_{S−1}` (`[2S − 1]`) with `t(σ)`
/// diffusers' `sigma_to_t` (log-linear interpolation over the train sigmas, in f32).
fn dpm2_schedule(e: Schedule, cfg: &SchedulerConfig, tables: &TrainTables) -> Schedule {
    let s = &e.sigmas;
    let n = s.len();
    // torch.lerp(a, b, w) for w ≥ 0.5 is `b − (b − a)·(1 − w)`: m_S = 0 (from ln 0 = −inf),
    // m_0 = NaN (unused), as in diffusers.
    let interpol: Vec<f32> = (0..n)
        .map(|k| {
            let a = s[k].ln();
            let b = s[(k + n - 1) % n].ln();
            (b - (b - a) * 0.5).exp()
        })
        .collect();
    let double = |v: &[f32]| {
        let mut out = vec![v[0]];
        for &x in &v[1..] {
            out.extend([x, x]);
        }
        out.push(v[n - 1]);
        out
    };
    let log_sigmas: Vec<f32> = tables.sigmas.iter().map(|s| s.ln()).collect();
    let mut timesteps = vec![e.timesteps[0]];
    for k in 1..n - 1 {
        timesteps.push(sigma_to_t(interpol[k], &log_sigmas));
        timesteps.push(e.timesteps[k]);
    }
    let sigmas = double(s);
    Schedule {
        init_noise_sigma: k_init_noise_sigma(&sigmas, cfg),
        timesteps,
        sigmas,
        sigmas_interpol: double(&interpol),
        prev_timesteps: Vec::new(),
    }
}

/// diffusers' `sigma_to_t` in f32: the last train index whose `ln σ` is ≤ `ln sigma` (at most
/// N − 2), then linear interpolation of the index in `ln σ`.
fn sigma_to_t(sigma: f32, log_sigmas: &[f32]) -> f32 {
    let ls = sigma.ln();
    let n = log_sigmas.len();
    let mut low = 0usize;
    let mut count = 0usize;
    let mut best = 0usize;
    for (i, &l) in log_sigmas.iter().enumerate() {
        if ls - l >= 0.0 {
            count += 1;
            if count > best {
                best = count;
                low = i;
            }
        }
    }
    let low = low.min(n - 2);
    let (lo, hi) = (log_sigmas[low], log_sigmas[low + 1]);
    let w = ((lo - ls) / (lo - hi)).clamp(0.0, 1.0);
    (1.0 - w) * low as f32 + w * (low + 1) as f32
}

/// `DDIMScheduler.set_timesteps` (integer timesteps by the config's spacing) and its
/// `t_prev = t − N_train / S`.
fn ddim_schedule(cfg: &SchedulerConfig, tables: &TrainTables, steps: usize) -> Schedule {
    let n = i64::from(cfg.num_train_timesteps);
    let s = steps as i64;
    let timesteps: Vec<i64> = match cfg.timestep_spacing {
        TimestepSpacing::Linspace => {
            let mut t: Vec<i64> = np_linspace(0.0, (n - 1) as f64, steps)
                .into_iter()
                .map(|v| v.round_ties_even() as i64)
                .collect();
            t.reverse();
            t
        }
        TimestepSpacing::Leading => {
            let ratio = n / s;
            (0..s)
                .rev()
                .map(|i| i * ratio + i64::from(cfg.steps_offset))
                .collect()
        }
        TimestepSpacing::Trailing => {
            let ratio = n as f64 / steps as f64;
            np_arange(n as f64, 0.0, -ratio)
                .into_iter()
                .map(|v| v.round_ties_even() as i64 - 1)
                .collect()
        }
    };
    let prev_timesteps = timesteps.iter().map(|&t| t - n / s).collect();
    alpha_schedule(timesteps, prev_timesteps, tables)
}

/// LCM's `original_inference_steps` (diffusers' default; PixArt-LCM's config).
pub const LCM_ORIGINAL_STEPS: usize = 50;
/// LCM's `timestep_scaling`.
pub const LCM_TIMESTEP_SCALING: f32 = 10.0;

/// `LCMScheduler.set_timesteps` (ignores `timestep_spacing`): the original schedule
/// `[1..50]·(N_train / 50) − 1` reversed, sampled at `floor(linspace(0, 50, S, endpoint=False))`.
fn lcm_schedule(
    cfg: &SchedulerConfig,
    tables: &TrainTables,
    steps: usize,
) -> Result<Schedule, SamplerError> {
    if steps > LCM_ORIGINAL_STEPS {
        return Err(SamplerError::BadSteps {
            steps,
            max: LCM_ORIGINAL_STEPS as u32,
            what: "LCM's original_inference_steps",
        });
    }
    let k = i64::from(cfg.num_train_timesteps) / LCM_ORIGINAL_STEPS as i64;
    let origin: Vec<i64> = (1..=LCM_ORIGINAL_STEPS as i64)
        .rev()
        .map(|i| i * k - 1)
        .collect();
    let timesteps: Vec<i64> = (0..steps)
        .map(|i| {
            let x = i as f64 * (LCM_ORIGINAL_STEPS as f64 / steps as f64);
            origin[x.floor() as usize]
        })
        .collect();
    let prev_timesteps = (0..steps)
        .map(|i| timesteps.get(i + 1).copied().unwrap_or(timesteps[i]))
        .collect();
    Ok(alpha_schedule(timesteps, prev_timesteps, tables))
}

/// `x0` from the model output `out` at noise level `sigma` for sample `x` (k-diffusion
/// parameterisation, as the Euler-type schedulers compute `pred_original_sample`).
fn k_x0(prediction: PredictionType, sigma: f32, x: f32, out: f32) -> f32 {
    match prediction {
        PredictionType::Epsilon => x - sigma * out,
        PredictionType::VPrediction => {
            let sq = sigma * sigma + 1.0;
            out * (-sigma / sq.sqrt()) + x / sq
        }
        PredictionType::Sample => out,
    }
}

/// UniC's `R` (rows `rks^0`, `rks^1` with `rks = [rk, 1]`) and `b` (`h_phi_k · k! / B_h`,
/// `h_phi_1 = expm1(hh) / hh − 1`, `h_phi_2 = h_phi_1 / hh − 1/2`) for order 2.
fn unipc_rb(rk: f32, hh: f32, b_h: f32) -> ([[f32; 2]; 2], [f32; 2]) {
    let mut h_phi_k = hh.exp_m1() / hh - 1.0;
    let mut factorial = 1.0f32;
    let mut b = [0f32; 2];
    for (k, bk) in b.iter_mut().enumerate() {
        *bk = h_phi_k * factorial / b_h;
        factorial *= (k + 2) as f32;
        h_phi_k = h_phi_k / hh - 1.0 / factorial;
    }
    ([[1.0, 1.0], [rk, 1.0]], b)
}

/// `torch.linalg.solve` of a 2×2 system by LU with partial pivoting (LAPACK `sgesv`).
fn solve2(a: [[f32; 2]; 2], b: [f32; 2]) -> [f32; 2] {
    let (a, b) = if a[1][0].abs() > a[0][0].abs() {
        ([a[1], a[0]], [b[1], b[0]])
    } else {
        (a, b)
    };
    let l = a[1][0] / a[0][0];
    let u22 = a[1][1] - l * a[0][1];
    let y2 = b[1] - l * b[0];
    let x2 = y2 / u22;
    let x1 = (b[0] - a[0][1] * x2) / a[0][0];
    [x1, x2]
}

/// LCM's boundary-condition scalings at timestep `t`: `c_skip = σ_d²/((10t)² + σ_d²)`,
/// `c_out = 10t/sqrt((10t)² + σ_d²)`, σ_d = 0.5, in f32 as diffusers' tensors.
pub fn lcm_scalings(t: f32) -> (f32, f32) {
    let scaled = t * LCM_TIMESTEP_SCALING;
    let denom = scaled * scaled + 0.25;
    (0.25 / denom, scaled / denom.sqrt())
}

/// A schedule of the ᾱ-parameterised samplers (DDIM, LCM): init sigma 1, and for messages
/// and checks the train sigmas at the timesteps (their steps do not use them).
fn alpha_schedule(timesteps: Vec<i64>, prev_timesteps: Vec<i64>, tables: &TrainTables) -> Schedule {
    let mut sigmas: Vec<f32> = timesteps
        .iter()
        .map(|&t| tables.sigmas[t.clamp(0, tables.sigmas.len() as i64 - 1) as usize])
        .collect();
    sigmas.push(0.0);
    Schedule {
        timesteps: timesteps.iter().map(|&t| t as f32).collect(),
        sigmas,
        init_noise_sigma: 1.0,
        sigmas_interpol: Vec::new(),
        prev_timesteps,
    }
}

fn check_schedule(s: &Schedule) -> Result<(), SamplerError> {
    let steps = s.timesteps.len();
    if steps == 0 {
        return Err(SamplerError::BadSchedule {
            what: "no timesteps".to_string(),
        });
    }
    for (i, &sigma) in s.sigmas.iter().enumerate() {
        let final_zero = i >= steps && sigma == 0.0;
        let usable = sigma > 0.0 && (sigma * sigma).is_finite();
        if !(final_zero || usable) {
            return Err(SamplerError::BadSchedule {
                what: format!("sigma[{i}] = {sigma} (timestep {:?})", s.timesteps.get(i)),
            });
        }
    }
    if !s.init_noise_sigma.is_finite() {
        return Err(SamplerError::BadSchedule {
            what: format!("init_noise_sigma = {}", s.init_noise_sigma),
        });
    }
    Ok(())
}

/// diffusers `_sigma_to_alpha_sigma_t`: `alpha = 1 / sqrt(sigma² + 1)`, `sigma_t = sigma·alpha`.
fn alpha_sigma(sigma: f32) -> (f32, f32) {
    let alpha = 1.0 / (sigma * sigma + 1.0).sqrt();
    (alpha, sigma * alpha)
}

/// `lambda = ln(alpha) − ln(sigma_t)` (infinite when `sigma_t = 0`).
fn lambda(alpha: f32, sigma_t: f32) -> f32 {
    alpha.ln() - sigma_t.ln()
}

/// A sampler over one latent tensor of `latent_len` values.
///
/// Call [`Sampler::scale_model_input`] and [`Sampler::step`] for step 0, 1, …, S − 1 in order;
/// calling step 0 again restarts. Buffers are allocated in [`Sampler::new`]; `step` does not
/// allocate.
#[derive(Clone, Debug)]
pub struct Sampler {
    method: SamplingMethod,
    schedule: Schedule,
    prediction: PredictionType,
    solver_order: u32,
    solver_type: SolverType,
    lower_order_final: bool,
    euler_at_final: bool,
    final_sigma_zero: bool,
    latent_len: usize,
    /// DPM-Solver: data prediction `x0` of this step, `[latent_len]`.
    x0: Vec<f32>,
    /// DPM-Solver: data prediction of the previous step, `[latent_len]`.
    x0_prev: Vec<f32>,
    /// Completed steps since the start, capped at the solver order (`lower_order_nums`).
    lower_order_nums: u32,
    next_step: usize,
    /// DDIM, LCM: `alphas_cumprod` of the train schedule.
    alphas_cumprod: Vec<f32>,
    /// Heun, DPM2: the latents at the start of the interval (`self.sample`); UniPC: the data
    /// prediction of the step before the last; `[latent_len]`.
    stash: Vec<f32>,
    /// Heun: the first call's derivative, `[latent_len]`.
    prev_derivative: Vec<f32>,
    /// Heun: the first call's `dt`.
    heun_dt: f32,
    /// Heun, DPM2: the next call is the first of an interval.
    first_order: bool,
    /// UniPC: the sample before the last predictor (`last_sample`), `[latent_len]`.
    last_sample: Vec<f32>,
    /// UniPC: the order of the last predictor (`this_order`).
    last_order: u32,
    /// The first step index of the run (`set_begin_index`; 0 but for image to image).
    begin: usize,
}

/// The first step of an image-to-image run of `steps` inference steps at `strength`
/// (diffusers' img2img `get_timesteps`): `init_timestep = min(⌊steps · strength⌋, steps)`
/// (the product in f64, as Python computes it), `t_start = steps − init_timestep`, and the run
/// begins at step index `t_start · order` of the full schedule.
///
/// # Errors
/// [`SamplerError::Strength`] for a strength outside (0, 1] or one that leaves no step.
pub fn img2img_begin(
    steps: usize,
    strength: f64,
    method: SamplingMethod,
) -> Result<usize, SamplerError> {
    if !(strength > 0.0 && strength <= 1.0) {
        return Err(SamplerError::Strength {
            strength,
            steps,
            why: "must be in (0, 1]",
        });
    }
    let init_timestep = ((steps as f64 * strength) as usize).min(steps);
    if init_timestep == 0 {
        return Err(SamplerError::Strength {
            strength,
            steps,
            why: "leaves no denoising step (⌊steps · strength⌋ = 0); raise --strength or --steps",
        });
    }
    Ok((steps - init_timestep) * method.order())
}

impl Sampler {
    /// A sampler for `steps` inference steps over latents of `latent_len` values.
    ///
    /// # Errors
    /// As [`schedule`].
    pub fn new(
        cfg: &SchedulerConfig,
        method: SamplingMethod,
        steps: usize,
        latent_len: usize,
    ) -> Result<Self, SamplerError> {
        let schedule = schedule(cfg, method, steps)?;
        use SamplingMethod as M;
        // A latent-sized buffer for the methods that keep one, empty for the others.
        let buffer = |used_by: &[M]| {
            vec![
                0.0f32;
                if used_by.contains(&method) {
                    latent_len
                } else {
                    0
                }
            ]
        };
        let alphas_cumprod = match method {
            SamplingMethod::Ddim | SamplingMethod::Lcm => train_tables(cfg).alphas_cumprod,
            _ => Vec::new(),
        };
        Ok(Sampler {
            method,
            schedule,
            prediction: cfg.prediction_type,
            solver_order: cfg.solver_order,
            solver_type: cfg.solver_type,
            lower_order_final: cfg.lower_order_final,
            euler_at_final: cfg.euler_at_final,
            final_sigma_zero: cfg.final_sigmas_type == FinalSigmasType::Zero,
            latent_len,
            x0: buffer(&[M::DpmPp2m, M::UniPc]),
            x0_prev: buffer(&[M::DpmPp2m, M::UniPc]),
            lower_order_nums: 0,
            next_step: 0,
            alphas_cumprod,
            stash: buffer(&[M::Heun, M::Dpm2, M::UniPc]),
            prev_derivative: buffer(&[M::Heun]),
            heun_dt: 0.0,
            first_order: true,
            last_sample: buffer(&[M::UniPc]),
            last_order: 0,
            begin: 0,
        })
    }

    /// Starts the run at step index `begin` of the full schedule instead of 0 (diffusers'
    /// `set_begin_index`, image to image): the solver's history starts empty there.
    ///
    /// # Errors
    /// [`SamplerError::StepOrder`] for `begin` ≥ S.
    pub fn begin_at(&mut self, begin: usize) -> Result<(), SamplerError> {
        self.check_index(begin)?;
        self.begin = begin;
        self.next_step = begin;
        self.lower_order_nums = 0;
        self.first_order = true;
        Ok(())
    }

    /// The first step index of the run (0 unless [`Sampler::begin_at`] moved it).
    pub fn begin(&self) -> usize {
        self.begin
    }

    /// The denoiser's estimate of the clean latents at step `i` (the `denoised` stable-diffusion.cpp
    /// previews): from `latents` before the step and the guided `model_output`, all
    /// `[latent_len]`. Sigma-based samplers: k-diffusion's `x0` at the call's σ; DPM-Solver++,
    /// UniPC, DDIM and LCM: `(x − σ_t·ε)/α_t` (epsilon; `α_t·x − σ_t·v` for v-prediction, the
    /// output itself for `sample`), σ_t and α_t of the step.
    ///
    /// # Errors
    /// [`SamplerError::Length`] for wrong lengths, [`SamplerError::StepOrder`] for `i` ≥ S.
    pub fn denoised(
        &self,
        i: usize,
        latents: &[f32],
        model_output: &[f32],
        out: &mut [f32],
    ) -> Result<(), SamplerError> {
        self.check_index(i)?;
        self.check("latents", latents.len())?;
        self.check("model_output", model_output.len())?;
        self.check("denoised", out.len())?;
        let vp = |alpha: f32, sigma_t: f32, out: &mut [f32]| {
            for ((o, &x), &m) in out.iter_mut().zip(latents).zip(model_output) {
                *o = match self.prediction {
                    PredictionType::Epsilon => (x - sigma_t * m) / alpha,
                    PredictionType::VPrediction => alpha * x - sigma_t * m,
                    PredictionType::Sample => m,
                };
            }
        };
        match self.method {
            SamplingMethod::DpmPp2m | SamplingMethod::UniPc => {
                let (a, s) = alpha_sigma(self.schedule.sigmas[i]);
                vp(a, s, out);
            }
            SamplingMethod::Ddim | SamplingMethod::Lcm => {
                let ab = self.alpha_bar(self.schedule.timesteps[i] as i64);
                vp(ab.sqrt(), (1.0 - ab).sqrt(), out);
            }
            _ => {
                let sigma = match self.method {
                    SamplingMethod::Dpm2 if !self.first_order => self.schedule.sigmas_interpol[i],
                    _ => self.schedule.sigmas[i],
                };
                for ((o, &x), &m) in out.iter_mut().zip(latents).zip(model_output) {
                    *o = k_x0(self.prediction, sigma, x, m);
                }
            }
        }
        Ok(())
    }

    /// `scheduler.add_noise(x0, noise, timesteps[begin])`: the clean latents `x0` noised to the
    /// level of the run's first step, into `out` (all `[latent_len]`). Sigma-based samplers
    /// (Euler, Euler a, Heun, DPM2): `x0 + σ·noise`; DPM-Solver++ and UniPC: `α·x0 + σ_t·noise`
    /// with `α = 1/sqrt(σ² + 1)`, `σ_t = σ·α`; DDIM and LCM: `sqrt(ᾱ_t)·x0 + sqrt(1 − ᾱ_t)·noise`
    /// at the step's timestep. σ is `sigmas[begin]`. No `init_noise_sigma` factor.
    ///
    /// # Errors
    /// [`SamplerError::Length`] for wrong lengths.
    pub fn add_noise(
        &self,
        x0: &[f32],
        noise: &[f32],
        out: &mut [f32],
    ) -> Result<(), SamplerError> {
        self.check("clean latents", x0.len())?;
        self.check("noise", noise.len())?;
        self.check("noised latents", out.len())?;
        let b = self.begin;
        let (a, s) = match self.method {
            SamplingMethod::Euler
            | SamplingMethod::EulerAncestral
            | SamplingMethod::Heun
            | SamplingMethod::Dpm2 => (1.0, self.schedule.sigmas[b]),
            SamplingMethod::DpmPp2m | SamplingMethod::UniPc => {
                let sigma = self.schedule.sigmas[b];
                let alpha = 1.0 / (sigma * sigma + 1.0).sqrt();
                (alpha, sigma * alpha)
            }
            SamplingMethod::Ddim | SamplingMethod::Lcm => {
                let t = self.schedule.timesteps[b] as i64;
                let ab = self.alpha_bar(t);
                (ab.sqrt(), (1.0 - ab).sqrt())
            }
        };
        for ((o, &x), &n) in out.iter_mut().zip(x0).zip(noise) {
            *o = a * x + s * n;
        }
        Ok(())
    }

    /// The method this sampler runs.
    pub fn method(&self) -> SamplingMethod {
        self.method
    }

    /// Number of steps S.
    pub fn steps(&self) -> usize {
        self.schedule.timesteps.len()
    }

    /// The timestep to feed the denoiser at each step, `[S]`.
    pub fn timesteps(&self) -> &[f32] {
        &self.schedule.timesteps
    }

    /// The noise levels, `[S + 1]`.
    pub fn sigmas(&self) -> &[f32] {
        &self.schedule.sigmas
    }

    /// The full schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Multiplier of the standard-normal initial noise (1 for DPM-Solver, max sigma for Euler
    /// with linspace/trailing spacing).
    pub fn init_noise_sigma(&self) -> f32 {
        self.schedule.init_noise_sigma
    }

    fn check(&self, what: &'static str, len: usize) -> Result<(), SamplerError> {
        if len == self.latent_len {
            Ok(())
        } else {
            Err(SamplerError::Length {
                what,
                found: len,
                expected: self.latent_len,
            })
        }
    }

    fn check_index(&self, step_index: usize) -> Result<(), SamplerError> {
        if step_index >= self.steps() {
            return Err(SamplerError::StepOrder {
                found: step_index,
                expected: self.next_step,
                steps: self.steps(),
            });
        }
        Ok(())
    }

    /// The denoiser input for step `step_index`: identity for DPM-Solver, DDIM and LCM,
    /// `x / sqrt(σ² + 1)` for the sigma-based samplers (σ of the call: DPM2's second call uses
    /// its midpoint). `latents` and `out` are `[latent_len]`.
    ///
    /// # Errors
    /// [`SamplerError::Length`] for wrong lengths, [`SamplerError::StepOrder`] for an index ≥ S.
    pub fn scale_model_input(
        &self,
        step_index: usize,
        latents: &[f32],
        out: &mut [f32],
    ) -> Result<(), SamplerError> {
        self.check_index(step_index)?;
        self.check("latents", latents.len())?;
        self.check("scaled output", out.len())?;
        let sigma = match self.method {
            SamplingMethod::DpmPp2m
            | SamplingMethod::Ddim
            | SamplingMethod::Lcm
            | SamplingMethod::UniPc => {
                out.copy_from_slice(latents);
                return Ok(());
            }
            // DPM2's second call runs at the interval's midpoint.
            SamplingMethod::Dpm2 if !self.first_order => self.schedule.sigmas_interpol[step_index],
            _ => self.schedule.sigmas[step_index],
        };
        let denom = (sigma * sigma + 1.0).sqrt();
        for (o, &x) in out.iter_mut().zip(latents) {
            *o = x / denom;
        }
        Ok(())
    }

    /// Advances `latents` (`[latent_len]`, in place) from step `step_index` to the next noise
    /// level, given the denoiser's prediction `model_output` (`[latent_len]`, after guidance;
    /// epsilon for PixArt).
    ///
    /// # Errors
    /// [`SamplerError::Length`] for wrong lengths; [`SamplerError::StepOrder`] when
    /// `step_index` is neither the next step nor 0.
    pub fn step(
        &mut self,
        step_index: usize,
        model_output: &[f32],
        latents: &mut [f32],
    ) -> Result<(), SamplerError> {
        self.step_with_noise(step_index, model_output, latents, None)
    }

    /// [`Sampler::step`] for every method: `noise` (`[latent_len]`, standard normal, drawn
    /// from the run's generator after what it drew before) is required exactly at the steps
    /// [`SamplingMethod::draws_noise`] names, as diffusers draws it.
    ///
    /// # Errors
    /// As [`Sampler::step`], and [`SamplerError::Noise`] when the noise is missing or of the
    /// wrong length.
    pub fn step_with_noise(
        &mut self,
        step_index: usize,
        model_output: &[f32],
        latents: &mut [f32],
        noise: Option<&[f32]>,
    ) -> Result<(), SamplerError> {
        self.check_index(step_index)?;
        let wants = self.method.draws_noise(step_index, self.steps());
        let noise = match noise {
            Some(n) if wants && n.len() == self.latent_len => Some(n),
            None if !wants => None,
            _ => {
                return Err(SamplerError::Noise {
                    step: step_index,
                    method: self.method.name(),
                    expected: if wants { self.latent_len } else { 0 },
                })
            }
        };
        if step_index != self.next_step && step_index != self.begin {
            return Err(SamplerError::StepOrder {
                found: step_index,
                expected: self.next_step,
                steps: self.steps(),
            });
        }
        self.check("model_output", model_output.len())?;
        self.check("latents", latents.len())?;
        if step_index == self.begin {
            self.lower_order_nums = 0;
            self.first_order = true;
        }
        match self.method {
            SamplingMethod::DpmPp2m => self.dpm_step(step_index, model_output, latents),
            SamplingMethod::Euler => self.euler_step(step_index, model_output, latents),
            SamplingMethod::EulerAncestral => {
                self.euler_a_step(step_index, model_output, latents, noise.unwrap_or(&[]))
            }
            SamplingMethod::Heun => self.heun_step(step_index, model_output, latents),
            SamplingMethod::Dpm2 => self.dpm2_step(step_index, model_output, latents),
            SamplingMethod::Ddim => self.ddim_step(step_index, model_output, latents),
            SamplingMethod::Lcm => self.lcm_step(step_index, model_output, latents, noise),
            SamplingMethod::UniPc => self.unipc_step(step_index, model_output, latents),
        }
        self.next_step = step_index + 1;
        Ok(())
    }

    /// `DPMSolverMultistepScheduler.step` for `dpmsolver++` (no noise, no thresholding).
    fn dpm_step(&mut self, i: usize, model_output: &[f32], x: &mut [f32]) {
        // convert_model_output: the data prediction x0.
        self.data_prediction(self.schedule.sigmas[i], x, model_output);
        let sigmas = &self.schedule.sigmas;
        let (alpha_s0, sigma_s0) = alpha_sigma(sigmas[i]);

        let steps = self.steps();
        let lower_order_final = i == steps - 1
            && (self.euler_at_final
                || (self.lower_order_final && steps < 15)
                || self.final_sigma_zero);
        let (alpha_t, sigma_t) = alpha_sigma(sigmas[i + 1]);
        let lambda_t = lambda(alpha_t, sigma_t);
        let lambda_s0 = lambda(alpha_s0, sigma_s0);
        let h = lambda_t - lambda_s0;
        let ratio = sigma_t / sigma_s0;
        let exp_m1 = (-h).exp() - 1.0;
        let coef = alpha_t * exp_m1;

        if self.solver_order == 1 || self.lower_order_nums < 1 || lower_order_final {
            // dpm_solver_first_order_update
            for (xv, &d0) in x.iter_mut().zip(self.x0.iter()) {
                *xv = ratio * *xv - coef * d0;
            }
        } else {
            // multistep_dpm_solver_second_order_update
            let (alpha_s1, sigma_s1) = alpha_sigma(sigmas[i - 1]);
            let lambda_s1 = lambda(alpha_s1, sigma_s1);
            let h_0 = lambda_s0 - lambda_s1;
            let r0 = h_0 / h;
            let inv_r0 = 1.0 / r0;
            match self.solver_type {
                SolverType::Midpoint => {
                    let half_coef = 0.5 * coef;
                    for ((xv, &m0), &m1) in
                        x.iter_mut().zip(self.x0.iter()).zip(self.x0_prev.iter())
                    {
                        let d1 = inv_r0 * (m0 - m1);
                        *xv = ratio * *xv - coef * m0 - half_coef * d1;
                    }
                }
                SolverType::Heun => {
                    let coef1 = alpha_t * (exp_m1 / h + 1.0);
                    for ((xv, &m0), &m1) in
                        x.iter_mut().zip(self.x0.iter()).zip(self.x0_prev.iter())
                    {
                        let d1 = inv_r0 * (m0 - m1);
                        *xv = ratio * *xv - coef * m0 + coef1 * d1;
                    }
                }
            }
        }
        std::mem::swap(&mut self.x0, &mut self.x0_prev);
        if self.lower_order_nums < self.solver_order {
            self.lower_order_nums += 1;
        }
    }

    /// `convert_model_output` of DPM-Solver++ and UniPC: the data prediction at `sigma` into
    /// `x0`.
    fn data_prediction(&mut self, sigma: f32, x: &[f32], model_output: &[f32]) {
        let (alpha, sigma_t) = alpha_sigma(sigma);
        match self.prediction {
            PredictionType::Epsilon => {
                for ((d, &xv), &e) in self.x0.iter_mut().zip(x).zip(model_output) {
                    *d = (xv - sigma_t * e) / alpha;
                }
            }
            PredictionType::VPrediction => {
                for ((d, &xv), &v) in self.x0.iter_mut().zip(x).zip(model_output) {
                    *d = alpha * xv - sigma_t * v;
                }
            }
            PredictionType::Sample => self.x0.copy_from_slice(model_output),
        }
    }

    /// `EulerAncestralDiscreteScheduler.step`: `σ_up = sqrt(σ'²·(σ² − σ'²)/σ²)`,
    /// `σ_down = sqrt(σ'² − σ_up²)`, `x' = x + ((x − x0)/σ)·(σ_down − σ) + noise·σ_up`.
    fn euler_a_step(&self, i: usize, model_output: &[f32], x: &mut [f32], noise: &[f32]) {
        let sigma_from = self.schedule.sigmas[i];
        let sigma_to = self.schedule.sigmas[i + 1];
        let sigma_up = (sigma_to * sigma_to * (sigma_from * sigma_from - sigma_to * sigma_to)
            / (sigma_from * sigma_from))
            .sqrt();
        let sigma_down = (sigma_to * sigma_to - sigma_up * sigma_up).sqrt();
        let dt = sigma_down - sigma_from;
        for ((xv, &o), &n) in x.iter_mut().zip(model_output).zip(noise) {
            let x0 = k_x0(self.prediction, sigma_from, *xv, o);
            let derivative = (*xv - x0) / sigma_from;
            *xv = (*xv + derivative * dt) + n * sigma_up;
        }
    }

    /// `HeunDiscreteScheduler.step`: the first call of an interval `σ → σ'` is an Euler step
    /// (its derivative and `dt` kept), the second averages the derivatives at `σ` and at `σ'`
    /// (x0 from the second call's output at `σ'`) and steps from the interval's start.
    fn heun_step(&mut self, i: usize, model_output: &[f32], x: &mut [f32]) {
        // The element loops zip these buffers: a short one would make the step a no-op.
        debug_assert_eq!(self.stash.len(), x.len());
        let sig = &self.schedule.sigmas;
        if self.first_order {
            let (sigma, sigma_next) = (sig[i], sig[i + 1]);
            let dt = sigma_next - sigma;
            for (((xv, &o), d), st) in x
                .iter_mut()
                .zip(model_output)
                .zip(self.prev_derivative.iter_mut())
                .zip(self.stash.iter_mut())
            {
                let x0 = k_x0(self.prediction, sigma, *xv, o);
                let derivative = (*xv - x0) / sigma;
                *d = derivative;
                *st = *xv;
                *xv += derivative * dt;
            }
            self.heun_dt = dt;
            self.first_order = false;
        } else {
            let sigma_next = sig[i];
            let dt = self.heun_dt;
            for (((xv, &o), &d), &st) in x
                .iter_mut()
                .zip(model_output)
                .zip(self.prev_derivative.iter())
                .zip(self.stash.iter())
            {
                let x0 = k_x0(self.prediction, sigma_next, *xv, o);
                let derivative = (d + (*xv - x0) / sigma_next) / 2.0;
                *xv = st + derivative * dt;
            }
            self.first_order = true;
        }
    }

    /// `KDPM2DiscreteScheduler.step`: the first call of an interval `σ → σ'` steps to its
    /// midpoint `m`; the second, with the output at `m`, steps the interval's start to `σ'`
    /// along `(x_m − x0)/m`.
    fn dpm2_step(&mut self, i: usize, model_output: &[f32], x: &mut [f32]) {
        // The element loops zip these buffers: a short one would make the step a no-op.
        debug_assert_eq!(self.stash.len(), x.len());
        let sig = &self.schedule.sigmas;
        let ip = &self.schedule.sigmas_interpol;
        // diffusers' KDPM2 has no `sample` prediction; it is read as epsilon here, as before.
        let pred = match self.prediction {
            PredictionType::Sample => PredictionType::Epsilon,
            p => p,
        };
        if self.first_order {
            let (sigma, sigma_interpol) = (sig[i], ip[i + 1]);
            let dt = sigma_interpol - sigma;
            for ((xv, &o), st) in x.iter_mut().zip(model_output).zip(self.stash.iter_mut()) {
                let x0 = k_x0(pred, sigma, *xv, o);
                let derivative = (*xv - x0) / sigma;
                *st = *xv;
                *xv += derivative * dt;
            }
            self.first_order = false;
        } else {
            let (sigma, sigma_interpol, sigma_next) = (sig[i - 1], ip[i], sig[i]);
            let dt = sigma_next - sigma;
            for ((xv, &o), &st) in x.iter_mut().zip(model_output).zip(self.stash.iter()) {
                let x0 = k_x0(pred, sigma_interpol, *xv, o);
                let derivative = (*xv - x0) / sigma_interpol;
                *xv = st + derivative * dt;
            }
            self.first_order = true;
        }
    }

    /// ᾱ at train timestep `t`, or 1 (`set_alpha_to_one`, the DDIM and LCM default) below 0.
    fn alpha_bar(&self, t: i64) -> f32 {
        if t < 0 {
            1.0
        } else {
            self.alphas_cumprod[(t as usize).min(self.alphas_cumprod.len() - 1)]
        }
    }

    /// `DDIMScheduler.step` with eta 0 and `clip_sample` (DDIM's default): `x0` clamped to
    /// [−1, 1], `x' = sqrt(ᾱ_prev)·x0 + sqrt(1 − ᾱ_prev)·ε` (ε not re-derived from the
    /// clamped x0).
    fn ddim_step(&self, i: usize, model_output: &[f32], x: &mut [f32]) {
        let a_t = self.alpha_bar(self.schedule.timesteps[i] as i64);
        let a_prev = self.alpha_bar(self.schedule.prev_timesteps[i]);
        let b_t = 1.0 - a_t;
        let (sa_t, sb_t) = (a_t.sqrt(), b_t.sqrt());
        let sa_prev = a_prev.sqrt();
        let dir = (1.0 - a_prev - 0.0).sqrt();
        for (xv, &o) in x.iter_mut().zip(model_output) {
            let (x0, eps) = match self.prediction {
                PredictionType::Epsilon => ((*xv - sb_t * o) / sa_t, o),
                PredictionType::Sample => (o, (*xv - sa_t * o) / sb_t),
                PredictionType::VPrediction => (sa_t * *xv - sb_t * o, sa_t * o + sb_t * *xv),
            };
            let x0 = x0.clamp(-1.0, 1.0);
            *xv = sa_prev * x0 + dir * eps;
        }
    }

    /// `LCMScheduler.step`: `x0` from ε, `denoised = c_out·x0 + c_skip·x` with the boundary
    /// scalings at `10·t` (σ_data 0.5), then `sqrt(ᾱ_next)·denoised + sqrt(1 − ᾱ_next)·noise`,
    /// or `denoised` at the last step.
    fn lcm_step(&self, i: usize, model_output: &[f32], x: &mut [f32], noise: Option<&[f32]>) {
        let t = self.schedule.timesteps[i];
        let a_t = self.alpha_bar(t as i64);
        let a_prev = self.alpha_bar(self.schedule.prev_timesteps[i]);
        let (c_skip, c_out) = lcm_scalings(t);
        let (sa_t, sb_t) = (a_t.sqrt(), (1.0 - a_t).sqrt());
        let (sa_prev, sb_prev) = (a_prev.sqrt(), (1.0 - a_prev).sqrt());
        for (j, (xv, &o)) in x.iter_mut().zip(model_output).enumerate() {
            let x0 = match self.prediction {
                PredictionType::Epsilon => (*xv - sb_t * o) / sa_t,
                PredictionType::Sample => o,
                PredictionType::VPrediction => sa_t * *xv - sb_t * o,
            };
            let denoised = c_out * x0 + c_skip * *xv;
            *xv = match noise {
                Some(n) => sa_prev * denoised + sb_prev * n[j],
                None => denoised,
            };
        }
    }

    /// `UniPCMultistepScheduler.step` (predict_x0, bh2, orders 1–2, no disabled corrector):
    /// the data prediction `m` of this step; from the second step the UniC corrector
    /// (`multistep_uni_c_bh_update`) replaces the sample with one that also uses `m`; then
    /// the history shifts and the UniP predictor (`multistep_uni_p_bh_update`) of order
    /// `min(solver_order, S − i, steps so far + 1)` steps to the next sigma. Scalars in f32 as
    /// diffusers' tensors.
    fn unipc_step(&mut self, i: usize, model_output: &[f32], x: &mut [f32]) {
        // The element loops zip these buffers: a short one would make the step a no-op.
        debug_assert_eq!(self.stash.len(), x.len());
        // convert_model_output: this step's data prediction, kept in `x0`.
        self.data_prediction(self.schedule.sigmas[i], x, model_output);
        let sig = &self.schedule.sigmas;
        let lambda_of = |sigma: f32| {
            let (a, s) = alpha_sigma(sigma);
            lambda(a, s)
        };
        // The corrector: x (the predictor's output) from last_sample with the previous data
        // prediction m0 = x0_prev, this step's output x0, and for order 2 the one before
        // (kept in `stash`); not at the run's first step (no `last_sample` yet).
        if i > self.begin {
            let order = self.last_order;
            let (alpha_t, sigma_t) = alpha_sigma(sig[i]);
            let (_, sigma_s0) = alpha_sigma(sig[i - 1]);
            let h = lambda_of(sig[i]) - lambda_of(sig[i - 1]);
            let hh = -h;
            let h_phi_1 = hh.exp_m1();
            let b_h = hh.exp_m1();
            let ratio = sigma_t / sigma_s0;
            let coef = alpha_t * h_phi_1;
            let ab = alpha_t * b_h;
            if order >= 2 {
                let rk = (lambda_of(sig[i - 2]) - lambda_of(sig[i - 1])) / h;
                let (r, b) = unipc_rb(rk, hh, b_h);
                let rhos = solve2(r, b);
                for ((((xv, &ls), &m0), &m1), &mt) in x
                    .iter_mut()
                    .zip(&self.last_sample)
                    .zip(&self.x0_prev)
                    .zip(&self.stash)
                    .zip(&self.x0)
                {
                    let d1 = (m1 - m0) / rk;
                    let corr = rhos[0] * d1;
                    let x_t_ = ratio * ls - coef * m0;
                    *xv = x_t_ - ab * (corr + rhos[1] * (mt - m0));
                }
            } else {
                for (((xv, &ls), &m0), &mt) in x
                    .iter_mut()
                    .zip(&self.last_sample)
                    .zip(&self.x0_prev)
                    .zip(&self.x0)
                {
                    let x_t_ = ratio * ls - coef * m0;
                    *xv = x_t_ - ab * (0.0 + 0.5 * (mt - m0));
                }
            }
        }
        // Shift the history: stash ← m_{i−1}, x0_prev ← m_i.
        std::mem::swap(&mut self.stash, &mut self.x0_prev);
        std::mem::swap(&mut self.x0_prev, &mut self.x0);
        let steps = self.steps();
        let mut order = self.solver_order;
        if self.lower_order_final {
            order = order.min((steps - i) as u32);
        }
        order = order.min(self.lower_order_nums + 1);
        self.last_order = order;
        self.last_sample.copy_from_slice(x);
        // The predictor from m0 = x0_prev (this step) and m1 = stash (the previous one).
        let (alpha_t, sigma_t) = alpha_sigma(sig[i + 1]);
        let (_, sigma_s0) = alpha_sigma(sig[i]);
        let h = lambda_of(sig[i + 1]) - lambda_of(sig[i]);
        let hh = -h;
        let h_phi_1 = hh.exp_m1();
        let b_h = hh.exp_m1();
        let ratio = sigma_t / sigma_s0;
        let coef = alpha_t * h_phi_1;
        let ab = alpha_t * b_h;
        if order >= 2 {
            let rk = (lambda_of(sig[i - 1]) - lambda_of(sig[i])) / h;
            for ((xv, &m0), &m1) in x.iter_mut().zip(&self.x0_prev).zip(&self.stash) {
                let d1 = (m1 - m0) / rk;
                *xv = (ratio * *xv - coef * m0) - ab * (0.5 * d1);
            }
        } else {
            for (xv, &m0) in x.iter_mut().zip(&self.x0_prev) {
                *xv = (ratio * *xv - coef * m0) - ab * 0.0;
            }
        }
        if self.lower_order_nums < self.solver_order {
            self.lower_order_nums += 1;
        }
    }

    /// `EulerDiscreteScheduler.step` with `s_churn = 0` (so `sigma_hat = sigma`).
    fn euler_step(&self, i: usize, model_output: &[f32], x: &mut [f32]) {
        let sigma = self.schedule.sigmas[i];
        let dt = self.schedule.sigmas[i + 1] - sigma;
        match self.prediction {
            PredictionType::Epsilon => {
                for (xv, &e) in x.iter_mut().zip(model_output) {
                    let x0 = *xv - sigma * e;
                    let derivative = (*xv - x0) / sigma;
                    *xv += derivative * dt;
                }
            }
            PredictionType::VPrediction => {
                let sq = sigma * sigma + 1.0;
                let c_out = -sigma / sq.sqrt();
                for (xv, &v) in x.iter_mut().zip(model_output) {
                    let x0 = v * c_out + *xv / sq;
                    let derivative = (*xv - x0) / sigma;
                    *xv += derivative * dt;
                }
            }
            PredictionType::Sample => {
                for (xv, &x0) in x.iter_mut().zip(model_output) {
                    let derivative = (*xv - x0) / sigma;
                    *xv += derivative * dt;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn method_names() {
        for name in ["dpm++2m", "DPMPP2M", "dpm++", " dpmpp "] {
            assert_eq!(
                name.parse::<SamplingMethod>().unwrap(),
                SamplingMethod::DpmPp2m
            );
        }
        assert_eq!(
            "Euler".parse::<SamplingMethod>().unwrap(),
            SamplingMethod::Euler
        );
        for m in SamplingMethod::ALL {
            assert_eq!(m.name().parse::<SamplingMethod>().unwrap(), m);
        }
        let err = "plms".parse::<SamplingMethod>().unwrap_err().to_string();
        assert!(
            err.contains("plms") && err.contains("dpm++2m") && err.contains("unipc"),
            "{err}"
        );
    }

    /// A stochastic sampler refuses a step without noise, a deterministic one a step with it.
    #[test]
    fn noise_is_required_exactly_where_it_is_drawn() {
        let cfg = SchedulerConfig::pixart();
        let mut a = Sampler::new(&cfg, SamplingMethod::EulerAncestral, 2, 4).unwrap();
        let mut x = [1.0f32; 4];
        assert!(matches!(
            a.step(0, &[0.0; 4], &mut x),
            Err(SamplerError::Noise { .. })
        ));
        a.step_with_noise(0, &[0.0; 4], &mut x, Some(&[0.5; 4]))
            .unwrap();
        let mut l = Sampler::new(&cfg, SamplingMethod::Lcm, 2, 4).unwrap();
        l.step_with_noise(0, &[0.0; 4], &mut x, Some(&[0.5; 4]))
            .unwrap();
        // The last LCM step draws nothing.
        assert!(l
            .step_with_noise(1, &[0.0; 4], &mut x, Some(&[0.5; 4]))
            .is_err());
        l.step(1, &[0.0; 4], &mut x).unwrap();
        let mut d = Sampler::new(&cfg, SamplingMethod::Ddim, 2, 4).unwrap();
        assert!(d
            .step_with_noise(0, &[0.0; 4], &mut x, Some(&[0.5; 4]))
            .is_err());
    }

    /// The 4-step schedules quoted in the fixtures README §3 (diffusers' values).
    #[test]
    fn readme_four_step_schedules() {
        let dpm = schedule(&SchedulerConfig::pixart(), SamplingMethod::DpmPp2m, 4).unwrap();
        assert_eq!(dpm.timesteps, [999.0, 749.0, 500.0, 250.0]);
        assert_eq!(dpm.init_noise_sigma, 1.0);
        let euler = schedule(&SchedulerConfig::pixart(), SamplingMethod::Euler, 4).unwrap();
        assert_eq!(euler.timesteps, [999.0, 666.0, 333.0, 0.0]);
        for (s, want) in [
            (&dpm, [157.4073, 17.2470, 3.4430, 0.9580, 0.0]),
            (&euler, [157.4073, 9.4889, 1.4624, 0.0100, 0.0]),
        ] {
            for (a, b) in s.sigmas.iter().zip(want) {
                assert!(
                    (a - b).abs() <= 5e-5 * b.max(1.0),
                    "{:?} vs {want:?}",
                    s.sigmas
                );
            }
        }
        assert_eq!(euler.init_noise_sigma, euler.sigmas[0]);
        let one = schedule(&SchedulerConfig::pixart(), SamplingMethod::Euler, 1).unwrap();
        assert_eq!(one.timesteps, [0.0]);
        assert!((one.init_noise_sigma - 0.01).abs() < 1e-4);
    }

    #[test]
    fn bad_requests_are_refused() {
        let cfg = SchedulerConfig::pixart();
        assert!(matches!(
            schedule(&cfg, SamplingMethod::DpmPp2m, 0),
            Err(SamplerError::BadSteps { .. })
        ));
        assert!(matches!(
            schedule(&cfg, SamplingMethod::Euler, 1001),
            Err(SamplerError::BadSteps { .. })
        ));
        let mut bad = SchedulerConfig::pixart();
        bad.beta_end = f64::INFINITY;
        assert!(matches!(
            Sampler::new(&bad, SamplingMethod::DpmPp2m, 4, 16),
            Err(SamplerError::InvalidConfig(_))
        ));
        // Betas whose cumulative product underflows give infinite sigmas.
        let mut underflow = SchedulerConfig::pixart();
        underflow.num_train_timesteps = 100_000;
        underflow.beta_start = 0.5;
        underflow.beta_end = 0.9;
        assert!(matches!(
            schedule(&underflow, SamplingMethod::DpmPp2m, 4),
            Err(SamplerError::BadSchedule { .. })
        ));

        let mut s = Sampler::new(&cfg, SamplingMethod::DpmPp2m, 4, 16).unwrap();
        let mut x = vec![0.5f32; 16];
        let e = vec![0.1f32; 16];
        assert!(matches!(
            s.step(1, &e, &mut x),
            Err(SamplerError::StepOrder { .. })
        ));
        assert!(matches!(
            s.step(0, &e[..15], &mut x),
            Err(SamplerError::Length { .. })
        ));
        s.step(0, &e, &mut x).unwrap();
        assert!(matches!(
            s.step(2, &e, &mut x),
            Err(SamplerError::StepOrder { .. })
        ));
        assert!(matches!(
            s.step(4, &e, &mut x),
            Err(SamplerError::StepOrder { .. })
        ));
        let mut out = vec![0f32; 16];
        assert!(matches!(
            s.scale_model_input(9, &x, &mut out),
            Err(SamplerError::StepOrder { .. })
        ));
    }

    /// Structural properties of every spacing (no reference values exist for leading /
    /// trailing in the fixtures): S timesteps inside the train range, decreasing, sigmas
    /// decreasing to the final value, Euler's leading ending at `steps_offset`, trailing starting
    /// at N−1.
    #[test]
    fn every_spacing_gives_a_decreasing_schedule() {
        for spacing in [
            TimestepSpacing::Linspace,
            TimestepSpacing::Leading,
            TimestepSpacing::Trailing,
        ] {
            for method in [SamplingMethod::DpmPp2m, SamplingMethod::Euler] {
                for steps in [1usize, 2, 3, 7, 20, 50, 333, 500] {
                    let mut cfg = SchedulerConfig::pixart();
                    cfg.timestep_spacing = spacing;
                    cfg.steps_offset = 1;
                    let s = schedule(&cfg, method, steps).unwrap();
                    let ctx = format!("{spacing:?} {method} {steps}");
                    assert_eq!(s.timesteps.len(), steps, "{ctx}");
                    assert_eq!(s.sigmas.len(), steps + 1, "{ctx}");
                    assert!(
                        s.timesteps.iter().all(|&t| (0.0..=999.0).contains(&t)),
                        "{ctx}"
                    );
                    assert!(
                        s.timesteps.windows(2).all(|w| w[0] > w[1]),
                        "{ctx}: {:?}",
                        s.timesteps
                    );
                    assert!(s.sigmas.windows(2).all(|w| w[0] > w[1]), "{ctx}");
                    assert_eq!(s.sigmas[steps], 0.0, "{ctx}");
                    match spacing {
                        // Euler keeps t = 0 (+ offset); DPM-Solver drops it.
                        TimestepSpacing::Leading if method == SamplingMethod::Euler => {
                            assert_eq!(s.timesteps[steps - 1], 1.0, "{ctx}")
                        }
                        TimestepSpacing::Leading => assert!(s.timesteps[steps - 1] > 1.0, "{ctx}"),
                        TimestepSpacing::Trailing => assert_eq!(s.timesteps[0], 999.0, "{ctx}"),
                        TimestepSpacing::Linspace => {}
                    }
                }
            }
        }
    }

    /// The last DPM step lands on sigma 0 and returns the data prediction exactly.
    #[test]
    fn dpm_last_step_returns_x0() {
        let cfg = SchedulerConfig::pixart();
        let mut s = Sampler::new(&cfg, SamplingMethod::DpmPp2m, 1, 3).unwrap();
        let sigma = s.sigmas()[0];
        let (alpha, sigma_t) = alpha_sigma(sigma);
        let mut x = vec![1.0f32, -2.0, 3.0];
        let eps = vec![0.5f32, 0.25, -1.0];
        let want: Vec<f32> = x
            .iter()
            .zip(&eps)
            .map(|(&x, &e)| (x - sigma_t * e) / alpha)
            .collect();
        s.step(0, &eps, &mut x).unwrap();
        assert_eq!(x, want);
    }
}
