//! Q8_0 weights interleaved by eight rows, and their kernel (x86-64, AVX2 with
//! FMA and F16C; VNNI fuses the multiply-add where present).
//!
//! `qdot` spends one f32 conversion and one FMA per 32-element block per
//! (weight row, activation row): as many vector instructions as the integer
//! dot itself. Here each i32 lane belongs to one of eight weight rows, so one
//! conversion and one FMA finish a block for eight rows at once:
//! - a stored block (272 bytes) holds the eight rows' f16 scales, then for each
//!   element pair (0,1), (2,3), .. (30,31) the pair of every row (16 bytes);
//! - a pair of 16-bit activations is broadcast to all lanes and multiplied with
//!   the widened weight pairs (`vpdpwssd`, or `vpmaddwd` plus add), so after 16
//!   pairs lane i holds row i's exact block dot;
//! - per block: `acc = fma(f32(dot), weight scale * activation scale, acc)`.
//!
//! An output element's arithmetic is that sequence over its row's blocks,
//! whatever the tile (the block dot is an exact integer), so results are
//! batch- and thread-invariant. Bytes per weight are Q8_0's: the layout serves
//! decode as well as prefill.

#![cfg(target_arch = "x86_64")]
// Row groups, tile rows and their accumulators are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]

use super::qdot::ActScales;
use crate::quant::Q8Block;
use std::arch::x86_64::*;
use std::ops::Range;

/// Weight rows per interleaved group.
pub const GROUP_ROWS: usize = 8;
/// Bytes of one interleaved block: eight f16 scales, 8 x 32 i8 values.
const BLOCK_BYTES: usize = 2 * GROUP_ROWS + 32 * GROUP_ROWS;
/// Bytes of one Q8_0 block (f16 scale, 32 x i8).
const Q8_0_BYTES: usize = 34;

/// Vocabulary-sized matrices (the output head) stay in the plain layout: a
/// prompt needs one of their rows, not all, and decode streams them; the
/// plain layout's kernel streams Gemma's 178 MB head ~5-10% faster here.
const MAX_ROWS: usize = 65536;

/// Whether a Q8_0 weight of `rows` rows is stored interleaved here: whole
/// groups only, and only where the kernel runs.
pub fn eligible(rows: usize) -> bool {
    rows > 0 && rows <= MAX_ROWS && rows.is_multiple_of(GROUP_ROWS) && super::qdot::available()
}

/// Q8_0 rows (`cols / 32` blocks each) in the interleaved layout.
pub fn interleave(src: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let nb = cols / 32;
    let row_bytes = nb * Q8_0_BYTES;
    assert!(rows.is_multiple_of(GROUP_ROWS) && src.len() == rows * row_bytes);
    let mut out = vec![0u8; src.len()];
    for (g, dst) in out.chunks_exact_mut(nb * BLOCK_BYTES).enumerate() {
        for (j, blk) in dst.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            for i in 0..GROUP_ROWS {
                let s = &src[(g * GROUP_ROWS + i) * row_bytes + j * Q8_0_BYTES..][..Q8_0_BYTES];
                blk[2 * i..2 * i + 2].copy_from_slice(&s[..2]);
                for p in 0..16 {
                    let at = 2 * GROUP_ROWS + p * 2 * GROUP_ROWS + 2 * i;
                    blk[at..at + 2].copy_from_slice(&s[2 + 2 * p..4 + 2 * p]);
                }
            }
        }
    }
    out
}

/// Row `r` of interleaved weights (`cols` values) as f32.
pub fn dequantize_row(data: &[u8], r: usize, cols: usize, out: &mut [f32]) {
    let nb = cols / 32;
    let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
    let group = &data[g * nb * BLOCK_BYTES..(g + 1) * nb * BLOCK_BYTES];
    for (blk, o) in group.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = half::f16::from_le_bytes([blk[2 * i], blk[2 * i + 1]]).to_f32();
        for (e, o) in o.iter_mut().enumerate() {
            let at = 2 * GROUP_ROWS + (e / 2) * 2 * GROUP_ROWS + 2 * i + e % 2;
            *o = d * blk[at] as i8 as f32;
        }
    }
}

