//! The CUDA executor on the fixture pipelines (feature `cuda`, run by `scripts/test-cuda` on a
//! machine with an NVIDIA GPU): T5, the denoiser with guidance and the VAE decode of plans
//! compiled from the diffusers fixtures, run on the GPU from the fixtures' initial noise.
//!
//! - f32 plans (as published) must match diffusers within the CPU's tolerances (final latents
//!   within 1e-3 × max(1, max |ref|), PNG values within one level for ≥ 99.5 %);
//! - f32, F16 and Q8_0 plans must match the CPU session on the same plan within the bounds
//!   below (the matrix products and element-wise kernels give the CPU's bits; norms and
//!   attention reduce in another order, within 1e-5 of the largest value per kernel).
//!
//! Without a GPU each test says so and passes, unless `EDGE_REQUIRE_GPU` is set. The PTX is
//! compiled here by NVRTC, or read from `$EDGE_CUDA_PTX_DIR/ARCH/NAME.ptx`.
#![cfg(feature = "cuda")]

use edge_e2e::*;
use edge_kernels_cuda::gpu::Gpu;
use edge_runtime::cuda::{CudaMath, CudaSession};
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{GenerateParams, Plan, Session};
use edge_schema::DType;

fn gpu() -> Option<Gpu> {
    Gpu::for_tests()
}

fn plan(name: &str, quant: Option<DType>) -> Plan {
    sized_plan(name, quant)
}

fn params(
    noise: &[f32],
    (w, h): (u32, u32),
    method: SamplingMethod,
    steps: usize,
) -> GenerateParams {
    // The fixtures' run ("a lovely cat", guidance 4.5, seed 0) at this size from this noise.
    GenerateParams {
        width: w,
        height: h,
        ..cat_params(steps, method, Some(noise.to_vec()))
    }
}

/// Runs `p` on the GPU; returns the outputs and the executor's one-line summary.
fn on_gpu(
    plan: &Plan,
    g: Gpu,
    p: &GenerateParams,
    math: CudaMath,
) -> (edge_runtime::Generated, String) {
    use edge_runtime::Executor;
    let host = Session::new(plan, edge_kernels_cpu::best(), None).unwrap();
    let mut c = CudaSession::new(host, g).unwrap();
    c.set_math(math);
    let out = edge_runtime::generate(&mut c, p, &mut |_| {}).unwrap();
    let counts = c.counts();
    assert!(
        counts.gpu_steps > counts.host_steps,
        "most steps run on the GPU: {counts:?}"
    );
    (out, c.device_summary().unwrap_or_default())
}

fn on_cpu(plan: &Plan, p: &GenerateParams) -> edge_runtime::Generated {
    let mut s = Session::new(plan, edge_kernels_cpu::best(), None).unwrap();
    edge_runtime::generate(&mut s, p, &mut |_| {}).unwrap()
}

fn matches_diffusers(name: &str, run: &str, method: SamplingMethod, steps: usize) {
    let Some(g) = gpu() else { return };
    let plan = plan(name, None);
    let r = read_safetensors(&fixture(&format!(
        "{name}/reference/pipeline_{run}.safetensors"
    )));
    let noise = &r["initial_noise"];
    let (h, w) = (noise.shape[2], noise.shape[3]);
    let p = params(&noise.data, ((w * 8) as u32, (h * 8) as u32), method, steps);
    let (out, summary) = on_gpu(&plan, g, &p, CudaMath::Fast);
    let cpu = on_cpu(&plan, &p);
    eprintln!(
        "{name} {run}: GPU vs diffusers rel max {:.3e}, GPU vs CPU rel max {:.3e} rel L2 {:.3e}; {summary}",
        rel_max_err(&out.latents, &r["final_latents"].data),
        rel_max_err(&out.latents, &cpu.latents),
        rel_l2(&out.latents, &cpu.latents)
    );
    assert_close(
        &format!("{name} {run} final latents on the GPU"),
        &out.latents,
        &r["final_latents"].data,
        1e-3,
    );
    assert_png_close(
        &format!("{name} {run} on the GPU"),
        &out.rgb,
        &r["image_uint8"].data,
    );
}

