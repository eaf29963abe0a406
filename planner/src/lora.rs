//! LoRA adapters merged into the transformer's weights at plan time (`edgeplan compile
//! --lora FILE[:MULTIPLIER]`).
//!
//! A LoRA replaces a linear layer's weight `W [out, in]` (outermost-first) by
//! `W' = W + (B @ A) · (m · alpha / r)` with `A [r, in]`, `B [out, r]`, rank `r`, the file's
//! `alpha` (the rank when the file has none) and the user's multiplier `m` — what PEFT's
//! `merge()` computes and what PEFT's unmerged forward `W x + (B (A x)) · m · alpha / r`
//! equals up to rounding. The merge is done in f32 before packing, so quantization
//! (`--quant`) applies to the merged weight.
//!
//! Two key formats are read (safetensors files):
//!
//! - **PEFT / diffusers**: `<prefix>.<module>.lora_A.weight` (= A), `….lora_B.weight` (= B),
//!   optional `….alpha`; the prefix is `transformer.` (diffusers), `base_model.model.` (PEFT's
//!   own `save_pretrained`) or none.
//! - **kohya** (sd-scripts, A1111, ComfyUI): `lora_unet_<module with . → _>.lora_down.weight`
//!   (= A), `….lora_up.weight` (= B), `….alpha` (0-d); `lora_transformer_` is accepted as the
//!   prefix too.
//!
//! A module is one of the transformer's linear layers under its diffusers name
//! (`transformer_blocks.0.attn1.to_q`). Keys that name no layer, other adapter kinds (LoCon
//! mid weights, LoHa, LoKr, DoRA magnitudes), a missing half, ranks that disagree between A
//! and B and shapes that disagree with the layer are errors naming the file and the keys.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use edge_schema::plan::LoraInfo;

use crate::error::{PlanError, Result};
use crate::load::safetensors::SafetensorsFile;
use crate::load::{to_f32, TensorSource};

/// One `--lora` argument.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraRequest {
    pub path: PathBuf,
    /// The user's strength `m` (1 when not given).
    pub multiplier: f32,
}

impl LoraRequest {
    /// Parses `FILE[:MULTIPLIER]`: the text after the last `:` is the multiplier when it is a
    /// number (a path that itself contains `:` and names an existing file is taken whole).
    ///
    /// Errors: a multiplier that is not a finite number within ±100, naming the argument.
    pub fn parse(arg: &str) -> Result<LoraRequest> {
        let bad = |why: &str| PlanError::Invalid(format!("--lora {arg}: {why}"));
        let (path, m) = match arg.rsplit_once(':') {
            Some((p, m)) if !p.is_empty() && !Path::new(arg).exists() => {
                let m: f32 = m.trim().parse().map_err(|_| {
                    bad(&format!(
                        "the multiplier `{m}` after the last `:` is not a number (FILE[:MULTIPLIER], e.g. style.safetensors:0.8)"
                    ))
                })?;
                (p, m)
            }
            _ => (arg, 1.0),
        };
        if !(m.is_finite() && m.abs() <= 100.0) {
            return Err(bad(&format!(
                "the multiplier {m} must be a finite number within ±100"
            )));
        }
        if path.is_empty() {
            return Err(bad("no file given"));
        }
        Ok(LoraRequest {
            path: PathBuf::from(path),
            multiplier: m,
        })
    }
}

/// The key format of a LoRA file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoraFormat {
    /// `lora_A` / `lora_B` (PEFT, diffusers).
    Peft,
    /// `lora_down` / `lora_up` / `alpha` (kohya sd-scripts).
    Kohya,
}

impl LoraFormat {
    /// The name recorded in the plan and shown by `inspect`.
    pub fn name(self) -> &'static str {
        match self {
            LoraFormat::Peft => "peft",
            LoraFormat::Kohya => "kohya",
        }
    }
}

/// One adapted layer as the file stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraLayer {
    /// The key stem in the file (`transformer.transformer_blocks.0.attn1.to_q`,
    /// `lora_unet_transformer_blocks_0_attn1_to_q`).
    pub key: String,
    pub rank: usize,
    pub in_features: usize,
    pub out_features: usize,
    /// `A [rank, in_features]`, row-major f32.
    pub a: Vec<f32>,
    /// `B [out_features, rank]`, row-major f32.
    pub b: Vec<f32>,
    /// The file's alpha; `None` means alpha = rank (scale 1 before the multiplier).
    pub alpha: Option<f32>,
}

