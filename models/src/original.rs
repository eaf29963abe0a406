//! The name table of the original PixArt checkpoint layout (PixArt-α / PixArt-Σ repositories,
//! and the GGUF files of stable-diffusion.cpp / ComfyUI-GGUF) against diffusers names; the
//! planner's loader (`planner/src/load/original.rs`) serves such files under diffusers names.
//!
//! Name table (diffusers `scripts/convert_pixart_alpha_to_diffusers.py` and
//! `convert_pixart_sigma_to_diffusers.py` do the inverse), every original name optionally
//! prefixed (e.g. `model.diffusion_model.`):
//!
//! | original | diffusers |
//! | --- | --- |
//! | `x_embedder.proj.*` | `pos_embed.proj.*` (conv `[D, C, p, p]`) |
//! | `t_embedder.mlp.{0,2}.*` | `adaln_single.emb.timestep_embedder.linear_{1,2}.*` |
//! | `t_block.1.*` | `adaln_single.linear.*` |
//! | `y_embedder.y_proj.fc{1,2}.*` | `caption_projection.linear_{1,2}.*` |
//! | `csize_embedder.mlp.{0,2}.*` (α) | `adaln_single.emb.resolution_embedder.linear_{1,2}.*` |
//! | `ar_embedder.mlp.{0,2}.*` (α) | `adaln_single.emb.aspect_ratio_embedder.linear_{1,2}.*` |
//! | `blocks.N.scale_shift_table` | `transformer_blocks.N.scale_shift_table` `[6, D]` |
//! | `blocks.N.attn.qkv.*` | rows of `attn1.to_q`, `attn1.to_k`, `attn1.to_v` (in that order) |
//! | `blocks.N.attn.proj.*` | `attn1.to_out.0.*` |
//! | `blocks.N.cross_attn.q_linear.*` | `attn2.to_q.*` |
//! | `blocks.N.cross_attn.kv_linear.*` | rows of `attn2.to_k`, `attn2.to_v` |
//! | `blocks.N.cross_attn.proj.*` | `attn2.to_out.0.*` |
//! | `blocks.N.mlp.fc{1,2}.*` | `ff.net.0.proj.*`, `ff.net.2.*` |
//! | `final_layer.linear.*` | `proj_out.*` |
//! | `final_layer.scale_shift_table` | `scale_shift_table` `[2, D]` |
//!
//! Fused tensors are split along axis 0 (output rows) into equal parts. Rows are contiguous
//! in every storage type (a ggml block never spans two rows), so a part is a byte range of
//! the fused tensor and quantized data is served unchanged; the loader serves
//! the whole fused tensor when all its parts are asked for at once.
//! Tensors without a diffusers counterpart (`pos_embed`, `y_embedder.y_embedding`) are
//! ignored.

/// Where a diffusers tensor lives in an original-layout file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The original name, without the prefix.
    pub name: String,
    /// `(index, count)` when the tensor is rows `index/count` of a fused tensor.
    pub part: Part,
}

/// `(diffusers stem, original stem)` for the non-block tensors; suffixes `.weight`/`.bias`
/// carry over unchanged.
const GLOBAL_STEMS: [(&str, &str); 12] = [
    ("pos_embed.proj", "x_embedder.proj"),
    (
        "adaln_single.emb.timestep_embedder.linear_1",
        "t_embedder.mlp.0",
    ),
    (
        "adaln_single.emb.timestep_embedder.linear_2",
        "t_embedder.mlp.2",
    ),
    ("adaln_single.linear", "t_block.1"),
    ("caption_projection.linear_1", "y_embedder.y_proj.fc1"),
    ("caption_projection.linear_2", "y_embedder.y_proj.fc2"),
    (
        "adaln_single.emb.resolution_embedder.linear_1",
        "csize_embedder.mlp.0",
    ),
    (
        "adaln_single.emb.resolution_embedder.linear_2",
        "csize_embedder.mlp.2",
    ),
    (
        "adaln_single.emb.aspect_ratio_embedder.linear_1",
        "ar_embedder.mlp.0",
    ),
    (
        "adaln_single.emb.aspect_ratio_embedder.linear_2",
        "ar_embedder.mlp.2",
    ),
    ("proj_out", "final_layer.linear"),
    ("scale_shift_table", "final_layer.scale_shift_table"),
];

