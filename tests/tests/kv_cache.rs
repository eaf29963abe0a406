//! The cross-attention K/V cache (issue 17): held once in the cross-K/V stage (its per-block
//! parts are placed inside the cache, the concatenation copies nothing), and typed
//! (`--kv-cache-type f16|q8_0`) within a stated bound of the f32 cache. (The f32 cache's
//! agreement with diffusers is checked stage by stage in `pipeline.rs`.)

use edge_e2e::*;
use edge_planner::CompileOptions;
use edge_runtime::pipeline::{condition, encode_text};
use edge_runtime::tokenizer::Tokenizer;
use edge_runtime::{Plan, Session};
use edge_schema::op::Op;
use edge_schema::plan::StageKind;
use edge_schema::DType;

fn plan_with(cache: DType) -> Plan {
    let opts = CompileOptions {
        sizes: vec![(64, 64)],
        kv_cache: cache,
        ..Default::default()
    };
    let mut c = edge_planner::compile_folder(&demo("pixart-shapes-64"), &opts).unwrap();
    Plan::from_bytes(&edge_planner::write::assemble(&mut c.meta, &c.table).unwrap()).unwrap()
}

fn latents(plan: &Plan) -> Vec<f32> {
    let mut s = Session::new(plan, edge_kernels::generic(), None).unwrap();
    edge_runtime::generate(&mut s, &demo_params(4), &mut |_| {})
        .unwrap()
        .latents
}

/// The cross-K/V cache of `plan` for the test prompt, dequantized to f32 `[L·seq, 2D]`, and
/// its row width.
fn cache_of(plan: &Plan) -> (Vec<f32>, usize) {
    let mut s = Session::new(plan, edge_kernels::generic(), None).unwrap();
    let tok = Tokenizer::new(&plan.meta().tokenizer).unwrap();
    let (hidden, mask, _) = encode_text(&mut s, &tok, &demo_params(4).prompt).unwrap();
    let cond = condition(&mut s, hidden, mask).unwrap();
    let meta = plan.meta();
    let st = &meta.stages[meta.cross_kv_stage.unwrap() as usize];
    let v = &st.values[st.outputs[0] as usize];
    let n = v.shape.iter().product::<u64>() as usize;
    let mut out = vec![0f32; n];
    edge_kernels::quant::dequantize_row(v.dtype, cond.context.as_bytes(), &mut out);
    (out, v.shape[1] as usize)
}

#[test]
fn the_cross_kv_stage_holds_the_cache_once() {
    for cache in [DType::F32, DType::F16, DType::Q8_0] {
        let plan = plan_with(cache);
        let meta = plan.meta();
        let st = &meta.stages[meta.cross_kv_stage.unwrap() as usize];
        let out = &st.values[st.outputs[0] as usize];
        assert_eq!(out.dtype, cache);
        let bytes = out.byte_len().unwrap();
        let concat = st
            .steps
            .iter()
            .find(|s| matches!(s.op, Op::Concat { .. }))
            .expect("the demo has more than one block");
        assert!(
            edge_schema::verify::in_place_concat(st, concat),
            "{cache}: the per-block parts are not placed inside the cache"
        );
        // Before: the parts and their concatenation, 2× the cache. Now the cache once, plus
        // the caption projection `[seq, D]` and (typed) one block's f32 keys and values
        // `[seq, 2D]` before they are stored, and the f32 linear's packed weight panels
        // (`PANEL_SLOTS` column tasks of `panel_cols(D)` output columns of `D` f32,
        // `linear_scratch_bytes`); 64-byte alignment of each.
        let blocks = concat.inputs.len() as u64;
        let f32_part = 4 * out.shape.iter().product::<u64>() / blocks;
        let extra = if cache == DType::F32 { 0 } else { f32_part };
        let d = out.shape[1] / 2;
        let panel =
            (edge_kernels::PANEL_SLOTS * edge_kernels::panel_cols(d as usize)) as u64 * 4 * d;
        let bound = bytes + f32_part / 2 + extra + panel + 4 * 64;
        assert!(
            st.arena_size <= bound,
            "{cache}: arena {} bytes for a cache of {bytes} (bound {bound})",
            st.arena_size
        );
        assert!(
            st.arena_size < 2 * bytes + panel,
            "{cache}: the cache is held twice"
        );
        // Every denoiser reads the cache in the type the cross-K/V stage writes.
        for d in meta.stages.iter().filter(|s| s.kind == StageKind::Denoiser) {
            assert_eq!(d.values[d.inputs[2] as usize].dtype, cache);
        }
    }
}

#[test]
fn typed_caches_stay_within_their_bound() {
    let (exact, width) = cache_of(&plan_with(DType::F32));
    assert_eq!(width % 32, 0);
    // F16: each value rounded to nearest even: within 2⁻¹¹ relatively (half an ulp), plus
    // half the smallest subnormal step.
    let (f16, _) = cache_of(&plan_with(DType::F16));
    for (i, (&x, &y)) in exact.iter().zip(&f16).enumerate() {
        let bound = x.abs() * 2f32.powi(-11) + 2f32.powi(-25);
        assert!((x - y).abs() <= bound, "f16 value {i}: {x} stored as {y}");
    }
    // Q8_0: x ≈ d·q with d = amax/127 stored as f16; the rounding of x/d (≤ d/2) plus the
    // scale's f16 rounding (≤ 127·d·2⁻¹¹) stay within amax/200.
    let (q8, _) = cache_of(&plan_with(DType::Q8_0));
    for (b, (xs, ys)) in exact.chunks(32).zip(q8.chunks(32)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (&x, &y) in xs.iter().zip(ys) {
            assert!(
                (x - y).abs() <= amax / 200.0,
                "q8_0 block {b}: {x} stored as {y} (amax {amax})"
            );
        }
    }
    // The whole pipeline: 4 DPM++ steps with guidance from the same seed.
    let reference = latents(&plan_with(DType::F32));
    for (cache, bound) in [(DType::F16, 1e-3), (DType::Q8_0, 2e-2)] {
        let got = latents(&plan_with(cache));
        let r = rel_l2(&got, &reference);
        println!("{cache}: final latents rel_l2 {r:.3e} against the f32 cache");
        assert!(
            r > 0.0,
            "{cache}: no difference at all: the cache type is not used"
        );
        assert!(r <= bound, "{cache}: rel_l2 {r} above {bound}");
    }
}
