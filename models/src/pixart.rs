//! The PixArt-α/Σ denoiser (diffusers 0.42 `PixArtTransformer2DModel` with
//! `BasicTransformerBlock(norm_type="ada_norm_single")`, `AdaLayerNormSingle`,
//! `PixArtAlphaCombinedTimestepSizeEmbeddings`, `PixArtAlphaTextProjection`, `PatchEmbed`).
//!
//! One batch-1 forward: patchify + 2-D sin-cos position table → adaLN-single timestep
//! conditioning (+ α micro-conditions) → blocks (modulated self-attention with gate,
//! un-normed ungated cross-attention with the caption mask as a −10000 bias, modulated gated
//! GELU-tanh MLP) → final modulated LayerNorm → `proj_out` → unpatchify → noise half.

use edge_graph::schema::op::Op;
use edge_graph::schema::DType;
use edge_graph::{Graph, ValueId, WeightKind};

use crate::config::PixArtConfig;
use crate::util::{conv2d, linear, linear_fused, linear_gelu};
use crate::ModelError;

const MODEL: &str = "PixArtTransformer2DModel";

/// Width of the sinusoidal projection of timesteps and micro-conditions (`Timesteps(256, …)`).
const SINUSOID_DIM: usize = 256;

/// α micro-conditions: the generated image size in pixels, as `PixArtAlphaPipeline` passes them
/// (`resolution = [height, width]`, `aspect_ratio = height / width`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MicroConditions {
    pub height_px: f32,
    pub width_px: f32,
}

/// The 2-D sin-cos position table of diffusers `get_2d_sincos_pos_embed(dim, (gh, gw),
/// base_size, interpolation_scale, output_type="pt")`, row-major `[gh · gw, dim]`, tokens in
/// (y, x) order.
///
/// Positions are computed in f32 as torch does, `pos_y = y / (gh / base_size) /
/// interpolation_scale` (x likewise with `gw`), the sines and cosines in f64, the result cast
/// to f32. Channels `[0, dim/2)` encode x and `[dim/2, dim)` encode y; each half is
/// `[sin(pos·ω_k), cos(pos·ω_k)]` with `ω_k = 10000^(−k/(dim/4))`, `k < dim/4`.
///
/// `dim` must be a positive multiple of 4 and `gh`, `gw`, `base_size` positive (diffusers
/// raises otherwise); for other arguments the result is empty.
pub fn pos_embed_2d(
    dim: usize,
    gh: usize,
    gw: usize,
    base_size: usize,
    interpolation_scale: f64,
) -> Vec<f32> {
    if dim == 0 || !dim.is_multiple_of(4) || gh == 0 || gw == 0 || base_size == 0 {
        return Vec::new();
    }
    let quarter = dim / 4;
    let omega: Vec<f64> = (0..quarter)
        .map(|k| 1.0 / 10000f64.powf(k as f64 / quarter as f64))
        .collect();
    let interp = interpolation_scale as f32;
    let axis = |n: usize, i: usize| -> f64 {
        let step = (n as f64 / base_size as f64) as f32;
        f64::from(i as f32 / step / interp)
    };
    let mut out = Vec::with_capacity(gh * gw * dim);
    for y in 0..gh {
        let py = axis(gh, y);
        for x in 0..gw {
            let px = axis(gw, x);
            for pos in [px, py] {
                out.extend(omega.iter().map(|w| (pos * w).sin() as f32));
                out.extend(omega.iter().map(|w| (pos * w).cos() as f32));
            }
        }
    }
    out
}

/// `Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)`: `t [n]` → `[n, 256]`.
fn sinusoid(g: &mut Graph, name: &str, t: ValueId, n: usize) -> edge_graph::Result<ValueId> {
    g.op_shaped(
        name,
        Op::TimestepEmbedding {
            flip_sin_to_cos: true,
            downscale_freq_shift: 0.0,
            max_period: 10000.0,
        },
        &[t],
        &[n, SINUSOID_DIM],
    )
}

/// diffusers `TimestepEmbedding`: `linear_1` → SiLU → `linear_2`, `[n, 256]` → `[n, out]`.
fn embed_mlp(g: &mut Graph, x: ValueId, prefix: &str, out: usize) -> edge_graph::Result<ValueId> {
    let h = linear(g, x, &format!("{prefix}.linear_1"), out, SINUSOID_DIM, true)?;
    let h = g.op(&format!("{prefix}.act"), Op::Silu, &[h])?;
    linear(g, h, &format!("{prefix}.linear_2"), out, out, true)
}

