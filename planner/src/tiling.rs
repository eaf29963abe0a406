//! Planning a tiled VAE decode: validate the user's tiling flags (the rules of
//! stable-diffusion.cpp's `--vae-tiling`, `--vae-tile-size`, `--vae-tile-overlap`,
//! `--vae-relative-tile-size`) and choose the largest tile that fits a memory budget.
//!
//! Tile sizes are in **image pixels** on the command line and in **latent pixels** in the
//! plan; a tile is at least [`MIN_TILE_LATENT`] latent pixels per axis and at most the image.

use edge_schema::plan::VaeTiling;

use crate::error::{PlanError, Result};

/// Smallest tile side, in latent pixels.
pub const MIN_TILE_LATENT: u32 = 4;

/// Default overlap between tiles, as a fraction of the tile.
pub const DEFAULT_OVERLAP: f32 = 0.5;

/// How tiles are decoded (`--vae-tile-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TileMode {
    /// GroupNorm statistics of the whole image, halo context, no blending: the tiled decode
    /// equals the whole-image decode (see `edge_schema::tiles`). Holds the activations between
    /// GroupNorms as whole-image tensors.
    #[default]
    Exact,
    /// Blended tiles whose GroupNorms normalise with statistics estimated by a whole-image
    /// decode of the latent reduced `factor` times per axis (`edge_schema::plan::StatsEstimate`):
    /// little more memory than blending, close to the whole-image decode (measured bounds in
    /// `edge_schema::tiles::ESTIMATE_BOUND_LEVELS`). What exact mode falls back to when its
    /// held activations fit nowhere.
    Estimate,
    /// Each tile decoded alone (its own GroupNorm statistics) and the overlaps blended, as
    /// stable-diffusion.cpp and diffusers' `tiled_decode` do: the least memory, but the picture
    /// changes (colours shift where a tile's statistics differ from the image's).
    Blend,
}

impl std::str::FromStr for TileMode {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "exact" => Ok(TileMode::Exact),
            "estimate" => Ok(TileMode::Estimate),
            "blend" => Ok(TileMode::Blend),
            other => Err(PlanError::Invalid(format!(
                "--vae-tile-mode `{other}`: expected exact, estimate or blend"
            ))),
        }
    }
}

impl TileMode {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            TileMode::Exact => "exact",
            TileMode::Estimate => "estimate",
            TileMode::Blend => "blend",
        }
    }
}

/// Where exact tiles hold the activations between GroupNorms (`--vae-tile-hold`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TileHold {
    /// Memory when the held tensors fit the budget (or there is none), else a file.
    #[default]
    Auto,
    /// Host memory.
    Memory,
    /// A temporary file on the device, read back a band of rows at a time.
    File,
}

impl std::str::FromStr for TileHold {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(TileHold::Auto),
            "memory" => Ok(TileHold::Memory),
            "file" => Ok(TileHold::File),
            other => Err(PlanError::Invalid(format!(
                "--vae-tile-hold `{other}`: expected auto, memory or file"
            ))),
        }
    }
}

/// What the user asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TileRequest {
    /// `--vae-tile-mode`.
    pub mode: TileMode,
    /// `--vae-tile-hold`.
    pub hold: TileHold,
    /// `--vae-tile-size WxH` (or one number): tile size in image pixels.
    pub size: Option<(u32, u32)>,
    /// `--vae-relative-tile-size X[xY]`: ≤ 1 a fraction of each axis, > 1 a tile count.
    pub relative: Option<(f32, f32)>,
    /// `--vae-tile-overlap`: fraction of a tile shared with its neighbour (0…0.5).
    pub overlap: Option<f32>,
    /// `--vae-estimate-factor`: the reduction of the statistics estimate's latent (2…64);
    /// by default the smallest power of two whose decoder fits the budget.
    pub estimate_factor: Option<u32>,
}

/// Largest latent reduction a statistics estimate may use.
pub const MAX_ESTIMATE_FACTOR: u32 = 64;

/// Parses and validates `--vae-estimate-factor` (an integer 2…64).
pub fn parse_estimate_factor(s: &str) -> Result<u32> {
    match s.trim().parse::<i64>() {
        Ok(f) if (2..=i64::from(MAX_ESTIMATE_FACTOR)).contains(&f) => Ok(f as u32),
        _ => Err(PlanError::Invalid(format!(
            "--vae-estimate-factor `{s}`: expected a whole number 2…{MAX_ESTIMATE_FACTOR} (latent pixels per reduced pixel)"
        ))),
    }
}