/// One matmul: `m` interleaved weight rows of `nb` blocks against `n`
/// activation rows (16-bit blocks and their scales).
pub struct Q8x8Matmul<'a> {
    pub data: &'a [u8],
    pub nb: usize,
    pub m: usize,
    pub xq: &'a [Q8Block],
    pub acts: &'a ActScales,
    pub n: usize,
}

impl Q8x8Matmul<'_> {
    /// out[t * m + r] for every activation row t and every row r of the row
    /// groups `groups`.
    ///
    /// # Safety
    /// `eligible` held for this weight; `out` points at `n * m` writable
    /// floats of which this call writes only the columns of `groups`.
    pub unsafe fn groups(&self, groups: Range<usize>, out: *mut f32) {
        assert!(groups.end * GROUP_ROWS <= self.m && self.data.len() >= self.m * self.nb * Q8_0_BYTES);
        assert!(self.xq.len() >= self.n * self.nb && self.acts.d.len() >= self.n * self.acts.stride);
        if super::qdot::vnni() {
            run_vnni(self, groups, out)
        } else {
            run_avx2(self, groups, out)
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2(mm: &Q8x8Matmul, groups: Range<usize>, out: *mut f32) {
    run::<false>(mm, groups, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn run_vnni(mm: &Q8x8Matmul, groups: Range<usize>, out: *mut f32) {
    run::<true>(mm, groups, out)
}

/// Tiles of T activation rows by G row groups, C independent integer chains
/// per accumulator. Few activation rows (decode) stream the weights from
/// memory: one group at a time then (two groups' streams, 5 KB or more apart,
/// read at half the rate here), with chains to hide the multiply latency.
/// Eight rows or more reuse each chunk's weights from cache; two groups per
/// tile then share each activation broadcast.
#[inline(always)]
unsafe fn run<const V: bool>(mm: &Q8x8Matmul, groups: Range<usize>, out: *mut f32) {
    let mut t0 = 0;
    while t0 < mm.n {
        t0 += match mm.n - t0 {
            1 => tiles::<1, 1, 4, V>(mm, t0, groups.clone(), out),
            2 => tiles::<2, 1, 2, V>(mm, t0, groups.clone(), out),
            3 => tiles::<3, 1, 2, V>(mm, t0, groups.clone(), out),
            _ if mm.n < 8 => tiles::<4, 1, 1, V>(mm, t0, groups.clone(), out),
            _ => tiles::<4, 2, 1, V>(mm, t0, groups.clone(), out),
        };
    }
}

/// Tile rows t0..t0 + T over every group of `groups`, G at a time (then one at a
/// time for the rest); returns T.
#[inline(always)]
unsafe fn tiles<const T: usize, const G: usize, const C: usize, const V: bool>(
    mm: &Q8x8Matmul,
    t0: usize,
    groups: Range<usize>,
    out: *mut f32,
) -> usize {
    let mut g = groups.start;
    while g + G <= groups.end {
        tile::<T, G, C, V>(mm, t0, g, out);
        g += G;
    }
    while g < groups.end {
        tile::<T, 1, C, V>(mm, t0, g, out);
        g += 1;
    }
    T
}

/// How far ahead of a group's current block its bytes are fetched when few
/// activation rows stream the weights.
const PREFETCH_AHEAD: usize = 1024;

#[inline(always)]
unsafe fn tile<const T: usize, const G: usize, const C: usize, const V: bool>(
    mm: &Q8x8Matmul,
    t0: usize,
    g0: usize,
    out: *mut f32,
) {
    let nb = mm.nb;
    let base: [*const u8; G] = std::array::from_fn(|g| mm.data.as_ptr().add((g0 + g) * nb * BLOCK_BYTES));
    let xq: [*const Q8Block; T] = std::array::from_fn(|t| mm.xq.as_ptr().add((t0 + t) * nb));
    let d: [*const f32; T] = std::array::from_fn(|t| mm.acts.d.as_ptr().add((t0 + t) * mm.acts.stride));
    let mut acc = [[_mm256_setzero_ps(); T]; G];
    for j in 0..nb {
        let blk: [*const u8; G] = base.map(|b| b.add(j * BLOCK_BYTES));
        if T <= 3 {
            for g in 0..G {
                let ahead = blk[g].wrapping_add(PREFETCH_AHEAD);
                for l in 0..BLOCK_BYTES.div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
                }
            }
        }
        let mut dot = [[[_mm256_setzero_si256(); T]; G]; C];
        let qs: [*const i32; T] = xq.map(|x| (*x.add(j)).qs.as_ptr() as *const i32);
        // Pairs p0 + c go to chain c: constant indices once `c`'s loop is
        // unrolled, so the chains stay in registers.
        for p0 in (0..16).step_by(C) {
            for c in 0..C {
                let p = p0 + c;
                let w: [__m256i; G] = std::array::from_fn(|g| {
                    let at = blk[g].add(2 * GROUP_ROWS + 2 * GROUP_ROWS * p);
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(at as *const __m128i))
                });
                for t in 0..T {
                    let a = _mm256_set1_epi32(qs[t].add(p).read_unaligned());
                    for g in 0..G {
                        dot[c][g][t] = if V {
                            _mm256_dpwssd_epi32(dot[c][g][t], w[g], a)
                        } else {
                            _mm256_add_epi32(dot[c][g][t], _mm256_madd_epi16(w[g], a))
                        };
                    }
                }
            }
        }
        for g in 0..G {
            let ws = _mm256_cvtph_ps(_mm_loadu_si128(blk[g] as *const __m128i));
            for t in 0..T {
                let mut sum = dot[0][g][t];
                for c in 1..C {
                    sum = _mm256_add_epi32(sum, dot[c][g][t]);
                }
                let s = _mm256_mul_ps(ws, _mm256_set1_ps(*d[t].add(j)));
                acc[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), s, acc[g][t]);
            }
        }
    }
    for g in 0..G {
        for t in 0..T {
            _mm256_storeu_ps(out.add((t0 + t) * mm.m + (g0 + g) * GROUP_ROWS), acc[g][t]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::Rng;
    use super::*;
    use crate::quant::dequantize_row as dequantize_q8_0;
    use ferrite_core::DType;

    #[test]
    fn interleaved_rows_dequantize_as_stored() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (m, k) = (16, 96);
        let data = rng.weight(DType::Q8_0, m, k);
        let x = interleave(&data, m, k);
        let rb = k / 32 * Q8_0_BYTES;
        let (mut want, mut got) = (vec![0f32; k], vec![0f32; k]);
        for r in 0..m {
            dequantize_q8_0(DType::Q8_0, &data[r * rb..(r + 1) * rb], &mut want).unwrap();
            dequantize_row(&x, r, k, &mut got);
            assert_eq!(want, got, "row {r}");
        }
    }

    /// Against f64 dots of the dequantized weights and activations, for every
    /// tile shape (n = 1..9) and odd group counts; the AVX2 and VNNI variants
    /// give the same bits.
    #[test]
    fn matches_reference_and_variants_agree() {
        if !super::super::qdot::available() {
            return;
        }
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let (m, k) = (40, 160);
        let nb = k / 32;
        let data = interleave(&rng.weight(DType::Q8_0, m, k), m, k);
        for n in 1..=9 {
            let (_, xq) = rng.acts(n, k);
            let acts = ActScales::new(&xq, n, nb);
            let mm = Q8x8Matmul { data: &data, nb, m, xq: &xq, acts: &acts, n };
            let mut out = vec![0f32; n * m];
            // SAFETY: the features are present (checked above); sizes match.
            unsafe { run_avx2(&mm, 0..m / GROUP_ROWS, out.as_mut_ptr()) };
            let mut w = vec![0f32; k];
            for r in 0..m {
                dequantize_row(&data, r, k, &mut w);
                for t in 0..n {
                    let want: f64 = (0..k)
                        .map(|e| {
                            let b = &xq[t * nb + e / 32];
                            w[e] as f64 * b.d as f64 * b.qs[e % 32] as f64
                        })
                        .sum();
                    let got = out[t * m + r] as f64;
                    assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "n {n} t {t} r {r}: {got} vs {want}");
                }
            }
            if super::super::qdot::vnni() {
                let mut fused = vec![0f32; n * m];
                // SAFETY: as above, VNNI checked.
                unsafe { run_vnni(&mm, 0..m / GROUP_ROWS, fused.as_mut_ptr()) };
                assert_eq!(out, fused, "n {n}");
            }
        }
    }
}
