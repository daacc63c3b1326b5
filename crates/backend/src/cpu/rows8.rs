//! Quantized weights interleaved by eight rows (Q8_0, Q5_0, Q4_K and Q6_K), and their
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

use super::qdot::ActScales;
use crate::quant::{f16_at, scale_min_k4, Q8Block};
use ferrite_core::DType;
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
    matches!(dtype, DType::Q8_0 | DType::Q5_0 | DType::Q4K | DType::Q6K)
        && rows > 0
        && rows <= MAX_ROWS
        && rows.is_multiple_of(R)
        && super::qdot::available()
}

// Q8_0 group block (32 columns of 8 rows): 8 f16 scales, then 16 pairs x 8
// rows x 2 i8.
const Q8_0_GROUP: usize = 2 * R + 32 * R;

// Q5_0 group block (32 columns of 8 rows): 8 f16 scales; 8 x 16 bytes whose
// byte 2 * row + e of the p-th holds the low four bits of element 2p + e in
// its low nibble and of element 2(p + 8) + e in its high nibble; then 16 u16,
// one per (row, e): bit p the fifth bit of element 2p + e, bit 8 + p that of
// element 2(p + 8) + e.
const Q5_0_QS: usize = 2 * R;
const Q5_0_HB: usize = Q5_0_QS + 16 * R;
const Q5_0_GROUP: usize = Q5_0_HB + 4 * R;

// Q4_K group block (256 columns of 8 rows): 8 f16 d, 8 f16 dmin, the 6-bit
// scales and mins as bytes ([sub-block][row] each), then per 32-column
// sub-block 8 x 16 bytes: byte 2 * row + e of the p-th holds element
// 2p + e in its low nibble and 2(p + 8) + e in its high nibble.
const Q4K_SC: usize = 4 * R;
const Q4K_MIN: usize = Q4K_SC + 8 * R;
const Q4K_QS: usize = Q4K_MIN + 8 * R;
const Q4K_GROUP: usize = Q4K_QS + 128 * R;

// Q6_K group block (256 columns of 8 rows): 8 f16 d, the i8 scales
// ([16-column sub-block][row]), then per 32-column sub-block the low four
// bits as Q4_K's nibbles (128 bytes) and the top two bits as 16 u16 per half
// (one per (row, e): bits 2p, 2p + 1 those of element 2p + e, or of
// 2(p + 8) + e in the second half; 64 bytes).
const Q6K_SC: usize = 2 * R;
const Q6K_QS: usize = Q6K_SC + 16 * R;
const Q6K_SUB: usize = 128 + 64;
const Q6K_GROUP: usize = Q6K_QS + 8 * Q6K_SUB;

/// Bytes of one group's stored block (`block_size` columns of eight rows).
fn group_block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 => Q8_0_GROUP,
        DType::Q5_0 => Q5_0_GROUP,
        DType::Q4K => Q4K_GROUP,
        _ => Q6K_GROUP,
    }
}

/// Bytes of a weight of `rows` x `cols` in the interleaved layout.
pub fn interleaved_bytes(dtype: DType, rows: usize, cols: usize) -> usize {
    rows / R * cols / dtype.block_size() * group_block_bytes(dtype)
}

/// Rows of `dtype` (eligible) in the interleaved layout.
pub fn interleave(dtype: DType, src: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let nb = cols / dtype.block_size();
    let (bb, gb) = (dtype.block_bytes(), group_block_bytes(dtype));
    let row_bytes = nb * bb;
    assert!(rows.is_multiple_of(R) && src.len() == rows * row_bytes);
    let mut out = vec![0u8; interleaved_bytes(dtype, rows, cols)];
    for (g, dst) in out.chunks_exact_mut(nb * gb).enumerate() {
        for (j, blk) in dst.chunks_exact_mut(gb).enumerate() {
            let rows: [&[u8]; R] = std::array::from_fn(|i| &src[(g * R + i) * row_bytes + j * bb..][..bb]);
            match dtype {
                DType::Q8_0 => interleave_q8_0(rows, blk),
                DType::Q5_0 => interleave_q5_0(rows, blk),
                DType::Q4K => interleave_q4k(rows, blk),
                _ => interleave_q6k(rows, blk),
            }
        }
    }
    out
}

