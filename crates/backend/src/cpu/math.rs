//! Branch-free f32 elementary functions, so loops over them vectorize (libm's
//! calls do not). Accuracy: a few f32 ulps.

/// e^x for -87 <= x <= 88.5; below, e^-87 (about 1.6e-38: no denormals), above, e^88.5.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.5);
    // 2^n * e^r with n = round(x / ln 2), |r| <= ln 2 / 2 (ln 2 split in two
    // parts so r is exact), e^r by its degree-6 Taylor polynomial.
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let mut p = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p * r + c;
    }
    // 2^n as two factors, so n = 128 (x near 88.5) does not overflow the exponent.
    let half = (n * 0.5).floor();
    p * pow2(half) * pow2(n - half)
}

/// 2^e for an integer e, -126 <= e <= 127, as its bits: e is read from the low
/// mantissa bits of 1.5 * 2^23 + e rather than converted (`as i32`
/// saturates, which kept `exp` from vectorizing: a scalar conversion per lane).
#[inline(always)]
fn pow2(e: f32) -> f32 {
    let bits = (e + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000);
    f32::from_bits(bits.wrapping_add(127) << 23)
}

/// erf as a rational function of x^2 on [-4, 4] (beyond, erf is +-1 in f32).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    for c in [2.770_681_4e-8, -2.101_024e-6, -5.692_506_4e-5, -7.349_906_3e-4, -2.954_6e-3, -1.609_603_3e-2] {
        p = p * x2 + c;
    }
    let mut q = -1.456_607_2e-5_f32;
    for c in [-2.133_740_6e-4, -1.682_827e-3, -7.373_329e-3, -1.426_474e-2] {
        q = q * x2 + c;
    }
    x * p / q
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_and_erf_match_libm() {
        let mut worst = (0f64, 0f64);
        for i in -200_000..=200_000 {
            let x = i as f32 * 4.35e-4; // -87 .. 87
            let rel = ((super::exp(x) as f64 - (x as f64).exp()) / (x as f64).exp()).abs();
            worst.0 = worst.0.max(rel);
            let y = i as f32 * 3e-5; // -6 .. 6
            worst.1 = worst.1.max((super::erf(y) as f64 - libm_erf(y as f64)).abs());
        }
        assert!(worst.0 < 5e-7, "exp relative error {}", worst.0);
        assert!(worst.1 < 5e-7, "erf absolute error {}", worst.1);
        assert!(super::exp(-100.0) < 2e-38 && super::exp(100.0).is_finite());
        for e in -126..=127 {
            assert_eq!(super::pow2(e as f32), 2f32.powi(e), "2^{e}");
        }
    }

    /// erf by its Taylor series (|x| < 3) or continued fraction, in f64.
    fn libm_erf(x: f64) -> f64 {
        if x.abs() >= 3.0 {
            // erfc continued fraction (Lentz), converges fast for |x| >= 3.
            let z = x.abs();
            let mut f = z;
            for k in (1..60).rev() {
                f = z + (k as f64 / 2.0) / f;
            }
            let erfc = (-z * z).exp() / (f * std::f64::consts::PI.sqrt());
            return (1.0 - erfc).copysign(x);
        }
        let (mut sum, mut term) = (0.0, x);
        for k in 0..200 {
            sum += term / (2 * k + 1) as f64;
            term *= -x * x / (k + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
