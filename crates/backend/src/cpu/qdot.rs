//! Fused quantized-weight kernels for x86-64 with AVX2, FMA and F16C: each weight
//! row is read straight from its stored blocks (no unpack buffer). Tiles: a single
//! activation row (decode) takes four weight rows at a time, for independent
//! accumulators; larger batches take up to eight activation rows per weight row,
//! so a decoded weight block is reused across the tile.
//!
//! The arithmetic of one output element never depends on the batch size or on
//! the tile it falls in (so results are batch-invariant). A row is walked in
//! groups of eight 32-element activation blocks: one 256-element k-quant block,
//! or eight 32-element blocks (fewer at the end of a row). Per group:
//! - the eight weight scales times the eight activation scales make one f32
//!   vector `s`;
//! - each 32-element block's integer dot (weights widened to i16 times the i16
//!   activations, `madd` into eight i32 lanes, both halves added) is converted to
//!   f32 and accumulated with one FMA by its lane of `s`;
//! - weight offsets (the mins of Q4_1/Q5_1/Q4_K/Q5_K and the -8/-16 centre of
//!   Q4_0/Q5_0) times the activation block sums go to a second accumulator.
//!
//! The two accumulators are added lane-wise and summed horizontally at the end.
//! Q6_K's per-16 sub-scales are multiplied into the weights in i16 (|q * sc| <=
//! 4096), so its scale vector is just the block scale.

#![cfg(target_arch = "x86_64")]
// Weight rows, tile rows and their accumulators are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]

use crate::quant::Q8Block;
use ferrite_core::DType;
use std::arch::x86_64::*;
use std::ops::Range;

/// Whether the fused kernels can run here (AVX2, FMA and F16C).
pub fn available() -> bool {
    super::simd::has_avx2() && super::simd::has_f16c()
}

/// Whether `dtype` has a fused kernel.
pub fn supports(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q4K | DType::Q5K | DType::Q6K
    )
}

/// Activation scales laid out contiguously (the fused kernels load eight at a
/// time): row t's block j is at `t * stride + j`; `stride` is the block count
/// rounded up to 8, the padding is zero.
#[derive(Default)]
pub struct ActScales {
    pub d: Vec<f32>,
    pub dsum: Vec<f32>,
    pub stride: usize,
}

impl ActScales {
    #[cfg(test)]
    pub fn new(xq: &[Q8Block], n: usize, nb: usize) -> Self {
        let mut a = ActScales::default();
        a.fill(xq, n, nb);
        a
    }

    /// The scales of `n` rows of `nb` blocks, reusing this one's buffers.
    pub fn fill(&mut self, xq: &[Q8Block], n: usize, nb: usize) {
        self.stride = nb.next_multiple_of(8);
        for v in [&mut self.d, &mut self.dsum] {
            v.clear();
            v.resize(n * self.stride, 0.0);
        }
        for t in 0..n {
            for j in 0..nb {
                self.d[t * self.stride + j] = xq[t * nb + j].d;
                self.dsum[t * self.stride + j] = xq[t * nb + j].dsum;
            }
        }
    }
}

/// One quantized matmul: `m` weight rows of `k` elements stored as `dtype`
/// (`row_bytes` each, validated at load) against `n` quantized activation rows.
pub struct QuantMatmul<'a> {
    pub dtype: DType,
    pub data: &'a [u8],
    pub row_bytes: usize,
    pub k: usize,
    pub m: usize,
    pub xq: &'a [Q8Block],
    pub acts: &'a ActScales,
    pub n: usize,
}

impl QuantMatmul<'_> {
    /// out[t * m + r] for every activation row t < n and weight row r in `rows`.
    ///
    /// # Safety
    /// `available()` must be true; `data` holds `m * row_bytes` bytes (`k / block_size`
    /// blocks of `dtype` per row, `k` a multiple of 32), `xq` holds `n * k / 32`
    /// blocks, `acts` was built from `xq`, `rows.end <= m`, and `out` points at
    /// `n * m` writable floats of which this call writes only columns `rows`.
    pub unsafe fn rows(&self, rows: Range<usize>, out: *mut f32) {
        assert!(rows.end <= self.m && self.data.len() >= self.m * self.row_bytes);
        assert!(self.xq.len() >= self.n * (self.k / 32) && self.acts.d.len() >= self.n * self.acts.stride);
        if vnni() {
            quant_rows_vnni(self, rows, out)
        } else {
            quant_rows_avx2(self, rows, out)
        }
    }
}

