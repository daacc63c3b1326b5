//! Paged causal attention on the CPU.
//!
//! Keys are cached transposed within each block, `[block][kv_dim][block_size]`,
//! so the keys of a block lie contiguous for every dimension: scores for eight
//! (AVX2) or sixteen (AVX-512) keys accumulate in one vector without
//! horizontal sums. Values stay row-major, `[slot][kv_dim]`, to be added as
//! many dimensions at a time.
//!
//! Work is split into units of (sequence, KV head, block of query rows); within
//! a unit, tiles of up to four (row, head) pairs that share the KV head are
//! computed together, so each loaded key or value vector feeds four
//! accumulators (decode with grouped-query attention fills a tile with the
//! heads of one KV head). Every pair's arithmetic is its own: scores
//! accumulate over the dimensions in order, and values over the keys in order
//! (with exact zero weights outside its window), whatever tile or batch it is
//! in, so results are batch-invariant and a row computed in a prefill chunk
//! equals the same row decoded alone.
//!
//! A row's keys go in chunks of `KEY_CHUNK` at fixed positions, each with a
//! softmax of its own, merged in chunk order. A unit takes its chunks in
//! turn; where there are too few units for the threads (decoding one long
//! sequence), each chunk is a unit of its own and the merge runs after, the
//! same arithmetic (SmolLM2 decode at 4,096 tokens of context +14% on 2
//! threads).

// Tile rows and their accumulators are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]
use super::fork::{for_each_chunk, SendPtr};
use super::math::exp;
#[cfg(target_arch = "x86_64")]
use super::simd::{has_avx2, has_avx512, has_f16c};
use crate::{AttnBatch, AttnParams, SeqSlice};
use ferrite_core::{Error, Result};
use std::cell::{Cell, RefCell};
use std::ops::Range;

thread_local! {
    /// The units of the running call, kept for the next one (the decode loop
    /// allocates nothing).
    static UNITS: Cell<Vec<Unit>> = const { Cell::new(Vec::new()) };
    /// A unit's scores, per thread, likewise.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A tile's partials of its chunks, per thread, likewise.
    static LOCAL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Split units' partials (see `attention`), likewise.
    static PARTS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// K and V of every layer, stored in f32 or in f16 (as llama.cpp's default
/// cache: half the bytes to read per decoded token, widened exactly on load).
pub struct CpuKvPool {
    /// Per layer: `[block][kv_dim][block_size]` (transposed within a block).
    pub k: Vec<KvStore>,
    /// Per layer: `[slot][kv_dim]`.
    pub v: Vec<KvStore>,
    pub kv_dim: usize,
    pub block_size: usize,
    pub slots: usize,
}

pub enum KvStore {
    F32(Vec<f32>),
    /// f16 bits.
    F16(Vec<u16>),
}

impl KvStore {
    pub fn zeros(len: usize, f16: bool) -> KvStore {
        if f16 {
            KvStore::F16(vec![0; len])
        } else {
            KvStore::F32(vec![0.0; len])
        }
    }

    fn set(&mut self, i: usize, x: f32) {
        match self {
            KvStore::F32(v) => v[i] = x,
            KvStore::F16(v) => v[i] = half::f16::from_f32(x).to_bits(),
        }
    }
}

/// A cached element: f32, or f16 bits widened exactly.
trait Elem: Copy + Send + Sync {
    fn f32(self) -> f32;
    /// Eight consecutive elements as f32.
    ///
    /// # Safety
    /// AVX2 and F16C present; eight elements readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Sixteen, likewise.
    ///
    /// # Safety
    /// AVX-512F present; sixteen elements readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Elem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
}

impl Elem for u16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

impl CpuKvPool {
    /// Index of key dimension `c` of the token in `slot`.
    #[inline(always)]
    fn k_index(&self, slot: usize, c: usize) -> usize {
        let bs = self.block_size;
        ((slot / bs) * self.kv_dim + c) * bs + slot % bs
    }
}

pub fn write_kv(pool: &mut CpuKvPool, layer: usize, k: &[f32], v: &[f32], slots: &[usize]) -> Result<()> {
    let d = pool.kv_dim;
    if k.len() != slots.len() * d || v.len() != k.len() {
        return Err(Error::Shape(format!("write_kv: {} slots for {} values", slots.len(), k.len())));
    }
    for (i, &s) in slots.iter().enumerate() {
        if s >= pool.slots {
            return Err(Error::Shape(format!("KV slot {s} outside the pool ({} slots)", pool.slots)));
        }
        for c in 0..d {
            let ki = pool.k_index(s, c);
            pool.k[layer].set(ki, k[i * d + c]);
            pool.v[layer].set(s * d + c, v[i * d + c]);
        }
    }
    Ok(())
}

/// Query rows per unit of work: long prefills split so the threads balance.
const QUERY_BLOCK: usize = 16;

/// Keys per chunk: a row's keys are taken in chunks at these absolute
/// positions, each with a softmax of its own (its max, its sum and its
/// weighted values), merged in chunk order. A long decode row's chunks can
/// then go to different threads and give what one thread computes.
const KEY_CHUNK: usize = 512;

/// The largest head dimension attention takes (a tile's queries sit in a
/// stack array of this many rows).
pub const MAX_HEAD_DIM: usize = 512;

/// (sequence, KV head, query rows) of the flat batch; `split`: only this
/// key chunk of its one row, its partials stored in `PARTS` (see `attention`).
struct Unit {
    seq: usize,
    kv_head: usize,
    rows: Range<usize>,
    split: Option<Split>,
}

struct Split {
    chunk: usize,
    /// Where the row's partials start: per head, one per chunk it sees.
    part: usize,
}

/// What every unit of one attention call reads.
struct Call<'a, E> {
    q: &'a [f32],
    k: &'a [E],
    v: &'a [E],
    kv_dim: usize,
    bs: usize,
    batch: &'a AttnBatch,
    p: &'a AttnParams,
}

