//! One arithmetic on every CPU target: whole fixture pipelines (T5, denoiser with guidance, VAE
//! decode) run with every x86 SIMD kernel table this CPU has give **byte-identical** final
//! latents and PNG pixels to the generic kernels, for plans as published (f32), `f16`, `q8_0`
//! and `q4_0` matrices, square and non-square sizes, both samplers, PixArt-Σ and PixArt-α.
//! A table this CPU lacks is reported on stderr (see `kernels/x86/tests/twins.rs`).

use edge_e2e::*;
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{GenerateParams, Plan, Session};
use edge_schema::plan::{Isa, PackLayout, Target};
use edge_schema::DType;

fn plan(name: &str, quant: Option<DType>) -> Plan {
    sized_plan(name, quant)
}

fn run(
    plan: &Plan,
    table: edge_kernels::KernelTable,
    noise: &[f32],
    (w, h): (u32, u32),
    method: SamplingMethod,
) -> (Vec<f32>, Vec<u8>) {
    let mut s = Session::new(plan, table, None).unwrap();
    let params = GenerateParams {
        prompt: "a lovely cat".into(),
        negative_prompt: String::new(),
        steps: 3,
        cfg_scale: 4.5,
        method,
        seed: 0,
        width: w,
        height: h,
        rng: Default::default(),
        karras: None,
        init_latents: Some(noise.to_vec()),
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    let out = edge_runtime::generate(&mut s, &params, &mut |_| {}).unwrap();
    (out.latents, out.rgb)
}

fn identical(name: &str, quant: Option<DType>) {
    let tables = edge_kernels_x86::variants(&edge_kernels::cpu::features());
    if tables.is_empty() {
        eprintln!(
            "skipped: no x86 SIMD table on this CPU ({})",
            edge_kernels::cpu::features().summary()
        );
        return;
    }
    let p = plan(name, quant);
    for (size, method) in [
        ((64, 64), SamplingMethod::DpmPp2m),
        ((64, 96), SamplingMethod::Euler),
    ] {
        let n = 4 * (size.0 as usize / 8) * (size.1 as usize / 8);
        let noise: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let (lat0, rgb0) = run(&p, edge_kernels::generic(), &noise, size, method);
        for (label, t) in &tables {
            let (lat, rgb) = run(&p, *t, &noise, size, method);
            let what = format!("{name} {quant:?} {size:?} {method:?} {label}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(
                bits(&lat),
                bits(&lat0),
                "{what}: final latents differ from generic"
            );
            assert_eq!(rgb, rgb0, "{what}: PNG pixels differ from generic");
        }
    }
}

#[test]
fn sigma_f32_plan_is_byte_identical() {
    identical("pixart-sigma-tiny", None);
}

#[test]
fn sigma_q8_0_plan_is_byte_identical() {
    identical("pixart-sigma-tiny", Some(DType::Q8_0));
}

#[test]
fn sigma_f16_plan_is_byte_identical() {
    identical("pixart-sigma-tiny", Some(DType::F16));
}

#[test]
fn alpha_q4_0_plan_is_byte_identical() {
    identical("pixart-alpha-tiny", Some(DType::Q4_0));
}

#[test]
fn alpha_f32_plan_is_byte_identical() {
    identical("pixart-alpha-tiny", None);
}

/// The `pixart-sigma-tiny` fixture at 64×64 compiled with `quant` matrices for `target`.
fn target_plan(quant: DType, target: Target) -> Plan {
    let opts = edge_planner::CompileOptions {
        sizes: vec![(64, 64)],
        policy: edge_planner::pack::PackPolicy {
            default: Some(quant),
            rules: Vec::new(),
        },
        target,
        ..Default::default()
    };
    let mut c =
        edge_planner::compile_folder(&fixture("pixart-sigma-tiny"), &opts).expect("compiles");
    let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).expect("assemble");
    Plan::from_bytes(&bytes).expect("plan verifies")
}

/// The fixture compiled row-major (`--target generic`) and for the x86-64 target of `features`
/// with `quant` matrices; the latter must hold some in `layout`.
fn row_major_and_packed(quant: DType, features: &[&str], layout: PackLayout) -> (Plan, Plan) {
    let row_major = target_plan(
        quant,
        Target {
            isa: Isa::Generic,
            features: Vec::new(),
        },
    );
    let packed = target_plan(
        quant,
        Target {
            isa: Isa::X86_64,
            features: features.iter().map(|f| f.to_string()).collect(),
        },
    );
    let repacked = packed
        .meta()
        .tensors
        .iter()
        .filter(|t| t.layout == layout)
        .count();
    assert!(repacked > 0, "no tensor was repacked into {layout:?}");
    (row_major, packed)
}

