//! `layer_norm` and `rms_norm` of every table variant against the generic kernels, on random
//! rows with ragged widths `d` (not multiples of the 4-lane width) and shifted means.
//!
//! Both compute their statistics in f64 in the order of [`edge_kernels::lane_sum`] (four lanes,
//! unfused squares, then the tail), so every output is bit-identical.

mod common;
use common::Rng;

use edge_kernels_neon::variants;

fn close(what: &str, got: &[f32], want: &[f32]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what} [{i}]: {g} vs generic {w}");
    }
}

#[test]
fn layer_norm_matches_generic() {
    let g = edge_kernels::generic();
    let mut rng = Rng(11);
    for (m, d) in [(1, 1), (3, 3), (5, 7), (17, 64), (33, 100), (2, 1153)] {
        let x = rng.vec_shifted(m * d, 3.0, 1.5);
        let w = rng.vec_shifted(d, 1.0, 1.0);
        let b = rng.vec_shifted(d, 0.5, 0.0);
        for (wo, bo) in [
            (Some(&w[..]), Some(&b[..])),
            (None, None),
            (Some(&w[..]), None),
        ] {
            let mut want = vec![0.0f32; m * d];
            (g.layer_norm.run)(&x, m, d, 1e-6, wo, bo, &mut want);
            for (label, t) in variants() {
                let mut got = vec![f32::NAN; m * d];
                (t.layer_norm.run)(&x, m, d, 1e-6, wo, bo, &mut got);
                close(
                    &format!("{label} {} m={m} d={d}", t.layer_norm.name),
                    &got,
                    &want,
                );
            }
        }
    }
}

#[test]
fn rms_norm_matches_generic() {
    let g = edge_kernels::generic();
    let mut rng = Rng(12);
    for (m, d) in [(1, 1), (3, 3), (5, 7), (17, 64), (33, 100), (2, 1153)] {
        let x = rng.vec_shifted(m * d, 3.0, 0.5);
        let w = rng.vec_shifted(d, 1.0, 1.0);
        let mut want = vec![0.0f32; m * d];
        (g.rms_norm.run)(&x, m, d, 1e-6, &w, &mut want);
        for (label, t) in variants() {
            let mut got = vec![f32::NAN; m * d];
            (t.rms_norm.run)(&x, m, d, 1e-6, &w, &mut got);
            close(
                &format!("{label} {} m={m} d={d}", t.rms_norm.name),
                &got,
                &want,
            );
        }
    }
}

/// GroupNorm: statistics in f64 as the generic kernel, summed in four lanes instead of
/// sequentially; the normalization `((x − mean) · rstd) · weight + bias` in f64 in the same
/// order. The f64 statistics differ by ~1e-16 relative, so an output may differ by one f32
/// rounding: the same bound as above (2 ulps + 1e-7). Ragged `c` (not a multiple of
/// `groups · 4`) and `hw` (1, 3, 17, 65), groups 1, 2, 4, 32, shifted means.
#[test]
fn group_norm_matches_generic() {
    let g = edge_kernels::generic();
    let mut rng = Rng(13);
    let mut cases = 0;
    let mut worst_ulps = 0.0f32;
    for (c, groups) in [
        (3, 1),
        (6, 2),
        (10, 2),
        (12, 4),
        (20, 4),
        (32, 32),
        (96, 32),
    ] {
        for hw in [1, 3, 17, 65] {
            let x = rng.vec_shifted(c * hw, 3.0, 1.5);
            let w = rng.vec_shifted(c, 1.0, 1.0);
            let b = rng.vec_shifted(c, 0.5, 0.0);
            let mut want = vec![0.0f32; c * hw];
            g.group_norm(&x, c, hw, groups, 1e-6, &w, &b, &mut want);
            for (label, t) in variants() {
                let mut got = vec![f32::NAN; c * hw];
                t.group_norm(&x, c, hw, groups, 1e-6, &w, &b, &mut got);
                close(
                    &format!(
                        "{label} {} c={c} hw={hw} groups={groups}",
                        t.group_norm_stats.name
                    ),
                    &got,
                    &want,
                );
                for (g, w) in got.iter().zip(&want) {
                    worst_ulps = worst_ulps.max((g - w).abs() / (w.abs() * f32::EPSILON));
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= 28);
    eprintln!("group_norm: max |neon − generic| = {worst_ulps} · 2⁻²³ · |generic|");
}

/// A group larger than one normalization task (nested parallel channels), results identical for
/// 1 and 3 threads, and equal to the generic kernel within the bound above.
#[test]
fn group_norm_thread_count_does_not_change_results() {
    let g = edge_kernels::generic();
    let mut rng = Rng(14);
    let (c, hw, groups) = (40, 1031, 4);
    let x = rng.vec_shifted(c * hw, 2.0, -0.7);
    let w = rng.vec_shifted(c, 1.0, 1.0);
    let b = rng.vec_shifted(c, 0.5, 0.0);
    let mut want = vec![0.0f32; c * hw];
    g.group_norm(&x, c, hw, groups, 1e-5, &w, &b, &mut want);
    for (label, t) in variants() {
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool")
                .install(|| {
                    let mut out = vec![0.0f32; c * hw];
                    t.group_norm(&x, c, hw, groups, 1e-5, &w, &b, &mut out);
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
        close(&format!("{label} group_norm c={c} hw={hw}"), &one, &want);
    }
}

#[test]
#[should_panic(expected = "group_norm: 3 groups do not divide 8 channels")]
fn group_norm_rejects_groups_not_dividing_channels() {
    let t = variants().pop().expect("a variant").1;
    let x = vec![0.0f32; 8 * 5];
    let (w, b) = (vec![1.0f32; 8], vec![0.0f32; 8]);
    let mut out = vec![0.0f32; 8 * 5];
    t.group_norm(&x, 8, 5, 3, 1e-6, &w, &b, &mut out);
}

/// With the same statistics the NEON normalization is the generic one bit for bit (tiled VAE
/// decoding normalises every tile with the whole image's statistics through this slot).
#[test]
fn group_norm_apply_is_bit_identical_for_given_stats() {
    let g = edge_kernels::generic();
    let mut rng = Rng(15);
    for (c, hw, groups) in [(6, 17, 2), (32, 65, 32), (40, 1031, 4), (12, 3, 4)] {
        let x = rng.vec_shifted(c * hw, 2.0, 0.4);
        let w = rng.vec_shifted(c, 1.0, 1.0);
        let b = rng.vec_shifted(c, 0.5, 0.0);
        let mut stats = vec![edge_kernels::GroupStats::default(); groups];
        (g.group_norm_stats.run)(&x, c, hw, groups, 1e-6, &mut stats);
        let mut want = vec![0.0f32; c * hw];
        (g.group_norm_apply.run)(&x, c, hw, groups, &stats, &w, &b, &mut want);
        for (label, t) in variants() {
            let mut got = vec![f32::NAN; c * hw];
            (t.group_norm_apply.run)(&x, c, hw, groups, &stats, &w, &b, &mut got);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label} {} c={c} hw={hw} groups={groups}",
                t.group_norm_apply.name
            );
        }
    }
}
