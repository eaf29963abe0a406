//! Where a GPU plan's stages run (`edgeplan compile --target cuda-smXX --max-vram B`): on the
//! GPU, unless the budget cannot hold the text encoder beside the denoiser and the VAE; then
//! the text encoder's stages run on the device's CPU cores (their weights stay in the mapped
//! plan) and only the rest must fit. Decided when the plan is laid out, recorded in
//! [`CudaModules`], shown by `edgeplan inspect`, and followed by the CUDA executor.

use edge_schema::memory::cuda_device_bytes as device_bytes;
use edge_schema::plan::{CudaModules, PlanMeta, StageKind};

use crate::error::{PlanError, Result};

/// Decides `meta.cuda`'s placement for its `vram_budget` (nothing to do for a CPU plan).
///
/// # Errors
/// [`PlanError::Invalid`] naming both figures when even the denoiser and the VAE alone
/// exceed the budget.
pub fn place(meta: &mut PlanMeta) -> Result<()> {
    let Some(budget) = meta.cuda.as_ref().map(|c| c.vram_budget) else {
        return Ok(());
    };
    let all = device_bytes(meta, &[]);
    let text: Vec<u32> = meta
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind == StageKind::TextEncoder)
        .map(|(i, _)| i as u32)
        .collect();
    let (host, need) = match budget {
        Some(b) if all > b => {
            let without = device_bytes(meta, &text);
            if without > b {
                return Err(PlanError::Invalid(format!(
                    "--max-vram {b}: the GPU needs {all} bytes with the text encoder, {without} without it (on the CPU cores); raise --max-vram or quantize (--quant q8_0)"
                )));
            }
            (text, without)
        }
        _ => (Vec::new(), all),
    };
    if let Some(c) = meta.cuda.as_mut() {
        set(c, host, need);
    }
    Ok(())
}

fn set(c: &mut CudaModules, host: Vec<u32>, need: u64) {
    c.host_stages = host;
    c.device_bytes = need;
}