type Out = SendPtr<f32>;

pub fn attention(
    q: &[f32],
    n: usize,
    pool: &CpuKvPool,
    layer: usize,
    batch: &AttnBatch,
    p: &AttnParams,
) -> Result<Vec<f32>> {
    let hd = p.head_dim;
    if q.len() != n * p.n_heads * hd
        || p.n_kv_heads == 0
        || p.n_kv_heads * hd != pool.kv_dim
        || !p.n_heads.is_multiple_of(p.n_kv_heads)
        || hd > MAX_HEAD_DIM
    {
        return Err(Error::Shape("attention: q or KV shapes do not match the layer".into()));
    }
    if p.window == Some(0) {
        return Err(Error::InvalidInput("attention: a sliding window of 0 keys sees nothing".into()));
    }
    batch.validate(n, pool.slots / pool.block_size, pool.block_size)?;
    let mut units = UNITS.take();
    units.clear();
    for (si, s) in batch.seqs.iter().enumerate() {
        for kv_head in 0..p.n_kv_heads {
            for start in (s.q_start..s.q_start + s.q_len).step_by(QUERY_BLOCK) {
                let rows = start..(start + QUERY_BLOCK).min(s.q_start + s.q_len);
                units.push(Unit { seq: si, kv_head, rows, split: None });
            }
        }
    }
    // Too few units to keep every thread busy, keys enough to split, and
    // one row a unit (decoding one or a few long sequences; the partials
    // then take a few MB at most): a unit a key chunk instead, merged after.
    // The same arithmetic either way.
    let mut parts = 0;
    let span = |u: &Unit| chunk_span(&batch.seqs[u.seq], &u.rows, p.window);
    let few = units.len() < 2 * rayon::current_num_threads();
    if few && units.iter().all(|u| u.rows.len() == 1) && units.iter().any(|u| span(u).len() > 1) {
        let (whole, group) = (units.len(), p.n_heads / p.n_kv_heads);
        for i in 0..whole {
            let chunks = span(&units[i]);
            let (seq, kv_head, rows, part) = (units[i].seq, units[i].kv_head, units[i].rows.clone(), parts);
            parts += rows.len() * group * chunks.len() * part_len(hd);
            for chunk in chunks {
                units.push(Unit { seq, kv_head, rows: rows.clone(), split: Some(Split { chunk, part }) });
            }
        }
        units.drain(..whole);
    }
    let mut out = super::pool::zeroed(q.len());
    let o = SendPtr(out.as_mut_ptr());
    let mut store = PARTS.take();
    store.resize(parts, 0.0);
    let ps = SendPtr(store.as_mut_ptr());
    let (kv_dim, bs) = (pool.kv_dim, pool.block_size);
    match (&pool.k[layer], &pool.v[layer]) {
        (KvStore::F32(k), KvStore::F32(v)) => run_units(&Call { q, k, v, kv_dim, bs, batch, p }, &units, o, ps),
        (KvStore::F16(k), KvStore::F16(v)) => run_units(&Call { q, k, v, kv_dim, bs, batch, p }, &units, o, ps),
        _ => unreachable!("K and V share a precision"),
    }
    if parts > 0 {
        merge_split(&units, batch, p, &store, &mut out);
    }
    PARTS.set(store);
    UNITS.set(units);
    Ok(out)
}