/// Runs `plan` (64×64, DPM, the fixed noise) with the generic kernels and every x86 table this
/// CPU has: each must give `want`'s final latents and PNG pixels bit for bit.
fn same_bytes_on_every_table(plan: &Plan, want: &(Vec<f32>, Vec<u8>)) {
    let mut tables = vec![("generic", edge_kernels::generic())];
    tables.extend(edge_kernels_x86::variants(&edge_kernels::cpu::features()));
    for (label, t) in tables {
        let got = run64(plan, t);
        assert_eq!(bits(&got.0), bits(&want.0), "{label}: final latents differ");
        assert_eq!(got.1, want.1, "{label}: PNG pixels differ");
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// [`run`] at 64×64 with DPM++ 2M from a fixed noise.
fn run64(plan: &Plan, t: edge_kernels::KernelTable) -> (Vec<f32>, Vec<u8>) {
    let noise: Vec<f32> = (0..4 * 8 * 8)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    run(plan, t, &noise, (64, 64), SamplingMethod::DpmPp2m)
}

/// Relative L2 distance of `plan`'s final latents (generic kernels) from diffusers' (f32) in the
/// fixture's 4-step DPM++ reference, started from diffusers' own initial noise.
fn from_diffusers(plan: &Plan) -> f64 {
    let r = read_safetensors(&fixture(
        "pixart-sigma-tiny/reference/pipeline_dpm_4_cat_64x64.safetensors",
    ));
    let mut s = Session::new(plan, edge_kernels::generic(), None).unwrap();
    let params = cat_params(
        4,
        SamplingMethod::DpmPp2m,
        Some(r["initial_noise"].data.clone()),
    );
    let lat = edge_runtime::generate(&mut s, &params, &mut |_| {})
        .unwrap()
        .latents;
    rel_l2(&lat, &r["final_latents"].data)
}

/// A `--target x86_64-avx512` plan (its `Q8_0` matrices in `PackLayout::Interleaved16x4`, read
/// in place or copied by the VNNI kernels) gives the same bytes as the row-major `q8_0` plan,
/// with the generic kernels and every x86 table this CPU has.
#[test]
fn sigma_q8_0_avx512_target_plan_is_byte_identical() {
    let (row_major, packed) = row_major_and_packed(
        DType::Q8_0,
        &["avx512f", "avx512bw", "avx512vnni"],
        PackLayout::Interleaved16x4,
    );
    same_bytes_on_every_table(&packed, &run64(&row_major, edge_kernels::generic()));
}

/// A `--target x86_64-avx512bf16 --quant bf16` plan (its `BF16` matrices in
/// `PackLayout::Bf16Pairs16`, whose products round the activations to bf16, `vdpbf16ps`'s
/// arithmetic): every x86 table this CPU has gives the generic kernels' bytes (the
/// `avx512+vnni+bf16` table with `vdpbf16ps`, the others through the generic kernel); the
/// latents differ from the row-major `bf16` plan's (other arithmetic) but stay close to them.
#[test]
fn sigma_bf16_pairs_plan_is_byte_identical_and_close_to_row_major() {
    let (row_major, packed) = row_major_and_packed(
        DType::BF16,
        &["avx512f", "avx512bw", "avx512vnni", "avx512bf16"],
        PackLayout::Bf16Pairs16,
    );
    if !edge_kernels::cpu::features().avx512bf16 {
        eprintln!(
            "skipped: no avx512+vnni+bf16 table on this CPU ({}); the others still run",
            edge_kernels::cpu::features().summary()
        );
    }
    let want = run64(&packed, edge_kernels::generic());
    same_bytes_on_every_table(&packed, &want);
    let exact = run64(&row_major, edge_kernels::generic());
    assert_ne!(
        bits(&exact.0),
        bits(&want.0),
        "bf16 products gave the f32 products' bits"
    );
    let rel = rel_l2(&want.0, &exact.0);
    eprintln!("bf16 products against f32 products of the same bf16 weights: relative L2 {rel:.2e}");
    assert!(
        rel < 2e-2,
        "bf16 products drift from the f32 ones: relative L2 {rel:.2e}"
    );
}

/// `--attention-products bf16` (the denoiser's attention steps marked `bf16_products`,
/// `edge_kernels::attention_bf16`'s arithmetic): every x86 table this CPU has gives the
/// generic kernels' bytes (`vdpbf16ps` in the `avx512+vnni+bf16` table, the generic step in
/// the others); the bits differ from the f32 products' and the final latents of the fixture's
/// 4-step DPM++ run stay close to diffusers'.
#[test]
fn sigma_bf16_attention_plan_is_byte_identical_and_close_to_diffusers() {
    use edge_schema::op::Op;
    let compile = |bf16: bool| {
        let opts = edge_planner::CompileOptions {
            sizes: vec![(64, 64)],
            attention_bf16: bf16,
            ..Default::default()
        };
        fixture_plan("pixart-sigma-tiny", &opts).0
    };
    let (f32_plan, bf16_plan) = (compile(false), compile(true));
    let marked = |p: &Plan, kind: edge_schema::plan::StageKind| {
        p.meta()
            .stages
            .iter()
            .filter(|s| s.kind == kind)
            .flat_map(|s| &s.steps)
            .filter(|st| {
                matches!(
                    st.op,
                    Op::Attention {
                        bf16_products: true,
                        ..
                    }
                )
            })
            .count()
    };
    use edge_schema::plan::StageKind;
    assert!(marked(&bf16_plan, StageKind::Denoiser) > 0);
    assert_eq!(marked(&bf16_plan, StageKind::TextEncoder), 0);
    assert_eq!(marked(&f32_plan, StageKind::Denoiser), 0);
    if !edge_kernels::cpu::features().avx512bf16 {
        eprintln!(
            "skipped: no avx512+vnni+bf16 table on this CPU ({}); the others still run",
            edge_kernels::cpu::features().summary()
        );
    }
    let want = run64(&bf16_plan, edge_kernels::generic());
    same_bytes_on_every_table(&bf16_plan, &want);
    let exact = run64(&f32_plan, edge_kernels::generic());
    assert_ne!(
        bits(&exact.0),
        bits(&want.0),
        "bf16 attention products gave the f32 products' bits"
    );
    let (e32, e16) = (from_diffusers(&f32_plan), from_diffusers(&bf16_plan));
    eprintln!(
        "final latents against diffusers, relative L2: f32 attention products {e32:.2e}, bf16 {e16:.2e}"
    );
    assert!(
        e16 < 1e-2,
        "bf16 attention products: relative L2 {e16:.2e} from diffusers"
    );
}

/// `--activation-bits 7 --quant q8_0` (the denoiser's `Q8_0` matrices in
/// `PackLayout::Interleaved8x4A7`, whose activations are quantized to 7 bits): every x86 table
/// this CPU has gives the generic kernels' bytes (all of them run the AVX2 7-bit tile); the
/// text encoder's matrices keep 8-bit activations; the bits differ from the 8-bit `q8_0` plan's
/// and the final latents of the fixture's 4-step DPM++ run stay within twice the 8-bit plan's
/// distance from diffusers' (measured: 5.1e-2 against 3.3e-2 relative L2).
#[test]
fn sigma_q8_0_7_bit_activations_plan_is_byte_identical_and_close_to_diffusers() {
    use edge_schema::plan::StageKind;
    let compile = |a7: bool| {
        let opts = edge_planner::CompileOptions {
            sizes: vec![(64, 64)],
            policy: edge_planner::pack::PackPolicy {
                default: Some(DType::Q8_0),
                rules: Vec::new(),
            },
            activations_a7: a7,
            ..Default::default()
        };
        fixture_plan("pixart-sigma-tiny", &opts).0
    };
    let (q8, a7) = (compile(false), compile(true));
    let layouts = |p: &Plan, kind: StageKind| {
        let m = p.meta();
        let mut v: Vec<PackLayout> = m
            .stages
            .iter()
            .filter(|s| s.kind == kind)
            .flat_map(|s| s.values.iter())
            .filter_map(|v| match v.storage {
                edge_schema::plan::Storage::Weight(t) => Some(m.tensors[t as usize].layout),
                _ => None,
            })
            .collect();
        v.sort_by_key(|l| format!("{l:?}"));
        v.dedup();
        v
    };
    assert!(layouts(&a7, StageKind::Denoiser).contains(&PackLayout::Interleaved8x4A7));
    assert!(!layouts(&a7, StageKind::TextEncoder).contains(&PackLayout::Interleaved8x4A7));
    assert!(!layouts(&q8, StageKind::Denoiser).contains(&PackLayout::Interleaved8x4A7));
    let want = run64(&a7, edge_kernels::generic());
    same_bytes_on_every_table(&a7, &want);
    assert_ne!(
        bits(&run64(&q8, edge_kernels::generic()).0),
        bits(&want.0),
        "7-bit activations gave the 8-bit plan's bits"
    );
    let (e8, e7) = (from_diffusers(&q8), from_diffusers(&a7));
    eprintln!("final latents against diffusers, relative L2: q8_0 {e8:.2e}, q8_0 with 7-bit activations {e7:.2e}");
    assert!(
        e7 < 8e-2 && e7 < 2.0 * e8,
        "7-bit activations: relative L2 {e7:.2e} from diffusers (8-bit: {e8:.2e})"
    );
}