/// A parsed LoRA file (not yet matched to a model).
#[derive(Clone, Debug)]
pub struct LoraFile {
    /// The file, as given.
    pub path: PathBuf,
    /// BLAKE3 of the file's bytes.
    pub digest: [u8; 32],
    pub format: LoraFormat,
    /// In key order.
    pub layers: Vec<LoraLayer>,
}

const PEFT_SUFFIXES: [(&str, Half); 3] = [
    (".lora_A.weight", Half::A),
    (".lora_B.weight", Half::B),
    (".alpha", Half::Alpha),
];
const KOHYA_SUFFIXES: [(&str, Half); 3] = [
    (".lora_down.weight", Half::A),
    (".lora_up.weight", Half::B),
    (".alpha", Half::Alpha),
];
/// Key parts of adapter kinds this merge does not implement.
const UNSUPPORTED: [(&str, &str); 8] = [
    (".lora_mid.", "LoCon/LyCORIS mid weights"),
    (".hada_", "LoHa"),
    (".lokr_", "LoKr"),
    (".dora_scale", "DoRA"),
    (".lora_magnitude_vector", "DoRA"),
    (".diff", "full weight differences"),
    (".lora_embedding_", "embedding LoRA"),
    (".bias", "LoRA biases"),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    A,
    B,
    Alpha,
}