fn run_units<E: Elem>(call: &Call<E>, units: &[Unit], o: Out, parts: Out) {
    for_each_chunk(units.len(), 1, &|range| {
        SCORES.with_borrow_mut(|scores| {
            LOCAL.with_borrow_mut(|local| {
                for u in &units[range] {
                    run_unit(call, u, o, parts, scores, local);
                }
            })
        })
    });
}

/// A (row, head) pair of a tile and what it sees.
#[derive(Clone, Copy, Default)]
struct Pair {
    row: usize,
    head: usize,
    /// Visible key positions: lo..hi.
    lo: usize,
    hi: usize,
}

impl Pair {
    /// The keys of chunk c this pair sees (possibly none).
    fn in_chunk(&self, c: usize) -> Pair {
        let (lo, hi) = (self.lo.max(c * KEY_CHUNK), self.hi.min((c + 1) * KEY_CHUNK));
        Pair { lo, hi: hi.max(lo), ..*self }
    }
    /// The key chunks this pair has keys in.
    fn chunks(&self) -> Range<usize> {
        self.lo / KEY_CHUNK..self.hi.div_ceil(KEY_CHUNK)
    }
}

/// The unit's pairs, rows by heads, in the order their partials are stored.
fn pairs<'a>(
    seq: &'a SeqSlice,
    rows: &Range<usize>,
    heads: Range<usize>,
    window: Option<usize>,
) -> impl Iterator<Item = Pair> + 'a {
    rows.clone().flat_map(move |row| heads.clone().map(move |head| (row, head))).map(move |(row, head)| {
        let pos = seq.ctx_len - seq.q_len + (row - seq.q_start);
        let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        Pair { row, head, lo, hi: pos + 1 }
    })
}

/// The key chunks any of `rows` has keys in.
fn chunk_span(seq: &SeqSlice, rows: &Range<usize>, window: Option<usize>) -> Range<usize> {
    let mut all = pairs(seq, rows, 0..1, window).map(|t| t.chunks());
    let first = all.next().unwrap_or(0..0);
    all.fold(first, |a, b| a.start.min(b.start)..a.end.max(b.end))
}

/// Floats of a stored partial: max, sum, then the head's weighted values.
fn part_len(hd: usize) -> usize {
    hd + 2
}