/// Whether AVX-512 VNNI (with 256-bit forms) is present, checked once.
pub fn vnni() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl"))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quant_rows_avx2(mm: &QuantMatmul, rows: Range<usize>, out: *mut f32) {
    quant_rows::<false>(mm, rows, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn quant_rows_vnni(mm: &QuantMatmul, rows: Range<usize>, out: *mut f32) {
    quant_rows::<true>(mm, rows, out)
}

#[inline(always)]
unsafe fn quant_rows<const V: bool>(mm: &QuantMatmul, rows: Range<usize>, out: *mut f32) {
    let (n, m) = (mm.n, mm.m);
    let a = Rows {
        data: mm.data.as_ptr(),
        row_bytes: mm.row_bytes,
        nb: mm.k / 32,
        xq: mm.xq.as_ptr(),
        acts: mm.acts,
        n,
        m,
        out,
    };
    match mm.dtype {
        DType::Q4_0 => a.run::<Q4_0, V>(rows),
        DType::Q4_1 => a.run::<Q4_1, V>(rows),
        DType::Q5_0 => a.run::<Q5_0, V>(rows),
        DType::Q5_1 => a.run::<Q5_1, V>(rows),
        DType::Q8_0 => a.run::<Q8_0, V>(rows),
        DType::Q4K => a.run::<Q4K, V>(rows),
        DType::Q5K => a.run::<Q5K, V>(rows),
        DType::Q6K => a.run::<Q6K, V>(rows),
        _ => unreachable!("fused kernels cover quantized types only"),
    }
}

// Format ids for the const-generic kernels.
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q5_1: u8 = 3;
pub(super) const Q8_0: u8 = 4;
pub(super) const Q4K: u8 = 5;
pub(super) const Q5K: u8 = 6;
pub(super) const Q6K: u8 = 7;

/// Bytes per stored block.
pub(super) const fn block_bytes(f: u8) -> usize {
    match f {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        Q8_0 => 34,
        Q4K => 144,
        Q5K => 176,
        _ => 210,
    }
}

pub(super) const fn is_k(f: u8) -> bool {
    f >= Q4K
}

struct Rows<'a> {
    data: *const u8,
    row_bytes: usize,
    nb: usize,
    xq: *const Q8Block,
    acts: &'a ActScales,
    n: usize,
    m: usize,
    out: *mut f32,
}

/// The activation rows of one tile: their values (16-bit blocks here,
/// bytes in `qdot8`), scales and scaled sums.
pub(super) struct Tile<const T: usize, Q = Q8Block> {
    pub(super) q: [*const Q; T],
    pub(super) d: [*const f32; T],
    pub(super) dsum: [*const f32; T],
}

impl<const T: usize, Q> Tile<T, Q> {
    /// Rows t0.. of `acts`, whose values for row t start at `q(t0 + t)`.
    ///
    /// # Safety
    /// `acts` holds rows t0..t0 + T.
    #[inline(always)]
    pub(super) unsafe fn new(acts: &ActScales, t0: usize, q: impl Fn(usize) -> *const Q) -> Self {
        Tile {
            q: std::array::from_fn(|t| q(t0 + t)),
            d: std::array::from_fn(|t| acts.d.as_ptr().add((t0 + t) * acts.stride)),
            dsum: std::array::from_fn(|t| acts.dsum.as_ptr().add((t0 + t) * acts.stride)),
        }
    }
}

/// Accumulators of R weight rows times T activation rows (kept in registers),
/// and the state that lives in memory: the current group's scales, read
/// with a variable index (which would pin the whole struct to the stack if it
/// were a field here), and the offset accumulators, touched once per group.
struct Acc<'g, const T: usize, const R: usize, const V: bool> {
    acc: [[__m256; T]; R],
    g: &'g mut Group<T, R>,
}

