//! Bytes → the request-body parsers of `edgerun serve`: the first byte picks the route (even:
//! `POST /v1/images/generations` → `parse_openai`; odd: `POST /sdapi/v1/txt2img` →
//! `parse_txt2img`), the rest is the body. Every accepted job must stay inside the limits.
#![no_main]

use edge_serve::request::{parse_openai, parse_txt2img, Limits, MAX_PROMPT_CHARS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    let lim = Limits {
        sizes: vec![(64, 64), (128, 64), (512, 512)],
        max_steps: 150,
        max_images: 8,
        default_method: edge_runtime::sampler::SamplingMethod::DpmPp2m,
        plan_karras: false,
    };
    let r = if route % 2 == 0 {
        parse_openai(body, &lim)
    } else {
        parse_txt2img(body, &lim)
    };
    match r {
        Ok(j) => {
            assert!(lim.sizes.contains(&(j.width, j.height)));
            assert!((1..=lim.max_steps).contains(&j.steps));
            assert!((1..=lim.max_images).contains(&j.count));
            assert!(j.cfg_scale.is_finite() && (0.0..=100.0).contains(&j.cfg_scale));
            assert!(j.prompt.chars().count() <= MAX_PROMPT_CHARS);
            assert!(j.negative_prompt.chars().count() <= MAX_PROMPT_CHARS);
        }
        Err(e) => assert!(!e.message.is_empty()),
    }
});
