//! CPU matmul for every weight format. Quantized weights: activations are
//! quantized once per row to 16-bit blocks (`Q8Block`); on x86-64 with AVX2 the
//! fused kernels of `qdot` then read each weight block straight from storage,
//! elsewhere each weight row is unpacked once and dotted with every activation row
//! in integer arithmetic. Dense weights: f32 dots. Every output element is
//! computed the same way whatever the batch size, so results are batch-invariant.

use super::fork::{for_each_chunk, SendPtr};
use super::CpuWeight;
use crate::quant::{dequantize_row, quantize_row_q8, unpack_row, Q8Block, UnpackedRow};
use std::ops::Range;

/// Block dots (32 weights times 32 activations) per parallel chunk: a few
/// microseconds of work, so chunks balance well and cost little to hand out.
const CHUNK_WORK: usize = 2048;

/// Output rows per parallel chunk for `n` activation rows of `nb` blocks.
fn rows_per_chunk(n: usize, nb: usize) -> usize {
    CHUNK_WORK.div_ceil(n * nb.max(1)).next_multiple_of(4).clamp(16, 512)
}

type OutPtr = SendPtr<f32>;

/// out[n, m] = x[n, k] * w[m, k]^T.
pub fn matmul(x: &[f32], n: usize, w: &CpuWeight, out: &mut [f32]) {
    debug_assert_eq!(x.len(), n * w.cols);
    debug_assert_eq!(out.len(), n * w.rows);
    if n == 0 || w.rows == 0 {
        return;
    }
    if w.dtype.is_quantized() {
        let nb = w.cols / 32;
        const GROUP: usize = 32;
        let mut xq = vec![Q8Block::default(); n * nb];
        let xp = SendPtr(xq.as_mut_ptr());
        // Rows of about 32K activations per chunk: decode quantizes here.
        for_each_chunk(n, (1 << 15) / w.cols.max(1) + 1, &|rows| {
            for t in rows {
                // SAFETY: each chunk writes its own activation rows of `xq`.
                let q = unsafe { std::slice::from_raw_parts_mut(xp.get().add(t * nb), nb) };
                quantize_row_q8(&x[t * w.cols..(t + 1) * w.cols], q, GROUP);
            }
        });
        dispatch_quant(&xq, n, w, out);
    } else if let Some(p) = &w.packed {
        super::sgemm::gemm(x, n, p, None, out);
    } else if let Some(p) = &w.packed_bf16 {
        super::sgemm_bf16::gemm(x, n, p, None, out);
    } else {
        dispatch_dense(x, n, w, out);
    }
}

fn dispatch_quant(xq: &[Q8Block], n: usize, w: &CpuWeight, out: &mut [f32]) {
    let m = w.rows;
    let ptr = SendPtr(out.as_mut_ptr());
    let chunk = rows_per_chunk(n, w.cols / 32);
    #[cfg(target_arch = "x86_64")]
    if super::qdot::available() && super::qdot::supports(w.dtype) {
        let acts = super::qdot::ActScales::new(xq, n, w.cols / 32);
        let mm = super::qdot::QuantMatmul {
            dtype: w.dtype,
            data: w.bytes.as_slice(),
            row_bytes: w.row_bytes(),
            k: w.cols,
            m,
            xq,
            acts: &acts,
            n,
        };
        for_each_chunk(m, chunk, &|rows| {
            // SAFETY: AVX2/FMA/F16C present (checked above); the weight's byte
            // count was validated at load, `xq` and `acts` hold n rows of
            // cols / 32 blocks, and each chunk writes only its own columns.
            unsafe { mm.rows(rows, ptr.get()) };
        });
        return;
    }
    for_each_chunk(m, chunk, &|rows| {
        let mut u = UnpackedRow::default();
        #[cfg(target_arch = "x86_64")]
        if super::simd::has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
            unsafe { quant_rows_avx2(xq, n, w, rows, &mut u, ptr) };
            return;
        }
        quant_rows(xq, n, w, rows, &mut u, ptr)
    });
}

fn dispatch_dense(x: &[f32], n: usize, w: &CpuWeight, out: &mut [f32]) {
    let m = w.rows;
    let ptr = SendPtr(out.as_mut_ptr());
    for_each_chunk(m, rows_per_chunk(n, w.cols / 32), &|rows| {
        let mut row = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if super::simd::has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
            unsafe { dense_rows_avx2(x, n, w, rows, &mut row, ptr) };
            return;
        }
        dense_rows(x, n, w, rows, &mut row, ptr)
    });
}

