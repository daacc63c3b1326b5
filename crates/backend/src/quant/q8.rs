//! Activation quantization: each row of f32 activations becomes blocks of 32
//! integers with one f32 scale, so weight-by-activation products are integer
//! dots. Two widths: 16-bit values (`quantize_row_q8`) and 8-bit ones held in
//! the same blocks (`quantize_row_q8_bits8`, for `vpdpbusd`).

/// Largest quantized magnitude of 16-bit activations. Where weights are
/// widened to i16 and multiplied pairwise into i32 anyway, 16 bits cost no more
/// than 8 and cut the activation rounding error 256-fold (logits within ~1e-2
/// of exact arithmetic).
const Q_MAX: i32 = 32767;
/// The same for 8-bit activations: byte-by-byte dots (`vpdpbusd`) do twice
/// the work per instruction, at llama.cpp's rounding (logits ~0.1 from exact).
pub const Q_MAX8: i32 = 127;

#[derive(Clone, Copy, Debug)]
pub struct Q8Block {
    pub d: f32,
    /// `d * sum(qs)`, used by formats whose weights carry an offset (min).
    pub dsum: f32,
    pub qs: [i16; 32],
}

impl Default for Q8Block {
    fn default() -> Self {
        Q8Block { d: 0.0, dsum: 0.0, qs: [0; 32] }
    }
}

/// Quantize `x` (length a multiple of `group`) into `out` (x.len() / 32 blocks);
/// each `group` elements (a multiple of 32) share one scale. The matmul uses 32
/// for every format: finer than llama.cpp's 256 (Q8_K) for k-quants, so closer to
/// exact arithmetic.
#[inline(always)]
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block], group: usize) {
    quantize_row::<Q_MAX>(x, out, group)
}

/// `quantize_row_q8` to 8-bit values (|q| <= 127), one scale per 32.
#[inline(always)]
pub fn quantize_row_q8_bits8(x: &[f32], out: &mut [Q8Block]) {
    quantize_row::<Q_MAX8>(x, out, 32)
}

#[inline(always)]
fn quantize_row<const QMAX: i32>(x: &[f32], out: &mut [Q8Block], group: usize) {
    debug_assert_eq!(x.len(), out.len() * 32);
    debug_assert_eq!(x.len() % group, 0);
    #[cfg(target_arch = "x86_64")]
    if group == 32 && crate::cpu::simd::has_avx2() {
        // SAFETY: AVX2 is present (checked at run time); the lengths match
        // (asserted above and re-checked inside).
        unsafe { quantize_row32_avx2::<QMAX>(x, out) };
        return;
    }
    let per = group / 32;
    for (xg, og) in x.chunks_exact(group).zip(out.chunks_exact_mut(per)) {
        let amax = xg.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / QMAX as f32;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (xb, ob) in xg.chunks_exact(32).zip(og.iter_mut()) {
            quantize_block::<QMAX>(xb, ob, d, id);
        }
    }
}

#[inline(always)]
fn quantize_block<const QMAX: i32>(xb: &[f32], ob: &mut Q8Block, d: f32, id: f32) {
    let mut sum = 0i32;
    for (q, &v) in ob.qs.iter_mut().zip(xb) {
        let r = (v * id).round() as i32;
        *q = r.clamp(-QMAX, QMAX) as i16;
        sum += *q as i32;
    }
    ob.d = d;
    ob.dsum = d * sum as f32;
}

/// `quantize_row` with one scale per 32 elements, bit for bit: the same
/// maximum, the same f32 products, rounding half away from zero like
/// `f32::round` (NaN to 0), the same clamp and sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row32_avx2<const QMAX: i32>(x: &[f32], out: &mut [Q8Block]) {
    use std::arch::x86_64::*;
    assert_eq!(x.len(), out.len() * 32);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let sign = _mm256_set1_ps(-0.0);
    for (xb, ob) in x.chunks_exact(32).zip(out.iter_mut()) {
        let p = xb.as_ptr();
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        // The maximum is exact whatever the order (NaNs aside).
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m))).max(0.0);
        let d = amax / QMAX as f32;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut q = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let y = _mm256_mul_ps(v[i], idv);
            // round half away from zero: truncate, then step away from zero
            // when the dropped fraction is at least one half (exact in f32).
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let frac = _mm256_and_ps(_mm256_sub_ps(y, t), abs_mask);
            let step =
                _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), _mm256_or_ps(one, _mm256_and_ps(y, sign)));
            let r = _mm256_add_ps(t, step);
            let r = _mm256_max_ps(_mm256_min_ps(r, _mm256_set1_ps(QMAX as f32)), _mm256_set1_ps(-QMAX as f32));
            // NaN becomes 0, like `f32 as i32`.
            let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
            q[i] = _mm256_cvttps_epi32(r);
        }
        // packs interleaves 128-bit lanes; permute restores element order.
        let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
        let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(ob.qs.as_mut_ptr() as *mut __m256i, lo);
        _mm256_storeu_si256(ob.qs.as_mut_ptr().add(16) as *mut __m256i, hi);
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        ob.d = d;
        ob.dsum = d * _mm_cvtsi128_si32(s) as f32;
    }
}
