//! The tiny autoencoder (diffusers 0.42 `AutoencoderTiny`, `models/autoencoders/vae.py`
//! `EncoderTiny` / `DecoderTiny`, `models/unets/unet_2d_blocks.py` `AutoencoderTinyBlock`):
//! TAESD for PixArt-α's SD VAE latents, TAESDXL for PixArt-Σ's SDXL latents.
//!
//! Every convolution is 3×3 with padding 1; a block is
//! `ReLU(conv(ReLU(conv(ReLU(conv(x))))) + x)` (convolutions with bias, identity skip: the
//! channels never change inside a stage). Weights keep diffusers' `nn.Sequential` names:
//! `decoder.layers.N.…`, `encoder.layers.N.…`, a block's convolutions at `conv.0`, `conv.2`,
//! `conv.4`.

use edge_graph::schema::op::Op;
use edge_graph::schema::DType;
use edge_graph::{Graph, ValueId, WeightKind};

use crate::config::TinyVaeConfig;
use crate::ModelError;

const MODEL: &str = "AutoencoderTiny";
const SAME: [u32; 4] = [1, 1, 1, 1];

type GResult<T> = edge_graph::Result<T>;

/// A 3×3 convolution `prefix.{weight,bias}` to `cout` channels.
fn conv3(
    g: &mut Graph,
    x: ValueId,
    prefix: &str,
    cout: usize,
    stride: u32,
    bias: bool,
) -> GResult<ValueId> {
    let cin = g.dims(x).first().copied().unwrap_or(0);
    let w = g.weight(
        &format!("{prefix}.weight"),
        &[cout, cin, 3, 3],
        WeightKind::ConvKernel,
    )?;
    let mut ins = vec![x, w];
    if bias {
        ins.push(g.weight(&format!("{prefix}.bias"), &[cout], WeightKind::Vector)?);
    }
    g.op(
        prefix,
        Op::Conv2d {
            stride: [stride, stride],
            pad: SAME,
            has_bias: bias,
        },
        &ins,
    )
}

/// `AutoencoderTinyBlock` with equal in and out channels.
fn block(g: &mut Graph, x: ValueId, p: &str) -> GResult<ValueId> {
    let c = g.dims(x)[0];
    let h = conv3(g, x, &format!("{p}.conv.0"), c, 1, true)?;
    let h = g.op(&format!("{p}.conv.1"), Op::Relu, &[h])?;
    let h = conv3(g, h, &format!("{p}.conv.2"), c, 1, true)?;
    let h = g.op(&format!("{p}.conv.3"), Op::Relu, &[h])?;
    let h = conv3(g, h, &format!("{p}.conv.4"), c, 1, true)?;
    let s = g.op(&format!("{p}.sum"), Op::Add, &[h, x])?;
    g.op(&format!("{p}.fuse"), Op::Relu, &[s])
}

/// `x + c` for a scalar `c`, as a broadcast add of a constant row `[w]`.
fn add_scalar(g: &mut Graph, x: ValueId, name: &str, c: f32) -> GResult<ValueId> {
    let w = *g.dims(x).last().unwrap_or(&1);
    let k = g.constant(&format!("{name}.constant"), &[w], vec![c; w])?;
    g.op(name, Op::Add, &[x, k])
}

fn check(h: usize, w: usize, what: &str) -> Result<(), ModelError> {
    if h == 0 || w == 0 {
        return Err(ModelError::Size {
            model: MODEL,
            msg: format!("{what} {h}×{w} (h×w) must be positive"),
        });
    }
    Ok(())
}

