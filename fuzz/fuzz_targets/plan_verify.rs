//! Plan bytes → `edge_runtime::Plan::from_bytes`; on success, a dry run of every stage on a
//! small arena (zero ids, constant latents), which reaches the session's step executor.
//!
//! Mutated bytes almost never keep BLAKE3 digests valid, so the first input byte picks how
//! the rest is used:
//!
//! - even: the bytes are a whole plan file, used unchanged (header and digest parsing);
//! - `1 mod 4`: the bytes are a **metadata** blob (postcard `PlanMeta`), spliced after the
//!   header and weight region of `data/alpha-tiny-16-q4_0.plan` (PixArt-α tiny fixture at
//!   16x16, 8 tokens, q4_0), with every digest and length recomputed the way a hostile planner would;
//! - `3 mod 4`: the first 256 bytes stand for a header, of which only the offsets and lengths
//!   (bytes 16..56) are used, over the base header (digests recomputed); the rest is a
//!   metadata blob, spliced the same way. (Mode 0 covers the other header bytes.)
//!
//! So the fuzzer explores `verify_meta`, the padding check and the executor with arbitrary
//! tables over real weights, without mutating megabytes of weights per input.
#![no_main]

use std::sync::OnceLock;

use edge_runtime::{Executor, Plan, Session, StageInput};
use edge_schema::header::{Header, HEADER_LEN};
use edge_schema::plan::PlanMeta;
use edge_schema::DType;
use libfuzzer_sys::fuzz_target;
use zerocopy::FromBytes;

/// Arena limit of the dry run: a fuzzed plan may ask for more, and is then refused.
const ARENA_LIMIT: u64 = 64 << 20;

/// The base plan whose header and weight region the metadata modes reuse.
fn base() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/alpha-tiny-16-q4_0.plan");
        std::fs::read(path).expect("fuzz/data/alpha-tiny-16-q4_0.plan is readable")
    })
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The base plan's header (or `header`, when given) and weights, then `meta` (section
/// digests recomputed when it decodes), with the metadata digest, lengths (unless `header`
/// is given) and header digest recomputed.
fn splice(header: Option<&[u8]>, meta: &[u8]) -> Vec<u8> {
    let base = base();
    let m0 = u64_at(base, 16) as usize;
    let (w0, wlen) = (u64_at(base, 32) as usize, u64_at(base, 40) as usize);
    let weights = &base[w0..w0 + wlen];
    let meta = match PlanMeta::decode(meta) {
        Ok(mut decoded) => {
            for s in &mut decoded.sections {
                let range = s.offset as usize..s.offset.saturating_add(s.len) as usize;
                if let Some(sec) = weights.get(range) {
                    s.digest = *blake3::hash(sec).as_bytes();
                }
            }
            decoded.encode().unwrap_or_else(|_| meta.to_vec())
        }
        Err(_) => meta.to_vec(),
    };
    let mut out = base[..m0].to_vec();
    out.extend_from_slice(&meta);
    let mut head = base[..HEADER_LEN].to_vec();
    if let Some(given) = header {
        head[16..56].copy_from_slice(&given[16..56]);
    }
    let Ok(mut h) = Header::read_from_bytes(&head) else {
        return out;
    };
    if header.is_none() {
        h.meta_len = (meta.len() as u64).into();
        h.file_len = (out.len() as u64).into();
    }
    h.meta_digest = *blake3::hash(&meta).as_bytes();
    h.header_digest = h.compute_digest();
    out[..HEADER_LEN].copy_from_slice(&h.to_bytes());
    out
}

/// `EDGE_FUZZ_DEBUG=1` prints what happened to each input (for checking seeds).
fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("EDGE_FUZZ_DEBUG").is_some())
}

fn dry_run(plan: &Plan) {
    let _ = plan.verify_all_sections();
    let Ok(mut session) = Session::new(plan, edge_kernels::generic(), Some(ARENA_LIMIT)) else {
        return;
    };
    let meta = plan.meta();
    for (i, stage) in meta.stages.iter().enumerate() {
        // Bytes of a stage input or output, from its type and shape (arena slot or not).
        let bytes = |vid: u32| -> usize {
            stage
                .values
                .get(vid as usize)
                .and_then(|v| v.byte_len())
                .map_or(0, |b| b.min(ARENA_LIMIT) as usize)
        };
        let mut i32_inputs: Vec<Vec<i32>> = Vec::new();
        let mut byte_inputs: Vec<Vec<u32>> = Vec::new();
        let mut kinds = Vec::new();
        for &vid in &stage.inputs {
            let is_i32 = stage.values.get(vid as usize).map(|v| v.dtype) == Some(DType::I32);
            if is_i32 {
                i32_inputs.push(vec![0; bytes(vid) / 4]);
                kinds.push((true, i32_inputs.len() - 1, bytes(vid)));
            } else {
                // 0.5f32 in every word: finite values for f32, f16 and q8_0 alike.
                byte_inputs.push(vec![0x3F00_0000; bytes(vid).div_ceil(4)]);
                kinds.push((false, byte_inputs.len() - 1, bytes(vid)));
            }
        }
        let inputs: Vec<StageInput<'_>> = kinds
            .iter()
            .map(|&(is_i32, k, n)| {
                if is_i32 {
                    StageInput::I32(&i32_inputs[k])
                } else {
                    StageInput::Bytes(&zerocopy::IntoBytes::as_bytes(&byte_inputs[k][..])[..n])
                }
            })
            .collect();
        let mut outs: Vec<Vec<u8>> = stage.outputs.iter().map(|&v| vec![0; bytes(v)]).collect();
        let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
        let r = session.run_stage_bytes(i as u32, &inputs, &mut out_refs);
        if debug() {
            eprintln!("stage {i} ({}): {:?}", stage.name, r.map(|_| "ran"));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let spliced;
    let bytes = match mode & 3 {
        1 => {
            spliced = splice(None, rest);
            &spliced[..]
        }
        3 if rest.len() >= HEADER_LEN => {
            spliced = splice(Some(&rest[..HEADER_LEN]), &rest[HEADER_LEN..]);
            &spliced[..]
        }
        _ => rest,
    };
    match Plan::from_bytes(bytes) {
        Ok(plan) => dry_run(&plan),
        Err(e) if debug() => eprintln!("refused: {e}"),
        Err(_) => {}
    }
});
