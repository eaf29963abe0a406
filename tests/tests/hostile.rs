//! Hostile plans: a valid plan of the demo model whose metadata is mutated and re-encoded with
//! correct digests, so that only the verifier (schema/src/verify/) stands between it and the
//! kernels. Every mutation must be refused by [`Plan::from_bytes`] with a message naming the
//! problem, and damaged files (flipped bytes, truncation) must be refused without panicking.

use edge_runtime::Executor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use edge_e2e::{compiled_plan, demo};
use edge_runtime::Plan;
use edge_schema::header::{Header, FORMAT_VERSION, HEADER_LEN};
use edge_schema::op::Op;
use edge_schema::plan::{Isa, PackLayout, PlanMeta, Stage, StageKind, Storage, Target};

/// A minimal BLAKE3 (hash mode, 32-byte output), written from the BLAKE3 specification
/// (github.com/BLAKE3-team/BLAKE3-specs, sections 2.1-2.6), so that the test can give mutated
/// metadata a correct digest. Checked against the digests the planner wrote (see
/// `blake3_matches_planner`).
mod blake3 {
    const IV: [u32; 8] = [
        0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB,
        0x5BE0CD19,
    ];
    const PERM: [usize; 16] = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
    const CHUNK_START: u32 = 1;
    const CHUNK_END: u32 = 2;
    const PARENT: u32 = 4;
    const ROOT: u32 = 8;
    const CHUNK: usize = 1024;

    fn g(s: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize, x: u32, y: u32) {
        s[a] = s[a].wrapping_add(s[b]).wrapping_add(x);
        s[d] = (s[d] ^ s[a]).rotate_right(16);
        s[c] = s[c].wrapping_add(s[d]);
        s[b] = (s[b] ^ s[c]).rotate_right(12);
        s[a] = s[a].wrapping_add(s[b]).wrapping_add(y);
        s[d] = (s[d] ^ s[a]).rotate_right(8);
        s[c] = s[c].wrapping_add(s[d]);
        s[b] = (s[b] ^ s[c]).rotate_right(7);
    }

    fn compress(cv: &[u32; 8], block: &[u8], counter: u64, flags: u32) -> [u32; 8] {
        let mut padded = [0u8; 64];
        padded[..block.len()].copy_from_slice(block);
        let mut m = [0u32; 16];
        for (i, w) in m.iter_mut().enumerate() {
            *w = u32::from_le_bytes(padded[4 * i..4 * i + 4].try_into().unwrap());
        }
        let mut s = [
            cv[0],
            cv[1],
            cv[2],
            cv[3],
            cv[4],
            cv[5],
            cv[6],
            cv[7],
            IV[0],
            IV[1],
            IV[2],
            IV[3],
            counter as u32,
            (counter >> 32) as u32,
            block.len() as u32,
            flags,
        ];
        for r in 0..7 {
            g(&mut s, 0, 4, 8, 12, m[0], m[1]);
            g(&mut s, 1, 5, 9, 13, m[2], m[3]);
            g(&mut s, 2, 6, 10, 14, m[4], m[5]);
            g(&mut s, 3, 7, 11, 15, m[6], m[7]);
            g(&mut s, 0, 5, 10, 15, m[8], m[9]);
            g(&mut s, 1, 6, 11, 12, m[10], m[11]);
            g(&mut s, 2, 7, 8, 13, m[12], m[13]);
            g(&mut s, 3, 4, 9, 14, m[14], m[15]);
            if r < 6 {
                m = PERM.map(|p| m[p]);
            }
        }
        let mut out = [0u32; 8];
        for i in 0..8 {
            out[i] = s[i] ^ s[i + 8];
        }
        out
    }

    fn chunk_cv(data: &[u8], counter: u64, root: u32) -> [u32; 8] {
        let blocks: Vec<&[u8]> = if data.is_empty() {
            vec![&[][..]]
        } else {
            data.chunks(64).collect()
        };
        let mut cv = IV;
        for (i, b) in blocks.iter().enumerate() {
            let mut flags = 0;
            if i == 0 {
                flags |= CHUNK_START;
            }
            if i + 1 == blocks.len() {
                flags |= CHUNK_END | root;
            }
            cv = compress(&cv, b, counter, flags);
        }
        cv
    }

    fn node(data: &[u8], first_chunk: u64, root: u32) -> [u32; 8] {
        let chunks = data.len().div_ceil(CHUNK).max(1);
        if chunks == 1 {
            return chunk_cv(data, first_chunk, root);
        }
        // The left subtree holds the largest power of two of chunks that leaves one for the right.
        let left = 1usize << (usize::BITS - 1 - (chunks - 1).leading_zeros());
        let (l, r) = data.split_at(left * CHUNK);
        let lcv = node(l, first_chunk, 0);
        let rcv = node(r, first_chunk + left as u64, 0);
        let mut block = [0u8; 64];
        for i in 0..8 {
            block[4 * i..4 * i + 4].copy_from_slice(&lcv[i].to_le_bytes());
            block[32 + 4 * i..32 + 4 * i + 4].copy_from_slice(&rcv[i].to_le_bytes());
        }
        compress(&IV, &block, 0, PARENT | root)
    }

