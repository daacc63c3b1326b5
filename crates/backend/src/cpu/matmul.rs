//! CPU matmul for every weight format. Quantized weights: activations are
//! quantized once per row to blocks of 32 (`Q8Block`): 8-bit values for the
//! fused kernels of `qdot8` on x86-64 with AVX-512 VNNI, 16-bit values for
//! `qdot`'s (AVX2) and elsewhere, and for `rows8`'s (Q8_0, Q5_0 and Q4_K
//! weights interleaved by eight rows at load). The fused kernels read each
//! weight block straight from storage; elsewhere each weight row is unpacked once and dotted
//! with every activation row in integer arithmetic. Dense weights: f32 dots.
//! Every output element is computed the same way whatever the batch size, so
//! results are batch-invariant.

use super::fork::{for_each_chunk, SendPtr};
use super::CpuWeight;
use crate::quant::{dequantize_row, quantize_row_q8, quantize_row_q8_bits8, unpack_row, Q8Block, UnpackedRow};
use std::cell::RefCell;
use std::ops::Range;

/// Block dots (32 weights times 32 activations) per parallel chunk: long
/// enough that a thread streams its weight rows with few restarts (each
/// chunk starts with rows nothing prefetched: decode of Gemma's 178 MB
/// output matrix ran at 27 GB/s in chunks of 2,048 dots, 32 GB/s in chunks of
/// 8,192), and handed out cheaply.
const CHUNK_WORK: usize = 8192;
/// Chunks per thread at least, so that the threads finish together on small
/// weights too.
const CHUNKS_PER_THREAD: usize = 4;

/// Output rows per parallel chunk for `n` activation rows of `nb` blocks and
/// `m` weight rows.
fn rows_per_chunk(n: usize, nb: usize, m: usize) -> usize {
    let balanced = m.div_ceil(CHUNKS_PER_THREAD * rayon::current_num_threads().max(1));
    CHUNK_WORK.div_ceil(n * nb.max(1)).min(balanced).next_multiple_of(4).clamp(16, 512)
}

type OutPtr = SendPtr<f32>;

/// Weights one `matmul_many` pass takes at most (q, k and v; gate and up).
const MAX_MANY: usize = 4;

/// out[n, m] = x[n, k] * w[m, k]^T.
pub fn matmul(x: &[f32], n: usize, w: &CpuWeight, out: &mut [f32]) {
    debug_assert_eq!(x.len(), n * w.cols);
    debug_assert_eq!(out.len(), n * w.rows);
    if n == 0 || w.rows == 0 {
        return;
    }
    if w.dtype.is_quantized() {
        quant_matmul(x, n, &mut [(w, out)], !w.interleaved && bits8(w.dtype));
    } else if let Some(p) = &w.packed {
        super::sgemm::gemm(x, n, p, None, out);
    } else if let Some(p) = &w.packed_bf16 {
        super::sgemm_bf16::gemm(x, n, p, None, out);
    } else {
        dispatch_dense(x, n, w, out);
    }
}

/// `outs[i]` = x * ws[i]^T for weights sharing their input: where the fused
/// 16-bit kernels take them all, the activations are quantized once and every
/// weight's chunks go to the threads in one parallel loop (one hand-off
/// instead of one per weight: decode runs ~200 small matmuls per token);
/// otherwise one `matmul` each. The results are `matmul`'s, bit for bit.
pub fn matmul_many(x: &[f32], n: usize, ws: &[&CpuWeight], outs: &mut [&mut [f32]]) {
    let shared = ws.len() <= MAX_MANY
        && n > 0
        && ws.iter().all(|w| w.cols == ws[0].cols && w.rows > 0 && fused(w) && (w.interleaved || !bits8(w.dtype)));
    if !shared {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            matmul(x, n, w, out);
        }
        return;
    }
    let mut targets: [(&CpuWeight, &mut [f32]); MAX_MANY] = std::array::from_fn(|_| (ws[0], &mut [][..]));
    for (t, (w, out)) in targets.iter_mut().zip(ws.iter().zip(outs.iter_mut())) {
        *t = (*w, &mut **out);
    }
    quant_matmul(x, n, &mut targets[..ws.len()], false);
}

/// Whether `w` has a fused 16-bit kernel here (interleaved rows, or `qdot`'s).
fn fused(w: &CpuWeight) -> bool {
    #[cfg(target_arch = "x86_64")]
    return w.dtype.is_quantized() && (w.interleaved || (super::qdot::available() && super::qdot::supports(w.dtype)));
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = w;
        false
    }
}

