//! Image post-processing and PNG output.

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

/// An RGB8 PNG (`rgb` is `[height, width, 3]`) with `text` as text chunks (key, value: tEXt
/// when the value is Latin-1, iTXt (UTF-8) otherwise), as bytes.
///
/// # Errors
/// The PNG encoder's, as a string (a buffer whose length is not `width · height · 3`).
pub fn encode_png(
    rgb: &[u8],
    width: u32,
    height: u32,
    text: &[(&str, String)],
) -> std::result::Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut buf, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        for (k, v) in text {
            // tEXt holds Latin-1 only; prompts with other characters go in an iTXt (UTF-8)
            // chunk under the same keyword.
            if v.chars().all(|c| u32::from(c) <= 0xFF) {
                enc.add_text_chunk((*k).to_string(), v.clone())
            } else {
                enc.add_itxt_chunk((*k).to_string(), v.clone())
            }
            .map_err(|e| e.to_string())?;
        }
        let mut w = enc.write_header().map_err(|e| e.to_string())?;
        w.write_image_data(rgb).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
    }
    Ok(buf)
}

/// Writes [`encode_png`]'s bytes atomically: a temporary file in the same folder is renamed
/// over `path` only once complete.
///
/// # Errors
/// [`Error::Output`] naming `path`.
pub fn write_png(
    path: &Path,
    rgb: &[u8],
    width: u32,
    height: u32,
    text: &[(&str, String)],
) -> Result<()> {
    let buf = encode_png(rgb, width, height, text).map_err(|reason| Error::Output {
        path: path.display().to_string(),
        reason,
    })?;
    write_atomic(path, &buf)
}

/// Writes `bytes` to `path` with [`edge_schema::io::write_atomic`]: no partial output file, a
/// symbolic link followed, a device, pipe or directory refused.
///
/// # Errors
/// [`Error::Output`] naming `path` and the I/O failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    edge_schema::io::write_atomic(path, bytes).map_err(|e| Error::Output {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Any prompt can be stored: Latin-1 in tEXt, the rest (emoji, CJK, curly quotes) in iTXt;
    /// both read back as written.
    #[test]
    fn text_chunks_hold_any_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.png");
        let prompts = [
            ("latin", "café rouge".to_string()),
            ("other", "a “red” 🔴 猫".to_string()),
        ];
        write_png(
            &path,
            &[0u8; 2 * 2 * 3],
            2,
            2,
            &prompts
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
        let reader = dec.read_info().unwrap();
        let info = reader.info();
        assert_eq!(info.uncompressed_latin1_text.len(), 1);
        assert_eq!(info.uncompressed_latin1_text[0].keyword, "latin");
        assert_eq!(info.uncompressed_latin1_text[0].text, "café rouge");
        assert_eq!(info.utf8_text.len(), 1);
        assert_eq!(info.utf8_text[0].keyword, "other");
        assert_eq!(info.utf8_text[0].get_text().unwrap(), "a “red” 🔴 猫");
    }
}
