//! The AutoencoderKL decoder and encoder (diffusers 0.42 `AutoencoderKL`,
//! `models/autoencoders/vae.py` `Encoder`/`Decoder`, `UNetMidBlock2D`, `ResnetBlock2D`,
//! `Attention` with group norm, `Upsample2D`, `Downsample2D`).
//!
//! GroupNorm eps is 1e-6 everywhere; the activation is SiLU; ResNets add a 1×1
//! `conv_shortcut` when their channel count changes; the mid-block attention is single-head
//! over the `h·w` pixels with scale `1/sqrt(C)` and a residual.

use edge_graph::schema::op::Op;
use edge_graph::schema::DType;
use edge_graph::{Graph, ValueId};

use crate::config::{ConfigError, VaeConfig};
use crate::util::{conv2d, group_norm, linear, linear_fused};
use crate::ModelError;

const MODEL: &str = "AutoencoderKL";
const GN_EPS: f32 = 1e-6;
const SAME: [u32; 4] = [1, 1, 1, 1];

type GResult<T> = edge_graph::Result<T>;

/// `ResnetBlock2D` without time embedding: `x [cin, h, w]` → `[cout, h, w]`.
fn resnet(g: &mut Graph, x: ValueId, p: &str, cout: usize, groups: usize) -> GResult<ValueId> {
    let cin = g.dims(x)[0];
    let h = group_norm(g, x, &format!("{p}.norm1"), groups, GN_EPS)?;
    let h = g.op(&format!("{p}.act1"), Op::Silu, &[h])?;
    let h = conv2d(g, h, &format!("{p}.conv1"), cout, 3, 1, SAME)?;
    let h = group_norm(g, h, &format!("{p}.norm2"), groups, GN_EPS)?;
    let h = g.op(&format!("{p}.act2"), Op::Silu, &[h])?;
    let h = conv2d(g, h, &format!("{p}.conv2"), cout, 3, 1, SAME)?;
    let skip = if cin != cout {
        conv2d(g, x, &format!("{p}.conv_shortcut"), cout, 1, 1, [0; 4])?
    } else {
        x
    };
    g.op(&format!("{p}.residual"), Op::Add, &[skip, h])
}

/// Single-head `Attention` with group norm and residual: `x [c, h, w]` → `[c, h, w]`.
/// q/k/v are fused into one Linear over the pixel tokens `[h·w, c]`.
fn attention(g: &mut Graph, x: ValueId, p: &str, groups: usize) -> GResult<ValueId> {
    let dims = g.dims(x);
    let (c, hw) = (dims[0], dims[1] * dims[2]);
    let h = group_norm(g, x, &format!("{p}.group_norm"), groups, GN_EPS)?;
    let h = g.op_shaped(&format!("{p}.flatten"), Op::Reshape, &[h], &[c, hw])?;
    let t = g.op(
        &format!("{p}.tokens"),
        Op::Permute { perm: vec![1, 0] },
        &[h],
    )?;
    let parts = ["to_q", "to_k", "to_v"].map(|s| format!("{p}.{s}"));
    let qkv = linear_fused(g, t, &format!("{p}.qkv"), &parts, c, c, true)?;
    let a = g.op(
        &format!("{p}.attention"),
        Op::Attention {
            heads: 1,
            head_dim: c as u32,
            scale: (1.0 / (c as f64).sqrt()) as f32,
            q_offset: 0,
            k_offset: c as u32,
            v_offset: 2 * c as u32,
            has_mask: false,
            masked_value: 0.0,
            has_bias: false,
            bf16_products: false,
        },
        &[qkv, qkv],
    )?;
    let o = linear(g, a, &format!("{p}.to_out.0"), c, c, true)?;
    let o = g.op(
        &format!("{p}.channels"),
        Op::Permute { perm: vec![1, 0] },
        &[o],
    )?;
    let o = g.op_shaped(&format!("{p}.unflatten"), Op::Reshape, &[o], &dims)?;
    g.op(&format!("{p}.residual"), Op::Add, &[o, x])
}

