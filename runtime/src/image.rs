//! Image post-processing and PNG output.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Turns a decoded image `[3, h, w]` (about −1…1, not clamped) into RGB bytes `[h, w, 3]`,
/// exactly as diffusers' `VaeImageProcessor.postprocess` + `numpy_to_pil` do:
/// `clamp(x / 2 + 0.5, 0, 1)` in f32, then `round(v · 255)` with ties to even, as u8.
pub fn to_rgb8(image: &[f32], width: usize, height: usize) -> Vec<u8> {
    let plane = width * height;
    let mut out = vec![0u8; plane * 3];
    for c in 0..3 {
        for p in 0..plane {
            let x = image[c * plane + p];
            let v = (x / 2.0 + 0.5).clamp(0.0, 1.0);
            out[p * 3 + c] = (v * 255.0).round_ties_even() as u8;
        }
    }
    out
}

/// Writes an RGB8 PNG with `text` as tEXt chunks (key, value), atomically: a temporary file
/// in the same folder is renamed over `path` only once complete.
pub fn write_png(
    path: &Path,
    rgb: &[u8],
    width: u32,
    height: u32,
    text: &[(&str, String)],
) -> Result<()> {
    let err = |reason: String| Error::Output {
        path: path.display().to_string(),
        reason,
    };
    let mut buf = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut buf, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        for (k, v) in text {
            enc.add_text_chunk((*k).to_string(), v.clone())
                .map_err(|e| err(e.to_string()))?;
        }
        let mut w = enc.write_header().map_err(|e| err(e.to_string()))?;
        w.write_image_data(rgb).map_err(|e| err(e.to_string()))?;
        w.finish().map_err(|e| err(e.to_string()))?;
    }
    write_atomic(path, &buf)
}

/// Writes `bytes` to `path` through a `tempfile` in the same folder, synced, then renamed over
/// `path` (removed on any error), so no partial output file is ever left.
///
/// # Errors
/// [`Error::Output`] naming `path` and the I/O failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let err = |e: std::io::Error| Error::Output {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".out.tmp-")
        .tempfile_in(dir)
        .map_err(err)?;
    tmp.write_all(bytes).map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    Ok(())
}
