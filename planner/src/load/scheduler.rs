//! Reads a diffusers `scheduler/scheduler_config.json` into a [`SchedulerConfig`].
//!
//! The file is parsed as JSON5 because diffusers writes non-finite floats as bare tokens
//! (`"lambda_min_clipped": -Infinity`), which strict JSON parsers refuse. Keys that do not
//! change what the runtime computes (`_diffusers_version`, `dynamic_thresholding_ratio`, …)
//! and unknown keys are ignored. A missing key takes the default of the diffusers 0.42
//! constructor (`DPMSolverMultistepScheduler.__init__` / `EulerDiscreteScheduler.__init__`,
//! which agree on every shared key). A value of the wrong type, or an option the runtime does
//! not implement (Karras sigmas, thresholding, SDE solvers, …), is an error that names the
//! file, the field and what is supported.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use edge_schema::scheduler::{
    AlgorithmType, BetaSchedule, FinalSigmasType, PredictionType, SchedulerClass, SchedulerConfig,
    SolverType, TimestepSpacing,
};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// Why a scheduler config was refused. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerLoadError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not JSON (nor JSON5), or its top level is not an object.
    #[error("{path}: not a valid JSON object: {reason}")]
    Syntax { path: String, reason: String },
    /// A field holds a value of the wrong type.
    #[error("{path}: field `{field}` must be {expected}, found {found}")]
    WrongType {
        path: String,
        field: String,
        expected: &'static str,
        found: String,
    },
    /// A field holds a value the runtime does not implement.
    #[error("{path}: field `{field}` = {found} is not supported (supported: {supported})")]
    Unsupported {
        path: String,
        field: String,
        found: String,
        supported: &'static str,
    },
    /// The values are well-typed but out of range ([`SchedulerConfig::validate`]).
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// Reads and checks `path` (a diffusers `scheduler_config.json`).
///
/// # Errors
/// [`SchedulerLoadError`] naming the file and, for bad values, the field.
pub fn load_scheduler_config(path: &Path) -> Result<SchedulerConfig, SchedulerLoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| SchedulerLoadError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_scheduler_config(&text, &path.display().to_string())
}

/// Parses the text of a `scheduler_config.json`; `origin` names it in errors.
///
/// # Errors
/// As [`load_scheduler_config`], without the I/O case.
pub fn parse_scheduler_config(
    text: &str,
    origin: &str,
) -> Result<SchedulerConfig, SchedulerLoadError> {
    let value: Json = json5::from_str(text).map_err(|e| SchedulerLoadError::Syntax {
        path: origin.to_string(),
        reason: e.to_string(),
    })?;
    let Json::Object(map) = value else {
        return Err(SchedulerLoadError::Syntax {
            path: origin.to_string(),
            reason: format!("the top level is {}, not an object", value.kind()),
        });
    };
    let fields = Fields {
        path: origin,
        map: &map,
    };
    let cfg = fields.config()?;
    cfg.validate()
        .map_err(|reason| SchedulerLoadError::Invalid {
            path: origin.to_string(),
            reason,
        })?;
    Ok(cfg)
}

/// A parsed JSON5 value. Numbers keep the form they were written in, and non-finite floats
/// (`-Infinity`, `NaN`) survive, unlike in `serde_json::Value`.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

