//! Weights on the GPU and the matmuls: our GEMV kernels for decode batches,
//! cuBLASLt (lt.rs) for the rest.
//!
//! Weights are stored as f16 or bf16 (f32 only with `exact_f32`). Quantized
//! GGUF weights stay in their blocks (kernels/quant.cu reads them in place):
//! decode batches multiply them directly, prefill dequantizes a tile of rows
//! at a time to f16 for the tensor cores. Activations stay f32 between ops; a
//! GEMM rounds its input to the weight's 16-bit type, multiplies on tensor
//! cores and accumulates and writes f32.

use std::borrow::Cow;
use std::ffi::c_void;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use ferrite_core::{DType, Error, Result};
use rayon::prelude::*;

use super::device::{device_err, elementwise, Device};
use super::CudaTensor;
use crate::RawWeight;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    F16,
    Bf16,
    /// GGUF blocks as stored.
    Quant(DType),
}

impl Storage {
    /// Kernel code: the `embedding` kernel's dtype for dense storage, the
    /// type code of kernels/quant.cu for blocks.
    pub fn code(self) -> i32 {
        match self {
            Storage::F32 => 0,
            Storage::F16 => 1,
            Storage::Bf16 => 2,
            Storage::Quant(q) => quant_code(q).unwrap_or(-1),
        }
    }
    /// The type a GEMM reads: blocks are dequantized to f16 first.
    fn cuda_type(self) -> cudaDataType {
        match self {
            Storage::F32 => cudaDataType::CUDA_R_32F,
            Storage::Bf16 => cudaDataType::CUDA_R_16BF,
            Storage::F16 | Storage::Quant(_) => cudaDataType::CUDA_R_16F,
        }
    }
    /// 16-bit type of a GEMM's input.
    fn half(self) -> Storage {
        if self == Storage::Bf16 {
            Storage::Bf16
        } else {
            Storage::F16
        }
    }
}

/// kernels/quant.cu's code (T_*) of a block type, and the kernel-name stem.
fn quant_code(q: DType) -> Option<i32> {
    QUANT_KERNELS.iter().position(|(t, _)| *t == q).map(|i| i as i32)
}

/// Block types read in place, in kernel-code order, with their GEMV name stems.
pub const QUANT_KERNELS: [(DType, &str); 8] = [
    (DType::Q4_0, "q4_0"),
    (DType::Q4_1, "q4_1"),
    (DType::Q5_0, "q5_0"),
    (DType::Q5_1, "q5_1"),
    (DType::Q8_0, "q8_0"),
    (DType::Q4K, "q4_k"),
    (DType::Q5K, "q5_k"),
    (DType::Q6K, "q6_k"),
];

/// The GEMV kernel for `n` (1..=8) input rows of weights stored as `st`.
pub fn gemv_name(st: Storage, n: usize) -> String {
    let stem = match st {
        Storage::Bf16 => "bf16",
        Storage::Quant(q) => QUANT_KERNELS.iter().find(|(t, _)| *t == q).map_or("f16", |k| k.1),
        _ => "f16",
    };
    format!("gemv_{stem}_{n}")
}

pub struct CudaWeight {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub storage: Storage,
    pub data: CudaSlice<u8>,
}

impl CudaWeight {
    /// Bytes from one row to the next in `data`: for blocks the file's, but
    /// Q6_K's, which `device_bytes` repacks into padded rows.
    pub fn row_bytes(&self) -> u64 {
        let k = self.cols;
        (match self.storage {
            Storage::Quant(DType::Q6K) => crate::quant::repack::q6_k_planar_row_bytes(k),
            Storage::Quant(q) => k / q.block_size() * q.block_bytes(),
            Storage::F32 => 4 * k,
            Storage::F16 | Storage::Bf16 => 2 * k,
        }) as u64
    }
}

