//! Helper for `scripts/test-aarch64`'s end-to-end check (no Python needed).
//!
//! - `latents extract IN.safetensors TENSOR OUT.safetensors`: copies f32 tensor `TENSOR` of
//!   `IN` (e.g. `initial_noise` of a fixture's `pipeline_*.safetensors`) to `OUT` as tensor
//!   `latents`, the input format of `edgerun generate --init-latents`.
//! - `latents compare GOT.safetensors GOT_TENSOR REF.safetensors REF_TENSOR TOL [max|l2]`:
//!   fails unless both f32 tensors have the same shape and `max|got − ref| ≤ TOL · max(1,
//!   max|ref|)` (`max`, the default) or `‖got − ref‖₂ / ‖ref‖₂ ≤ TOL` (`l2`, the metric of
//!   `tests/tests/formats.rs` for the quantized GGUF pipelines).
//! - `latents image GOT.png REF.safetensors TENSOR`: fails unless the RGB8 PNG equals u8 tensor
//!   `TENSOR` (`image_uint8` `[1, H, W, 3]` of a fixture's pipeline file) within 1 level on at
//!   least 99.5 % of the channel values and within 3 everywhere (the bound of
//!   `tests/tests/pipeline.rs`).

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
        [cmd, got, reference, tensor] if cmd == "image" => compare_image(got, reference, tensor),
        _ => Err("usage: latents extract IN TENSOR OUT | latents compare GOT GOT_TENSOR REF REF_TENSOR TOL [max|l2] | latents image GOT.png REF TENSOR".into()),
    }
}

/// The `image` subcommand: PNG `got` against u8 tensor `tensor` of `reference`.
fn compare_image(got: &str, reference: &str, tensor: &str) -> Result<(), String> {
    let file = std::fs::File::open(got).map_err(|e| format!("reading {got}: {e}"))?;
    let mut dec = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .map_err(|e| format!("{got}: not a PNG: {e}"))?;
    let mut px = vec![0u8; dec.output_buffer_size().unwrap_or(0)];
    let info = dec.next_frame(&mut px).map_err(|e| format!("{got}: {e}"))?;
    if info.color_type != png::ColorType::Rgb || info.bit_depth != png::BitDepth::Eight {
        return Err(format!(
            "{got}: expected 8-bit RGB, found {:?} {:?}",
            info.color_type, info.bit_depth
        ));
    }
    px.truncate(info.buffer_size());
    let bytes = std::fs::read(reference).map_err(|e| format!("reading {reference}: {e}"))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{reference}: not a valid safetensors file: {e}"))?;
    let t = st
        .tensor(tensor)
        .map_err(|e| format!("{reference}: no tensor `{tensor}`: {e}"))?;
    let want_shape = [1, info.height as usize, info.width as usize, 3];
    if t.dtype() != Dtype::U8 || t.shape() != want_shape {
        return Err(format!(
            "{reference}:{tensor} is {:?} {:?}, expected U8 {want_shape:?}",
            t.dtype(),
            t.shape()
        ));
    }
    let diffs: Vec<u8> = px
        .iter()
        .zip(t.data())
        .map(|(a, b)| a.abs_diff(*b))
        .collect();
    let max = diffs.iter().copied().max().unwrap_or(0);
    let within1 = diffs.iter().filter(|&&d| d <= 1).count() as f64 / diffs.len().max(1) as f64;
    println!(
        "image: max level difference {max}, {:.3} % within 1 level",
        within1 * 100.0
    );
    if max > 3 || within1 < 0.995 {
        return Err(format!(
            "{got} differs from {reference}:{tensor}: max {max} levels, {:.3} % within 1",
            within1 * 100.0
        ));
    }
    Ok(())
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