fn run_unit<E: Elem>(c: &Call<E>, u: &Unit, o: Out, parts: Out, scores: &mut Vec<f32>, local: &mut Vec<f32>) {
    let seq = &c.batch.seqs[u.seq];
    let (hd, group) = (c.p.head_dim, c.p.n_heads / c.p.n_kv_heads);
    let heads = u.kv_head * group..(u.kv_head + 1) * group;
    let mut all = pairs(seq, &u.rows, heads, c.p.window).enumerate();
    loop {
        let mut buf = [(0, Pair::default()); 4];
        let len = buf.iter_mut().zip(all.by_ref()).map(|(b, p)| *b = p).count();
        if len == 0 {
            return;
        }
        let tile = &buf[..len];
        let chunks = match &u.split {
            Some(s) => s.chunk..s.chunk + 1,
            None => {
                let lo = tile.iter().map(|(_, t)| t.lo).min().unwrap_or(0) / KEY_CHUNK;
                lo..tile.iter().map(|(_, t)| t.hi).max().unwrap_or(0).div_ceil(KEY_CHUNK)
            }
        };
        if u.split.is_none() {
            local.resize(chunks.len() * 4 * part_len(hd), 0.0);
        }
        // (One pointer for every slot: an index into `local` would borrow it
        // anew and void the pointers taken before.)
        let lp = local.as_mut_ptr();
        for ch in chunks.clone() {
            // The tile's pairs with keys in this chunk, and where their partials go.
            let mut sub = [Pair::default(); 4];
            let mut dst = [std::ptr::null_mut::<f32>(); 4];
            let mut n = 0;
            for (r, &(i, t)) in tile.iter().enumerate() {
                let seen = t.in_chunk(ch);
                if seen.lo == seen.hi {
                    continue;
                }
                dst[n] = match &u.split {
                    // SAFETY: each (pair, chunk) slot belongs to one unit.
                    Some(s) => unsafe { parts.get().add(s.part + split_slot(i, &t, ch) * part_len(hd)) },
                    // SAFETY: within `local`, sized for the tile's chunks above.
                    None => unsafe { lp.add(((ch - chunks.start) * 4 + r) * part_len(hd)) },
                };
                sub[n] = seen;
                n += 1;
            }
            chunk_partials(c, seq, u.kv_head, &sub[..n], &dst[..n], scores);
        }
        if u.split.is_none() {
            for (r, (_, t)) in tile.iter().enumerate() {
                let at = |ch: usize| &local[((ch - chunks.start) * 4 + r) * part_len(hd)..][..part_len(hd)];
                // SAFETY: this (row, head) slice belongs to this unit alone.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(o.get().add((t.row * c.p.n_heads + t.head) * hd), hd) };
                merge(t.chunks().map(at), dst);
            }
        }
    }
}

/// Chunk partials of up to four pairs that share a KV head.
fn chunk_partials<E: Elem>(
    c: &Call<E>,
    seq: &SeqSlice,
    kv_head: usize,
    tile: &[Pair],
    dst: &[*mut f32],
    scores: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && has_f16c() && c.bs.is_multiple_of(8) && c.p.head_dim.is_multiple_of(8) {
        let wide = has_avx512() && c.bs.is_multiple_of(16) && c.p.head_dim.is_multiple_of(16);
        // SAFETY: AVX2, FMA and F16C (and AVX-512F where `wide`) are present
        // (checked at run time); shapes and block tables were validated by
        // `attention`; each destination holds a partial.
        unsafe {
            match (tile.len(), wide) {
                (4, true) => tile_avx512::<E, 4>(c, seq, kv_head, tile, dst, scores),
                (3, true) => tile_avx512::<E, 3>(c, seq, kv_head, tile, dst, scores),
                (2, true) => tile_avx512::<E, 2>(c, seq, kv_head, tile, dst, scores),
                (1, true) => tile_avx512::<E, 1>(c, seq, kv_head, tile, dst, scores),
                (4, false) => tile_avx2::<E, 4>(c, seq, kv_head, tile, dst, scores),
                (3, false) => tile_avx2::<E, 3>(c, seq, kv_head, tile, dst, scores),
                (2, false) => tile_avx2::<E, 2>(c, seq, kv_head, tile, dst, scores),
                (1, false) => tile_avx2::<E, 1>(c, seq, kv_head, tile, dst, scores),
                _ => {}
            }
        }
        return;
    }
    for (t, &d) in tile.iter().zip(dst) {
        // SAFETY: as above.
        let d = unsafe { std::slice::from_raw_parts_mut(d, part_len(c.p.head_dim)) };
        pair_generic(c, seq, kv_head, t, d, scores);
    }
}

