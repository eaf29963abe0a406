//! Shared test helpers: a seeded generator, f64 comparisons and thread-pool runners.
#![allow(dead_code)]

/// Sizes with ragged edges used by the shape loops.
pub const SIZES: [usize; 7] = [1, 3, 5, 17, 33, 64, 100];

/// SplitMix64: a small deterministic generator, so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Asserts `|got − want| ≤ tol(i)` element-wise, naming the first failure.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let t = tol(i);
        assert!(
            (f64::from(g) - w).abs() <= t && g.is_finite(),
            "{what}: element {i}: got {g}, want {w} (tolerance {t})"
        );
    }
}

/// Runs `f` inside a fresh rayon pool of `n` threads.
pub fn with_threads<T: Send>(n: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("a local rayon pool")
        .install(f)
}

/// Runs `f` with 1, 2 and 3 threads and asserts the outputs are bitwise identical.
pub fn assert_thread_invariant(what: &str, f: impl Fn() -> Vec<f32> + Send + Sync) {
    let one = with_threads(1, &f);
    for n in [2, 3] {
        let other = with_threads(n, &f);
        let same = one.len() == other.len()
            && one
                .iter()
                .zip(&other)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{what}: result with {n} threads differs from 1 thread"
        );
    }
}

/// Bytes of f32 values (little-endian), in a Vec<f32>-backed buffer so that they are 4-aligned.
pub struct AlignedBytes {
    words: Vec<u32>,
    len: usize,
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes {
            words: vec![0; len.div_ceil(4) + 16],
            len,
        }
    }

    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut a = Self::zeroed(bytes.len());
        a.bytes_mut().copy_from_slice(bytes);
        a
    }

    pub fn bytes(&self) -> &[u8] {
        let all: &[u8] = bytemuck_words(&self.words);
        &all[..self.len]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let all: &mut [u8] = bytemuck_words_mut(&mut self.words);
        &mut all[..len]
    }
}

fn bytemuck_words(w: &[u32]) -> &[u8] {
    zerocopy::IntoBytes::as_bytes(w)
}

fn bytemuck_words_mut(w: &mut [u32]) -> &mut [u8] {
    zerocopy::IntoBytes::as_mut_bytes(w)
}

pub fn f32_bytes(v: &[f32]) -> AlignedBytes {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    AlignedBytes::from_bytes(&bytes)
}

pub fn f16_bytes(v: &[f32]) -> (AlignedBytes, Vec<f32>) {
    let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
    let bytes: Vec<u8> = h.iter().flat_map(|x| x.to_le_bytes()).collect();
    (
        AlignedBytes::from_bytes(&bytes),
        h.iter().map(|x| x.to_f32()).collect(),
    )
}

pub fn bf16_bytes(v: &[f32]) -> (AlignedBytes, Vec<f32>) {
    let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let bytes: Vec<u8> = h.iter().flat_map(|x| x.to_le_bytes()).collect();
    (
        AlignedBytes::from_bytes(&bytes),
        h.iter().map(|x| x.to_f32()).collect(),
    )
}
