//! Weight packing: choose each tensor's stored type and convert its bytes.
//!
//! Rules (DESIGN.md invariant 4): only matrices (Linear weights) are ever quantized; norms,
//! biases, embeddings, element-wise tables and position tables stay f32 (embeddings and
//! convolution kernels may stay f16/bf16 when the checkpoint has them so). A quantized type
//! whose block size does not divide the row length falls back to the nearest type that fits
//! (Q*_K → Q8_0-family → F16), and every fallback is recorded.
//! Tensors already stored in the chosen type (e.g. a GGUF Q8_0 matrix with `--quant q8_0`, or
//! any quantized GGUF tensor when no type is asked for) pass through without requantization.

use edge_graph::WeightKind;
use edge_schema::DType;

/// How to choose weight types.
#[derive(Clone, Debug, Default)]
pub struct PackPolicy {
    /// Type for matrices; `None` keeps each matrix's checkpoint type.
    pub default: Option<DType>,
    /// `(pattern, type)` overrides, first match wins. A pattern matches a tensor name when the
    /// name contains it, or, with `*` wildcards, when the wildcard pattern matches the whole name.
    pub rules: Vec<(String, DType)>,
}

/// A type choice that differs from what was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub tensor: String,
    pub asked: DType,
    pub used: DType,
    pub reason: String,
}

/// Whether `name` matches `pattern` (substring, or `*` glob over the whole name).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    if !pattern.contains('*') {
        return name.contains(pattern);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = name;
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            if !rest.starts_with(p) {
                return false;
            }
            rest = &rest[p.len()..];
        } else if i == parts.len() - 1 {
            return rest.ends_with(p);
        } else if let Some(pos) = rest.find(p) {
            rest = &rest[pos + p.len()..];
        } else {
            return false;
        }
    }
    true
}

fn fits(d: DType, row: u64) -> bool {
    row.is_multiple_of(d.block_size() as u64)
}

/// The next type to try when `d` does not fit a row.
fn fallback_of(d: DType) -> DType {
    match d {
        DType::Q2K | DType::Q3K | DType::Q4K => DType::Q4_0,
        DType::Q5K => DType::Q5_0,
        DType::Q6K => DType::Q8_0,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => DType::F16,
        other => other,
    }
}

impl PackPolicy {
    /// The index of the rule that decides the type of a weight of `kind` named `name`: the
    /// first matching rule, for matrices only (other kinds are never quantized).
    pub fn rule_for(&self, name: &str, kind: WeightKind) -> Option<usize> {
        if kind != WeightKind::Matrix {
            return None;
        }
        self.rules
            .iter()
            .position(|(p, _)| pattern_matches(p, name))
    }

    /// Refuses rules that decided no weight's type (`applied` holds those that did): a rule
    /// that matches nothing, only weights that are never quantized, or only weights an
    /// earlier rule takes would otherwise be ignored without a word.
    pub fn check_rules_applied(
        &self,
        applied: &std::collections::BTreeSet<usize>,
    ) -> Result<(), crate::PlanError> {
        let unused: Vec<String> = self
            .rules
            .iter()
            .enumerate()
            .filter(|(i, _)| !applied.contains(i))
            .map(|(_, (p, d))| format!("`{p}={}`", d.name()))
            .collect();
        if unused.is_empty() {
            return Ok(());
        }
        Err(crate::PlanError::Invalid(format!(
            "--quant-rule {}: decides the type of no matrix weight of this model (a rule applies to matrix weights whose diffusers name contains the pattern or matches its * glob, e.g. `transformer_blocks.*.ff.*` or `attn2`; norms, biases, embeddings and tables are never quantized; the first matching rule wins); fix or remove it",
            unused.join(", ")
        )))
    }

    /// The stored type for a tensor of `kind` named `name`, whose checkpoint type is `source`
    /// and whose rows have `row` elements. Returns the type and a fallback record if the asked
    /// type could not be used.
    pub fn choose(
        &self,
        name: &str,
        kind: WeightKind,
        source: DType,
        row: u64,
    ) -> (DType, Option<Fallback>) {
        match kind {
            WeightKind::Vector | WeightKind::Table => return (DType::F32, None),
            WeightKind::Embedding | WeightKind::ConvKernel => {
                let d = match source {
                    DType::F16 | DType::BF16 if kind == WeightKind::Embedding => source,
                    DType::F16 if kind == WeightKind::ConvKernel => source,
                    _ => DType::F32,
                };
                return (d, None);
            }
            WeightKind::Matrix => {}
        }
        let asked = self
            .rules
            .iter()
            .find(|(p, _)| pattern_matches(p, name))
            .map(|(_, d)| *d)
            .or(self.default);
        let Some(asked) = asked else {
            return (source, None);
        };
        let mut d = asked;
        while !fits(d, row) {
            d = fallback_of(d);
        }
        if d == asked {
            (d, None)
        } else {
            (
                d,
                Some(Fallback {
                    tensor: name.to_string(),
                    asked,
                    used: d,
                    reason: format!(
                        "rows of {row} elements are not a multiple of {}'s block size {}",
                        asked,
                        asked.block_size()
                    ),
                }),
            )
        }
    }
}

/// Converts `data` (type `from`, `n` elements, rows of `row` elements) to type `to`.
/// Identical types pass through untouched.
pub fn convert(data: &[u8], from: DType, to: DType, n: usize) -> Vec<u8> {
    if from == to {
        return data.to_vec();
    }
    let mut f = vec![0f32; n];
    edge_kernels::quant::dequantize_row(from, data, &mut f);
    let bytes = to.bytes_for(n as u64).unwrap_or(0) as usize;
    let mut out = vec![0u8; bytes];
    edge_kernels::quant::quantize_row(to, &f, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_quantizes_vectors_and_tables() {
        let p = PackPolicy {
            default: Some(DType::Q8_0),
            rules: vec![],
        };
        assert_eq!(
            p.choose("x.bias", WeightKind::Vector, DType::F32, 64).0,
            DType::F32
        );
        assert_eq!(
            p.choose("t", WeightKind::Table, DType::F16, 64).0,
            DType::F32
        );
        assert_eq!(
            p.choose("w", WeightKind::Matrix, DType::F32, 64).0,
            DType::Q8_0
        );
    }

    #[test]
    fn falls_back_when_blocks_do_not_divide_rows() {
        let p = PackPolicy {
            default: Some(DType::Q4K),
            rules: vec![("mlp".into(), DType::Q8_0)],
        };
        let (d, fb) = p.choose("attn", WeightKind::Matrix, DType::F32, 64);
        assert_eq!(d, DType::Q4_0);
        assert!(fb.is_some());
        let (d, fb) = p.choose("mlp.fc1", WeightKind::Matrix, DType::F32, 48);
        assert_eq!(d, DType::F16);
        assert_eq!(fb.map(|f| f.asked), Some(DType::Q8_0));
        assert_eq!(
            p.choose("mlp", WeightKind::Matrix, DType::F32, 256).0,
            DType::Q8_0
        );
    }

    #[test]
    fn globs() {
        assert!(pattern_matches("blocks.*.attn*", "blocks.3.attn.qkv"));
        assert!(!pattern_matches("blocks.*.mlp", "blocks.3.attn"));
        assert!(pattern_matches("attn", "blocks.3.attn.qkv"));
    }
}
