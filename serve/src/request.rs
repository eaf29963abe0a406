//! Request bodies of the image endpoints, parsed into one [`JobSpec`]: the OpenAI images API
//! (`POST /v1/images/generations`) and AUTOMATIC1111's `POST /sdapi/v1/txt2img`.
//!
//! Bodies are JSON objects. Fields this server does not know are ignored (clients of both
//! APIs send many defaults); a known field with a wrong type or value is refused with a
//! [`RequestError`] naming the field and what was expected. `null` counts as absent. Nothing
//! of a request reaches the filesystem.

use edge_runtime::rng::NoiseRng;
use edge_runtime::sampler::SamplingMethod;
use serde_json::{Map, Value};

/// The most characters a prompt (or negative prompt) may have. The plan's tokenizer cuts
/// the tokens to its maximum sequence length anyway; this only bounds the work of reading it.
pub const MAX_PROMPT_CHARS: usize = 16_384;

/// What a request may ask for: the plan's sizes and the server's bounds.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The plan's image sizes (width, height) in pixels.
    pub sizes: Vec<(u32, u32)>,
    /// The most sampler steps one image may take.
    pub max_steps: usize,
    /// The most images one request may ask for (`n`; `batch_size · n_iter`).
    pub max_images: usize,
    /// The sampler of a request that names none (the plan's scheduler class).
    pub default_method: SamplingMethod,
    /// Whether the plan's scheduler config asks for karras sigmas.
    pub plan_karras: bool,
}