struct Group<const T: usize, const R: usize> {
    macc: [[__m256; T]; R],
    s: [[[f32; 8]; T]; R],
}

impl Rows<'_> {
    /// Tiles of up to eight activation rows, each run over every weight row of
    /// `rows` (so a tile's activations stay in L1); a single activation row takes
    /// four weight rows at a time instead, for independent accumulators. The
    /// tile shape changes only which values share registers, never the
    /// arithmetic of an output element.
    #[inline(always)]
    unsafe fn run<const F: u8, const V: bool>(&self, rows: Range<usize>) {
        let mut t0 = 0;
        while t0 < self.n {
            t0 += match self.n - t0 {
                1 => self.tile::<F, 1, 4, V>(t0, rows.clone()),
                2 => self.tile::<F, 2, 2, V>(t0, rows.clone()),
                3 => self.tile::<F, 3, 1, V>(t0, rows.clone()),
                4..8 => self.tile::<F, 4, 1, V>(t0, rows.clone()),
                // AVX-512 VL has 32 vector registers: two weight rows per tile
                // halve the activation loads per product.
                _ if V => self.tile::<F, 8, 2, V>(t0, rows.clone()),
                _ => self.tile::<F, 8, 1, V>(t0, rows.clone()),
            };
        }
    }

    #[inline(always)]
    unsafe fn tile<const F: u8, const T: usize, const R: usize, const V: bool>(
        &self,
        t0: usize,
        rows: Range<usize>,
    ) -> usize {
        let tile = Tile::<T>::new(self.acts, t0, |t| self.xq.wrapping_add(t * self.nb));
        let ahead = PREFETCH_BYTES.div_ceil(self.row_bytes.max(1)).max(R);
        let mut r = rows.start;
        while r + R <= rows.end {
            // Weights stream from memory once per token in decode: fetch the
            // rows PREFETCH_BYTES ahead while these are computed.
            let pf = Prefetch { at: self.data.wrapping_add((r + ahead) * self.row_bytes), len: R * self.row_bytes };
            let v = row_dot::<F, T, R, V>(
                std::array::from_fn(|i| self.data.add((r + i) * self.row_bytes)),
                self.nb,
                &tile,
                pf,
            );
            for (i, v) in v.into_iter().enumerate() {
                for (t, v) in v.into_iter().enumerate() {
                    *self.out.add((t0 + t) * self.m + r + i) = v;
                }
            }
            r += R;
        }
        // The same arithmetic per output element, one weight row at a time.
        while R > 1 && r < rows.end {
            let pf = Prefetch { at: self.data.wrapping_add((r + ahead) * self.row_bytes), len: self.row_bytes };
            let v = row_dot::<F, T, 1, V>([self.data.add(r * self.row_bytes)], self.nb, &tile, pf);
            for (t, v) in v[0].into_iter().enumerate() {
                *self.out.add((t0 + t) * self.m + r) = v;
            }
            r += 1;
        }
        T
    }
}

/// How far ahead weights are fetched, in bytes (whole rows, at least this).
/// Without these prefetches decode runs at a third of the speed here; 2-3 KB
/// ahead beat 6 KB by about 10% in decode (Gemma and SmolLM2, 2 threads), and
/// 12 KB or more was slower still.
pub(super) const PREFETCH_BYTES: usize = 3072;

/// A byte range to fetch into L1 while a row tile is computed. Prefetches never
/// fault, so the range may run past the weights (its address is only computed
/// with wrapping arithmetic, never dereferenced).
#[derive(Clone, Copy)]
pub(super) struct Prefetch {
    pub(super) at: *const u8,
    pub(super) len: usize,
}

impl Prefetch {
    /// Prefetch `bytes` from `at` (not past `end`); returns where to go on.
    #[inline(always)]
    pub(super) unsafe fn step(&self, at: *const u8, bytes: usize, end: *const u8) -> *const u8 {
        let mut p = at;
        let stop = at.wrapping_add(bytes);
        while p < stop && p < end {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            p = p.wrapping_add(64);
        }
        stop
    }
}