    /// The 32-byte BLAKE3 hash of `data`.
    pub fn hash(data: &[u8]) -> [u8; 32] {
        let cv = node(data, 0, ROOT);
        let mut out = [0u8; 32];
        for i in 0..8 {
            out[4 * i..4 * i + 4].copy_from_slice(&cv[i].to_le_bytes());
        }
        out
    }
}

fn good_plan() -> Vec<u8> {
    compiled_plan(&demo("pixart-shapes-64"), &[(64, 64)], None)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Header fields at the offsets schema/src/header.rs documents.
struct Layout {
    meta_offset: usize,
    meta_len: usize,
    weights_offset: usize,
    weights_len: usize,
}

fn layout(file: &[u8]) -> Layout {
    Layout {
        meta_offset: u64_at(file, 16) as usize,
        meta_len: u64_at(file, 24) as usize,
        weights_offset: u64_at(file, 32) as usize,
        weights_len: u64_at(file, 40) as usize,
    }
}

/// Writes the header of `file` (which must hold at least the header) with the given version,
/// metadata range, file length and metadata digest, and a correct self-digest.
fn write_header(
    file: &mut [u8],
    version: u32,
    meta_offset: u64,
    meta_len: u64,
    meta_digest: [u8; 32],
) {
    let file_len = file.len() as u64;
    file[8..12].copy_from_slice(&version.to_le_bytes());
    file[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    file[16..24].copy_from_slice(&meta_offset.to_le_bytes());
    file[24..32].copy_from_slice(&meta_len.to_le_bytes());
    file[48..56].copy_from_slice(&file_len.to_le_bytes());
    file[56..88].copy_from_slice(&meta_digest);
    let digest = blake3::hash(&file[..HEADER_LEN - 32]);
    file[HEADER_LEN - 32..HEADER_LEN].copy_from_slice(&digest);
}

/// The plan file of `good` with its metadata replaced by `meta` (re-encoded), the same weight
/// region, and a header whose digests are all correct: the layout of planner/src/write.rs
/// `assemble` (header, padding, weights, metadata).
fn reassemble(good: &[u8], meta: &PlanMeta, version: u32) -> Vec<u8> {
    let l = layout(good);
    let meta_bytes = meta.encode().expect("encode");
    let meta_offset = l.weights_offset + l.weights_len;
    let mut out = good[..meta_offset].to_vec();
    out.extend_from_slice(&meta_bytes);
    let digest = blake3::hash(&meta_bytes);
    write_header(
        &mut out,
        version,
        meta_offset as u64,
        meta_bytes.len() as u64,
        digest,
    );
    out
}

/// `Plan::from_bytes` on `bytes`, turning a panic into a test failure that says so.
fn open(what: &str, bytes: &[u8]) -> Result<Plan, String> {
    match catch_unwind(AssertUnwindSafe(|| Plan::from_bytes(bytes))) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => panic!("{what}: Plan::from_bytes panicked"),
    }
}

/// Mutates a decoded copy of the good plan's metadata and asserts that the re-assembled plan
/// is refused with a message containing every `needle`.
fn refused(what: &str, needles: &[&str], mutate: impl FnOnce(&mut PlanMeta)) {
    refused_in(&good_plan(), what, needles, mutate)
}

/// [`refused`] on the plan `good`.
fn refused_in(good: &[u8], what: &str, needles: &[&str], mutate: impl FnOnce(&mut PlanMeta)) {
    let good = good.to_vec();
    let mut meta = edge_planner::inspect::read_meta(&good).expect("good plan decodes");
    mutate(&mut meta);
    let bytes = reassemble(&good, &meta, FORMAT_VERSION);
    match open(what, &bytes) {
        Ok(_) => panic!("{what}: hostile plan was accepted"),
        Err(msg) => {
            for n in needles {
                assert!(msg.contains(n), "{what}: message lacks `{n}`: {msg}");
            }
        }
    }
}

fn stage_of(meta: &mut PlanMeta, kind: StageKind) -> &mut Stage {
    meta.stages
        .iter_mut()
        .find(|s| s.kind == kind)
        .expect("stage of kind")
}

fn arena_slot(s: &Stage, id: u32) -> edge_schema::plan::ArenaSlice {
    match s.values[id as usize].storage {
        Storage::Arena(a) => a,
        _ => panic!("value {id} is not an arena value"),
    }
}

/// Value `id`'s arena slot, to mutate.
fn arena_slot_mut(s: &mut Stage, id: u32) -> &mut edge_schema::plan::ArenaSlice {
    match &mut s.values[id as usize].storage {
        Storage::Arena(a) => a,
        Storage::Weight(_) => panic!("value {id} is a weight"),
        Storage::Input(_) => panic!("value {id} is a bound stage input"),
    }
}

#[test]
fn blake3_matches_planner() {
    let good = good_plan();
    let l = layout(&good);
    // Header self-digest (one chunk), metadata digest, and every section digest (many chunks).
    let h = Header::read(&good).expect("good header");
    assert_eq!(blake3::hash(&good[..HEADER_LEN - 32]), h.compute_digest());
    assert_eq!(
        blake3::hash(&good[l.meta_offset..l.meta_offset + l.meta_len]),
        h.meta_digest
    );
    let meta = edge_planner::inspect::read_meta(&good).unwrap();
    assert!(meta.sections.iter().any(|s| s.len > 4096));
    for s in &meta.sections {
        let start = l.weights_offset + s.offset as usize;
        assert_eq!(blake3::hash(&good[start..start + s.len as usize]), s.digest);
    }
    // And the unchanged metadata re-assembled is accepted.
    let same = reassemble(&good, &meta, FORMAT_VERSION);
    assert_eq!(same, good);
    open("unchanged", &same).expect("re-assembled good plan verifies");
}

#[test]
fn section_range_overflow() {
    refused(
        "section offset + len overflows",
        &["weight section 0"],
        |m| {
            m.sections[0].offset = !4095;
            m.sections[0].len = 8192;
        },
    );
}

#[test]
fn tensor_range_overflow() {
    refused(
        "tensor offset + len overflows",
        &["tensor 0", "in section"],
        |m| {
            m.tensors[0].offset = !63;
        },
    );
}

#[test]
fn tensor_shape_overflow() {
    refused(
        "tensor element count overflows",
        &["tensor 0", "invalid shape"],
        |m| {
            m.tensors[0].shape = vec![u64::MAX / 2, 3];
        },
    );
}

#[test]
fn value_shape_overflow() {
    refused("value element count overflows", &["invalid shape"], |m| {
        let s = stage_of(m, StageKind::Denoiser);
        let id = s.outputs[0] as usize;
        s.values[id].shape = vec![1 << 40, 1 << 40];
    });
}

#[test]
fn tensor_longer_than_its_section() {
    refused(
        "tensor past its section end",
        &["tensor", "in section"],
        |m| {
            let sec_len = m.sections[m.tensors[0].section as usize].len;
            m.tensors[0].offset = sec_len / 64 * 64;
        },
    );
}

#[test]
fn op_input_aliases_output() {
    refused(
        "elementwise op writes over its input",
        &["overlaps the output"],
        |m| {
            let s = stage_of(m, StageKind::Denoiser);
            let k = s
                .steps
                .iter()
                .position(|st| {
                    matches!(st.op, Op::Silu | Op::GeluTanh | Op::Scale { .. })
                        && matches!(s.values[st.inputs[0] as usize].storage, Storage::Arena(_))
                })
                .expect("an elementwise step");
            let (i, o) = (s.steps[k].inputs[0], s.steps[k].outputs[0]);
            s.values[o as usize].storage = s.values[i as usize].storage.clone();
        },
    );
}

#[test]
fn live_values_overlap() {
    refused(
        "two live stage inputs share bytes",
        &["overlap while both are live"],
        |m| {
            let s = stage_of(m, StageKind::TextEncoder);
            // Inputs are live from the stage start; put the mask on the first bytes of the
            // token ids.
            let ids = arena_slot(s, s.inputs[0]);
            let t = s.inputs[1] as usize;
            let slot = arena_slot_mut(s, t as u32);
            slot.offset = ids.offset;
        },
    );
}

/// A step's scratch on the bytes of an input the step itself reads last: the two are live
/// at the same step (the input until its last read, inclusive), so the plan is refused. The
/// sweep must keep an interval that ends at the step where the next one starts.
#[test]
fn scratch_over_its_own_steps_last_read_input() {
    refused(
        "scratch on the step's own last-read input",
        &["overlap while both are live", "scratch of step"],
        |m| {
            for s in m.stages.iter_mut() {
                let n = s.steps.len();
                // The last read of each value.
                let mut last = vec![usize::MAX; s.values.len()];
                for (k, st) in s.steps.iter().enumerate() {
                    for &i in &st.inputs {
                        last[i as usize] = k;
                    }
                }
                for &o in &s.outputs {
                    last[o as usize] = n;
                }
                for k in 0..n {
                    let Some(sc) = s.steps[k].scratch else {
                        continue;
                    };
                    let own = s.steps[k].inputs.iter().copied().find(|&i| {
                        last[i as usize] == k
                            && matches!(s.values[i as usize].storage, Storage::Arena(a) if a.len >= 4)
                    });
                    if let Some(i) = own {
                        let Storage::Arena(a) = s.values[i as usize].storage else {
                            unreachable!()
                        };
                        let sc_new = edge_schema::plan::ArenaSlice {
                            offset: a.offset,
                            len: sc.len.min(a.len),
                            ..sc
                        };
                        s.steps[k].scratch = Some(sc_new);
                        return;
                    }
                }
            }
            panic!("no step with scratch reads an arena input for the last time");
        },
    );
}

#[test]
fn segment_past_step_list() {
    refused("segment runs past the steps", &["segment", "steps"], |m| {
        let s = stage_of(m, StageKind::Denoiser);
        let n = s.steps.len() as u32;
        let last = s.segments.last_mut().expect("a segment");
        last.end_step = n + 5;
    });
    refused("segment range reversed", &["segment"], |m| {
        let s = stage_of(m, StageKind::VaeDecoder);
        s.segments[0].end_step = u32::MAX;
    });
}

#[test]
fn wrong_format_version() {
    let good = good_plan();
    let meta = edge_planner::inspect::read_meta(&good).unwrap();
    let bytes = reassemble(&good, &meta, FORMAT_VERSION + 1);
    let msg = open("version", &bytes).expect_err("future version accepted");
    assert!(
        msg.contains(&format!("version {}", FORMAT_VERSION + 1)) && msg.contains("not supported"),
        "{msg}"
    );
}

#[test]
fn embedding_shape_mismatch() {
    refused("token ids of the wrong rank", &["embedding", "ids"], |m| {
        let s = stage_of(m, StageKind::TextEncoder);
        let ids = s.inputs[0] as usize;
        let l = s.values[ids].shape[0];
        assert_eq!(l % 2, 0);
        s.values[ids].shape = vec![l / 2, 2];
    });
    refused(
        "sequence length disagrees with the ids input",
        &["max sequence length"],
        |m| {
            m.text.max_sequence_length += 1;
        },
    );
    refused(
        "embedding table smaller than the vocabulary",
        &["embedding table"],
        |m| {
            m.text.vocab_rows += 1;
        },
    );
}

#[test]
fn read_before_write() {
    refused(
        "a step reads a later step's output",
        &["read before it is written"],
        |m| {
            let s = stage_of(m, StageKind::Denoiser);
            let k = s
                .steps
                .iter()
                .position(|st| matches!(st.op, Op::Silu | Op::GeluTanh | Op::Add))
                .expect("an elementwise step");
            let later = s.steps.last().expect("steps").outputs[0];
            s.steps[k].inputs[0] = later;
        },
    );
}

#[test]
fn arena_slice_past_arena() {
    refused(
        "value slot past the arena end",
        &["outside the arena"],
        |m| {
            let s = stage_of(m, StageKind::VaeDecoder);
            let size = s.arena_size;
            let id = s.outputs[0] as usize;
            let slot = arena_slot_mut(s, id as u32);
            slot.offset = size - slot.len + 4;
        },
    );
    refused("value slot offset overflows", &["outside the arena"], |m| {
        let s = stage_of(m, StageKind::Denoiser);
        let id = s.outputs[0] as usize;
        let slot = arena_slot_mut(s, id as u32);
        slot.offset = u64::MAX - 3;
    });
}

/// Positions 0..len sampled by a fixed linear congruential sequence.
fn sample_positions(len: usize, n: usize, seed: u64) -> Vec<usize> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as usize) % len
        })
        .collect()
}