#[test]
fn sigma_dpm_4_matches_diffusers_on_the_gpu() {
    matches_diffusers(
        "pixart-sigma-tiny",
        "dpm_4_cat_64x64",
        SamplingMethod::DpmPp2m,
        4,
    );
}

#[test]
fn sigma_nonsquare_matches_diffusers_on_the_gpu() {
    matches_diffusers(
        "pixart-sigma-tiny",
        "dpm_4_cat_w64_h96",
        SamplingMethod::DpmPp2m,
        4,
    );
}

#[test]
fn alpha_dpm_4_matches_diffusers_on_the_gpu() {
    matches_diffusers(
        "pixart-alpha-tiny",
        "dpm_4_cat_64x64",
        SamplingMethod::DpmPp2m,
        4,
    );
}

#[test]
fn sigma_euler_4_matches_diffusers_on_the_gpu() {
    matches_diffusers(
        "pixart-sigma-tiny",
        "euler_4_cat_64x64",
        SamplingMethod::Euler,
        4,
    );
}

/// Quantized plans: the GPU against the CPU on the same plan, 8 steps, square and non-square.
fn matches_cpu(name: &str, quant: DType, math: CudaMath, bound: f64) {
    if gpu().is_none() {
        return;
    }
    let plan = plan(name, Some(quant));
    for (size, method) in [
        ((64, 64), SamplingMethod::DpmPp2m),
        ((64, 96), SamplingMethod::Euler),
    ] {
        let n = 4 * (size.0 as usize / 8) * (size.1 as usize / 8);
        let noise: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let p = params(&noise, size, method, 8);
        let Some(g) = gpu() else { return };
        let (out, summary) = on_gpu(&plan, g, &p, math);
        let cpu = on_cpu(&plan, &p);
        let (l2, mx) = (
            rel_l2(&out.latents, &cpu.latents),
            rel_max_err(&out.latents, &cpu.latents),
        );
        eprintln!("{name} {quant:?} {math:?} {size:?} {method:?}: GPU vs CPU rel L2 {l2:.3e}, rel max {mx:.3e}; {summary}");
        assert!(
            l2 <= bound,
            "{name} {quant:?} {size:?}: GPU vs CPU rel L2 {l2:e} above {bound:e}"
        );
    }
}

/// Exact math: every product is the CPU's; only norms and attention reduce in another order.
#[test]
fn sigma_f16_plan_matches_the_cpu_in_exact_math() {
    matches_cpu("pixart-sigma-tiny", DType::F16, CudaMath::Exact, 1e-5);
}

/// Fast math: the denoiser's F16 products on tensor cores (activations rounded to F16).
#[test]
fn sigma_f16_plan_on_tensor_cores_stays_near_the_cpu() {
    matches_cpu("pixart-sigma-tiny", DType::F16, CudaMath::Fast, 1e-2);
}

#[test]
fn alpha_bf16_plan_on_tensor_cores_stays_near_the_cpu() {
    matches_cpu("pixart-alpha-tiny", DType::BF16, CudaMath::Fast, 3e-2);
}

/// Q8_0 products are the CPU's bits on tensor cores too (exact math: f32 attention).
#[test]
fn sigma_q8_0_plan_matches_the_cpu() {
    matches_cpu("pixart-sigma-tiny", DType::Q8_0, CudaMath::Exact, 1e-5);
}

/// Fast math: F16 attention in the denoiser of a Q8_0 plan.
#[test]
fn sigma_q8_0_plan_with_tensor_core_attention_stays_near_the_cpu() {
    matches_cpu("pixart-sigma-tiny", DType::Q8_0, CudaMath::Fast, 3e-2);
}

/// PixArt-α's Q8_0 plan: the activation quantizer turns the attention's and norms' last-bit
/// differences into whole quantization steps now and then (measured on an H200: rel L2 1.4e-3
/// at 64×64 after 8 steps).
#[test]
fn alpha_q8_0_plan_matches_the_cpu() {
    matches_cpu("pixart-alpha-tiny", DType::Q8_0, CudaMath::Exact, 5e-3);
}