/// R weight rows (`nb` 32-element blocks each) against the tile's activation rows.
#[inline(always)]
unsafe fn row_dot<const F: u8, const T: usize, const R: usize, const V: bool>(
    w: [*const u8; R],
    nb: usize,
    a: &Tile<T>,
    pf: Prefetch,
) -> [[f32; T]; R] {
    let mut g = Group::<T, R> { macc: [[_mm256_setzero_ps(); T]; R], s: [[[0.0; 8]; T]; R] };
    let mut c = Acc::<T, R, V> { acc: [[_mm256_setzero_ps(); T]; R], g: &mut g };
    let bb = block_bytes(F);
    // Spread the prefetches evenly over the groups.
    let per_group = (pf.len * 8).div_ceil(nb.max(1)).next_multiple_of(64);
    let mut pf_at = pf.at;
    let pf_end = pf.at.wrapping_add(pf.len);
    let mut j0 = 0;
    if is_k(F) {
        while j0 < nb {
            pf_at = pf.step(pf_at, per_group, pf_end);
            let b = w.map(|w| w.add(j0 / 8 * bb));
            match F {
                Q4K => group_q4k::<T, R, false, V>(b, j0, a, &mut c),
                Q5K => group_q4k::<T, R, true, V>(b, j0, a, &mut c),
                _ => group_q6k::<T, R, V>(b, j0, a, &mut c),
            }
            j0 += 8;
        }
    } else {
        while j0 + 8 <= nb {
            pf_at = pf.step(pf_at, per_group, pf_end);
            group32::<F, T, R, V>(w.map(|w| w.add(j0 * bb)), 8, j0, a, &mut c);
            j0 += 8;
        }
        if j0 < nb {
            pf.step(pf_at, per_group, pf_end);
            group32::<F, T, R, V>(w.map(|w| w.add(j0 * bb)), nb - j0, j0, a, &mut c);
        }
    }
    // (Plain loops: a closure would not inherit the caller's target features.)
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum(_mm256_add_ps(c.acc[r][t], c.g.macc[r][t]));
        }
    }
    out
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_add_ss(h, _mm_movehdup_ps(h));
    _mm_cvtss_f32(h)
}

/// Start of a group for weight row `r`: scales `ws * d_act` for each tile row,
/// and the offset term `wm * dsum_act` (when `MIN`).
#[inline(always)]
unsafe fn prologue<const T: usize, const R: usize, const MIN: bool, const V: bool>(
    r: usize,
    ws: __m256,
    wm: __m256,
    j0: usize,
    a: &Tile<T>,
    c: &mut Acc<'_, T, R, V>,
) {
    for t in 0..T {
        _mm256_storeu_ps(c.g.s[r][t].as_mut_ptr(), _mm256_mul_ps(ws, _mm256_loadu_ps(a.d[t].add(j0))));
        if MIN {
            c.g.macc[r][t] = _mm256_fmadd_ps(wm, _mm256_loadu_ps(a.dsum[t].add(j0)), c.g.macc[r][t]);
        }
    }
}

/// Activation block `j0 + j` of tile row `t` as two vectors of 16 i16.
#[inline(always)]
unsafe fn act_block<const T: usize>(a: &Tile<T>, t: usize, j0: usize, j: usize) -> (__m256i, __m256i) {
    let q = (*a.q[t].add(j0 + j)).qs.as_ptr() as *const __m256i;
    (_mm256_loadu_si256(q), _mm256_loadu_si256(q.add(1)))
}

