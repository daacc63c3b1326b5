//! Quantized weights interleaved by eight rows (every GGUF block format here:
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), and their
//! kernel (x86-64, AVX2 with FMA and F16C; VNNI fuses the multiply-add).
//!
//! `qdot` spends one f32 conversion and one FMA per 32-element block per
//! (weight row, activation row): as many vector instructions as the integer
//! dot itself. Here each i32 lane belongs to one of eight weight rows, so one
//! conversion and one FMA finish a block for eight rows at once:
//! - a stored group holds each 32-element block of the eight rows as 16
//!   element pairs (0,1), (2,3), .. (30,31), each pair of every row side by
//!   side, plus the rows' scales;
//! - a pair of 16-bit activations is broadcast to all lanes and multiplied
//!   with the widened weight pairs (`vpdpwssd`, or `vpmaddwd` plus add), so
//!   after 16 pairs lane i holds row i's exact block dot;
//! - per block: `acc = fma(f32(dot), weight scale * activation scale, acc)`,
//!   then for Q4_K `acc = acc - weight min * activation block sum`; Q6_K,
//!   with a scale per 16 values, keeps the two halves' dots apart and adds
//!   each with its own scale.
//!
//! An output element's arithmetic is that sequence over its row's blocks,
//! whatever the tile (the block dot is an exact integer), so results are
//! batch- and thread-invariant. The bytes per weight are the format's (Q4_K's
//! plus 3%): the layout serves decode as well as prefill. Q5_0, whose fifth
//! bits cost more to unpack than the multiply, is expanded to the Q8_0 layout
//! a chunk at a time where eight or more activation rows reuse it (the same
//! values, so the same bits as its own kernel).

#![cfg(target_arch = "x86_64")]
// Row groups, tile rows and their accumulators are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]

mod layout;

use super::qdot::ActScales;
use crate::quant::Q8Block;
use ferrite_core::DType;
use layout::*;
pub use layout::{dequantize_row, interleave};
use std::arch::x86_64::*;
use std::ops::Range;

/// Weight rows per interleaved group.
pub const GROUP_ROWS: usize = 8;
const R: usize = GROUP_ROWS;

/// Vocabulary-sized matrices (the output head) stay in the plain layout: a
/// prompt needs one of their rows, not all, and decode streams them; the
/// plain layout's kernel streams Gemma's 178 MB head ~5-10% faster here.
const MAX_ROWS: usize = 65536;

/// Whether a weight of `dtype` with `rows` rows is stored interleaved here:
/// the formats below, whole groups only, and only where the kernel runs.
pub fn eligible(dtype: DType, rows: usize) -> bool {
    super::qdot::supports(dtype) && rows > 0 && rows <= MAX_ROWS && rows.is_multiple_of(R) && super::qdot::available()
}

/// One matmul: `m` interleaved weight rows of `k` columns against `n`
/// activation rows (16-bit blocks and their scales).
pub struct Rows8Matmul<'a> {
    pub dtype: DType,
    pub data: &'a [u8],
    pub k: usize,
    pub m: usize,
    pub xq: &'a [Q8Block],
    pub acts: &'a ActScales,
    pub n: usize,
}

