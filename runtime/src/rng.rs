//! Seeded Gaussian noise for the initial latents.
//!
//! Two generators, each defined here bit for bit so that a seed gives the same latents on every
//! platform and with any thread count:
//!
//! - [`TorchCpuGenerator`]: torch's CPU generator (`torch.Generator("cpu").manual_seed(s)`,
//!   MT19937) and its `torch.randn` float32 normal transform, on either of torch's paths
//!   ([`TorchPath`]), so `-s 42` gives the noise — and the image — diffusers gives for seed 42.
//!   The AVX2 path's polynomials are evaluated here in scalar f32 with `mul_add` where torch's
//!   build contracts to FMA: one rounding each, so the same bits on every CPU.
//! - [`gaussian`]: SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
//!   generators", OOPSLA 2014) feeding the Box–Muller transform in f64, rounded to f32: this
//!   runtime's first generator (`--rng edge`).

/// Which noise a seed names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NoiseRng {
    /// torch's CPU generator with the normal transform of torch builds that have AVX2 kernels
    /// (x86-64 workstations, where diffusers references are made): the default.
    #[default]
    TorchCpu,
    /// torch's CPU generator with the DEFAULT-capability transform (torch builds without AVX2
    /// kernels, e.g. aarch64): glibc `logf`, `sinf`, `cosf`.
    TorchCpuDefault,
    /// SplitMix64 + Box–Muller ([`gaussian`]).
    Edge,
}

impl NoiseRng {
    /// The name `--rng` takes and the PNG records.
    pub const fn name(self) -> &'static str {
        match self {
            NoiseRng::TorchCpu => "torch-cpu",
            NoiseRng::TorchCpuDefault => "torch-cpu-default",
            NoiseRng::Edge => "edge",
        }
    }

    /// Standard normal noise for `seed` into `out` (flat, e.g. `[c, h, w]`), as `torch.randn`
    /// of that many elements on a freshly seeded generator (or [`gaussian`]).
    pub fn fill(self, seed: u64, out: &mut [f32]) {
        NoiseStream::new(self, seed).fill(out);
    }
}

impl std::str::FromStr for NoiseRng {
    type Err = String;

    /// `torch-cpu` (also `cpu`, stable-diffusion.cpp's spelling), `torch-cpu-default`, `edge`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "torch-cpu" | "cpu" => Ok(NoiseRng::TorchCpu),
            "torch-cpu-default" => Ok(NoiseRng::TorchCpuDefault),
            "edge" => Ok(NoiseRng::Edge),
            _ => Err(format!(
                "unknown generator {s:?}; expected torch-cpu (or cpu), torch-cpu-default or edge"
            )),
        }
    }
}

/// One generator's stream of standard normal draws, for the initial noise and the per-step
/// noise of stochastic samplers (drawn in that order, as diffusers draws them from the one
/// generator it is given).
#[derive(Clone, Debug)]
pub enum NoiseStream {
    /// torch's generator on one of its paths (boxed: its state is 2.5 KB).
    Torch(Box<TorchCpuGenerator>, TorchPath),
    /// SplitMix64 + Box–Muller in pairs ([`gaussian`] is its first draw).
    Edge(SplitMix64),
}

impl NoiseStream {
    /// A fresh stream of `rng` seeded with `seed`.
    pub fn new(rng: NoiseRng, seed: u64) -> Self {
        match rng {
            NoiseRng::TorchCpu => NoiseStream::Torch(
                Box::new(TorchCpuGenerator::manual_seed(seed)),
                TorchPath::Avx2,
            ),
            NoiseRng::TorchCpuDefault => NoiseStream::Torch(
                Box::new(TorchCpuGenerator::manual_seed(seed)),
                TorchPath::Default,
            ),
            NoiseRng::Edge => NoiseStream::Edge(SplitMix64::new(seed)),
        }
    }

