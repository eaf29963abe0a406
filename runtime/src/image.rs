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

/// The largest init image side accepted, pixels (the planner's largest size).
const MAX_SIDE: u32 = 8192;

/// Decodes a PNG init image into RGB bytes `[height, width, 3]`: 8-bit RGB, palette images
/// (expanded) and 8-bit RGBA whose every pixel is opaque are read; `name` (the file) names it
/// in errors.
///
/// # Errors
/// [`Error::InitImage`] naming `name`: not a PNG, truncated or corrupt data, grayscale,
/// 16 bits per channel, transparency, a side above 8192 pixels.
pub fn decode_png_rgb(bytes: &[u8], name: &str) -> Result<(u32, u32, Vec<u8>)> {
    let bad = |reason: String| Error::InitImage {
        path: name.to_string(),
        reason,
    };
    let mut dec = png::Decoder::new_with_limits(
        std::io::Cursor::new(bytes),
        png::Limits {
            bytes: 4 * (MAX_SIDE as usize) * (MAX_SIDE as usize),
        },
    );
    dec.set_transformations(png::Transformations::EXPAND);
    let mut reader = dec
        .read_info()
        .map_err(|e| bad(format!("not a readable PNG ({e})")))?;
    let info = reader.info();
    let (w, h) = (info.width, info.height);
    let (color, depth) = (info.color_type, info.bit_depth);
    if w > MAX_SIDE || h > MAX_SIDE {
        return Err(bad(format!("{w}x{h} pixels; at most {MAX_SIDE} per side")));
    }
    match color {
        png::ColorType::Grayscale | png::ColorType::GrayscaleAlpha => {
            return Err(bad(format!(
                "a grayscale PNG ({color:?}); the VAE encodes RGB: convert it to 8-bit RGB"
            )))
        }
        _ if depth == png::BitDepth::Sixteen => {
            return Err(bad(
                "16 bits per channel; convert it to 8-bit RGB (the pipeline reads 8-bit images)"
                    .into(),
            ))
        }
        _ => {}
    }
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| bad(format!("{w}x{h} pixels overflow the decoder's buffer")))?;
    let mut buf = vec![0u8; size];
    let out = reader
        .next_frame(&mut buf)
        .map_err(|e| bad(format!("truncated or corrupt image data ({e})")))?;
    buf.truncate(out.buffer_size());
    let (w, h) = (out.width, out.height);
    match (out.color_type, out.bit_depth) {
        (png::ColorType::Rgb, png::BitDepth::Eight) => Ok((w, h, buf)),
        (png::ColorType::Rgba, png::BitDepth::Eight) => {
            if let Some(p) = buf.chunks_exact(4).position(|px| px[3] != 255) {
                return Err(bad(format!(
                    "pixel ({}, {}) is not opaque (alpha {}); flatten the image onto a background first",
                    p % w as usize,
                    p / w as usize,
                    buf[4 * p + 3]
                )));
            }
            Ok((
                w,
                h,
                buf.chunks_exact(4)
                    .flat_map(|px| [px[0], px[1], px[2]])
                    .collect(),
            ))
        }
        (c, d) => Err(bad(format!("{c:?} at {d:?} bits; expected 8-bit RGB"))),
    }
}

/// An RGB8 image `[h, w, 3]` as the VAE's input `[3, h, w]` in [−1, 1], as diffusers'
/// `VaeImageProcessor.preprocess` computes it: `x / 255` (f32), then `2·v − 1`.
pub fn rgb8_to_vae_input(rgb: &[u8], width: usize, height: usize) -> Vec<f32> {
    let plane = width * height;
    let mut out = vec![0f32; 3 * plane];
    for p in 0..plane.min(rgb.len() / 3) {
        for c in 0..3 {
            let v = f32::from(rgb[p * 3 + c]) / 255.0;
            out[c * plane + p] = 2.0 * v - 1.0;
        }
    }
    out
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

    fn png_of(w: u32, h: u32, color: png::ColorType, depth: png::BitDepth, data: &[u8]) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut enc = png::Encoder::new(&mut buf, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        if color == png::ColorType::Indexed {
            enc.set_palette(vec![255, 0, 0, 0, 0, 255]);
        }
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(data).unwrap();
        wr.finish().unwrap();
        buf
    }

    /// Init images: RGB, palette and opaque RGBA are read as RGB; grayscale, 16-bit,
    /// transparent and truncated images are refused naming the file and the reason.
    #[test]
    fn init_images_are_read_or_refused_by_name() {
        use png::{BitDepth as D, ColorType as C};
        let rgb: Vec<u8> = (0..2 * 3 * 3).map(|i| i as u8 * 10).collect();
        let ok = decode_png_rgb(&png_of(3, 2, C::Rgb, D::Eight, &rgb), "a.png").unwrap();
        assert_eq!(ok, (3, 2, rgb.clone()));
        let rgba: Vec<u8> = rgb
            .chunks(3)
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect();
        assert_eq!(
            decode_png_rgb(&png_of(3, 2, C::Rgba, D::Eight, &rgba), "a.png").unwrap(),
            (3, 2, rgb.clone())
        );
        let pal = decode_png_rgb(&png_of(2, 1, C::Indexed, D::Eight, &[1, 0]), "p.png").unwrap();
        assert_eq!(pal, (2, 1, vec![0, 0, 255, 255, 0, 0]));
        let err = |bytes: &[u8]| decode_png_rgb(bytes, "in.png").unwrap_err().to_string();
        let e = err(&png_of(3, 2, C::Grayscale, D::Eight, &[0; 6]));
        assert!(e.contains("in.png") && e.contains("grayscale"), "{e}");
        let e = err(&png_of(3, 2, C::Rgb, D::Sixteen, &[0; 36]));
        assert!(e.contains("16 bits"), "{e}");
        let mut clear = rgba.clone();
        clear[7] = 0;
        let e = err(&png_of(3, 2, C::Rgba, D::Eight, &clear));
        assert!(e.contains("(1, 0)") && e.contains("not opaque"), "{e}");
        let whole = png_of(3, 2, C::Rgb, D::Eight, &rgb);
        let e = err(&whole[..whole.len() - 20]);
        assert!(e.contains("in.png") && !e.contains('\n'), "{e}");
        let e = err(b"GIF89a");
        assert!(e.contains("not a readable PNG"), "{e}");
    }
}
