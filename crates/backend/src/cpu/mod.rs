//! The CPU backend: f32 activations, weights kept in their stored format, rayon
//! for all cores, SIMD chosen at run time (see `simd`).

mod attention;
mod encoder_attention;
mod fork;
mod math;
mod matmul;
mod ops;
mod pool;
mod qdot;
mod qdot8;
mod rows8;
mod sgemm;
mod sgemm_bf16;
pub mod simd;
#[cfg(test)]
mod test_util;

pub use attention::{CpuKvPool, KvStore, MAX_HEAD_DIM};
pub use matmul::dot_f32;

use crate::quant::dequantize_row;
use crate::{check_segments, Activation, AttnBatch, AttnParams, Backend, KvDtype, KvSpec, RawWeight, Reduce, Rope};
use ferrite_core::{DType, Error, HostBytes, Result};
use rayon::prelude::*;

#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend {
    /// Multiply f32 weights in bf16 (f32 accumulation) where the CPU has
    /// AVX-512 BF16: twice the multiply rate, about 3 significant digits per
    /// product. Off by default; embedding models may opt in.
    pub bf16_dense: bool,
}

impl CpuBackend {
    /// Exact f32 arithmetic for dense weights.
    pub const F32: CpuBackend = CpuBackend { bf16_dense: false };

    /// bf16 products for f32 weights when the CPU supports them (else f32);
    /// returns the backend and whether bf16 is in use.
    pub fn with_bf16_dense() -> (CpuBackend, bool) {
        let on = sgemm_bf16::available();
        (CpuBackend { bf16_dense: on }, on)
    }
}

#[derive(Clone, Debug)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl CpuTensor {
    /// The values, leaving the tensor empty.
    pub fn into_data(mut self) -> Vec<f32> {
        std::mem::take(&mut self.data)
    }
}

impl Drop for CpuTensor {
    fn drop(&mut self) {
        pool::give_back(std::mem::take(&mut self.data));
    }
}

pub struct CpuWeight {
    pub name: String,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: HostBytes,
    /// f32 weights repacked for the GEMM kernel (see `sgemm`).
    packed: Option<sgemm::PackedF32>,
    /// Or, with `CpuBackend::bf16_dense`, as bf16 panels (see `sgemm_bf16`).
    packed_bf16: Option<sgemm_bf16::PackedBf16>,
    /// Rows stored interleaved by eight (see `rows8`).
    interleaved: bool,
}

impl CpuWeight {
    /// A weight in its stored format; f32 weights are also packed for the GEMM,
    /// and Q8_0, Q5_0 and Q4_K rows interleaved by eight where that kernel runs.
    pub fn new(name: String, dtype: DType, rows: usize, cols: usize, bytes: HostBytes) -> CpuWeight {
        #[cfg(target_arch = "x86_64")]
        if rows8::eligible(dtype, rows) {
            let bytes = HostBytes::from_vec(rows8::interleave(dtype, bytes.as_slice(), rows, cols));
            return CpuWeight { name, dtype, rows, cols, bytes, packed: None, packed_bf16: None, interleaved: true };
        }
        let mut w = CpuWeight { name, dtype, rows, cols, bytes, packed: None, packed_bf16: None, interleaved: false };
        if dtype == DType::F32 {
            let packed = sgemm::PackedF32::pack(rows, cols, |r, buf| {
                w.dequantize_row(r, buf).expect("weight row sizes are validated before packing")
            });
            w.packed = Some(packed);
        }
        w
    }

    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.block_bytes()
    }
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if self.interleaved {
            if r >= self.rows || out.len() != self.cols {
                return Err(Error::Shape(format!("row {r} of [{}, {}] into {}", self.rows, self.cols, out.len())));
            }
            rows8::dequantize_row(self.dtype, self.bytes.as_slice(), r, self.cols, out);
            return Ok(());
        }
        let rb = self.row_bytes();
        dequantize_row(self.dtype, &self.bytes.as_slice()[r * rb..(r + 1) * rb], out)
    }
}

