//! Fused quantized-weight kernels on 8-bit activations, for x86-64 with
//! AVX-512 VNNI (256-bit forms): one `vpdpbusd` multiplies a whole 32-element
//! block (32 unsigned bytes by 32 signed bytes into eight i32 lanes), where the
//! 16-bit kernels of `qdot` need two `vpdpwssd` and twice the activation loads.
//!
//! The layout of the work is `qdot`'s: the same tiles (activation rows by
//! weight rows), groups of eight blocks whose scales make one f32 vector `s`,
//! one FMA per block dot, the weight offsets times the activation block sums
//! in a second accumulator. Only the integer dot differs:
//! - weights with unsigned values (the 4- and 5-bit formats, whose offsets go
//!   through the block sums) are the unsigned operand, activations the signed;
//! - signed weights (Q8_0, and Q6_K's q - 32) are the signed operand against
//!   the activations plus 128 (stored so), and the dot starts from -128 times
//!   the weights' sums (one `vpdpbusd` per weight block, shared by the tile);
//! - Q6_K's two sub-scales per block multiply the i32 lanes (lanes 0-3 hold
//!   elements 0-15, lanes 4-7 elements 16-31), exactly.
//!
//! Every output element's arithmetic is independent of the batch and tile, so
//! results are batch-invariant, as with `qdot`.

#![cfg(target_arch = "x86_64")]
// Weight rows, tile rows and their accumulators are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]

use super::qdot::{
    bits32, block_bytes, hsum, is_k, scales32, scales_k4, ActScales, Prefetch, Tile, PREFETCH_BYTES, Q4K, Q4_0, Q4_1,
    Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use crate::quant::Q8Block;
use ferrite_core::DType;
use std::arch::x86_64::*;
use std::ops::Range;

/// Whether these kernels can run here: `qdot`'s features plus AVX-512 VNNI.
pub fn available() -> bool {
    super::qdot::available() && super::qdot::vnni()
}

/// Whether the weight's values are signed (the activations are then stored
/// plus 128).
fn signed_weights(dtype: DType) -> bool {
    matches!(dtype, DType::Q8_0 | DType::Q6K)
}

/// `signed_weights` for a format id.
const fn signed_format(f: u8) -> bool {
    matches!(f, Q8_0 | Q6K)
}

/// Activation blocks quantized with |q| <= 127 as the kernels read them for
/// weights of `dtype`: one byte per value, plus 128 for signed weights.
pub fn pack(blocks: &[Q8Block], dtype: DType, out: &mut [u8]) {
    let bias = if signed_weights(dtype) { 128 } else { 0 };
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        for (o, &v) in o.iter_mut().zip(&b.qs) {
            *o = (v as i32 + bias) as u8;
        }
    }
}

/// 8-bit activation rows: `n * k` bytes from `pack`, and the blocks' scales.
pub struct Acts8 {
    pub q: Vec<u8>,
    pub scales: ActScales,
}

#[cfg(test)]
impl Acts8 {
    pub fn new(xq: &[Q8Block], n: usize, nb: usize, dtype: DType) -> Self {
        let mut q = vec![0u8; xq.len() * 32];
        pack(xq, dtype, &mut q);
        Acts8 { q, scales: ActScales::new(xq, n, nb) }
    }
}

/// One quantized matmul on 8-bit activations (see `qdot::QuantMatmul`).
pub struct QuantMatmul8<'a> {
    pub dtype: DType,
    pub data: &'a [u8],
    pub row_bytes: usize,
    pub k: usize,
    pub m: usize,
    pub acts: &'a Acts8,
    pub n: usize,
}

