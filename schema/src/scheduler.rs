//! The noise-scheduler configuration that travels in a plan.
//!
//! [`SchedulerConfig`] holds the fields of a diffusers `scheduler_config.json`
//! (`DPMSolverMultistepScheduler` / `EulerDiscreteScheduler`, diffusers 0.42) that change the
//! numbers a sampler produces. The planner reads the JSON (`edge_planner::load::scheduler`);
//! the runtime builds its sampler from this struct (`edge_runtime::sampler`). Options that the
//! runtime does not implement have no representation here (a config using them is refused
//! when it is loaded), except `thresholding`, kept so that a plan can say explicitly that it is
//! off ([`SchedulerConfig::validate`] refuses it on), and `use_karras_sigmas`, which is
//! implemented for DPM-Solver++ only.
//!
//! The types are postcard-friendly: plain structs and unit enums, no untagged enums and no
//! free-form JSON values.

use serde::{Deserialize, Serialize};

/// Largest `num_train_timesteps` a plan may carry. Real models use 1000; the bound only keeps
/// a hostile plan from making the runtime allocate per-timestep tables of absurd size.
pub const MAX_TRAIN_TIMESTEPS: u32 = 100_000;

/// Longest `class_name` a plan may carry, in bytes.
pub const MAX_CLASS_NAME_LEN: usize = 256;

/// The diffusers scheduler class that wrote the config (`_class_name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SchedulerClass {
    /// `DPMSolverMultistepScheduler`.
    DpmSolverMultistep,
    /// `EulerDiscreteScheduler`.
    EulerDiscrete,
    /// `EulerAncestralDiscreteScheduler`.
    EulerAncestralDiscrete,
    /// `HeunDiscreteScheduler`.
    HeunDiscrete,
    /// `KDPM2DiscreteScheduler`.
    KDpm2Discrete,
    /// `DDIMScheduler` (eta 0, `clip_sample`, `set_alpha_to_one`).
    Ddim,
    /// `LCMScheduler` (PixArt-LCM: 50 original steps, timestep scaling 10).
    Lcm,
    /// `UniPCMultistepScheduler` (bh2, predict_x0).
    UniPcMultistep,
}

impl SchedulerClass {
    /// Whether this runtime implements `use_karras_sigmas` for the class (diffusers 0.42 has
    /// it also for UniPC; Euler ancestral, DDIM and LCM have none).
    pub const fn supports_karras(self) -> bool {
        matches!(
            self,
            SchedulerClass::DpmSolverMultistep
                | SchedulerClass::EulerDiscrete
                | SchedulerClass::HeunDiscrete
                | SchedulerClass::KDpm2Discrete
        )
    }

    /// The diffusers class name.
    pub const fn diffusers_name(self) -> &'static str {
        match self {
            SchedulerClass::DpmSolverMultistep => "DPMSolverMultistepScheduler",
            SchedulerClass::EulerDiscrete => "EulerDiscreteScheduler",
            SchedulerClass::EulerAncestralDiscrete => "EulerAncestralDiscreteScheduler",
            SchedulerClass::HeunDiscrete => "HeunDiscreteScheduler",
            SchedulerClass::KDpm2Discrete => "KDPM2DiscreteScheduler",
            SchedulerClass::Ddim => "DDIMScheduler",
            SchedulerClass::Lcm => "LCMScheduler",
            SchedulerClass::UniPcMultistep => "UniPCMultistepScheduler",
        }
    }

    /// Every class a plan may name.
    pub const ALL: [SchedulerClass; 8] = [
        SchedulerClass::DpmSolverMultistep,
        SchedulerClass::EulerDiscrete,
        SchedulerClass::EulerAncestralDiscrete,
        SchedulerClass::HeunDiscrete,
        SchedulerClass::KDpm2Discrete,
        SchedulerClass::Ddim,
        SchedulerClass::Lcm,
        SchedulerClass::UniPcMultistep,
    ];
}

/// How the training betas are laid out over the train timesteps (`beta_schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BetaSchedule {
    /// `"linear"`: `torch.linspace(beta_start, beta_end, N, float32)`.
    Linear,
    /// `"scaled_linear"`: `torch.linspace(sqrt(beta_start), sqrt(beta_end), N, float32) ** 2`.
    ScaledLinear,
    /// `"squaredcos_cap_v2"`: the Glide cosine schedule (`betas_for_alpha_bar`, max beta 0.999).
    SquaredcosCapV2,
}

/// What the denoiser predicts (`prediction_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PredictionType {
    /// `"epsilon"`: the added noise.
    Epsilon,
    /// `"v_prediction"`: `v = alpha_t·eps − sigma_t·x0`.
    VPrediction,
    /// `"sample"`: the clean sample `x0`.
    Sample,
}

/// DPM-Solver variant (`algorithm_type`). Only the deterministic data-prediction solver is
/// implemented.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AlgorithmType {
    /// `"dpmsolver++"`.
    DpmSolverPlusPlus,
}