/// `acc[r][t] += dot * scale`: the i32 lanes of one block's dot, weights
/// (`w0` elements 0..16, `w1` 16..32, as i16) times activations (a0, a1), then
/// to f32 with the block's scale for this tile row.
#[inline(always)]
unsafe fn mac_one<const T: usize, const R: usize, const V: bool>(
    (w0, w1): (__m256i, __m256i),
    (a0, a1): (__m256i, __m256i),
    r: usize,
    t: usize,
    j: usize,
    c: &mut Acc<'_, T, R, V>,
) {
    // VNNI fuses the pairwise multiply-add with the accumulation: the same
    // i32 sums (both wrap identically) in two instructions instead of three.
    let p = if V {
        _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(_mm256_setzero_si256(), w0, a0), w1, a1)
    } else {
        _mm256_add_epi32(_mm256_madd_epi16(w0, a0), _mm256_madd_epi16(w1, a1))
    };
    c.acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&c.g.s[r][t][j]), c.acc[r][t]);
}

/// Block `j0 + j` of weight row `r` (`w` as in `mac_one`).
#[inline(always)]
unsafe fn mac<const T: usize, const R: usize, const V: bool>(
    r: usize,
    w: (__m256i, __m256i),
    j0: usize,
    j: usize,
    a: &Tile<T>,
    c: &mut Acc<'_, T, R, V>,
) {
    for t in 0..T {
        mac_one(w, act_block(a, t, j0, j), r, t, j, c);
    }
}

/// Block `j0 + j` of all R weight rows: each activation block is loaded once
/// for the R rows.
#[inline(always)]
unsafe fn mac_rows<const T: usize, const R: usize, const V: bool>(
    w: &[(__m256i, __m256i); R],
    j0: usize,
    j: usize,
    a: &Tile<T>,
    c: &mut Acc<'_, T, R, V>,
) {
    for t in 0..T {
        let x = act_block(a, t, j0, j);
        for r in 0..R {
            mac_one(w[r], x, r, t, j, c);
        }
    }
}

/// Eight (or `g` < 8, at a row's end) consecutive 32-element blocks of each of
/// the R weight rows.
#[inline(always)]
unsafe fn group32<const F: u8, const T: usize, const R: usize, const V: bool>(
    b: [*const u8; R],
    g: usize,
    j0: usize,
    a: &Tile<T>,
    c: &mut Acc<'_, T, R, V>,
) {
    let bb = block_bytes(F);
    for r in 0..R {
        let (ws, wm) = scales32::<F>(b[r], g);
        if F == Q8_0 {
            prologue::<T, R, false, V>(r, ws, wm, j0, a, c);
        } else {
            prologue::<T, R, true, V>(r, ws, wm, j0, a, c);
        }
    }
    let (lo4, four) = nibble_ops();
    for j in 0..g {
        let mut w = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
        for r in 0..R {
            let blk = b[r].add(j * bb);
            w[r] = match F {
                Q4_0 | Q4_1 => {
                    let x =
                        _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(if F == Q4_0 { 2 } else { 4 }) as *const __m128i));
                    (_mm256_and_si256(x, lo4), _mm256_srl_epi16(x, four))
                }
                Q5_0 | Q5_1 => {
                    // In bytes: [low nibbles | high nibbles], the fifth bits
                    // or-ed in, then each half widened.
                    let off = if F == Q5_0 { 2 } else { 4 };
                    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(off + 4) as *const __m128i));
                    let y = _mm256_blend_epi32::<0b1111_0000>(v, _mm256_srli_epi16(v, 4));
                    let y = _mm256_or_si256(_mm256_and_si256(y, _mm256_set1_epi8(0x0F)), bits32(blk.add(off)));
                    (
                        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(y)),
                        _mm256_cvtepu8_epi16(_mm256_extracti128_si256(y, 1)),
                    )
                }
                _ => (
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(2) as *const __m128i)),
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(18) as *const __m128i)),
                ),
            };
        }
        mac_rows::<T, R, V>(&w, j0, j, a, c);
    }
}