/// A pair's output from its chunks' partials, in chunk order: one chunk's
/// weighted values over its sum; more, each weighted by e^(its max - the
/// largest).
fn merge<'a>(mut parts: impl Iterator<Item = &'a [f32]> + Clone, dst: &mut [f32]) {
    let single = parts.clone().nth(1).is_none();
    if single {
        let p = parts.next().expect("a pair sees a key");
        let inv = 1.0 / p[1];
        dst.iter_mut().zip(&p[2..]).for_each(|(d, &x)| *d = x * inv);
        return;
    }
    let max = parts.clone().fold(f32::NEG_INFINITY, |m, p| m.max(p[0]));
    dst.fill(0.0);
    let mut sum = 0.0;
    for p in parts {
        let w = exp(p[0] - max);
        sum += p[1] * w;
        dst.iter_mut().zip(&p[2..]).for_each(|(d, &x)| *d += x * w);
    }
    let inv = 1.0 / sum;
    dst.iter_mut().for_each(|d| *d *= inv);
}

/// Where a split row's head `i` (pair `t`) keeps its partial of chunk
/// `ch`, in partials from the row's `part`.
fn split_slot(i: usize, t: &Pair, ch: usize) -> usize {
    let chunks = t.chunks();
    i * chunks.len() + ch - chunks.start
}

/// The outputs of split units' pairs from their stored partials.
fn merge_split(units: &[Unit], batch: &AttnBatch, p: &AttnParams, store: &[f32], out: &mut [f32]) {
    let (hd, group) = (p.head_dim, p.n_heads / p.n_kv_heads);
    for u in units {
        let Some(s) = &u.split else { continue };
        let heads = u.kv_head * group..(u.kv_head + 1) * group;
        for (i, t) in pairs(&batch.seqs[u.seq], &u.rows, heads, p.window).enumerate() {
            // Each row once: at the unit of its first chunk.
            if s.chunk != t.chunks().start {
                break;
            }
            let at = |ch: usize| &store[s.part + split_slot(i, &t, ch) * part_len(hd)..][..part_len(hd)];
            merge(t.chunks().map(at), &mut out[(t.row * p.n_heads + t.head) * hd..][..hd]);
        }
    }
}

/// Turns raw scores[lo..hi] (relative to `base`) into e^(score - max) for
/// the pair's visible keys, zero elsewhere in `row`; returns the max and
/// the sum.
#[inline(always)]
fn softmax(row: &mut [f32], base: usize, pair: &Pair, softcap: Option<f32>) -> (f32, f32) {
    let (a, b) = (pair.lo - base, pair.hi - base);
    row[..a].fill(0.0);
    row[b..].fill(0.0);
    let vis = &mut row[a..b];
    if let Some(cap) = softcap {
        vis.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
    }
    let max = lanes8(vis, f32::NEG_INFINITY, f32::max);
    vis.iter_mut().for_each(|x| *x = exp(*x - max));
    (max, lanes8(vis, 0.0, |a, b| a + b))
}

/// `f` over `xs` in eight interleaved lanes (element i in lane i % 8), the
/// lanes then combined pairwise: one vector operation per eight elements
/// where a plain fold is a chain of dependent scalar ones. The order depends
/// on the slice alone, so a (row, head) pair's softmax stays the same in any
/// tile or batch.
#[inline(always)]
fn lanes8(xs: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in chunks.by_ref() {
        for j in 0..8 {
            acc[j] = f(acc[j], c[j]);
        }
    }
    for (j, &x) in chunks.remainder().iter().enumerate() {
        acc[j] = f(acc[j], x);
    }
    let quad = [f(acc[0], acc[4]), f(acc[1], acc[5]), f(acc[2], acc[6]), f(acc[3], acc[7])];
    f(f(quad[0], quad[2]), f(quad[1], quad[3]))
}