#[test]
fn flipped_bytes_are_refused() {
    let good = good_plan();
    let l = layout(&good);
    let mut positions: Vec<usize> = Vec::new();
    // The header, the weight region, the metadata, and the padding between header and weights.
    positions.extend(sample_positions(HEADER_LEN, 60, 1));
    positions.extend(
        sample_positions(l.weights_len, 80, 2)
            .iter()
            .map(|p| l.weights_offset + p),
    );
    positions.extend(
        sample_positions(l.meta_len, 60, 3)
            .iter()
            .map(|p| l.meta_offset + p),
    );
    positions.extend(
        sample_positions(l.weights_offset - HEADER_LEN, 10, 4)
            .iter()
            .map(|p| HEADER_LEN + p),
    );
    // First and last byte of each part.
    positions.extend([
        0,
        HEADER_LEN - 1,
        l.weights_offset,
        l.meta_offset - 1,
        l.meta_offset,
        good.len() - 1,
    ]);
    for p in positions {
        for bit in [0x01u8, 0x80] {
            let mut b = good.clone();
            b[p] ^= bit;
            if open(&format!("flip at {p}"), &b).is_ok() {
                panic!("plan with byte {p} xor {bit:#x} was accepted (weights at {}..{}, metadata at {}..)", l.weights_offset, l.weights_offset + l.weights_len, l.meta_offset);
            }
        }
    }
}

