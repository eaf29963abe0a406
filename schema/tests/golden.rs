//! The wire format is frozen: a fixed plan header and metadata must encode to exactly these
//! bytes. If this test fails, a serialized type changed: bump `FORMAT_VERSION` and update the
//! digests below in the same commit (DESIGN.md invariant 10). Needs the `write` feature
//! (on in workspace builds, where the planner enables it).
#![cfg(feature = "write")]

use edge_schema::header::{Header, FORMAT_VERSION, MAGIC};
use edge_schema::op::{Epilogue, Op};
use edge_schema::plan::*;
use edge_schema::scheduler::*;
use edge_schema::tokenizer::*;
use edge_schema::DType;
use zerocopy::IntoBytes;

fn meta() -> PlanMeta {
    let slot = |offset, len| {
        Storage::Arena(ArenaSlice {
            arena: 0,
            offset,
            len,
        })
    };
    PlanMeta {
        target: Target {
            isa: Isa::Aarch64,
            features: vec!["neon".into(), "dotprod".into()],
        },
        model: ModelInfo {
            family: ModelFamily::PixArtAlpha,
            name: "golden".into(),
            pipeline_class: "PixArtAlphaPipeline".into(),
            loras: vec![edge_schema::plan::LoraInfo {
                file: "style.safetensors".into(),
                blake3: [7; 32],
                multiplier: 0.8,
                format: "kohya".into(),
                layers: 20,
                rank: 4,
            }],
        },
        tokenizer: TokenizerSpec {
            pieces: vec![
                Piece {
                    text: "<pad>".into(),
                    score: 0.0,
                },
                Piece {
                    text: "</s>".into(),
                    score: 0.0,
                },
                Piece {
                    text: "<unk>".into(),
                    score: 0.0,
                },
                Piece {
                    text: "\u{2581}a".into(),
                    score: -1.5,
                },
            ],
            added_tokens: vec![AddedToken {
                content: "</s>".into(),
                id: 1,
                special: true,
            }],
            unk_id: 2,
            eos_id: 1,
            pad_id: 0,
            precompiled_charsmap: vec![],
            remove_extra_whitespaces: true,
            prepend_scheme: PrependScheme::Always,
        },
        scheduler: SchedulerConfig {
            class: SchedulerClass::DpmSolverMultistep,
            class_name: "DPMSolverMultistepScheduler".into(),
            num_train_timesteps: 1000,
            beta_start: 0.0001,
            beta_end: 0.02,
            beta_schedule: BetaSchedule::Linear,
            trained_betas: None,
            prediction_type: PredictionType::Epsilon,
            algorithm_type: AlgorithmType::DpmSolverPlusPlus,
            solver_order: 2,
            solver_type: SolverType::Midpoint,
            lower_order_final: true,
            euler_at_final: false,
            final_sigmas_type: FinalSigmasType::Zero,
            timestep_spacing: TimestepSpacing::Linspace,
            steps_offset: 0,
            use_karras_sigmas: false,
            thresholding: false,
            lambda_min_clipped: f64::NEG_INFINITY,
        },
        text: TextInfo {
            max_sequence_length: 4,
            hidden: 2,
            vocab_rows: 8,
        },
        vae: VaeInfo {
            scaling_factor: 0.18215,
            latent_channels: 4,
            downscale: 8,
        },
        sizes: vec![
            ImageSize {
                width: 64,
                height: 32,
                denoiser_stage: 1,
                decoder_stage: 2,
                decoder_tiling: Some(VaeTiling {
                    stage: 2,
                    tile_latent_w: 4,
                    tile_latent_h: 4,
                    overlap_latent_w: 2,
                    overlap_latent_h: 2,
                    sync: None,
                    estimate: Some(StatsEstimate {
                        stage: 5,
                        factor: 4,
                    }),
                }),
                encoder_stage: Some(4),
                encoder_tiling: Some(EncoderTiling {
                    down_stage: 4,
                    mid_stage: 6,
                    tile_latent_w: 3,
                    tile_latent_h: 2,
                    halo_latent: 1,
                    sync_steps: vec![2, 9],
                    held: HeldIn::Memory,
                }),
                tiny_decoder_stage: None,
            },
            ImageSize {
                width: 96,
                height: 64,
                denoiser_stage: 1,
                decoder_stage: 3,
                decoder_tiling: Some(VaeTiling {
                    stage: 3,
                    tile_latent_w: 8,
                    tile_latent_h: 6,
                    overlap_latent_w: 0,
                    overlap_latent_h: 0,
                    sync: Some(GroupNormSync {
                        head_stage: 2,
                        halo_latent: 2,
                        sync_steps: vec![0, 3, 300],
                        held: HeldIn::File,
                    }),
                    estimate: None,
                }),
                encoder_stage: None,
                encoder_tiling: None,
                tiny_decoder_stage: Some(5),
            },
        ],
        text_stage: 0,
        text_buckets: vec![(2, 3)],
        cross_kv_stage: Some(4),
        stages: vec![Stage {
            name: "s".into(),
            kind: StageKind::TextEncoder,
            width: 0,
            height: 0,
            values: vec![
                ValueEntry {
                    dtype: DType::F32,
                    shape: vec![4, 2],
                    storage: slot(0, 32),
                },
                ValueEntry {
                    dtype: DType::Q8_0,
                    shape: vec![2, 32],
                    storage: Storage::Weight(0),
                },
                ValueEntry {
                    dtype: DType::F16,
                    shape: vec![2, 32],
                    storage: Storage::Input(1),
                },
            ],
            steps: vec![
                Step {
                    op: Op::Quantize { dtype: DType::Q8_0 },
                    inputs: vec![0],
                    outputs: vec![1],
                    scratch: None,
                },
                Step {
                    op: Op::Rows { start: 1, len: 1 },
                    inputs: vec![2],
                    outputs: vec![0],
                    scratch: None,
                },
                Step {
                    op: Op::Attention {
                        heads: 2,
                        head_dim: 1,
                        scale: 0.5,
                        q_offset: 0,
                        k_offset: 2,
                        v_offset: 4,
                        has_mask: true,
                        masked_value: -10000.0,
                        has_bias: false,
                        bf16_products: true,
                    },
                    inputs: vec![0, 1],
                    outputs: vec![0],
                    scratch: Some(ArenaSlice {
                        arena: 0,
                        offset: 64,
                        len: 128,
                    }),
                },
                Step {
                    op: Op::Linear {
                        has_bias: false,
                        epilogue: Epilogue::GeluTanh,
                    },
                    inputs: vec![0, 1],
                    outputs: vec![0],
                    scratch: None,
                },
            ],
            segments: vec![Segment {
                first_step: 0,
                end_step: 1,
                label: "block.0".into(),
                section: Some(0),
            }],
            inputs: vec![0],
            outputs: vec![0],
            arena_size: 192,
            live_lower_bound: 160,
            segmented: true,
        }],
        tensors: vec![
            TensorEntry {
                name: "w".into(),
                dtype: DType::Q8_0,
                shape: vec![2, 32],
                layout: PackLayout::RowMajor,
                section: 0,
                offset: 0,
                len: 68,
            },
            TensorEntry {
                name: "w4".into(),
                dtype: DType::Q4_0,
                shape: vec![4, 32],
                layout: PackLayout::Interleaved4x8,
                section: 0,
                offset: 128,
                len: 72,
            },
            TensorEntry {
                name: "w16".into(),
                dtype: DType::Q8_0,
                shape: vec![16, 32],
                layout: PackLayout::Interleaved16x4,
                section: 0,
                offset: 256,
                len: 544,
            },
            TensorEntry {
                name: "wbf16".into(),
                dtype: DType::BF16,
                shape: vec![16, 2],
                layout: PackLayout::Bf16Pairs16,
                section: 0,
                offset: 832,
                len: 64,
            },
            TensorEntry {
                name: "w8a7".into(),
                dtype: DType::Q8_0,
                shape: vec![8, 32],
                layout: PackLayout::Interleaved8x4A7,
                section: 0,
                offset: 896,
                len: 272,
            },
        ],
        sections: vec![SectionEntry {
            offset: 0,
            len: 4096,
            digest: [7; 32],
        }],
        notes: vec!["note".into()],
        budget: Some(1 << 30),
        cuda: Some(CudaModules {
            arch: "sm_87".into(),
            compiler: "NVRTC 12.6".into(),
            modules: vec![CudaModule {
                name: "linear.cu".into(),
                source_digest: [9; 32],
                ptx: ".version 8.5\n.target sm_87\n".into(),
            }],
            vram_budget: Some(6 << 30),
            host_stages: vec![0],
            device_bytes: 5 << 30,
        }),
    }
}