fn same_shape(a: &CpuTensor, b: &CpuTensor, op: &str) -> Result<()> {
    if a.rows != b.rows || a.cols != b.cols {
        return Err(Error::Shape(format!("{op}: [{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols)));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvPool = CpuKvPool;

    fn name(&self) -> String {
        format!("cpu ({}, {} threads)", simd::describe(), rayon::current_num_threads())
    }

    fn weight(&self, raw: RawWeight) -> Result<CpuWeight> {
        raw.check_size()?;
        if self.bf16_dense && raw.dtype == DType::F32 && raw.rows > 1 {
            let mut w = CpuWeight {
                name: raw.name,
                dtype: raw.dtype,
                rows: raw.rows,
                cols: raw.cols,
                bytes: raw.bytes,
                packed: None,
                packed_bf16: None,
                interleaved: false,
            };
            let packed = sgemm_bf16::PackedBf16::pack(w.rows, w.cols, |r, buf| {
                w.dequantize_row(r, buf).expect("weight row sizes are validated before packing")
            });
            w.packed_bf16 = Some(packed);
            return Ok(w);
        }
        #[cfg(target_arch = "x86_64")]
        let interleaved = rows8::eligible(raw.dtype, raw.rows);
        #[cfg(not(target_arch = "x86_64"))]
        let interleaved = false;
        if raw.dtype == DType::Q5_0 && !interleaved {
            // Exactly representable in Q8_0, whose kernels are cheaper (see `repack`).
            let bytes = HostBytes::from_vec(crate::quant::repack::q5_0_to_q8_0(raw.bytes.as_slice()));
            return Ok(CpuWeight::new(raw.name, DType::Q8_0, raw.rows, raw.cols, bytes));
        }
        Ok(CpuWeight::new(raw.name, raw.dtype, raw.rows, raw.cols, raw.bytes))
    }

    fn upload(&self, data: Vec<f32>, rows: usize, cols: usize) -> Result<CpuTensor> {
        if data.len() != rows * cols {
            return Err(Error::Shape(format!("{} values for [{rows}, {cols}]", data.len())));
        }
        Ok(CpuTensor { data, rows, cols })
    }

    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn embedding(&self, table: &CpuWeight, ids: &[u32]) -> Result<CpuTensor> {
        let d = table.cols;
        let mut data = pool::zeroed(ids.len() * d);
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= table.rows {
                return Err(Error::InvalidInput(format!(
                    "token id {id} is outside the vocabulary ({} tokens)",
                    table.rows
                )));
            }
            table.dequantize_row(id as usize, &mut data[i * d..(i + 1) * d])?;
        }
        Ok(CpuTensor { data, rows: ids.len(), cols: d })
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuWeight) -> Result<CpuTensor> {
        if x.cols != w.cols {
            return Err(Error::Shape(format!(
                "matmul {}: input has {} columns, weight expects {}",
                w.name, x.cols, w.cols
            )));
        }
        let mut out = pool::zeroed(x.rows * w.rows);
        matmul::matmul(&x.data, x.rows, w, &mut out);
        Ok(CpuTensor { data: out, rows: x.rows, cols: w.rows })
    }

    fn matmul_many<const N: usize>(&self, x: &CpuTensor, ws: [&CpuWeight; N]) -> Result<[CpuTensor; N]> {
        if let Some(w) = ws.iter().find(|w| w.cols != x.cols) {
            return Err(Error::Shape(format!(
                "matmul {}: input has {} columns, weight expects {}",
                w.name, x.cols, w.cols
            )));
        }
        let mut outs = ws.map(|w| CpuTensor { data: pool::zeroed(x.rows * w.rows), rows: x.rows, cols: w.rows });
        let mut views = outs.each_mut().map(|o| o.data.as_mut_slice());
        matmul::matmul_many(&x.data, x.rows, &ws, &mut views);
        Ok(outs)
    }

    fn linear(&self, x: &CpuTensor, w: &CpuWeight, bias: Option<&CpuTensor>) -> Result<CpuTensor> {
        if w.packed.is_none() && w.packed_bf16.is_none() {
            let mut y = self.matmul(x, w)?;
            if let Some(b) = bias {
                self.add_row(&mut y, b)?;
            }
            return Ok(y);
        }
        if x.cols != w.cols || bias.is_some_and(|b| b.data.len() != w.rows) {
            return Err(Error::Shape(format!(
                "linear {}: input has {} columns, weight is [{}, {}]",
                w.name, x.cols, w.rows, w.cols
            )));
        }
        let mut out = pool::zeroed(x.rows * w.rows);
        let b = bias.map(|b| b.data.as_slice());
        if x.rows > 0 && w.rows > 0 {
            match (&w.packed, &w.packed_bf16) {
                (Some(p), _) => sgemm::gemm(&x.data, x.rows, p, b, &mut out),
                (_, Some(p)) => sgemm_bf16::gemm(&x.data, x.rows, p, b, &mut out),
                _ => unreachable!("checked above"),
            }
        }
        Ok(CpuTensor { data: out, rows: x.rows, cols: w.rows })
    }

    fn add_row(&self, x: &mut CpuTensor, v: &CpuTensor) -> Result<()> {
        if v.data.len() != x.cols {
            return Err(Error::Shape(format!("add_row: {} values for {} columns", v.data.len(), x.cols)));
        }
        ops::add_rows(&mut x.data, &v.data);
        Ok(())
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        same_shape(x, y, "add")?;
        ops::add(&mut x.data, &y.data);
        Ok(())
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) -> Result<()> {
        ops::scale(&mut x.data, s);
        Ok(())
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        let g = w.data.len();
        if g == 0 || !x.cols.is_multiple_of(g) {
            return Err(Error::Shape(format!("rms_norm: {} columns in groups of {g}", x.cols)));
        }
        Ok(CpuTensor { data: ops::rms_norm(&x.data, &w.data, eps), rows: x.rows, cols: x.cols })
    }

    fn glu(&self, gate: &CpuTensor, up: &CpuTensor, act: Activation) -> Result<CpuTensor> {
        same_shape(gate, up, "glu")?;
        Ok(CpuTensor { data: ops::glu(&gate.data, &up.data, act), rows: gate.rows, cols: gate.cols })
    }

    fn rope(&self, x: &mut CpuTensor, rope: &Rope, positions: &[u32]) -> Result<()> {
        if positions.len() != x.rows
            || !x.cols.is_multiple_of(rope.head_dim)
            || rope.inv_freq.len() * 2 != rope.head_dim
        {
            return Err(Error::Shape("rope: positions or head size do not match".into()));
        }
        ops::rope(&mut x.data, x.cols, rope, positions);
        Ok(())
    }

    fn layer_norm(&self, x: &CpuTensor, w: &CpuTensor, b: Option<&CpuTensor>, eps: f32) -> Result<CpuTensor> {
        if w.data.len() != x.cols || b.is_some_and(|b| b.data.len() != x.cols) {
            return Err(Error::Shape(format!("layer_norm: weights do not match {} columns", x.cols)));
        }
        let data = ops::layer_norm(&x.data, &w.data, b.map(|b| b.data.as_slice()), eps);
        Ok(CpuTensor { data, rows: x.rows, cols: x.cols })
    }

    fn activate(&self, x: &mut CpuTensor, act: Activation) -> Result<()> {
        ops::activate_all(&mut x.data, act);
        Ok(())
    }

    fn softcap(&self, x: &mut CpuTensor, cap: f32) -> Result<()> {
        x.data.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        Ok(())
    }

    fn rows(&self, x: &CpuTensor, rows: &[usize]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            if r >= x.rows {
                return Err(Error::Shape(format!("row {r} of {}", x.rows)));
            }
            data.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        Ok(CpuTensor { data, rows: rows.len(), cols: x.cols })
    }

    fn encoder_attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        seqs: &[std::ops::Range<usize>],
        p: &AttnParams,
    ) -> Result<CpuTensor> {
        let data = encoder_attention::encoder_attention(&q.data, &k.data, &v.data, q.rows, seqs, p)?;
        Ok(CpuTensor { data, rows: q.rows, cols: q.cols })
    }

    fn reduce_segments(&self, x: &CpuTensor, segs: &[std::ops::Range<usize>], how: Reduce) -> Result<CpuTensor> {
        check_segments(segs, x.rows)?;
        let cols = x.cols;
        let mut data = pool::zeroed(segs.len() * cols);
        data.par_chunks_mut(cols.max(1)).zip(segs).for_each(|(out, s)| {
            let rows = x.data[s.start * cols..s.end * cols].chunks(cols);
            match how {
                Reduce::Mean => {
                    // f64 sums: the mean of hundreds of rows stays exact to f32.
                    let mut acc = vec![0f64; cols];
                    rows.for_each(|r| acc.iter_mut().zip(r).for_each(|(a, &v)| *a += v as f64));
                    out.iter_mut().zip(&acc).for_each(|(o, a)| *o = (a / s.len() as f64) as f32);
                }
                Reduce::Max => {
                    out.fill(f32::NEG_INFINITY);
                    rows.for_each(|r| out.iter_mut().zip(r).for_each(|(o, &v)| *o = o.max(v)));
                }
            }
        });
        Ok(CpuTensor { data, rows: segs.len(), cols })
    }

    fn kv_pool(&self, spec: KvSpec) -> Result<CpuKvPool> {
        let slots = spec.n_blocks * spec.block_size;
        let len =
            slots.checked_mul(spec.kv_dim).ok_or_else(|| Error::InvalidInput("KV cache size overflows".into()))?;
        let f16 = spec.dtype == KvDtype::F16;
        Ok(CpuKvPool {
            k: (0..spec.n_layers).map(|_| KvStore::zeros(len, f16)).collect(),
            v: (0..spec.n_layers).map(|_| KvStore::zeros(len, f16)).collect(),
            kv_dim: spec.kv_dim,
            block_size: spec.block_size,
            slots,
        })
    }

    fn write_kv(
        &self,
        pool: &mut CpuKvPool,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        batch: &AttnBatch,
    ) -> Result<()> {
        attention::write_kv(pool, layer, &k.data, &v.data, &batch.slots)
    }

    fn attention(
        &self,
        q: &CpuTensor,
        pool: &CpuKvPool,
        layer: usize,
        batch: &AttnBatch,
        p: &AttnParams,
    ) -> Result<CpuTensor> {
        let data = attention::attention(&q.data, q.rows, pool, layer, batch, p)?;
        Ok(CpuTensor { data, rows: q.rows, cols: q.cols })
    }
}