/// The scales and offsets of `g` (up to 8) consecutive 32-element blocks at
/// `b`, one per f32 lane (zero past `g`): d, and the offset per unit of the
/// activations' sum (m for Q4_1/Q5_1, the -8/-16 centre of Q4_0/Q5_0).
#[inline(always)]
pub(super) unsafe fn scales32<const F: u8>(b: *const u8, g: usize) -> (__m256, __m256) {
    let bb = block_bytes(F);
    // The first four bytes of each block: d (f16), and m (f16) for Q4_1/Q5_1.
    let h = if g == 8 {
        heads8(b, bb)
    } else {
        let head = |i: usize| if i < g { (b.add(i * bb) as *const i32).read_unaligned() } else { 0 };
        _mm256_setr_epi32(head(0), head(1), head(2), head(3), head(4), head(5), head(6), head(7))
    };
    // [d0..d3 m0..m3 | d4..d7 m4..m7] as u16, then [d0..d7 | m0..m7].
    let split = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
    );
    let packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(h, split), 0b11_01_10_00);
    let ws = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
    let wm = match F {
        Q4_1 | Q5_1 => _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1)),
        Q4_0 => _mm256_mul_ps(ws, _mm256_set1_ps(-8.0)),
        Q5_0 => _mm256_mul_ps(ws, _mm256_set1_ps(-16.0)),
        _ => _mm256_setzero_ps(),
    };
    (ws, wm)
}

/// The first four bytes of eight blocks `bb` bytes apart, one per i32 lane
/// (broadcast loads and blends: no general-purpose to vector moves).
#[inline(always)]
pub(super) unsafe fn heads8(b: *const u8, bb: usize) -> __m256i {
    let ld = |i: usize| (b.add(i * bb) as *const i32).read_unaligned();
    let v = _mm256_set1_epi32(ld(0));
    let v = _mm256_blend_epi32::<0b0000_0010>(v, _mm256_set1_epi32(ld(1)));
    let v = _mm256_blend_epi32::<0b0000_0100>(v, _mm256_set1_epi32(ld(2)));
    let v = _mm256_blend_epi32::<0b0000_1000>(v, _mm256_set1_epi32(ld(3)));
    let v = _mm256_blend_epi32::<0b0001_0000>(v, _mm256_set1_epi32(ld(4)));
    let v = _mm256_blend_epi32::<0b0010_0000>(v, _mm256_set1_epi32(ld(5)));
    let v = _mm256_blend_epi32::<0b0100_0000>(v, _mm256_set1_epi32(ld(6)));
    _mm256_blend_epi32::<0b1000_0000>(v, _mm256_set1_epi32(ld(7)))
}

/// The nibble mask (0x0F in each i16 lane) and a shift count of 4, hidden from
/// the optimizer: knowing them, LLVM masks and shifts the bytes before widening
/// them to i16, which costs a second widening shuffle per 16 weights.
#[inline(always)]
unsafe fn nibble_ops() -> (__m256i, __m128i) {
    let mask = std::hint::black_box(0x000F_000Fu32) as i32;
    (_mm256_set1_epi32(mask), _mm_cvtsi32_si128(std::hint::black_box(4)))
}

/// Sixteen bytes at `p`, zero-extended to i16.
#[inline(always)]
unsafe fn widen(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i))
}

/// The 32 bits at `p` to 32 bytes: byte i is 16 when bit i is set, else 0.
#[inline(always)]
pub(super) unsafe fn bits32(p: *const u8) -> __m256i {
    let v = _mm256_set1_epi32((p as *const i32).read_unaligned());
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let v = _mm256_and_si256(_mm256_shuffle_epi8(v, spread), sel);
    _mm256_and_si256(_mm256_cmpeq_epi8(v, sel), _mm256_set1_epi8(16))
}

/// A Q4_K/Q5_K block's eight sub-block scales (d * sc) and offsets (-dmin * m).
#[inline(always)]
pub(super) unsafe fn scales_k4(b: *const u8) -> (__m256, __m256) {
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()));
    let d = _mm256_broadcastss_ps(dm);
    let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    // Unpack the 12 scale bytes into 8 scales then 8 mins (llama.cpp's masks).
    let s = b.add(4) as *const u32;
    let (u0, u1, u2) = (s.read_unaligned(), s.add(1).read_unaligned(), s.add(2).read_unaligned());
    const KM1: u32 = 0x3f3f_3f3f;
    const KM2: u32 = 0x0f0f_0f0f;
    const KM3: u32 = 0x0303_0303;
    let sc_lo = u0 & KM1;
    let sc_hi = (u2 & KM2) | (((u0 >> 6) & KM3) << 4);
    let mn_lo = u1 & KM1;
    let mn_hi = ((u2 >> 4) & KM2) | (((u1 >> 6) & KM3) << 4);
    let sc = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, sc_hi as i32, sc_lo as i32));
    let mn = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, mn_hi as i32, mn_lo as i32));
    let ws = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
    let wm = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)), _mm256_set1_ps(-0.0));
    (ws, wm)
}

