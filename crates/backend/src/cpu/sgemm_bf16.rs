//! Dense GEMM with bf16 inputs and f32 accumulation (AVX-512 BF16), an opt-in
//! for f32 checkpoints where about 3 significant digits per product suffice
//! (sentence embeddings: cosine 0.99997 to f32 on all-MiniLM-L6-v2).
//!
//! `vdpbf16ps` multiplies pairs of bf16 values and adds both products to one
//! f32 lane, so one instruction does twice the multiply-adds of an f32 FMA.
//! Weights are packed once into panels of `NR` columns holding k in pairs:
//! `[k / 2][NR][2]`; activations are rounded to bf16 pairs per call and a pair
//! is broadcast to every lane. The tiling is `sgemm`'s; every output element
//! is one chain over the k pairs in order, so results are batch-invariant.
//! The kernels are x86-only: elsewhere `available()` is false and nothing
//! here runs.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports, unused_variables))]

use super::fork::for_each_chunk_mut;
use std::ops::Range;

use super::sgemm::{Out, MR, NR};

/// Whether this CPU has the instructions (AVX-512 BF16 with 256-bit forms).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            is_x86_feature_detected!("avx512bf16")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512f")
                && super::simd::has_avx2()
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A weight [m, k] as bf16 panels; k is padded to even with zeros.
pub struct PackedBf16 {
    data: Vec<u16>,
    pub m: usize,
    pub k: usize,
    /// k / 2, rounded up.
    kp: usize,
}

fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

impl PackedBf16 {
    /// Packs `m` rows of `k` values, produced by `row(r, buf)`.
    pub fn pack(m: usize, k: usize, mut row: impl FnMut(usize, &mut [f32])) -> PackedBf16 {
        let kp = k.div_ceil(2);
        let panels = m.div_ceil(NR);
        let mut data = vec![0u16; panels * kp * NR * 2];
        let mut buf = vec![0f32; k];
        for r in 0..m {
            row(r, &mut buf);
            let panel = &mut data[(r / NR) * kp * NR * 2..(r / NR + 1) * kp * NR * 2];
            for (kk, &v) in buf.iter().enumerate() {
                panel[(kk / 2) * NR * 2 + (r % NR) * 2 + kk % 2] = to_bf16(v);
            }
        }
        PackedBf16 { data, m, k, kp }
    }

    fn panel(&self, p: usize) -> &[u16] {
        &self.data[p * self.kp * NR * 2..(p + 1) * self.kp * NR * 2]
    }
}

/// out[n, m] = x[n, k] * w^T (+ bias[m] on every row).
pub fn gemm(x: &[f32], n: usize, w: &PackedBf16, bias: Option<&[f32]>, out: &mut [f32]) {
    assert!(available(), "bf16 GEMM without AVX-512 BF16");
    assert_eq!(x.len(), n * w.k, "gemm: activation size");
    // Activations as bf16 pairs, one u32 per pair: [n][kp].
    let mut xb = vec![0u32; n * w.kp];
    for_each_chunk_mut(&mut xb, w.kp, 8, &|first, rows| {
        for (i, dst) in rows.chunks_mut(w.kp).enumerate() {
            let src = &x[(first + i) * w.k..(first + i + 1) * w.k];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available()` was checked; dst holds ceil(k / 2) pairs.
            unsafe {
                round_row(src, dst)
            };
        }
    });
    let xb = &xb;
    super::sgemm::tiled(n, w.m, bias, out, &|rows, panels, o| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available()` was checked; the tile's rows and panels are in bounds.
        unsafe {
            tile(xb, w, rows, panels, o)
        };
    });
}

/// One activation row to bf16 pairs (round to nearest even), 16 at a time.
/// In memory the pairs are just the bf16 values in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bf16")]
unsafe fn round_row(src: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    debug_assert!(dst.len() * 2 >= src.len());
    let out = dst.as_mut_ptr() as *mut u16;
    let full = src.len() / 16 * 16;
    for i in (0..full).step_by(16) {
        let v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr().add(i)));
        _mm256_storeu_si256(out.add(i) as *mut __m256i, std::mem::transmute::<__m256bh, __m256i>(v));
    }
    for (i, &v) in src.iter().enumerate().skip(full) {
        *out.add(i) = to_bf16(v);
    }
    if src.len() % 2 == 1 {
        *out.add(src.len()) = 0;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bf16")]
unsafe fn tile(xb: &[u32], w: &PackedBf16, rows: Range<usize>, panels: Range<usize>, o: Out) {
    super::sgemm::panel_loop!(xb, w, w.kp, rows, panels, o, kernel);
}

/// C[R, cols] = A[R, k] * panel: per k pair, two 8-column panel vectors and a
/// broadcast pair per row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn kernel<const R: usize>(a: &[u32], b: &[u16], kp: usize, c: *mut f32, ldc: usize, cols: usize) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() == R * kp && b.len() == kp * NR * 2);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for j in 0..kp {
        let b0: __m256bh = std::mem::transmute(_mm256_loadu_si256(bp.add(j * NR * 2) as *const __m256i));
        let b1: __m256bh = std::mem::transmute(_mm256_loadu_si256(bp.add(j * NR * 2 + 16) as *const __m256i));
        for i in 0..R {
            let av: __m256bh = std::mem::transmute(_mm256_set1_epi32(*ap.add(i * kp + j) as i32));
            acc[i][0] = _mm256_dpbf16_ps(acc[i][0], av, b0);
            acc[i][1] = _mm256_dpbf16_ps(acc[i][1], av, b1);
        }
    }
    super::sgemm::store_rows(&acc, c, ldc, cols);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against an f64 product of the bf16-rounded inputs (the kernel's only
    /// rounding is then the f32 accumulation), at odd sizes, and batch
    /// invariance.
    #[test]
    fn matches_rounded_reference_and_is_batch_invariant() {
        if !available() {
            return; // No AVX-512 BF16 here: the f32 GEMM is used instead.
        }
        let mut s = 0x853c_49e6_748f_ea9bu64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2001) as f32 / 1000.0 - 1.0
        };
        let r = |v: f32| half::bf16::from_f32(v).to_f32() as f64;
        for &(n, m, k) in &[(1, 1, 1), (1, 17, 5), (7, 33, 64), (53, 70, 129), (100, 16, 384)] {
            let x: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let bias: Vec<f32> = (0..m).map(|_| rnd()).collect();
            let p = PackedBf16::pack(m, k, |row, buf| buf.copy_from_slice(&w[row * k..(row + 1) * k]));
            let mut out = vec![0f32; n * m];
            gemm(&x, n, &p, Some(&bias), &mut out);
            for t in 0..n {
                for c in 0..m {
                    let want = (0..k).map(|i| r(x[t * k + i]) * r(w[c * k + i])).sum::<f64>() + bias[c] as f64;
                    let got = out[t * m + c] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (k as f64).sqrt() * 4.0,
                        "({n},{m},{k}) {t},{c}: {got} vs {want}"
                    );
                }
                let mut one = vec![0f32; m];
                gemm(&x[t * k..(t + 1) * k], 1, &p, Some(&bias), &mut one);
                assert_eq!(one, out[t * m..(t + 1) * m], "row {t} alone differs from the batch");
            }
        }
    }
}