#[test]
fn truncated_files_are_refused() {
    let good = good_plan();
    let l = layout(&good);
    let mut lens = vec![0, 1, 7, 8, 100, HEADER_LEN - 1, HEADER_LEN, HEADER_LEN + 1];
    lens.extend([
        l.weights_offset,
        l.weights_offset + 1,
        l.meta_offset,
        l.meta_offset + 1,
    ]);
    lens.extend([good.len() - 1, good.len() - 8]);
    lens.extend(sample_positions(good.len(), 40, 5));
    for n in lens {
        let msg =
            open(&format!("truncated to {n}"), &good[..n]).expect_err("truncated plan accepted");
        // Nothing left is an empty file, not a plan; any start of one is a plan cut short.
        let want = if n == 0 {
            "the file is empty"
        } else {
            "truncated"
        };
        assert!(msg.contains(want), "truncated to {n}: {msg}");
    }
    // Appended bytes are refused too (the header records the file length).
    let mut longer = good.clone();
    longer.push(0);
    assert!(open("one byte longer", &longer).is_err());
}

/// A plan whose conv2d steps lost their planned scratch passes the metadata verifier (the
/// schema does not know kernel scratch sizes), so the session must refuse the step instead of
/// letting the kernel panic.
#[test]
fn missing_conv_scratch_is_refused_before_any_step_runs() {
    let good = good_plan();
    let mut meta = edge_planner::inspect::read_meta(&good).unwrap();
    let dec = meta
        .stages
        .iter()
        .position(|s| s.kind == StageKind::VaeDecoder)
        .expect("decoder stage");
    let mut removed = 0;
    for st in &mut meta.stages[dec].steps {
        if matches!(st.op, Op::Conv2d { .. }) && st.scratch.take().is_some() {
            removed += 1;
        }
    }
    assert!(
        removed > 0,
        "the demo decoder has conv2d steps with scratch"
    );
    let bytes = reassemble(&good, &meta, FORMAT_VERSION);
    let plan = match open("no conv scratch", &bytes) {
        Ok(p) => p,
        // Refusing it at open time is as good.
        Err(msg) => {
            assert!(msg.contains("scratch"), "{msg}");
            return;
        }
    };
    let stage = &plan.meta().stages[dec];
    let input = vec![
        0f32;
        stage.values[stage.inputs[0] as usize]
            .shape
            .iter()
            .product::<u64>() as usize
    ];
    let mut out = vec![
        0f32;
        stage.values[stage.outputs[0] as usize]
            .shape
            .iter()
            .product::<u64>() as usize
    ];
    // The session decodes every step when it is created: refused there, before any step runs.
    let mut session = match edge_runtime::Session::new(&plan, edge_kernels::generic(), None) {
        Ok(s) => s,
        Err(e) => {
            assert!(e.to_string().contains("scratch"), "{e}");
            return;
        }
    };
    let r = catch_unwind(AssertUnwindSafe(|| {
        session.run_stage(
            dec as u32,
            &[edge_runtime::StageInput::F32(&input)],
            &mut [&mut out],
        )
    }));
    match r {
        Ok(Ok(())) => panic!("decoder ran without its conv2d scratch"),
        Ok(Err(e)) => assert!(e.to_string().contains("scratch"), "{e}"),
        Err(_) => panic!("the session panicked on a conv2d step without scratch"),
    }
}