/// A vector width for the attention tile: AVX2's eight lanes or AVX-512's
/// sixteen. Each lane computes what it would in the other (a score sums its
/// dimensions in order, an output its keys), so the two give the same bits.
#[cfg(target_arch = "x86_64")]
trait Lanes {
    type V: Copy;
    const N: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    /// a * b + c.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn load<E: Elem>(p: *const E) -> Self::V;
}

#[cfg(target_arch = "x86_64")]
struct Avx2;
#[cfg(target_arch = "x86_64")]
struct Avx512;

/// `Lanes` for one vector type: its intrinsics and the `Elem` load of its width.
#[cfg(target_arch = "x86_64")]
macro_rules! lanes {
    ($name:ident, $v:ident, $n:expr, $zero:ident, $set1:ident, $fma:ident, $store:ident, $load:ident) => {
        impl Lanes for $name {
            type V = std::arch::x86_64::$v;
            const N: usize = $n;
            #[inline(always)]
            unsafe fn zero() -> Self::V {
                std::arch::x86_64::$zero()
            }
            #[inline(always)]
            unsafe fn splat(x: f32) -> Self::V {
                std::arch::x86_64::$set1(x)
            }
            #[inline(always)]
            unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
                std::arch::x86_64::$fma(a, b, c)
            }
            #[inline(always)]
            unsafe fn store(p: *mut f32, v: Self::V) {
                std::arch::x86_64::$store(p, v)
            }
            #[inline(always)]
            unsafe fn load<E: Elem>(p: *const E) -> Self::V {
                E::$load(p)
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
lanes!(Avx2, __m256, 8, _mm256_setzero_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps, load8);
#[cfg(target_arch = "x86_64")]
lanes!(Avx512, __m512, 16, _mm512_setzero_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps, load16);

/// `tile_lanes` on eight lanes, its instructions enabled (the two wrappers
/// differ in their target features alone, which cannot be generic).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<E: Elem, const R: usize>(
    c: &Call<E>,
    seq: &SeqSlice,
    kv_head: usize,
    tile: &[Pair],
    dst: &[*mut f32],
    scores: &mut Vec<f32>,
) {
    tile_lanes::<Avx2, E, R>(c, seq, kv_head, tile, dst, scores)
}

/// `tile_lanes` on sixteen lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn tile_avx512<E: Elem, const R: usize>(
    c: &Call<E>,
    seq: &SeqSlice,
    kv_head: usize,
    tile: &[Pair],
    dst: &[*mut f32],
    scores: &mut Vec<f32>,
) {
    tile_lanes::<Avx512, E, R>(c, seq, kv_head, tile, dst, scores)
}

/// Tile of R pairs, N = L::N lanes: scores of N keys per vector from the
/// transposed key blocks, then values N dimensions at a time. Inlined into
/// the functions above, which enable the instructions.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_lanes<L: Lanes, E: Elem, const R: usize>(
    c: &Call<E>,
    seq: &SeqSlice,
    kv_head: usize,
    tile: &[Pair],
    dst: &[*mut f32],
    scores: &mut Vec<f32>,
) {
    let (p, hd, bs, kvd, n) = (c.p, c.p.head_dim, c.bs, c.kv_dim, L::N);
    let qd = p.n_heads * hd;
    // Keys any pair sees, widened to whole vectors (never across a block: bs % N == 0).
    let (ulo, uhi) = (tile.iter().map(|t| t.lo).min().unwrap(), tile.iter().map(|t| t.hi).max().unwrap());
    let (vlo, vhi) = (ulo / n * n, uhi.next_multiple_of(n));
    let len = vhi - vlo;
    scores.resize(R * len, 0.0);
    let mut qs = [[0f32; R]; MAX_HEAD_DIM];
    for (r, t) in tile.iter().enumerate() {
        for (d, &x) in c.q[t.row * qd + t.head * hd..][..hd].iter().enumerate() {
            qs[d][r] = x * p.scale;
        }
    }
    let kp = c.k.as_ptr();
    // The N keys from t0 (one cache block: bs % N == 0), transposed.
    let keys = |t0: usize| {
        let block = *seq.block_table.get_unchecked(t0 / bs) as usize;
        kp.add((block * kvd + kv_head * hd) * bs + t0 % bs)
    };
    // 2N keys at a time where there are: each broadcast q value feeds two
    // vectors of keys. Every score still sums its dimensions in order.
    let mut t0 = vlo;
    while t0 < vhi {
        let w = if t0 + 2 * n <= vhi { 2 } else { 1 };
        let base = [keys(t0), if w == 2 { keys(t0 + n) } else { keys(t0) }];
        let mut acc = [[L::zero(); 2]; R];
        for (d, qd) in qs[..hd].iter().enumerate() {
            let kv = [L::load(base[0].add(d * bs)), L::load(base[1].add(d * bs))];
            for r in 0..R {
                let q = L::splat(qd[r]);
                acc[r][0] = L::fma(q, kv[0], acc[r][0]);
                acc[r][1] = L::fma(q, kv[1], acc[r][1]);
            }
        }
        for r in 0..R {
            for h in 0..w {
                L::store(scores.as_mut_ptr().add(r * len + t0 + n * h - vlo), acc[r][h]);
            }
        }
        t0 += n * w;
    }
    for r in 0..R {
        let (max, sum) = softmax(&mut scores[r * len..(r + 1) * len], vlo, &tile[r], p.softcap);
        *dst[r] = max;
        *dst[r].add(1) = sum;
    }
    let vp = c.v.as_ptr();
    // 2N dimensions at a time where there are: each broadcast weight feeds
    // two vectors of values. Every output still sums its keys in order.
    let mut d0 = 0;
    while d0 < hd {
        let w = if d0 + 2 * n <= hd { 2 } else { 1 };
        let mut acc = [[L::zero(); 2]; R];
        // A cache block at a time: its slot looked up once, then a row of
        // values a key (a division and a table load per key cost more than
        // the key's multiplies).
        let mut t = ulo;
        while t < uhi {
            let end = ((t / bs + 1) * bs).min(uhi);
            let slot = *seq.block_table.get_unchecked(t / bs) as usize * bs + t % bs;
            let mut at = vp.add(slot * kvd + kv_head * hd + d0);
            for t in t..end {
                let vv = [L::load(at), L::load(at.add(n * (w - 1)))];
                for r in 0..R {
                    let s = L::splat(*scores.get_unchecked(r * len + t - vlo));
                    acc[r][0] = L::fma(s, vv[0], acc[r][0]);
                    acc[r][1] = L::fma(s, vv[1], acc[r][1]);
                }
                at = at.add(kvd);
            }
            t = end;
        }
        for r in 0..R {
            for h in 0..w {
                L::store(dst[r].add(2 + d0 + n * h), acc[r][h]);
            }
        }
        d0 += n * w;
    }
}