/// `UNetMidBlock2D`: resnet, (attention, resnet).
fn mid_block(g: &mut Graph, x: ValueId, p: &str, cfg: &VaeConfig) -> GResult<ValueId> {
    let c = g.dims(x)[0];
    let groups = cfg.norm_num_groups;
    let mut x = resnet(g, x, &format!("{p}.resnets.0"), c, groups)?;
    if cfg.mid_block_add_attention {
        x = attention(g, x, &format!("{p}.attentions.0"), groups)?;
    }
    resnet(g, x, &format!("{p}.resnets.1"), c, groups)
}

/// `conv_norm_out` → SiLU → `conv_out` (3×3).
fn out_head(g: &mut Graph, x: ValueId, p: &str, cout: usize, groups: usize) -> GResult<ValueId> {
    let h = group_norm(g, x, &format!("{p}.conv_norm_out"), groups, GN_EPS)?;
    let h = g.op(&format!("{p}.conv_act"), Op::Silu, &[h])?;
    conv2d(g, h, &format!("{p}.conv_out"), cout, 3, 1, SAME)
}

/// The channels of the coarsest level; an error for an empty `block_out_channels`.
fn top_channels(cfg: &VaeConfig) -> Result<usize, ModelError> {
    cfg.block_out_channels.last().copied().ok_or_else(|| {
        ConfigError::Inconsistent {
            model: MODEL,
            msg: "`block_out_channels` is empty".into(),
        }
        .into()
    })
}

fn check_latent(latent_h: usize, latent_w: usize) -> Result<(), ModelError> {
    if latent_h == 0 || latent_w == 0 {
        return Err(ModelError::Size {
            model: MODEL,
            msg: format!("latent {latent_h}×{latent_w} (h×w) must not be empty"),
        });
    }
    Ok(())
}

/// The decoder up to and including the mid block: unscale, `post_quant_conv`, `conv_in`, the
/// mid block (with its attention over every pixel).
fn decoder_head(g: &mut Graph, latent: ValueId, cfg: &VaeConfig) -> Result<ValueId, ModelError> {
    let top = top_channels(cfg)?;
    let lc = cfg.latent_channels;
    let factor = (1.0 / f64::from(cfg.scaling_factor)) as f32;
    let mut x = g.op("unscale", Op::Scale { factor }, &[latent])?;
    if cfg.use_post_quant_conv {
        x = conv2d(g, x, "post_quant_conv", lc, 1, 1, [0; 4])?;
    }
    x = conv2d(g, x, "decoder.conv_in", top, 3, 1, SAME)?;
    g.cut("decoder.mid_block");
    Ok(mid_block(g, x, "decoder.mid_block", cfg)?)
}

/// The decoder after the mid block: the up blocks, `conv_norm_out`, SiLU, `conv_out`. Only
/// local operations (3×3 and 1×1 convolutions, GroupNorm, SiLU, nearest upsampling).
fn decoder_tail(g: &mut Graph, mut x: ValueId, cfg: &VaeConfig) -> GResult<ValueId> {
    let groups = cfg.norm_num_groups;
    let blocks = &cfg.block_out_channels;
    for (i, &cout) in blocks.iter().rev().enumerate() {
        let p = format!("decoder.up_blocks.{i}");
        g.cut(p.clone());
        for r in 0..=cfg.layers_per_block {
            x = resnet(g, x, &format!("{p}.resnets.{r}"), cout, groups)?;
        }
        if i + 1 < blocks.len() {
            x = g.op(&format!("{p}.upsample"), Op::UpsampleNearest2x, &[x])?;
            x = conv2d(g, x, &format!("{p}.upsamplers.0.conv"), cout, 3, 1, SAME)?;
        }
    }
    g.cut("decoder.conv_out");
    out_head(g, x, "decoder", cfg.out_channels, groups)
}

/// Builds the VAE decoder for a `latent_h × latent_w` latent.
///
/// Input: `latent [latent_channels, latent_h, latent_w]`, the sampler's latents; the graph
/// first applies `Scale { factor: 1/scaling_factor }` (the pipeline decodes
/// `latents / scaling_factor`). Output: `image [out_channels, f·latent_h, f·latent_w]` with
/// `f = 2^(len(block_out_channels) − 1)` (8 for the PixArt VAEs), raw values in about [−1, 1],
/// not clamped. The graph is [`build_vae_decoder_head`] followed by
/// [`build_vae_decoder_tail`], node for node.
///
/// Cuts: `decoder.mid_block`, `decoder.up_blocks.N`, `decoder.conv_out` (before
/// `conv_norm_out`).
///
/// Errors: [`ModelError::Size`] for a zero latent side.
pub fn build_vae_decoder(
    cfg: &VaeConfig,
    latent_h: usize,
    latent_w: usize,
) -> Result<Graph, ModelError> {
    check_latent(latent_h, latent_w)?;
    let mut g = Graph::new("vae_decoder");
    let latent = g.input(
        "latent",
        &[cfg.latent_channels, latent_h, latent_w],
        DType::F32,
    );
    let x = decoder_head(&mut g, latent, cfg)?;
    let image = decoder_tail(&mut g, x, cfg)?;
    g.output(image);
    Ok(g)
}

