//! Where a GPU plan's stages run (`edgeplan compile --target cuda-smXX --max-vram B`), decided
//! when the plan is laid out: every stage on the GPU when the budget holds them; the text
//! encoder on the CPU cores when only the rest fits; refused, naming both figures, when not
//! even that fits. No GPU needed: the placement is the planner's.

use edge_e2e::*;
use edge_schema::plan::{CudaModule, CudaModules, PlanMeta, StageKind};

fn compiled(vram: Option<u64>) -> Result<PlanMeta, String> {
    let opts = edge_planner::CompileOptions {
        sizes: vec![(64, 64)],
        cuda: Some(CudaModules {
            arch: "sm_87".into(),
            compiler: "NVRTC 12.6".into(),
            modules: vec![CudaModule {
                name: "linear.cu".into(),
                source_digest: [0; 32],
                ptx: ".version 8.5".into(),
            }],
            vram_budget: vram,
            host_stages: Vec::new(),
            device_bytes: 0,
        }),
        ..Default::default()
    };
    let mut c = edge_planner::compile_folder(&fixture("pixart-sigma-tiny"), &opts)
        .map_err(|e| e.to_string())?;
    let bytes = edge_planner::write::assemble(&mut c.meta, &c.table).map_err(|e| e.to_string())?;
    let plan = edge_runtime::Plan::from_bytes(&bytes).map_err(|e| e.to_string())?;
    Ok(plan.meta().clone())
}

#[test]
fn the_text_encoder_moves_to_the_cpu_cores_only_when_the_gpu_budget_needs_it() {
    let free = compiled(None).unwrap();
    let text: Vec<u32> = free
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind == StageKind::TextEncoder)
        .map(|(i, _)| i as u32)
        .collect();
    assert!(!text.is_empty());
    let all = edge_schema::memory::cuda_device_bytes(&free, &[]);
    let without = edge_schema::memory::cuda_device_bytes(&free, &text);
    assert!(
        without < all,
        "the text encoder holds weights: {without} < {all}"
    );
    let c = free.cuda.as_ref().unwrap();
    assert!(c.host_stages.is_empty());
    assert_eq!(c.device_bytes, all);

    let roomy = compiled(Some(all)).unwrap();
    assert!(roomy.cuda.as_ref().unwrap().host_stages.is_empty());

    let tight = compiled(Some(all - 1)).unwrap();
    let c = tight.cuda.as_ref().unwrap();
    assert_eq!(c.host_stages, text);
    assert_eq!(c.device_bytes, without);
    assert_eq!(c.vram_budget, Some(all - 1));
    let summary = edge_planner::inspect::summary(&tight, 0);
    assert!(
        summary.contains("on the CPU cores, the rest on the GPU")
            && summary.contains(&format!("the GPU needs {without} bytes")),
        "{summary}"
    );

    let e = compiled(Some(without - 1)).unwrap_err();
    assert!(
        e.contains(&format!("--max-vram {}", without - 1))
            && e.contains(&all.to_string())
            && e.contains(&without.to_string()),
        "{e}"
    );
}
