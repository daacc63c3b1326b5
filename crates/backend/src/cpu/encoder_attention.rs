//! Bidirectional attention for encoders: every (row, head) pair attends to the
//! keys of its own sequence, optionally only those within a band around it.

use super::fork::for_each_chunk_mut;
use super::matmul::dot_f32;
#[cfg(target_arch = "x86_64")]
use super::simd::has_avx2;
use crate::AttnParams;
use ferrite_core::{Error, Result};
use std::ops::Range;

struct Task<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// Sequence rows of every flat-batch row.
    seq_of: &'a [Range<usize>],
    p: &'a AttnParams,
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
    {
        return Err(Error::Shape("encoder attention: q, k or v shapes do not match".into()));
    }
    let mut seq_of = vec![0..0; n];
    for s in seqs {
        if s.end > n || s.is_empty() {
            return Err(Error::Shape(format!("encoder attention: sequence rows {s:?} of {n}")));
        }
        seq_of[s.clone()].iter_mut().for_each(|r| *r = s.clone());
    }
    if seq_of.iter().any(|r| r.is_empty()) {
        return Err(Error::Shape("encoder attention: rows without a sequence".into()));
    }
    let task = Task { q, k, v, seq_of: &seq_of, p };
    let mut out = vec![0f32; q.len()];
    let per_chunk = (n * p.n_heads).div_ceil(4 * rayon::current_num_threads()).max(1);
    for_each_chunk_mut(&mut out, hd, per_chunk, &|first, o| {
        let mut scores = Vec::new();
        for (i, oh) in o.chunks_mut(hd).enumerate() {
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
                unsafe { head_avx2(&task, first + i, oh, &mut scores) };
                continue;
            }
            head(&task, first + i, oh, &mut scores);
        }
    });
    Ok(out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_avx2(t: &Task, idx: usize, o: &mut [f32], scores: &mut Vec<f32>) {
    head(t, idx, o, scores)
}

/// softmax(q k^T * scale) v for task `idx` = (row, head).
#[inline(always)]
fn head(t: &Task, idx: usize, o: &mut [f32], scores: &mut Vec<f32>) {
    let p = t.p;
    let hd = p.head_dim;
    let kvd = p.n_kv_heads * hd;
    let (row, head) = (idx / p.n_heads, idx % p.n_heads);
    let seq = &t.seq_of[row];
    let keys = match p.window {
        Some(w) => row.saturating_sub(w).max(seq.start)..(row + w + 1).min(seq.end),
        None => seq.clone(),
    };
    let qh = &t.q[idx * hd..(idx + 1) * hd];
    let off = (head / (p.n_heads / p.n_kv_heads)) * hd;
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for j in keys.clone() {
        let x = dot_f32(qh, &t.k[j * kvd + off..j * kvd + off + hd]) * p.scale;
        max = max.max(x);
        scores.push(x);
    }
    let mut sum = 0f32;
    for x in scores.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    o.fill(0.0);
    for (s, j) in scores.iter().zip(keys) {
        let w = s * inv;
        for (oe, &ve) in o.iter_mut().zip(&t.v[j * kvd + off..j * kvd + off + hd]) {
            *oe += w * ve;
        }
    }
}
