//! Checking a plan's [`Target`] against this CPU (DESIGN.md invariant 8).
//!
//! Every pack layout a planner writes (row-major ggml blocks, the `Interleaved4x8` repack of
//! `aarch64-neon` plans and the `Interleaved16x4` one of `x86_64-avx512` plans) is understood by
//! the generic kernels on any CPU; so a plan compiled for
//! another ISA still runs (that is how
//! `edgeplan verify` checks an aarch64 plan on the workstation). What a plan can demand is CPU
//! features for its packs: when it names features and runs on its own ISA, each must be
//! present, or the plan is refused with the missing features named, rather than silently
//! running slow or wrong code.

use edge_schema::plan::{Isa, Target};

use crate::error::{Error, Result};

/// The ISA this binary runs on.
pub fn host_isa() -> Isa {
    if cfg!(target_arch = "aarch64") {
        Isa::Aarch64
    } else if cfg!(target_arch = "x86_64") {
        Isa::X86_64
    } else {
        Isa::Generic
    }
}

/// Whether this CPU has `feature` (names as `is_aarch64_feature_detected!` /
/// `is_x86_feature_detected!` spell them); `None` for a name this runtime does not know. Reads
/// the process's one detection, [`edge_kernels::cpu::features`], which also picks the kernels.
fn has_feature(feature: &str) -> Option<bool> {
    edge_kernels::cpu::features().has(feature)
}

/// Refuses a plan whose packs need CPU features this CPU lacks (on the plan's own ISA).
pub fn check(target: &Target) -> Result<()> {
    if target.isa == Isa::Generic || target.isa != host_isa() {
        return Ok(());
    }
    let missing: Vec<&str> = target
        .features
        .iter()
        .filter(|f| has_feature(f) != Some(true))
        .map(|f| f.as_str())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Plan(edge_schema::Error::TargetMismatch {
            needed: target.to_string(),
            found: format!("a CPU without {}", missing.join(", ")),
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn generic_and_foreign_plans_run_and_missing_features_are_named() {
        assert!(check(&Target {
            isa: Isa::Generic,
            features: vec![]
        })
        .is_ok());
        let foreign = if host_isa() == Isa::Aarch64 {
            Isa::X86_64
        } else {
            Isa::Aarch64
        };
        assert!(check(&Target {
            isa: foreign,
            features: vec!["sve9".into()]
        })
        .is_ok());
        let err = check(&Target {
            isa: host_isa(),
            features: vec!["no-such-feature".into()],
        })
        .unwrap_err();
        assert!(err.to_string().contains("no-such-feature"), "{err}");
    }
}