/// The bytes to upload for a checkpoint weight, and how they are stored:
/// stored types as they are (borrowed; Q6_K repacked for the decode
/// kernels), others converted.
fn device_bytes(raw: &RawWeight, exact_f32: bool) -> Result<(Cow<'_, [u8]>, Storage)> {
    let src = raw.bytes.as_slice();
    Ok(match raw.dtype {
        DType::F16 => (Cow::Borrowed(src), Storage::F16),
        DType::BF16 => (Cow::Borrowed(src), Storage::Bf16),
        DType::F32 if exact_f32 => (Cow::Borrowed(src), Storage::F32),
        DType::F32 => {
            let mut out = vec![0u8; src.len() / 2];
            out.par_chunks_mut(2 << 16).zip(src.par_chunks(4 << 16)).for_each(|(o, s)| {
                for (o, s) in o.chunks_exact_mut(2).zip(s.chunks_exact(4)) {
                    let v = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                    o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
                }
            });
            (Cow::Owned(out), Storage::Bf16)
        }
        DType::Q6K => (Cow::Owned(crate::quant::repack::q6_k_planar(src, raw.cols)), Storage::Quant(DType::Q6K)),
        q if quant_code(q).is_some() => (Cow::Borrowed(src), Storage::Quant(q)),
        q => return Err(Error::Unsupported(format!("{}: {q} weights on the GPU", raw.name))),
    })
}

pub fn upload(dev: &Device, raw: RawWeight, exact_f32: bool) -> Result<CudaWeight> {
    raw.check_size()?;
    let (bytes, storage) = device_bytes(&raw, exact_f32)?;
    let data = dev.stream.clone_htod(bytes.as_ref()).map_err(|e| device_err("uploading a weight", e))?;
    Ok(CudaWeight { name: raw.name, rows: raw.rows, cols: raw.cols, storage, data })
}

/// y [n, m] = x [n, k] · w [m, k]^T, f32 out.
pub fn matmul(dev: &Device, x: &CudaTensor, w: &CudaWeight) -> Result<CudaTensor> {
    matmul_many(dev, x, &[w]).map(|mut v| v.remove(0))
}

fn alloc_out(dev: &Device, n: usize, m: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: every element is written by the GEMM or GEMV that follows.
    unsafe { dev.stream.alloc::<f32>((n * m).max(1)) }.map_err(|e| device_err("alloc", e))
}

/// x times each weight (q, k, v sharing their input): the GEMV kernel for
/// decode batches (up to three weights of one storage per launch; in the
/// batch-invariant mode, for every batch), else one input conversion and a
/// GEMM per weight.
pub fn matmul_many(dev: &Device, x: &CudaTensor, ws: &[&CudaWeight]) -> Result<Vec<CudaTensor>> {
    let (n, k) = (x.rows, x.cols);
    if let Some(w) = ws.iter().find(|w| w.cols != k) {
        return Err(Error::Shape(format!("matmul {}: input has {k} columns, weight expects {}", w.name, w.cols)));
    }
    let mut out = Vec::with_capacity(ws.len());
    let mut half_x: Option<(Storage, HalfInput)> = None;
    // The input quantized for block GEMVs, once per order (`piece_order`).
    let mut x8: [Option<X8>; 2] = [None, None];
    let mut rest = ws;
    while let Some(first) = rest.first() {
        let st = first.storage;
        if uses_gemv(dev, n, k, st) {
            let run = rest.iter().take(3).take_while(|w| w.storage == st).count();
            out.extend(gemv(dev, x, &rest[..run], &mut x8)?);
            rest = &rest[run..];
            continue;
        }
        let w = first;
        let mut y = alloc_out(dev, n, w.rows)?;
        if n * w.rows > 0 && k == 0 {
            dev.stream.memset_zeros(&mut y).map_err(|e| device_err("memset", e))?;
        } else if n * w.rows > 0 {
            let half = st.half();
            if st != Storage::F32 && half_x.as_ref().is_none_or(|h| h.0 != half) {
                half_x = Some((half, half_input(dev, x, half)?));
            }
            let xp = half_x.as_ref().filter(|_| st != Storage::F32).map(|h| h.1.get());
            match st {
                Storage::Quant(_) => gemm_quant(dev, x, xp.expect("f16 input"), w, &mut y)?,
                _ => {
                    gemm(dev, x, xp, w, GemmOut::F32(&mut y), None)?;
                }
            }
        }
        out.push(CudaTensor::new(y, n, w.rows));
        rest = &rest[1..];
    }
    Ok(out)
}