/// One pair's chunk partial, portable code (any block size and head size).
fn pair_generic<E: Elem>(
    c: &Call<E>,
    seq: &SeqSlice,
    kv_head: usize,
    t: &Pair,
    dst: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let (p, hd, bs, kvd) = (c.p, c.p.head_dim, c.bs, c.kv_dim);
    let qd = p.n_heads * hd;
    let q = &c.q[t.row * qd + t.head * hd..][..hd];
    let slot = |pos: usize| seq.block_table[pos / bs] as usize * bs + pos % bs;
    scores.clear();
    for pos in t.lo..t.hi {
        let s = slot(pos);
        let kbase = ((s / bs) * kvd + kv_head * hd) * bs + s % bs;
        let mut acc = 0f32;
        for (d, &x) in q.iter().enumerate() {
            acc = (x * p.scale).mul_add(c.k[kbase + d * bs].f32(), acc);
        }
        scores.push(acc);
    }
    (dst[0], dst[1]) = softmax(scores, t.lo, t, p.softcap);
    let acc = &mut dst[2..2 + hd];
    acc.fill(0.0);
    for (pos, &w) in (t.lo..t.hi).zip(scores.iter()) {
        let s = slot(pos);
        for (a, &x) in acc.iter_mut().zip(&c.v[s * kvd + kv_head * hd..][..hd]) {
            *a = w.mul_add(x.f32(), *a);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The sixteen-lane tile gives the eight-lane tile's bits: the same
    /// partials for pairs with different key ranges, f16 and f32 caches.
    #[test]
    fn avx512_tile_gives_the_avx2_bits() {
        if !(has_avx2() && has_f16c() && has_avx512()) {
            eprintln!("no AVX-512 here: the sixteen-lane tile is not run");
            return;
        }
        let (bs, hd, n_kv) = (16usize, 32usize, 2usize);
        let p =
            AttnParams { n_heads: 4, n_kv_heads: n_kv, head_dim: hd, scale: 0.2, window: None, softcap: Some(30.0) };
        let (kvd, len) = (n_kv * hd, 90usize);
        let blocks = len.div_ceil(bs);
        let mut x = 1u32;
        let mut rand = move || {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0
        };
        let q: Vec<f32> = (0..4 * hd).map(|_| rand()).collect();
        let kf: Vec<f32> = (0..blocks * bs * kvd).map(|_| rand()).collect();
        let vf: Vec<f32> = (0..blocks * bs * kvd).map(|_| rand()).collect();
        let seq = SeqSlice { q_start: 0, q_len: 1, ctx_len: len, block_table: (0..blocks as u32).rev().collect() };
        let batch = AttnBatch { seqs: vec![seq.clone()], block_size: bs, slots: vec![] };
        let tile = [
            Pair { row: 0, head: 0, lo: 0, hi: 90 },
            Pair { row: 0, head: 1, lo: 5, hi: 61 },
            Pair { row: 0, head: 0, lo: 33, hi: 34 },
        ];
        fn run<E: Elem>(c: &Call<E>, seq: &SeqSlice, tile: &[Pair], wide: bool) -> Vec<u32> {
            let mut out = vec![0f32; 3 * (c.p.head_dim + 2)];
            let base = out.as_mut_ptr();
            // SAFETY: three partials of head_dim + 2 floats fit in `out`.
            let dst: Vec<*mut f32> = (0..3).map(|r| unsafe { base.add(r * (c.p.head_dim + 2)) }).collect();
            let mut scores = Vec::new();
            // SAFETY: AVX2, FMA, F16C and AVX-512F checked above; shapes as built.
            unsafe {
                match wide {
                    true => tile_avx512::<E, 3>(c, seq, 1, tile, &dst, &mut scores),
                    false => tile_avx2::<E, 3>(c, seq, 1, tile, &dst, &mut scores),
                }
            }
            out.iter().map(|x| x.to_bits()).collect()
        }
        let f16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
        let (kh, vh) = (f16(&kf), f16(&vf));
        let c32 = Call { q: &q, k: &kf, v: &vf, kv_dim: kvd, bs, batch: &batch, p: &p };
        let c16 = Call { q: &q, k: &kh, v: &vh, kv_dim: kvd, bs, batch: &batch, p: &p };
        assert_eq!(run(&c32, &seq, &tile, true), run(&c32, &seq, &tile, false), "f32 cache");
        assert_eq!(run(&c16, &seq, &tile, true), run(&c16, &seq, &tile, false), "f16 cache");
    }
}