impl QuantMatmul8<'_> {
    /// out[t * m + r] for every activation row t < n and weight row r in `rows`.
    ///
    /// # Safety
    /// `available()` must be true; `data` holds `m * row_bytes` bytes (`k /
    /// block_size` blocks of `dtype` per row, `k` a multiple of 32), `acts`
    /// holds n rows of k for this dtype, `rows.end <= m`, and `out` points at
    /// `n * m` writable floats of which this call writes only columns `rows`.
    pub unsafe fn rows(&self, rows: Range<usize>, out: *mut f32) {
        assert!(rows.end <= self.m && self.data.len() >= self.m * self.row_bytes);
        assert!(self.acts.q.len() >= self.n * self.k && self.acts.scales.d.len() >= self.n * self.acts.scales.stride);
        quant_rows8(self, rows, out)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn quant_rows8(mm: &QuantMatmul8, rows: Range<usize>, out: *mut f32) {
    let a = Rows { data: mm.data.as_ptr(), row_bytes: mm.row_bytes, k: mm.k, acts: mm.acts, n: mm.n, m: mm.m, out };
    match mm.dtype {
        DType::Q4_0 => a.run::<Q4_0>(rows),
        DType::Q4_1 => a.run::<Q4_1>(rows),
        DType::Q5_0 => a.run::<Q5_0>(rows),
        DType::Q5_1 => a.run::<Q5_1>(rows),
        DType::Q8_0 => a.run::<Q8_0>(rows),
        DType::Q4K => a.run::<Q4K>(rows),
        DType::Q5K => a.run::<Q5K>(rows),
        DType::Q6K => a.run::<Q6K>(rows),
        _ => unreachable!("fused kernels cover quantized types only"),
    }
}

struct Rows<'a> {
    data: *const u8,
    row_bytes: usize,
    k: usize,
    acts: &'a Acts8,
    n: usize,
    m: usize,
    out: *mut f32,
}

/// A group's state beside the accumulators: its scales (read with a variable
/// index, so in memory; a separate variable keeps the accumulators in
/// registers, as in `qdot`) and the offset accumulators.
struct Group<const T: usize, const R: usize> {
    macc: [[__m256; T]; R],
    s: [[[f32; 8]; T]; R],
}

impl Rows<'_> {
    /// `qdot`'s tile shapes (the tile changes only which values share
    /// registers, never an output element's arithmetic).
    #[inline(always)]
    unsafe fn run<const F: u8>(&self, rows: Range<usize>) {
        let mut t0 = 0;
        while t0 < self.n {
            t0 += match self.n - t0 {
                1 => self.tile::<F, 1, 4>(t0, rows.clone()),
                2 => self.tile::<F, 2, 2>(t0, rows.clone()),
                3 => self.tile::<F, 3, 1>(t0, rows.clone()),
                4..8 => self.tile::<F, 4, 1>(t0, rows.clone()),
                _ => self.tile::<F, 8, 2>(t0, rows.clone()),
            };
        }
    }

    #[inline(always)]
    unsafe fn tile<const F: u8, const T: usize, const R: usize>(&self, t0: usize, rows: Range<usize>) -> usize {
        let tile = Tile::<T, u8>::new(&self.acts.scales, t0, |t| self.acts.q.as_ptr().wrapping_add(t * self.k));
        let nb = self.k / 32;
        let ahead = PREFETCH_BYTES.div_ceil(self.row_bytes.max(1)).max(R);
        let mut r = rows.start;
        while r + R <= rows.end {
            let pf = Prefetch { at: self.data.wrapping_add((r + ahead) * self.row_bytes), len: R * self.row_bytes };
            let v = row_dot::<F, T, R>(std::array::from_fn(|i| self.data.add((r + i) * self.row_bytes)), nb, &tile, pf);
            for (i, v) in v.into_iter().enumerate() {
                for (t, v) in v.into_iter().enumerate() {
                    *self.out.add((t0 + t) * self.m + r + i) = v;
                }
            }
            r += R;
        }
        while R > 1 && r < rows.end {
            let pf = Prefetch { at: self.data.wrapping_add((r + ahead) * self.row_bytes), len: self.row_bytes };
            let v = row_dot::<F, T, 1>([self.data.add(r * self.row_bytes)], nb, &tile, pf);
            for (t, v) in v[0].into_iter().enumerate() {
                *self.out.add((t0 + t) * self.m + r) = v;
            }
            r += 1;
        }
        T
    }
}

