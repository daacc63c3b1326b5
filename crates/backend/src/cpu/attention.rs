//! Paged causal attention on the CPU: every (token, head) pair reads its
//! sequence's keys and values through the block table.

use super::fork::for_each_chunk_mut;
use super::matmul::dot_f32;
#[cfg(target_arch = "x86_64")]
use super::simd::has_avx2;
use crate::{AttnBatch, AttnParams};
use ferrite_core::{Error, Result};

/// K and V of every layer, each `n_blocks * block_size` slots of `kv_dim` floats.
/// With `f16`, values are rounded to f16 precision on write, as llama.cpp's
/// default f16 cache does.
pub struct CpuKvPool {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub kv_dim: usize,
    pub slots: usize,
    pub f16: bool,
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
        let f16 = |x: &f32| if pool.f16 { half::f16::from_f32(*x).to_f32() } else { *x };
        for (dst, src) in pool.k[layer][s * d..(s + 1) * d].iter_mut().zip(&k[i * d..(i + 1) * d]) {
            *dst = f16(src);
        }
        for (dst, src) in pool.v[layer][s * d..(s + 1) * d].iter_mut().zip(&v[i * d..(i + 1) * d]) {
            *dst = f16(src);
        }
    }
    Ok(())
}

/// Where each flat-batch row lives: its sequence and its position.
fn row_positions(batch: &AttnBatch, n: usize) -> Result<Vec<(usize, usize)>> {
    let mut rows = vec![(usize::MAX, 0); n];
    for (si, s) in batch.seqs.iter().enumerate() {
        if s.q_start + s.q_len > n || s.q_len > s.ctx_len || s.ctx_len > s.block_table.len() * batch.block_size {
            return Err(Error::Shape(format!("attention batch entry {si} is inconsistent")));
        }
        for i in 0..s.q_len {
            rows[s.q_start + i] = (si, s.ctx_len - s.q_len + i);
        }
    }
    if rows.iter().any(|r| r.0 == usize::MAX) {
        return Err(Error::Shape("attention batch leaves rows without a sequence".into()));
    }
    Ok(rows)
}

/// What every (row, head) task of one attention call reads.
struct Heads<'a> {
    q: &'a [f32],
    rows: &'a [(usize, usize)],
    batch: &'a AttnBatch,
    p: &'a AttnParams,
    k: &'a [f32],
    v: &'a [f32],
    kv_dim: usize,
}

pub fn attention(
    q: &[f32],
    n: usize,
    pool: &CpuKvPool,
    layer: usize,
    batch: &AttnBatch,
    p: &AttnParams,
) -> Result<Vec<f32>> {
    let hd = p.head_dim;
    if q.len() != n * p.n_heads * hd || p.n_kv_heads * hd != pool.kv_dim || !p.n_heads.is_multiple_of(p.n_kv_heads) {
        return Err(Error::Shape("attention: q or KV shapes do not match the layer".into()));
    }
    let rows = row_positions(batch, n)?;
    let heads = Heads { q, rows: &rows, batch, p, k: &pool.k[layer], v: &pool.v[layer], kv_dim: pool.kv_dim };
    let mut out = vec![0f32; q.len()];
    // Enough chunks to balance (a decode step has only n_heads tasks), few
    // enough that handing them out costs little.
    let tasks = n * p.n_heads;
    let per_chunk = tasks.div_ceil(4 * rayon::current_num_threads()).max(1);
    for_each_chunk_mut(&mut out, hd, per_chunk, &|first, o| {
        let mut scores = Vec::new();
        for (i, oh) in o.chunks_mut(hd).enumerate() {
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
                unsafe { head_avx2(&heads, first + i, oh, &mut scores) };
                continue;
            }
            head(&heads, first + i, oh, &mut scores);
        }
    });
    Ok(out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_avx2(h: &Heads, idx: usize, o: &mut [f32], scores: &mut Vec<f32>) {
    head(h, idx, o, scores)
}

/// Output of task `idx` = (row, head): softmax(q k^T * scale) v over the
/// row's visible positions, read through its sequence's block table.
#[inline(always)]
fn head(h: &Heads, idx: usize, o: &mut [f32], scores: &mut Vec<f32>) {
    let p = h.p;
    let hd = p.head_dim;
    let (row, head) = (idx / p.n_heads, idx % p.n_heads);
    let (si, pos) = h.rows[row];
    let seq = &h.batch.seqs[si];
    let bs = h.batch.block_size;
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let qh = &h.q[idx * hd..(idx + 1) * hd];
    let kv_off = (head / (p.n_heads / p.n_kv_heads)) * hd;
    let at = |t: usize| (seq.block_table[t / bs] as usize * bs + t % bs) * h.kv_dim + kv_off;
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for t in lo..=pos {
        let s = at(t);
        let mut x = dot_f32(qh, &h.k[s..s + hd]) * p.scale;
        if let Some(cap) = p.softcap {
            x = cap * (x / cap).tanh();
        }
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
    for (j, t) in (lo..=pos).enumerate() {
        let s = at(t);
        let w = scores[j] * inv;
        for (oe, &ve) in o.iter_mut().zip(&h.v[s..s + hd]) {
            *oe += w * ve;
        }
    }
}