/// Like [`reassemble`], from raw metadata bytes (for encodings no `PlanMeta` value can have).
fn reassemble_raw(good: &[u8], meta_bytes: &[u8]) -> Vec<u8> {
    let l = layout(good);
    let meta_offset = l.weights_offset + l.weights_len;
    let mut out = good[..meta_offset].to_vec();
    out.extend_from_slice(meta_bytes);
    let digest = blake3::hash(meta_bytes);
    write_header(
        &mut out,
        FORMAT_VERSION,
        meta_offset as u64,
        meta_bytes.len() as u64,
        digest,
    );
    out
}

#[test]
fn tokenizer_with_invalid_utf8_is_refused() {
    let good = good_plan();
    let mut meta = edge_planner::inspect::read_meta(&good).expect("good plan decodes");
    // A recognisable piece whose bytes we then break in the encoding.
    meta.tokenizer.pieces[3].text = "\u{2581}zzzzqqqq".into();
    let mut bytes = meta.encode().expect("encode");
    let at = bytes
        .windows(8)
        .position(|w| w == b"zzzzqqqq")
        .expect("piece bytes present");
    bytes[at] = 0xFF;
    let plan = reassemble_raw(&good, &bytes);
    let msg = open("invalid utf-8", &plan).expect_err("invalid UTF-8 accepted");
    assert!(
        msg.contains("does not decode") && msg.to_lowercase().contains("utf"),
        "{msg}"
    );
}

#[test]
fn plan_for_missing_cpu_features_is_refused() {
    let good = good_plan();
    let mut meta = edge_planner::inspect::read_meta(&good).expect("good plan decodes");
    meta.target = edge_schema::plan::Target {
        isa: edge_runtime::target::host_isa(),
        features: vec!["sme9".into()],
    };
    let plan = open("target", &reassemble(&good, &meta, FORMAT_VERSION)).expect("verifies");
    let err =
        edge_runtime::target::check(&plan.meta().target).expect_err("missing feature accepted");
    let msg = err.to_string();
    assert!(
        msg.contains("compiled for") && msg.contains("sme9"),
        "{msg}"
    );
}

#[test]
fn repacked_layout_on_a_non_matrix_type_is_refused() {
    refused(
        "f32 tensor marked Interleaved4x8",
        &["tensor 0", "Interleaved4x8", "only 2-D Q8_0/Q4_0"],
        |m| {
            m.tensors[0].layout = PackLayout::Interleaved4x8;
        },
    );
}

#[test]
fn vnni_layout_on_another_type_is_refused() {
    refused(
        "f32 tensor marked Interleaved16x4",
        &["tensor 0", "Interleaved16x4", "only 2-D Q8_0 matrices"],
        |m| {
            m.tensors[0].layout = PackLayout::Interleaved16x4;
        },
    );
}

#[test]
fn seven_bit_layout_on_another_type_is_refused() {
    refused(
        "f32 tensor marked Interleaved8x4A7",
        &["tensor 0", "Interleaved8x4A7", "only 2-D Q8_0 matrices"],
        |m| {
            m.tensors[0].layout = PackLayout::Interleaved8x4A7;
        },
    );
}

#[test]
fn bf16_pairs_layout_on_another_type_is_refused() {
    refused(
        "f32 tensor marked Bf16Pairs16",
        &["tensor 0", "Bf16Pairs16", "only 2-D BF16 matrices"],
        |m| {
            m.tensors[0].layout = PackLayout::Bf16Pairs16;
        },
    );
}