/// A GEMM's input in a 16-bit type: the copy the op that made it wrote, or
/// converted now.
enum HalfInput<'a> {
    Kept(&'a CudaSlice<u16>),
    Made(CudaSlice<u16>),
}

impl HalfInput<'_> {
    fn get(&self) -> &CudaSlice<u16> {
        match self {
            HalfInput::Kept(b) => b,
            HalfInput::Made(b) => b,
        }
    }
}

fn half_input<'a>(dev: &Device, x: &'a CudaTensor, half: Storage) -> Result<HalfInput<'a>> {
    match &x.half {
        Some((st, buf)) if *st == half => Ok(HalfInput::Kept(buf)),
        _ => to_half(dev, x, half).map(HalfInput::Made),
    }
}

/// The input rounded to a 16-bit weight type.
fn to_half(dev: &Device, x: &CudaTensor, st: Storage) -> Result<CudaSlice<u16>> {
    let _span = super::profile::span(&dev.stream, "  input to 16 bits");
    let len = x.rows * x.cols;
    // SAFETY: fully written by the conversion kernel.
    let mut h = unsafe { dev.stream.alloc::<u16>(len.max(1)) }.map_err(|e| device_err("alloc", e))?;
    let f = if st == Storage::Bf16 { "to_bf16" } else { "to_f16" };
    let len64 = len as u64;
    dev.launch(f).arg(&x.buf).arg(&mut h).arg(len64).run(elementwise(len))?;
    Ok(h)
}

