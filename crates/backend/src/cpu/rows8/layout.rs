//! The interleaved group layouts of each format: converting stored rows to
//! them, reading a row back, and the `Layout` the kernel reads them through.

// Row groups and their bytes are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]

use super::R;
use crate::quant::{f16_at, scale_min_k4};
use ferrite_core::DType;
use std::arch::x86_64::*;

// Q8_0 group block (32 columns of 8 rows): 8 f16 scales, then 16 pairs x 8
// rows x 2 i8.
pub(super) const Q8_0_GROUP: usize = 2 * R + 32 * R;

// Nibble pairs, the 4-bit values of one 32-column block of eight rows as the
// kernel reads them (128 bytes): byte 2 * row + e of the p-th 16 holds
// element 2p + e in its low nibble and element 2(p + 8) + e in its high one.
pub(super) const NIBBLES: usize = 16 * R;

// Q4_0 group block (32 columns of 8 rows): 8 f16 scales, the nibble pairs.
// Q4_1: 8 f16 scales, 8 f16 mins, the nibble pairs.
pub(super) const Q4_0_GROUP: usize = 2 * R + NIBBLES;
pub(super) const Q4_1_GROUP: usize = 4 * R + NIBBLES;

// Q5_0 group block (32 columns of 8 rows): 8 f16 scales; 8 x 16 bytes whose
// byte 2 * row + e of the p-th holds the low four bits of element 2p + e in
// its low nibble and of element 2(p + 8) + e in its high nibble; then 16 u16,
// one per (row, e): bit p the fifth bit of element 2p + e, bit 8 + p that of
// element 2(p + 8) + e.
pub(super) const Q5_0_QS: usize = 2 * R;
pub(super) const Q5_0_HB: usize = Q5_0_QS + 16 * R;
pub(super) const Q5_0_GROUP: usize = Q5_0_HB + 4 * R;
// Q5_1: 8 f16 scales, 8 f16 mins, then as Q5_0.
pub(super) const Q5_1_QS: usize = 4 * R;
pub(super) const Q5_1_HB: usize = Q5_1_QS + 16 * R;
pub(super) const Q5_1_GROUP: usize = Q5_1_HB + 4 * R;

// Q4_K group block (256 columns of 8 rows): 8 f16 d, 8 f16 dmin, the 6-bit
// scales and mins as bytes ([sub-block][row] each), then per 32-column
// sub-block 8 x 16 bytes: byte 2 * row + e of the p-th holds element
// 2p + e in its low nibble and 2(p + 8) + e in its high nibble.
pub(super) const Q4K_SC: usize = 4 * R;
pub(super) const Q4K_MIN: usize = Q4K_SC + 8 * R;
pub(super) const Q4K_QS: usize = Q4K_MIN + 8 * R;
pub(super) const Q4K_GROUP: usize = Q4K_QS + 128 * R;
// Q5_K: Q4_K's head, then per 32-column sub-block the nibble pairs and the
// fifth-bit words as in Q5_0.
pub(super) const Q5K_SUB: usize = NIBBLES + 4 * R;
pub(super) const Q5K_GROUP: usize = Q4K_QS + 8 * Q5K_SUB;

// Q6_K group block (256 columns of 8 rows): 8 f16 d, the i8 scales
// ([16-column sub-block][row]), then per 32-column sub-block the low four
// bits as Q4_K's nibbles (128 bytes) and the top two bits as 16 u16 per half
// (one per (row, e): bits 2p, 2p + 1 those of element 2p + e, or of
// 2(p + 8) + e in the second half; 64 bytes).
pub(super) const Q6K_SC: usize = 2 * R;
pub(super) const Q6K_QS: usize = Q6K_SC + 16 * R;
pub(super) const Q6K_SUB: usize = 128 + 64;
pub(super) const Q6K_GROUP: usize = Q6K_QS + 8 * Q6K_SUB;