fn interleave_q8_0(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[..2]);
        for p in 0..16 {
            let at = 2 * R + p * 2 * R + 2 * i;
            blk[at..at + 2].copy_from_slice(&s[2 + 2 * p..4 + 2 * p]);
        }
    }
}

/// A Q5_0 block's 32 5-bit values (unsigned, 16 above the weight).
fn q5_0_values(b: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (b[6 + j] & 0xF) | (((qh >> j) & 1) << 4) as u8;
        q[j + 16] = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
    }
    q
}

fn interleave_q5_0(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[..2]);
        let v = q5_0_values(s);
        for e in 0..2 {
            let mut hb = 0u16;
            for p in 0..8 {
                let (lo, hi) = (v[2 * p + e], v[2 * (p + 8) + e]);
                blk[Q5_0_QS + p * 16 + 2 * i + e] = (lo & 0xF) | (hi & 0xF) << 4;
                hb |= ((lo >> 4) as u16) << p | ((hi >> 4) as u16) << (8 + p);
            }
            blk[Q5_0_HB + 2 * (2 * i + e)..][..2].copy_from_slice(&hb.to_le_bytes());
        }
    }
}

/// A Q4_K block's 256 4-bit values in element order.
fn q4k_values(b: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for j in 0..4 {
        for l in 0..32 {
            let v = b[16 + 32 * j + l];
            q[64 * j + l] = v & 0xF;
            q[64 * j + 32 + l] = v >> 4;
        }
    }
    q
}

fn interleave_q4k(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[0..2]);
        blk[2 * R + 2 * i..2 * R + 2 * i + 2].copy_from_slice(&s[2..4]);
        for sub in 0..8 {
            let (sc, m) = scale_min_k4(sub, &s[4..16]);
            blk[Q4K_SC + sub * R + i] = sc;
            blk[Q4K_MIN + sub * R + i] = m;
        }
        let q = q4k_values(s);
        for sub in 0..8 {
            for p in 0..8 {
                for e in 0..2 {
                    let lo = q[32 * sub + 2 * p + e];
                    let hi = q[32 * sub + 2 * (p + 8) + e];
                    blk[Q4K_QS + sub * 128 + p * 16 + 2 * i + e] = lo | hi << 4;
                }
            }
        }
    }
}