impl LoraFile {
    /// Reads the safetensors file at `path`.
    ///
    /// Errors: those of reading the file ([`crate::load::LoadError`]) and
    /// [`PlanError::Invalid`] for the problems listed in the module docs.
    pub fn open(path: &Path) -> Result<LoraFile> {
        let f = SafetensorsFile::open(path)?;
        let mut hasher = blake3::Hasher::new();
        let io = |e| crate::load::LoadError::Io {
            path: path.display().to_string(),
            source: e,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        hasher.update_reader(file).map_err(io)?;
        let mut l = LoraFile::from_source(&f)?;
        l.path = path.to_path_buf();
        l.digest = *hasher.finalize().as_bytes();
        Ok(l)
    }

    /// Parses the tensors of `src` (path and digest left empty).
    ///
    /// Errors: [`PlanError::Invalid`] naming `src` and the key for a file with no LoRA
    /// tensors, keys of both formats, unsupported adapter kinds, unknown keys, a missing A or
    /// B, tensors that are not 2-D (alpha: one value), ranks that disagree, a zero rank, a
    /// non-finite value.
    pub fn from_source(src: &dyn TensorSource) -> Result<LoraFile> {
        let what = src.describe();
        let bad = |why: String| PlanError::Invalid(format!("{what}: {why}"));
        let names = src.names();
        let peft = names
            .iter()
            .any(|n| n.contains(".lora_A.") || n.contains(".lora_B."));
        let kohya = names
            .iter()
            .any(|n| n.contains(".lora_down.") || n.contains(".lora_up."));
        let format = match (peft, kohya) {
            (true, false) => LoraFormat::Peft,
            (false, true) => LoraFormat::Kohya,
            (true, true) => {
                return Err(bad(
                    "holds both PEFT (lora_A/lora_B) and kohya (lora_down/lora_up) keys; one LoRA file has one format".into(),
                ))
            }
            (false, false) => {
                return Err(bad(format!(
                    "no LoRA tensors (keys ending in .lora_A.weight/.lora_B.weight or .lora_down.weight/.lora_up.weight); {} tensors such as {}",
                    names.len(),
                    names.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
                )))
            }
        };
        let suffixes = match format {
            LoraFormat::Peft => &PEFT_SUFFIXES,
            LoraFormat::Kohya => &KOHYA_SUFFIXES,
        };
        // key stem → (A, B, alpha) tensor names
        let mut stems: BTreeMap<String, [Option<String>; 3]> = BTreeMap::new();
        let mut unknown = Vec::new();
        for n in &names {
            if let Some((_, kind)) = UNSUPPORTED.iter().find(|(p, _)| n.contains(p)) {
                return Err(bad(format!(
                    "tensor `{n}` belongs to a {kind} adapter; only plain LoRA (A/B matrices, optional alpha) can be merged"
                )));
            }
            match suffixes.iter().find(|(s, _)| n.ends_with(s)) {
                Some((s, half)) => {
                    let stem = n[..n.len() - s.len()].to_string();
                    stems.entry(stem).or_default()[*half as usize] = Some(n.clone());
                }
                None => unknown.push(n.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(bad(format!(
                "{} tensors are not {} LoRA keys: {}",
                unknown.len(),
                format.name(),
                list(&unknown)
            )));
        }
        let mut layers = Vec::new();
        for (stem, [a, b, alpha]) in stems {
            let (Some(a), Some(b)) = (a, b) else {
                let (a_name, b_name) = match format {
                    LoraFormat::Peft => ("lora_A", "lora_B"),
                    LoraFormat::Kohya => ("lora_down", "lora_up"),
                };
                return Err(bad(format!(
                    "layer `{stem}` needs both {a_name} and {b_name} weights; the file has only {}",
                    stems_half_names(&names, &stem).join(", ")
                )));
            };
            let read = |name: &str| -> Result<(Vec<usize>, Vec<f32>)> {
                let t = src
                    .tensor(name)?
                    .ok_or_else(|| bad(format!("tensor `{name}` is listed but cannot be read")))?;
                let v = to_f32(&t);
                if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                    return Err(bad(format!(
                        "tensor `{name}` holds {} at flat index {i}; LoRA weights must be finite",
                        v[i]
                    )));
                }
                Ok((t.shape.clone(), v))
            };
            let (sa, va) = read(&a)?;
            let (sb, vb) = read(&b)?;
            if sa.len() != 2 || sb.len() != 2 {
                return Err(bad(format!(
                    "`{a}` has shape {sa:?} and `{b}` {sb:?}; LoRA weights of a linear layer are 2-D (A [rank, in], B [out, rank]); convolution LoRAs are not supported"
                )));
            }
            let (rank, in_features, out_features) = (sa[0], sa[1], sb[0]);
            if sb[1] != rank {
                return Err(bad(format!(
                    "rank mismatch in layer `{stem}`: `{a}` has shape {sa:?} (rank {rank}) but `{b}` has {sb:?} (rank {})",
                    sb[1]
                )));
            }
            if rank == 0 || in_features == 0 || out_features == 0 {
                return Err(bad(format!(
                    "layer `{stem}`: empty LoRA weights ({sa:?}, {sb:?})"
                )));
            }
            let alpha = match alpha {
                None => None,
                Some(n) => {
                    let (s, v) = read(&n)?;
                    if v.len() != 1 {
                        return Err(bad(format!("`{n}` has shape {s:?}; alpha is one value")));
                    }
                    Some(v[0])
                }
            };
            layers.push(LoraLayer {
                key: stem,
                rank,
                in_features,
                out_features,
                a: va,
                b: vb,
                alpha,
            });
        }
        Ok(LoraFile {
            path: PathBuf::new(),
            digest: [0; 32],
            format,
            layers,
        })
    }
}

/// The names in `names` that start with `stem.` (for the missing-half message).
fn stems_half_names(names: &[String], stem: &str) -> Vec<String> {
    names
        .iter()
        .filter(|n| n.starts_with(stem) && n[stem.len()..].starts_with('.'))
        .map(|n| format!("`{n}`"))
        .collect()
}

/// At most 12 names, then a count.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 12;
    let mut s = names
        .iter()
        .take(SHOWN)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(", and {} more", names.len() - SHOWN));
    }
    s
}

/// One low-rank update of one weight: `(B @ A) · scale` is added.
#[derive(Clone, Debug)]
struct Delta {
    /// Index into [`LoraMerge::files`] and into that file's layers.
    file: usize,
    layer: usize,
    scale: f32,
}

/// The LoRA files matched to a model's linear layers: what [`LoraMerge::apply`] adds to each
/// weight, and what the plan records.
#[derive(Clone, Debug, Default)]
pub struct LoraMerge {
    files: Vec<LoraFile>,
    /// Diffusers weight name (`transformer_blocks.0.attn1.to_q.weight`) → updates, in the
    /// order the files were given.
    deltas: HashMap<String, Vec<Delta>>,
    infos: Vec<LoraInfo>,
}

/// Module prefixes a PEFT key may carry before the diffusers module name.
const PEFT_PREFIXES: [&str; 4] = [
    "transformer.",
    "base_model.model.",
    "model.diffusion_model.",
    "diffusion_model.",
];
/// Prefixes of kohya keys for the denoiser.
const KOHYA_PREFIXES: [&str; 2] = ["lora_unet_", "lora_transformer_"];