/// Bytes of one group's stored block (`block_size` columns of eight rows).
pub(super) fn group_block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q4_0 => Q4_0_GROUP,
        DType::Q4_1 => Q4_1_GROUP,
        DType::Q8_0 => Q8_0_GROUP,
        DType::Q5_0 => Q5_0_GROUP,
        DType::Q5_1 => Q5_1_GROUP,
        DType::Q4K => Q4K_GROUP,
        DType::Q5K => Q5K_GROUP,
        _ => Q6K_GROUP,
    }
}

/// Bytes of a weight of `rows` x `cols` in the interleaved layout.
pub(super) fn interleaved_bytes(dtype: DType, rows: usize, cols: usize) -> usize {
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
                DType::Q4_0 => interleave_q4(rows, blk, 2),
                DType::Q4_1 => interleave_q4(rows, blk, 4),
                DType::Q8_0 => interleave_q8_0(rows, blk),
                DType::Q5_0 => interleave_q5_0(rows, blk),
                DType::Q5_1 => interleave_q5_1(rows, blk),
                DType::Q4K => interleave_q4k(rows, blk, false),
                DType::Q5K => interleave_q4k(rows, blk, true),
                _ => interleave_q6k(rows, blk),
            }
        }
    }
    out
}

pub(super) fn interleave_q8_0(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[..2]);
        for p in 0..16 {
            let at = 2 * R + p * 2 * R + 2 * i;
            blk[at..at + 2].copy_from_slice(&s[2 + 2 * p..4 + 2 * p]);
        }
    }
}

/// Row `i`'s 32 values of a block (their low four bits) into the nibble
/// pairs at `at`.
fn put_nibbles(blk: &mut [u8], at: usize, i: usize, q: &[u8]) {
    for p in 0..8 {
        for e in 0..2 {
            let (lo, hi) = (q[2 * p + e], q[2 * (p + 8) + e]);
            blk[at + p * 16 + 2 * i + e] = (lo & 0xF) | (hi & 0xF) << 4;
        }
    }
}

/// The low four bits of row `i`'s element `e` (0..32) in the nibble pairs at `at`.
fn nibble(blk: &[u8], at: usize, i: usize, e: usize) -> u8 {
    let v = blk[at + (e / 2) % 8 * 16 + 2 * i + e % 2];
    if e < 16 {
        v & 0xF
    } else {
        v >> 4
    }
}

/// Q4_0 (`head` 2: the scale) or Q4_1 (4: scale and min) rows.
fn interleave_q4(rows: [&[u8]; R], blk: &mut [u8], head: usize) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[..2]);
        if head == 4 {
            blk[2 * R + 2 * i..2 * R + 2 * i + 2].copy_from_slice(&s[2..4]);
        }
        let mut q = [0u8; 32];
        for j in 0..16 {
            (q[j], q[j + 16]) = (s[head + j] & 0xF, s[head + j] >> 4);
        }
        put_nibbles(blk, head * R, i, &q);
    }
}

/// A Q5_0 block's 32 5-bit values (unsigned, 16 above the weight).
pub(super) fn q5_0_values(b: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (b[6 + j] & 0xF) | (((qh >> j) & 1) << 4) as u8;
        q[j + 16] = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
    }
    q
}

pub(super) fn interleave_q5_0(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[..2]);
        let v = q5_0_values(s);
        put_nibbles(blk, Q5_0_QS, i, &v);
        put_fifth_bits(blk, Q5_0_HB, i, &v);
    }
}

fn interleave_q5_1(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[..2]);
        blk[2 * R + 2 * i..2 * R + 2 * i + 2].copy_from_slice(&s[2..4]);
        // Q5_1's values sit where Q5_0's would, two bytes on (after the min).
        let v = q5_0_values(&s[2..]);
        put_nibbles(blk, Q5_1_QS, i, &v);
        put_fifth_bits(blk, Q5_1_HB, i, &v);
    }
}

