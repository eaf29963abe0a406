//! Graph weights resolved from a checkpoint's tensors: fused parts served whole or
//! concatenated, shapes checked, LoRA merged, every tensor checked once for non-finite values.

use edge_graph::WeightSpec;
use edge_schema::DType;

use crate::error::{PlanError, Result};
use crate::load::TensorSource;
use crate::lower::{LoadedWeight, WeightResolver};
use crate::progress::{CompileProgress, ProgressHook};

/// Resolves graph weights from one component's tensors (diffusers names), remembering which
/// tensors the graphs used (for [`SourceResolver::unused`]) and checking each once for
/// non-finite values.
pub struct SourceResolver<'a> {
    pub source: &'a dyn TensorSource,
    used: std::sync::Mutex<std::collections::BTreeSet<String>>,
    progress: ProgressHook,
    lora: Option<&'a crate::lora::LoraMerge>,
}

impl<'a> SourceResolver<'a> {
    /// A resolver over `source` that has used nothing yet.
    pub fn new(source: &'a dyn TensorSource) -> SourceResolver<'a> {
        SourceResolver {
            source,
            used: Default::default(),
            progress: ProgressHook::default(),
            lora: None,
        }
    }

    /// The resolver, merging `lora`'s updates into the weights it adapts.
    pub fn with_lora(mut self, lora: &'a crate::lora::LoraMerge) -> Self {
        self.lora = Some(lora);
        self
    }

    /// The resolver, reporting every weight it reads to `progress`.
    pub fn with_progress(mut self, progress: ProgressHook) -> Self {
        self.progress = progress;
        self
    }

    /// The source's tensors no graph asked for, sorted, leaving out those `ignored` accepts
    /// (parts of the checkpoint the plan does not contain by design).
    pub fn unused(&self, ignored: impl Fn(&str) -> bool) -> Vec<String> {
        let used = self.used.lock().map(|u| u.clone()).unwrap_or_default();
        self.source
            .names()
            .into_iter()
            .filter(|n| !used.contains(n) && !ignored(n))
            .collect()
    }

    /// Whether a graph asked for tensor `name`.
    pub fn was_used(&self, name: &str) -> bool {
        self.used.lock().is_ok_and(|u| u.contains(name))
    }

    /// Marks `names` used; true for those not used before (checked for finiteness then).
    fn first_use(&self, names: &[String]) -> bool {
        let Ok(mut used) = self.used.lock() else {
            return true;
        };
        let mut fresh = false;
        for n in names {
            fresh |= used.insert(n.clone());
        }
        fresh
    }

    /// Refuses a tensor holding NaN or infinity, naming the file, tensor and first index:
    /// sampling would otherwise diverge and blame the guidance scale.
    fn check_finite(&self, name: &str, t: &crate::load::RawTensor<'_>) -> Result<()> {
        let Some((i, v)) = first_non_finite(t) else {
            return Ok(());
        };
        Err(PlanError::Invalid(format!(
            "{}: tensor `{name}` (shape {:?}, {}) holds {v} at flat index {i}; weights must be finite",
            self.source.describe(),
            t.shape,
            t.dtype.name()
        )))
    }

    fn stored(&self, name: &str) -> String {
        match self.source.stored_name(name) {
            Some(s) => format!(" (stored as {s})"),
            None => String::new(),
        }
    }

    /// ` (stored as NAME)` with the whole stored tensor holding `name` (a fused tensor served
    /// whole), or nothing.
    fn stored_whole(&self, name: &str) -> String {
        match self.source.stored_whole_name(name) {
            Some(s) => format!(" (stored as {s})"),
            None => String::new(),
        }
    }
}

impl WeightResolver for SourceResolver<'_> {
    /// Fused specs (several parts) are first asked of [`TensorSource::fused`], so a tensor
    /// stored fused (original PixArt `attn.qkv`) is served whole, in its stored type; else
    /// the parts are read one by one and concatenated along axis 0.
    ///
    /// Errors: [`PlanError::MissingWeight`] naming the missing tensor, the file, its stored
    /// name when it differs, and the expected shape; [`PlanError::WeightShape`] naming the part whose shape disagrees.
    fn resolve(&self, spec: &WeightSpec, shape: &[u64]) -> Result<LoadedWeight> {
        let w = self.resolve_quietly(spec, shape)?;
        let w = self.merge_lora(spec, w)?;
        self.progress.report(CompileProgress::Read {
            bytes: w.bytes.len() as u64,
        });
        Ok(w)
    }
}