/// An aarch64 plan's repacked matrix fed to a kernel that reads row-major data (here: as the
/// activation operand of its own linear step) is refused before anything runs.
#[test]
fn repacked_weight_outside_a_linear_weight_operand_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("arm.plan");
    let opts = edge_planner::CompileOptions {
        sizes: vec![(64, 64)],
        policy: edge_planner::pack::PackPolicy {
            default: Some(edge_schema::DType::Q8_0),
            rules: vec![],
        },
        target: Target {
            isa: Isa::Aarch64,
            features: vec!["neon".into()],
        },
        ..Default::default()
    };
    edge_planner::compile::compile_to_file(&demo("pixart-shapes-64"), &opts, &out)
        .expect("compile");
    let good = std::fs::read(&out).unwrap();
    open("aarch64 q8_0 plan", &good).expect("the unmodified plan verifies");
    let mut meta = edge_planner::inspect::read_meta(&good).unwrap();
    let repacked: Vec<bool> = meta
        .tensors
        .iter()
        .map(|t| t.layout == PackLayout::Interleaved4x8)
        .collect();
    let s = stage_of(&mut meta, StageKind::Denoiser);
    let k = s
        .steps
        .iter()
        .position(|st| {
            matches!(st.op, Op::Linear { .. })
                && matches!(s.values[st.inputs[1] as usize].storage,
                    Storage::Weight(t) if repacked[t as usize])
        })
        .expect("a linear step with a repacked weight");
    let s = stage_of(&mut meta, StageKind::Denoiser);
    s.steps[k].inputs[0] = s.steps[k].inputs[1];
    let bytes = reassemble(&good, &meta, FORMAT_VERSION);
    let Err(msg) = open("repacked weight as activation", &bytes) else {
        panic!("a repacked weight used as an activation was accepted");
    };
    assert!(
        msg.contains("input 0") && msg.contains("only a linear weight may use"),
        "{msg}"
    );
}

