//! The original PixArt checkpoint layout (PixArt-α / PixArt-Σ repositories, and the GGUF files
//! of stable-diffusion.cpp / ComfyUI-GGUF) presented under diffusers names: a [`TensorSource`]
//! over the name table of [`edge_models::original`] (which also says which tensors are rows of
//! a fused one). Fused tensors are split along axis 0 (output rows) into equal parts. Rows are
//! contiguous in every storage type (a ggml block never spans two rows), so a part is a byte
//! range of the fused tensor and quantized data is served unchanged; [`TensorSource::fused`]
//! serves the whole fused tensor when all its parts are asked for at once.

use std::collections::BTreeMap;

use edge_models::original::{detect_prefix, diffusers_names_of, origin_of, Origin};

use super::{LoadError, RawTensor, TensorSource};

/// A [`TensorSource`] in the original PixArt layout, presented under diffusers names.
pub struct OriginalLayout {
    inner: Box<dyn TensorSource>,
    prefix: String,
    /// Diffusers name → origin, for every tensor the file provides.
    names: BTreeMap<String, Origin>,
}

impl OriginalLayout {
    /// Wraps `inner` if its names are in the original layout (see [`detect_prefix`]);
    /// returns it unchanged otherwise (diffusers layout).
    pub fn wrap_if_original(inner: Box<dyn TensorSource>) -> Box<dyn TensorSource> {
        let all = inner.names();
        let Some(prefix) = detect_prefix(&all) else {
            return inner;
        };
        let mut names = BTreeMap::new();
        for full in &all {
            let Some(orig) = full.strip_prefix(prefix.as_str()) else {
                continue;
            };
            for d in diffusers_names_of(orig) {
                if let Some(o) = origin_of(&d) {
                    names.insert(d, o);
                }
            }
        }
        Box::new(OriginalLayout {
            inner,
            prefix,
            names,
        })
    }

    /// The prefix in front of every original name (`""` when none).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn original(&self, o: &Origin) -> String {
        format!("{}{}", self.prefix, o.name)
    }
}

/// Rows `index/count` of `t` (split along axis 0). When the rows do not divide evenly the
/// whole tensor is returned, so the caller's shape check reports the mismatch.
fn rows_part<'a>(t: RawTensor<'a>, index: usize, count: usize) -> RawTensor<'a> {
    let Some(&rows) = t.shape.first() else {
        return t;
    };
    if count == 0 || !rows.is_multiple_of(count) || !t.data.len().is_multiple_of(count) {
        return t;
    }
    let per = t.data.len() / count;
    let mut shape = t.shape.clone();
    shape[0] = rows / count;
    RawTensor {
        dtype: t.dtype,
        shape,
        data: &t.data[index * per..(index + 1) * per],
    }
}

impl TensorSource for OriginalLayout {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>, LoadError> {
        let Some(o) = origin_of(name) else {
            return Ok(None);
        };
        let Some(t) = self.inner.tensor(&self.original(&o))? else {
            return Ok(None);
        };
        Ok(Some(match o.part {
            None => t,
            Some((i, n)) => rows_part(t, i, n),
        }))
    }

    fn fused(&self, parts: &[String]) -> Result<Option<RawTensor<'_>>, LoadError> {
        let origins: Vec<Option<Origin>> = parts.iter().map(|p| origin_of(p)).collect();
        let Some(Some(first)) = origins.first() else {
            return Ok(None);
        };
        let whole = origins.iter().enumerate().all(|(i, o)| {
            o.as_ref()
                .is_some_and(|o| o.name == first.name && o.part == Some((i, parts.len())))
        });
        if !whole {
            return Ok(None);
        }
        self.inner.tensor(&self.original(first))
    }

    fn stored_name(&self, name: &str) -> Option<String> {
        let o = origin_of(name)?;
        let full = self.original(&o);
        Some(match o.part {
            None => full,
            Some((i, n)) => format!("{full} (rows part {} of {n})", i + 1),
        })
    }

    fn stored_whole_name(&self, name: &str) -> Option<String> {
        origin_of(name).map(|o| self.original(&o))
    }

    fn names(&self) -> Vec<String> {
        self.names.keys().cloned().collect()
    }

    fn describe(&self) -> String {
        format!(
            "{} (original PixArt layout, prefix `{}`)",
            self.inner.describe(),
            self.prefix
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in [
            "pos_embed.proj.weight",
            "adaln_single.linear.bias",
            "scale_shift_table",
            "transformer_blocks.7.attn1.to_k.weight",
            "transformer_blocks.0.attn2.to_v.bias",
            "transformer_blocks.12.ff.net.2.weight",
            "adaln_single.emb.aspect_ratio_embedder.linear_2.weight",
        ] {
            let o = origin_of(d).unwrap();
            assert!(
                diffusers_names_of(&o.name).contains(&d.to_string()),
                "{d} → {o:?}"
            );
        }
        assert_eq!(
            origin_of("transformer_blocks.3.attn1.to_v.weight"),
            Some(Origin {
                name: "blocks.3.attn.qkv.weight".into(),
                part: Some((2, 3))
            })
        );
        assert!(origin_of("transformer_blocks.x.attn1.to_q.weight").is_none());
        assert!(diffusers_names_of("y_embedder.y_embedding").is_empty());
    }

    #[test]
    fn prefix_detection() {
        let n = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            detect_prefix(&n(&["model.diffusion_model.x_embedder.proj.weight"])),
            Some("model.diffusion_model.".into())
        );
        assert_eq!(
            detect_prefix(&n(&["x_embedder.proj.weight"])),
            Some(String::new())
        );
        assert_eq!(detect_prefix(&n(&["pos_embed.proj.weight"])), None);
    }
}