/// Builds the denoiser for latent size `latent_h × latent_w` and a caption of `seq_len` tokens
/// (batch 1; classifier-free guidance runs the graph twice).
///
/// Inputs, in order: `latent [in_channels, latent_h, latent_w]`; `timestep [1]` (the raw
/// 0…999 value as f32); `context [seq_len, caption_channels]` (T5 states; width
/// `cross_attention_dim` when the config has no caption projection); `mask [seq_len]` (1 keep,
/// 0 pad). Output: `eps [in_channels, latent_h, latent_w]`, the first `in_channels` output
/// channels (the noise prediction; the learned-variance half is dropped, as the pipelines do).
///
/// `micro` is used only when the config has `use_additional_conditions`; it is ignored
/// otherwise, as diffusers ignores `added_cond_kwargs`.
///
/// Weights use the diffusers names; self-attention q/k/v and cross-attention k/v are fused
/// row concatenations. Cuts: `transformer_blocks.N` before each block, `final_layer` before the
/// output layer.
///
/// Errors: [`ModelError::Size`] when a latent side is zero or not a multiple of `patch_size`,
/// or `seq_len == 0`; [`ModelError::MissingMicroConditions`] when the config needs `micro` and
/// it is `None`.
pub fn build_pixart_denoiser(
    cfg: &PixArtConfig,
    latent_h: usize,
    latent_w: usize,
    seq_len: usize,
    micro: Option<MicroConditions>,
) -> Result<Graph, ModelError> {
    build(cfg, latent_h, latent_w, seq_len, micro, None)
}

/// Width of one row of the cross-attention key/value cache of [`build_pixart_cross_kv`]:
/// `2 · inner_dim` (a block's keys at columns `0..D`, its values at `D..2D`).
pub fn cross_kv_width(cfg: &PixArtConfig) -> usize {
    2 * cfg.inner_dim()
}

/// Shape of the cross-attention key/value cache, outermost-first:
/// `[num_layers · seq_len, 2 · inner_dim]`, block `n`'s rows at `n·seq_len..(n+1)·seq_len`.
pub fn cross_kv_shape(cfg: &PixArtConfig, seq_len: usize) -> [usize; 2] {
    [cfg.num_layers * seq_len, cross_kv_width(cfg)]
}

/// The step-independent part of the denoiser: the caption projection and every block's
/// cross-attention keys and values, computed once per prompt instead of at every sampler step.
///
/// Input `context [seq_len, caption_channels]` (T5 states); output `kv` of
/// [`cross_kv_shape`] stored as `cache` (F32, or F16 / Q8_0 through [`Op::Quantize`], which
/// the matching denoiser reads back with [`Op::Rows`]). Each block's `[seq_len, 2D]` part is
/// concatenated along the outermost axis, so the planner places the parts inside the cache
/// (in-place concatenation: the cache is held once). The matching denoiser is
/// [`build_pixart_denoiser_cached`]; with an F32 cache they compute exactly what
/// [`build_pixart_denoiser`] computes. Cut `transformer_blocks.N.attn2.kv` before each block's
/// projection.
pub fn build_pixart_cross_kv(
    cfg: &PixArtConfig,
    seq_len: usize,
    cache: DType,
) -> Result<Graph, ModelError> {
    if seq_len == 0 {
        return Err(ModelError::Size {
            model: MODEL,
            msg: "caption length must be at least 1".into(),
        });
    }
    check_cache_type(cfg, cache)?;
    let d = cfg.inner_dim();
    let ctx_width = cfg.caption_channels.unwrap_or(cfg.cross_attention_dim);
    let mut g = Graph::new("pixart_cross_kv");
    let context = g.input("context", &[seq_len, ctx_width], DType::F32);
    let caption = caption_projection(&mut g, cfg, context)?;
    let mut parts = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let b = format!("transformer_blocks.{n}");
        g.cut(format!("{b}.attn2.kv"));
        let kv_parts = ["to_k", "to_v"].map(|s| format!("{b}.attn2.{s}"));
        let kv = linear_fused(
            &mut g,
            caption,
            &format!("{b}.attn2.kv"),
            &kv_parts,
            d,
            cfg.cross_attention_dim,
            cfg.attention_bias,
        )?;
        parts.push(if cache == DType::F32 {
            kv
        } else {
            g.op(
                &format!("{b}.attn2.kv.cache"),
                Op::Quantize { dtype: cache },
                &[kv],
            )?
        });
    }
    let kv = if parts.len() == 1 {
        parts[0]
    } else {
        g.op("cross_kv", Op::Concat { axis: 0 }, &parts)?
    };
    g.output(kv);
    Ok(g)
}