    /// The next draw of `out.len()` normals (one `torch.randn` call).
    pub fn fill(&mut self, out: &mut [f32]) {
        match self {
            NoiseStream::Torch(g, path) => g.randn(out, *path),
            NoiseStream::Edge(rng) => gaussian_from(rng, out),
        }
    }
}

/// The 32-bit Mersenne Twister MT19937 (Matsumoto & Nishimura 1998), as torch's CPU
/// generator runs it.
#[derive(Clone, Debug)]
pub struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    /// Seeded with `seed` by the reference initialisation
    /// `s[i] = 1812433253 · (s[i−1] ⊕ (s[i−1] >> 30)) + i`.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let p = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(p ^ (p >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        for i in 0..624 {
            let y = (self.state[i] & UPPER) | (self.state[(i + 1) % 624] & LOWER);
            let mut v = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            self.state[i] = v;
        }
        self.index = 0;
    }

    /// The next 32 tempered bits.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Two outputs, the first in the high half (torch's `random64`).
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        (hi << 32) | u64::from(self.next_u32())
    }
}

/// Which of torch's float32 normal transforms to follow (they differ in the last bits of about
/// 39 % of the elements, by at most 2e-6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchPath {
    /// Torch's AVX2/AVX-512 kernel: Cephes `log`/`sincos` polynomials of ATen's
    /// `avx_mathfun.h` with the FMA contractions of torch's build.
    Avx2,
    /// Torch's DEFAULT capability: libm `logf`, `cosf`, `sinf` (glibc).
    Default,
}

/// torch's CPU generator: `torch.Generator("cpu").manual_seed(seed)` and the float32
/// `torch.randn` it feeds, following `../shared/fixtures/README.md` §9 (checked there against
/// torch 2.15 bit for bit; here against its stored draws).
#[derive(Clone, Debug)]
pub struct TorchCpuGenerator {
    mt: Mt19937,
    /// The normal the double Box–Muller (fewer than 16 elements) keeps for the next call.
    cached_normal: Option<f64>,
}

impl TorchCpuGenerator {
    /// `manual_seed(seed)`: only the low 32 bits of the seed count (torch's behaviour).
    pub fn manual_seed(seed: u64) -> Self {
        TorchCpuGenerator {
            mt: Mt19937::new(seed as u32),
            cached_normal: None,
        }
    }

    /// A float uniform in [0, 1): 24 random bits.
    fn uniform_f32(&mut self) -> f32 {
        (self.mt.next_u32() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0)
    }

    /// A double uniform in [0, 1): 53 random bits.
    fn uniform_f64(&mut self) -> f64 {
        (self.mt.next_u64() & ((1u64 << 53) - 1)) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `torch.randn(out.len(), generator=self, dtype=float32)` into `out`. Consecutive calls
    /// continue the stream as consecutive `torch.randn` calls do.
    pub fn randn(&mut self, out: &mut [f32], path: TorchPath) {
        let n = out.len();
        if n < 16 {
            for v in out.iter_mut() {
                *v = match self.cached_normal.take() {
                    Some(c) => c as f32,
                    None => {
                        let u1 = self.uniform_f64();
                        let u2 = self.uniform_f64();
                        let r = (-2.0 * (-u2).ln_1p()).sqrt();
                        let theta = 2.0 * std::f64::consts::PI * u1;
                        self.cached_normal = Some(r * theta.sin());
                        (r * theta.cos()) as f32
                    }
                };
            }
            return;
        }
        for v in out.iter_mut() {
            *v = self.uniform_f32();
        }
        for i in (0..=n - 16).step_by(16) {
            box_muller_16(&mut out[i..i + 16], path);
        }
        if !n.is_multiple_of(16) {
            let tail = &mut out[n - 16..];
            for v in tail.iter_mut() {
                *v = self.uniform_f32();
            }
            box_muller_16(tail, path);
        }
    }
}

/// torch's `normal_fill_16`: uniforms `d[0..16]` → normals, `u1 = 1 − d[j]`, `u2 = d[j + 8]`,
/// `d[j] = r·cos θ`, `d[j + 8] = r·sin θ` with `r = sqrt(−2 ln u1)`, `θ = 2π u2`.
fn box_muller_16(d: &mut [f32], path: TorchPath) {
    for j in 0..8 {
        let u1 = 1.0 - d[j];
        let u2 = d[j + 8];
        let (r, cos, sin) = match path {
            TorchPath::Avx2 => {
                let r = (-2.0 * ln_cephes(u1)).sqrt();
                let (s, c) = sincos_cephes(std::f32::consts::TAU * u2);
                (r, c, s)
            }
            TorchPath::Default => {
                let r = (-2.0 * u1.ln()).sqrt();
                let theta = (2.0 * std::f64::consts::PI * f64::from(u2)) as f32;
                (r, theta.cos(), theta.sin())
            }
        };
        d[j] = r * cos;
        d[j + 8] = r * sin;
    }
}

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
    gaussian_from(&mut SplitMix64::new(seed), out);
}

