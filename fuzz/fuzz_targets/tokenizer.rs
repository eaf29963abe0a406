//! Bytes → the planner's tokenizer readers. First byte even: `tokenizer.json`
//! (`load_tokenizer_json`); odd: `spiece.model` (`load_spiece_model`). A spec that loads is
//! then built into the runtime tokenizer and used on a few prompts.
#![no_main]

use edge_planner::load::tokenizer::{load_spiece_model, load_tokenizer_json};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let spec = if mode & 1 == 0 {
        load_tokenizer_json(&common::write_scratch("tokenizer.json", bytes))
    } else {
        load_spiece_model(&common::write_scratch("spiece.model", bytes))
    };
    let Ok(spec) = spec else {
        return;
    };
    if let Ok(tok) = edge_runtime::tokenizer::Tokenizer::new(&spec) {
        for prompt in [
            "",
            "a red circle",
            "  Ünïcode\u{3000}テキスト <extra_id_0> ",
            "\u{0}\u{ffff}",
        ] {
            let _ = tok.encode(prompt);
            let _ = tok.encode_padded(prompt, 16);
        }
    }
});