/// Second-order update rule of DPM-Solver (`solver_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SolverType {
    /// `"midpoint"`.
    Midpoint,
    /// `"heun"`.
    Heun,
}

/// The sigma appended after the last inference timestep (`final_sigmas_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FinalSigmasType {
    /// `"zero"`: the last step lands on sigma 0 (the clean sample).
    Zero,
    /// `"sigma_min"`: the last step lands on the train sigma at t = 0.
    SigmaMin,
}

/// How the inference timesteps are spread over the train timesteps (`timestep_spacing`,
/// Table 2 of arXiv:2305.08891).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimestepSpacing {
    /// `"linspace"`.
    Linspace,
    /// `"leading"` (adds `steps_offset`).
    Leading,
    /// `"trailing"`.
    Trailing,
}

/// The scheduler configuration a plan carries; field names and meanings are diffusers'.
///
/// Values are kept in the precision diffusers reads them with (Python floats are f64;
/// `trained_betas` become a float32 tensor), so that the runtime can rebuild the float32
/// tables bit for bit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    /// The scheduler class as an enum.
    pub class: SchedulerClass,
    /// `_class_name` exactly as the file wrote it (for messages).
    pub class_name: String,
    /// `num_train_timesteps` (N): length of the training noise schedule.
    pub num_train_timesteps: u32,
    /// `beta_start` (the first training beta).
    pub beta_start: f64,
    /// `beta_end` (the last training beta).
    pub beta_end: f64,
    /// `beta_schedule` (ignored when `trained_betas` is set).
    pub beta_schedule: BetaSchedule,
    /// `trained_betas`: explicit betas, `[N]`, overriding `beta_schedule` when present.
    pub trained_betas: Option<Vec<f32>>,
    /// `prediction_type`.
    pub prediction_type: PredictionType,
    /// `algorithm_type` (DPM-Solver only).
    pub algorithm_type: AlgorithmType,
    /// `solver_order` (DPM-Solver only): 1 or 2.
    pub solver_order: u32,
    /// `solver_type` (DPM-Solver only).
    pub solver_type: SolverType,
    /// `lower_order_final` (DPM-Solver): first order on the last step when fewer than 15 steps.
    pub lower_order_final: bool,
    /// `euler_at_final` (DPM-Solver): always first order on the last step.
    pub euler_at_final: bool,
    /// `final_sigmas_type`.
    pub final_sigmas_type: FinalSigmasType,
    /// `timestep_spacing`.
    pub timestep_spacing: TimestepSpacing,
    /// `steps_offset`: added to the timesteps with `Leading` spacing.
    pub steps_offset: u32,
    /// `use_karras_sigmas`: the Karras et al. (2022) sigmas, `ρ = 7` (DPM-Solver++, Euler,
    /// Heun, KDPM2: [`SchedulerClass::supports_karras`]).
    pub use_karras_sigmas: bool,
    /// `thresholding`: must be false (dynamic thresholding is not implemented).
    pub thresholding: bool,
    /// `lambda_min_clipped` (DPM-Solver): timesteps whose log-SNR `lambda(t)` is below this are
    /// not used. `-inf` (the default, and PixArt's value) clips nothing. Never NaN.
    pub lambda_min_clipped: f64,
}

impl SchedulerConfig {
    /// The scheduler PixArt-α and PixArt-Σ pipelines publish in
    /// `scheduler/scheduler_config.json` (diffusers `DPMSolverMultistepScheduler`: 1000 linear
    /// betas from 1e-4 to 0.02, DPM-Solver++ 2M, midpoint, ε-prediction, linspace spacing,
    /// `lower_order_final`, final sigma zero). The planner reads the file a model ships; this is
    /// for tools and tests that need the config without a model folder.
    pub fn pixart() -> Self {
        Self {
            class: SchedulerClass::DpmSolverMultistep,
            class_name: "DPMSolverMultistepScheduler".to_string(),
            num_train_timesteps: 1000,
            beta_start: 0.0001,
            beta_end: 0.02,
            beta_schedule: BetaSchedule::Linear,
            trained_betas: None,
            prediction_type: PredictionType::Epsilon,
            algorithm_type: AlgorithmType::DpmSolverPlusPlus,
            solver_order: 2,
            solver_type: SolverType::Midpoint,
            lower_order_final: true,
            euler_at_final: false,
            final_sigmas_type: FinalSigmasType::Zero,
            timestep_spacing: TimestepSpacing::Linspace,
            steps_offset: 0,
            use_karras_sigmas: false,
            thresholding: false,
            lambda_min_clipped: f64::NEG_INFINITY,
        }
    }