impl Rows8Matmul<'_> {
    /// out[t * m + r] for every activation row t and every row r of the row
    /// groups `groups`.
    ///
    /// # Safety
    /// `eligible` held for this weight, whose bytes came from `interleave`;
    /// `out` points at `n * m` writable floats of which this call writes only
    /// the columns of `groups`.
    pub unsafe fn groups(&self, groups: Range<usize>, out: *mut f32) {
        assert!(groups.end * R <= self.m && self.data.len() >= interleaved_bytes(self.dtype, self.m, self.k));
        assert!(self.xq.len() >= self.n * (self.k / 32) && self.acts.d.len() >= self.n * self.acts.stride);
        if self.dtype == DType::Q5_0 && self.n >= EXPAND_ROWS {
            return self.expanded(groups, out);
        }
        run_dtype(self, groups, out, super::qdot::vnni())
    }

    /// Q5_0 groups expanded to the Q8_0 layout, then that kernel.
    unsafe fn expanded(&self, groups: Range<usize>, out: *mut f32) {
        let nb = self.k / 32;
        let src = &self.data[groups.start * nb * Q5_0_GROUP..groups.end * nb * Q5_0_GROUP];
        let mut buf = vec![0u8; groups.len() * nb * Q8_0_GROUP];
        expand_q5_0(src, &mut buf);
        let mm = Rows8Matmul { dtype: DType::Q8_0, data: &buf, ..*self };
        // The expanded groups start at 0; their output columns at groups.start.
        let (local, out) = (0..groups.len(), out.add(groups.start * R));
        if super::qdot::vnni() {
            run_vnni::<Q8_0Rows>(&mm, local, out)
        } else {
            run_avx2::<Q8_0Rows>(&mm, local, out)
        }
    }
}

/// The kernel for `mm.dtype`, its VNNI or its AVX2 variant.
unsafe fn run_dtype(mm: &Rows8Matmul, groups: Range<usize>, out: *mut f32, vnni: bool) {
    macro_rules! go {
        ($layout:ty) => {
            if vnni {
                run_vnni::<$layout>(mm, groups, out)
            } else {
                run_avx2::<$layout>(mm, groups, out)
            }
        };
    }
    match mm.dtype {
        DType::Q4_0 => go!(Q4Rows<0>),
        DType::Q4_1 => go!(Q4Rows<{ 2 * R }>),
        DType::Q5_0 => go!(Q5Rows<0>),
        DType::Q5_1 => go!(Q5Rows<{ 2 * R }>),
        DType::Q8_0 => go!(Q8_0Rows),
        DType::Q4K => go!(KRows<false>),
        DType::Q5K => go!(KRows<true>),
        _ => go!(Q6KRows),
    }
}

/// Activation rows from which Q5_0 is expanded rather than unpacked per use.
const EXPAND_ROWS: usize = 8;

