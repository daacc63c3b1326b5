//! CPU matmul for every weight format. Quantized weights: activations are
//! quantized once per row to Q8 blocks and each weight row is unpacked once, then
//! dotted with every activation row in integer arithmetic. Dense weights: f32 dots.
//! Every output element is computed the same way whatever the batch size, so
//! results are batch-invariant.

use super::CpuWeight;
use crate::quant::{dequantize_row, quantize_row_q8, unpack_row, Q8Block, UnpackedRow};
use rayon::prelude::*;
use std::ops::Range;

/// Output rows handled by one task: large enough to amortize scheduling.
const ROWS_PER_TASK: usize = 16;

/// A raw pointer that may cross threads; each task writes a disjoint set of
/// output elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint indices (distinct output columns r), and the
// buffer outlives the parallel loop that uses the pointer.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// out[n, m] = x[n, k] * w[m, k]^T.
pub fn matmul(x: &[f32], n: usize, w: &CpuWeight, out: &mut [f32]) {
    debug_assert_eq!(x.len(), n * w.cols);
    debug_assert_eq!(out.len(), n * w.rows);
    if w.dtype.is_quantized() {
        let nb = w.cols / 32;
        const GROUP: usize = 32;
        let mut xq = vec![Q8Block::default(); n * nb];
        xq.par_chunks_mut(nb)
            .zip(x.par_chunks(w.cols))
            .for_each(|(q, xr)| quantize_row_q8(xr, q, GROUP));
        dispatch_quant(&xq, n, w, out);
    } else {
        dispatch_dense(x, n, w, out);
    }
}

fn dispatch_quant(xq: &[Q8Block], n: usize, w: &CpuWeight, out: &mut [f32]) {
    let m = w.rows;
    let ptr = OutPtr(out.as_mut_ptr());
    (0..m.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each_init(UnpackedRow::default, |u, task| {
        let rows = task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(m);
        #[cfg(target_arch = "x86_64")]
        if super::simd::has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
            unsafe { quant_rows_avx2(xq, n, w, rows, u, ptr) };
            return;
        }
        quant_rows(xq, n, w, rows, u, ptr)
    });
}

fn dispatch_dense(x: &[f32], n: usize, w: &CpuWeight, out: &mut [f32]) {
    let m = w.rows;
    let ptr = OutPtr(out.as_mut_ptr());
    (0..m.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each_init(Vec::new, |row: &mut Vec<f32>, task| {
        let rows = task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(m);
        #[cfg(target_arch = "x86_64")]
        if super::simd::has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
            unsafe { dense_rows_avx2(x, n, w, rows, row, ptr) };
            return;
        }
        dense_rows(x, n, w, rows, row, ptr)
    });
}

// The kernels below are compiled twice: once for the baseline target and once
// with AVX2+FMA enabled; `#[inline(always)]` bodies pick up the wider vectors.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quant_rows_avx2(xq: &[Q8Block], n: usize, w: &CpuWeight, rows: Range<usize>, u: &mut UnpackedRow, ptr: OutPtr) {
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
            unsafe { *ptr.0.add(t * m + r) = v };
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
            unsafe { *ptr.0.add(t * m + r) = v };
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
