//! Bidirectional attention for encoders: every (row, head) pair attends to the
//! keys of its own sequence, optionally only those within a band around it.

// Tile rows and their accumulators are parallel const-size arrays.
#![allow(clippy::needless_range_loop)]
use super::fork::{for_each_chunk, SendPtr};
use super::math::exp;
#[cfg(target_arch = "x86_64")]
use super::simd::has_avx2;
use crate::AttnParams;
use ferrite_core::Result;
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

type Out = SendPtr<f32>;

pub fn encoder_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    seqs: &[Range<usize>],
    p: &AttnParams,
) -> Result<Vec<f32>> {
    crate::check_encoder_attention(p, n, (q.len(), k.len(), v.len()), seqs)?;
    let mut units = Vec::new();
    for s in seqs {
        for head in 0..p.n_heads {
            for start in s.clone().step_by(QUERY_BLOCK) {
                units.push(Unit { seq: s.clone(), head, queries: start..(start + QUERY_BLOCK).min(s.end) });
            }
        }
    }
    let inputs = Inputs { q, k, v, p };
    let mut out = super::pool::zeroed(q.len());
    let o = SendPtr(out.as_mut_ptr());
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
    /// Four scaled query rows: [4][head_dim] (for the x86 kernel).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    qv: Vec<f32>,
}

/// kt[d * len + j] = k[j * stride + d] for j < n keys and d < hd (hd a
/// multiple of 8), in 8x8 blocks transposed in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_keys_avx2(k: &[f32], stride: usize, n: usize, hd: usize, kt: &mut [f32], len: usize) {
    use std::arch::x86_64::*;
    debug_assert!(hd.is_multiple_of(8) && kt.len() >= hd * len && len >= n);
    let full = n / 8 * 8;
    for j0 in (0..full).step_by(8) {
        for d0 in (0..hd).step_by(8) {
            let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(k.as_ptr().add((j0 + i) * stride + d0)));
            // 8x8 transpose: interleave pairs, then quads, then swap 128-bit halves.
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (i, v) in out.iter().enumerate() {
                _mm256_storeu_ps(kt.as_mut_ptr().add((d0 + i) * len + j0), *v);
            }
        }
    }
    for j in full..n {
        for d in 0..hd {
            kt[d * len + j] = k[j * stride + d];
        }
    }
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
    transpose_keys_avx2(&x.k[span.start * kvd + off..], kvd, span.len(), hd, &mut s.kt, len);
    s.scores.resize(4 * len, 0.0);
    s.qv.resize(4 * hd, 0.0);
    let mut r0 = u.queries.start;
    while r0 < u.queries.end {
        let nr = 4.min(u.queries.end - r0);
        // Key vectors any of the rows sees, relative to the span.
        let lo = (band(r0).start - span.start) / 8 * 8;
        let hi = (band(r0 + nr - 1).end - span.start).next_multiple_of(8);
        // Scaled queries, row-major [4][hd]; missing rows are zero.
        for r in 0..4 {
            let dst = &mut s.qv[r * hd..(r + 1) * hd];
            if r < nr {
                let q = &x.q[(r0 + r) * qd + u.head * hd..][..hd];
                dst.iter_mut().zip(q).for_each(|(a, &b)| *a = b * p.scale);
            } else {
                dst.fill(0.0);
            }
        }
        let qp = s.qv.as_ptr();
        let kp = s.kt.as_ptr();
        let sp = s.scores.as_mut_ptr();
        // Two key vectors per pass where they fit: eight accumulators, so the
        // FMAs rather than the loads set the pace.
        let mut j = lo;
        while j + 16 <= hi {
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for d in 0..hd {
                let k0 = _mm256_loadu_ps(kp.add(d * len + j));
                let k1 = _mm256_loadu_ps(kp.add(d * len + j + 8));
                for r in 0..4 {
                    let q = _mm256_broadcast_ss(&*qp.add(r * hd + d));
                    acc[r][0] = _mm256_fmadd_ps(q, k0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(q, k1, acc[r][1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(sp.add(r * len + j), a[0]);
                _mm256_storeu_ps(sp.add(r * len + j + 8), a[1]);
            }
            j += 16;
        }
        if j < hi {
            let mut acc = [_mm256_setzero_ps(); 4];
            for d in 0..hd {
                let kv = _mm256_loadu_ps(kp.add(d * len + j));
                for r in 0..4 {
                    acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&*qp.add(r * hd + d)), kv, acc[r]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(sp.add(r * len + j), *a);
            }
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
        // Weighted values, 16 dimensions at a time (8 for an odd last one).
        let keys = lo..hi.min(span.len());
        let mut c = 0;
        while c < hd {
            let two = c + 16 <= hd;
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for jj in keys.clone() {
                let vp = x.v.as_ptr().add((span.start + jj) * kvd + off + c);
                let v0 = _mm256_loadu_ps(vp);
                let v1 = if two { _mm256_loadu_ps(vp.add(8)) } else { _mm256_setzero_ps() };
                for r in 0..4 {
                    let w = _mm256_set1_ps(*s.scores.get_unchecked(r * len + jj));
                    acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
                }
            }
            for r in 0..nr {
                let dst = o.get().add((r0 + r) * qd + u.head * hd + c);
                let scale = _mm256_set1_ps(inv[r]);
                _mm256_storeu_ps(dst, _mm256_mul_ps(acc[r][0], scale));
                if two {
                    _mm256_storeu_ps(dst.add(8), _mm256_mul_ps(acc[r][1], scale));
                }
            }
            c += if two { 16 } else { 8 };
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
