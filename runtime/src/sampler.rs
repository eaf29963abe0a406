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
    BetaSchedule, FinalSigmasType, PredictionType, SchedulerConfig, SolverType, TimestepSpacing,
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
    #[error("{steps} inference steps requested (--steps); expected 1..={max} (the scheduler's num_train_timesteps)")]
    BadSteps { steps: usize, max: u32 },
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
    /// Steps must run in order 0, 1, 2, … (a multistep solver keeps history); 0 restarts.
    #[error(
        "step {found} called out of order: expected step {expected} of {steps} (or 0 to restart)"
    )]
    StepOrder {
        found: usize,
        expected: usize,
        steps: usize,
    },
}

/// The sampling algorithm the runtime runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplingMethod {
    /// DPM-Solver++ multistep (2M with PixArt's `solver_order = 2`), `DPMSolverMultistepScheduler`.
    DpmPp2m,
    /// Euler, `EulerDiscreteScheduler.from_config(config)`.
    Euler,
}

impl SamplingMethod {
    /// The names [`FromStr`] accepts (case-insensitive).
    pub const ACCEPTED: [&'static str; 5] = ["dpm++2m", "dpmpp2m", "dpm++", "dpmpp", "euler"];

    /// The canonical name.
    pub const fn name(self) -> &'static str {
        match self {
            SamplingMethod::DpmPp2m => "dpm++2m",
            SamplingMethod::Euler => "euler",
        }
    }

    /// The name AUTOMATIC1111's web UI (and its PNG `parameters`) gives the sampler.
    pub const fn a1111_name(self) -> &'static str {
        match self {
            SamplingMethod::DpmPp2m => "DPM++ 2M",
            SamplingMethod::Euler => "Euler",
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
        return Err(SamplerError::BadSteps { steps, max: n });
    }
    let tables = train_tables(cfg);
    let sigma_last = match cfg.final_sigmas_type {
        FinalSigmasType::Zero => 0.0,
        FinalSigmasType::SigmaMin => tables.sigmas[0],
    };
    let sched = match method {
        SamplingMethod::DpmPp2m => dpm_schedule(cfg, &tables, steps, sigma_last),
        SamplingMethod::Euler => euler_schedule(cfg, &tables, steps, sigma_last),
    };
    check_schedule(&sched)?;
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
    }
}

fn euler_schedule(
    cfg: &SchedulerConfig,
    tables: &TrainTables,
    steps: usize,
    sigma_last: f32,
) -> Schedule {
    let n = cfg.num_train_timesteps;
    let timesteps: Vec<f32> = match cfg.timestep_spacing {
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
    };
    let mut sigmas: Vec<f32> = timesteps
        .iter()
        .map(|&t| np_interp(f64::from(t), &tables.sigmas) as f32)
        .collect();
    sigmas.push(sigma_last);
    let max_sigma = sigmas.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let init_noise_sigma = match cfg.timestep_spacing {
        TimestepSpacing::Linspace | TimestepSpacing::Trailing => max_sigma,
        TimestepSpacing::Leading => (max_sigma * max_sigma + 1.0).sqrt(),
    };
    Schedule {
        timesteps,
        sigmas,
        init_noise_sigma,
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
        let final_zero = i == steps && sigma == 0.0;
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
        let history = match method {
            SamplingMethod::DpmPp2m => latent_len,
            SamplingMethod::Euler => 0,
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
            x0: vec![0.0; history],
            x0_prev: vec![0.0; history],
            lower_order_nums: 0,
            next_step: 0,
        })
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

    /// The denoiser input for step `step_index`: identity for DPM-Solver, `x / sqrt(σ² + 1)`
    /// for Euler. `latents` and `out` are `[latent_len]`.
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
        match self.method {
            SamplingMethod::DpmPp2m => out.copy_from_slice(latents),
            SamplingMethod::Euler => {
                let sigma = self.schedule.sigmas[step_index];
                let denom = (sigma * sigma + 1.0).sqrt();
                for (o, &x) in out.iter_mut().zip(latents) {
                    *o = x / denom;
                }
            }
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
        self.check_index(step_index)?;
        if step_index != self.next_step && step_index != 0 {
            return Err(SamplerError::StepOrder {
                found: step_index,
                expected: self.next_step,
                steps: self.steps(),
            });
        }
        self.check("model_output", model_output.len())?;
        self.check("latents", latents.len())?;
        if step_index == 0 {
            self.lower_order_nums = 0;
        }
        match self.method {
            SamplingMethod::DpmPp2m => self.dpm_step(step_index, model_output, latents),
            SamplingMethod::Euler => self.euler_step(step_index, model_output, latents),
        }
        self.next_step = step_index + 1;
        Ok(())
    }

    /// `DPMSolverMultistepScheduler.step` for `dpmsolver++` (no noise, no thresholding).
    fn dpm_step(&mut self, i: usize, model_output: &[f32], x: &mut [f32]) {
        let sigmas = &self.schedule.sigmas;
        let (alpha_s0, sigma_s0) = alpha_sigma(sigmas[i]);
        // convert_model_output: the data prediction x0.
        match self.prediction {
            PredictionType::Epsilon => {
                for ((d, &xv), &e) in self.x0.iter_mut().zip(x.iter()).zip(model_output) {
                    *d = (xv - sigma_s0 * e) / alpha_s0;
                }
            }
            PredictionType::VPrediction => {
                for ((d, &xv), &v) in self.x0.iter_mut().zip(x.iter()).zip(model_output) {
                    *d = alpha_s0 * xv - sigma_s0 * v;
                }
            }
            PredictionType::Sample => self.x0.copy_from_slice(model_output),
        }

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
        let err = "ddim".parse::<SamplingMethod>().unwrap_err().to_string();
        assert!(
            err.contains("ddim") && err.contains("dpm++2m") && err.contains("euler"),
            "{err}"
        );
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