/// Row `i`'s fifth bits (bit 4 of each of 32 values) as the two 16-bit words
/// at `at`: word (row, e) has bit p from element 2p + e, bit 8 + p from
/// element 2(p + 8) + e.
fn put_fifth_bits(blk: &mut [u8], at: usize, i: usize, q: &[u8]) {
    for e in 0..2 {
        let mut hb = 0u16;
        for p in 0..8 {
            let (lo, hi) = (q[2 * p + e], q[2 * (p + 8) + e]);
            hb |= (((lo >> 4) & 1) as u16) << p | (((hi >> 4) & 1) as u16) << (8 + p);
        }
        blk[at + 2 * (2 * i + e)..][..2].copy_from_slice(&hb.to_le_bytes());
    }
}

/// The fifth bit (as 16 or 0) of row `i`'s element `e` (0..32) in the words at `at`.
fn fifth_bit(blk: &[u8], at: usize, i: usize, e: usize) -> u8 {
    let lane = 2 * i + e % 2;
    let hb = u16::from_le_bytes([blk[at + 2 * lane], blk[at + 2 * lane + 1]]);
    (((hb >> (8 * (e / 16) + (e / 2) % 8)) & 1) << 4) as u8
}

/// A Q4_K block's 256 4-bit values in element order.
pub(super) fn q4k_values(b: &[u8]) -> [u8; 256] {
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

/// Q4_K rows, or Q5_K (`five`) with their fifth bits.
pub(super) fn interleave_q4k(rows: [&[u8]; R], blk: &mut [u8], five: bool) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[0..2]);
        blk[2 * R + 2 * i..2 * R + 2 * i + 2].copy_from_slice(&s[2..4]);
        for sub in 0..8 {
            let (sc, m) = scale_min_k4(sub, &s[4..16]);
            blk[Q4K_SC + sub * R + i] = sc;
            blk[Q4K_MIN + sub * R + i] = m;
        }
        let q = if five { q5k_values(s) } else { q4k_values(s) };
        let sub_bytes = if five { Q5K_SUB } else { NIBBLES };
        for sub in 0..8 {
            let (at, v) = (Q4K_QS + sub * sub_bytes, &q[32 * sub..32 * sub + 32]);
            put_nibbles(blk, at, i, v);
            if five {
                put_fifth_bits(blk, at + NIBBLES, i, v);
            }
        }
    }
}

/// A Q5_K block's 256 5-bit values in element order.
fn q5k_values(b: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for j in 0..4 {
        for l in 0..32 {
            let (v, h) = (qs[32 * j + l], qh[l] >> (2 * j));
            q[64 * j + l] = (v & 0xF) | (h & 1) << 4;
            q[64 * j + 32 + l] = (v >> 4) | ((h >> 1) & 1) << 4;
        }
    }
    q
}