/// A Q6_K block's 256 6-bit values (unsigned, 32 above the weight) in
/// element order.
fn q6k_values(b: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for n in 0..2 {
        let (ql, qh) = (&b[64 * n..], &b[128 + 32 * n..]);
        for l in 0..32 {
            let e = 128 * n + l;
            q[e] = (ql[l] & 0xF) | (qh[l] & 3) << 4;
            q[e + 32] = (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4;
            q[e + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            q[e + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        }
    }
    q
}

fn interleave_q6k(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[208..210]);
        for u in 0..16 {
            blk[Q6K_SC + u * R + i] = s[192 + u];
        }
        let q = q6k_values(s);
        for sub in 0..8 {
            let at = Q6K_QS + sub * Q6K_SUB;
            for e in 0..2 {
                let (mut top_lo, mut top_hi) = (0u16, 0u16);
                for p in 0..8 {
                    let (lo, hi) = (q[32 * sub + 2 * p + e], q[32 * sub + 2 * (p + 8) + e]);
                    blk[at + p * 16 + 2 * i + e] = (lo & 0xF) | (hi & 0xF) << 4;
                    top_lo |= ((lo >> 4) as u16) << (2 * p);
                    top_hi |= ((hi >> 4) as u16) << (2 * p);
                }
                let lane = 2 * (2 * i + e);
                blk[at + 128 + lane..][..2].copy_from_slice(&top_lo.to_le_bytes());
                blk[at + 160 + lane..][..2].copy_from_slice(&top_hi.to_le_bytes());
            }
        }
    }
}

/// Row `r` of interleaved weights (`cols` values) as f32, with the format's
/// own dequantization arithmetic.
pub fn dequantize_row(dtype: DType, data: &[u8], r: usize, cols: usize, out: &mut [f32]) {
    let nb = cols / dtype.block_size();
    let gb = group_block_bytes(dtype);
    let (g, i) = (r / R, r % R);
    let group = &data[g * nb * gb..(g + 1) * nb * gb];
    for (blk, o) in group.chunks_exact(gb).zip(out.chunks_exact_mut(dtype.block_size())) {
        if dtype == DType::Q8_0 {
            let d = f16_at(blk, 2 * i);
            for (e, o) in o.iter_mut().enumerate() {
                *o = d * blk[2 * R + (e / 2) * 2 * R + 2 * i + e % 2] as i8 as f32;
            }
            continue;
        }
        if dtype == DType::Q5_0 {
            let d = f16_at(blk, 2 * i);
            for (e, o) in o.iter_mut().enumerate() {
                let (p, half, lane) = ((e / 2) % 8, e / 16, 2 * i + e % 2);
                let v = blk[Q5_0_QS + p * 16 + lane];
                let low = if half == 0 { v & 0xF } else { v >> 4 };
                let hb = u16::from_le_bytes([blk[Q5_0_HB + 2 * lane], blk[Q5_0_HB + 2 * lane + 1]]);
                let q = low as i32 | (((hb >> (8 * half + p)) & 1) as i32) << 4;
                *o = d * (q - 16) as f32;
            }
            continue;
        }
        if dtype == DType::Q6K {
            let d = f16_at(blk, 2 * i);
            for (e, o) in o.iter_mut().enumerate() {
                let (sub, p, half, lane) = (e / 32, (e / 2) % 8, (e / 16) % 2, 2 * i + e % 2);
                let at = Q6K_QS + sub * Q6K_SUB;
                let v = blk[at + p * 16 + lane];
                let low = if half == 0 { v & 0xF } else { v >> 4 };
                let top = &blk[at + 128 + 32 * half + 2 * lane..];
                let top = u16::from_le_bytes([top[0], top[1]]);
                let q = (low as u16 | ((top >> (2 * p)) & 3) << 4) as i32 - 32;
                let sc = blk[Q6K_SC + (e / 16) * R + i] as i8;
                *o = d * sc as f32 * q as f32;
            }
            continue;
        }
        let (d, dmin) = (f16_at(blk, 2 * i), f16_at(blk, 2 * R + 2 * i));
        for (sub, o) in o.chunks_exact_mut(32).enumerate() {
            let (sc, m) = (blk[Q4K_SC + sub * R + i], blk[Q4K_MIN + sub * R + i]);
            for (e, o) in o.iter_mut().enumerate() {
                let (p, half) = ((e / 2) % 8, e / 16);
                let v = blk[Q4K_QS + sub * 128 + p * 16 + 2 * i + e % 2];
                let q = if half == 0 { v & 0xF } else { v >> 4 };
                *o = d * sc as f32 * q as f32 - dmin * m as f32;
            }
        }
    }
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
        match (self.dtype, super::qdot::vnni()) {
            (DType::Q8_0, false) => run_avx2::<Q8_0Rows>(self, groups, out),
            (DType::Q8_0, true) => run_vnni::<Q8_0Rows>(self, groups, out),
            (DType::Q5_0, false) => run_avx2::<Q5_0Rows>(self, groups, out),
            (DType::Q5_0, true) => run_vnni::<Q5_0Rows>(self, groups, out),
            (DType::Q4K, false) => run_avx2::<Q4KRows>(self, groups, out),
            (DType::Q4K, true) => run_vnni::<Q4KRows>(self, groups, out),
            (_, false) => run_avx2::<Q6KRows>(self, groups, out),
            (_, true) => run_vnni::<Q6KRows>(self, groups, out),
        }
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

/// Activation rows from which Q5_0 is expanded rather than unpacked per use.
const EXPAND_ROWS: usize = 8;

/// Q5_0 group blocks as Q8_0 group blocks (the same scales and values).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn expand_q5_0(src: &[u8], dst: &mut [u8]) {
    for (s, d) in src.chunks_exact(Q5_0_GROUP).zip(dst.chunks_exact_mut(Q8_0_GROUP)) {
        d[..2 * R].copy_from_slice(&s[..2 * R]);
        let out = d.as_mut_ptr().add(2 * R) as *mut __m128i;
        for p in 0..8 {
            let (lo, hi) = Q5_0Rows::pairs(s.as_ptr(), 0, p);
            _mm_storeu_si128(out.add(p), to_i8(lo));
            _mm_storeu_si128(out.add(p + 8), to_i8(hi));
        }
    }
}

/// How a format's group block yields weight pairs and scales.
trait Layout {
    /// Columns per stored group block, and its bytes.
    const COLS: usize;
    const BYTES: usize;
    /// Whether blocks carry a min (times the activation block sum).
    const MIN: bool;
    /// Whether each 16-column half of a block has its own scale (`scales`
    /// then gives the halves' scales).
    const SPLIT: bool = false;
    /// The eight rows' pairs p and p + 8 (p < 8) of 32-column block `sub`, as i16.
    unsafe fn pairs(blk: *const u8, sub: usize, p: usize) -> (__m256i, __m256i);
    /// The eight rows' scales of block `sub`, and their mins (or zero).
    unsafe fn scales(blk: *const u8, sub: usize) -> (__m256, __m256);
}

struct Q8_0Rows;
impl Layout for Q8_0Rows {
    const COLS: usize = 32;
    const BYTES: usize = Q8_0_GROUP;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn pairs(blk: *const u8, _: usize, p: usize) -> (__m256i, __m256i) {
        let at = blk.add(2 * R) as *const __m128i;
        (_mm256_cvtepi8_epi16(_mm_loadu_si128(at.add(p))), _mm256_cvtepi8_epi16(_mm_loadu_si128(at.add(p + 8))))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, _: usize) -> (__m256, __m256) {
        (_mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i)), _mm256_setzero_ps())
    }
}