/// One Q4_K (or Q5_K) block of each of the R weight rows: 8 sub-blocks of 32
/// with 6-bit scales and mins.
#[inline(always)]
unsafe fn group_q4k<const T: usize, const R: usize, const FIVE: bool, const V: bool>(
    b: [*const u8; R],
    j0: usize,
    a: &Tile<T>,
    c: &mut Acc<'_, T, R, V>,
) {
    for r in 0..R {
        let (ws, wm) = scales_k4(b[r]);
        prologue::<T, R, true, V>(r, ws, wm, j0, a, c);
    }
    let (lo4, four) = nibble_ops();
    let bit4 = _mm256_set1_epi16(0x10);
    // High bits (Q5_K): bit s of qh[l] belongs to sub-block s; kept at bit 4.
    let mut h = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
    if FIVE {
        for r in 0..R {
            let qh = b[r].add(16);
            h[r] = (_mm256_slli_epi16(widen(qh), 4), _mm256_slli_epi16(widen(qh.add(16)), 4));
        }
    }
    for p in 0..4 {
        for half in 0..2 {
            let mut w = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
            for r in 0..R {
                let qs = b[r].add(if FIVE { 48 } else { 16 } + 32 * p);
                let x0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(qs as *const __m128i));
                let x1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(qs.add(16) as *const __m128i));
                let (mut w0, mut w1) = if half == 0 {
                    (_mm256_and_si256(x0, lo4), _mm256_and_si256(x1, lo4))
                } else {
                    (_mm256_srl_epi16(x0, four), _mm256_srl_epi16(x1, four))
                };
                if FIVE {
                    let (h0, h1) = h[r];
                    w0 = _mm256_or_si256(w0, _mm256_and_si256(h0, bit4));
                    w1 = _mm256_or_si256(w1, _mm256_and_si256(h1, bit4));
                    h[r] = (_mm256_srli_epi16(h0, 1), _mm256_srli_epi16(h1, 1));
                }
                w[r] = (w0, w1);
            }
            mac_rows::<T, R, V>(&w, j0, 2 * p + half, a, c);
        }
    }
}

/// One Q6_K block of each of the R weight rows: two halves of 128, each 4
/// sub-blocks of 32 with two i8 scales (one per 16). One row at a time: the
/// decoded half-block takes most registers.
#[inline(always)]
unsafe fn group_q6k<const T: usize, const R: usize, const V: bool>(
    b: [*const u8; R],
    j0: usize,
    a: &Tile<T>,
    c: &mut Acc<'_, T, R, V>,
) {
    for r in 0..R {
        let d = _mm256_cvtph_ps(_mm_set1_epi16((b[r].add(208) as *const i16).read_unaligned()));
        prologue::<T, R, false, V>(r, d, _mm256_setzero_ps(), j0, a, c);
        for n in 0..2 {
            let ql = b[r].add(64 * n);
            let qh = b[r].add(128 + 32 * n);
            let h = Q6Half {
                l: [widen(ql), widen(ql.add(16)), widen(ql.add(32)), widen(ql.add(48))],
                h: [widen(qh), widen(qh.add(16))],
                // This half's 8 scales as i16, in both 128-bit lanes.
                sc: _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64(
                    b[r].add(192 + 8 * n) as *const __m128i
                ))),
            };
            q6k_sub::<T, R, 0, V>(&h, r, j0, 4 * n, a, c);
            q6k_sub::<T, R, 1, V>(&h, r, j0, 4 * n + 1, a, c);
            q6k_sub::<T, R, 2, V>(&h, r, j0, 4 * n + 2, a, c);
            q6k_sub::<T, R, 3, V>(&h, r, j0, 4 * n + 3, a, c);
        }
    }
}