impl Json {
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Int(_) | Json::Float(_) => "a number",
            Json::Str(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    /// A short rendering for error messages.
    fn describe(&self) -> String {
        match self {
            Json::Null => "null".to_string(),
            Json::Bool(b) => b.to_string(),
            Json::Int(i) => i.to_string(),
            Json::Float(f) => f.to_string(),
            Json::Str(s) => format!("{s:?}"),
            Json::Array(a) => format!("an array of {} values", a.len()),
            Json::Object(_) => "an object".to_string(),
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Int(i128::from(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Int(i128::from(v)))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Json, E> {
        Ok(Json::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Json, E> {
        // Beyond i128 no field can use it; keep it as a float so it is reported, not lost.
        Ok(i128::try_from(v).map_or(Json::Float(v as f64), Json::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Json>()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = BTreeMap::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            out.insert(k, v);
        }
        Ok(Json::Object(out))
    }
}

/// Typed access to the keys of one config file.
struct Fields<'a> {
    path: &'a str,
    map: &'a BTreeMap<String, Json>,
}

impl Fields<'_> {
    /// The present, non-null value of `field`.
    fn get(&self, field: &str) -> Option<&Json> {
        self.map.get(field).filter(|v| **v != Json::Null)
    }

    fn wrong_type(&self, field: &str, expected: &'static str, found: &Json) -> SchedulerLoadError {
        SchedulerLoadError::WrongType {
            path: self.path.to_string(),
            field: field.to_string(),
            expected,
            found: found.describe(),
        }
    }

    fn unsupported(
        &self,
        field: &str,
        found: String,
        supported: &'static str,
    ) -> SchedulerLoadError {
        SchedulerLoadError::Unsupported {
            path: self.path.to_string(),
            field: field.to_string(),
            found,
            supported,
        }
    }

    fn bool_or(&self, field: &str, default: bool) -> Result<bool, SchedulerLoadError> {
        match self.get(field) {
            None => Ok(default),
            Some(Json::Bool(b)) => Ok(*b),
            Some(v) => Err(self.wrong_type(field, "a boolean", v)),
        }
    }

    /// A boolean switch for a feature that is not implemented: absent, null or false.
    fn must_be_off(&self, field: &str) -> Result<(), SchedulerLoadError> {
        if self.bool_or(field, false)? {
            Err(self.unsupported(field, "true".to_string(), "false"))
        } else {
            Ok(())
        }
    }

    fn uint_or(&self, field: &str, default: u32) -> Result<u32, SchedulerLoadError> {
        const EXPECTED: &str = "a non-negative integer below 2^32";
        match self.get(field) {
            None => Ok(default),
            Some(v @ Json::Int(i)) => {
                u32::try_from(*i).map_err(|_| self.wrong_type(field, EXPECTED, v))
            }
            Some(v) => Err(self.wrong_type(field, EXPECTED, v)),
        }
    }

    fn number(&self, field: &str, v: &Json) -> Result<f64, SchedulerLoadError> {
        match v {
            Json::Float(f) => Ok(*f),
            Json::Int(i) => Ok(*i as f64),
            _ => Err(self.wrong_type(field, "a number", v)),
        }
    }

    fn number_or(&self, field: &str, default: f64) -> Result<f64, SchedulerLoadError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => self.number(field, v),
        }
    }

    /// A string option, `default` when absent or null.
    fn str_or<'s>(&'s self, field: &str, default: &'s str) -> Result<&'s str, SchedulerLoadError> {
        match self.get(field) {
            None => Ok(default),
            Some(Json::Str(s)) => Ok(s),
            Some(v) => Err(self.wrong_type(field, "a string", v)),
        }
    }

    fn config(&self) -> Result<SchedulerConfig, SchedulerLoadError> {
        let class_name = match self.get("_class_name") {
            Some(Json::Str(s)) => s.clone(),
            Some(v) => return Err(self.wrong_type("_class_name", "a string", v)),
            None => {
                return Err(SchedulerLoadError::WrongType {
                    path: self.path.to_string(),
                    field: "_class_name".to_string(),
                    expected: "a string",
                    found: "nothing (the key is missing)".to_string(),
                })
            }
        };
        let Some(class) = SchedulerClass::ALL
            .into_iter()
            .find(|c| c.diffusers_name() == class_name)
        else {
            return Err(self.unsupported(
                "_class_name",
                format!("{class_name:?}"),
                "\"DPMSolverMultistepScheduler\", \"EulerDiscreteScheduler\", \"EulerAncestralDiscreteScheduler\", \"HeunDiscreteScheduler\", \"KDPM2DiscreteScheduler\", \"DDIMScheduler\", \"LCMScheduler\", \"UniPCMultistepScheduler\"",
            ));
        };
        // What the runtime's DDIM and LCM steps assume (their classes' defaults).
        let (clip_default, lcm) = match class {
            SchedulerClass::Ddim => (true, false),
            SchedulerClass::Lcm => (false, true),
            _ => (false, false),
        };
        if matches!(class, SchedulerClass::Ddim | SchedulerClass::Lcm) {
            let clip = self.bool_or("clip_sample", clip_default)?;
            if clip != clip_default {
                return Err(self.unsupported(
                    "clip_sample",
                    clip.to_string(),
                    if clip_default { "true" } else { "false" },
                ));
            }
            if !self.bool_or("set_alpha_to_one", true)? {
                return Err(self.unsupported("set_alpha_to_one", "false".to_string(), "true"));
            }
            if self.number_or("clip_sample_range", 1.0)? != 1.0 {
                return Err(self.unsupported(
                    "clip_sample_range",
                    self.number_or("clip_sample_range", 1.0)?.to_string(),
                    "1.0",
                ));
            }
        }
        if class == SchedulerClass::UniPcMultistep {
            // The runtime implements UniPC's B(h) = expm1 (bh2; diffusers maps the DPM names
            // midpoint, heun and logrho to it), data prediction and an enabled corrector.
            let st = self.str_or("solver_type", "bh2")?;
            if !matches!(st, "bh2" | "midpoint" | "heun" | "logrho") {
                return Err(self.unsupported("solver_type", format!("{st:?}"), "\"bh2\""));
            }
            if !self.bool_or("predict_x0", true)? {
                return Err(self.unsupported("predict_x0", "false".to_string(), "true"));
            }
            if let Some(Json::Array(v)) = self.get("disable_corrector") {
                if !v.is_empty() {
                    return Err(self.unsupported(
                        "disable_corrector",
                        v.len().to_string() + " steps",
                        "[]",
                    ));
                }
            }
        }
        if lcm {
            let steps = self.uint_or("original_inference_steps", 50)?;
            if steps != 50 {
                return Err(self.unsupported("original_inference_steps", steps.to_string(), "50"));
            }
            let scaling = self.number_or("timestep_scaling", 10.0)?;
            if scaling != 10.0 {
                return Err(self.unsupported("timestep_scaling", scaling.to_string(), "10.0"));
            }
        }

        let beta_schedule = match self.str_or("beta_schedule", "linear")? {
            "linear" => BetaSchedule::Linear,
            "scaled_linear" => BetaSchedule::ScaledLinear,
            "squaredcos_cap_v2" => BetaSchedule::SquaredcosCapV2,
            other => {
                return Err(self.unsupported(
                    "beta_schedule",
                    format!("{other:?}"),
                    "\"linear\", \"scaled_linear\", \"squaredcos_cap_v2\"",
                ))
            }
        };
        let trained_betas = match self.get("trained_betas") {
            None => None,
            Some(Json::Array(values)) => Some(
                values
                    .iter()
                    .map(|v| self.number("trained_betas", v).map(|b| b as f32))
                    .collect::<Result<Vec<f32>, _>>()?,
            ),
            Some(v) => {
                return Err(self.wrong_type("trained_betas", "null or an array of numbers", v))
            }
        };
        let prediction_type = match self.str_or("prediction_type", "epsilon")? {
            "epsilon" => PredictionType::Epsilon,
            "v_prediction" => PredictionType::VPrediction,
            "sample" => PredictionType::Sample,
            other => {
                return Err(self.unsupported(
                    "prediction_type",
                    format!("{other:?}"),
                    "\"epsilon\", \"v_prediction\", \"sample\"",
                ))
            }
        };
        // diffusers maps "deis" to "dpmsolver++" in the DPM-Solver constructor.
        let algorithm_type = match self.str_or("algorithm_type", "dpmsolver++")? {
            "dpmsolver++" | "deis" => AlgorithmType::DpmSolverPlusPlus,
            other => {
                return Err(self.unsupported(
                    "algorithm_type",
                    format!("{other:?}"),
                    "\"dpmsolver++\"",
                ))
            }
        };
        // diffusers maps the DEIS / UniPC solver names to "midpoint".
        let solver_type = match self.str_or("solver_type", "midpoint")? {
            "midpoint" | "logrho" | "bh1" | "bh2" => SolverType::Midpoint,
            "heun" => SolverType::Heun,
            other => {
                return Err(self.unsupported(
                    "solver_type",
                    format!("{other:?}"),
                    "\"midpoint\", \"heun\"",
                ))
            }
        };
        let solver_order = self.uint_or("solver_order", 2)?;
        if !(1..=2).contains(&solver_order) {
            return Err(self.unsupported("solver_order", solver_order.to_string(), "1, 2"));
        }
        let final_sigmas_type = match self.str_or("final_sigmas_type", "zero")? {
            "zero" => FinalSigmasType::Zero,
            "sigma_min" => FinalSigmasType::SigmaMin,
            other => {
                return Err(self.unsupported(
                    "final_sigmas_type",
                    format!("{other:?}"),
                    "\"zero\", \"sigma_min\"",
                ))
            }
        };
        let timestep_spacing = match self.str_or("timestep_spacing", "linspace")? {
            "linspace" => TimestepSpacing::Linspace,
            "leading" => TimestepSpacing::Leading,
            "trailing" => TimestepSpacing::Trailing,
            other => {
                return Err(self.unsupported(
                    "timestep_spacing",
                    format!("{other:?}"),
                    "\"linspace\", \"leading\", \"trailing\"",
                ))
            }
        };
        if let Some(v) = self.get("variance_type") {
            return Err(self.unsupported("variance_type", v.describe(), "null"));
        }
        match self.str_or("interpolation_type", "linear")? {
            "linear" => {}
            other => {
                return Err(self.unsupported(
                    "interpolation_type",
                    format!("{other:?}"),
                    "\"linear\"",
                ))
            }
        }
        match self.str_or("timestep_type", "discrete")? {
            "discrete" => {}
            other => {
                return Err(self.unsupported("timestep_type", format!("{other:?}"), "\"discrete\""))
            }
        }
        for field in [
            "use_lu_lambdas",
            "use_exponential_sigmas",
            "use_beta_sigmas",
            "use_flow_sigmas",
            "use_dynamic_shifting",
            "rescale_betas_zero_snr",
        ] {
            self.must_be_off(field)?;
        }
        let use_karras_sigmas = self.bool_or("use_karras_sigmas", false)?;
        if use_karras_sigmas && !class.supports_karras() {
            return Err(self.unsupported(
                "use_karras_sigmas",
                "true".to_string(),
                "false (karras sigmas are implemented for DPMSolverMultistepScheduler, EulerDiscreteScheduler, HeunDiscreteScheduler and KDPM2DiscreteScheduler)",
            ));
        }
        let thresholding = self.bool_or("thresholding", false)?;
        if thresholding {
            return Err(self.unsupported("thresholding", "true".to_string(), "false"));
        }
        let lambda_min_clipped = self.number_or("lambda_min_clipped", f64::NEG_INFINITY)?;
        if lambda_min_clipped.is_nan() {
            return Err(self.unsupported(
                "lambda_min_clipped",
                "NaN".to_string(),
                "a number or -Infinity",
            ));
        }

        Ok(SchedulerConfig {
            class,
            class_name,
            num_train_timesteps: self.uint_or("num_train_timesteps", 1000)?,
            beta_start: self.number_or("beta_start", 0.0001)?,
            beta_end: self.number_or("beta_end", 0.02)?,
            beta_schedule,
            trained_betas,
            prediction_type,
            algorithm_type,
            solver_order,
            solver_type,
            lower_order_final: self.bool_or("lower_order_final", true)?,
            euler_at_final: self.bool_or("euler_at_final", false)?,
            final_sigmas_type,
            timestep_spacing,
            steps_offset: self.uint_or("steps_offset", 0)?,
            use_karras_sigmas,
            thresholding,
            lambda_min_clipped,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The published PixArt settings (fixtures README §4, demo README §2).
    fn assert_pixart(cfg: &SchedulerConfig) {
        assert_eq!(cfg, &SchedulerConfig::pixart());
    }

    #[test]
    fn loads_the_published_configs() {
        for dir in [
            "tests/fixtures/pixart-sigma-tiny",
            "tests/fixtures/pixart-alpha-tiny",
            "demo/pixart-shapes-64",
        ] {
            let path = repo().join(dir).join("scheduler/scheduler_config.json");
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains("-Infinity"),
                "{dir}: the fixture should exercise -Infinity"
            );
            assert!(serde_json::from_str::<serde_json::Value>(&text).is_err());
            let cfg = load_scheduler_config(&path).unwrap_or_else(|e| panic!("{dir}: {e}"));
            assert_pixart(&cfg);
        }
    }

    fn published() -> String {
        let path = repo().join("tests/fixtures/pixart-sigma-tiny/scheduler/scheduler_config.json");
        std::fs::read_to_string(path).unwrap()
    }

    /// Replaces the value of `key` in the published file's text.
    fn with(key: &str, value: &str) -> String {
        let text = published();
        let start = text.find(&format!("\"{key}\":")).expect(key);
        let end = start + text[start..].find('\n').unwrap();
        let comma = if text[start..end].ends_with(',') {
            ","
        } else {
            ""
        };
        format!(
            "{}\"{key}\": {value}{comma}{}",
            &text[..start],
            &text[end..]
        )
    }

    fn error_of(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scheduler_config.json");
        std::fs::write(&path, text).unwrap();
        match load_scheduler_config(&path) {
            Ok(cfg) => panic!("accepted {cfg:?}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("scheduler_config.json"),
                    "{msg} does not name the file"
                );
                msg
            }
        }
    }

    #[test]
    fn malformed_files_are_refused_naming_the_field() {
        let cases = [
            ("num_train_timesteps", "\"1000\""),
            ("num_train_timesteps", "-5"),
            ("num_train_timesteps", "0"),
            ("beta_start", "\"0.0001\""),
            ("beta_end", "NaN"),
            ("beta_schedule", "\"sqrt_linear\""),
            ("prediction_type", "\"flow\""),
            ("algorithm_type", "\"sde-dpmsolver++\""),
            ("solver_order", "3"),
            ("solver_type", "\"euler\""),
            ("lower_order_final", "1"),
            ("final_sigmas_type", "\"sigma_max\""),
            ("timestep_spacing", "\"uniform\""),
            ("thresholding", "true"),
            ("use_flow_sigmas", "true"),
            ("rescale_betas_zero_snr", "true"),
            ("trained_betas", "[0.1, \"x\"]"),
            ("trained_betas", "[0.1, 0.2]"),
            ("lambda_min_clipped", "\"-inf\""),
            ("variance_type", "\"learned_range\""),
            ("steps_offset", "1.5"),
        ];
        for (field, value) in cases {
            let msg = error_of(&with(field, value));
            assert!(
                msg.contains(field),
                "{field} = {value}: {msg} does not name the field"
            );
        }
        let msg = error_of(&with("_class_name", "\"PNDMScheduler\""));
        assert!(
            msg.contains("_class_name") && msg.contains("EulerDiscreteScheduler"),
            "{msg}"
        );
        let msg = error_of("{ \"_class_name\": ");
        assert!(msg.contains("not a valid JSON object"), "{msg}");
        let msg = error_of("[1, 2]");
        assert!(msg.contains("not an object"), "{msg}");
    }

    #[test]
    fn defaults_and_extras() {
        // Missing keys take diffusers' defaults; unknown keys are ignored.
        let text = "{\"_class_name\": \"EulerDiscreteScheduler\", \"something_new\": [1, {\"a\": null}],
                     \"timestep_spacing\": \"leading\", \"steps_offset\": 1,
                     \"beta_schedule\": \"scaled_linear\", \"beta_start\": 0.00085, \"beta_end\": 0.012}";
        let cfg = parse_scheduler_config(text, "inline").unwrap();
        assert_eq!(cfg.class, SchedulerClass::EulerDiscrete);
        assert_eq!(cfg.timestep_spacing, TimestepSpacing::Leading);
        assert_eq!(cfg.steps_offset, 1);
        assert_eq!(cfg.beta_schedule, BetaSchedule::ScaledLinear);
        assert_eq!(cfg.beta_start, 0.00085);
        assert_eq!(cfg.num_train_timesteps, 1000);
        assert_eq!(cfg.solver_order, 2);
        assert_eq!(cfg.lambda_min_clipped, f64::NEG_INFINITY);
        let with_betas = with(
            "trained_betas",
            &format!("[{}]", vec!["0.01"; 1000].join(", ")),
        );
        let cfg = parse_scheduler_config(&with_betas, "inline").unwrap();
        assert_eq!(cfg.trained_betas.as_deref(), Some(&[0.01f32; 1000][..]));
        let clipped = with("lambda_min_clipped", "-5.1");
        assert_eq!(
            parse_scheduler_config(&clipped, "inline")
                .unwrap()
                .lambda_min_clipped,
            -5.1
        );
    }
}
