//! The op harness's attention checks: paged attention over mixed prefill and
//! decode batches, a layer's attention inputs in one op, and encoder
//! attention.

use super::{dequantized_or_same, raw, Harness, TOL_BF16, TOL_F16, TOL_F32, TOL_X8_TAILED};
use crate::{AttnBatch, AttnParams, Backend, KvDtype, KvSpec, Rope, SeqSlice};
use ferrite_core::{DType, Result};

impl<B: Backend> Harness<'_, B> {
    pub(super) fn attention(&mut self) -> Result<()> {
        // `long`: few decode rows over long contexts (the first one's keys, 0: not long); `prefill_only`: no decode rows.
        for (dtype, window, softcap, hd, heads, kv_heads, long, prefill_only) in [
            (KvDtype::F16, None, None, 64, 8, 2, 0usize, false),
            (KvDtype::F32, Some(5), Some(20.0), 128, 4, 4, 0, false),
            (KvDtype::F16, Some(300), None, 256, 4, 1, 0, false),
            (KvDtype::F16, Some(20), Some(30.0), 128, 8, 2, 0, false),
            (KvDtype::F16, None, None, 128, 8, 2, 0, true),
            (KvDtype::F16, Some(30), None, 64, 4, 1, 0, true),
            // Split-K on GPUs.
            (KvDtype::F16, None, None, 128, 8, 2, 900, false),
            (KvDtype::F32, Some(700), None, 64, 4, 1, 900, false),
            // Query heads per KV head: 8, 7 and 1 (every column of the GPU's
            // tensor-core row kernel, a ragged one, and plain multi-head).
            (KvDtype::F16, None, None, 128, 8, 1, 900, false),
            (KvDtype::F16, None, None, 64, 4, 2, 900, false),
            // 17 splits of 8 heads: the merge's (head, split) pairs outnumber its threads.
            (KvDtype::F16, None, None, 128, 8, 1, 4400, false),
            (KvDtype::F16, Some(9), None, 64, 7, 1, 0, false),
            (KvDtype::F16, None, Some(50.0), 64, 3, 3, 0, false),
        ] {
            let bs = 16;
            let n_blocks = 120 + long.saturating_sub(900).div_ceil(bs);
            let spec = KvSpec { n_layers: 2, n_blocks, block_size: bs, kv_dim: kv_heads * hd, dtype };
            let p = AttnParams { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125, window, softcap };
            let mut pb = self.b.kv_pool(spec)?;
            let mut pc = self.cpu.kv_pool(spec)?;
            // (tokens already cached, new tokens, block table)
            // Long prompts take the tensor-core path on GPUs, short ones the row kernel.
            let seqs: Vec<(usize, usize, Vec<u32>)> = if long > 0 {
                // Over 8 rows: a GPU's split merge writes a 16-bit copy for a GEMM.
                let first = (long + 1).div_ceil(bs) as u32;
                let short = (0..7).map(|i| (40, 1, (first + 38 + 3 * i..first + 41 + 3 * i).collect()));
                [(long, 1, (0..first).rev().collect()), (600, 2, (first..first + 38).collect())]
                    .into_iter()
                    .chain(short)
                    .collect()
            } else if prefill_only {
                // Prompts alone: on GPUs the flash kernel alone, which may then
                // write only the 16-bit copy the output projection reads.
                vec![(0, 100, vec![5, 9, 1, 12, 13, 14, 15]), (20, 37, vec![39, 0, 3, 30])]
            } else {
                vec![
                    (0, 100, vec![5, 9, 1, 12, 13, 14, 15]),
                    (40, 1, vec![30, 2, 7, 11]),
                    (20, 13, vec![39, 0, 3]),
                    (30, 20, vec![16, 17, 18, 19]),
                ]
            };
            let mut batch_seqs = Vec::new();
            let mut slots = Vec::new();
            let mut start = 0;
            for (past, new, table) in &seqs {
                for t in *past..past + new {
                    slots.push(table[t / bs] as usize * bs + t % bs);
                }
                batch_seqs.push(SeqSlice {
                    q_start: start,
                    q_len: *new,
                    ctx_len: past + new,
                    block_table: table.clone(),
                });
                start += new;
            }
            // Earlier context: written by a first step of the same layer.
            let mut past_slots = Vec::new();
            let mut past_seqs = Vec::new();
            let mut pstart = 0;
            for (past, _, table) in &seqs {
                for t in 0..*past {
                    past_slots.push(table[t / bs] as usize * bs + t % bs);
                }
                past_seqs.push(SeqSlice { q_start: pstart, q_len: *past, ctx_len: *past, block_table: table.clone() });
                pstart += past;
            }
            let kvd = kv_heads * hd;
            let past_batch = AttnBatch { seqs: past_seqs, block_size: bs, slots: past_slots };
            let (pk, pv) = (self.rng.vec(pstart * kvd, 1.0), self.rng.vec(pstart * kvd, 1.0));
            let (kb, kc) = self.up(&pk, pstart, kvd)?;
            let (vb, vc) = self.up(&pv, pstart, kvd)?;
            self.b.write_kv(&mut pb, 1, &kb, &vb, &past_batch)?;
            self.cpu.write_kv(&mut pc, 1, &kc, &vc, &past_batch)?;
            let batch = AttnBatch { seqs: batch_seqs, block_size: bs, slots };
            let n = start;
            let (k, v, q) = (self.rng.vec(n * kvd, 1.0), self.rng.vec(n * kvd, 1.0), self.rng.vec(n * heads * hd, 2.0));
            let (mut kb, mut kc) = self.up(&k, n, kvd)?;
            let (vb, vc) = self.up(&v, n, kvd)?;
            let (mut qb, mut qc) = self.up(&q, n, heads * hd)?;
            // The new rows turned and stored in one op (a decoder layer's),
            // interleaved pairs in every other case.
            let rope = Rope {
                head_dim: hd,
                inv_freq: (0..hd / 2).map(|i| 10000f32.powf(-((2 * i) as f32) / hd as f32)).collect(),
                interleaved: softcap.is_some(),
            };
            let positions: Vec<u32> =
                batch.seqs.iter().flat_map(|s| (s.ctx_len - s.q_len..s.ctx_len).map(|t| t as u32)).collect();
            self.b.rope_write_kv(&mut qb, &mut kb, &vb, &rope, &positions, (&mut pb, 1), &batch)?;
            self.cpu.rope_write_kv(&mut qc, &mut kc, &vc, &rope, &positions, (&mut pc, 1), &batch)?;
            let tag = format!("rope_write_kv {dtype:?} hd={hd} interleaved={}", rope.interleaved);
            self.record(format!("{tag}: q"), &qb, &qc, TOL_F32)?;
            self.record(format!("{tag}: k"), &kb, &kc, TOL_F32)?;
            let got = self.b.attention(&qb, &pb, 1, &batch, &p)?;
            let want = self.cpu.attention(&qc, &pc, 1, &batch, &p)?;
            let ctx = if long > 0 {
                format!(", {long}-token context")
            } else if prefill_only {
                ", prompts only".into()
            } else {
                String::new()
            };
            let name = format!(
                "paged attention {dtype:?} hd={hd} {heads}/{kv_heads} window={window:?} softcap={softcap:?}{ctx}"
            );
            // With an f16 cache a backend may also round q and the softmax
            // weights to f16 (tensor cores): the f16 limit applies.
            let tol = if dtype == KvDtype::F16 { TOL_F16 } else { TOL_F32 };
            self.record(name.clone(), &got, &want, tol)?;
            // The o projection added to a residual stream (a GPU hands it
            // attention's 16-bit copy, in prefill alone).
            let cols = heads * hd;
            let w = raw("w", DType::BF16, 40, cols, self.rng.weight(DType::BF16, 40, cols));
            let (wb, wc) = (self.b.weight(w.clone())?, self.cpu.weight(w)?);
            let resid = self.rng.vec(n * 40, 2.0);
            let (mut xb, mut xc) = self.up(&resid, n, 40)?;
            self.b.attention_project_add(&mut xb, &qb, &pb, 1, &batch, &p, &wb)?;
            self.cpu.attention_project_add(&mut xc, &qc, &pc, 1, &batch, &p, &wc)?;
            self.record(format!("{name}, attention_project_add (bf16)"), &xb, &xc, TOL_BF16)?;
            if long > 0 && cols % 256 == 0 {
                // Decode rows of long contexts (GPUs: split-K, merged) into a
                // Q4_K projection (the GEMV reads them quantized to 8 bits).
                let sub =
                    AttnBatch { seqs: batch.seqs[..2].to_vec(), block_size: bs, slots: batch.slots[..3].to_vec() };
                let q3 = self.cpu.to_host(&qc)?[..3 * cols].to_vec();
                let (q3b, q3c) = self.up(&q3, 3, cols)?;
                let w = raw("w", DType::Q4K, 40, cols, self.rng.weight(DType::Q4K, 40, cols));
                let (wb, wc) = (self.b.weight(w.clone())?, self.cpu.weight(dequantized_or_same(&w)?)?);
                let resid = self.rng.vec(3 * 40, 2.0);
                let (mut xb, mut xc) = self.up(&resid, 3, 40)?;
                self.b.attention_project_add(&mut xb, &q3b, &pb, 1, &sub, &p, &wb)?;
                self.cpu.attention_project_add(&mut xc, &q3c, &pc, 1, &sub, &p, &wc)?;
                let op = format!("{name}, 3 rows, attention_project_add, a Q4_K matmul");
                self.record(op, &xb, &xc, TOL_X8_TAILED)?;
            }
            // Encoders: bidirectional over two sequences, banded or not.
            let seqs = if long > 0 { [0..1, 1..n] } else { [0..20, 20..n] };
            let enc_window = window.map(|w| w.min(8));
            let pe = AttnParams { window: enc_window, softcap: None, ..p };
            let got = self.b.encoder_attention(&qb, &kb, &vb, &seqs, &pe)?;
            let want = self.cpu.encoder_attention(&qc, &kc, &vc, &seqs, &pe)?;
            self.record(format!("encoder attention hd={hd} window={enc_window:?}"), &got, &want, TOL_F32)?;
        }
        self.encoder_attention()
    }

    /// Encoder shapes: many short sequences and ones longer than a GPU tile
    /// (64 rows), banded or not, and a head size that is not a multiple of 4.
    /// A decoder layer's attention inputs in one op (`norm_qkv_rope_kv`),
    /// then attention and its projection, for prompts (GPUs: q, k and v in
    /// bf16 alone) and for decode rows.
    pub(super) fn attention_inputs(&mut self) -> Result<()> {
        for (hd, interleaved) in [(64, false), (128, true)] {
            self.attention_inputs_of(hd, interleaved)?;
        }
        let (q4, q6) = (DType::Q4K, DType::Q6K);
        for (hd, qk_type, v_type) in [(128, q4, q4), (128, q4, q6), (64, q4, q6), (128, q6, q6)] {
            self.attention_inputs_decode(hd, qk_type, v_type)?;
        }
        Ok(())
    }

    /// `norm_qkv_rope_kv` on GGUF k-quant blocks (Q4_K_M's: Q4_K q and k, a
    /// Q4_K or Q6_K v; or all Q6_K; Q5_K's: `five_bit_tiles`) with
    /// interleaved RoPE: a 36-token
    /// prompt, then one decode row at position 36 (a GPU turns q and k and writes the cache in the
    /// GEMVs' epilogue unless `FERRITE_CUDA_QKV_ROPE=0`), then attention
    /// over all 37 keys and its projection.
    pub(super) fn attention_inputs_decode(&mut self, hd: usize, qk_type: DType, v_type: DType) -> Result<()> {
        let (c, heads, kv_heads, bs, prompt) = (512, 4, 2, 16, 36);
        let inv_freq = (0..hd / 2).map(|i| 10000f32.powf(-((2 * i) as f32) / hd as f32)).collect();
        let rope = Rope { head_dim: hd, inv_freq, interleaved: true };
        let spec = KvSpec { n_layers: 1, n_blocks: 4, block_size: bs, kv_dim: kv_heads * hd, dtype: KvDtype::F16 };
        let (mut pb, mut pc) = (self.b.kv_pool(spec)?, self.cpu.kv_pool(spec)?);
        let ws = [("q", qk_type, heads * hd), ("k", qk_type, kv_heads * hd), ("v", v_type, kv_heads * hd)]
            .map(|(name, dt, m)| raw(name, dt, m, c, self.rng.weight(dt, m, c)));
        let [qw, kw, vw] = ws.clone().map(|w| self.b.weight(w));
        let [qc_w, kc_w, vc_w] = ws.map(|w| dequantized_or_same(&w).and_then(|w| self.cpu.weight(w)));
        let (wb, wc) = ([&qw?, &kw?, &vw?], [&qc_w?, &kc_w?, &vc_w?]);
        // Blocks out of order: no key's slot is its position.
        let table = vec![2u32, 0, 3, 1];
        let slot = |t: usize| table[t / bs] as usize * bs + t % bs;
        let g = self.rng.vec(c, 1.0);
        let (gb, gc) = self.up(&g, 1, c)?;
        let (mut q_last, mut tag) = (None, String::new());
        // The prompt, then the decode row.
        for (start, len) in [(0, prompt), (prompt, 1)] {
            let seq = SeqSlice { q_start: 0, q_len: len, ctx_len: start + len, block_table: table.clone() };
            let batch = AttnBatch { seqs: vec![seq], block_size: bs, slots: (start..start + len).map(slot).collect() };
            let positions: Vec<u32> = (start as u32..(start + len) as u32).collect();
            let x = self.rng.vec(len * c, 3.0);
            let (xb, xc) = self.up(&x, len, c)?;
            let (pos, b) = (&positions, &batch);
            let qb = self.b.norm_qkv_rope_kv(&xb, (&gb, 1e-6), wb, &rope, pos, (&mut pb, 0), b)?;
            let qc = self.cpu.norm_qkv_rope_kv(&xc, (&gc, 1e-6), wc, &rope, pos, (&mut pc, 0), b)?;
            tag = format!("norm_qkv_rope_kv, matmuls on {qk_type} q/k and {v_type} v, hd={hd}, {len} rows at {start}");
            self.record(format!("{tag}: q"), &qb, &qc, TOL_X8_TAILED)?;
            q_last = Some((qb, qc, batch));
        }
        let Some((qb, qc, batch)) = q_last else { return Ok(()) };
        // Scores of order one (k's entries are of q's size): a sharper
        // softmax would turn the 8-bit inputs' rounding into near-ties.
        let ms = qc.data.iter().map(|v| v * v).sum::<f32>() / qc.data.len() as f32;
        let scale = 1.0 / ((hd as f32).sqrt() * ms.max(1e-6));
        let o = raw("o", DType::BF16, c, heads * hd, self.rng.weight(DType::BF16, c, heads * hd));
        let (ob, oc) = (self.b.weight(o.clone())?, self.cpu.weight(o)?);
        let x = self.rng.vec(c, 3.0);
        // Every key; the newest alone (its V as written); the newest two
        // (a softmax weighed by the newest K).
        for (window, keys) in [(None, "every key"), (Some(1), "the newest key"), (Some(2), "the newest two keys")] {
            let p = AttnParams { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale, window, softcap: None };
            let ((mut rb, mut rc), b) = (self.up(&x, 1, c)?, &batch);
            self.b.attention_project_add(&mut rb, &qb, &pb, 0, b, &p, &ob)?;
            self.cpu.attention_project_add(&mut rc, &qc, &pc, 0, b, &p, &oc)?;
            self.record(format!("{tag}, then attention_project_add over {keys}"), &rb, &rc, TOL_X8_TAILED)?;
        }
        Ok(())
    }

    /// `attention_inputs` for heads of `hd` with RoPE's pairs `interleaved` or not.
    fn attention_inputs_of(&mut self, hd: usize, interleaved: bool) -> Result<()> {
        let (c, heads, kv_heads, bs) = (256, 4, 2, 16);
        // q and k entries are sums of 256 products of unit-sized factors:
        // scores of order one at this scale (at 1/8, a softmax so sharp that
        // bf16 rounding of q and k moved the output by 2-7%).
        let scale = 1.0 / 512.0;
        let p = AttnParams { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale, window: None, softcap: None };
        let inv_freq = (0..hd / 2).map(|i| 10000f32.powf(-((2 * i) as f32) / hd as f32)).collect();
        let rope = Rope { head_dim: hd, inv_freq, interleaved };
        for lens in [vec![100usize, 37], vec![1, 1, 1]] {
            let spec = KvSpec { n_layers: 1, n_blocks: 16, block_size: bs, kv_dim: kv_heads * hd, dtype: KvDtype::F16 };
            let (mut pb, mut pc) = (self.b.kv_pool(spec)?, self.cpu.kv_pool(spec)?);
            let (mut seqs, mut slots, mut positions) = (Vec::new(), Vec::new(), Vec::new());
            let (mut start, mut block) = (0, 0u32);
            for &len in &lens {
                let table: Vec<u32> = (block..block + len.div_ceil(bs) as u32).collect();
                block += table.len() as u32;
                for t in 0..len {
                    slots.push(table[t / bs] as usize * bs + t % bs);
                    positions.push(t as u32);
                }
                seqs.push(SeqSlice { q_start: start, q_len: len, ctx_len: len, block_table: table });
                start += len;
            }
            let (batch, n) = (AttnBatch { seqs, block_size: bs, slots }, start);
            let (x, g) = (self.rng.vec(n * c, 3.0), self.rng.vec(c, 1.0));
            let ((xb, xc), (gb, gc)) = (self.up(&x, n, c)?, self.up(&g, 1, c)?);
            let ws = [("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd), ("o", c)]
                .map(|(name, m)| (name, m, if name == "o" { heads * hd } else { c }))
                .map(|(name, m, k)| raw(name, DType::BF16, m, k, self.rng.weight(DType::BF16, m, k)));
            let [qw, kw, vw, ow] = ws.clone().map(|w| self.b.weight(w));
            let [qc_w, kc_w, vc_w, oc_w] = ws.map(|w| self.cpu.weight(w));
            let (qw, kw, vw, ow) = (qw?, kw?, vw?, ow?);
            let (qc_w, kc_w, vc_w, oc_w) = (qc_w?, kc_w?, vc_w?, oc_w?);
            let (pos, b) = (&positions, &batch);
            let qb = self.b.norm_qkv_rope_kv(&xb, (&gb, 1e-6), [&qw, &kw, &vw], &rope, pos, (&mut pb, 0), b)?;
            let qc = self.cpu.norm_qkv_rope_kv(&xc, (&gc, 1e-6), [&qc_w, &kc_w, &vc_w], &rope, pos, (&mut pc, 0), b)?;
            // Attention first: it reads q as the op left it (to_host reads f32).
            let ((mut rb, mut rc), tag) =
                (self.up(&x, n, c)?, format!("norm_qkv_rope_kv bf16 hd={hd} interleaved={interleaved}, {n} rows"));
            self.b.attention_project_add(&mut rb, &qb, &pb, 0, b, &p, &ow)?;
            self.cpu.attention_project_add(&mut rc, &qc, &pc, 0, b, &p, &oc_w)?;
            self.record(format!("{tag}, then attention_project_add"), &rb, &rc, TOL_BF16)?;
            // Output projections on blocks (GPU decode: the GEMV reads
            // attention's output quantized, in piece order for k-quants).
            for dt in [DType::Q4K, DType::Q8_0] {
                let w = raw("o", dt, c, heads * hd, self.rng.weight(dt, c, heads * hd));
                let (wb, wc) = (self.b.weight(w.clone())?, self.cpu.weight(dequantized_or_same(&w)?)?);
                let (mut rb, mut rc) = self.up(&x, n, c)?;
                self.b.attention_project_add(&mut rb, &qb, &pb, 0, b, &p, &wb)?;
                self.cpu.attention_project_add(&mut rc, &qc, &pc, 0, b, &p, &wc)?;
                self.record(format!("{tag}, then attention_project_add, a {dt} matmul"), &rb, &rc, TOL_X8_TAILED)?;
            }
            self.record(format!("{tag}: q"), &qb, &qc, TOL_BF16)?;
        }
        Ok(())
    }

    fn encoder_attention(&mut self) -> Result<()> {
        let mixed = [0..5, 5..70, 70..71, 71..200];
        for (hd, heads, kv_heads, window, seqs) in [
            (32, 12, 12, None, &mixed[..]),
            (64, 4, 2, Some(16), &[0..150, 150..200][..]),
            (96, 2, 1, Some(70), &mixed[..]),
            (30, 2, 1, None, &mixed[..]),
            (12, 3, 1, Some(3), &mixed[..]),
        ] {
            let n = seqs.last().map_or(0, |s| s.end);
            let p =
                AttnParams { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.17, window, softcap: None };
            let kvd = kv_heads * hd;
            let (k, v, q) = (self.rng.vec(n * kvd, 1.0), self.rng.vec(n * kvd, 1.0), self.rng.vec(n * heads * hd, 2.0));
            let (kb, kc) = self.up(&k, n, kvd)?;
            let (vb, vc) = self.up(&v, n, kvd)?;
            let (qb, qc) = self.up(&q, n, heads * hd)?;
            let got = self.b.encoder_attention(&qb, &kb, &vb, seqs, &p)?;
            let want = self.cpu.encoder_attention(&qc, &kc, &vc, seqs, &p)?;
            let name =
                format!("encoder attention hd={hd} {heads}/{kv_heads} window={window:?}, {} sequences", seqs.len());
            self.record(name, &got, &want, TOL_F32)?;
        }
        Ok(())
    }
}