impl LoraMerge {
    /// Matches `files` (each with its multiplier) to `layers`: the model's linear weights,
    /// diffusers name (`….weight`) → shape `[out, in]`.
    ///
    /// Errors: [`PlanError::Invalid`] listing every key of a file that names no layer of the
    /// model (with the expected spelling), a layer whose LoRA shapes disagree with its weight,
    /// and a layer adapted twice by one file.
    pub fn bind(files: Vec<(LoraFile, f32)>, layers: &BTreeMap<String, [u64; 2]>) -> Result<Self> {
        let kohya_names: HashMap<String, &String> = layers
            .keys()
            .map(|n| {
                let module = n.strip_suffix(".weight").unwrap_or(n);
                (module.replace('.', "_"), n)
            })
            .collect();
        let mut merge = LoraMerge::default();
        for (fi, (file, m)) in files.into_iter().enumerate() {
            let mut unmatched = Vec::new();
            let mut seen: HashMap<&String, &str> = HashMap::new();
            let mut max_rank = 0;
            for (li, l) in file.layers.iter().enumerate() {
                let weight = match file.format {
                    LoraFormat::Peft => {
                        let module = PEFT_PREFIXES
                            .iter()
                            .find_map(|p| l.key.strip_prefix(p))
                            .unwrap_or(&l.key);
                        layers
                            .get_key_value(&format!("{module}.weight"))
                            .map(|(k, _)| k)
                    }
                    LoraFormat::Kohya => KOHYA_PREFIXES
                        .iter()
                        .find_map(|p| l.key.strip_prefix(p))
                        .and_then(|m| kohya_names.get(m).copied()),
                };
                let Some(weight) = weight else {
                    unmatched.push(l.key.clone());
                    continue;
                };
                let [out, inp] = layers[weight];
                if (l.out_features as u64, l.in_features as u64) != (out, inp) {
                    return Err(PlanError::Invalid(format!(
                        "{}: layer `{}` has A [{r}, {}] and B [{}, {r}], an update of shape [{}, {}], but the model's `{weight}` is [{out}, {inp}]: the LoRA was made for another model",
                        file.path.display(),
                        l.key,
                        l.in_features,
                        l.out_features,
                        l.out_features,
                        l.in_features,
                        r = l.rank,
                    )));
                }
                if let Some(prev) = seen.insert(weight, &l.key) {
                    return Err(PlanError::Invalid(format!(
                        "{}: `{prev}` and `{}` both adapt `{weight}`",
                        file.path.display(),
                        l.key
                    )));
                }
                let alpha = l.alpha.unwrap_or(l.rank as f32);
                max_rank = max_rank.max(l.rank);
                merge.deltas.entry(weight.clone()).or_default().push(Delta {
                    file: fi,
                    layer: li,
                    scale: m * alpha / l.rank as f32,
                });
            }
            if !unmatched.is_empty() {
                let example = layers
                    .keys()
                    .find(|k| k.contains("attn1.to_q"))
                    .or_else(|| layers.keys().next())
                    .map(|k| k.strip_suffix(".weight").unwrap_or(k).to_string())
                    .unwrap_or_default();
                let spelled = match file.format {
                    LoraFormat::Peft => format!("transformer.{example}.lora_A.weight"),
                    LoraFormat::Kohya => {
                        format!("lora_unet_{}.lora_down.weight", example.replace('.', "_"))
                    }
                };
                return Err(PlanError::Invalid(format!(
                    "{}: {} of its {} LoRA layers match no linear layer of this transformer (keys like `{spelled}`; text-encoder LoRAs are not supported): {}",
                    file.path.display(),
                    unmatched.len(),
                    file.layers.len(),
                    list(&unmatched)
                )));
            }
            merge.infos.push(LoraInfo {
                file: file
                    .path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                blake3: file.digest,
                multiplier: m,
                format: file.format.name().to_string(),
                layers: file.layers.len() as u32,
                rank: max_rank as u32,
            });
            merge.files.push(file);
        }
        Ok(merge)
    }

    /// What the plan records (`ModelInfo::loras`), in the order given.
    pub fn infos(&self) -> &[LoraInfo] {
        &self.infos
    }

    /// Whether `name` (a diffusers weight name) has an update.
    pub fn touches(&self, name: &str) -> bool {
        self.deltas.contains_key(name)
    }

