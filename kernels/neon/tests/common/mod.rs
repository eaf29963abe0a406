//! Shared by the kernel tests: a small deterministic generator (xorshift64*), so that every
//! test file draws its random inputs the same way without a dependency.
#![allow(dead_code)]

/// The fastest NEON table this CPU runs (the last variant; what `edge_kernels_cpu::best`
/// picks on aarch64).
pub fn best() -> edge_kernels::KernelTable {
    match edge_kernels_neon::variants().pop() {
        Some((_, t)) => t,
        None => unreachable!("variants() always holds at least one table"),
    }
}

/// xorshift64* state; any non-zero seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1), 24 random bits.
    pub fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }

    /// `n` values uniform in [shift - scale, shift + scale).
    pub fn vec_shifted(&mut self, n: usize, scale: f32, shift: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale + shift).collect()
    }
}