/// Where `gemm` writes: f32, or bf16 for an op that reads 16 bits.
enum GemmOut<'a> {
    F32(&'a mut CudaSlice<f32>),
    Bf16(&'a mut CudaSlice<u16>),
}

/// y = x · w^T on tensor cores, with x in f32 (`half_x` None, f32 weights) or in the
/// weight's 16-bit type, plus `bias` [m] where cuBLASLt adds it (the result says).
fn gemm(
    dev: &Device,
    x: &CudaTensor,
    half_x: Option<&CudaSlice<u16>>,
    w: &CudaWeight,
    y: GemmOut,
    bias: Option<&CudaTensor>,
) -> Result<bool> {
    let (n, k, m) = (x.rows, x.cols, w.rows);
    let s = &dev.stream;
    let (label, ((yp, _g3), yt)) = match y {
        GemmOut::F32(y) => ("  gemm", (y.device_ptr_mut(s), cudaDataType::CUDA_R_32F)),
        GemmOut::Bf16(y) => ("  gemm (bf16 out)", (y.device_ptr_mut(s), cudaDataType::CUDA_R_16BF)),
    };
    let _span = super::profile::span(s, label);
    let (wp, _g1) = w.data.device_ptr(s);
    let (xp, _g2) = match half_x {
        Some(h) => h.device_ptr(s),
        None => x.buf.device_ptr(s),
    };
    let bias = bias.map(|b| b.buf.device_ptr(s));
    let t = w.storage.cuda_type();
    // Column-major view: y^T [m, n] = w [k, m]^T · x^T [k, n].
    let g = Gemm { m, n, k, ldc: m, a: (wp, t), b: (xp, t), c: (yp, yt), bias: bias.as_ref().map(|b| b.0) };
    // SAFETY: pointers are live device buffers of the sizes given.
    unsafe { g.run(dev) }.map_err(|e| device_err(&format!("GEMM {}", w.name), e))
}

/// Gate and up of a gated MLP on tensor cores with bf16 outputs, for
/// `glu_bf16in`: f32 outputs doubled the bytes the GEMMs write and the
/// activation reads, in prefill the largest tensors of a layer. `None` where
/// it does not apply (GEMV sizes, weights not both bf16, mismatched shapes).
pub fn gemm_gate_up(
    dev: &Device,
    x: &CudaTensor,
    gate: &CudaWeight,
    up: &CudaWeight,
) -> Result<Option<[CudaSlice<u16>; 2]>> {
    let (n, k, m) = (x.rows, x.cols, gate.rows);
    let bf16 = |w: &CudaWeight| w.storage == Storage::Bf16 && w.cols == k && w.rows == m;
    if !gemm_rows(dev, n) || !bf16(gate) || !bf16(up) || n * m * k == 0 {
        return Ok(None);
    }
    let half_x = half_input(dev, x, Storage::Bf16)?;
    let mut out = Vec::with_capacity(2);
    for w in [gate, up] {
        // SAFETY: fully written by the GEMM.
        let mut y = unsafe { dev.stream.alloc::<u16>(n * m) }.map_err(|e| device_err("alloc", e))?;
        // No algorithm for bf16 outputs (the batch-invariant mode pins one per
        // shape): the f32 path instead, which reports a real failure again.
        if gemm(dev, x, Some(half_x.get()), w, GemmOut::Bf16(&mut y), None).is_err() {
            return Ok(None);
        }
        out.push(y);
    }
    Ok(out.try_into().ok())
}

/// x · w^T plus `bias` [1, m] on every row, the bias added by the GEMM where
/// cuBLASLt can (dense weights, batches too big for the GEMV). Whether it was.
pub fn matmul_bias(dev: &Device, x: &CudaTensor, w: &CudaWeight, bias: &CudaTensor) -> Result<(CudaTensor, bool)> {
    let (n, k, st) = (x.rows, x.cols, w.storage);
    if matches!(st, Storage::Quant(_)) || uses_gemv(dev, n, k, st) || n * k == 0 || w.cols != k {
        return Ok((matmul(dev, x, w)?, false));
    }
    let mut y = alloc_out(dev, n, w.rows)?;
    let half = (st != Storage::F32).then(|| half_input(dev, x, st.half())).transpose()?;
    let added = gemm(dev, x, half.as_ref().map(|h| h.get()), w, GemmOut::F32(&mut y), Some(bias))?;
    Ok((CudaTensor::new(y, n, w.rows), added))
}

/// Whether a batch of `n` rows goes to the GEMV kernels (decode batches;
/// in the batch-invariant mode every batch of block types) rather than a
/// GEMM (in that mode, every batch of dense weights: cuBLASLt with one
/// algorithm per weight shape, see `lt::Lt`).
fn uses_gemv(dev: &Device, n: usize, k: usize, st: Storage) -> bool {
    let gemv = if dev.deterministic { matches!(st, Storage::Quant(_)) } else { n <= 8 };
    n >= 1 && k.is_multiple_of(8) && st != Storage::F32 && gemv
}

/// act(x · gate^T) * (x · up^T) in one GEMV launch per 8 input rows, where
/// both weights are bf16 or both f16 of one shape and `n` takes the GEMV;
/// `None` otherwise (the caller runs the matmuls and `glu`).
pub fn gemv_glu(
    dev: &Device,
    x: &CudaTensor,
    gate: &CudaWeight,
    up: &CudaWeight,
    act: i32,
) -> Result<Option<CudaTensor>> {
    let (n, k, m) = (x.rows, x.cols, gate.rows);
    let st = gate.storage;
    if !matches!(st, Storage::Bf16 | Storage::F16)
        || up.storage != st
        || (up.rows, up.cols) != (m, k)
        || gate.cols != k
        || m == 0
        || !uses_gemv(dev, n, k, st)
    {
        return Ok(None);
    }
    let s = &dev.stream;
    let mut y = alloc_out(dev, n, m)?;
    let (m32, k32) = (m as u32, k as u32);
    let cfg =
        LaunchConfig { grid_dim: (m.div_ceil(8).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let stem = if st == Storage::Bf16 { "bf16" } else { "f16" };
    let (yp, _gy) = y.device_ptr_mut(s);
    let (xp, _gx) = x.buf.device_ptr(s);
    let (gp, _gg) = gate.data.device_ptr(s);
    let (up_p, _gu) = up.data.device_ptr(s);
    for r0 in (0..n).step_by(8) {
        let name = format!("gemv_glu_{stem}_{}", (n - r0).min(8));
        let (yr, xr) = (yp + (r0 * m * 4) as u64, xp + (r0 * k * 4) as u64);
        let mut a = dev.launch(&name);
        a.arg(gp).arg(up_p).arg(yr).arg(m32).arg(xr).arg(k32).arg(act);
        let _span = super::profile::span(s, gemv_span(st));
        // Both weights are [m, k] 16-bit, x is [n, k] f32 and y [n, m] (offsets
        // stay inside them); k % 8 == 0 keeps the 16-byte loads aligned.
        a.run(cfg)?;
    }
    drop((_gy, _gx, _gg, _gu));
    Ok(Some(CudaTensor::new(y, n, m)))
}

/// Whether a 16-bit matmul of `n` input rows may go to a GEMM (else the GEMV
/// kernel, which reads f32 inputs): where ops write 16-bit copies.
pub fn gemm_rows(dev: &Device, n: usize) -> bool {
    n > 8 || dev.deterministic
}

/// Elements of f16 scratch a quantized weight is dequantized into per GEMM.
const DEQUANT_TILE: usize = 32 << 20;
/// Rows per dequantized tile at most (the grid's y dimension).
const DEQUANT_ROWS: usize = 65535;

/// Prefill with a quantized weight: tiles of rows dequantized to f16, each
/// multiplied into its columns of y^T (its rows' outputs).
fn gemm_quant(
    dev: &Device,
    x: &CudaTensor,
    half_x: &CudaSlice<u16>,
    w: &CudaWeight,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    let (n, k, m) = (x.rows, x.cols, w.rows);
    let s = &dev.stream;
    let tile_rows = (DEQUANT_TILE / k).clamp(1, m.min(DEQUANT_ROWS));
    // SAFETY: each tile is fully written by `dequant_f16` before the GEMM reads it.
    let mut tile = unsafe { s.alloc::<u16>(tile_rows * k) }.map_err(|e| device_err("alloc", e))?;
    let row_bytes = w.row_bytes();
    let (code, k32) = (w.storage.code(), k as u32);
    for r0 in (0..m).step_by(tile_rows) {
        let rows = (m - r0).min(tile_rows);
        let r0_32 = r0 as u32;
        let span = super::profile::span(s, "  dequant_f16");
        let mut b = dev.launch("dequant_f16");
        b.arg(&w.data).arg(&mut tile).arg(code).arg(row_bytes).arg(k32).arg(r0_32);
        // A block row per weight row, a thread per 32 values.
        let grid = ((k / 32).div_ceil(128) as u32, rows as u32, 1);
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // Rows r0..r0+rows exist; the tile holds rows x k values.
        b.run(cfg)?;
        drop(span);
        let _span = super::profile::span(s, "  gemm (dequantized)");
        let (tp, _g1) = tile.device_ptr(s);
        let (xp, _g2) = half_x.device_ptr(s);
        let (yp, _g3) = y.device_ptr_mut(s);
        let h = cudaDataType::CUDA_R_16F;
        let c = (yp + (r0 * 4) as u64, cudaDataType::CUDA_R_32F);
        let g = Gemm { m: rows, n, k, ldc: m, a: (tp, h), b: (xp, h), c, bias: None };
        // SAFETY: the tile, the input and y's columns r0..r0+rows are live.
        unsafe { g.run(dev) }.map_err(|e| device_err(&format!("GEMM {}", w.name), e))?;
    }
    Ok(())
}

/// One GEMM C = A^T · B (column-major; f32 accumulation): A is k x m,
/// B is k x n, C is m x n with leading dimension `ldc`, each a device pointer
/// and its element type.
pub(super) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ldc: usize,
    pub a: (u64, cudaDataType),
    pub b: (u64, cudaDataType),
    pub c: (u64, cudaDataType),
    /// An f32 vector of m values to add to every column, where cuBLASLt can.
    pub bias: Option<u64>,
}

impl Gemm {
    /// cuBLASLt where it has an algorithm for the shape, else cublasGemmEx.
    /// Whether the bias was added (not by the fallback: the caller's job).
    ///
    /// SAFETY: the pointers must be live buffers of those sizes and types.
    pub unsafe fn run(&self, dev: &Device) -> std::result::Result<bool, String> {
        if let Some(lt) = &dev.lt {
            let shape = super::lt::Shape {
                m: self.m,
                n: self.n,
                k: self.k,
                ldc: self.ldc,
                a: self.a.1,
                b: self.b.1,
                c: self.c.1,
                bias: self.bias.is_some(),
            };
            let stream = dev.stream.cu_stream() as cudarc::cublaslt::sys::cudaStream_t;
            match lt.gemm(&shape, self.a.0, self.b.0, self.c.0, self.bias.unwrap_or(0), stream) {
                // cublasGemmEx picks its kernel per shape: not batch-invariant.
                Err(e)
                    if e.0 == cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED
                        && dev.deterministic =>
                {
                    return Err(format!(
                        "no batch-invariant cuBLASLt algorithm for {} x {} x {}",
                        self.m, self.n, self.k
                    ))
                }
                Err(e) if e.0 == cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => {}
                done => return done.map(|_| self.bias.is_some()).map_err(|e| format!("cuBLASLt: {e:?}")),
            }
        }
        let (alpha, beta) = (1f32, 0f32);
        cudarc::cublas::result::gemm_ex(
            *dev.blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            self.m as i32,
            self.n as i32,
            self.k as i32,
            &alpha as *const f32 as *const c_void,
            self.a.0 as *const c_void,
            self.a.1,
            self.k as i32,
            self.b.0 as *const c_void,
            self.b.1,
            self.k as i32,
            &beta as *const f32 as *const c_void,
            self.c.0 as *mut c_void,
            self.c.1,
            self.ldc as i32,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
        .map(|_| false)
        .map_err(|e| format!("cuBLAS: {e:?}"))
    }
}

/// Weight rows each warp of a GEMV takes for `n` input rows: two for 16-bit
/// weights at n > 1 (`gemv_pair_body` in kernels/gemv.cu), so that each input
/// load serves two rows; else one.
fn gemv_rows_per_warp(st: Storage, n: usize) -> u32 {
    if n > 1 && matches!(st, Storage::Bf16 | Storage::F16) {
        2
    } else {
        1
    }
}

/// Profile name of a GEMV launch (nested in its matmul's).
fn gemv_span(st: Storage) -> &'static str {
    match st {
        Storage::Bf16 => "  gemv bf16",
        Storage::Quant(DType::Q4K) => "  gemv q4_k",
        Storage::Quant(DType::Q6K) => "  gemv q6_k",
        Storage::Quant(_) => "  gemv other blocks",
        _ => "  gemv f16",
    }
}

/// The input of a quantized GEMV: 8-bit values per group of 32 and each
/// group's scale and the sums of its two halves (two u32 per group).
type X8 = (CudaSlice<u8>, CudaSlice<u32>);

/// Whether a block type's GEMV reads its input in k-quant piece order
/// (kernels/quant.cu), the index of its `X8` among a matmul group's.
fn piece_order(q: DType) -> usize {
    matches!(q, DType::Q4K | DType::Q5K | DType::Q6K) as usize
}

fn quantize_x8(dev: &Device, x: &CudaTensor, kperm: usize) -> Result<X8> {
    let len = x.rows * x.cols;
    let groups = (len / 32) as u64;
    // SAFETY: both are fully written by the kernel (k % 32 == 0 for blocks,
    // k % 256 == 0 for k-quants).
    let mut xq = unsafe { dev.stream.alloc::<u8>(len.max(1)) }.map_err(|e| device_err("alloc", e))?;
    let mut meta = unsafe { dev.stream.alloc::<u32>(2 * (len / 32).max(1)) }.map_err(|e| device_err("alloc", e))?;
    let _span = super::profile::span(&dev.stream, "  quantize_x8");
    let kperm = kperm as i32;
    // One lane per value.
    let mut a = dev.launch("quantize_x8");
    a.arg(&x.buf).arg(&mut xq).arg(&mut meta).arg(groups).arg(kperm).run(elementwise(len))?;
    Ok((xq, meta))
}

/// Decode batches: our memory-bound kernels, up to three weights of one
/// storage per launch, input rows in chunks of eight; 16-bit weights take the
/// f32 input as is, blocks take it quantized once per matmul group (`x8`).
/// Each output row's sums run the same way whatever the batch (the
/// batch-invariant mode uses this for every batch size).
fn gemv(dev: &Device, x: &CudaTensor, ws: &[&CudaWeight], x8: &mut [Option<X8>; 2]) -> Result<Vec<CudaTensor>> {
    let (n, k) = (x.rows, x.cols);
    let s = &dev.stream;
    let mut ys = ws.iter().map(|w| alloc_out(dev, n, w.rows)).collect::<Result<Vec<_>>>()?;
    // Unused slots repeat the first weight with zero rows.
    let mut wp = [0u64; 3];
    let mut yp = [0u64; 3];
    let mut m = [0u32; 3];
    let mut guards = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let (p, g) = w.data.device_ptr(s);
        wp[i] = p;
        guards.push(g);
        m[i] = w.rows as u32;
    }
    for (i, y) in ys.iter_mut().enumerate() {
        let (p, g) = y.device_ptr_mut(s);
        yp[i] = p;
        guards.push(g);
    }
    for i in ws.len()..3 {
        (wp[i], yp[i]) = (wp[0], yp[0]);
    }
    let rows: u32 = m.iter().sum();
    let k32 = k as u32;
    // Blocks: the input quantized to 8 bits per group of 32 (in piece order
    // for k-quants), with each group's scale and half sums (kernels/quant.cu).
    let quant = match ws[0].storage {
        Storage::Quant(q) => {
            let order = piece_order(q);
            if x8[order].is_none() {
                x8[order] = Some(quantize_x8(dev, x, order)?);
            }
            x8[order].as_ref()
        }
        _ => None,
    };
    // No launch without rows: a grid in which no thread waits for the kernel
    // before it (pdl_wait) would break the order the kernels after it rely on.
    let n_launched = if rows == 0 { 0 } else { n };
    for r0 in (0..n_launched).step_by(8) {
        let nc = (n - r0).min(8);
        let name = gemv_name(ws[0].storage, nc);
        let per_warp = gemv_rows_per_warp(ws[0].storage, nc);
        // Eight warps per block, each on `gemv_rows_per_warp` weight rows.
        let warps = rows.div_ceil(per_warp);
        let cfg =
            LaunchConfig { grid_dim: (warps.div_ceil(8).max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let y: [u64; 3] = std::array::from_fn(|i| yp[i] + (r0 * m[i] as usize * 4) as u64);
        let mut a = dev.launch(&name);
        a.arg(wp[0]).arg(wp[1]).arg(wp[2]).arg(y[0]).arg(y[1]).arg(y[2]);
        a.arg(m[0]).arg(m[1]).arg(m[2]);
        let _g;
        match &quant {
            Some((xq, meta)) => {
                let (xp, g1) = xq.device_ptr(s);
                let (mp, g2) = meta.device_ptr(s);
                _g = (g1, Some(g2));
                let row_bytes = ws[0].row_bytes();
                a.arg(xp + (r0 * k) as u64).arg(mp + (r0 * (k / 32) * 8) as u64).arg(k32).arg(row_bytes);
                a.arg(dev.prefetch);
            }
            None => {
                let (xp, g1) = x.buf.device_ptr(s);
                _g = (g1, None);
                a.arg(xp + (r0 * k * 4) as u64).arg(k32);
            }
        }
        // Profiles time each GEMV shape apart: small ones pay more for the launch.
        let label = if super::profile::enabled() {
            super::profile::intern(format!("{} {rows}x{k} n{nc}", gemv_span(ws[0].storage)))
        } else {
            ""
        };
        let _span = super::profile::span(s, label);
        // Pointers are live buffers of the sizes given (offsets stay inside
        // them); k % 8 == 0 keeps the 16-byte loads aligned.
        a.run(cfg)?;
    }
    drop(guards);
    Ok(ys.into_iter().zip(ws).map(|(buf, w)| CudaTensor::new(buf, n, w.rows)).collect())
}