thread_local! {
    /// The activation side of a quantized matmul (blocks, and the 8-bit
    /// kernels' bytes), reused by the next one on this thread: no allocation
    /// per decode step.
    static ACT_BLOCKS: RefCell<(Vec<Q8Block>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The fused kernels' activation scales, likewise.
    #[cfg(target_arch = "x86_64")]
    static ACT_SCALES: RefCell<super::qdot::ActScales> = RefCell::default();
}

/// `v[..len]`, growing `v` (never shrinking it) as needed.
fn at_least<T: Clone + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

/// Quantized weights' matmuls on one input (`targets`: weights of equal
/// columns and their outputs), on 8-bit activations when `eight` (one target
/// then, and the `qdot8` kernels must be available), else 16-bit ones.
// (The 8-bit kernels are x86-only; elsewhere `eight` is never set.)
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn quant_matmul(x: &[f32], n: usize, targets: &mut [(&CpuWeight, &mut [f32])], eight: bool) {
    ACT_BLOCKS.with_borrow_mut(|(xq, x8_buf)| {
        let (nb, k) = (targets[0].0.cols / 32, targets[0].0.cols);
        const GROUP: usize = 32;
        let xq = at_least(xq, n * nb);
        // The 8-bit kernels' bytes, packed in the same pass.
        let x8 = at_least(x8_buf, if eight { n * k } else { 0 });
        let (xp, x8p) = (SendPtr(xq.as_mut_ptr()), SendPtr(x8.as_mut_ptr()));
        let dtype = targets[0].0.dtype;
        // Rows of about 32K activations per chunk: decode quantizes here.
        for_each_chunk(n, (1 << 15) / k.max(1) + 1, &|rows| {
            for t in rows {
                // SAFETY: each chunk writes its own activation rows of `xq` and `x8`.
                let q = unsafe { std::slice::from_raw_parts_mut(xp.get().add(t * nb), nb) };
                let xr = &x[t * k..(t + 1) * k];
                if !eight {
                    quantize_row_q8(xr, q, GROUP);
                    continue;
                }
                quantize_row_q8_bits8(xr, q);
                #[cfg(target_arch = "x86_64")]
                super::qdot8::pack(q, dtype, unsafe { std::slice::from_raw_parts_mut(x8p.get().add(t * k), k) });
            }
        });
        #[cfg(target_arch = "x86_64")]
        if eight {
            let (w, out) = &mut targets[0];
            return ACT_SCALES.with_borrow_mut(|scales| {
                scales.fill(xq, n, nb);
                // Lent to the kernels' owner type, then given back.
                let acts = super::qdot8::Acts8 { q: std::mem::take(x8_buf), scales: std::mem::take(scales) };
                dispatch_quant8(&acts, n, w, out);
                (*x8_buf, *scales) = (acts.q, acts.scales);
            });
        }
        #[cfg(target_arch = "x86_64")]
        if targets.iter().all(|(w, _)| fused(w)) {
            return ACT_SCALES.with_borrow_mut(|acts| {
                acts.fill(xq, n, nb);
                dispatch_fused(xq, acts, n, targets)
            });
        }
        for (w, out) in targets.iter_mut() {
            dispatch_unpacked(xq, n, w, out, eight);
        }
    })
}

/// Whether `dtype`'s matmuls run on 8-bit activations here (`qdot8`): only
/// when asked for (`FERRITE_CPU_ACTIVATIONS=8`), and only for weights in the
/// plain layout (the caller checks that). 8-bit activations are
/// llama.cpp's rounding and prefill runs about a fifth faster, but logits
/// move by up to ~0.5 from exact arithmetic, and at one of the 320 Gemma
/// golden positions (a four-way near-tie) the top token then beats
/// llama.cpp's by 0.62, past the 0.5 the goldens allow; 16-bit activations
/// (the default) stay within ~1e-2 of exact.
///
/// On aarch64 with the dot-product extension the same option runs the
/// unpacked rows' dots with `sdot` (16 byte products per instruction).
fn bits8(dtype: ferrite_core::DType) -> bool {
    let asked = ferrite_core::env::cpu_activations_8();
    #[cfg(target_arch = "x86_64")]
    return asked && super::qdot8::available() && super::qdot::supports(dtype);
    #[cfg(target_arch = "aarch64")]
    return asked && dtype.is_quantized() && std::arch::is_aarch64_feature_detected!("dotprod");
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (asked, dtype);
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn dispatch_quant8(acts: &super::qdot8::Acts8, n: usize, w: &CpuWeight, out: &mut [f32]) {
    let ptr = SendPtr(out.as_mut_ptr());
    let mm = super::qdot8::QuantMatmul8 {
        dtype: w.dtype,
        data: w.bytes.as_slice(),
        row_bytes: w.row_bytes(),
        k: w.cols,
        m: w.rows,
        acts,
        n,
    };
    for_each_chunk(w.rows, rows_per_chunk(n, w.cols / 32, w.rows), &|rows| {
        // SAFETY: the 8-bit kernels' features are present (bits8); the
        // weight's byte count was validated at load, `acts` holds n rows of
        // cols, and each chunk writes only its own columns.
        unsafe { mm.rows(rows, ptr.get()) };
    });
}

/// One weight's part of a fused parallel loop: its kernel, its units (row
/// groups when interleaved, else rows) and how many make a chunk.
#[cfg(target_arch = "x86_64")]
struct Job<'a> {
    kernel: Kernel<'a>,
    units: usize,
    chunk: usize,
    out: OutPtr,
}

#[cfg(target_arch = "x86_64")]
impl<'a> Job<'a> {
    fn new(w: &'a CpuWeight, out: &mut [f32], xq: &'a [Q8Block], acts: &'a super::qdot::ActScales, n: usize) -> Self {
        let (k, m, rows) = (w.cols, w.rows, rows_per_chunk(n, w.cols / 32, w.rows));
        let out = SendPtr(out.as_mut_ptr());
        if w.interleaved {
            let mm = super::rows8::Rows8Matmul { dtype: w.dtype, data: w.bytes.as_slice(), k, m, xq, acts, n };
            let g = super::rows8::GROUP_ROWS;
            Job { kernel: Kernel::Rows8(mm), units: m / g, chunk: (rows / g).max(1), out }
        } else {
            let (data, row_bytes) = (w.bytes.as_slice(), w.row_bytes());
            let mm = super::qdot::QuantMatmul { dtype: w.dtype, data, row_bytes, k, m, xq, acts, n };
            Job { kernel: Kernel::Plain(mm), units: m, chunk: rows, out }
        }
    }
}

#[cfg(target_arch = "x86_64")]
enum Kernel<'a> {
    Rows8(super::rows8::Rows8Matmul<'a>),
    Plain(super::qdot::QuantMatmul<'a>),
}

/// The fused kernels of every target in one parallel loop: chunk c of the
/// loop is the weights' chunks in order.
#[cfg(target_arch = "x86_64")]
fn dispatch_fused(xq: &[Q8Block], acts: &super::qdot::ActScales, n: usize, targets: &mut [(&CpuWeight, &mut [f32])]) {
    let mut jobs: [Option<Job>; MAX_MANY] = Default::default();
    let mut starts = [0usize; MAX_MANY + 1];
    for (i, t) in targets.iter_mut().enumerate() {
        let j = Job::new(t.0, t.1, xq, acts, n);
        starts[i + 1] = starts[i] + j.units.div_ceil(j.chunk);
        jobs[i] = Some(j);
    }
    let count = targets.len();
    for_each_chunk(starts[count], 1, &|cs| {
        for c in cs {
            let i = (0..count).rfind(|&i| starts[i] <= c).unwrap_or(0);
            let j = jobs[i].as_ref().expect("a job per target");
            let first = (c - starts[i]) * j.chunk;
            let units = first..(first + j.chunk).min(j.units);
            // SAFETY: the kernels' features are present (`fused`); the
            // weights' bytes were validated at load (and interleaved whole
            // groups); `xq` and `acts` hold n rows of cols / 32 blocks; each
            // chunk writes only its own columns of its own output.
            unsafe {
                match &j.kernel {
                    Kernel::Rows8(mm) => mm.groups(units, j.out.get()),
                    Kernel::Plain(mm) => mm.rows(units, j.out.get()),
                }
            }
        }
    });
}

thread_local! {
    /// A weight row unpacked (or dequantized) for the plain kernels, kept
    /// per thread for the next chunk: no allocation per decode step.
    static ROW: RefCell<(UnpackedRow, Vec<f32>)> = RefCell::default();
}

/// Weights without a fused kernel: each row unpacked once, then dotted with
/// every activation row (`eight`: activations of at most 127 in magnitude,
/// for the `sdot` kernel on aarch64).
fn dispatch_unpacked(xq: &[Q8Block], n: usize, w: &CpuWeight, out: &mut [f32], eight: bool) {
    let ptr = SendPtr(out.as_mut_ptr());
    for_each_chunk(w.rows, rows_per_chunk(n, w.cols / 32, w.rows), &|rows| {
        ROW.with_borrow_mut(|(u, _)| {
            #[cfg(target_arch = "x86_64")]
            if super::simd::has_avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
                unsafe { quant_rows_avx2(xq, n, w, rows, u, ptr) };
                return;
            }
            #[cfg(target_arch = "aarch64")]
            if eight {
                // SAFETY: `eight` is only set where `bits8` found the
                // dot-product extension; the activations fit a byte.
                unsafe { quant_rows_sdot(xq, n, w, rows, u, ptr) };
                return;
            }
            let _ = eight;
            quant_rows(xq, n, w, rows, u, ptr, dot_unpacked_fast)
        })
    });
}

fn dispatch_dense(x: &[f32], n: usize, w: &CpuWeight, out: &mut [f32]) {
    let m = w.rows;
    let ptr = SendPtr(out.as_mut_ptr());
    for_each_chunk(m, rows_per_chunk(n, w.cols / 32, w.rows), &|rows| {
        ROW.with_borrow_mut(|(_, row)| {
            #[cfg(target_arch = "x86_64")]
            if super::simd::has_avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
                unsafe { dense_rows_avx2(x, n, w, rows, row, ptr) };
                return;
            }
            dense_rows(x, n, w, rows, row, ptr)
        })
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
    quant_rows(xq, n, w, rows, u, ptr, dot_unpacked_fast)
}

#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
unsafe fn quant_rows_sdot(
    xq: &[Q8Block],
    n: usize,
    w: &CpuWeight,
    rows: Range<usize>,
    u: &mut UnpackedRow,
    ptr: OutPtr,
) {
    quant_rows(xq, n, w, rows, u, ptr, |u, x| {
        assert!(u.q.len() >= 32 * x.len() && u.scale.len() >= 2 * x.len() && u.min.len() >= x.len());
        // SAFETY: the dot-product extension is enabled here; lengths checked.
        unsafe { dot_unpacked_sdot(u, x) }
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dense_rows_avx2(x: &[f32], n: usize, w: &CpuWeight, rows: Range<usize>, row: &mut Vec<f32>, ptr: OutPtr) {
    dense_rows(x, n, w, rows, row, ptr)
}

/// Output columns `rows` of every activation row, quantized weights, each
/// output one `dot` of an unpacked weight row and an activation row.
#[inline(always)]
fn quant_rows(
    xq: &[Q8Block],
    n: usize,
    w: &CpuWeight,
    rows: Range<usize>,
    u: &mut UnpackedRow,
    ptr: OutPtr,
    dot: impl Fn(&UnpackedRow, &[Q8Block]) -> f32,
) {
    let (m, k) = (w.rows, w.cols);
    let nb = k / 32;
    let row_bytes = w.row_bytes();
    let data = w.bytes.as_slice();
    for r in rows {
        unpack_row(w.dtype, &data[r * row_bytes..(r + 1) * row_bytes], k, u);
        for t in 0..n {
            let v = dot(u, &xq[t * nb..(t + 1) * nb]);
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
    #[cfg(target_arch = "aarch64")]
    {
        assert!(u.q.len() >= 32 * xq.len() && u.scale.len() >= 2 * xq.len() && u.min.len() >= xq.len());
        // SAFETY: NEON is part of every aarch64 target; lengths checked above.
        return unsafe { dot_unpacked_neon(u, xq) };
    }
    #[allow(unreachable_code)]
    dot_unpacked(u, xq)
}

/// `dot_unpacked`'s f32 arithmetic over the blocks, with `dot16` summing a
/// half block's 16 products exactly (a macro, so the integer dot inlines
/// into the caller's target features).
#[cfg(target_arch = "aarch64")]
macro_rules! blocks_dot {
    ($u:expr, $xq:expr, $dot16:expr) => {{
        let (u, mut acc) = ($u, 0f32);
        for (b, a) in $xq.iter().enumerate() {
            let qp = u.q.as_ptr().add(32 * b);
            let s0 = $dot16(qp, a.qs.as_ptr());
            let s1 = $dot16(qp.add(16), a.qs.as_ptr().add(16));
            acc += a.d * (*u.scale.get_unchecked(2 * b) * s0 as f32 + *u.scale.get_unchecked(2 * b + 1) * s1 as f32)
                - *u.min.get_unchecked(b) * a.dsum;
        }
        acc
    }};
}

/// `dot_unpacked` with NEON: each half block's 16 products (i8 weights
/// widened to i16, times the i16 activations) accumulate exactly in i32 lanes
/// (`smull`/`smlal`), then the same f32 arithmetic as the scalar version, so
/// the two give the same bits. (`sdot` multiplies bytes: it would need 8-bit
/// activations, the precision the default declines on x86 too.)
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn dot_unpacked_neon(u: &UnpackedRow, xq: &[Q8Block]) -> f32 {
    use std::arch::aarch64::*;
    // Sixteen weights at `w` times sixteen activations at `a`, summed.
    #[inline(always)]
    unsafe fn dot16(w: *const i8, a: *const i16) -> i32 {
        let w = vld1q_s8(w);
        let (wl, wh) = (vmovl_s8(vget_low_s8(w)), vmovl_high_s8(w));
        let (a0, a1) = (vld1q_s16(a), vld1q_s16(a.add(8)));
        let s = vmull_s16(vget_low_s16(wl), vget_low_s16(a0));
        let s = vmlal_high_s16(s, wl, a0);
        let s = vmlal_s16(s, vget_low_s16(wh), vget_low_s16(a1));
        vaddvq_s32(vmlal_high_s16(s, wh, a1))
    }
    blocks_dot!(u, xq, dot16)
}

/// `dot_unpacked` for activations of at most 127 in magnitude (8-bit
/// quantization) with `sdot`: each half block's 16 byte products summed
/// exactly in i32 lanes, then the scalar version's f32 arithmetic, so the two
/// give the same bits. (The intrinsic is not stable Rust; the instruction is
/// written out.)
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_unpacked_sdot(u: &UnpackedRow, xq: &[Q8Block]) -> f32 {
    use std::arch::aarch64::*;
    // Sixteen weights at `w` times sixteen activations (i16 that fit a byte) at `a`.
    #[inline(always)]
    unsafe fn dot16(w: *const i8, a: *const i16) -> i32 {
        let x = vcombine_s8(vmovn_s16(vld1q_s16(a)), vmovn_s16(vld1q_s16(a.add(8))));
        let mut acc = vdupq_n_s32(0);
        std::arch::asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) vld1q_s8(w),
            x = in(vreg) x,
            options(pure, nomem, nostack)
        );
        vaddvq_s32(acc)
    }
    blocks_dot!(u, xq, dot16)
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

    /// The 8-bit path end to end (quantizing, packing, the kernels, the
    /// chunks) against f64 dots of the dequantized weights with the exact
    /// activations: within 8-bit rounding.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn eight_bit_activations_match_dequantized_weights() {
        if !super::super::qdot8::available() {
            return; // The 16-bit path serves this CPU.
        }
        let mut rng = Rng(0x6a09_e667_f3bc_c908);
        for dtype in QUANT_TYPES {
            let k = if dtype.block_size() == 256 { 512 } else { 288 };
            for n in [1, 3, 9, 40] {
                let m = 37;
                let bytes = rng.weight(dtype, m, k);
                let w = CpuWeight::new("w".into(), dtype, m, k, HostBytes::from_vec(bytes.clone()));
                let (x, _) = rng.acts(n, k);
                let mut got = vec![0f32; n * m];
                quant_matmul(&x, n, &mut [(&w, &mut got[..])], true);
                let mut wrow = vec![0f32; k];
                let rb = w.row_bytes();
                for r in 0..m {
                    dequantize_row(dtype, &bytes[r * rb..(r + 1) * rb], &mut wrow).unwrap();
                    for t in 0..n {
                        let xr = &x[t * k..(t + 1) * k];
                        let want: f64 = wrow.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let scale: f64 = wrow.iter().zip(xr).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                        let err = (got[t * m + r] as f64 - want).abs();
                        assert!(err <= 1e-2 * scale, "{dtype} n={n} r={r} t={t}: {} vs {want}", got[t * m + r]);
                    }
                }
            }
        }
    }

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
            quant_rows(
                &xq,
                n,
                &w,
                0..m,
                &mut UnpackedRow::default(),
                SendPtr(unpacked.as_mut_ptr()),
                dot_unpacked_fast,
            );
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

    /// One pass over several weights gives each weight's own matmul, bit for
    /// bit: interleaved and plain layouts mixed, decode and prefill sizes.
    #[test]
    fn matmul_many_equals_separate_matmuls() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let k = 512;
        use ferrite_core::DType;
        let shapes = [(DType::Q8_0, 16), (DType::Q6K, 13), (DType::Q4K, 24), (DType::Q5_0, 40)];
        let ws: Vec<CpuWeight> = shapes
            .iter()
            .map(|&(dtype, m)| CpuWeight::new("w".into(), dtype, m, k, HostBytes::from_vec(rng.weight(dtype, m, k))))
            .collect();
        let refs: Vec<&CpuWeight> = ws.iter().collect();
        for n in [1, 3, 9] {
            let (x, _) = rng.acts(n, k);
            let mut many: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
            let mut views: Vec<&mut [f32]> = many.iter_mut().map(|o| o.as_mut_slice()).collect();
            matmul_many(&x, n, &refs, &mut views);
            for (w, got) in ws.iter().zip(&many) {
                let mut want = vec![0f32; n * w.rows];
                matmul(&x, n, w, &mut want);
                assert_eq!(got, &want, "{} n {n}", w.dtype);
            }
        }
    }

    /// The `sdot` unpacked dot on 8-bit activations against the scalar one,
    /// bit for bit, for every format (aarch64 with the dot-product
    /// extension; qemu's default CPU has it).
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn sdot_unpacked_dot_equals_scalar() {
        assert!(std::arch::is_aarch64_feature_detected!("dotprod"), "no dot-product extension to test");
        let mut rng = Rng(0x5d07_5d07);
        for dtype in QUANT_TYPES {
            let k = if dtype.block_size() == 256 { 512 } else { 288 };
            let bytes = rng.weight(dtype, 3, k);
            let (x, _) = rng.acts(2, k);
            let mut xq = vec![Q8Block::default(); 2 * k / 32];
            for (xr, q) in x.chunks(k).zip(xq.chunks_mut(k / 32)) {
                quantize_row_q8_bits8(xr, q);
            }
            let rb = k / dtype.block_size() * dtype.block_bytes();
            let mut u = UnpackedRow::default();
            let mut want = [0f32; 6];
            for r in 0..3 {
                unpack_row(dtype, &bytes[r * rb..(r + 1) * rb], k, &mut u);
                for t in 0..2 {
                    let x = &xq[t * k / 32..(t + 1) * k / 32];
                    // SAFETY: the extension is present (asserted above).
                    let got = unsafe { dot_unpacked_sdot(&u, x) };
                    assert_eq!(got.to_bits(), dot_unpacked(&u, x).to_bits(), "{dtype} r {r}");
                    want[t * 3 + r] = got;
                }
            }
            // The whole matmul on 8-bit activations takes this path.
            let w = CpuWeight::new("w".into(), dtype, 3, k, HostBytes::from_vec(bytes));
            let mut out = vec![0f32; 6];
            quant_matmul(&x, 2, &mut [(&w, &mut out[..])], true);
            assert_eq!(out, want, "{dtype} matmul");
        }
    }

    /// The NEON unpacked dot against the scalar one, bit for bit, for every
    /// format (run on aarch64, e.g. under qemu: scripts/test-aarch64.sh).
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_unpacked_dot_equals_scalar() {
        let mut rng = Rng(0x0a64_0a64);
        for dtype in QUANT_TYPES {
            let k = if dtype.block_size() == 256 { 512 } else { 288 };
            let bytes = rng.weight(dtype, 3, k);
            let (_, xq) = rng.acts(2, k);
            let rb = k / dtype.block_size() * dtype.block_bytes();
            let mut u = UnpackedRow::default();
            for r in 0..3 {
                unpack_row(dtype, &bytes[r * rb..(r + 1) * rb], k, &mut u);
                for t in 0..2 {
                    let x = &xq[t * k / 32..(t + 1) * k / 32];
                    assert_eq!(dot_unpacked_fast(&u, x).to_bits(), dot_unpacked(&u, x).to_bits(), "{dtype} r {r}");
                }
            }
        }
    }
}
