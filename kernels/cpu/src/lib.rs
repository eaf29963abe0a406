//! Kernel selection in one place: [`best`] is [`edge_kernels::generic`] with the plugs of this
//! CPU's architecture applied (the NEON crate's on aarch64, the x86 crate's on x86-64), chosen
//! from the features [`edge_kernels::cpu::features`] detected once per process. The runtime's
//! plan target check and `edgerun -v` read the same detection.
//!
//! A new CPU backend plugs in here: a crate that turns [`Features`] into kernel tables (each
//! slot tested against its generic twin), listed in [`variants`].
#![forbid(unsafe_code)]

pub use edge_kernels::cpu::{features, Features};
use edge_kernels::KernelTable;
use edge_schema::plan::PackLayout;
use edge_schema::DType;

/// Every kernel table this CPU can run, `("generic", generic())` first and [`best`]'s choice
/// last, each with a short label (`"neon+dotprod"`, `"avx512+vnni"`, …). Tests run all of them.
pub fn variants() -> Vec<(&'static str, KernelTable)> {
    let mut v = vec![("generic", edge_kernels::generic())];
    if cfg!(target_arch = "aarch64") {
        v.extend(edge_kernels_neon::variants());
    }
    v.extend(edge_kernels_x86::variants(&features()));
    v
}

/// Every label [`variants`] can give on some CPU this build targets, the CPU-independent
/// `"generic"` first: what `--kernels` accepts besides `best`, whether or not this CPU has it.
pub const TABLE_LABELS: &[&str] = &[
    "generic",
    "avx2",
    "avx512",
    "avx512+vnni",
    "avx512+vnni+bf16",
    "avx512+vnni+bf16+amx",
    "neon",
    "neon+dotprod",
    "neon+i8mm",
];

/// The fastest kernel table for this CPU (the last of [`variants`]).
pub fn best() -> KernelTable {
    best_labelled().1
}

/// [`best`] with its label (`"generic"` when no SIMD table applies).
pub fn best_labelled() -> (&'static str, KernelTable) {
    variants()
        .pop()
        .unwrap_or(("generic", edge_kernels::generic()))
}

/// The kernel that the `linear` slot of `table` runs for weights of type `dtype` stored in
/// `layout` (`avx512vnni_linear_q32_panel_6x32`, `neon_linear_q8_0_dotprod_x4`,
/// `generic_linear_f32`, …). Panics, with the `linear` kernels' message, for a type that cannot
/// be in `layout`.
pub fn linear_variant_name(table: &KernelTable, dtype: DType, layout: PackLayout) -> &'static str {
    assert!(
        edge_kernels::pack::holds(layout, dtype),
        "linear: {dtype:?} weights cannot be in layout {layout:?}"
    );
    edge_kernels_x86::linear_variant_name(table, dtype, layout)
        .unwrap_or_else(|| edge_kernels_neon::linear_layout_variant_name(table, dtype, layout))
}

/// Peak throughput of one core ([`edge_kernels_x86::Peak`]; all `None` off x86-64 for now).
pub use edge_kernels_x86::Peak;

/// Measures [`Peak`] on the calling thread (`iters` ≈ 20 million: about 0.1 s).
pub fn peak(iters: usize) -> Peak {
    edge_kernels_x86::peak(&features(), iters)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_variant_label_is_listed() {
        for (label, _) in super::variants() {
            assert!(
                super::TABLE_LABELS.contains(&label),
                "{label} is missing from TABLE_LABELS"
            );
        }
    }
}