/// Refuses a cache type other than F32, F16, Q8_0, or Q8_0 when a cache row is not a whole
/// number of 32-value blocks.
fn check_cache_type(cfg: &PixArtConfig, cache: DType) -> Result<(), ModelError> {
    let ok = edge_schema::op::is_cache_type(cache)
        && cross_kv_width(cfg).is_multiple_of(cache.block_size());
    if ok {
        return Ok(());
    }
    Err(ModelError::Size {
        model: MODEL,
        msg: format!(
            "a {cache} K/V cache does not fit rows of {} values (f32, f16, q8_0 with rows of whole 32-value blocks)",
            cross_kv_width(cfg)
        ),
    })
}

/// [`build_pixart_denoiser`] reading the cross-attention keys and values from the cache that
/// [`build_pixart_cross_kv`] computes: the third input is `kv` of [`cross_kv_shape`] stored as
/// `cache` instead of `context`; block `n` reads its rows with [`Op::Rows`] (a copy for F32,
/// dequantized for F16 / Q8_0) before its cross-attention.
pub fn build_pixart_denoiser_cached(
    cfg: &PixArtConfig,
    latent_h: usize,
    latent_w: usize,
    seq_len: usize,
    micro: Option<MicroConditions>,
    cache: DType,
) -> Result<Graph, ModelError> {
    check_cache_type(cfg, cache)?;
    build(cfg, latent_h, latent_w, seq_len, micro, Some(cache))
}

/// `caption_projection`: linear_1 → GELU(tanh) → linear_2 (or the context itself when the
/// config has no caption channels).
fn caption_projection(
    g: &mut Graph,
    cfg: &PixArtConfig,
    context: ValueId,
) -> Result<ValueId, ModelError> {
    let d = cfg.inner_dim();
    Ok(match cfg.caption_channels {
        Some(cc) => {
            let h = linear_gelu(
                g,
                context,
                "caption_projection.linear_1",
                "caption_projection.linear_1+act",
                d,
                cc,
                true,
            )?;
            linear(g, h, "caption_projection.linear_2", d, d, true)?
        }
        None => context,
    })
}

