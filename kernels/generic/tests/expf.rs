//! The kernels' `exp` polynomial against the correctly rounded exponential (f64 `exp` rounded
//! to f32): at most 2 ulp over the normal range, the documented edges exact.

use edge_kernels::expf::{exp_f32, EXP_HI, EXP_LO};

fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn within_two_ulp_of_the_correctly_rounded_exp() {
    let mut worst = (0u32, 0f32);
    let n = 400_000;
    for i in 0..=n {
        let x = -87.0 + (88.5 + 87.0) * i as f32 / n as f32;
        let want = (x as f64).exp() as f32;
        let u = ulps(exp_f32(x), want);
        if u > worst.0 {
            worst = (u, x);
        }
    }
    assert!(worst.0 <= 2, "exp_f32({}) is {} ulp off", worst.1, worst.0);
}

#[test]
fn edges() {
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(EXP_LO - 1.0), 0.0);
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f32(EXP_HI + 0.01), f32::INFINITY);
    assert!(exp_f32(f32::NAN).is_nan());
    assert!(exp_f32(88.722_83).is_finite());
    assert_eq!(exp_f32(88.7229), f32::INFINITY);
    assert_eq!(exp_f32(EXP_HI), f32::INFINITY);
    // Subnormal results: within 1 subnormal step of the f64 value.
    for x in [-88.0f32, -95.5, -100.0, -103.9] {
        let want = (x as f64).exp() as f32;
        assert!(
            ulps(exp_f32(x), want) <= 1,
            "exp_f32({x}) = {} vs {want}",
            exp_f32(x)
        );
    }
}