/// Builds the head of the VAE decoder for a whole `latent_h × latent_w` latent: everything up
/// to the mid block's output, which the mid-block attention needs the whole image for.
///
/// Input: `latent [latent_channels, latent_h, latent_w]` (as [`build_vae_decoder`]). Output:
/// `hidden [block_out_channels[-1], latent_h, latent_w]`. Cut: `decoder.mid_block`.
///
/// Errors: [`ModelError::Size`] for a zero latent side.
pub fn build_vae_decoder_head(
    cfg: &VaeConfig,
    latent_h: usize,
    latent_w: usize,
) -> Result<Graph, ModelError> {
    check_latent(latent_h, latent_w)?;
    let mut g = Graph::new("vae_decoder_head");
    let latent = g.input(
        "latent",
        &[cfg.latent_channels, latent_h, latent_w],
        DType::F32,
    );
    let x = decoder_head(&mut g, latent, cfg)?;
    g.output(x);
    Ok(g)
}

/// Builds the tail of the VAE decoder for a window of `latent_h × latent_w` latent pixels:
/// the up blocks and the output head, which hold only local operations and GroupNorms, so a
/// window of the head's output decodes to the matching window of the image when every
/// GroupNorm uses the whole image's statistics and the window carries enough context.
///
/// Input: `hidden [block_out_channels[-1], latent_h, latent_w]`. Output:
/// `image [out_channels, f·latent_h, f·latent_w]` (as [`build_vae_decoder`]). Cuts:
/// `decoder.up_blocks.N`, `decoder.conv_out`.
///
/// Errors: [`ModelError::Size`] for a zero latent side.
pub fn build_vae_decoder_tail(
    cfg: &VaeConfig,
    latent_h: usize,
    latent_w: usize,
) -> Result<Graph, ModelError> {
    check_latent(latent_h, latent_w)?;
    let top = top_channels(cfg)?;
    let mut g = Graph::new("vae_decoder_tail");
    let hidden = g.input("hidden", &[top, latent_h, latent_w], DType::F32);
    let image = decoder_tail(&mut g, hidden, cfg)?;
    g.output(image);
    Ok(g)
}

/// Builds the VAE encoder for an `image_h × image_w` image.
///
/// Input: `image [in_channels, image_h, image_w]` in [−1, 1]. Output:
/// `moments [2·latent_channels, image_h/f, image_w/f]` (`f` as in [`build_vae_decoder`]): the
/// mean in the first `latent_channels` channels and the (unclamped) log-variance in the rest,
/// after `quant_conv` when the config uses it. The graph is [`build_vae_encoder_down`]
/// followed by [`build_vae_encoder_mid`], node for node.
///
/// `Downsample2D` pads right and bottom by one and applies a 3×3 stride-2 convolution.
/// Cuts: `encoder.down_blocks.N`, `encoder.mid_block`, `encoder.conv_out` (before
/// `conv_norm_out`).
///
/// Errors: [`ModelError::Size`] when a side is zero or not a multiple of `f`.
pub fn build_vae_encoder(
    cfg: &VaeConfig,
    image_h: usize,
    image_w: usize,
) -> Result<Graph, ModelError> {
    check_image(cfg, image_h, image_w)?;
    let mut g = Graph::new("vae_encoder");
    let image = g.input("image", &[cfg.in_channels, image_h, image_w], DType::F32);
    let x = encoder_down(&mut g, image, cfg)?;
    let moments = encoder_mid(&mut g, x, cfg)?;
    g.output(moments);
    Ok(g)
}