// The kernels below are compiled twice: once for the baseline target and once
// with AVX2+FMA enabled; `#[inline(always)]` bodies pick up the wider vectors.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quant_rows_avx2(
    xq: &[Q8Block],
    n: usize,
    w: &CpuWeight,
    rows: Range<usize>,
    u: &mut UnpackedRow,
    ptr: OutPtr,
) {
    quant_rows(xq, n, w, rows, u, ptr)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dense_rows_avx2(x: &[f32], n: usize, w: &CpuWeight, rows: Range<usize>, row: &mut Vec<f32>, ptr: OutPtr) {
    dense_rows(x, n, w, rows, row, ptr)
}

/// Output columns `rows` of every activation row, quantized weights.
#[inline(always)]
fn quant_rows(xq: &[Q8Block], n: usize, w: &CpuWeight, rows: Range<usize>, u: &mut UnpackedRow, ptr: OutPtr) {
    let (m, k) = (w.rows, w.cols);
    let nb = k / 32;
    let row_bytes = w.row_bytes();
    let data = w.bytes.as_slice();
    for r in rows {
        unpack_row(w.dtype, &data[r * row_bytes..(r + 1) * row_bytes], k, u);
        for t in 0..n {
            let v = dot_unpacked_fast(u, &xq[t * nb..(t + 1) * nb]);
            // SAFETY: (t, r) is unique to this task (r is in this task's range).
            unsafe { *ptr.get().add(t * m + r) = v };
        }
    }
}

/// Output columns `rows` of every activation row, dense weights.
#[inline(always)]
fn dense_rows(x: &[f32], n: usize, w: &CpuWeight, rows: Range<usize>, row: &mut Vec<f32>, ptr: OutPtr) {
    let (m, k) = (w.rows, w.cols);
    let row_bytes = w.row_bytes();
    let data = w.bytes.as_slice();
    row.resize(k, 0.0);
    for r in rows {
        dequantize_row(w.dtype, &data[r * row_bytes..(r + 1) * row_bytes], row)
            .expect("weight row sizes are validated at load");
        for t in 0..n {
            let v = dot_f32(row, &x[t * k..(t + 1) * k]);
            // SAFETY: (t, r) is unique to this task.
            unsafe { *ptr.get().add(t * m + r) = v };
        }
    }
}

/// The unpacked-row dot with explicit AVX2 where present.
#[inline(always)]
fn dot_unpacked_fast(u: &UnpackedRow, xq: &[Q8Block]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx2() {
        assert!(u.q.len() >= 32 * xq.len() && u.scale.len() >= 2 * xq.len() && u.min.len() >= xq.len());
        // SAFETY: AVX2/FMA present (checked at run time); lengths checked above.
        return unsafe { dot_unpacked_avx2(u, xq) };
    }
    dot_unpacked(u, xq)
}

/// Per 32-element block: widen weights to i16, multiply pairwise with the i16
/// activations into i32 (`madd`), convert and scale in f32 lanes; one horizontal
/// sum per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_unpacked_avx2(u: &UnpackedRow, xq: &[Q8Block]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let mut min_acc = 0f32;
    for (b, a) in xq.iter().enumerate() {
        let qp = u.q.as_ptr().add(32 * b);
        let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(qp as *const __m128i));
        let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(qp.add(16) as *const __m128i));
        let a0 = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
        let a1 = _mm256_loadu_si256(a.qs.as_ptr().add(16) as *const __m256i);
        let p0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(w0, a0));
        let p1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(w1, a1));
        acc = _mm256_fmadd_ps(p0, _mm256_set1_ps(a.d * *u.scale.get_unchecked(2 * b)), acc);
        acc = _mm256_fmadd_ps(p1, _mm256_set1_ps(a.d * *u.scale.get_unchecked(2 * b + 1)), acc);
        min_acc += *u.min.get_unchecked(b) * a.dsum;
    }
    let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_add_ss(h, _mm_movehdup_ps(h));
    _mm_cvtss_f32(h) - min_acc
}

#[inline(always)]
fn dot_unpacked(u: &UnpackedRow, xq: &[Q8Block]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in xq.iter().enumerate() {
        let q = &u.q[32 * b..32 * b + 32];
        let mut s0 = 0i32;
        let mut s1 = 0i32;
        for i in 0..16 {
            s0 += q[i] as i32 * a.qs[i] as i32;
            s1 += q[16 + i] as i32 * a.qs[16 + i] as i32;
        }
        acc += a.d * (u.scale[2 * b] * s0 as f32 + u.scale[2 * b + 1] * s1 as f32) - u.min[b] * a.dsum;
    }
    acc
}

/// f32 dot with 16 independent lanes so the compiler can vectorize it.
#[inline(always)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{Rng, QUANT_TYPES};
    use super::*;
    use ferrite_core::HostBytes;

    /// The portable unpack path (used where the fused kernels are not) against
    /// the fused kernels: the same quantized activations, so only f32 rounding
    /// differs.
    #[test]
    fn unpack_path_matches_fused_kernels() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for dtype in QUANT_TYPES {
            let (n, m, k) = (3, 37, if dtype.block_size() == 256 { 512 } else { 288 });
            let w = CpuWeight::new("w".into(), dtype, m, k, HostBytes::from_vec(rng.weight(dtype, m, k)));
            let (x, xq) = rng.acts(n, k);
            let mut fused = vec![0f32; n * m];
            matmul(&x, n, &w, &mut fused);
            // Both flavours of the unpack path: explicit AVX2 and plain scalar.
            let mut unpacked = vec![0f32; n * m];
            quant_rows(&xq, n, &w, 0..m, &mut UnpackedRow::default(), SendPtr(unpacked.as_mut_ptr()));
            let mut scalar = vec![0f32; n * m];
            let mut u = UnpackedRow::default();
            let nb = k / 32;
            for r in 0..m {
                let rb = w.row_bytes();
                unpack_row(dtype, &w.bytes.as_slice()[r * rb..(r + 1) * rb], k, &mut u);
                for t in 0..n {
                    scalar[t * m + r] = dot_unpacked(&u, &xq[t * nb..(t + 1) * nb]);
                }
            }
            // Q6_K's fused kernel multiplies its sub-scales in before the i32
            // to f32 conversion, which may round (by at most 2^-24 of a lane).
            let scale = fused.iter().fold(1f32, |a, v| a.max(v.abs()));
            for i in 0..n * m {
                let tol = 2e-5 * scale;
                assert!((fused[i] - unpacked[i]).abs() < tol, "{dtype} {i}: {} vs {}", fused[i], unpacked[i]);
                assert!((fused[i] - scalar[i]).abs() < tol, "{dtype} {i}: {} vs {}", fused[i], scalar[i]);
            }
        }
    }
}
