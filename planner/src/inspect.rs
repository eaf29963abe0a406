//! `edgeplan inspect`: a human-readable summary of a plan file.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use edge_schema::header::Header;
use edge_schema::plan::{PackLayout, PlanMeta, StageKind, Storage};
use edge_schema::DType;

/// Decodes and verifies `file` (a whole plan) and returns its metadata.
pub fn read_meta(file: &[u8]) -> edge_schema::Result<PlanMeta> {
    edge_schema::verify::read_meta(file, &Header::read(file)?)
}

/// The sizes (`WxH, WxH`) for which `has` holds, or `none`.
fn sizes_with(meta: &PlanMeta, has: impl Fn(&edge_schema::plan::ImageSize) -> bool) -> String {
    let v: Vec<String> = meta
        .sizes
        .iter()
        .filter(|z| has(z))
        .map(|z| format!("{}x{}", z.width, z.height))
        .collect();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

/// The summary `edgeplan inspect` prints: model, target, sizes, and per stage the steps,
/// segments, arena size against the liveness lower bound, and weight bytes per type.
pub fn summary(meta: &PlanMeta, file_len: u64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "model: {} ({:?}, {})",
        meta.model.name, meta.model.family, meta.model.pipeline_class
    );
    for l in &meta.model.loras {
        let _ = writeln!(
            s,
            "lora: {} × {} ({}, {} layers, rank {}, blake3 {})",
            l.file,
            l.multiplier,
            l.format,
            l.layers,
            l.rank,
            hex(&l.blake3[..8])
        );
    }
    let _ = writeln!(
        s,
        "target: {}{}",
        meta.target,
        meta.cuda.as_ref().map_or(String::new(), |c| format!(
            " packs (any CPU can run them), GPU kernels for {} (--target cuda-{})",
            c.arch,
            c.arch.replace('_', "")
        ))
    );
    match &meta.cuda {
        Some(c) => {
            let bytes: usize = c.modules.iter().map(|m| m.ptx.len()).sum();
            let names: Vec<&str> = c.modules.iter().map(|m| m.name.as_str()).collect();
            let _ = writeln!(
                s,
                "cuda: kernels compiled ahead of time for {} by {} ({} modules, {bytes} bytes of PTX: {})",
                c.arch,
                c.compiler,
                c.modules.len(),
                names.join(", ")
            );
            let host: Vec<&str> = c
                .host_stages
                .iter()
                .filter_map(|&i| meta.stages.get(i as usize).map(|st| st.name.as_str()))
                .collect();
            let _ = writeln!(
                s,
                "cuda placement: {}; the GPU needs {} bytes{}",
                if host.is_empty() {
                    "every stage on the GPU".to_string()
                } else {
                    format!("{} on the CPU cores, the rest on the GPU", host.join(", "))
                },
                c.device_bytes,
                c.vram_budget
                    .map_or(String::new(), |b| format!(" (--max-vram {b})"))
            );
        }
        None => {
            let _ = writeln!(s, "cuda: none (edgerun --device cuda compiles the kernels at start, or reads --cuda-ptx)");
        }
    }
    let _ = writeln!(s, "file: {file_len} bytes ({})", mib(file_len));
    let sizes: Vec<String> = meta
        .sizes
        .iter()
        .map(|z| format!("{}x{}", z.width, z.height))
        .collect();
    let _ = writeln!(s, "image sizes (WxH): {}", sizes.join(", "));

    let _ = writeln!(
        s,
        "tiny decoder (TAESD: --decoder tae, --preview tae): {}",
        sizes_with(meta, |z| z.tiny_decoder_stage.is_some())
    );
    let _ = writeln!(
        s,
        "VAE encoder (image to image): {}",
        sizes_with(meta, |z| z.encoder_stage.is_some())
    );
    for z in &meta.sizes {
        let Some(t) = &z.decoder_tiling else { continue };
        let ds = meta.vae.downscale;
        let tile = format!(
            "{}x{} latent pixels ({}x{} image pixels)",
            t.tile_latent_w,
            t.tile_latent_h,
            t.tile_latent_w * ds,
            t.tile_latent_h * ds
        );
        let how = match &t.sync {
            Some(sync) => {
                let held = edge_schema::tiles::held_bytes(meta, z);
                let place = match sync.held {
                    edge_schema::plan::HeldIn::Memory => "in memory".to_string(),
                    edge_schema::plan::HeldIn::File => format!(
                        "in a spill file on the device ({} bytes of buffers in memory)",
                        edge_schema::tiles::host_bytes(meta, z)
                    ),
                };
                format!(
                    "exact tiles: windows of {tile} with a halo of {}, {} GroupNorms normalised with the whole image's statistics, {held} bytes held between them {place} (mode exact: the whole-image decode's values)",
                    latent_px(sync.halo_latent),
                    sync.sync_steps.len()
                )
            }
            None => match &t.estimate {
                Some(e) => format!(
                    "blended tiles of {tile}, overlap {}x{} latent pixels, GroupNorm statistics estimated by a whole-image decode of the latent reduced to {}x{} (1/{} per axis; mode estimate: {})",
                    t.overlap_latent_w,
                    t.overlap_latent_h,
                    edge_schema::tiles::reduced_len(z.width / ds, e.factor),
                    edge_schema::tiles::reduced_len(z.height / ds, e.factor),
                    e.factor,
                    edge_schema::tiles::estimate_error(e.factor)
                ),
                None => format!(
                    "blended tiles of {tile}, overlap {}x{} latent pixels (mode blend: each tile normalised alone)",
                    t.overlap_latent_w, t.overlap_latent_h
                ),
            },
        };
        let _ = writeln!(s, "  {}x{}: VAE decoded in {how}", z.width, z.height);
    }
    for z in &meta.sizes {
        let Some(t) = &z.encoder_tiling else { continue };
        let ds = meta.vae.downscale;
        let place = match t.held {
            edge_schema::plan::HeldIn::Memory => "in memory".to_string(),
            edge_schema::plan::HeldIn::File => format!(
                "in a spill file on the device ({} bytes of buffers in memory)",
                edge_schema::tiles::encoder_host_bytes(meta, z)
            ),
        };
        let held = match t.held {
            edge_schema::plan::HeldIn::Memory => edge_schema::tiles::encoder_host_bytes(meta, z),
            edge_schema::plan::HeldIn::File => {
                edge_schema::tiles::encoder_spilled_bytes(meta, z).unwrap_or(0)
            }
        };
        let _ = writeln!(
            s,
            "  {}x{}: VAE encoded in exact tiles: windows of {}x{} latent pixels ({}x{} image pixels) with a halo of {}, {} GroupNorms normalised with the whole image's statistics, {held} bytes held between them {place}, mid block on the whole latent (the whole-image encode's values)",
            z.width,
            z.height,
            t.tile_latent_w,
            t.tile_latent_h,
            t.tile_latent_w * ds,
            t.tile_latent_h * ds,
            latent_px(t.halo_latent),
            t.sync_steps.len()
        );
    }
    let _ = writeln!(
        s,
        "budget: {}",
        meta.budget
            .map_or("none (monolithic)".to_string(), |b| format!(
                "{b} bytes ({})",
                mib(b)
            ))
    );
    let _ = writeln!(
        s,
        "text: max sequence length {}, hidden {}, tokenizer {} ids",
        meta.text.max_sequence_length,
        meta.text.hidden,
        meta.tokenizer.vocab_len()
    );
    if let Some(st) = meta
        .cross_kv_stage
        .and_then(|k| meta.stages.get(k as usize))
    {
        if let Some(v) = st.outputs.first().and_then(|&o| st.values.get(o as usize)) {
            let bytes = v.byte_len().unwrap_or(0);
            let _ = writeln!(
                s,
                "cross-attention K/V cache: {} {:?} ({}, held once per prompt; --kv-cache-type)",
                v.dtype,
                v.shape,
                mib(bytes)
            );
        }
    }
    // Element-wise ops fused into the products' epilogues (the model builders fuse each GELU
    // into the `linear` it follows).
    let (mut fused, mut linears) = (0usize, 0usize);
    for step in meta.stages.iter().flat_map(|st| &st.steps) {
        if let edge_schema::op::Op::Linear { epilogue, .. } = step.op {
            linears += 1;
            fused += usize::from(epilogue == edge_schema::op::Epilogue::GeluTanh);
        }
    }
    let _ = writeln!(
        s,
        "fused epilogues: gelu_tanh in {fused} of {linears} linear steps (applied to each block \
         of outputs while it is in cache; the bits of the op run on its own)"
    );
    // The products of the attention steps, bf16 where `--attention-products bf16` marked them.
    let (mut bf16_steps, mut attention_steps) = (0usize, 0usize);
    for step in meta.stages.iter().flat_map(|st| &st.steps) {
        if let edge_schema::op::Op::Attention { bf16_products, .. } = step.op {
            attention_steps += 1;
            bf16_steps += usize::from(bf16_products);
        }
    }
    let _ = if bf16_steps == 0 {
        writeln!(s, "attention products: f32 (--attention-products)")
    } else {
        writeln!(
            s,
            "attention products: bf16 pairs in {bf16_steps} of {attention_steps} attention steps, \
             the denoiser's (vdpbf16ps's arithmetic; --attention-products)"
        )
    };
    // The GroupNorm group count of the decoder (no weight reveals it; a wrong one gives a
    // visibly wrong image), read from its first GroupNorm step.
    let groups = meta
        .sizes
        .first()
        .and_then(|z| meta.stages.get(z.decoder_stage as usize))
        .and_then(|st| {
            st.steps.iter().find_map(|step| match step.op {
                edge_schema::op::Op::GroupNorm { groups, .. } => Some(groups),
                _ => None,
            })
        });
    let _ = writeln!(
        s,
        "scheduler: {:?}, {} train steps; vae scale factor {}, GroupNorm groups {}",
        meta.scheduler.class,
        meta.scheduler.num_train_timesteps,
        meta.vae.scaling_factor,
        groups.map_or("none".to_string(), |g| g.to_string())
    );
    let mut total_by_type: BTreeMap<String, u64> = BTreeMap::new();
    for (i, st) in meta.stages.iter().enumerate() {
        let ratio = if st.live_lower_bound > 0 {
            st.arena_size as f64 / st.live_lower_bound as f64
        } else {
            1.0
        };
        // A text encoder stage per prompt length bucket: its `ids [l]` input says which.
        let tokens = (st.kind == StageKind::TextEncoder)
            .then(|| st.inputs.first())
            .flatten()
            .and_then(|&v| st.values.get(v as usize))
            .and_then(|v| v.shape.first());
        let size = match tokens {
            _ if st.width > 0 => format!(" {}x{}", st.width, st.height),
            Some(l) => format!(", prompts up to {l} tokens"),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "stage {i} {} ({:?}{size}): {} steps, {} segments{}, arena {} bytes, liveness lower bound {} bytes, ratio {ratio:.3}",
            st.name,
            st.kind,
            st.steps.len(),
            st.segments.len(),
            if st.segmented { " (segmented: weights streamed per segment)" } else { "" },
            st.arena_size,
            st.live_lower_bound
        );
        let mut seen = vec![false; meta.tensors.len()];
        let mut by_type: BTreeMap<String, u64> = BTreeMap::new();
        for v in &st.values {
            if let Storage::Weight(t) = v.storage {
                if !std::mem::replace(&mut seen[t as usize], true) {
                    let e = &meta.tensors[t as usize];
                    let key = pack_name(e);
                    *by_type.entry(key).or_default() += e.len;
                }
            }
        }
        let total: u64 = by_type.values().sum();
        let parts: Vec<String> = by_type.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            s,
            "  weights: {} ; total {total} bytes ({})",
            parts.join(", "),
            mib(total)
        );
    }
    for e in &meta.tensors {
        *total_by_type.entry(pack_name(e)).or_default() += e.len;
    }
    let parts: Vec<String> = total_by_type
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let total: u64 = total_by_type.values().sum();
    let _ = writeln!(
        s,
        "all weights (shared tensors once): {} ; total {total} bytes ({}) in {} sections",
        parts.join(", "),
        mib(total),
        meta.sections.len()
    );
    if meta.notes.is_empty() {
        let _ = writeln!(s, "notes: none");
    } else {
        let _ = writeln!(s, "notes (fallbacks, assumed values, warnings):");
        for n in &meta.notes {
            let _ = writeln!(s, "  {n}");
        }
    }
    let _ = DType::F32;
    s
}

/// `n latent pixel(s)`.
fn latent_px(n: u32) -> String {
    format!("{n} latent pixel{}", if n == 1 { "" } else { "s" })
}

/// A tensor's pack as `inspect` names it: the type, and the layout when it is not row-major
/// (`q8_0 (interleaved 16x4)`).
fn pack_name(e: &edge_schema::plan::TensorEntry) -> String {
    match e.layout {
        PackLayout::RowMajor => e.dtype.name().to_string(),
        PackLayout::Interleaved4x8 => format!("{} (interleaved 4x8)", e.dtype.name()),
        PackLayout::Interleaved16x4 => format!("{} (interleaved 16x4)", e.dtype.name()),
        PackLayout::Bf16Pairs16 => format!("{} (pairs 16x2, bf16 products)", e.dtype.name()),
        PackLayout::Interleaved8x4A7 => {
            format!("{} (interleaved 8x4, 7-bit activations)", e.dtype.name())
        }
    }
}