/// Builds the front of the VAE encoder for a window of `latent_h × latent_w` latent pixels
/// (`f·latent_h × f·latent_w` image pixels): `conv_in` and the down blocks, which hold only
/// local operations (3×3 convolutions, stride 1 or 2) and GroupNorms, so a window of the image
/// encodes to the matching window of the down blocks' output when every GroupNorm uses the
/// whole image's statistics and the window carries enough context.
///
/// Input: `image [in_channels, f·latent_h, f·latent_w]`. Output:
/// `hidden [block_out_channels[-1], latent_h, latent_w]`. Cuts: `encoder.down_blocks.N`.
///
/// Errors: [`ModelError::Size`] for a zero latent side.
pub fn build_vae_encoder_down(
    cfg: &VaeConfig,
    latent_h: usize,
    latent_w: usize,
) -> Result<Graph, ModelError> {
    check_latent(latent_h, latent_w)?;
    let f = cfg.downscale_factor();
    let mut g = Graph::new("vae_encoder_down");
    let image = g.input(
        "image",
        &[cfg.in_channels, f * latent_h, f * latent_w],
        DType::F32,
    );
    let x = encoder_down(&mut g, image, cfg)?;
    g.output(x);
    Ok(g)
}

/// Builds the back of the VAE encoder for a whole `latent_h × latent_w` latent: the mid block
/// (whose attention needs the whole image), the output head and `quant_conv`.
///
/// Input: `hidden [block_out_channels[-1], latent_h, latent_w]`. Output: `moments` as
/// [`build_vae_encoder`]. Cuts: `encoder.mid_block`, `encoder.conv_out`.
///
/// Errors: [`ModelError::Size`] for a zero latent side.
pub fn build_vae_encoder_mid(
    cfg: &VaeConfig,
    latent_h: usize,
    latent_w: usize,
) -> Result<Graph, ModelError> {
    check_latent(latent_h, latent_w)?;
    let top = top_channels(cfg)?;
    let mut g = Graph::new("vae_encoder_mid");
    let hidden = g.input("hidden", &[top, latent_h, latent_w], DType::F32);
    let moments = encoder_mid(&mut g, hidden, cfg)?;
    g.output(moments);
    Ok(g)
}

fn check_image(cfg: &VaeConfig, image_h: usize, image_w: usize) -> Result<(), ModelError> {
    let f = cfg.downscale_factor();
    if image_h == 0 || image_w == 0 || !image_h.is_multiple_of(f) || !image_w.is_multiple_of(f) {
        return Err(ModelError::Size {
            model: MODEL,
            msg: format!("image {image_h}×{image_w} (h×w) must be a positive multiple of {f}"),
        });
    }
    Ok(())
}

/// `conv_in` and the down blocks.
fn encoder_down(g: &mut Graph, image: ValueId, cfg: &VaeConfig) -> Result<ValueId, ModelError> {
    let groups = cfg.norm_num_groups;
    let blocks = &cfg.block_out_channels;
    top_channels(cfg)?;
    let mut x = conv2d(g, image, "encoder.conv_in", blocks[0], 3, 1, SAME)?;
    for (i, &cout) in blocks.iter().enumerate() {
        let p = format!("encoder.down_blocks.{i}");
        g.cut(p.clone());
        for r in 0..cfg.layers_per_block {
            x = resnet(g, x, &format!("{p}.resnets.{r}"), cout, groups)?;
        }
        if i + 1 < blocks.len() {
            x = conv2d(
                g,
                x,
                &format!("{p}.downsamplers.0.conv"),
                cout,
                3,
                2,
                [0, 1, 0, 1],
            )?;
        }
    }
    Ok(x)
}

/// The mid block, the output head and `quant_conv`.
fn encoder_mid(g: &mut Graph, x: ValueId, cfg: &VaeConfig) -> Result<ValueId, ModelError> {
    g.cut("encoder.mid_block");
    let x = mid_block(g, x, "encoder.mid_block", cfg)?;
    g.cut("encoder.conv_out");
    let lc2 = 2 * cfg.latent_channels;
    let mut moments = out_head(g, x, "encoder", lc2, cfg.norm_num_groups)?;
    if cfg.use_quant_conv {
        moments = conv2d(g, moments, "quant_conv", lc2, 1, 1, [0; 4])?;
    }
    Ok(moments)
}
