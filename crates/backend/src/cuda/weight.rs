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
use super::gemv::{self, GemvOut, Norm, X8Cache};
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

/// Whether a weight of `q` blocks, `k` values a row, is regrouped in tiles
/// of 16 rows at upload for the tensor-core GEMV (`gemv_tile_body` in
/// kernels/gemv_tile.cu): Q4_K and Q6_K always; Q5_K unless
/// `FERRITE_CUDA_FIVE_BIT_TILES=0`; 32-value blocks' rows of whole
/// super-blocks (`repack::block32_tiled`; others too, padded, with
/// `FERRITE_CUDA_PAD_TILES=1`) unless `FERRITE_CUDA_B32_TILES=0`
/// (Q5_0's and Q5_1's also unless `FERRITE_CUDA_FIVE_BIT_TILES=0`). The
/// batch-invariant mode tiles the same: its lone rows take the `_whole_1`
/// GEMVs, whose float sums are spelled with intrinsics as a batch's.
fn tiles_at_upload(q: DType, k: usize) -> bool {
    let five = matches!(q, DType::Q5_0 | DType::Q5_1 | DType::Q5K);
    let optional = match q {
        DType::Q4K | DType::Q6K => return true,
        DType::Q5K => true,
        _ => {
            let pad = ferrite_core::env::cuda_pad_tiles();
            ferrite_core::env::cuda_b32_tiles() && crate::quant::repack::block32_tiled(q, k, pad)
        }
    };
    optional && (!five || ferrite_core::env::cuda_five_bit_tiles())
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

pub struct CudaWeight {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub storage: Storage,
    pub data: CudaSlice<u8>,
    /// Multiplied column by column by the weights of the RMS norm of its
    /// input (`CudaBackend::fold_norm`): the norm passed with it is all ones.
    pub norm_folded: bool,
    /// Its rows regrouped in tiles of 16 for the tensor-core GEMVs
    /// (`tiles_at_upload`).
    pub tiled: bool,
}

impl CudaWeight {
    /// Its code for the kernels that read its blocks (kernels/quant.cu
    /// `dq32`): tiled 32-value blocks and Q5_K add `T_TILED` (8); Q4_K and
    /// Q6_K, always tiled, keep their own.
    pub fn code(&self) -> i32 {
        const T_TILED: i32 = 8;
        let own_tiles = self.tiled && !matches!(self.storage, Storage::Quant(DType::Q4K | DType::Q6K));
        self.storage.code() + if own_tiles { T_TILED } else { 0 }
    }

    /// Whether prefill dequantizes it a warp per tile column
    /// (`dequant_f16_tiled`): tiles of 32-value blocks (kernels/quant.cu
    /// `B32Layout`) unless `FERRITE_CUDA_DEQUANT_TILED=0`, Q4_K's and Q5_K's
    /// unless `FERRITE_CUDA_DEQUANT_KTILED=0`.
    fn coalesced_dequant(&self) -> bool {
        match self.storage {
            Storage::Quant(DType::Q6K) => false,
            Storage::Quant(DType::Q4K | DType::Q5K) => self.tiled && ferrite_core::env::cuda_dequant_ktiled(),
            _ => self.tiled && ferrite_core::env::cuda_dequant_tiled(),
        }
    }

    /// Bytes from one row to the next in `data`: for blocks the file's
    /// (rows regrouped in tiles of 16, `tiled`: a tile takes 16 times
    /// this, rows padded to whole super-blocks).
    pub fn row_bytes(&self) -> u64 {
        let k = if self.tiled { self.cols.next_multiple_of(256) } else { self.cols };
        (match self.storage {
            Storage::Quant(q) => k / q.block_size() * q.block_bytes(),
            Storage::F32 => 4 * k,
            Storage::F16 | Storage::Bf16 => 2 * k,
        }) as u64
    }
}

/// The bytes to upload for a checkpoint weight, how they are stored, and
/// whether in tiles: stored types as they are (borrowed; blocks regrouped in
/// tiles for the decode kernels where `tiles_at_upload`), others converted.
fn device_bytes(raw: &RawWeight, exact_f32: bool) -> Result<(Cow<'_, [u8]>, Storage, bool)> {
    let src = raw.bytes.as_slice();
    let tiles = raw.dtype.is_quantized() && tiles_at_upload(raw.dtype, raw.cols);
    Ok(match raw.dtype {
        DType::F16 => (Cow::Borrowed(src), Storage::F16, false),
        DType::BF16 => (Cow::Borrowed(src), Storage::Bf16, false),
        DType::F32 if exact_f32 => (Cow::Borrowed(src), Storage::F32, false),
        DType::F32 => {
            let mut out = vec![0u8; src.len() / 2];
            out.par_chunks_mut(2 << 16).zip(src.par_chunks(4 << 16)).for_each(|(o, s)| {
                for (o, s) in o.chunks_exact_mut(2).zip(s.chunks_exact(4)) {
                    let v = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                    o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
                }
            });
            (Cow::Owned(out), Storage::Bf16, false)
        }
        DType::Q6K => (Cow::Owned(crate::quant::repack::q6_k_tiles(src, raw.cols)), Storage::Quant(DType::Q6K), true),
        DType::Q4K => (Cow::Owned(crate::quant::repack::q4_k_tiles(src, raw.cols)), Storage::Quant(DType::Q4K), true),
        DType::Q5K if tiles => {
            (Cow::Owned(crate::quant::repack::q5_k_tiles(src, raw.cols)), Storage::Quant(DType::Q5K), true)
        }
        q if tiles => (Cow::Owned(crate::quant::repack::block32_tiles(q, src, raw.cols)), Storage::Quant(q), true),
        // Blocks of 18, 22 or 34 bytes: an odd count leaves the tensor 2 bytes
        // short of a whole word, which the dp4a GEMVs' word loads read
        // (kernels/quant.cu `blk_words`); padded, no load leaves it.
        q if quant_code(q).is_some() && !src.len().is_multiple_of(4) => {
            let mut padded = src.to_vec();
            padded.resize(src.len().next_multiple_of(4), 0);
            (Cow::Owned(padded), Storage::Quant(q), false)
        }
        q if quant_code(q).is_some() => (Cow::Borrowed(src), Storage::Quant(q), false),
        q => return Err(Error::Unsupported(format!("{}: {q} weights on the GPU", raw.name))),
    })
}

pub fn upload(dev: &Device, raw: RawWeight, exact_f32: bool) -> Result<CudaWeight> {
    raw.check_size()?;
    let (bytes, storage, tiled) = device_bytes(&raw, exact_f32)?;
    let data = dev.stream.clone_htod(bytes.as_ref()).map_err(|e| device_err("uploading a weight", e))?;
    if raw.rows > 1 {
        dev.weight_bytes.add(matches!(storage, Storage::Quant(_)), bytes.len());
    }
    Ok(CudaWeight { name: raw.name, rows: raw.rows, cols: raw.cols, storage, data, norm_folded: false, tiled })
}

/// y [n, m] = x [n, k] · w [m, k]^T, f32 out.
pub fn matmul(dev: &Device, x: &CudaTensor, w: &CudaWeight) -> Result<CudaTensor> {
    matmul_many(dev, x, &[w], None).map(|mut v| v.remove(0))
}

pub(super) fn alloc_out(dev: &Device, n: usize, m: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: every element is written by the GEMM or GEMV that follows
    // (but k's and v's by a q/k/v GEMV with RoPE, which are dropped unread:
    // `gemv::gemv_qkv_rope_kv`).
    unsafe { dev.alloc::<f32>((n * m).max(1)) }.map_err(|e| device_err("alloc", e))
}

fn check_cols(x: &CudaTensor, w: &CudaWeight) -> Result<()> {
    match w.cols == x.cols {
        true => Ok(()),
        false => {
            Err(Error::Shape(format!("matmul {}: input has {} columns, weight expects {}", w.name, x.cols, w.cols)))
        }
    }
}

/// x times each weight (q, k, v sharing their input): the GEMV kernels for
/// decode batches (up to three weights of one storage per launch; in the
/// batch-invariant mode, for every batch), else one input conversion and a
/// GEMM per weight. `norm`: x normed first, fused into the block GEMVs (the
/// caller checks that all of `ws` take them, `gemv::fuses_norm`).
pub fn matmul_many(dev: &Device, x: &CudaTensor, ws: &[&CudaWeight], norm: Option<Norm>) -> Result<Vec<CudaTensor>> {
    let (n, k) = (x.rows, x.cols);
    for w in ws {
        check_cols(x, w)?;
    }
    if norm.is_some_and(|nm| !gemv::fuses_norm(dev, x, nm, ws) && !gemv::folds_norm(dev, x, ws)) {
        return Err(Error::Shape("a fused input norm needs the GEMVs and a weight per column (or folded)".into()));
    }
    let mut out = Vec::with_capacity(ws.len());
    let mut half_x = None;
    // The input quantized for block GEMVs, once per order.
    let mut x8: X8Cache = [None, None, None];
    gemv::quantize_ahead(dev, x, ws, &mut x8, norm)?;
    if let Some(out) = gemv::gemv_mixed_qkv(dev, x, ws, &mut x8, norm, None)? {
        return Ok(out);
    }
    let mut rest = ws;
    while let Some(first) = rest.first() {
        let st = first.storage;
        if gemv::uses_gemv(dev, n, k, st) {
            let run = rest.iter().take(3).take_while(|w| w.storage == st).count();
            out.extend(gemv::gemv(dev, x, &rest[..run], &mut x8, norm, GemvOut::New)?);
            rest = &rest[run..];
            continue;
        }
        let mut y = alloc_out(dev, n, first.rows)?;
        gemm_into(dev, x, &mut half_x, first, &mut y, false)?;
        out.push(CudaTensor::new(y, n, first.rows));
        rest = &rest[1..];
    }
    Ok(out)
}

/// x += a · w^T (`Backend::matmul_add`): the GEMV adds its sums to x, a GEMM
/// accumulates into it (beta = 1; no output of its own to write and read).
pub fn matmul_add(dev: &Device, x: &mut CudaTensor, a: &CudaTensor, w: &CudaWeight) -> Result<()> {
    matmul_add_x8(dev, x, a, w, [None, None, None])
}

/// `matmul_add` whose GEMV takes its input quantized already where `x8`
/// holds it (the kernel that made `a` quantized it too).
pub fn matmul_add_x8(dev: &Device, x: &mut CudaTensor, a: &CudaTensor, w: &CudaWeight, mut x8: X8Cache) -> Result<()> {
    check_cols(a, w)?;
    if (x.rows, x.cols) != (a.rows, w.rows) {
        return Err(Error::Shape(format!(
            "matmul_add {}: [{}, {}] += [{}, {}] x [{}, {}]^T",
            w.name, x.rows, x.cols, a.rows, a.cols, w.rows, w.cols
        )));
    }
    if gemv::uses_gemv(dev, a.rows, a.cols, w.storage) {
        gemv::gemv(dev, a, &[w], &mut x8, None, GemvOut::Add(x.f32_mut(dev)?))?;
        return Ok(());
    }
    gemm_into(dev, a, &mut None, w, x.f32_mut(dev)?, true)
}

/// y (+)= x · w^T on tensor cores (`accumulate`: added to y), x converted to
/// the weight's 16-bit type once per matmul group (`half_x`).
fn gemm_into<'a>(
    dev: &Device,
    x: &'a CudaTensor,
    half_x: &mut Option<(Storage, HalfInput<'a>)>,
    w: &CudaWeight,
    y: &mut CudaSlice<f32>,
    accumulate: bool,
) -> Result<()> {
    let (n, k, st) = (x.rows, x.cols, w.storage);
    if n * w.rows == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            dev.stream.memset_zeros(y).map_err(|e| device_err("memset", e))?;
        }
        return Ok(());
    }
    let half = st.half();
    if st != Storage::F32 && half_x.as_ref().is_none_or(|h| h.0 != half) {
        *half_x = Some((half, half_input(dev, x, half)?));
    }
    let xp = half_x.as_ref().filter(|_| st != Storage::F32).map(|h| h.1.get());
    match st {
        Storage::Quant(_) => gemm_quant(dev, x, xp.expect("f16 input"), w, y, accumulate),
        _ => gemm(dev, x, xp, w, GemmOut::F32(y), None, accumulate).map(|_| ()),
    }
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
    match x.half() {
        Some((st, buf)) if st == half => Ok(HalfInput::Kept(buf)),
        _ => to_half(dev, x, half).map(HalfInput::Made),
    }
}

