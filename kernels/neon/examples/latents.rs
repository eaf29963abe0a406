//! Helper for `scripts/test-aarch64`'s end-to-end check (no Python needed).
//!
//! - `latents extract IN.safetensors TENSOR OUT.safetensors`: copies f32 tensor `TENSOR` of
//!   `IN` (e.g. `initial_noise` of a fixture's `pipeline_*.safetensors`) to `OUT` as tensor
//!   `latents`, the input format of `edgerun generate --init-latents`.
//! - `latents compare GOT.safetensors GOT_TENSOR REF.safetensors REF_TENSOR TOL [max|l2]`:
//!   fails unless both f32 tensors have the same shape and `max|got − ref| ≤ TOL · max(1,
//!   max|ref|)` (`max`, the default) or `‖got − ref‖₂ / ‖ref‖₂ ≤ TOL` (`l2`, the metric of
//!   `tests/tests/formats.rs` for the quantized GGUF pipelines).

use std::process::ExitCode;

use safetensors::{Dtype, SafeTensors};

/// Reads f32 tensor `name` of the safetensors file `path`: `(shape, values)`.
fn read(path: &str, name: &str) -> Result<(Vec<usize>, Vec<f32>), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{path}: not a valid safetensors file: {e}"))?;
    let t = st
        .tensor(name)
        .map_err(|e| format!("{path}: no tensor `{name}`: {e}"))?;
    if t.dtype() != Dtype::F32 {
        return Err(format!(
            "{path}: tensor `{name}` is {:?}, expected F32",
            t.dtype()
        ));
    }
    let v = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((t.shape().to_vec(), v))
}

fn run(args: &[String]) -> Result<(), String> {
    match args {
        [cmd, input, tensor, output] if cmd == "extract" => {
            let (shape, v) = read(input, tensor)?;
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), &bytes)
                .map_err(|e| format!("{output}: {e}"))?;
            let out = safetensors::serialize([("latents", view)], None)
                .map_err(|e| format!("{output}: {e}"))?;
            std::fs::write(output, out).map_err(|e| format!("writing {output}: {e}"))?;
            println!("wrote {output}: latents {shape:?} from {input}:{tensor}");
            Ok(())
        }
        [cmd, got, got_t, reference, ref_t, tol, rest @ ..] if cmd == "compare" && rest.len() <= 1 => {
            let l2 = match rest.first().map(String::as_str) {
                None | Some("max") => false,
                Some("l2") => true,
                Some(other) => return Err(format!("metric `{other}`: expected max or l2")),
            };
            let tol: f32 = tol
                .parse()
                .map_err(|e| format!("tolerance `{tol}`: {e}"))?;
            let (gs, g) = read(got, got_t)?;
            let (rs, r) = read(reference, ref_t)?;
            if gs != rs {
                return Err(format!("{got}:{got_t} is {gs:?}, {reference}:{ref_t} is {rs:?}"));
            }
            if l2 {
                let num: f64 = g
                    .iter()
                    .zip(&r)
                    .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
                    .sum();
                let den: f64 = r.iter().map(|y| f64::from(*y).powi(2)).sum();
                let rel = (num / den).sqrt();
                println!("rel L2 |got - ref| / |ref| = {rel:e}, bound = {tol:e}");
                if rel.is_nan() || rel > f64::from(tol) {
                    return Err(format!(
                        "{got}:{got_t} differs from {reference}:{ref_t}: rel L2 {rel:e} > {tol:e}"
                    ));
                }
                return Ok(());
            }
            let max_ref = r.iter().fold(0f32, |a, v| a.max(v.abs()));
            let diff = g
                .iter()
                .zip(&r)
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            let bound = tol * max_ref.max(1.0);
            println!("max|got - ref| = {diff:e}, max|ref| = {max_ref}, bound = {bound:e}");
            let nan = g.iter().any(|v| v.is_nan());
            if nan || diff > bound {
                return Err(format!("{got}:{got_t} differs from {reference}:{ref_t}: {diff} > {bound}"));
            }
            Ok(())
        }
        _ => Err("usage: latents extract IN TENSOR OUT | latents compare GOT GOT_TENSOR REF REF_TENSOR TOL [max|l2]".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latents: {e}");
            ExitCode::FAILURE
        }
    }
}
