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

#[test]
fn tanh_and_activations_stay_close_to_f64() {
    use edge_kernels::expf::tanh_f32;
    let mut worst_tanh = 0f64;
    let mut worst_gelu = 0f64;
    let mut worst_silu = 0f64;
    for i in -200_000..=200_000 {
        let x = i as f32 * 1e-4 * 3.0;
        let xd = x as f64;
        worst_tanh = worst_tanh.max((tanh_f32(x) as f64 - xd.tanh()).abs());
        let inner = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd);
        let g = 0.5 * xd * (1.0 + inner.tanh());
        worst_gelu =
            worst_gelu.max((edge_kernels::gelu_tanh_f32(x) as f64 - g).abs() / (1.0 + xd.abs()));
        let s = xd / (1.0 + (-xd).exp());
        worst_silu =
            worst_silu.max((edge_kernels::silu_f32(x) as f64 - s).abs() / (1.0 + xd.abs()));
    }
    // A few ulp of 1 (2^-24 ≈ 6e-8).
    assert!(worst_tanh < 4e-7, "tanh_f32: max abs error {worst_tanh:e}");
    assert!(worst_gelu < 4e-7, "gelu_tanh_f32: max error {worst_gelu:e}");
    assert!(worst_silu < 4e-7, "silu_f32: max error {worst_silu:e}");
    assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(tanh_f32(50.0), 1.0);
    assert_eq!(tanh_f32(-50.0), -1.0);
    assert!(tanh_f32(f32::NAN).is_nan());
}