/// R weight rows (`nb` 32-element blocks each) against the tile's activation rows.
#[inline(always)]
unsafe fn row_dot<const F: u8, const T: usize, const R: usize>(
    w: [*const u8; R],
    nb: usize,
    a: &Tile<T, u8>,
    pf: Prefetch,
) -> [[f32; T]; R] {
    let zero = _mm256_setzero_ps();
    let mut acc = [[zero; T]; R];
    let mut c = Group::<T, R> { macc: [[zero; T]; R], s: [[[0.0; 8]; T]; R] };
    let bb = block_bytes(F);
    let per_group = (pf.len * 8).div_ceil(nb.max(1)).next_multiple_of(64);
    let (mut pf_at, pf_end) = (pf.at, pf.at.wrapping_add(pf.len));
    let mut j0 = 0;
    while j0 < nb {
        pf_at = pf.step(pf_at, per_group, pf_end);
        // A k-quant block is one group of eight; other formats take eight
        // blocks (fewer at a row's end).
        let at = if is_k(F) { j0 / 8 * bb } else { j0 * bb };
        let g = if is_k(F) { 8 } else { 8.min(nb - j0) };
        let mut b = w;
        for r in 0..R {
            b[r] = w[r].add(at);
        }
        for r in 0..R {
            let (ws, wm) = match F {
                Q4K | Q5K => scales_k4(b[r]),
                Q6K => (_mm256_cvtph_ps(_mm_set1_epi16((b[r].add(208) as *const i16).read_unaligned())), zero),
                _ => scales32::<F>(b[r], g),
            };
            for t in 0..T {
                _mm256_storeu_ps(c.s[r][t].as_mut_ptr(), _mm256_mul_ps(ws, _mm256_loadu_ps(a.d[t].add(j0))));
                if !signed_format(F) {
                    c.macc[r][t] = _mm256_fmadd_ps(wm, _mm256_loadu_ps(a.dsum[t].add(j0)), c.macc[r][t]);
                }
            }
        }
        for j in 0..g {
            let mut blk = [EMPTY; R];
            for r in 0..R {
                blk[r] = decode::<F>(b[r], j);
            }
            for t in 0..T {
                let x = _mm256_loadu_si256(a.q[t].add((j0 + j) * 32) as *const __m256i);
                for r in 0..R {
                    let p = if signed_format(F) {
                        _mm256_dpbusd_epi32(blk[r].start, x, blk[r].w)
                    } else {
                        _mm256_dpbusd_epi32(blk[r].start, blk[r].w, x)
                    };
                    let p = if F == Q6K { _mm256_mullo_epi32(p, blk[r].lane_scale) } else { p };
                    let s = _mm256_broadcast_ss(&c.s[r][t][j]);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][t]);
                }
            }
        }
        j0 += 8;
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum(_mm256_add_ps(acc[r][t], c.macc[r][t]));
        }
    }
    out
}

/// One decoded 32-element weight block: its bytes in element order, where its
/// dot starts (-128 times the lane sums for signed weights, else zero), and
/// for Q6_K the sub-scale of each i32 lane.
#[derive(Clone, Copy)]
struct Block {
    w: __m256i,
    start: __m256i,
    lane_scale: __m256i,
}

// SAFETY: all-zero bits are a valid __m256i.
const EMPTY: Block = unsafe { std::mem::zeroed() };

/// [low nibbles | high nibbles] of the 16 bytes at `p`: elements 0..16, 16..32.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    _mm256_and_si256(_mm256_blend_epi32::<0b1111_0000>(v, _mm256_srli_epi16(v, 4)), _mm256_set1_epi8(0x0F))
}

/// A block of signed weights: its dot starts from -128 times its lane sums
/// (the activations come plus 128).
#[inline(always)]
unsafe fn signed(w: __m256i) -> Block {
    let zero = _mm256_setzero_si256();
    let sums = _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(-128), w);
    Block { w, start: _mm256_sub_epi32(zero, sums), lane_scale: zero }
}

#[inline(always)]
unsafe fn unsigned(w: __m256i) -> Block {
    Block { w, start: _mm256_setzero_si256(), lane_scale: _mm256_setzero_si256() }
}

