//! Text → `parse_scheduler_config` (JSON5 `scheduler_config.json`).
#![no_main]

use edge_planner::load::scheduler::parse_scheduler_config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_scheduler_config(text, "fuzz/scheduler_config.json");
    }
});
