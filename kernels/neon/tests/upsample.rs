//! The `upsample_nearest2x` slot of every table variant against the generic twin
//! [`edge_kernels::upsample_nearest2x`]: bit-identical (pure data movement), on ragged widths
//! (1, 3, 5, 17: not multiples of the 4-lane width), heights and channel counts, shapes that
//! split into several tasks, and special values (NaN payloads, −0, infinities).

use edge_kernels_neon::variants;

/// xorshift64* bits.
struct Rng(u64);

impl Rng {
    fn next_bits(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
    }

    /// Random f32 values in [-1, 1), with every 7th a special value.
    fn vec(&mut self, n: usize) -> Vec<f32> {
        let specials = [f32::NAN, -0.0, f32::INFINITY, f32::from_bits(0x7fc0_1234)];
        (0..n)
            .map(|i| {
                let b = self.next_bits();
                if i % 7 == 3 {
                    specials[b as usize % specials.len()]
                } else {
                    (b >> 8) as f32 / (1u32 << 23) as f32 - 1.0
                }
            })
            .collect()
    }
}

fn check(c: usize, h: usize, w: usize, rng: &mut Rng) {
    let generic = edge_kernels::generic();
    let x = rng.vec(c * h * w);
    let mut want = vec![1.5f32; 4 * c * h * w];
    (generic.upsample_nearest2x.run)(&x, c, h, w, &mut want);
    for (label, t) in variants() {
        let mut got = vec![f32::NAN; 4 * c * h * w];
        (t.upsample_nearest2x.run)(&x, c, h, w, &mut got);
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "{label} {} c={c} h={h} w={w} [{i}]: {g} vs generic {r}",
                t.upsample_nearest2x.name
            );
        }
    }
}

#[test]
fn upsample_matches_generic_bitwise() {
    let mut rng = Rng(0xDEAD_BEEF_1234_5678);
    for c in [1, 3, 5] {
        for h in [1, 2, 3, 7] {
            for w in [1, 3, 4, 5, 8, 17] {
                check(c, h, w, &mut rng);
            }
        }
    }
}

/// Several rows per task, several tasks, and rows longer than a task.
#[test]
fn upsample_large_shapes_match_generic_bitwise() {
    let mut rng = Rng(77);
    check(7, 300, 5, &mut rng);
    check(3, 65, 17, &mut rng);
    check(2, 3, 4099, &mut rng);
}

#[test]
fn upsample_zero_sizes() {
    let mut rng = Rng(5);
    for (c, h, w) in [(0, 3, 5), (3, 0, 5), (3, 5, 0)] {
        check(c, h, w, &mut rng);
    }
}

#[test]
fn upsample_thread_count_does_not_change_results() {
    let mut rng = Rng(6);
    let (c, h, w) = (5, 41, 23);
    let x = rng.vec(c * h * w);
    for (label, t) in variants() {
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool")
                .install(|| {
                    let mut out = vec![0.0f32; 4 * c * h * w];
                    (t.upsample_nearest2x.run)(&x, c, h, w, &mut out);
                    out
                })
        };
        let (one, three) = (on(1), on(3));
        assert!(
            one.iter()
                .zip(&three)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: 1 thread and 3 threads differ"
        );
    }
}

#[test]
#[should_panic(expected = "upsample_nearest2x: out has")]
fn upsample_rejects_wrong_output_length() {
    let t = variants().pop().expect("a variant").1;
    let x = vec![0.0f32; 2 * 3 * 5];
    let mut out = vec![0.0f32; 4 * 2 * 3 * 5 - 1];
    (t.upsample_nearest2x.run)(&x, 2, 3, 5, &mut out);
}