    /// Checks a config that came from an untrusted plan: counts in range, betas finite and in
    /// (0, 1), unsupported switches off, `lambda_min_clipped` not NaN.
    ///
    /// # Errors
    /// A message naming the field and what was expected.
    pub fn validate(&self) -> Result<(), String> {
        if self.class_name.len() > MAX_CLASS_NAME_LEN {
            return Err(format!(
                "scheduler class_name is {} bytes long (at most {MAX_CLASS_NAME_LEN})",
                self.class_name.len()
            ));
        }
        let n = self.num_train_timesteps;
        if n == 0 || n > MAX_TRAIN_TIMESTEPS {
            return Err(format!(
                "scheduler num_train_timesteps = {n} (expected 1..={MAX_TRAIN_TIMESTEPS})"
            ));
        }
        check_beta("beta_start", self.beta_start)?;
        check_beta("beta_end", self.beta_end)?;
        if let Some(betas) = &self.trained_betas {
            if betas.len() != n as usize {
                return Err(format!(
                    "scheduler trained_betas has {} values but num_train_timesteps = {n}",
                    betas.len()
                ));
            }
            if let Some((i, b)) = betas
                .iter()
                .enumerate()
                .find(|(_, b)| !(b.is_finite() && **b > 0.0 && **b < 1.0))
            {
                return Err(format!(
                    "scheduler trained_betas[{i}] = {b} (expected a finite value in (0, 1))"
                ));
            }
        }
        if !(1..=2).contains(&self.solver_order) {
            return Err(format!(
                "scheduler solver_order = {} (supported: 1, 2)",
                self.solver_order
            ));
        }
        if self.steps_offset > n {
            return Err(format!(
                "scheduler steps_offset = {} exceeds num_train_timesteps = {n}",
                self.steps_offset
            ));
        }
        if self.use_karras_sigmas && !self.class.supports_karras() {
            return Err(format!(
                "scheduler use_karras_sigmas = true is supported with DPMSolverMultistepScheduler, EulerDiscreteScheduler, HeunDiscreteScheduler and KDPM2DiscreteScheduler, not {}",
                self.class.diffusers_name()
            ));
        }
        if self.thresholding {
            return Err("scheduler thresholding = true is not supported".to_string());
        }
        if self.lambda_min_clipped.is_nan() {
            return Err("scheduler lambda_min_clipped is NaN".to_string());
        }
        Ok(())
    }
}

fn check_beta(field: &str, value: f64) -> Result<(), String> {
    if value.is_finite() && value > 0.0 && value < 1.0 {
        Ok(())
    } else {
        Err(format!(
            "scheduler {field} = {value} (expected a finite value in (0, 1))"
        ))
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn pixart_config_is_valid_and_roundtrips_through_postcard() {
        let cfg = SchedulerConfig::pixart();
        assert_eq!(cfg.validate(), Ok(()));
        let bytes = postcard::to_allocvec(&cfg).expect("encode");
        let back: SchedulerConfig = postcard::from_bytes(&bytes).expect("decode");
        assert_eq!(back, cfg);
        assert!(back.lambda_min_clipped.is_infinite());
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        type Mutation = Box<dyn Fn(&mut SchedulerConfig)>;
        let cases: Vec<(&str, Mutation)> = vec![
            (
                "num_train_timesteps",
                Box::new(|c| c.num_train_timesteps = 0),
            ),
            (
                "num_train_timesteps",
                Box::new(|c| c.num_train_timesteps = MAX_TRAIN_TIMESTEPS + 1),
            ),
            ("beta_start", Box::new(|c| c.beta_start = f64::NAN)),
            ("beta_end", Box::new(|c| c.beta_end = 1.0)),
            ("beta_start", Box::new(|c| c.beta_start = -0.1)),
            (
                "trained_betas",
                Box::new(|c| c.trained_betas = Some(vec![0.01; 3])),
            ),
            (
                "trained_betas[7]",
                Box::new(|c| {
                    let mut b = vec![0.01f32; 1000];
                    b[7] = f32::INFINITY;
                    c.trained_betas = Some(b);
                }),
            ),
            ("solver_order", Box::new(|c| c.solver_order = 3)),
            ("solver_order", Box::new(|c| c.solver_order = 0)),
            ("steps_offset", Box::new(|c| c.steps_offset = 5000)),
            (
                "use_karras_sigmas",
                Box::new(|c| {
                    c.class = SchedulerClass::EulerAncestralDiscrete;
                    c.use_karras_sigmas = true;
                }),
            ),
            ("thresholding", Box::new(|c| c.thresholding = true)),
            (
                "lambda_min_clipped",
                Box::new(|c| c.lambda_min_clipped = f64::NAN),
            ),
            ("class_name", Box::new(|c| c.class_name = "x".repeat(1000))),
        ];
        for (field, mutate) in cases {
            let mut cfg = SchedulerConfig::pixart();
            mutate(&mut cfg);
            let err = cfg.validate().expect_err(field);
            assert!(err.contains(field), "error {err:?} does not name {field}");
        }
    }

    #[test]
    fn finite_lambda_min_clipped_is_accepted() {
        let mut cfg = SchedulerConfig::pixart();
        cfg.lambda_min_clipped = -5.1;
        assert_eq!(cfg.validate(), Ok(()));
    }
}
