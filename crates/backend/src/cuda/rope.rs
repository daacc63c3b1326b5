//! Rotary embeddings on the GPU: RoPE on q (and k) in place, and RoPE with
//! the KV-cache write in one launch (kernels/ops.cu `rope`, `rope_kv_*`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use ferrite_core::{Error, Result};

use super::gemv::{self, Norm, RopeKvArgs};
use super::graph::{Field, Words};
use super::kv::{self, KvBuf};
use super::{profile, CudaBackend, CudaKvPool, CudaTensor, CudaWeight, Storage};
use crate::{AttnBatch, Rope};

impl CudaBackend {
    /// RoPE on `x`, and on `k` too if given (one launch; block row y of the
    /// grid turns tensor y).
    pub(super) fn rope_launch(
        &self,
        x: &mut CudaTensor,
        k: Option<&mut CudaTensor>,
        rope: &Rope,
        positions: &[u32],
    ) -> Result<()> {
        Self::check_rope(x, k.as_deref(), rope, positions)?;
        if x.rows == 0 {
            return Ok(());
        }
        let (pos, freq) = self.rope_inputs(rope, positions)?;
        let pos = pos.view();
        let s = &self.dev.stream;
        let (rows, c0) = (x.rows, x.cols);
        let (p0, _g0) = x.f32_mut(&self.dev)?.device_ptr_mut(s);
        let mut _g1 = None;
        let (tensors, c1, p1) = match k {
            Some(k) => {
                let c1 = k.cols;
                let (p, g) = k.f32_mut(&self.dev)?.device_ptr_mut(s);
                _g1 = Some(g);
                (2, c1, p)
            }
            None => (1, c0, p0),
        };
        let widest = c0.max(c1);
        let (c0, c1, hd, inter) = (c0 as u32, c1 as u32, rope.head_dim as u32, rope.interleaved as i32);
        // Pairs per row, two a thread where heads pair up evenly (`rope_row`).
        let pairs = widest / if rope.head_dim.is_multiple_of(4) { 4 } else { 2 };
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, tensors, 1),
            block_dim: (pairs.clamp(32, 1024).div_ceil(32) as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "rope", cfg, &p0, &p1, &pos, freq.as_ref(), &c0, &c1, &hd, &inter)
    }

    /// Checks `rope`'s shapes for q (and k) rows at `positions`.
    fn check_rope(q: &CudaTensor, k: Option<&CudaTensor>, rope: &Rope, positions: &[u32]) -> Result<()> {
        let fits = |t: &CudaTensor| positions.len() == t.rows && t.cols.is_multiple_of(rope.head_dim);
        if !fits(q) || k.is_some_and(|k| !fits(k)) || rope.inv_freq.len() * 2 != rope.head_dim || rope.head_dim > 512 {
            return Err(Error::Shape("rope: positions or head size do not match".into()));
        }
        Ok(())
    }

    /// The rotary kernels' device inputs: positions (the step's, while a
    /// decode step is captured) and the inverse frequencies.
    pub(super) fn rope_inputs(&self, rope: &Rope, positions: &[u32]) -> Result<(Words, Arc<CudaSlice<u32>>)> {
        let pos = self.step_words(Field::Positions, || positions.to_vec())?;
        let freq = rope.inv_freq.iter().map(|f| f.to_bits()).collect();
        Ok((pos, self.meta.constant(&self.dev, freq, self.graphs.is_capturing())?))
    }

    /// `norm_qkv_rope_kv` for one decode row whose q/k/v GEMVs apply RoPE
    /// and write the KV cache themselves (`gemv::gemv_qkv_rope_kv`; off
    /// with `FERRITE_CUDA_QKV_ROPE=0`): interleaved pairs, an f16 cache, Q4_K
    /// q/k with a Q4_K or Q6_K v; `None` elsewhere (the caller runs the
    /// separate kernels). Not in the batch-invariant mode: the epilogue's
    /// arithmetic may round differently from `rope_kv`'s.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn qkv_rope_kv_fused(
        &self,
        x: &CudaTensor,
        norm: Norm,
        [wq, wk, wv]: [&CudaWeight; 3],
        rope: &Rope,
        positions: &[u32],
        (pool, layer): (&mut CudaKvPool, usize),
        batch: &AttnBatch,
    ) -> Result<Option<CudaTensor>> {
        let (d, hd, kv_dim) = (&self.dev, rope.head_dim, pool.kv_dim);
        let shapes = hd > 0
            && hd.is_multiple_of(2)
            && rope.inv_freq.len() * 2 == hd
            && wq.rows.is_multiple_of(hd)
            && (wk.rows, wv.rows) == (kv_dim, kv_dim)
            && kv_dim.is_multiple_of(hd);
        let weights = [wq, wk, wv];
        if !d.qkv_rope || d.deterministic || !rope.interleaved || !shapes || !gemv::fuses_qkv_rope(d, x, weights, norm)
        {
            return Ok(None);
        }
        if positions.len() != 1 || batch.slots.len() != 1 || layer >= pool.k.len() {
            return Err(Error::Shape(format!(
                "rope_write_kv: {} positions, {} slots",
                positions.len(),
                batch.slots.len()
            )));
        }
        kv::check_slots(pool, batch)?;
        let (KvBuf::F16(kc), KvBuf::F16(vc)) = (&mut pool.k[layer], &mut pool.v[layer]) else { return Ok(None) };
        let _span = profile::span(&d.stream, "norm_qkv_rope_kv (fused)");
        let (pos, freq) = self.rope_inputs(rope, positions)?;
        let slots = self.step_words(Field::Slots, || batch.slots.iter().map(|&s| s as u32).collect())?;
        let s = &d.stream;
        let (pos, slots) = (pos.view(), slots.view());
        let ((pp, _g1), (fp, _g2), (sp, _g3)) = (pos.device_ptr(s), freq.device_ptr(s), slots.device_ptr(s));
        let ((kp, _g4), (vp, _g5)) = (kc.device_ptr_mut(s), vc.device_ptr_mut(s));
        let (head_dim, kv_dim) = (hd as u32, kv_dim as u32);
        let rkv = RopeKvArgs { pos: pp, inv_freq: fp, slots: sp, kc: kp, vc: vp, head_dim, kv_dim };
        gemv::gemv_qkv_rope_kv(d, x, weights, norm, &rkv)
    }

    /// `Backend::rope_write_kv`: RoPE on q and k and the KV write in one
    /// launch.
    pub(super) fn rope_kv(
        &self,
        (q, k, v): (&mut CudaTensor, &mut CudaTensor, &CudaTensor),
        rope: &Rope,
        positions: &[u32],
        (pool, layer): (&mut CudaKvPool, usize),
        batch: &AttnBatch,
    ) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "rope_write_kv");
        Self::check_rope(q, Some(k), rope, positions)?;
        kv::check_write(pool, layer, k, v, batch)?;
        if q.rows == 0 {
            return Ok(());
        }
        let (pos, freq) = self.rope_inputs(rope, positions)?;
        let slots = self.step_words(Field::Slots, || batch.slots.iter().map(|&s| s as u32).collect())?;
        let (pos, slots) = (pos.view(), slots.view());
        let (qc, kvd, rows) = (q.cols as u32, pool.kv_dim as u32, q.rows as u32);
        let (hd, inter) = (rope.head_dim as u32, rope.interleaved as i32);
        // Pairs of q or values of v per row, two a thread where heads pair up evenly (`rope_row`).
        let per = if rope.head_dim.is_multiple_of(4) { 2 } else { 1 };
        let widest = (q.cols / 2).max(pool.kv_dim) / per;
        let cfg = LaunchConfig {
            grid_dim: (q.rows as u32, 3, 1),
            block_dim: (widest.clamp(32, 1024).div_ceil(32) as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // Prefill's bf16 q, k and v (`norm_qkv_rope_kv`): turned in place, in bf16.
        if let (KvBuf::F16(kc), KvBuf::F16(vc)) = (&mut pool.k[layer], &mut pool.v[layer]) {
            let bf16 = |t: &CudaTensor| t.is_half_only() && t.half().is_some_and(|h| h.0 == Storage::Bf16);
            if bf16(q) && bf16(k) && bf16(v) {
                let vb = v.half().map(|h| h.1).ok_or_else(|| Error::Device("v without values".into()))?;
                if let (Some(qb), Some(kb)) = (q.half_only_mut(), k.half_only_mut()) {
                    // Eight pairs a thread, rows in eights (kernels/ops.cu).
                    let head = rope.head_dim;
                    if head.is_multiple_of(16) && head <= 256 && ferrite_core::env::cuda_rope_rows() {
                        let cfg = LaunchConfig {
                            grid_dim: (rows.div_ceil(8), 3, 1),
                            block_dim: (256, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        let f = "rope_kv_rows";
                        let dims = (&qc, &kvd, &hd, &inter);
                        let (pf, sl) = (freq.as_ref(), &slots);
                        return launch!(
                            self, f, cfg, qb, kb, vb, &pos, pf, sl, kc, vc, &rows, dims.0, dims.1, dims.2, dims.3
                        );
                    }
                    let f = "rope_kv_f16_bf16in";
                    return launch!(
                        self,
                        f,
                        cfg,
                        qb,
                        kb,
                        vb,
                        &pos,
                        freq.as_ref(),
                        &slots,
                        kc,
                        vc,
                        &qc,
                        &kvd,
                        &hd,
                        &inter
                    );
                }
            }
        }
        let (qb, kb) = (q.f32_mut(&self.dev)?, k.f32_mut(&self.dev)?);
        macro_rules! go {
            ($name:literal, $kc:expr, $vc:expr) => {
                launch!(
                    self,
                    $name,
                    cfg,
                    qb,
                    kb,
                    v.f32(&self.dev)?,
                    &pos,
                    freq.as_ref(),
                    &slots,
                    $kc,
                    $vc,
                    &qc,
                    &kvd,
                    &hd,
                    &inter
                )
            };
        }
        match (&mut pool.k[layer], &mut pool.v[layer]) {
            (KvBuf::F16(kc), KvBuf::F16(vc)) => go!("rope_kv_f16", kc, vc),
            (KvBuf::F32(kc), KvBuf::F32(vc)) => go!("rope_kv_f32", kc, vc),
            _ => unreachable!("K and V share a dtype"),
        }
    }
}
