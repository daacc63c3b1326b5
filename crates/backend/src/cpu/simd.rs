//! Run-time SIMD detection, done once.

#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    use std::sync::OnceLock;
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// F16C (f16 to f32 conversion), for f16 KV caches.
#[cfg(target_arch = "x86_64")]
pub fn has_f16c() -> bool {
    use std::sync::OnceLock;
    static F16C: OnceLock<bool> = OnceLock::new();
    *F16C.get_or_init(|| is_x86_feature_detected!("f16c"))
}

/// The instruction set the kernels use on this machine, for logs and `inspect`.
pub fn describe() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() && super::qdot::vnni() {
            return "avx2+fma, avx512-vnni dots";
        }
        if has_avx2() {
            return "avx2+fma";
        }
        "scalar (sse2)"
    }
    #[cfg(target_arch = "aarch64")]
    {
        "neon"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}
