//! Bytes → the runtime's init-image reader (`edge_runtime::image::decode_png_rgb`), then the
//! VAE preprocessing of what it accepts: a value or an error, never a panic, and an accepted
//! image always holds `width · height · 3` bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((w, h, rgb)) = edge_runtime::image::decode_png_rgb(data, "fuzz.png") {
        assert_eq!(rgb.len(), w as usize * h as usize * 3);
        let x = edge_runtime::image::rgb8_to_vae_input(&rgb, w as usize, h as usize);
        assert!(x.iter().all(|v| (-1.0..=1.0).contains(v)));
    }
});