impl Limits {
    /// The sizes as `WxH, WxH`.
    pub fn sizes_text(&self) -> String {
        self.sizes
            .iter()
            .map(|(w, h)| format!("{w}x{h}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One request's work: `count` images with seeds `seed, seed + 1, …`.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    pub prompt: String,
    pub negative_prompt: String,
    /// Sampler steps per image (1 ..= [`Limits::max_steps`]).
    pub steps: usize,
    /// Classifier-free guidance scale (finite, 0 ..= 100; ≤ 1 runs the prompt alone).
    pub cfg_scale: f32,
    pub method: SamplingMethod,
    /// Seed of the first image; `None`: a random one, chosen when the job runs.
    pub seed: Option<u64>,
    /// The generator the seeds feed (field `rng`: `torch-cpu` (default), `cpu`,
    /// `torch-cpu-default`, `edge`).
    pub rng: NoiseRng,
    /// Field `scheduler`: `Karras` (`Some(true)`), `discrete` (`Some(false)`), `Automatic` or
    /// absent: the plan's config (`None`).
    pub karras: Option<bool>,
    /// Image width in pixels (one of the plan's sizes).
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// Images (1 ..= [`Limits::max_images`]).
    pub count: usize,
}

/// A refused request: the field (when one is to blame) and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// The JSON field, e.g. `steps`; `None` for the body as a whole.
    pub field: Option<&'static str>,
    pub message: String,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn err(field: &'static str, message: String) -> RequestError {
    RequestError {
        field: Some(field),
        message,
    }
}

/// Default sampler steps, as `edgerun generate`.
pub const DEFAULT_STEPS: usize = 20;
/// Default guidance scale, as `edgerun generate` (PixArt's pipelines use 4.5).
pub const DEFAULT_CFG_SCALE: f32 = 4.5;

/// The samplers in AUTOMATIC1111's spelling with their aliases, as `GET /sdapi/v1/samplers`
/// lists them.
pub const SAMPLERS: [(&str, SamplingMethod, &[&str]); 8] = [
    (
        "DPM++ 2M",
        SamplingMethod::DpmPp2m,
        &["k_dpmpp_2m", "dpm++2m"],
    ),
    ("Euler", SamplingMethod::Euler, &["k_euler", "euler"]),
    (
        "Euler a",
        SamplingMethod::EulerAncestral,
        &["k_euler_a", "euler_a"],
    ),
    ("Heun", SamplingMethod::Heun, &["k_heun", "heun"]),
    ("DPM2", SamplingMethod::Dpm2, &["k_dpm_2", "dpm2"]),
    ("DDIM", SamplingMethod::Ddim, &["ddim"]),
    ("LCM", SamplingMethod::Lcm, &["lcm"]),
    ("UniPC", SamplingMethod::UniPc, &["unipc"]),
];

/// A sampler named in A1111 spelling (`DPM++ 2M`, `Euler`), by an A1111 alias (`k_euler`) or
/// by `edgerun`'s name (`dpm++2m`), case-insensitively.
pub fn parse_sampler(field: &'static str, name: &str) -> Result<SamplingMethod, RequestError> {
    let n = name.trim();
    for (a1111, m, aliases) in SAMPLERS {
        if n.eq_ignore_ascii_case(a1111) || aliases.iter().any(|a| n.eq_ignore_ascii_case(a)) {
            return Ok(m);
        }
    }
    Err(err(
        field,
        format!(
            "{field}: unknown sampler {name:?}; this server has {}",
            SAMPLERS
                .iter()
                .map(|(a, _, al)| format!("{a:?} (or {})", al.join(", ")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, RequestError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| RequestError {
        field: None,
        message: format!("the body is not valid JSON ({e}); expected a JSON object"),
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(RequestError {
            field: None,
            message: format!(
                "the body is {} (JSON), expected a JSON object",
                kind(&other)
            ),
        }),
    }
}

/// What a JSON value is, with its article ("an array").
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Field `name` of `m`; `null` counts as absent.
fn get<'a>(m: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    m.get(name).filter(|v| !v.is_null())
}

fn string(m: &Map<String, Value>, name: &'static str) -> Result<Option<String>, RequestError> {
    match get(m, name) {
        None => Ok(None),
        Some(Value::String(s)) if s.chars().count() > MAX_PROMPT_CHARS => Err(err(
            name,
            format!(
                "{name}: {} characters, at most {MAX_PROMPT_CHARS} are accepted",
                s.chars().count()
            ),
        )),
        Some(Value::String(s)) => match s
            .chars()
            .enumerate()
            .find(|(_, c)| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        {
            // A NUL would end the PNG text chunk early and hide the fields after it.
            Some((i, c)) => Err(err(
                name,
                format!(
                    "{name}: holds the control character U+{:04X} at character {i}; only tab, newline and carriage return are accepted",
                    c as u32
                ),
            )),
            None => Ok(Some(s.clone())),
        },
        Some(v) => Err(err(
            name,
            format!("{name}: expected a string, got {}", kind(v)),
        )),
    }
}

/// A whole number in `lo ..= hi`.
fn integer(
    m: &Map<String, Value>,
    name: &'static str,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, RequestError> {
    let Some(v) = get(m, name) else {
        return Ok(None);
    };
    let n = match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                .map(|f| f as i64)
        }),
        _ => None,
    };
    match n {
        Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
        Some(n) => Err(err(
            name,
            format!("{name}: {n} is out of range; expected a whole number from {lo} to {hi}"),
        )),
        None => Err(err(
            name,
            format!(
                "{name}: expected a whole number from {lo} to {hi}, got {}",
                short(v)
            ),
        )),
    }
}

/// A finite number in `lo ..= hi`.
fn number(
    m: &Map<String, Value>,
    name: &'static str,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, RequestError> {
    let Some(v) = get(m, name) else {
        return Ok(None);
    };
    match v.as_f64() {
        Some(f) if (lo..=hi).contains(&f) => Ok(Some(f)),
        _ => Err(err(
            name,
            format!(
                "{name}: expected a number from {lo} to {hi}, got {}",
                short(v)
            ),
        )),
    }
}

/// A value as it appears in a message: short, on one line.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

/// A seed: a whole number from 0 to 2^64 − 1, or −1 (random).
fn seed(m: &Map<String, Value>, name: &'static str) -> Result<Option<u64>, RequestError> {
    let Some(v) = get(m, name) else {
        return Ok(None);
    };
    if let Some(n) = v.as_u64() {
        return Ok(Some(n));
    }
    if v.as_i64() == Some(-1) || v.as_f64() == Some(-1.0) {
        return Ok(None);
    }
    // A whole number written as a float (`1e16`), below 2^64.
    if let Some(f) = v
        .as_f64()
        .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 18_446_744_073_709_551_616.0)
    {
        return Ok(Some(f as u64));
    }
    Err(err(
        name,
        format!(
            "{name}: expected a whole number from 0 to 18446744073709551615, or -1 for a random seed, got {}",
            short(v)
        ),
    ))
}

/// `(width, height)` checked against the plan's sizes.
fn check_size(
    field: &'static str,
    w: u32,
    h: u32,
    lim: &Limits,
) -> Result<(u32, u32), RequestError> {
    if lim.sizes.contains(&(w, h)) {
        Ok((w, h))
    } else {
        Err(err(
            field,
            format!(
                "{field}: the plan has no size {w}x{h} (WxH); it holds {}",
                lim.sizes_text()
            ),
        ))
    }
}

/// The plan's only size, or an error asking for one.
fn only_size(field: &'static str, lim: &Limits) -> Result<(u32, u32), RequestError> {
    match lim.sizes.as_slice() {
        [only] => Ok(*only),
        _ => Err(err(
            field,
            format!(
                "{field}: give the image size; the plan holds {}",
                lim.sizes_text()
            ),
        )),
    }
}

/// The fields both APIs share under the same names.
struct Common {
    negative_prompt: String,
    steps: usize,
    cfg_scale: f32,
    seed: Option<u64>,
    rng: NoiseRng,
    karras: Option<bool>,
}

fn common(m: &Map<String, Value>, lim: &Limits) -> Result<Common, RequestError> {
    Ok(Common {
        negative_prompt: string(m, "negative_prompt")?.unwrap_or_default(),
        steps: integer(m, "steps", 1, lim.max_steps as i64)?
            .map_or(DEFAULT_STEPS.min(lim.max_steps), |v| v as usize),
        // `+ 0.0` turns −0 into 0, so the infotext never says `CFG scale: -0`.
        cfg_scale: number(m, "cfg_scale", 0.0, 100.0)?
            .map_or(DEFAULT_CFG_SCALE, |v| v as f32 + 0.0),
        seed: seed(m, "seed")?,
        rng: match string(m, "rng")? {
            Some(r) => r.parse().map_err(|e| err("rng", format!("rng: {e}")))?,
            None => NoiseRng::default(),
        },
        karras: match string(m, "scheduler")?.map(|s| s.trim().to_ascii_lowercase()) {
            None => None,
            Some(s) if s == "automatic" => None,
            Some(s) if s == "karras" => Some(true),
            Some(s) if s == "discrete" || s == "uniform" => Some(false),
            Some(s) => {
                return Err(err(
                    "scheduler",
                    format!("scheduler: {s:?} is not served; this server has \"Automatic\" (the plan's schedule), \"Karras\" and \"discrete\""),
                ))
            }
        },
    })
}

impl Common {
    /// The job of both APIs from the shared fields and the route's own; karras sigmas only
    /// where they are implemented (DPM-Solver++).
    fn job(
        self,
        prompt: String,
        method: SamplingMethod,
        (width, height): (u32, u32),
        count: usize,
        lim: &Limits,
    ) -> Result<JobSpec, RequestError> {
        if self.karras.unwrap_or(lim.plan_karras) && !method.supports_karras() {
            return Err(err(
                "scheduler",
                format!("scheduler: karras sigmas are implemented for dpm++2m, euler, heun and dpm2, not {method}"),
            ));
        }
        Ok(JobSpec {
            prompt,
            negative_prompt: self.negative_prompt,
            steps: self.steps,
            cfg_scale: self.cfg_scale,
            method,
            seed: self.seed,
            rng: self.rng,
            karras: self.karras,
            width,
            height,
            count,
        })
    }
}

/// `POST /v1/images/generations` (OpenAI images API): `prompt` (required), `n`, `size`
/// (`"WxH"` or `"auto"`), `response_format` (`b64_json` only: this server keeps no files to
/// link to); `model`, `quality`, `style`, `user` are ignored. Extra fields: `negative_prompt`,
/// `seed` (absent or −1: random), `steps`, `cfg_scale`, `sampler` (A1111 or `edgerun` names).
///
/// # Errors
/// A [`RequestError`] naming the field.
pub fn parse_openai(body: &[u8], lim: &Limits) -> Result<JobSpec, RequestError> {
    let m = object(body)?;
    let prompt =
        string(&m, "prompt")?.ok_or_else(|| err("prompt", "prompt: required (a string)".into()))?;
    let c = common(&m, lim)?;
    let count = integer(&m, "n", 1, lim.max_images as i64)?.map_or(1, |v| v as usize);
    let (width, height) = match string(&m, "size")?.as_deref().map(str::trim) {
        None | Some("auto") => only_size("size", lim)?,
        Some(s) => {
            let parsed = s.split_once(['x', 'X']).and_then(|(w, h)| {
                Some((w.trim().parse::<u32>().ok()?, h.trim().parse::<u32>().ok()?))
            });
            match parsed {
                Some((w, h)) => check_size("size", w, h, lim)?,
                None => {
                    return Err(err(
                        "size",
                        format!(
                            "size: {s:?} is not WxH (e.g. \"{}\"); the plan holds {}",
                            lim.sizes_text().split(", ").next().unwrap_or("512x512"),
                            lim.sizes_text()
                        ),
                    ))
                }
            }
        }
    };
    match string(&m, "response_format")?.as_deref() {
        None | Some("b64_json") => {}
        Some(f) => {
            return Err(err(
                "response_format",
                format!("response_format: {f:?} is not served; this server answers b64_json only (it keeps no files to link to)"),
            ))
        }
    }
    let method = match string(&m, "sampler")? {
        Some(s) => parse_sampler("sampler", &s)?,
        None => lim.default_method,
    };
    c.job(prompt, method, (width, height), count, lim)
}

/// `POST /sdapi/v1/txt2img` (AUTOMATIC1111): `prompt`, `negative_prompt`, `steps`,
/// `cfg_scale`, `width`, `height` (default: the plan's only size), `seed` (−1 or absent:
/// random), `sampler_name` (or the older `sampler_index`) in A1111 spelling, `scheduler`
/// (`Automatic` only), `batch_size`, `n_iter` (images = batch_size · n_iter). Asking for
/// hires fix (`enable_hr: true`) is refused, since it would be silently skipped.
///
/// # Errors
/// A [`RequestError`] naming the field.
pub fn parse_txt2img(body: &[u8], lim: &Limits) -> Result<JobSpec, RequestError> {
    let m = object(body)?;
    let prompt = string(&m, "prompt")?.unwrap_or_default();
    let c = common(&m, lim)?;
    let max = lim.max_images as i64;
    let batch = integer(&m, "batch_size", 1, max)?.unwrap_or(1);
    let iters = integer(&m, "n_iter", 1, max)?.unwrap_or(1);
    if batch.saturating_mul(iters) > max {
        return Err(err(
            "batch_size",
            format!(
                "batch_size {batch} x n_iter {iters} = {} images, at most {max} per request",
                batch * iters
            ),
        ));
    }
    let w = integer(&m, "width", 1, u32::MAX as i64)?;
    let h = integer(&m, "height", 1, u32::MAX as i64)?;
    let (width, height) = match (w, h) {
        (None, None) => only_size("width", lim)?,
        (Some(w), Some(h)) => check_size("width", w as u32, h as u32, lim)?,
        (w, h) => {
            let pick: Vec<(u32, u32)> = lim
                .sizes
                .iter()
                .copied()
                .filter(|&(sw, sh)| {
                    w.is_none_or(|w| w == sw as i64) && h.is_none_or(|h| h == sh as i64)
                })
                .collect();
            match pick.as_slice() {
                [only] => *only,
                _ => {
                    return Err(err(
                        if w.is_some() { "height" } else { "width" },
                        format!(
                            "width/height: give both; the plan holds {}",
                            lim.sizes_text()
                        ),
                    ))
                }
            }
        }
    };
    let method = match (string(&m, "sampler_name")?, string(&m, "sampler_index")?) {
        (Some(s), _) => parse_sampler("sampler_name", &s)?,
        (None, Some(s)) => parse_sampler("sampler_index", &s)?,
        (None, None) => lim.default_method,
    };
    match get(&m, "enable_hr") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err(err(
                "enable_hr",
                "enable_hr: hires fix is not served; generate at one of the plan's sizes".into(),
            ))
        }
        Some(v) => {
            return Err(err(
                "enable_hr",
                format!("enable_hr: expected a boolean, got {}", kind(v)),
            ))
        }
    }
    c.job(
        prompt,
        method,
        (width, height),
        (batch * iters) as usize,
        lim,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits {
            sizes: vec![(64, 64), (96, 64)],
            max_steps: 50,
            max_images: 4,
            default_method: SamplingMethod::DpmPp2m,
            plan_karras: false,
        }
    }

    #[test]
    fn openai_fields_map_to_the_job() {
        let j = parse_openai(
            br#"{"model":"x","prompt":"a cat","n":2,"size":"96x64","response_format":"b64_json","seed":7,"steps":3,"cfg_scale":2,"sampler":"Euler","negative_prompt":"dog","quality":"hd"}"#,
            &lim(),
        )
        .unwrap();
        assert_eq!(
            j,
            JobSpec {
                prompt: "a cat".into(),
                negative_prompt: "dog".into(),
                steps: 3,
                cfg_scale: 2.0,
                method: SamplingMethod::Euler,
                seed: Some(7),
                rng: NoiseRng::TorchCpu,
                karras: None,
                width: 96,
                height: 64,
                count: 2
            }
        );
    }

    #[test]
    fn txt2img_fields_map_to_the_job() {
        let j = parse_txt2img(
            br#"{"prompt":"p","width":64,"height":64,"seed":-1,"sampler_name":"DPM++ 2M","batch_size":2,"n_iter":2,"steps":5,"cfg_scale":7.0,"restore_faces":false,"styles":[]}"#,
            &lim(),
        )
        .unwrap();
        assert_eq!(
            (j.count, j.seed, j.method, j.steps),
            (4, None, SamplingMethod::DpmPp2m, 5)
        );
        // One of width/height picks the only matching size.
        let j = parse_txt2img(br#"{"width":96}"#, &lim()).unwrap();
        assert_eq!((j.width, j.height), (96, 64));
        // A whole number written as a float is a seed; −0 is 0; tabs and newlines are kept.
        let j = parse_txt2img(
            br#"{"width":96,"seed":1e16,"cfg_scale":-0.0,"prompt":"a\tb\nc"}"#,
            &lim(),
        )
        .unwrap();
        assert_eq!(j.seed, Some(10_000_000_000_000_000));
        assert!(j.cfg_scale == 0.0 && j.cfg_scale.is_sign_positive());
        assert_eq!(j.prompt, "a\tb\nc");
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: &[(&[u8], Option<&str>, &str)] = &[
            (b"{", None, "not valid JSON"),
            (b"[1]", None, "is an array"),
            (
                br#"{"prompt":3}"#,
                Some("prompt"),
                "expected a string, got a number",
            ),
            (br#"{"prompt":[]}"#, Some("prompt"), "got an array"),
            (br#"{"n":1}"#, Some("prompt"), "required"),
            (br#"{"prompt":"a","n":9}"#, Some("n"), "out of range"),
            (
                br#"{"prompt":"a","size":"100000x100000"}"#,
                Some("size"),
                "64x64, 96x64",
            ),
            (br#"{"prompt":"a","size":"big"}"#, Some("size"), "not WxH"),
            (
                br#"{"prompt":"a","steps":"ten"}"#,
                Some("steps"),
                "whole number",
            ),
            (
                br#"{"prompt":"a","steps":0}"#,
                Some("steps"),
                "out of range",
            ),
            (
                br#"{"prompt":"a","cfg_scale":1e999}"#,
                None,
                "not valid JSON",
            ),
            (
                br#"{"prompt":"a","seed":1.5}"#,
                Some("seed"),
                "-1 for a random seed",
            ),
            (
                br#"{"prompt":"a","sampler":"LMS"}"#,
                Some("sampler"),
                "DPM++ 2M",
            ),
            (
                br#"{"prompt":"a","response_format":"url"}"#,
                Some("response_format"),
                "b64_json",
            ),
        ];
        for (body, field, text) in cases {
            // The size is given unless the case is about it (the limits hold two sizes).
            let b = String::from_utf8_lossy(body);
            let b = if b.contains("size") || !b.starts_with("{\"") {
                b.to_string()
            } else {
                b.replacen('{', "{\"size\":\"64x64\",", 1)
            };
            let body = b.as_bytes();
            let e = parse_openai(body, &lim()).unwrap_err();
            assert_eq!(e.field, *field, "{}", String::from_utf8_lossy(body));
            assert!(
                e.message.contains(text),
                "{}: {}",
                String::from_utf8_lossy(body),
                e.message
            );
        }
        let cases: &[(&[u8], &str, &str)] = &[
            (
                br#"{"width":100000,"height":100000}"#,
                "width",
                "no size 100000x100000",
            ),
            (
                br#"{"sampler_name":"DPM++ 2M Karras","width":64,"height":64}"#,
                "sampler_name",
                "unknown sampler",
            ),
            (
                br#"{"batch_size":3,"n_iter":2,"width":64,"height":64}"#,
                "batch_size",
                "at most 4",
            ),
            (
                br#"{"scheduler":"Exponential","width":64,"height":64}"#,
                "scheduler",
                "Automatic",
            ),
            (
                br#"{"scheduler":"Karras","sampler_name":"Euler a","width":64,"height":64}"#,
                "scheduler",
                "dpm++2m, euler, heun and dpm2",
            ),
            (
                br#"{"enable_hr":true,"width":64,"height":64}"#,
                "enable_hr",
                "hires",
            ),
            (br#"{"width":-5}"#, "width", "out of range"),
            (br#"{"enable_hr":"true","width":64,"height":64}"#, "enable_hr", "expected a boolean"),
            (br#"{"prompt":"a\u0000b","width":64,"height":64}"#, "prompt", "U+0000"),
            (br#"{"negative_prompt":"\u001b[31m","width":64,"height":64}"#, "negative_prompt", "U+001B"),
            (br#"{"batch_size":9223372036854775807,"n_iter":9223372036854775807,"width":64,"height":64}"#, "batch_size", "out of range"),
        ];
        for (body, field, text) in cases {
            let e = parse_txt2img(body, &lim()).unwrap_err();
            assert_eq!(e.field, Some(*field), "{}", String::from_utf8_lossy(body));
            assert!(
                e.message.contains(text),
                "{}: {}",
                String::from_utf8_lossy(body),
                e.message
            );
        }
    }
}