/// The input rounded to a 16-bit weight type.
fn to_half(dev: &Device, x: &CudaTensor, st: Storage) -> Result<CudaSlice<u16>> {
    let _span = super::profile::span(&dev.stream, "  input to 16 bits");
    let len = x.rows * x.cols;
    // SAFETY: fully written by the conversion kernel.
    let mut h = unsafe { dev.alloc::<u16>(len.max(1)) }.map_err(|e| device_err("alloc", e))?;
    let f = if st == Storage::Bf16 { "to_bf16" } else { "to_f16" };
    let len64 = len as u64;
    dev.launch(f).arg(x.f32(dev)?).arg(&mut h).arg(len64).run(elementwise(len))?;
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
    accumulate: bool,
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
        None => x.f32(dev)?.device_ptr(s),
    };
    let bias = bias.map(|b| b.f32(dev)).transpose()?.map(|b| b.device_ptr(s));
    let t = w.storage.cuda_type();
    // Column-major view: y^T [m, n] = w [k, m]^T · x^T [k, n].
    let bias = bias.as_ref().map(|b| b.0);
    let g = Gemm { m, n, k, ldc: m, a: (wp, t), b: (xp, t), c: (yp, yt), bias, accumulate };
    // SAFETY: pointers are live device buffers of the sizes given.
    unsafe { g.run(dev) }.map_err(|e| device_err(&format!("GEMM {}", w.name), e))
}