/// Q5_0 group blocks as Q8_0 group blocks (the same scales and values).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn expand_q5_0(src: &[u8], dst: &mut [u8]) {
    for (s, d) in src.chunks_exact(Q5_0_GROUP).zip(dst.chunks_exact_mut(Q8_0_GROUP)) {
        d[..2 * R].copy_from_slice(&s[..2 * R]);
        let out = d.as_mut_ptr().add(2 * R) as *mut __m128i;
        for p in 0..8 {
            let (lo, hi) = <Q5Rows<0>>::pairs(s.as_ptr(), 0, p);
            _mm_storeu_si128(out.add(p), to_i8(lo));
            _mm_storeu_si128(out.add(p + 8), to_i8(hi));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<L: Layout>(mm: &Rows8Matmul, groups: Range<usize>, out: *mut f32) {
    run::<L, false>(mm, groups, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn run_vnni<L: Layout>(mm: &Rows8Matmul, groups: Range<usize>, out: *mut f32) {
    run::<L, true>(mm, groups, out)
}

/// Tiles of T activation rows by G row groups, C independent integer chains
/// per accumulator. Few activation rows (decode) stream the weights from
/// memory: one group at a time then (two groups' streams, 5 KB or more apart,
/// read at half the rate here), with chains to hide the multiply latency.
/// Eight rows or more reuse each chunk's weights from cache; two groups per
/// tile then share each activation broadcast.
#[inline(always)]
unsafe fn run<L: Layout, const V: bool>(mm: &Rows8Matmul, groups: Range<usize>, out: *mut f32) {
    let mut t0 = 0;
    while t0 < mm.n {
        t0 += match mm.n - t0 {
            1 => tiles::<L, 1, 1, 4, V>(mm, t0, groups.clone(), out),
            2 => tiles::<L, 2, 1, 2, V>(mm, t0, groups.clone(), out),
            3 => tiles::<L, 3, 1, 2, V>(mm, t0, groups.clone(), out),
            // Split formats hold twice the integer accumulators.
            _ if mm.n < 8 || L::SPLIT => tiles::<L, 4, 1, 1, V>(mm, t0, groups.clone(), out),
            _ => tiles::<L, 4, 2, 1, V>(mm, t0, groups.clone(), out),
        };
    }
}

/// Tile rows t0..t0 + T over every group of `groups`, G at a time (then one at a
/// time for the rest); returns T.
#[inline(always)]
unsafe fn tiles<L: Layout, const T: usize, const G: usize, const C: usize, const V: bool>(
    mm: &Rows8Matmul,
    t0: usize,
    groups: Range<usize>,
    out: *mut f32,
) -> usize {
    let mut g = groups.start;
    while g + G <= groups.end {
        tile::<L, T, G, C, V>(mm, t0, g, out);
        g += G;
    }
    while g < groups.end {
        tile::<L, T, 1, C, V>(mm, t0, g, out);
        g += 1;
    }
    T
}

/// `acc` plus the pairwise products of `w` and `a` (i16 pairs into i32 lanes).
#[inline(always)]
unsafe fn multiply_add<const V: bool>(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    if V {
        _mm256_dpwssd_epi32(acc, w, a)
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(w, a))
    }
}

/// How far ahead of a group's current block its bytes are fetched when few
/// activation rows stream the weights.
const PREFETCH_AHEAD: usize = 1024;

#[inline(always)]
unsafe fn tile<L: Layout, const T: usize, const G: usize, const C: usize, const V: bool>(
    mm: &Rows8Matmul,
    t0: usize,
    g0: usize,
    out: *mut f32,
) {
    let nb = mm.k / 32;
    let subs = L::COLS / 32;
    let group_bytes = mm.k / L::COLS * L::BYTES;
    let base: [*const u8; G] = std::array::from_fn(|g| mm.data.as_ptr().add((g0 + g) * group_bytes));
    let xq: [*const Q8Block; T] = std::array::from_fn(|t| mm.xq.as_ptr().add((t0 + t) * nb));
    let d: [*const f32; T] = std::array::from_fn(|t| mm.acts.d.as_ptr().add((t0 + t) * mm.acts.stride));
    let dsum: [*const f32; T] = std::array::from_fn(|t| mm.acts.dsum.as_ptr().add((t0 + t) * mm.acts.stride));
    let mut acc = [[_mm256_setzero_ps(); T]; G];
    for j in 0..nb {
        let (blk, sub) = (base.map(|b| b.add(j / subs * L::BYTES)), j % subs);
        if T <= 3 {
            // Spread over the group block: this block's share of its bytes.
            let (share, at) = (L::BYTES / subs, sub * L::BYTES / subs);
            for g in 0..G {
                let ahead = blk[g].wrapping_add(at + PREFETCH_AHEAD);
                for l in 0..share.div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
                }
            }
        }
        // The second half's dots, for split formats.
        let mut dot = [[[_mm256_setzero_si256(); T]; G]; C];
        let mut dot2 = [[[_mm256_setzero_si256(); T]; G]; C];
        let qs: [*const i32; T] = xq.map(|x| (*x.add(j)).qs.as_ptr() as *const i32);
        // Pairs p0 + c (and 8 on) go to chain c: constant indices once `c`'s
        // loop is unrolled, so the chains stay in registers.
        for p0 in (0..8).step_by(C) {
            for c in 0..C {
                let p = p0 + c;
                // (A loop, not `from_fn`: its closure would not inherit the
                // target features, and the intrinsics would become calls.)
                let mut w = [(_mm256_setzero_si256(), _mm256_setzero_si256()); G];
                for g in 0..G {
                    w[g] = L::pairs(blk[g], sub, p);
                }
                for half in 0..2 {
                    for t in 0..T {
                        let a = _mm256_set1_epi32(qs[t].add(p + 8 * half).read_unaligned());
                        for g in 0..G {
                            let w = if half == 0 { w[g].0 } else { w[g].1 };
                            if L::SPLIT && half == 1 {
                                dot2[c][g][t] = multiply_add::<V>(dot2[c][g][t], w, a);
                            } else {
                                dot[c][g][t] = multiply_add::<V>(dot[c][g][t], w, a);
                            }
                        }
                    }
                }
            }
        }
        for g in 0..G {
            let (ws, wm) = L::scales(blk[g], sub);
            for t in 0..T {
                let mut sum = dot[0][g][t];
                for c in 1..C {
                    sum = _mm256_add_epi32(sum, dot[c][g][t]);
                }
                let da = _mm256_set1_ps(*d[t].add(j));
                acc[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(ws, da), acc[g][t]);
                if L::SPLIT {
                    let mut sum = dot2[0][g][t];
                    for c in 1..C {
                        sum = _mm256_add_epi32(sum, dot2[c][g][t]);
                    }
                    acc[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(wm, da), acc[g][t]);
                } else if L::MIN {
                    acc[g][t] = _mm256_fnmadd_ps(wm, _mm256_set1_ps(*dsum[t].add(j)), acc[g][t]);
                }
            }
        }
    }
    for g in 0..G {
        for t in 0..T {
            _mm256_storeu_ps(out.add((t0 + t) * mm.m + (g0 + g) * R), acc[g][t]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::Rng;
    use super::*;
    use crate::quant::dequantize_row as dequantize_plain;

    const FORMATS: [DType; 8] =
        [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q5K, DType::Q6K];

    #[test]
    fn interleaved_rows_dequantize_as_stored() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for dtype in FORMATS {
            let (m, k) = (16, 512);
            let data = rng.weight(dtype, m, k);
            let x = interleave(dtype, &data, m, k);
            let rb = k / dtype.block_size() * dtype.block_bytes();
            let (mut want, mut got) = (vec![0f32; k], vec![0f32; k]);
            for r in 0..m {
                dequantize_plain(dtype, &data[r * rb..(r + 1) * rb], &mut want).unwrap();
                dequantize_row(dtype, &x, r, k, &mut got);
                assert_eq!(want, got, "{dtype} row {r}");
            }
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
        for dtype in FORMATS {
            let (m, k) = (40, 512);
            let nb = k / 32;
            let data = interleave(dtype, &rng.weight(dtype, m, k), m, k);
            for n in 1..=9 {
                let (_, xq) = rng.acts(n, k);
                let acts = ActScales::new(&xq, n, nb);
                let mm = Rows8Matmul { dtype, data: &data, k, m, xq: &xq, acts: &acts, n };
                let mut out = vec![0f32; n * m];
                // SAFETY: the features are present (checked above); sizes match.
                unsafe { mm.groups(0..m / R, out.as_mut_ptr()) };
                let mut w = vec![0f32; k];
                for r in 0..m {
                    dequantize_row(dtype, &data, r, k, &mut w);
                    for t in 0..n {
                        let want: f64 = (0..k)
                            .map(|e| {
                                let b = &xq[t * nb + e / 32];
                                w[e] as f64 * b.d as f64 * b.qs[e % 32] as f64
                            })
                            .sum();
                        let got = out[t * m + r] as f64;
                        let tol = 1e-4 * (1.0 + want.abs());
                        assert!((got - want).abs() <= tol, "{dtype} n {n} t {t} r {r}: {got} vs {want}");
                    }
                }
                if super::super::qdot::vnni() {
                    let (mut plain, mut fused) = (vec![0f32; n * m], vec![0f32; n * m]);
                    // SAFETY: as above, VNNI checked.
                    unsafe {
                        run_dtype(&mm, 0..m / R, plain.as_mut_ptr(), false);
                        run_dtype(&mm, 0..m / R, fused.as_mut_ptr(), true);
                    }
                    assert_eq!(plain, fused, "{dtype} n {n}");
                    // The dispatch (Q5_0 expanded from 8 rows on) gives the same bits.
                    assert_eq!(out, fused, "{dtype} n {n}: dispatch");
                }
            }
        }
    }
}