struct Q5_0Rows;
impl Layout for Q5_0Rows {
    const COLS: usize = 32;
    const BYTES: usize = Q5_0_GROUP;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn pairs(blk: *const u8, _: usize, p: usize) -> (__m256i, __m256i) {
        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(Q5_0_QS + p * 16) as *const __m128i));
        // Fifth bits at bit p (low pairs) and 8 + p (high pairs), moved to bit 4.
        let h = _mm256_loadu_si256(blk.add(Q5_0_HB) as *const __m256i);
        let (nib, c16) = (_mm256_set1_epi16(0x0F), _mm256_set1_epi16(16));
        let lo = _mm256_or_si256(_mm256_and_si256(v, nib), bit_to_4(h, p));
        let hi = _mm256_or_si256(_mm256_srli_epi16(v, 4), bit_to_4(h, 8 + p));
        (_mm256_sub_epi16(lo, c16), _mm256_sub_epi16(hi, c16))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, _: usize) -> (__m256, __m256) {
        (_mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i)), _mm256_setzero_ps())
    }
}

struct Q6KRows;
impl Layout for Q6KRows {
    const COLS: usize = 256;
    const BYTES: usize = Q6K_GROUP;
    const MIN: bool = false;
    const SPLIT: bool = true;
    #[inline(always)]
    unsafe fn pairs(blk: *const u8, sub: usize, p: usize) -> (__m256i, __m256i) {
        let at = blk.add(Q6K_QS + sub * Q6K_SUB);
        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(at.add(p * 16) as *const __m128i));
        let top_lo = _mm256_loadu_si256(at.add(128) as *const __m256i);
        let top_hi = _mm256_loadu_si256(at.add(160) as *const __m256i);
        let (nib, c32) = (_mm256_set1_epi16(0x0F), _mm256_set1_epi16(32));
        let lo = _mm256_or_si256(_mm256_and_si256(v, nib), bits_to_45(top_lo, 2 * p));
        let hi = _mm256_or_si256(_mm256_srli_epi16(v, 4), bits_to_45(top_hi, 2 * p));
        (_mm256_sub_epi16(lo, c32), _mm256_sub_epi16(hi, c32))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, sub: usize) -> (__m256, __m256) {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        let (lo, hi) =
            (signed_bytes_f32(blk.add(Q6K_SC + 2 * sub * R)), signed_bytes_f32(blk.add(Q6K_SC + (2 * sub + 1) * R)));
        // d * sc is exact in f32 (an 11-bit by 8-bit product).
        (_mm256_mul_ps(d, lo), _mm256_mul_ps(d, hi))
    }
}