/// x times each of `ws` (bf16, x's rows in GEMMs) on tensor cores, each
/// output in bf16 alone (`CudaTensor::half_only`): for ops that read 16 bits.
/// `None` where a GEMM has no algorithm for it (the batch-invariant mode).
pub fn gemm_bf16_out(dev: &Device, x: &CudaTensor, ws: &[&CudaWeight]) -> Result<Option<Vec<CudaTensor>>> {
    let n = x.rows;
    let half_x = half_input(dev, x, Storage::Bf16)?;
    let mut out = Vec::with_capacity(ws.len());
    for w in ws {
        check_cols(x, w)?;
        // SAFETY: fully written by the GEMM.
        let mut y = unsafe { dev.alloc::<u16>((n * w.rows).max(1)) }.map_err(|e| device_err("alloc", e))?;
        if gemm(dev, x, Some(half_x.get()), w, GemmOut::Bf16(&mut y), None, false).is_err() {
            return Ok(None);
        }
        out.push(CudaTensor::half_only(n, w.rows, Storage::Bf16, y));
    }
    Ok(Some(out))
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
        let mut y = unsafe { dev.alloc::<u16>(n * m) }.map_err(|e| device_err("alloc", e))?;
        // No algorithm for bf16 outputs (the batch-invariant mode pins one per
        // shape): the f32 path instead, which reports a real failure again.
        if gemm(dev, x, Some(half_x.get()), w, GemmOut::Bf16(&mut y), None, false).is_err() {
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
    if matches!(st, Storage::Quant(_)) || gemv::uses_gemv(dev, n, k, st) || n * k == 0 || w.cols != k {
        return Ok((matmul(dev, x, w)?, false));
    }
    let mut y = alloc_out(dev, n, w.rows)?;
    let half = (st != Storage::F32).then(|| half_input(dev, x, st.half())).transpose()?;
    let added = gemm(dev, x, half.as_ref().map(|h| h.get()), w, GemmOut::F32(&mut y), Some(bias), false)?;
    Ok((CudaTensor::new(y, n, w.rows), added))
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
/// multiplied into its columns of y^T (its rows' outputs; `accumulate`:
/// added to them).
fn gemm_quant(
    dev: &Device,
    x: &CudaTensor,
    half_x: &CudaSlice<u16>,
    w: &CudaWeight,
    y: &mut CudaSlice<f32>,
    accumulate: bool,
) -> Result<()> {
    let (n, k, m) = (x.rows, x.cols, w.rows);
    let s = &dev.stream;
    let tile_rows = (DEQUANT_TILE / k).clamp(1, m.min(DEQUANT_ROWS));
    // SAFETY: each tile is fully written by `dequant_f16` (or
    // `dequant_f16_tiled`) before the GEMM reads it.
    let mut tile = unsafe { dev.alloc::<u16>(tile_rows * k) }.map_err(|e| device_err("alloc", e))?;
    let row_bytes = w.row_bytes();
    let (code, k32) = (w.code(), k as u32);
    // A warp per tile column where `coalesced_dequant`: `dequant_f16_tiled`.
    let tiles32 = w.coalesced_dequant();
    for r0 in (0..m).step_by(tile_rows) {
        let rows = (m - r0).min(tile_rows);
        let r0_32 = r0 as u32;
        let span = super::profile::span(s, "  dequant_f16");
        let (name, cfg) = if tiles32 {
            // A warp per tile column of the tiles holding these rows.
            let tiles = (r0 + rows).div_ceil(16) - r0 / 16;
            let grid = ((tiles * k.div_ceil(256)).div_ceil(8) as u32, 1, 1);
            ("dequant_f16_tiled", LaunchConfig { grid_dim: grid, block_dim: (256, 1, 1), shared_mem_bytes: 0 })
        } else {
            // A block row per weight row, a thread per 32 values.
            let grid = ((k / 32).div_ceil(128) as u32, rows as u32, 1);
            ("dequant_f16", LaunchConfig { grid_dim: grid, block_dim: (128, 1, 1), shared_mem_bytes: 0 })
        };
        let mut b = dev.launch(name);
        b.arg(&w.data).arg(&mut tile).arg(code).arg(row_bytes).arg(k32).arg(r0_32);
        if tiles32 {
            b.arg(rows as u32);
        }
        // Rows r0..r0+rows exist; the tile holds rows x k values.
        b.run(cfg)?;
        drop(span);
        let _span = super::profile::span(s, "  gemm (dequantized)");
        let (tp, _g1) = tile.device_ptr(s);
        let (xp, _g2) = half_x.device_ptr(s);
        let (yp, _g3) = y.device_ptr_mut(s);
        let h = cudaDataType::CUDA_R_16F;
        let c = (yp + (r0 * 4) as u64, cudaDataType::CUDA_R_32F);
        let g = Gemm { m: rows, n, k, ldc: m, a: (tp, h), b: (xp, h), c, bias: None, accumulate };
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
    /// C += A^T · B (beta = 1) instead of C = A^T · B.
    pub accumulate: bool,
}

impl Gemm {
    /// C's factor: 1 to accumulate, else 0.
    fn beta(&self) -> f32 {
        if self.accumulate {
            1.0
        } else {
            0.0
        }
    }

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
            match lt.gemm(&shape, [self.a.0, self.b.0, self.c.0], self.bias.unwrap_or(0), self.beta(), stream) {
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
        let (alpha, beta) = (1f32, self.beta());
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::HostBytes;

    #[test]
    fn block_tensors_are_padded_to_whole_words() {
        // 37 rows of 3 blocks: 111 blocks, 2 bytes short of a word for 18-,
        // 22- and 34-byte blocks; Q4_1's 20-byte blocks need nothing.
        for (dtype, padded) in [(DType::Q4_0, true), (DType::Q5_0, true), (DType::Q8_0, true), (DType::Q4_1, false)] {
            let n = 37 * 3 * dtype.block_bytes();
            let bytes: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let raw =
                RawWeight { name: "w".into(), dtype, rows: 37, cols: 96, bytes: HostBytes::from_vec(bytes.clone()) };
            let (out, storage, tiled) = device_bytes(&raw, false).unwrap();
            assert!(!tiled);
            assert_eq!(storage, Storage::Quant(dtype));
            assert_eq!(out.len(), if padded { n + 2 } else { n }, "{dtype}");
            assert_eq!(out[..n], bytes[..], "{dtype}");
            assert!(out[n..].iter().all(|&b| b == 0));
            assert_eq!(matches!(out, Cow::Borrowed(_)), !padded, "{dtype}: only padded tensors are copied");
        }
    }
}