/// A Q6_K block's 256 6-bit values (unsigned, 32 above the weight) in
/// element order.
pub(super) fn q6k_values(b: &[u8]) -> [u8; 256] {
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

pub(super) fn interleave_q6k(rows: [&[u8]; R], blk: &mut [u8]) {
    for (i, s) in rows.iter().enumerate() {
        blk[2 * i..2 * i + 2].copy_from_slice(&s[208..210]);
        for u in 0..16 {
            blk[Q6K_SC + u * R + i] = s[192 + u];
        }
        let q = q6k_values(s);
        for sub in 0..8 {
            let at = Q6K_QS + sub * Q6K_SUB;
            put_nibbles(blk, at, i, &q[32 * sub..32 * sub + 32]);
            for e in 0..2 {
                let (mut top_lo, mut top_hi) = (0u16, 0u16);
                for p in 0..8 {
                    let (lo, hi) = (q[32 * sub + 2 * p + e], q[32 * sub + 2 * (p + 8) + e]);
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
        if dtype == DType::Q4_0 {
            let d = f16_at(blk, 2 * i);
            for (e, o) in o.iter_mut().enumerate() {
                *o = (nibble(blk, 2 * R, i, e) as i32 - 8) as f32 * d;
            }
            continue;
        }
        if dtype == DType::Q4_1 {
            let (d, m) = (f16_at(blk, 2 * i), f16_at(blk, 2 * R + 2 * i));
            for (e, o) in o.iter_mut().enumerate() {
                *o = nibble(blk, 4 * R, i, e) as f32 * d + m;
            }
            continue;
        }
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
                let q = (nibble(blk, Q5_0_QS, i, e) | fifth_bit(blk, Q5_0_HB, i, e)) as i32;
                *o = d * (q - 16) as f32;
            }
            continue;
        }
        if dtype == DType::Q5_1 {
            let (d, m) = (f16_at(blk, 2 * i), f16_at(blk, 2 * R + 2 * i));
            for (e, o) in o.iter_mut().enumerate() {
                let q = nibble(blk, Q5_1_QS, i, e) | fifth_bit(blk, Q5_1_HB, i, e);
                *o = q as f32 * d + m;
            }
            continue;
        }
        if dtype == DType::Q6K {
            let d = f16_at(blk, 2 * i);
            for (e, o) in o.iter_mut().enumerate() {
                let (sub, p, half, lane) = (e / 32, (e / 2) % 8, (e / 16) % 2, 2 * i + e % 2);
                let at = Q6K_QS + sub * Q6K_SUB;
                let low = nibble(blk, at, i, e % 32);
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
            let five = dtype == DType::Q5K;
            let at = Q4K_QS + sub * if five { Q5K_SUB } else { NIBBLES };
            for (e, o) in o.iter_mut().enumerate() {
                let high = if five { fifth_bit(blk, at + NIBBLES, i, e) } else { 0 };
                let q = nibble(blk, at, i, e) | high;
                *o = d * sc as f32 * q as f32 - dmin * m as f32;
            }
        }
    }
}

/// How a format's group block yields weight pairs and scales.
pub(super) trait Layout {
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

pub(super) struct Q8_0Rows;
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

/// Q5_0 (`MIN_AT` 0: the values minus 16, as the Q8_0 layout it expands to
/// holds them) or Q5_1 (`MIN_AT` the mins' offset: value = d q + m) rows.
pub(super) struct Q5Rows<const MIN_AT: usize>;
impl<const MIN_AT: usize> Layout for Q5Rows<MIN_AT> {
    const COLS: usize = 32;
    const BYTES: usize = if MIN_AT == 0 { Q5_0_GROUP } else { Q5_1_GROUP };
    const MIN: bool = MIN_AT != 0;
    #[inline(always)]
    unsafe fn pairs(blk: *const u8, _: usize, p: usize) -> (__m256i, __m256i) {
        let (lo, hi) = if MIN_AT == 0 {
            fifth_bit_pairs(blk.add(Q5_0_QS), blk.add(Q5_0_HB), p)
        } else {
            fifth_bit_pairs(blk.add(Q5_1_QS), blk.add(Q5_1_HB), p)
        };
        if MIN_AT != 0 {
            return (lo, hi);
        }
        let c16 = _mm256_set1_epi16(16);
        (_mm256_sub_epi16(lo, c16), _mm256_sub_epi16(hi, c16))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, _: usize) -> (__m256, __m256) {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        if MIN_AT == 0 {
            return (d, _mm256_setzero_ps());
        }
        let m = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(MIN_AT) as *const __m128i));
        (d, _mm256_xor_ps(m, _mm256_set1_ps(-0.0)))
    }
}

/// Nibble pairs p (at `qs`) with their fifth bits (the words at `hb`) on top.
#[inline(always)]
unsafe fn fifth_bit_pairs(qs: *const u8, hb: *const u8, p: usize) -> (__m256i, __m256i) {
    let (lo, hi) = nibble_pairs(qs.add(p * 16));
    // Fifth bits at bit p (low pairs) and 8 + p (high pairs), moved to bit 4.
    let h = _mm256_loadu_si256(hb as *const __m256i);
    (_mm256_or_si256(lo, bits_at_4(h, p, 0x10)), _mm256_or_si256(hi, bits_at_4(h, 8 + p, 0x10)))
}

pub(super) struct Q6KRows;
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
        let lo = _mm256_or_si256(_mm256_and_si256(v, nib), bits_at_4(top_lo, 2 * p, 0x30));
        let hi = _mm256_or_si256(_mm256_srli_epi16(v, 4), bits_at_4(top_hi, 2 * p, 0x30));
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

/// Bits `bit` and up of each i16 lane of `h` moved to bit 4 and up, then
/// masked with `keep` (0x10: one bit, 0x30: two). (Plain functions, not
/// closures, here: a closure does not inherit the caller's target features
/// and would not be inlined.)
#[inline(always)]
pub(super) unsafe fn bits_at_4(h: __m256i, bit: usize, keep: i16) -> __m256i {
    let at4 = if bit <= 4 {
        _mm256_sll_epi16(h, _mm_cvtsi32_si128((4 - bit) as i32))
    } else {
        _mm256_srl_epi16(h, _mm_cvtsi32_si128((bit - 4) as i32))
    };
    _mm256_and_si256(at4, _mm256_set1_epi16(keep))
}

/// Eight bytes at `p`, widened to f32.
#[inline(always)]
pub(super) unsafe fn bytes_f32(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Eight signed bytes at `p`, widened to f32.
#[inline(always)]
pub(super) unsafe fn signed_bytes_f32(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Sixteen i16 lanes narrowed to i8 (saturating; the values fit).
#[inline(always)]
pub(super) unsafe fn to_i8(x: __m256i) -> __m128i {
    _mm_packs_epi16(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1))
}

/// Q4_0 (`MIN_AT` 0: the -8 centre as a min of 8 d) or Q4_1 (`MIN_AT` the
/// mins' offset: value = d q + m) rows.
pub(super) struct Q4Rows<const MIN_AT: usize>;
impl<const MIN_AT: usize> Layout for Q4Rows<MIN_AT> {
    const COLS: usize = 32;
    const BYTES: usize = if MIN_AT == 0 { Q4_0_GROUP } else { Q4_1_GROUP };
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn pairs(blk: *const u8, _: usize, p: usize) -> (__m256i, __m256i) {
        nibble_pairs(blk.add(if MIN_AT == 0 { 2 * R } else { 4 * R } + p * 16))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, _: usize) -> (__m256, __m256) {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
        if MIN_AT == 0 {
            // 8 d is exact.
            (d, _mm256_mul_ps(d, _mm256_set1_ps(8.0)))
        } else {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(MIN_AT) as *const __m128i));
            (d, _mm256_xor_ps(m, _mm256_set1_ps(-0.0)))
        }
    }
}

/// Sixteen nibble-pair bytes at `p` as the low pairs' and the high pairs'
/// values (i16).
#[inline(always)]
unsafe fn nibble_pairs(p: *const u8) -> (__m256i, __m256i) {
    let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
    (_mm256_and_si256(v, _mm256_set1_epi16(0x0F)), _mm256_srli_epi16(v, 4))
}

/// Q4_K rows, or Q5_K (`FIVE`) with their fifth bits.
pub(super) struct KRows<const FIVE: bool>;
impl<const FIVE: bool> Layout for KRows<FIVE> {
    const COLS: usize = 256;
    const BYTES: usize = if FIVE { Q5K_GROUP } else { Q4K_GROUP };
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn pairs(blk: *const u8, sub: usize, p: usize) -> (__m256i, __m256i) {
        if FIVE {
            let at = blk.add(Q4K_QS + sub * Q5K_SUB);
            fifth_bit_pairs(at, at.add(NIBBLES), p)
        } else {
            nibble_pairs(blk.add(Q4K_QS + sub * NIBBLES + p * 16))
        }
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