/// Bits `bit` and `bit + 1` of each i16 lane of `h`, moved to bits 4 and 5
/// (others cleared).
#[inline(always)]
unsafe fn bits_to_45(h: __m256i, bit: usize) -> __m256i {
    let at4 = if bit <= 4 {
        _mm256_sll_epi16(h, _mm_cvtsi32_si128((4 - bit) as i32))
    } else {
        _mm256_srl_epi16(h, _mm_cvtsi32_si128((bit - 4) as i32))
    };
    _mm256_and_si256(at4, _mm256_set1_epi16(0x30))
}

/// Bit `bit` of each i16 lane of `h`, moved to bit 4 (others cleared). (Plain
/// functions, not closures, here: a closure does not inherit the caller's
/// target features and would not be inlined.)
#[inline(always)]
unsafe fn bit_to_4(h: __m256i, bit: usize) -> __m256i {
    let at4 = if bit <= 4 {
        _mm256_sll_epi16(h, _mm_cvtsi32_si128((4 - bit) as i32))
    } else {
        _mm256_srl_epi16(h, _mm_cvtsi32_si128((bit - 4) as i32))
    };
    _mm256_and_si256(at4, _mm256_set1_epi16(0x10))
}

/// Eight bytes at `p`, widened to f32.
#[inline(always)]
unsafe fn bytes_f32(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Eight signed bytes at `p`, widened to f32.
#[inline(always)]
unsafe fn signed_bytes_f32(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Sixteen i16 lanes narrowed to i8 (saturating; the values fit).
#[inline(always)]
unsafe fn to_i8(x: __m256i) -> __m128i {
    _mm_packs_epi16(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1))
}

struct Q4KRows;
impl Layout for Q4KRows {
    const COLS: usize = 256;
    const BYTES: usize = Q4K_GROUP;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn pairs(blk: *const u8, sub: usize, p: usize) -> (__m256i, __m256i) {
        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(Q4K_QS + sub * 128 + p * 16) as *const __m128i));
        (_mm256_and_si256(v, _mm256_set1_epi16(0x0F)), _mm256_srli_epi16(v, 4))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, sub: usize) -> (__m256, __m256) {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(2 * R) as *const __m128i));
        // d * sc and dmin * m are exact in f32 (11-bit by 6-bit products).
        let (sc, m) = (bytes_f32(blk.add(Q4K_SC + sub * R)), bytes_f32(blk.add(Q4K_MIN + sub * R)));
        (_mm256_mul_ps(d, sc), _mm256_mul_ps(dmin, m))
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

    const FORMATS: [DType; 4] = [DType::Q8_0, DType::Q5_0, DType::Q4K, DType::Q6K];

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
                        match dtype {
                            DType::Q8_0 => {
                                run_avx2::<Q8_0Rows>(&mm, 0..m / R, plain.as_mut_ptr());
                                run_vnni::<Q8_0Rows>(&mm, 0..m / R, fused.as_mut_ptr());
                            }
                            DType::Q5_0 => {
                                run_avx2::<Q5_0Rows>(&mm, 0..m / R, plain.as_mut_ptr());
                                run_vnni::<Q5_0Rows>(&mm, 0..m / R, fused.as_mut_ptr());
                            }
                            DType::Q4K => {
                                run_avx2::<Q4KRows>(&mm, 0..m / R, plain.as_mut_ptr());
                                run_vnni::<Q4KRows>(&mm, 0..m / R, fused.as_mut_ptr());
                            }
                            _ => {
                                run_avx2::<Q6KRows>(&mm, 0..m / R, plain.as_mut_ptr());
                                run_vnni::<Q6KRows>(&mm, 0..m / R, fused.as_mut_ptr());
                            }
                        }
                    }
                    assert_eq!(plain, fused, "{dtype} n {n}");
                    // The dispatch (Q5_0 expanded from 8 rows on) gives the same bits.
                    assert_eq!(out, fused, "{dtype} n {n}: dispatch");
                }
            }
        }
    }
}
