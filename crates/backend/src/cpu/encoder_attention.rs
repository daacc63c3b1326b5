//! Bidirectional attention for encoders: every (row, head) pair attends to the
//! keys of its own sequence, optionally only those within a band around it.

// Tile rows and their accumulators are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]
use super::fork::for_each_chunk;
use super::math::exp;
#[cfg(target_arch = "x86_64")]
use super::simd::has_avx2;
use crate::AttnParams;
use ferrite_core::{Error, Result};
use std::ops::Range;

/// Query rows per task: long sequences split so the threads stay balanced.
const QUERY_BLOCK: usize = 64;

/// One (sequence, head, block of query rows) unit of work.
#[derive(Clone)]
struct Unit {
    seq: Range<usize>,
    head: usize,
    queries: Range<usize>,
}

struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    p: &'a AttnParams,
}

/// Output pointer shared by the units; each writes its own (row, head) slices.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: units write disjoint (row, head) slices of a buffer that outlives the loop.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}
impl Out {
    #[inline(always)]
    fn get(self) -> *mut f32 {
        self.0
    }
}

pub fn encoder_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    seqs: &[Range<usize>],
    p: &AttnParams,
) -> Result<Vec<f32>> {
    let (hd, kvd) = (p.head_dim, p.n_kv_heads * p.head_dim);
    if q.len() != n * p.n_heads * hd
        || k.len() != n * kvd
        || v.len() != k.len()
        || p.n_kv_heads == 0
        || !p.n_heads.is_multiple_of(p.n_kv_heads)
        || hd > 256
    {
        return Err(Error::Shape("encoder attention: q, k or v shapes do not match (head size at most 256)".into()));
    }
    let mut covered = vec![false; n];
    let mut units = Vec::new();
    for s in seqs {
        if s.end > n || s.is_empty() || covered[s.clone()].iter().any(|&c| c) {
            return Err(Error::Shape(format!("encoder attention: sequence rows {s:?} of {n}")));
        }
        covered[s.clone()].iter_mut().for_each(|c| *c = true);
        for head in 0..p.n_heads {
            for start in s.clone().step_by(QUERY_BLOCK) {
                units.push(Unit { seq: s.clone(), head, queries: start..(start + QUERY_BLOCK).min(s.end) });
            }
        }
    }
    if covered.iter().any(|&c| !c) {
        return Err(Error::Shape("encoder attention: rows without a sequence".into()));
    }
    let inputs = Inputs { q, k, v, p };
    let mut out = vec![0f32; q.len()];
    let o = Out(out.as_mut_ptr());
    for_each_chunk(units.len(), 1, &|range| {
        let mut scratch = Scratch::default();
        for u in &units[range] {
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
                unsafe { unit_avx2(&inputs, u, o, &mut scratch) };
                continue;
            }
            unit(&inputs, u, o, &mut scratch);
        }
    });
    Ok(out)
}

#[derive(Default)]
struct Scratch {
    /// The head's keys of the visible span, transposed: [head_dim, span].
    kt: Vec<f32>,
    scores: Vec<f32>,
}