/// `(index, count)`: rows `index/count` of a fused tensor.
pub type Part = Option<(usize, usize)>;

/// `(diffusers stem inside a block, original stem inside a block, part)`.
const BLOCK_STEMS: [(&str, &str, Part); 11] = [
    ("scale_shift_table", "scale_shift_table", None),
    ("attn1.to_q", "attn.qkv", Some((0, 3))),
    ("attn1.to_k", "attn.qkv", Some((1, 3))),
    ("attn1.to_v", "attn.qkv", Some((2, 3))),
    ("attn1.to_out.0", "attn.proj", None),
    ("attn2.to_q", "cross_attn.q_linear", None),
    ("attn2.to_k", "cross_attn.kv_linear", Some((0, 2))),
    ("attn2.to_v", "cross_attn.kv_linear", Some((1, 2))),
    ("attn2.to_out.0", "cross_attn.proj", None),
    ("ff.net.0.proj", "mlp.fc1", None),
    ("ff.net.2", "mlp.fc2", None),
];

/// Splits `name` into `(stem, suffix)` where suffix is `""`, `.weight` or `.bias`.
fn split_suffix(name: &str) -> (&str, &str) {
    for s in [".weight", ".bias"] {
        if let Some(stem) = name.strip_suffix(s) {
            return (stem, s);
        }
    }
    (name, "")
}

/// The original location of diffusers tensor `name`, or `None` when it has none.
pub fn origin_of(name: &str) -> Option<Origin> {
    let (stem, suffix) = split_suffix(name);
    for (d, o) in GLOBAL_STEMS {
        if stem == d {
            return Some(Origin {
                name: format!("{o}{suffix}"),
                part: None,
            });
        }
    }
    let rest = stem.strip_prefix("transformer_blocks.")?;
    let (n, inner) = rest.split_once('.')?;
    let n: usize = n.parse().ok()?;
    BLOCK_STEMS
        .iter()
        .find(|(d, _, _)| *d == inner)
        .map(|&(_, o, part)| Origin {
            name: format!("blocks.{n}.{o}{suffix}"),
            part,
        })
}

/// The diffusers names served by original tensor `name` (without prefix); empty when the
/// tensor has no diffusers counterpart.
pub fn diffusers_names_of(name: &str) -> Vec<String> {
    let (stem, suffix) = split_suffix(name);
    for (d, o) in GLOBAL_STEMS {
        if stem == o {
            return vec![format!("{d}{suffix}")];
        }
    }
    let Some(rest) = stem.strip_prefix("blocks.") else {
        return vec![];
    };
    let Some((n, inner)) = rest.split_once('.') else {
        return vec![];
    };
    if n.parse::<usize>().is_err() {
        return vec![];
    }
    BLOCK_STEMS
        .iter()
        .filter(|(_, o, _)| *o == inner)
        .map(|(d, _, _)| format!("transformer_blocks.{n}.{d}{suffix}"))
        .collect()
}

/// The name whose presence marks the original layout (after the prefix).
const MARKER: &str = "x_embedder.proj.weight";

/// The prefix of an original-layout tensor set (`""` or e.g. `model.diffusion_model.`), or
/// `None` when `names` are not in the original layout (no `*x_embedder.proj.weight`).
pub fn detect_prefix(names: &[String]) -> Option<String> {
    names
        .iter()
        .filter_map(|n| n.strip_suffix(MARKER))
        .min_by_key(|p| p.len())
        .map(str::to_string)
}
