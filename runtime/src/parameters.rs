//! The generation parameters a PNG records, in the AUTOMATIC1111 `parameters` layout that
//! stable-diffusion.cpp also writes and PNG-info tools read. One writer for every front end
//! (`edgerun generate`, `edgerun serve`), so the same run gives the same PNG bytes.

use crate::sampler::SamplingMethod;

/// What a PNG records about the run that made it.
#[derive(Clone, Debug)]
pub struct GenerationInfo {
    pub prompt: String,
    pub negative_prompt: String,
    pub steps: usize,
    pub sampler: SamplingMethod,
    pub cfg_scale: f32,
    pub seed: u64,
    /// The generator the seed fed (recorded unless `init_latents` replaced its noise).
    pub rng: crate::rng::NoiseRng,
    /// Karras sigmas were used (recorded as A1111's `Schedule type: Karras`).
    pub karras: bool,
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// The model's name from the plan's metadata.
    pub model: String,
    /// The plan's file name (never the path as typed).
    pub plan_name: String,
    /// BLAKE3 digest of the plan's metadata, 64 hex digits.
    pub plan_digest: String,
    /// File name of the initial noise, when it was given.
    pub init_latents: Option<String>,
    /// Image to image: the init image's file name and the strength (recorded as A1111's
    /// `Denoising strength` and `Init image`).
    pub init_image: Option<(String, f64)>,
}

impl GenerationInfo {
    /// The `parameters` text in the AUTOMATIC1111 layout: the prompt, `Negative prompt: …`,
    /// then one line of `Key: value` fields. Newlines, carriage returns and backslashes in the
    /// prompts are escaped (`\n`, `\r`, `\\`) so a prompt cannot forge a line; a field value
    /// holding `,`, `:` or `"` is quoted as a JSON string (A1111's rule), so it cannot forge a
    /// field. The plan is named by its file name and the BLAKE3 digest of its metadata
    /// (`Model hash`: the first 10 hex digits; `Plan digest`: all 64).
    pub fn a1111(&self) -> String {
        let mut fields = vec![
            ("Steps", self.steps.to_string()),
            ("Sampler", self.sampler.a1111_name().to_string()),
        ];
        if self.karras {
            fields.push(("Schedule type", "Karras".to_string()));
        }
        fields.extend([
            ("CFG scale", self.cfg_scale.to_string()),
            ("Seed", self.seed.to_string()),
        ]);
        if self.init_latents.is_none() {
            fields.push(("RNG", self.rng.name().to_string()));
        }
        fields.extend([
            ("Size", format!("{}x{}", self.width, self.height)),
            (
                "Model hash",
                self.plan_digest.get(..10).unwrap_or_default().to_string(),
            ),
            ("Model", self.model.clone()),
            ("Plan", self.plan_name.clone()),
            ("Plan digest", self.plan_digest.clone()),
        ]);
        if let Some((name, strength)) = &self.init_image {
            fields.push(("Denoising strength", strength.to_string()));
            fields.push(("Init image", name.clone()));
        }
        if let Some(f) = &self.init_latents {
            fields.push(("Init latents", f.clone()));
        }
        fields.push(("Version", format!("edgerun {}", env!("CARGO_PKG_VERSION"))));
        let line: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{k}: {}", quote_field(v)))
            .collect();
        format!(
            "{}\nNegative prompt: {}\n{}",
            escape_lines(&self.prompt),
            escape_lines(&self.negative_prompt),
            line.join(", ")
        )
    }

    /// The PNG text chunks of an image of this run: `parameters` ([`Self::a1111`]) and
    /// `Software`.
    pub fn png_text(&self) -> [(&'static str, String); 2] {
        [
            ("parameters", self.a1111()),
            ("Software", format!("edgerun {}", env!("CARGO_PKG_VERSION"))),
        ]
    }
}

/// `s` with `\`, newline and carriage return escaped, so it stays on one line, NUL as `\0`
/// (a NUL ends a PNG text chunk's keyword or hides what follows it), and every other control
/// character and the Unicode line and paragraph separators as `\u` and four hex digits (PNG
/// text chunks allow no control character but the line feed, and some readers break lines at
/// U+2028).
fn escape_lines(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0' => o.push_str("\\0"),
            c => push_escaped(&mut o, c),
        }
    }
    o
}

/// Control characters (C0, DEL, C1) and U+2028 / U+2029: written as escapes in the
/// parameters text.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Appends `c` to `o`: `\` as `\\`, line feed and carriage return as `\n` and `\r`, the other
/// characters [`needs_escape`] names as `\u` and four hex digits, the rest as is.
fn push_escaped(o: &mut String, c: char) {
    match c {
        '\\' => o.push_str("\\\\"),
        '\n' => o.push_str("\\n"),
        '\r' => o.push_str("\\r"),
        c if needs_escape(c) => o.push_str(&format!("\\u{:04x}", c as u32)),
        c => o.push(c),
    }
}

/// A field value as A1111 writes it: as is, or as a JSON string when it holds `,`, `:`, `"`,
/// a line break or another character [`needs_escape`] names.
fn quote_field(v: &str) -> String {
    if !v.contains([',', ':', '"']) && !v.chars().any(needs_escape) {
        return v.to_string();
    }
    let mut q = String::from("\"");
    for c in v.chars() {
        match c {
            '"' => q.push_str("\\\""),
            c => push_escaped(&mut q, c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt cannot forge a line or a field; a short digest does not panic.
    #[test]
    fn prompts_cannot_forge_fields() {
        let info = GenerationInfo {
            prompt: "a cat\nSteps: 99\0\x07\u{2028}x\u{7f}\u{85}".into(),
            negative_prompt: "".into(),
            steps: 2,
            sampler: SamplingMethod::Euler,
            cfg_scale: 4.5,
            seed: 7,
            rng: crate::rng::NoiseRng::TorchCpu,
            karras: false,
            width: 64,
            height: 32,
            model: "m, x\u{2029}".into(),
            plan_name: "p.plan".into(),
            plan_digest: "abc".into(),
            init_latents: None,
            init_image: None,
        };
        let t = info.a1111();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            "a cat\\nSteps: 99\\0\\u0007\\u2028x\\u007f\\u0085"
        );
        assert!(lines[2].starts_with("Steps: 2, Sampler: Euler, CFG scale: 4.5, Seed: 7, RNG: torch-cpu, Size: 64x32, Model hash: , Model: \"m, x\\u2029\""));
        // No control character but the two line feeds, no Unicode line separator.
        assert!(t.chars().filter(|&c| needs_escape(c)).eq(['\n', '\n']));
    }
}