/// Builds the tiny decoder for a `latent_h × latent_w` latent, as the pipeline calls it:
/// `vae.decode(latents / scaling_factor)`.
///
/// Input: `latent [latent_channels, latent_h, latent_w]` (the sampler's latents). Output:
/// `image [out_channels, f·latent_h, f·latent_w]` in about −1…1 (`f` = 2^(stages − 1)), not
/// clamped. The graph: `/ scaling_factor` (left out when it is 1), `tanh(x / 3) · 3` (the 3
/// is hard-coded in diffusers; `x / 3` is computed as `x · (1/3)`, within an ulp), conv →
/// ReLU, per stage its blocks, a nearest 2× upsample (not after the last) and a conv (no bias,
/// the last with bias to `out_channels`), then `· 2 − 1`.
///
/// Errors: [`ModelError::Size`] for a zero side.
pub fn build_tiny_decoder(
    cfg: &TinyVaeConfig,
    latent_h: usize,
    latent_w: usize,
) -> Result<Graph, ModelError> {
    check(latent_h, latent_w, "latent")?;
    let mut g = Graph::new("tiny_decoder");
    let latent = g.input(
        "latent",
        &[cfg.latent_channels, latent_h, latent_w],
        DType::F32,
    );
    let mut x = latent;
    if cfg.scaling_factor != 1.0 {
        x = g.op(
            "unscale",
            Op::Scale {
                factor: 1.0 / cfg.scaling_factor,
            },
            &[x],
        )?;
    }
    let x = g.op("clamp.div", Op::Scale { factor: 1.0 / 3.0 }, &[x])?;
    let x = g.op("clamp.tanh", Op::Tanh, &[x])?;
    let mut x = g.op("clamp.mul", Op::Scale { factor: 3.0 }, &[x])?;
    let chans = &cfg.decoder_block_out_channels;
    let mut idx = 0usize;
    let name = |i: &mut usize| {
        let n = format!("decoder.layers.{i}");
        *i += 1;
        n
    };
    x = conv3(&mut g, x, &name(&mut idx), chans[0], 1, true)?;
    x = g.op(&name(&mut idx), Op::Relu, &[x])?;
    for (i, (&c, &nb)) in chans.iter().zip(&cfg.num_decoder_blocks).enumerate() {
        let last = i + 1 == chans.len();
        g.cut(format!("decoder.stage.{i}"));
        for _ in 0..nb {
            x = block(&mut g, x, &name(&mut idx))?;
        }
        if !last {
            x = g.op(&name(&mut idx), Op::UpsampleNearest2x, &[x])?;
        }
        let cout = if last { cfg.out_channels } else { c };
        x = conv3(&mut g, x, &name(&mut idx), cout, 1, last)?;
    }
    let x = g.op("output.mul", Op::Scale { factor: 2.0 }, &[x])?;
    let image = add_scalar(&mut g, x, "output.sub", -1.0)?;
    g.output(image);
    Ok(g)
}

/// Builds the tiny encoder for an `image_h × image_w` image (`vae.encode(image).latents`).
///
/// Input: `image [in_channels, image_h, image_w]` in [−1, 1]. Output: `latents
/// [latent_channels, image_h/f, image_w/f]` (not multiplied by the scaling factor). The graph:
/// `(x + 1) / 2` (as `· 0.5`, exact), per stage a conv (the first with bias; the others
/// stride 2 with symmetric padding 1 and no bias) and its blocks, then a conv to
/// `latent_channels`.
///
/// Errors: [`ModelError::Size`] when a side is zero or not a multiple of `f`.
pub fn build_tiny_encoder(
    cfg: &TinyVaeConfig,
    image_h: usize,
    image_w: usize,
) -> Result<Graph, ModelError> {
    let f = cfg.downscale_factor();
    check(image_h, image_w, "image")?;
    if !image_h.is_multiple_of(f) || !image_w.is_multiple_of(f) {
        return Err(ModelError::Size {
            model: MODEL,
            msg: format!("image {image_h}×{image_w} (h×w) must be a multiple of {f}"),
        });
    }
    let mut g = Graph::new("tiny_encoder");
    let image = g.input("image", &[cfg.in_channels, image_h, image_w], DType::F32);
    let x = add_scalar(&mut g, image, "input.add", 1.0)?;
    let mut x = g.op("input.div", Op::Scale { factor: 0.5 }, &[x])?;
    let chans = &cfg.encoder_block_out_channels;
    let mut idx = 0usize;
    for (i, (&c, &nb)) in chans.iter().zip(&cfg.num_encoder_blocks).enumerate() {
        g.cut(format!("encoder.stage.{i}"));
        let p = format!("encoder.layers.{idx}");
        idx += 1;
        x = if i == 0 {
            conv3(&mut g, x, &p, c, 1, true)?
        } else {
            conv3(&mut g, x, &p, c, 2, false)?
        };
        for _ in 0..nb {
            x = block(&mut g, x, &format!("encoder.layers.{idx}"))?;
            idx += 1;
        }
    }
    let latents = conv3(
        &mut g,
        x,
        &format!("encoder.layers.{idx}"),
        cfg.latent_channels,
        1,
        true,
    )?;
    g.output(latents);
    Ok(g)
}
