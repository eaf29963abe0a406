//! torch's CPU generator against the stored torch 2.15 draws (`tests/fixtures/rng/`, README
//! §9): the raw MT19937 outputs, every `torch.randn` draw on both of torch's paths bit for bit
//! (seeds above 2³², shapes below and above 16 elements, consecutive draws on one generator
//! with the cached normal), and the `seeded/` pipelines: `--rng torch-cpu -s S` without
//! initial latents gives diffusers' run for seed S.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use edge_e2e::{assert_close, compiled_plan, fixture, read_safetensors};
use edge_runtime::rng::{Mt19937, NoiseRng, TorchCpuGenerator, TorchPath};
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{GenerateParams, Plan, Session};

/// Every tensor of the rng fixture with its raw little-endian bytes.
fn raw_tensors() -> HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(fixture("rng/torch_cpu_randn.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The index of the first element whose bits differ, with both values.
fn first_difference(ours: &[f32], theirs: &[f32]) -> Option<(usize, f32, f32)> {
    ours.iter()
        .zip(theirs)
        .enumerate()
        .find(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(i, (a, b))| (i, *a, *b))
}

#[test]
fn mt19937_outputs_match_torch() {
    let t = raw_tensors();
    let mut n = 0;
    for (name, (dtype, _, data)) in &t {
        let Some(seed) = name.strip_prefix("mt19937_u32.seed") else {
            continue;
        };
        assert_eq!(*dtype, safetensors::Dtype::I64);
        let seed: u64 = seed.parse().unwrap();
        let mut g = Mt19937::new(seed as u32);
        for (i, c) in data.chunks_exact(8).enumerate() {
            let want = i64::from_le_bytes(c.try_into().unwrap());
            assert_eq!(i64::from(g.next_u32()), want, "{name}[{i}]");
        }
        n += 1;
    }
    assert!(n >= 2, "only {n} engine streams in the fixture");
}

#[test]
fn randn_matches_torch_bit_for_bit_on_both_paths() {
    let t = raw_tensors();
    let mut checked = 0usize;
    // Single draws: `randn.seed<S>.<shape>.draw0`, `randn_default.…`.
    for (prefix, path) in [
        ("randn.seed", TorchPath::Avx2),
        ("randn_default.seed", TorchPath::Default),
    ] {
        for (name, (dtype, shape, data)) in &t {
            let Some(rest) = name.strip_prefix(prefix) else {
                continue;
            };
            assert_eq!(*dtype, safetensors::Dtype::F32, "{name}");
            let seed: u64 = rest.split('.').next().unwrap().parse().unwrap();
            let want = f32s(data);
            assert_eq!(want.len(), shape.iter().product::<usize>());
            let mut ours = vec![0f32; want.len()];
            TorchCpuGenerator::manual_seed(seed).randn(&mut ours, path);
            assert_eq!(first_difference(&ours, &want), None, "{name}");
            checked += 1;
        }
    }
    // Consecutive draws on one generator: `randn[_default].consecutive.seed<S>.draw<K>`.
    for (prefix, path) in [
        ("randn.consecutive.seed", TorchPath::Avx2),
        ("randn_default.consecutive.seed", TorchPath::Default),
    ] {
        let mut seeds: Vec<u64> = t
            .keys()
            .filter_map(|n| n.strip_prefix(prefix))
            .map(|r| r.split('.').next().unwrap().parse().unwrap())
            .collect();
        seeds.sort_unstable();
        seeds.dedup();
        assert!(seeds.len() >= 3, "{prefix}: {seeds:?}");
        for seed in seeds {
            let mut g = TorchCpuGenerator::manual_seed(seed);
            for k in 0.. {
                let Some((_, shape, data)) = t.get(&format!("{prefix}{seed}.draw{k}")) else {
                    assert!(k >= 2, "{prefix}{seed}: {k} draws");
                    break;
                };
                let want = f32s(data);
                assert_eq!(want.len(), shape.iter().product::<usize>());
                let mut ours = vec![0f32; want.len()];
                g.randn(&mut ours, path);
                assert_eq!(
                    first_difference(&ours, &want),
                    None,
                    "{prefix}{seed}.draw{k}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "only {checked} draws checked");
}

#[test]
fn only_the_low_32_bits_of_a_seed_count_as_in_torch() {
    let draw = |seed: u64| {
        let mut v = vec![0f32; 64];
        NoiseRng::TorchCpu.fill(seed, &mut v);
        v
    };
    assert_eq!(draw(1_234_567_890_123), draw(1_912_276_171));
    assert_eq!(draw((1 << 40) + 7), draw(7));
    assert_eq!(draw(1 << 32), draw(0));
    assert_ne!(draw(1), draw(2));
}

/// `seeded/`: the pipeline with no latents and `generator=manual_seed(s)`.
fn seeded_matches(run: &str, method: SamplingMethod, steps: usize, seed: u64) {
    let r = read_safetensors(&fixture(&format!("seeded/pipeline_{run}.safetensors")));
    let noise = &r["initial_noise"];
    let (h, w) = (noise.shape[2], noise.shape[3]);
    // The noise itself, bit for bit.
    let mut ours = vec![0f32; noise.data.len()];
    NoiseRng::TorchCpu.fill(seed, &mut ours);
    assert_eq!(
        first_difference(&ours, &noise.data),
        None,
        "{run}: initial noise"
    );
    let bytes = compiled_plan(&fixture("pixart-sigma-tiny"), &[(64, 64), (64, 96)], None);
    let plan = Plan::from_bytes(&bytes).unwrap();
    let mut s = Session::new(&plan, edge_kernels::generic(), None).unwrap();
    let params = GenerateParams {
        prompt: "a lovely cat".into(),
        negative_prompt: String::new(),
        steps,
        cfg_scale: 4.5,
        method,
        seed,
        width: (w * 8) as u32,
        height: (h * 8) as u32,
        rng: NoiseRng::TorchCpu,
        karras: None,
        init_latents: None,
        init_image: None,
        decoder: Default::default(),
        preview: None,
    };
    let out = edge_runtime::generate(&mut s, &params, &mut |_| {}).unwrap();
    let refl = &r["final_latents"].data;
    let err = edge_e2e::rel_max_err(&out.latents, refl);
    eprintln!("seeded {run}: final latents max |diff| / max(1, max|ref|) = {err:.2e}");
    assert_close(
        &format!("seeded {run} final latents"),
        &out.latents,
        &r["final_latents"].data,
        1e-3,
    );
    edge_e2e::assert_png_close(&format!("seeded {run}"), &out.rgb, &r["image_uint8"].data);
}

#[test]
fn seed_42_gives_diffusers_image_dpm_20() {
    seeded_matches("dpm_20_cat_seed42_64x64", SamplingMethod::DpmPp2m, 20, 42);
    seeded_matches("dpm_20_cat_seed42_w64_h96", SamplingMethod::DpmPp2m, 20, 42);
}

#[test]
fn seed_7_gives_diffusers_image_dpm_20() {
    seeded_matches("dpm_20_cat_seed7_64x64", SamplingMethod::DpmPp2m, 20, 7);
    seeded_matches("dpm_20_cat_seed7_w64_h96", SamplingMethod::DpmPp2m, 20, 7);
}

#[test]
fn seeds_give_diffusers_images_euler_8() {
    for seed in [42, 7] {
        for size in ["64x64", "w64_h96"] {
            seeded_matches(
                &format!("euler_8_cat_seed{seed}_{size}"),
                SamplingMethod::Euler,
                8,
                seed,
            );
        }
    }
}