/// [`gaussian`]'s draws from `rng` onwards (pairs; an odd count drops the last sine).
fn gaussian_from(rng: &mut SplitMix64, out: &mut [f32]) {
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

/// `log256_ps` of ATen's `avx_mathfun.h` (Cephes `logf`) for `x > 0`, with torch's FMA
/// contractions as `mul_add`. Constants as Cephes writes them (rounded to f32).
#[allow(clippy::excessive_precision)]
fn ln_cephes(x: f32) -> f32 {
    const P: [f32; 9] = [
        7.0376836292e-2,
        -1.1514610310e-1,
        1.1676998740e-1,
        -1.2420140846e-1,
        1.4249322787e-1,
        -1.6668057665e-1,
        2.0000714765e-1,
        -2.4999993993e-1,
        3.3333331174e-1,
    ];
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 127) as f32 + 1.0;
    // The mantissa with the exponent of 0.5: m in [0.5, 1).
    let m = f32::from_bits((bits & !0x7f80_0000) | 0x3f00_0000);
    let xm = if m < std::f32::consts::FRAC_1_SQRT_2 {
        e -= 1.0;
        (m - 1.0) + m
    } else {
        m - 1.0
    };
    let z = xm * xm;
    let mut y = P[0];
    for &p in &P[1..] {
        y = y.mul_add(xm, p);
    }
    y *= xm;
    y = y.mul_add(z, e * -2.12194440e-4);
    y = z.mul_add(-0.5, y);
    e.mul_add(0.693359375, xm + y)
}

/// `sincos256_ps` of ATen's `avx_mathfun.h` (Cephes) for `θ ≥ 0`, with torch's FMA
/// contractions as `mul_add`: returns `(sin θ, cos θ)`.
#[allow(clippy::excessive_precision)]
fn sincos_cephes(theta: f32) -> (f32, f32) {
    let mut j = (theta * 1.27323954473516) as i32;
    j = (j + 1) & !1;
    let y = j as f32;
    let mut x = y.mul_add(-0.78515625, theta);
    x = y.mul_add(-2.4187564849853515625e-4, x);
    x = y.mul_add(-3.77489497744594108e-8, x);
    let z = x * x;
    let mut c = 2.443315711809948e-5f32
        .mul_add(z, -1.388731625493765e-3)
        .mul_add(z, 4.166664568298827e-2);
    c = (c * z).mul_add(z, -(z * 0.5)) + 1.0;
    let mut s = (-1.9515295891e-4f32)
        .mul_add(z, 8.3321608736e-3)
        .mul_add(z, -1.6666654611e-1);
    s = (s * z).mul_add(x, x);
    let (mut sin, mut cos) = if j & 2 != 0 { (c, s) } else { (s, c) };
    if j & 4 != 0 {
        sin = -sin;
    }
    if (j - 2) & 4 == 0 {
        cos = -cos;
    }
    (sin, cos)
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