fn build(
    cfg: &PixArtConfig,
    latent_h: usize,
    latent_w: usize,
    seq_len: usize,
    micro: Option<MicroConditions>,
    cached: Option<DType>,
) -> Result<Graph, ModelError> {
    let p = cfg.patch_size;
    if latent_h == 0 || latent_w == 0 || !latent_h.is_multiple_of(p) || !latent_w.is_multiple_of(p)
    {
        return Err(ModelError::Size {
            model: MODEL,
            msg: format!(
                "latent {latent_h}×{latent_w} (h×w) must be a positive multiple of the patch size {p}"
            ),
        });
    }
    if seq_len == 0 {
        return Err(ModelError::Size {
            model: MODEL,
            msg: "caption length must be at least 1".into(),
        });
    }
    let micro = match (cfg.use_additional_conditions, micro) {
        (true, None) => return Err(ModelError::MissingMicroConditions { model: MODEL }),
        (true, m) => m,
        (false, _) => None,
    };
    let d = cfg.inner_dim();
    let (gh, gw) = (latent_h / p, latent_w / p);
    let tokens = gh * gw;
    let cin = cfg.in_channels;
    let cout = cfg.out_channels;
    let ctx_width = cfg.caption_channels.unwrap_or(cfg.cross_attention_dim);
    let mut g = Graph::new("pixart_denoiser");
    let latent = g.input("latent", &[cin, latent_h, latent_w], DType::F32);
    let timestep = g.input("timestep", &[1], DType::F32);
    let context = if let Some(cache) = cached {
        g.input("kv", &cross_kv_shape(cfg, seq_len), cache)
    } else {
        g.input("context", &[seq_len, ctx_width], DType::F32)
    };
    let mask = g.input("mask", &[seq_len], DType::F32);

    // Patch embedding: conv (stride p) → [D, gh, gw] → tokens [gh·gw, D] + position table.
    let patches = conv2d(&mut g, latent, "pos_embed.proj", d, p, p as u32, [0; 4])?;
    let flat = g.op_shaped("pos_embed.flatten", Op::Reshape, &[patches], &[d, tokens])?;
    let tok = g.op(
        "pos_embed.tokens",
        Op::Permute { perm: vec![1, 0] },
        &[flat],
    )?;
    let table = pos_embed_2d(d, gh, gw, cfg.base_size(), cfg.interpolation_scale);
    let pos = g.constant("pos_embed.table", &[tokens, d], table)?;
    let mut x = g.op("pos_embed", Op::Add, &[tok, pos])?;

    // adaLN-single: embedded_timestep (+ micro-conditions), then the 6·D modulation vector.
    let emb = "adaln_single.emb";
    let t_sin = sinusoid(&mut g, &format!("{emb}.time_proj"), timestep, 1)?;
    let mut t_emb = embed_mlp(&mut g, t_sin, &format!("{emb}.timestep_embedder"), d)?;
    if let Some(m) = micro {
        let third = d / 3;
        let res = g.constant(
            &format!("{emb}.resolution"),
            &[2],
            vec![m.height_px, m.width_px],
        )?;
        let ratio = (f64::from(m.height_px) / f64::from(m.width_px)) as f32;
        let ar = g.constant(&format!("{emb}.aspect_ratio"), &[1], vec![ratio])?;
        let res_sin = sinusoid(&mut g, &format!("{emb}.resolution_proj"), res, 2)?;
        let res_emb = embed_mlp(
            &mut g,
            res_sin,
            &format!("{emb}.resolution_embedder"),
            third,
        )?;
        let res_emb = g.op_shaped(
            &format!("{emb}.resolution_flat"),
            Op::Reshape,
            &[res_emb],
            &[1, 2 * third],
        )?;
        let ar_sin = sinusoid(&mut g, &format!("{emb}.aspect_ratio_proj"), ar, 1)?;
        let ar_emb = embed_mlp(
            &mut g,
            ar_sin,
            &format!("{emb}.aspect_ratio_embedder"),
            third,
        )?;
        let cond = g.op(
            &format!("{emb}.size_cond"),
            Op::Concat { axis: 1 },
            &[res_emb, ar_emb],
        )?;
        t_emb = g.op(&format!("{emb}.conditioning"), Op::Add, &[t_emb, cond])?;
    }
    let embedded_timestep = t_emb;
    let act = g.op("adaln_single.act", Op::Silu, &[embedded_timestep])?;
    let t6 = linear(&mut g, act, "adaln_single.linear", 6 * d, d, true)?;
    let t6 = g.op_shaped("adaln_single.rows", Op::Reshape, &[t6], &[6, d])?;

    // Caption projection: linear_1 → GELU(tanh) → linear_2.
    let caption = if cached.is_some() {
        context
    } else {
        caption_projection(&mut g, cfg, context)?
    };

    let heads = cfg.num_attention_heads as u32;
    let head_dim = cfg.attention_head_dim as u32;
    let scale = (1.0 / (cfg.attention_head_dim as f64).sqrt()) as f32;
    let bias = cfg.attention_bias;
    let ln = Op::LayerNorm {
        eps: cfg.norm_eps,
        affine: false,
    };
    for n in 0..cfg.num_layers {
        let b = format!("transformer_blocks.{n}");
        g.cut(b.clone());
        let sst = g.weight(
            &format!("{b}.scale_shift_table"),
            &[6, d],
            WeightKind::Table,
        )?;
        let m = g.op(&format!("{b}.modulation"), Op::Add, &[t6, sst])?;

        // Self-attention: x += gate_msa · attn1(LN(x)·(1+scale_msa)+shift_msa).
        let h = g.op(&format!("{b}.norm1"), ln.clone(), &[x])?;
        let h = g.op(
            &format!("{b}.norm1.modulate"),
            Op::Modulate {
                shift_row: 0,
                scale_row: 1,
            },
            &[h, m],
        )?;
        let qkv_parts = ["to_q", "to_k", "to_v"].map(|s| format!("{b}.attn1.{s}"));
        let qkv = linear_fused(&mut g, h, &format!("{b}.attn1.qkv"), &qkv_parts, d, d, bias)?;
        let a = g.op(
            &format!("{b}.attn1.attention"),
            Op::Attention {
                heads,
                head_dim,
                scale,
                q_offset: 0,
                k_offset: d as u32,
                v_offset: 2 * d as u32,
                has_mask: false,
                masked_value: 0.0,
                has_bias: false,
                bf16_products: false,
            },
            &[qkv, qkv],
        )?;
        let a = linear(&mut g, a, &format!("{b}.attn1.to_out.0"), d, d, true)?;
        x = g.op(
            &format!("{b}.attn1.residual"),
            Op::GatedResidual { gate_row: 2 },
            &[x, a, m],
        )?;

        // Cross-attention: x += attn2(x, caption), no norm, no gate; padded tokens −10000.
        let q = linear(&mut g, x, &format!("{b}.attn2.to_q"), d, d, bias)?;
        let kv = if cached.is_some() {
            g.op(
                &format!("{b}.attn2.kv.rows"),
                Op::Rows {
                    start: (n * seq_len) as u64,
                    len: seq_len as u64,
                },
                &[caption],
            )?
        } else {
            let kv_parts = ["to_k", "to_v"].map(|s| format!("{b}.attn2.{s}"));
            linear_fused(
                &mut g,
                caption,
                &format!("{b}.attn2.kv"),
                &kv_parts,
                d,
                cfg.cross_attention_dim,
                bias,
            )?
        };
        let a = g.op(
            &format!("{b}.attn2.attention"),
            Op::Attention {
                heads,
                head_dim,
                scale,
                q_offset: 0,
                k_offset: 0,
                v_offset: d as u32,
                has_mask: true,
                masked_value: -10000.0,
                has_bias: false,
                bf16_products: false,
            },
            &[q, kv, mask],
        )?;
        let a = linear(&mut g, a, &format!("{b}.attn2.to_out.0"), d, d, true)?;
        x = g.op(&format!("{b}.attn2.residual"), Op::Add, &[x, a])?;

        // Feed-forward: x += gate_mlp · ff(LN(x)·(1+scale_mlp)+shift_mlp). Its own segment
        // (finer cut: the MLP holds two thirds of a block's weights).
        g.cut(format!("{b}.ff"));
        let h = g.op(&format!("{b}.norm2"), ln.clone(), &[x])?;
        let h = g.op(
            &format!("{b}.norm2.modulate"),
            Op::Modulate {
                shift_row: 3,
                scale_row: 4,
            },
            &[h, m],
        )?;
        let h = linear_gelu(
            &mut g,
            h,
            &format!("{b}.ff.net.0.proj"),
            &format!("{b}.ff.net.0.proj+act"),
            4 * d,
            d,
            true,
        )?;
        let h = linear(&mut g, h, &format!("{b}.ff.net.2"), d, 4 * d, true)?;
        x = g.op(
            &format!("{b}.ff.residual"),
            Op::GatedResidual { gate_row: 5 },
            &[x, h, m],
        )?;
    }

    // Final layer: shift, scale = scale_shift_table + embedded_timestep; LN; modulate; proj_out.
    g.cut("final_layer");
    let sst = g.weight("scale_shift_table", &[2, d], WeightKind::Table)?;
    let et = g.op_shaped(
        "final_layer.embedded_timestep",
        Op::Reshape,
        &[embedded_timestep],
        &[d],
    )?;
    let m = g.op("final_layer.modulation", Op::Add, &[sst, et])?;
    let h = g.op(
        "norm_out",
        Op::LayerNorm {
            eps: 1e-6,
            affine: false,
        },
        &[x],
    )?;
    let h = g.op(
        "norm_out.modulate",
        Op::Modulate {
            shift_row: 0,
            scale_row: 1,
        },
        &[h, m],
    )?;
    let h = linear(&mut g, h, "proj_out", p * p * cout, d, true)?;

    // Unpatchify: token (y, x) holds (p_y, p_x, c) with c fastest → [c, y·p + p_y, x·p + p_x].
    let h = g.op_shaped("unpatchify.split", Op::Reshape, &[h], &[gh, gw, p, p, cout])?;
    let h = g.op(
        "unpatchify.permute",
        Op::Permute {
            perm: vec![4, 0, 2, 1, 3],
        },
        &[h],
    )?;
    let out = g.op_shaped("unpatchify", Op::Reshape, &[h], &[cout, latent_h, latent_w])?;
    let eps = if cout == 2 * cin {
        g.op(
            "eps",
            Op::Slice {
                axis: 0,
                start: 0,
                len: cin as u64,
            },
            &[out],
        )?
    } else {
        out
    };
    g.output(eps);
    Ok(g)
}