/// Half a Q6_K block, bytes widened to i16: `l` = ql[0..16], [16..32],
/// [32..48], [48..64]; `h` = qh[0..16], [16..32]; and the half's scales.
struct Q6Half {
    l: [__m256i; 4],
    h: [__m256i; 2],
    sc: __m256i,
}

/// Sub-block `SUB` (0..4) of a Q6_K half: the low (0, 1) or high (2, 3) nibbles of
/// ql[0..32] (0, 2) or ql[32..64] (1, 3), with qh bits 2*SUB and 2*SUB+1 on top,
/// minus 32, times the scales SUB*2 (first 16) and SUB*2+1 (last 16).
#[inline(always)]
unsafe fn q6k_sub<const T: usize, const R: usize, const SUB: i32, const V: bool>(
    h: &Q6Half,
    r: usize,
    j0: usize,
    j: usize,
    a: &Tile<T>,
    c: &mut Acc<'_, T, R, V>,
) {
    let lo4 = _mm256_set1_epi16(0x0F);
    let hi2 = _mm256_set1_epi16(0x30);
    let c32 = _mm256_set1_epi16(32);
    let l = if SUB % 2 == 0 { [h.l[0], h.l[1]] } else { [h.l[2], h.l[3]] };
    let mut w = [_mm256_setzero_si256(); 2];
    for i in 0..2 {
        let low = if SUB < 2 { _mm256_and_si256(l[i], lo4) } else { _mm256_srli_epi16(l[i], 4) };
        // qh bits 2*SUB, 2*SUB+1 moved to bits 4, 5.
        let high = match SUB {
            0 => _mm256_slli_epi16(h.h[i], 4),
            1 => _mm256_slli_epi16(h.h[i], 2),
            2 => h.h[i],
            _ => _mm256_srli_epi16(h.h[i], 2),
        };
        let q = _mm256_sub_epi16(_mm256_or_si256(low, _mm256_and_si256(high, hi2)), c32);
        // Scale index 2*SUB + i, broadcast to every i16 lane.
        let k = (2 * SUB + i as i32) as i8;
        let scale = _mm256_shuffle_epi8(h.sc, _mm256_set1_epi16(i16::from_le_bytes([2 * k as u8, 2 * k as u8 + 1])));
        w[i] = _mm256_mullo_epi16(q, scale);
    }
    mac::<T, R, V>(r, (w[0], w[1]), j0, j, a, c);
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{Rng, QUANT_TYPES};
    use super::*;

    /// The VNNI variant must give the same bits as the AVX2 one (it only fuses
    /// the integer multiply-add with the accumulation), for every format and
    /// tile shape.
    #[test]
    fn vnni_variant_is_bit_identical() {
        if !available() || !vnni() {
            return; // Nothing to compare on this CPU; the AVX2 path is tested elsewhere.
        }
        let mut rng = Rng(0x51_7cc1_b727_220a);
        for dtype in QUANT_TYPES {
            let k = if dtype.block_size() == 256 { 512 } else { 288 };
            let (n, m) = (11, 13);
            let data = rng.weight(dtype, m, k);
            let (_, xq) = rng.acts(n, k);
            let acts = ActScales::new(&xq, n, k / 32);
            let row_bytes = k / dtype.block_size() * dtype.block_bytes();
            let mm = QuantMatmul { dtype, data: &data, row_bytes, k, m, xq: &xq, acts: &acts, n };
            let (mut plain, mut fused) = (vec![0f32; n * m], vec![0f32; n * m]);
            // SAFETY: both feature sets are present (checked above); sizes match.
            unsafe {
                quant_rows_avx2(&mm, 0..m, plain.as_mut_ptr());
                quant_rows_vnni(&mm, 0..m, fused.as_mut_ptr());
            }
            assert_eq!(plain, fused, "{dtype}");
        }
    }
}