/// Validates `--vae-estimate-factor`.
pub fn validate_estimate_factor(f: u32) -> Result<u32> {
    if !(2..=MAX_ESTIMATE_FACTOR).contains(&f) {
        return Err(PlanError::Invalid(format!(
            "--vae-estimate-factor {f}: must be 2…{MAX_ESTIMATE_FACTOR} (latent pixels per reduced pixel)"
        )));
    }
    Ok(f)
}

/// Parses `WxH` or `N` (both axes) into a pair of positive integers.
pub fn parse_tile_size(s: &str) -> Result<(u32, u32)> {
    let err = || {
        PlanError::Invalid(format!(
            "--vae-tile-size `{s}`: expected WxH or one number of image pixels"
        ))
    };
    let parse = |t: &str| t.trim().parse::<u32>().map_err(|_| err());
    match s.split_once(['x', 'X']) {
        Some((w, h)) => Ok((parse(w)?, parse(h)?)),
        None => {
            let n = parse(s)?;
            Ok((n, n))
        }
    }
}

/// Parses `X` or `XxY` relative tile sizes (finite, positive).
pub fn parse_relative(s: &str) -> Result<(f32, f32)> {
    let err = |why: &str| {
        PlanError::Invalid(format!(
            "--vae-relative-tile-size `{s}`: {why} (expected X or XxY: ≤ 1 a fraction of the axis, > 1 a tile count)"
        ))
    };
    let parse = |t: &str| -> Result<f32> {
        let v: f32 = t.trim().parse().map_err(|_| err("not a number"))?;
        if !v.is_finite() || v <= 0.0 {
            return Err(err("must be a finite number above 0"));
        }
        Ok(v)
    };
    match s.split_once(['x', 'X']) {
        Some((a, b)) => Ok((parse(a)?, parse(b)?)),
        None => {
            let v = parse(s)?;
            Ok((v, v))
        }
    }
}

/// Validates an overlap: anything but a number in 0…0.5 is an error (a tile cannot share more
/// than half of itself with each neighbour).
pub fn validate_overlap(o: f32) -> Result<f32> {
    if !(0.0..=0.5).contains(&o) {
        return Err(PlanError::Invalid(format!(
            "--vae-tile-overlap {o}: must be a number in 0…0.5"
        )));
    }
    Ok(o)
}

/// Tile side (latent pixels) along an axis of `len` latent pixels for a relative request `r`.
fn relative_side(len: u32, r: f32, overlap: f32) -> u32 {
    let t = if r <= 1.0 {
        (len as f32 * r).round()
    } else {
        // `r` tiles with overlap o cover len = t·(r − (r − 1)·o).
        (len as f32 / (r - (r - 1.0) * overlap)).ceil()
    };
    (t as u32).clamp(MIN_TILE_LATENT.min(len), len)
}

fn overlap_px(tile: u32, overlap: f32) -> u32 {
    ((tile as f32 * overlap).round() as u32).min(tile.saturating_sub(1))
}

/// The tiling the user asked for explicitly, for an image of `width × height` pixels and a
/// VAE factor `ds`; `None` when no tile size was asked for. The tile stage index is left 0.
pub fn explicit_tiling(
    width: u32,
    height: u32,
    ds: u32,
    req: &TileRequest,
) -> Result<Option<VaeTiling>> {
    let overlap = validate_overlap(req.overlap.unwrap_or(DEFAULT_OVERLAP))?;
    let (lw, lh) = (width / ds, height / ds);
    let (tw, th) = if let Some((w, h)) = req.size {
        for (v, axis) in [(w, "width"), (h, "height")] {
            if v % ds != 0 || v < MIN_TILE_LATENT * ds {
                return Err(PlanError::Invalid(format!(
                    "--vae-tile-size {w}x{h}: tile {axis} {v} must be a multiple of {ds} and at least {} image pixels ({MIN_TILE_LATENT} latent pixels)",
                    MIN_TILE_LATENT * ds
                )));
            }
        }
        ((w / ds).min(lw), (h / ds).min(lh))
    } else if let Some((rx, ry)) = req.relative {
        for r in [rx, ry] {
            if !r.is_finite() || r <= 0.0 {
                return Err(PlanError::Invalid(format!(
                    "--vae-relative-tile-size {r}: must be a finite number above 0"
                )));
            }
        }
        (
            relative_side(lw, rx, overlap),
            relative_side(lh, ry, overlap),
        )
    } else {
        return Ok(None);
    };
    Ok(Some(VaeTiling {
        stage: 0,
        tile_latent_w: tw,
        tile_latent_h: th,
        overlap_latent_w: overlap_px(tw, overlap),
        overlap_latent_h: overlap_px(th, overlap),
        sync: None,
        estimate: None,
    }))
}