/// Block `j` of the group at `b` (a k-quant block, or eight 32-blocks).
#[inline(always)]
unsafe fn decode<const F: u8>(b: *const u8, j: usize) -> Block {
    let lo4 = _mm256_set1_epi8(0x0F);
    let bb = block_bytes(F);
    match F {
        Q4_0 | Q4_1 => unsigned(nibbles(b.add(j * bb + if F == Q4_0 { 2 } else { 4 }))),
        Q5_0 | Q5_1 => {
            let off = j * bb + if F == Q5_0 { 2 } else { 4 };
            unsigned(_mm256_or_si256(nibbles(b.add(off + 4)), bits32(b.add(off))))
        }
        Q8_0 => signed(_mm256_loadu_si256(b.add(j * bb + 2) as *const __m256i)),
        Q4K | Q5K => {
            // Sub-block j: the low (even j) or high nibbles of 32 bytes.
            let qs = _mm256_loadu_si256(b.add(if F == Q5K { 48 } else { 16 } + 32 * (j / 2)) as *const __m256i);
            let shift = _mm_cvtsi32_si128(4 * (j as i32 & 1));
            let mut w = _mm256_and_si256(_mm256_srl_epi16(qs, shift), lo4);
            if F == Q5K {
                // Bit j of each qh byte, to bit 4.
                let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
                let h = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), _mm256_set1_epi8(1));
                w = _mm256_or_si256(w, _mm256_slli_epi16(h, 4));
            }
            unsigned(w)
        }
        _ => {
            // Q6_K sub-block j = 4n + sub of half n: the low (sub 0, 1) or high
            // (2, 3) nibbles of ql[0..32] (sub 0, 2) or ql[32..64] (1, 3), qh
            // bits 2 sub and 2 sub + 1 on top, minus 32; scales 2 sub, 2 sub + 1.
            let (n, sub) = (j / 4, j % 4);
            let ql = _mm256_loadu_si256(b.add(64 * n + 32 * (sub & 1)) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(128 + 32 * n) as *const __m256i);
            let low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (sub as i32 >> 1))), lo4);
            let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * sub as i32)), _mm256_set1_epi8(3));
            let q = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
            let mut blk = signed(_mm256_sub_epi8(q, _mm256_set1_epi8(32)));
            let sc = b.add(192 + 8 * n + 2 * sub) as *const i8;
            let (s0, s1) = (*sc as i32, *sc.add(1) as i32);
            blk.lane_scale = _mm256_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1);
            blk
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{Rng, QUANT_TYPES};
    use super::*;
    use crate::quant::{dequantize_row, quantize_row_q8_bits8};

    /// Every format, odd shapes (a row's last group short, weight rows not a
    /// multiple of the tile, every tile height), against f64 dots of the
    /// dequantized weights with the 8-bit activations' values.
    #[test]
    fn matches_dequantized_reference() {
        if !available() {
            return; // The 16-bit kernels serve this CPU; they are tested in qdot and matmul.
        }
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for dtype in QUANT_TYPES {
            let k = if dtype.block_size() == 256 { 768 } else { 288 };
            for (n, m) in [(1, 13), (2, 6), (3, 5), (5, 7), (8, 9), (11, 13)] {
                let data = rng.weight(dtype, m, k);
                let (x, _) = rng.acts(n, k);
                let mut xq = vec![Q8Block::default(); n * k / 32];
                for t in 0..n {
                    quantize_row_q8_bits8(&x[t * k..(t + 1) * k], &mut xq[t * k / 32..(t + 1) * k / 32]);
                }
                assert!(xq.iter().all(|b| b.qs.iter().all(|&v| v.abs() <= 127)));
                let acts = Acts8::new(&xq, n, k / 32, dtype);
                let row_bytes = k / dtype.block_size() * dtype.block_bytes();
                let mm = QuantMatmul8 { dtype, data: &data, row_bytes, k, m, acts: &acts, n };
                let mut got = vec![0f32; n * m];
                // SAFETY: the features are present (checked above); sizes match.
                unsafe { mm.rows(0..m, got.as_mut_ptr()) };
                let mut wrow = vec![0f32; k];
                for r in 0..m {
                    dequantize_row(dtype, &data[r * row_bytes..(r + 1) * row_bytes], &mut wrow).unwrap();
                    for t in 0..n {
                        let want: f64 = (0..k)
                            .map(|i| {
                                let b = &xq[t * k / 32 + i / 32];
                                wrow[i] as f64 * b.d as f64 * b.qs[i % 32] as f64
                            })
                            .sum();
                        let scale: f64 = (0..k).map(|i| (wrow[i] as f64 * x[t * k + i] as f64).abs()).sum();
                        let err = (got[t * m + r] as f64 - want).abs();
                        assert!(
                            err <= 1e-5 * scale.max(1e-3),
                            "{dtype} n={n} r={r} t={t}: {} vs {want}",
                            got[t * m + r]
                        );
                    }
                }
            }
        }
    }
}