/// The unit with register tiles: 4 query rows at a time, scores for 8 keys
/// per vector (keys transposed, so no horizontal sums), then the weighted
/// values 8 dimensions at a time. Needs head_dim % 8 == 0.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn unit_avx2(x: &Inputs, u: &Unit, o: Out, s: &mut Scratch) {
    use std::arch::x86_64::*;
    let p = x.p;
    let hd = p.head_dim;
    if !hd.is_multiple_of(8) {
        return unit(x, u, o, s);
    }
    let (kvd, qd) = (p.n_kv_heads * hd, p.n_heads * hd);
    let off = (u.head / (p.n_heads / p.n_kv_heads)) * hd;
    let band = |i: usize| match p.window {
        Some(w) => i.saturating_sub(w).max(u.seq.start)..(i + w + 1).min(u.seq.end),
        None => u.seq.clone(),
    };
    let span = band(u.queries.start).start..band(u.queries.end - 1).end;
    // Keys transposed, padded with zeros to whole vectors: kt[d * len + j].
    let len = span.len().next_multiple_of(8);
    s.kt.clear();
    s.kt.resize(hd * len, 0.0);
    for (j, t) in span.clone().enumerate() {
        for (d, &kv) in x.k[t * kvd + off..t * kvd + off + hd].iter().enumerate() {
            s.kt[d * len + j] = kv;
        }
    }
    s.scores.resize(4 * len, 0.0);
    let mut r0 = u.queries.start;
    while r0 < u.queries.end {
        let nr = 4.min(u.queries.end - r0);
        // Key vectors any of the rows sees, relative to the span.
        let lo = (band(r0).start - span.start) / 8 * 8;
        let hi = (band(r0 + nr - 1).end - span.start).next_multiple_of(8);
        let mut qv = [[0f32; 4]; 256];
        for r in 0..nr {
            let q = &x.q[(r0 + r) * qd + u.head * hd..][..hd];
            for d in 0..hd {
                qv[d][r] = q[d] * p.scale;
            }
        }
        let mut j = lo;
        while j < hi {
            let mut acc = [_mm256_setzero_ps(); 4];
            for (d, qd4) in qv[..hd].iter().enumerate() {
                let kv = _mm256_loadu_ps(s.kt.as_ptr().add(d * len + j));
                for r in 0..4 {
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(qd4[r]), kv, acc[r]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(s.scores.as_mut_ptr().add(r * len + j), *a);
            }
            j += 8;
        }
        // Softmax of each row over its own band; zero elsewhere in lo..hi.
        let mut inv = [0f32; 4];
        for r in 0..nr {
            let keys = band(r0 + r);
            let (a, b) = (keys.start - span.start, keys.end - span.start);
            let row = &mut s.scores[r * len..(r + 1) * len];
            row[lo..a].fill(0.0);
            row[b..hi].fill(0.0);
            let max = row[a..b].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            row[a..b].iter_mut().for_each(|v| *v = exp(*v - max));
            inv[r] = 1.0 / row[a..b].iter().sum::<f32>();
        }
        for r in nr..4 {
            s.scores[r * len + lo..r * len + hi].fill(0.0);
        }
        // Weighted values, 8 dimensions at a time.
        for c in (0..hd).step_by(8) {
            let mut acc = [_mm256_setzero_ps(); 4];
            for jj in lo..hi.min(span.len()) {
                let vv = _mm256_loadu_ps(x.v.as_ptr().add((span.start + jj) * kvd + off + c));
                for r in 0..4 {
                    let w = _mm256_set1_ps(*s.scores.get_unchecked(r * len + jj));
                    acc[r] = _mm256_fmadd_ps(w, vv, acc[r]);
                }
            }
            for r in 0..nr {
                let dst = o.get().add((r0 + r) * qd + u.head * hd + c);
                _mm256_storeu_ps(dst, _mm256_mul_ps(acc[r], _mm256_set1_ps(inv[r])));
            }
        }
        r0 += nr;
    }
}

/// softmax(q k^T * scale) v for every query row of the unit. Keys are
/// transposed once per unit so that scores accumulate across keys in vector
/// lanes (no horizontal sums), and values are added row by row.
#[inline(always)]
fn unit(x: &Inputs, u: &Unit, o: Out, s: &mut Scratch) {
    let p = x.p;
    let hd = p.head_dim;
    let kvd = p.n_kv_heads * hd;
    let qd = p.n_heads * hd;
    let off = (u.head / (p.n_heads / p.n_kv_heads)) * hd;
    // Keys any query of the unit can see.
    let band = |i: usize| match p.window {
        Some(w) => i.saturating_sub(w).max(u.seq.start)..(i + w + 1).min(u.seq.end),
        None => u.seq.clone(),
    };
    let span = band(u.queries.start).start..band(u.queries.end - 1).end;
    let len = span.len();
    s.kt.resize(hd * len, 0.0);
    for (j, t) in span.clone().enumerate() {
        for (d, &kv) in x.k[t * kvd + off..t * kvd + off + hd].iter().enumerate() {
            s.kt[d * len + j] = kv;
        }
    }
    for i in u.queries.clone() {
        let keys = band(i);
        let (lo, hi) = (keys.start - span.start, keys.end - span.start);
        let sc = &mut s.scores;
        sc.clear();
        sc.resize(hi - lo, 0.0);
        for (d, &qv) in x.q[i * qd + u.head * hd..i * qd + (u.head + 1) * hd].iter().enumerate() {
            let qv = qv * p.scale;
            for (a, &kv) in sc.iter_mut().zip(&s.kt[d * len + lo..d * len + hi]) {
                *a += qv * kv;
            }
        }
        let max = sc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        sc.iter_mut().for_each(|v| *v = exp(*v - max));
        let inv = 1.0 / sc.iter().sum::<f32>();
        let mut acc = [0f32; 256];
        let acc = &mut acc[..hd];
        for (w, t) in sc.iter().zip(keys) {
            for (a, &vv) in acc.iter_mut().zip(&x.v[t * kvd + off..t * kvd + off + hd]) {
                *a += w * vv;
            }
        }
        // SAFETY: row i, head u.head belongs to this unit alone.
        let dst = unsafe { std::slice::from_raw_parts_mut(o.get().add(i * qd + u.head * hd), hd) };
        dst.iter_mut().zip(acc.iter()).for_each(|(d, a)| *d = a * inv);
    }
}
