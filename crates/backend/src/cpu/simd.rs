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

/// AVX-512F (the attention tile's sixteen-lane vectors), unless
/// `FERRITE_CPU_AVX512=0` (to compare: the results are the same).
#[cfg(target_arch = "x86_64")]
pub fn has_avx512() -> bool {
    use std::sync::OnceLock;
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(|| is_x86_feature_detected!("avx512f") && ferrite_core::env::cpu_avx512())
}

/// The instruction set the kernels use on this machine, for logs and `inspect`.
pub fn describe() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        match (has_avx2(), super::qdot::vnni(), has_avx512()) {
            (true, true, true) => "avx2+fma, avx512-vnni dots, avx512 attention",
            (true, true, false) => "avx2+fma, avx512-vnni dots",
            (true, false, true) => "avx2+fma, avx512 attention",
            (true, false, false) => "avx2+fma",
            _ => "scalar (sse2)",
        }
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