    /// Adds every update of weight `name` to `w` (`[out, in]` row-major f32, the rows
    /// `row_offset..row_offset + out` of a fused tensor whose rows are `in_features` long):
    /// `w += (B @ A) · scale` per file in order, `B @ A` summed over the rank in index order.
    ///
    /// Errors: [`PlanError::Invalid`] naming the LoRA file, its layer key, the weight and the
    /// first flat index where the merged weight is not finite (finite factors whose product
    /// overflows f32: a weight the runtime would turn into NaN latents).
    pub fn apply(&self, name: &str, w: &mut [f32]) -> Result<()> {
        let Some(ds) = self.deltas.get(name) else {
            return Ok(());
        };
        for d in ds {
            let f = &self.files[d.file];
            let l = &f.layers[d.layer];
            let (r, n) = (l.rank, l.in_features);
            for (o, row) in w.chunks_exact_mut(n).take(l.out_features).enumerate() {
                let b = &l.b[o * r..(o + 1) * r];
                for (i, x) in row.iter_mut().enumerate() {
                    let mut acc = 0f32;
                    for (k, &bk) in b.iter().enumerate() {
                        acc += bk * l.a[k * n + i];
                    }
                    *x += acc * d.scale;
                }
            }
            // Only the rows this update wrote (the others were checked by their own update).
            let touched = (l.out_features * n).min(w.len());
            if let Some(i) = w[..touched].iter().position(|x| !x.is_finite()) {
                return Err(PlanError::Invalid(format!(
                    "LoRA {}: layer `{}` merged into `{name}` gives {} at flat index {i}; merged \
                     weights must be finite (the update (B @ A) · scale overflows f32)",
                    f.path.display(),
                    l.key,
                    w[i]
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse_with_and_without_a_multiplier() {
        let r = LoraRequest::parse("style.safetensors:0.8").unwrap();
        assert_eq!(r.path, PathBuf::from("style.safetensors"));
        assert_eq!(r.multiplier, 0.8);
        assert_eq!(LoraRequest::parse("a.safetensors").unwrap().multiplier, 1.0);
        assert_eq!(LoraRequest::parse("a:-1").unwrap().multiplier, -1.0);
        assert!(LoraRequest::parse("a:x")
            .unwrap_err()
            .to_string()
            .contains("`x`"));
        assert!(LoraRequest::parse("a:inf").is_err());
        assert!(LoraRequest::parse("a:1000").is_err());
    }

    /// A kohya file `path` with one rank-1 layer `lora_unet_l` of 2 × 2 adapting `l.weight`,
    /// bound with `multiplier`.
    fn one_layer(
        path: &str,
        a: [f32; 2],
        b: [f32; 2],
        alpha: Option<f32>,
        multiplier: f32,
    ) -> LoraMerge {
        let file = LoraFile {
            path: path.into(),
            digest: [0; 32],
            format: LoraFormat::Kohya,
            layers: vec![LoraLayer {
                key: "lora_unet_l".into(),
                rank: 1,
                in_features: 2,
                out_features: 2,
                a: a.to_vec(),
                b: b.to_vec(),
                alpha,
            }],
        };
        let layers = BTreeMap::from([("l.weight".to_string(), [2u64, 2])]);
        LoraMerge::bind(vec![(file, multiplier)], &layers).unwrap()
    }

    #[test]
    fn apply_adds_b_times_a_scaled() {
        let m = one_layer("f", [1.0, 2.0], [3.0, 4.0], Some(2.0), 0.5);
        let mut w = vec![0f32; 4];
        m.apply("l.weight", &mut w).unwrap();
        // scale = 0.5 · 2 / 1 = 1; B @ A = [[3, 6], [4, 8]]
        assert_eq!(w, vec![3.0, 6.0, 4.0, 8.0]);
        assert_eq!(m.infos()[0].rank, 1);
    }

    /// Finite factors whose product overflows f32 are refused, naming the file, its layer,
    /// the weight and the index (the merged weight was planned and sampling diverged).
    #[test]
    fn apply_refuses_an_update_that_overflows() {
        let m = one_layer("big.safetensors", [1.0, 1e30], [1.0, 1e30], None, 1.0);
        let mut w = vec![0f32; 4];
        let e = m.apply("l.weight", &mut w).unwrap_err().to_string();
        for n in [
            "big.safetensors",
            "lora_unet_l",
            "l.weight",
            "inf",
            "flat index 3",
        ] {
            assert!(e.contains(n), "no `{n}` in {e}");
        }
    }
}