#[test]
fn metadata_bytes_are_frozen() {
    let bytes = meta().encode().unwrap();
    let digest = blake3::hash(&bytes).to_hex().to_string();
    assert_eq!(
        (FORMAT_VERSION, bytes.len(), digest.as_str()),
        (14, GOLDEN_LEN, GOLDEN_DIGEST),
        "the postcard encoding of PlanMeta changed: bump FORMAT_VERSION and update the golden values"
    );
    assert_eq!(PlanMeta::decode(&bytes).unwrap(), meta());
}

#[test]
fn header_layout_is_frozen() {
    let mut h = <Header as zerocopy::FromZeros>::new_zeroed();
    h.magic = MAGIC;
    h.format_version = 0x0102_0304.into();
    h.meta_offset = 0x1111_1111_1111_1111.into();
    h.file_len = 0x2222_2222_2222_2222.into();
    h.meta_digest = [0x33; 32];
    h.header_digest = [0x44; 32];
    let b = h.as_bytes();
    assert_eq!(b.len(), 256);
    assert_eq!(&b[..8], b"EDGEPLAN");
    assert_eq!(&b[8..12], &[4, 3, 2, 1]);
    assert_eq!(&b[16..24], &[0x11; 8]);
    assert_eq!(&b[48..56], &[0x22; 8]);
    assert_eq!(&b[56..88], &[0x33; 32]);
    assert_eq!(&b[224..256], &[0x44; 32]);
}

const GOLDEN_LEN: usize = 612;
const GOLDEN_DIGEST: &str = "a09016b5f834e477d9e98f124197b8c38e69f92903ef1211f022d5349313e5ee";