impl SourceResolver<'_> {
    /// [`WeightResolver::resolve`] without the progress report.
    fn resolve_quietly(&self, spec: &WeightSpec, shape: &[u64]) -> Result<LoadedWeight> {
        let found_of = |t: &crate::load::RawTensor<'_>| -> Vec<u64> {
            t.shape.iter().map(|&d| d as u64).collect()
        };
        let shape_err =
            |name: String, found: Vec<u64>, expected: Vec<u64>| PlanError::WeightShape {
                tensor: name,
                source_desc: self.source.describe(),
                found,
                expected,
            };
        if spec.parts.is_empty() {
            return Err(PlanError::Internal("weight spec without parts".into()));
        }
        if spec.parts.len() > 1 {
            if let Some(t) = self.source.fused(&spec.parts)? {
                let found = found_of(&t);
                if found != shape {
                    let name = format!(
                        "{}{}",
                        spec.parts.join(" + "),
                        self.stored_whole(&spec.parts[0])
                    );
                    return Err(shape_err(name, found, shape.to_vec()));
                }
                if self.first_use(&spec.parts) {
                    let name = format!(
                        "{}{}",
                        spec.parts.join(" + "),
                        self.stored_whole(&spec.parts[0])
                    );
                    self.check_finite(&name, &t)?;
                }
                return Ok(LoadedWeight {
                    dtype: t.dtype,
                    shape: shape.to_vec(),
                    bytes: t.data.to_vec(),
                    checkpoint_dtype: t.dtype,
                });
            }
        }
        // The parts split the fused tensor along axis 0 into equal pieces (q/k/v, k/v):
        // each must agree with it on every other axis and hold its share of the rows.
        let n = spec.parts.len().max(1) as u64;
        let mut expected = shape.to_vec();
        if let Some(rows) = expected.first_mut() {
            *rows /= n;
        }
        let mut parts = Vec::with_capacity(spec.parts.len());
        for name in &spec.parts {
            let t = self
                .source
                .tensor(name)?
                .ok_or_else(|| PlanError::MissingWeight {
                    tensor: name.clone(),
                    source_desc: format!(
                        "{}{}; expected shape {expected:?}",
                        self.source.describe(),
                        self.stored(name)
                    ),
                })?;
            let found = found_of(&t);
            if found != expected {
                return Err(shape_err(
                    format!("{name}{}", self.stored(name)),
                    found,
                    expected.clone(),
                ));
            }
            if self.first_use(std::slice::from_ref(name)) {
                self.check_finite(&format!("{name}{}", self.stored(name)), &t)?;
            }
            parts.push(t);
        }
        let same_dtype = parts.iter().all(|t| t.dtype == parts[0].dtype);
        let (dtype, bytes) = if same_dtype {
            let mut b = Vec::new();
            for t in &parts {
                b.extend_from_slice(t.data);
            }
            (parts[0].dtype, b)
        } else {
            let mut b = Vec::new();
            for t in &parts {
                for x in crate::load::to_f32(t) {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
            (DType::F32, b)
        };
        Ok(LoadedWeight {
            dtype,
            shape: shape.to_vec(),
            bytes,
            checkpoint_dtype: dtype,
        })
    }

    /// Merges the LoRA updates of `spec`'s parts (each part's rows in turn) into `w`, in f32;
    /// `w` is returned unchanged when no part is adapted. Errors where a merged weight is not
    /// finite ([`crate::lora::LoraMerge::apply`]).
    fn merge_lora(&self, spec: &WeightSpec, w: LoadedWeight) -> Result<LoadedWeight> {
        let Some(lora) = self.lora else {
            return Ok(w);
        };
        if !spec.parts.iter().any(|p| lora.touches(p)) {
            return Ok(w);
        }
        let dims: Vec<usize> = w.shape.iter().map(|&d| d as usize).collect();
        let mut f = crate::load::to_f32(&crate::load::RawTensor {
            dtype: w.dtype,
            shape: dims,
            data: &w.bytes,
        });
        let part_len = f.len() / spec.parts.len().max(1);
        for (part, rows) in spec.parts.iter().zip(f.chunks_exact_mut(part_len.max(1))) {
            lora.apply(part, rows)?;
        }
        Ok(LoadedWeight {
            dtype: DType::F32,
            shape: w.shape,
            bytes: f.iter().flat_map(|x| x.to_le_bytes()).collect(),
            checkpoint_dtype: w.checkpoint_dtype,
        })
    }
}

/// The first value of `t` that is NaN or infinite, with its flat index (row-major); block
/// types are dequantized to find it (a NaN scale poisons its whole block).
fn first_non_finite(t: &crate::load::RawTensor<'_>) -> Option<(usize, f32)> {
    let bits16 = |exp_mask: u16, f: fn(u16) -> f32| {
        t.data
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .position(|h| h & exp_mask == exp_mask)
            .map(|i| {
                let c = &t.data[2 * i..2 * i + 2];
                (i, f(u16::from_le_bytes([c[0], c[1]])))
            })
    };
    match t.dtype {
        DType::F32 => t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .enumerate()
            .find(|(_, v)| !v.is_finite()),
        DType::F16 => bits16(0x7c00, |h| half::f16::from_bits(h).to_f32()),
        DType::BF16 => bits16(0x7f80, |h| half::bf16::from_bits(h).to_f32()),
        DType::I32 => None,
        _ => crate::load::to_f32(t)
            .into_iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite()),
    }
}