/// The largest tile (same aspect as the image where possible) for which `fits(tile_w,
/// tile_h)` (latent pixels) holds, shrinking one latent pixel at a time from the whole image.
/// `None` when not even the minimum tile fits.
pub fn largest_fitting(
    lw: u32,
    lh: u32,
    overlap: f32,
    mut fits: impl FnMut(u32, u32) -> Result<bool>,
) -> Result<Option<VaeTiling>> {
    let longest = lw.max(lh);
    let mut side = longest;
    while side >= MIN_TILE_LATENT.min(longest) && side > 0 {
        let tw = side.min(lw).max(MIN_TILE_LATENT.min(lw));
        let th = side.min(lh).max(MIN_TILE_LATENT.min(lh));
        if fits(tw, th)? {
            return Ok(Some(VaeTiling {
                stage: 0,
                tile_latent_w: tw,
                tile_latent_h: th,
                overlap_latent_w: overlap_px(tw, overlap),
                overlap_latent_h: overlap_px(th, overlap),
                sync: None,
                estimate: None,
            }));
        }
        // Shrink faster on large images: about 10 % per try, at least one latent pixel.
        side -= (side / 10).max(1);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_sizes_are_validated() {
        let r = |size, relative, overlap| TileRequest {
            mode: TileMode::Blend,
            hold: TileHold::Auto,
            size,
            relative,
            overlap,
            estimate_factor: None,
        };
        let t = explicit_tiling(512, 256, 8, &r(Some((256, 128)), None, None))
            .unwrap()
            .unwrap();
        assert_eq!((t.tile_latent_w, t.tile_latent_h), (32, 16));
        assert_eq!((t.overlap_latent_w, t.overlap_latent_h), (16, 8));
        // Capped at the image.
        let t = explicit_tiling(64, 64, 8, &r(Some((1024, 1024)), None, Some(0.25)))
            .unwrap()
            .unwrap();
        assert_eq!((t.tile_latent_w, t.overlap_latent_w), (8, 2));
        // Below the minimum, or not a multiple of the VAE factor.
        assert!(explicit_tiling(512, 512, 8, &r(Some((24, 64)), None, None)).is_err());
        assert!(explicit_tiling(512, 512, 8, &r(Some((36, 64)), None, None)).is_err());
        // Bad overlaps: negative, NaN, above one half.
        assert!(explicit_tiling(512, 512, 8, &r(Some((64, 64)), None, Some(-0.1))).is_err());
        assert!(explicit_tiling(512, 512, 8, &r(Some((64, 64)), None, Some(f32::NAN))).is_err());
        assert!(explicit_tiling(512, 512, 8, &r(Some((64, 64)), None, Some(0.9))).is_err());
        let t = explicit_tiling(512, 512, 8, &r(Some((64, 64)), None, Some(0.5)))
            .unwrap()
            .unwrap();
        assert_eq!(t.overlap_latent_w, 4);
        // Relative sizes: a fraction, a tile count, and invalid values.
        let t = explicit_tiling(512, 512, 8, &r(None, Some((0.5, 0.25)), Some(0.0)))
            .unwrap()
            .unwrap();
        assert_eq!((t.tile_latent_w, t.tile_latent_h), (32, 16));
        let t = explicit_tiling(512, 512, 8, &r(None, Some((3.0, 3.0)), Some(0.5)))
            .unwrap()
            .unwrap();
        assert_eq!(t.tile_latent_w, 32); // 3 tiles of 32 with overlap 16 cover 64
        assert!(explicit_tiling(512, 512, 8, &r(None, Some((0.0, 1.0)), None)).is_err());
        assert!(parse_relative("0").is_err());
        assert!(parse_relative("nan").is_err());
        assert!(parse_relative("-2").is_err());
        assert_eq!(parse_tile_size("256x128").unwrap(), (256, 128));
        assert_eq!(parse_tile_size("256").unwrap(), (256, 256));
        assert!(parse_tile_size("abc").is_err());
        assert_eq!(
            explicit_tiling(512, 512, 8, &r(None, None, None)).unwrap(),
            None
        );
    }

    #[test]
    fn largest_fitting_shrinks_until_it_fits() {
        let t = largest_fitting(64, 32, 0.5, |w, h| Ok(w * h <= 400))
            .unwrap()
            .unwrap();
        assert!(t.tile_latent_w * t.tile_latent_h <= 400);
        assert!(t.tile_latent_w >= 16, "{t:?}");
        assert_eq!(
            largest_fitting(64, 64, 0.5, |_, _| Ok(false)).unwrap(),
            None
        );
        let t = largest_fitting(8, 8, 0.5, |_, _| Ok(true))
            .unwrap()
            .unwrap();
        assert_eq!((t.tile_latent_w, t.tile_latent_h), (8, 8));
    }
}
