//! Seeded Gaussian noise for the initial latents.
//!
//! The generator is SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014) feeding the Box–Muller transform in f64, rounded to f32. It is
//! defined here, bit for bit, so that a seed gives the same latents on every platform and
//! with any thread count. It does not reproduce torch's generator: to compare with diffusers
//! from identical noise, pass the noise with `--init-latents`.

/// A SplitMix64 stream.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in (0, 1] (53 random bits).
    fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// Fills `out` with standard normal samples (mean 0, variance 1) from `seed`.
pub fn gaussian(seed: u64, out: &mut [f32]) {
    let mut rng = SplitMix64::new(seed);
    let mut i = 0;
    while i < out.len() {
        let u1 = rng.next_open01();
        let u2 = rng.next_open01();
        let r = (-2.0 * u1.ln()).sqrt();
        let th = std::f64::consts::TAU * u2;
        out[i] = (r * th.cos()) as f32;
        if i + 1 < out.len() {
            out[i + 1] = (r * th.sin()) as f32;
        }
        i += 2;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_noise_and_unit_variance() {
        let mut a = vec![0f32; 10_001];
        let mut b = vec![0f32; 10_001];
        gaussian(42, &mut a);
        gaussian(42, &mut b);
        assert_eq!(a, b);
        gaussian(43, &mut b);
        assert_ne!(a, b);
        let n = a.len() as f64;
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = a
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
    }
}