/// A demo plan at 128×128 decoded in exact 64×64 tiles (GroupNorm statistics of the whole
/// image): head stage, tail stage, sync steps, halo.
fn exact_plan() -> Vec<u8> {
    let opts = edge_planner::CompileOptions {
        sizes: vec![(128, 128)],
        tiling: edge_planner::tiling::TileRequest {
            size: Some((64, 64)),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut c = edge_planner::compile_folder(&demo("pixart-shapes-64"), &opts).expect("compile");
    edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble")
}

fn sync_of(meta: &mut PlanMeta) -> &mut edge_schema::plan::GroupNormSync {
    meta.sizes[0]
        .decoder_tiling
        .as_mut()
        .and_then(|t| t.sync.as_mut())
        .expect("exact tiling")
}

#[test]
fn exact_tiling_that_cannot_reproduce_the_image_is_refused() {
    let good = exact_plan();
    open("exact plan", &good).expect("the exact plan itself is accepted");
    refused_in(
        &good,
        "halo narrower than the convolutions consume",
        &["halo 1", "narrower"],
        |m| sync_of(m).halo_latent = 1,
    );
    refused_in(&good, "halo that leaves no core", &["no core"], |m| {
        sync_of(m).halo_latent = 4
    });
    refused_in(
        &good,
        "a GroupNorm left out of the sync steps",
        &["sync steps"],
        |m| {
            sync_of(m).sync_steps.remove(3);
        },
    );
    refused_in(
        &good,
        "a sync step that is not a GroupNorm",
        &["sync steps"],
        |m| {
            let s = sync_of(m);
            s.sync_steps[2] += 1;
        },
    );
    refused_in(
        &good,
        "blending overlap on exact tiles",
        &["overlaps must be 0"],
        |m| {
            if let Some(t) = m.sizes[0].decoder_tiling.as_mut() {
                t.overlap_latent_w = 2;
            }
        },
    );
    refused_in(
        &good,
        "head stage that is not a decoder head",
        &["head stage"],
        |m| {
            let tail = m.sizes[0].decoder_stage;
            sync_of(m).head_stage = tail;
        },
    );
    refused_in(
        &good,
        "tail stage that is not a decoder tail",
        &["VAE tiling"],
        |m| {
            let tail = m.sizes[0].decoder_stage as usize;
            m.stages[tail].kind = StageKind::VaeDecoder;
        },
    );
}

fn encoder_tiling_of(meta: &mut PlanMeta) -> &mut edge_schema::plan::EncoderTiling {
    meta.sizes[0]
        .encoder_tiling
        .as_mut()
        .expect("exact encoder tiling")
}

/// The exact plan's encoder tiles (an explicit exact tile size tiles the encoder too) whose
/// geometry or stages cannot reproduce the whole-image encode are refused.
#[test]
fn exact_encoder_tiling_that_cannot_reproduce_the_encode_is_refused() {
    let good = exact_plan();
    let meta = edge_planner::inspect::read_meta(&good).unwrap();
    let et = meta.sizes[0].encoder_tiling.clone().expect("encoder tiles");
    assert_eq!(et.halo_latent, 1);
    refused_in(
        &good,
        "encoder halo narrower than its convolutions",
        &["halo 0", "narrower"],
        |m| encoder_tiling_of(m).halo_latent = 0,
    );
    refused_in(
        &good,
        "an encoder GroupNorm left out",
        &["sync steps"],
        |m| {
            encoder_tiling_of(m).sync_steps.remove(1);
        },
    );
    refused_in(
        &good,
        "encoder back pointing at the front",
        &["encoder back"],
        |m| {
            let t = encoder_tiling_of(m);
            t.mid_stage = t.down_stage;
        },
    );
    refused_in(
        &good,
        "encoder front of another kind",
        &["encoder front"],
        |m| {
            let d = encoder_tiling_of(m).down_stage as usize;
            m.stages[d].kind = StageKind::VaeEncoder;
        },
    );
    refused_in(
        &good,
        "encoder windows wider than the latent",
        &["do not fit"],
        |m| encoder_tiling_of(m).tile_latent_w = 17,
    );
    refused_in(
        &good,
        "encoder tiling beside another encoder stage",
        &["encoder tiling of stage"],
        |m| m.sizes[0].encoder_stage = Some(m.sizes[0].denoiser_stage),
    );
}

/// A demo plan at 128×128 in blended 96×96 tiles with statistics estimated at 1/2 resolution.
fn estimate_plan() -> Vec<u8> {
    let opts = edge_planner::CompileOptions {
        sizes: vec![(128, 128)],
        tiling: edge_planner::tiling::TileRequest {
            mode: edge_planner::tiling::TileMode::Estimate,
            size: Some((96, 96)),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut c = edge_planner::compile_folder(&demo("pixart-shapes-64"), &opts).expect("compile");
    edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble")
}

fn estimate_of(meta: &mut PlanMeta) -> &mut edge_schema::plan::StatsEstimate {
    meta.sizes[0]
        .decoder_tiling
        .as_mut()
        .and_then(|t| t.estimate.as_mut())
        .expect("estimated statistics")
}

#[test]
fn estimated_statistics_that_do_not_pair_are_refused() {
    let good = estimate_plan();
    open("estimate plan", &good).expect("the estimate plan itself is accepted");
    refused_in(&good, "reduction factor 1", &["factor 1", "2…64"], |m| {
        estimate_of(m).factor = 1
    });
    refused_in(
        &good,
        "a factor the stage was not built for",
        &["reduced latent"],
        |m| estimate_of(m).factor = 4,
    );
    refused_in(
        &good,
        "the tile decoder as the estimate",
        &["reduced latent"],
        |m| {
            let t = m.sizes[0].decoder_stage;
            estimate_of(m).stage = t;
        },
    );
    refused_in(
        &good,
        "GroupNorms that do not pair",
        &["do not pair"],
        |m| {
            let e = estimate_of(m).stage as usize;
            let st = &mut m.stages[e];
            let k = st
                .steps
                .iter()
                .rposition(|s| matches!(s.op, edge_schema::op::Op::GroupNorm { .. }))
                .unwrap();
            if let edge_schema::op::Op::GroupNorm { groups, .. } = &mut st.steps[k].op {
                *groups /= 2;
            }
        },
    );
    let exact = exact_plan();
    refused_in(
        &exact,
        "estimated statistics on exact tiles",
        &["cannot also"],
        |m| {
            if let Some(t) = m.sizes[0].decoder_tiling.as_mut() {
                t.estimate = Some(edge_schema::plan::StatsEstimate {
                    stage: t.stage,
                    factor: 2,
                });
            }
        },
    );
}

/// The cross-K/V stage's concatenation (in place: its per-block parts lie inside the cache).
fn in_place_concat_of(s: &Stage) -> usize {
    s.steps
        .iter()
        .position(|st| edge_schema::verify::in_place_concat(s, st))
        .expect("an in-place concatenation")
}

#[test]
fn in_place_concat_part_out_of_place_is_refused() {
    refused(
        "a concatenation part moved off its place inside the output",
        &["overlaps the output"],
        |m| {
            let s = stage_of(m, StageKind::CrossKv);
            let k = in_place_concat_of(s);
            let part = s.steps[k].inputs[1] as usize;
            let slot = arena_slot_mut(s, part as u32);
            slot.offset -= 64;
        },
    );
}

#[test]
fn a_live_value_over_an_in_place_concat_part_is_refused() {
    refused(
        "the caption projection put on the bytes of the first cache part",
        &["overlap"],
        |m| {
            let s = stage_of(m, StageKind::CrossKv);
            let k = in_place_concat_of(s);
            let first = arena_slot(s, s.steps[k].inputs[0]);
            // The caption projection is read by every block's K/V linear, so it is live while
            // the parts are written.
            let lin = s
                .steps
                .iter()
                .rposition(|st| matches!(st.op, Op::Linear { .. }) && st.inputs[0] != s.inputs[0])
                .unwrap();
            let caption = s.steps[lin].inputs[0] as usize;
            let slot = arena_slot_mut(s, caption as u32);
            slot.offset = first.offset;
        },
    );
}

#[test]
fn a_second_concat_over_placed_parts_is_refused() {
    refused(
        "a second in-place concatenation over the same parts",
        &["overlap while both are live"],
        |m| {
            let s = stage_of(m, StageKind::CrossKv);
            let k = in_place_concat_of(s);
            let mut step = s.steps[k].clone();
            // Same slot as the first output: both outputs are live to the stage end.
            let v = s.values[step.outputs[0] as usize].clone();
            s.values.push(v);
            step.outputs = vec![(s.values.len() - 1) as u32];
            s.steps.insert(k + 1, step);
            for seg in s.segments.iter_mut() {
                if seg.end_step as usize > k {
                    seg.end_step += 1;
                }
                if seg.first_step as usize > k {
                    seg.first_step += 1;
                }
            }
        },
    );
}

#[test]
fn bound_inputs_must_be_the_stage_inputs_they_claim() {
    refused(
        "a bound input that claims another input's place",
        &["claims to be stage input"],
        |m| {
            let s = stage_of(m, StageKind::Denoiser);
            let id = s.inputs[0] as usize;
            assert_eq!(s.values[id].storage, Storage::Input(0));
            s.values[id].storage = Storage::Input(1);
        },
    );
    refused(
        "a step output stored as a bound input",
        &["claims to be stage input 0"],
        |m| {
            let s = stage_of(m, StageKind::Denoiser);
            let id = s.steps[0].outputs[0] as usize;
            s.values[id].storage = Storage::Input(0);
        },
    );
}

/// A caller that passes a stage the wrong number of inputs or outputs gets an error naming the
/// stage and both counts (it used to be reported as an input of the wrong size).
#[test]
fn wrong_input_and_output_counts_are_named() {
    let good = good_plan();
    let plan = open("good", &good).expect("the demo plan opens");
    let dec = plan
        .meta()
        .stages
        .iter()
        .position(|s| s.kind == StageKind::VaeDecoder)
        .expect("decoder stage");
    let stage = &plan.meta().stages[dec];
    let n_in = stage.values[stage.inputs[0] as usize]
        .shape
        .iter()
        .product::<u64>() as usize;
    let input = vec![0f32; n_in];
    let mut out = vec![0f32; 4];
    let mut session = edge_runtime::Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let e = session
        .run_stage(
            dec as u32,
            &[
                edge_runtime::StageInput::F32(&input),
                edge_runtime::StageInput::F32(&input),
            ],
            &mut [&mut out],
        )
        .expect_err("two inputs for a one-input stage");
    let msg = e.to_string();
    assert!(
        msg.contains("called with 2 inputs and 1 outputs, expected 1 and 1"),
        "{msg}"
    );
    let e = session
        .run_stage(
            dec as u32,
            &[edge_runtime::StageInput::F32(&input)],
            &mut [],
        )
        .expect_err("no output buffer");
    assert!(
        e.to_string()
            .contains("called with 1 inputs and 0 outputs, expected 1 and 1"),
        "{e}"
    );
}

/// A plan's CUDA kernels (`--target cuda-smXX`) are verified like the rest of the metadata:
/// a known architecture, unique file names, PTX present and within bounds; a well-formed set
/// opens (and the CPU can run the plan).
#[test]
fn cuda_modules_are_verified() {
    use edge_schema::plan::{CudaModule, CudaModules};
    let modules = |arch: &str, names: &[&str], ptx: &str| CudaModules {
        arch: arch.into(),
        compiler: "NVRTC 12.6".into(),
        modules: names
            .iter()
            .map(|n| CudaModule {
                name: (*n).into(),
                source_digest: [1; 32],
                ptx: ptx.into(),
            })
            .collect(),
        vram_budget: None,
        host_stages: Vec::new(),
        device_bytes: 0,
    };
    let good = good_plan();
    let mut meta = edge_planner::inspect::read_meta(&good).expect("good plan decodes");
    meta.cuda = Some(modules("sm_87", &["linear.cu", "norm.cu"], ".version 8.5"));
    let bytes = reassemble(&good, &meta, FORMAT_VERSION);
    let plan = open("well-formed CUDA modules", &bytes).expect("accepted");
    assert_eq!(
        plan.meta().cuda.as_ref().map(|c| c.arch.as_str()),
        Some("sm_87")
    );
    refused("unknown architecture", &["CUDA kernels", "sm_80"], |m| {
        m.cuda = Some(modules("sm_80", &["linear.cu"], ".version 8.5"));
    });
    refused(
        "repeated module",
        &["CUDA module 1", "unique file name"],
        |m| {
            m.cuda = Some(modules(
                "sm_87",
                &["linear.cu", "linear.cu"],
                ".version 8.5",
            ));
        },
    );
    refused(
        "module name with a folder",
        &["CUDA module 0", "without folders"],
        |m| {
            m.cuda = Some(modules("sm_72", &["../linear.cu"], ".version 8.5"));
        },
    );
    refused("empty PTX", &["empty PTX"], |m| {
        m.cuda = Some(modules("sm_90", &["linear.cu"], ""));
    });
    refused(
        "a denoiser placed on the CPU cores",
        &["CUDA placement", "expected each text encoder stage once"],
        |m| {
            let den = m
                .stages
                .iter()
                .position(|s| s.kind == StageKind::Denoiser)
                .unwrap() as u32;
            let mut c = modules("sm_87", &["linear.cu"], ".version 8.5");
            c.host_stages = vec![den];
            m.cuda = Some(c);
        },
    );
    refused("a stage index past the end", &["CUDA placement"], |m| {
        let mut c = modules("sm_87", &["linear.cu"], ".version 8.5");
        c.host_stages = vec![9999];
        m.cuda = Some(c);
    });
}
