//! Decode-sized matmuls (up to 8 input rows a launch) on our memory-bound
//! kernels: kernels/gemv.cu for 16-bit weights, which read the f32 input as
//! it is, and kernels/quant.cu for GGUF blocks, which read it quantized to 8
//! bits (`quantize_x8`; `quantize_x8_sb` for the tensor-core kernels of
//! tiled weights, `tiled`).
//! Both add their sums to the output instead of writing them where asked (`matmul_add`: the residual add). At batch 1 the
//! block GEMVs also fuse the RMS norm of their input (`norm_matmul_*`): the
//! quantization multiplies by the norm's weights and sums each group's
//! squares, and the GEMV scales its sums by the norm (it factors out of each
//! dot product), which saves a kernel per norm. (The 16-bit GEMVs did the
//! same from the squares of the f32 input they read, which made them slower
//! than the kernel saved: the input's and the norm's loads filled L1.) A
//! gated MLP's activation likewise runs in its down projection's input
//! quantization (`gemv_add_glu`): Q4_K_M batch 1 +2.6% on the H200.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, SyncOnDrop};
use ferrite_core::{DType, Error, Result};

use super::device::{device_err, elementwise, Device};
use super::launch::Launch;
use super::weight::{alloc_out, CudaWeight, Storage, QUANT_KERNELS};
use super::CudaTensor;

/// An input norm fused into a GEMV: the RMS norm's weights (one per input
/// column) and epsilon.
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    pub w: &'a CudaTensor,
    pub eps: f32,
}

/// Device addresses of a decode step's RoPE and KV write (one row), for the
/// q/k/v GEMVs that do them in their epilogue (`gemv_qkv_rope_kv`).
pub struct RopeKvArgs {
    pub pos: u64,
    pub inv_freq: u64,
    pub slots: u64,
    pub kc: u64,
    pub vc: u64,
    pub head_dim: u32,
    pub kv_dim: u32,
}

impl RopeKvArgs {
    /// The kernels' trailing arguments (`RKV_ARGS`, kernels/gemv_tile.cu).
    fn push(&self, a: &mut Launch) {
        a.arg(self.pos).arg(self.inv_freq).arg(self.slots).arg(self.kc).arg(self.vc);
        a.arg(self.head_dim).arg(self.kv_dim);
    }
}

/// q of one input row whose q/k/v GEMVs also turn q and k by RoPE and store
/// k and v in the KV cache (kernels/rope_kv.cuh), so that no kernel runs
/// between them and attention: q/k/v all of one k-quant in tiles (one
/// launch of the tensor-core GEMV) or Q4_K or Q5_K q and k with a Q6_K v
/// (`gemv_mixed_qkv`'s launch), the input norm fused. `None` for any other
/// group (the caller checks the rest: one row, interleaved RoPE, an f16
/// cache).
pub fn gemv_qkv_rope_kv(
    dev: &Device,
    x: &CudaTensor,
    ws: [&CudaWeight; 3],
    norm: Norm,
    rkv: &RopeKvArgs,
) -> Result<Option<CudaTensor>> {
    if !fuses_qkv_rope(dev, x, ws, norm) {
        return Ok(None);
    }
    let mut x8: X8Cache = [None, None, None];
    let out = match ws[0].storage != ws[2].storage {
        true => gemv_mixed_qkv(dev, x, &ws, &mut x8, Some(norm), Some(rkv))?,
        false => Some(gemv_in(dev, x, &ws, &mut x8, Some(norm), None, GemvOut::New, Some(rkv))?),
    };
    // (k and v's outputs stay unwritten: their rows went to the cache.)
    Ok(out.map(|mut qkv| qkv.swap_remove(0)))
}

/// Whether `gemv_qkv_rope_kv` takes this group's weights (asked before its
/// inputs are uploaded).
pub fn fuses_qkv_rope(dev: &Device, x: &CudaTensor, ws: [&CudaWeight; 3], norm: Norm) -> bool {
    let (n, k) = (x.rows, x.cols);
    let same = ws.iter().all(|w| w.storage == ws[0].storage && w.rows > 0) && rope_tiles(ws[0]);
    n == 1
        && (same || mixed_qk(dev, &ws).is_some())
        && ws.iter().all(|w| w.cols == k && uses_gemv(dev, n, k, w.storage))
        && fuses_norm(dev, x, norm, &ws)
}

/// Whether the tensor-core GEMV of `w` has a kernel with RoPE and the KV
/// write in its epilogue: the k-quants'.
fn rope_tiles(w: &CudaWeight) -> bool {
    matches!(w.storage, Storage::Quant(DType::Q4K | DType::Q5K | DType::Q6K)) && w.tiled
}

/// The q and k type of a q/k/v group that `gemv_mixed_qkv` takes (Q4_K or
/// Q5_K tiles, with a Q6_K v), as its kernels' name stem.
fn mixed_qk(dev: &Device, ws: &[&CudaWeight]) -> Option<&'static str> {
    let [wq, wk, wv] = ws else { return None };
    let rows = ws.iter().all(|w| w.rows > 0);
    let stem = match wq.storage {
        Storage::Quant(DType::Q4K) => "q4k",
        Storage::Quant(DType::Q5K) if wq.tiled => "q5k",
        _ => return None,
    };
    (dev.mixed_qkv && rows && wk.storage == wq.storage && wv.storage == Storage::Quant(DType::Q6K)).then_some(stem)
}

/// Where a GEMV's sums go: new outputs, or added to a tensor of the output's
/// shape (one weight).
pub enum GemvOut<'a> {
    New,
    Add(&'a mut CudaSlice<f32>),
}

/// The GEMV kernel for `n` (1..=8) input rows of weights stored as `st`
/// (blocks: the dp4a GEMV of rows that are not `tiled`).
pub fn gemv_name(st: Storage, n: usize) -> String {
    let stem = match st {
        Storage::Bf16 => "bf16",
        Storage::Quant(q) => QUANT_KERNELS.iter().find(|(t, _)| *t == q).map_or("f16", |k| k.1),
        _ => "f16",
    };
    format!("gemv_{stem}_{n}")
}

/// Whether a batch of `n` rows goes to the GEMV kernels (decode batches;
/// in the batch-invariant mode every batch of block types) rather than a
/// GEMM (in that mode, every batch of dense weights: cuBLASLt with one
/// algorithm per weight shape, see `lt::Lt`).
pub fn uses_gemv(dev: &Device, n: usize, k: usize, st: Storage) -> bool {
    let gemv = if dev.deterministic { matches!(st, Storage::Quant(_)) } else { n <= 8 };
    n >= 1 && k.is_multiple_of(8) && st != Storage::F32 && gemv
}

/// Whether x times every one of `ws` goes to the block GEMVs with the input
/// norm fused: one input row (shapes that match, a weight of the norm per
/// column). With more rows each warp
/// reduces every row's squares after its sums, which lengthened the warps
/// more than the norm kernel costs (on the H200, Q4_K_M batch 4 13% slower;
/// batch 1 1-2% faster). Not in the batch-invariant mode, where a row must
/// be computed the same way whatever the batch.
pub fn fuses_norm(dev: &Device, x: &CudaTensor, norm: Norm, ws: &[&CudaWeight]) -> bool {
    let blocks = |w: &CudaWeight| matches!(w.storage, Storage::Quant(_));
    x.rows == 1
        && !dev.deterministic
        && norm.w.rows * norm.w.cols == x.cols
        && ws.iter().all(|w| w.cols == x.cols && blocks(w) && uses_gemv(dev, 1, x.cols, w.storage))
}

/// Whether x times every one of `ws`, 16-bit weights with the norm of x
/// folded in (`CudaBackend::fold_norm`), goes to the GEMVs that norm by x's
/// squares (`gemv_norm_*`, `gemv_glu_norm_*` in kernels/gemv.cu): one input
/// row, as it is (no norm kernel; the squares come from the input loads
/// the dot products make).
pub fn folds_norm(dev: &Device, x: &CudaTensor, ws: &[&CudaWeight]) -> bool {
    x.rows == 1 && ws.iter().all(|w| w.norm_folded && w.cols == x.cols && uses_gemv(dev, 1, x.cols, w.storage))
}

/// act(x · gate^T) * (x · up^T) in one GEMV launch per 8 input rows, where
/// both weights are bf16 or both f16 of one shape and `n` takes the GEMV;
/// `None` otherwise (the caller runs the matmuls and `glu`). With `norm`
/// (`folds_norm`), x is normed first (epsilon given).
pub fn gemv_glu(
    dev: &Device,
    x: &CudaTensor,
    gate: &CudaWeight,
    up: &CudaWeight,
    act: i32,
    norm: Option<f32>,
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
    if norm.is_some() && !folds_norm(dev, x, &[gate, up]) {
        return Err(Error::Shape(format!("gemv_glu {}: a norm folded into neither weight", gate.name)));
    }
    let s = &dev.stream;
    let mut y = alloc_out(dev, n, m)?;
    let (m32, k32) = (m as u32, k as u32);
    let cfg =
        LaunchConfig { grid_dim: (m.div_ceil(8).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let stem = if st == Storage::Bf16 { "bf16" } else { "f16" };
    let (yp, _gy) = y.device_ptr_mut(s);
    let (xp, _gx) = x.f32(dev)?.device_ptr(s);
    let (gp, _gg) = gate.data.device_ptr(s);
    let (up_p, _gu) = up.data.device_ptr(s);
    for r0 in (0..n).step_by(8) {
        let nc = (n - r0).min(8);
        let name = if norm.is_some() { format!("gemv_glu_norm_{stem}_1") } else { format!("gemv_glu_{stem}_{nc}") };
        let (yr, xr) = (yp + (r0 * m * 4) as u64, xp + (r0 * k * 4) as u64);
        let mut a = dev.launch(&name);
        a.arg(gp).arg(up_p).arg(yr).arg(m32).arg(xr).arg(k32).arg(act).arg(norm.unwrap_or(0.0));
        let _span = super::profile::span(s, gemv_span(st));
        // Both weights are [m, k] 16-bit, x is [n, k] f32 and y [n, m] (offsets
        // stay inside them); k % 8 == 0 keeps the 16-byte loads aligned.
        a.run(cfg)?;
    }
    drop((_gy, _gx, _gg, _gu));
    Ok(Some(CudaTensor::new(y, n, m)))
}

/// An optional buffer as a kernel argument (0: none), and the guard that
/// keeps its events until the launch.
fn opt_ptr<'a, T>(dev: &'a Device, b: Option<&'a CudaSlice<T>>) -> (u64, Option<SyncOnDrop<'a>>) {
    match b {
        Some(b) => {
            let (p, g) = b.device_ptr(&dev.stream);
            (p, Some(g))
        }
        None => (0, None),
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
        Storage::Quant(DType::Q5K) => "  gemv q5_k",
        Storage::Quant(DType::Q6K) => "  gemv q6_k",
        Storage::Quant(_) => "  gemv other blocks",
        _ => "  gemv f16",
    }
}

/// The input of a quantized GEMV: 8-bit values per group of 32 and each
/// group's scale and the sums of its two halves (two u32 per group); with an
/// input norm, each group's sum of squares before it. For the tensor-core
/// GEMVs (`quantize_x8_sb`) the groups are super-blocks of 256 (eight u32
/// each; kernels/quant.cu).
pub struct X8 {
    xq: CudaSlice<u8>,
    meta: CudaSlice<u32>,
    squares: Option<CudaSlice<f32>>,
    /// Values per scale: 32, or 256 for the tensor-core GEMVs.
    group: usize,
    /// Its `input_order`.
    order: usize,
}

impl X8 {
    /// Where a kernel other than `quantize_x8` writes it (the attention row
    /// kernels' `X8Out`, kernels/quantize_x8.cuh): the 8-bit values' and
    /// the metadata's addresses and the order. No squares: it is for GEMVs
    /// without an input norm.
    pub fn target<'a>(&'a mut self, s: &'a Arc<CudaStream>) -> ([u64; 2], i32, [SyncOnDrop<'a>; 2]) {
        let (xq, g1) = self.xq.device_ptr_mut(s);
        let (meta, g2) = self.meta.device_ptr_mut(s);
        ([xq, meta], self.order as i32, [g1, g2])
    }

    /// Where a kernel other than `quantize_x8` writes it normed (the window
    /// decode kernel, `x8_normed_room`): the 8-bit values', the metadata's
    /// and the squares' addresses.
    pub fn normed_target<'a>(&'a mut self, s: &'a Arc<CudaStream>) -> Result<([u64; 3], [SyncOnDrop<'a>; 3])> {
        let squares = self.squares.as_mut().ok_or_else(|| Error::Shape("an 8-bit input without squares".into()))?;
        let (ss, g3) = squares.device_ptr_mut(s);
        let (xq, g1) = self.xq.device_ptr_mut(s);
        let (meta, g2) = self.meta.device_ptr_mut(s);
        Ok(([xq, meta, ss], [g1, g2, g3]))
    }

    /// Where a kernel reads it: the 8-bit values', the metadata's and the
    /// squares' addresses (0: none).
    pub fn source<'a>(&'a self, dev: &'a Device) -> ([u64; 3], impl Sized + 'a) {
        let s = &dev.stream;
        let (xq, g1) = self.xq.device_ptr(s);
        let (meta, g2) = self.meta.device_ptr(s);
        let (ss, g3) = opt_ptr(dev, self.squares.as_ref());
        ([xq, meta, ss], (g1, g2, g3))
    }

    /// A matmul group's inputs holding this one alone.
    pub fn into_cache(self) -> X8Cache {
        let mut cache: X8Cache = [None, None, None];
        let order = self.order;
        cache[order] = Some(self);
        cache
    }

    /// Bytes per input row of k values of its squares (f32 per group), its
    /// metadata (two u32 per group of 32, eight per super-block) and its
    /// 8-bit values (a row's last super-block padded: `quantize_x8`).
    fn row_bytes(&self, k: usize) -> (usize, usize, usize) {
        let groups = k.div_ceil(self.group);
        (4 * groups, groups * if self.group == 256 { 32 } else { 8 }, groups * self.group)
    }
}

/// How the GEMV of a block weight reads its input, the index of its `X8`
/// among a matmul group's (kernels/quant.cu): groups of 32 in place (0), in
/// k-quant piece order (1: Q5_K's file blocks), or super-blocks in the
/// tensor-core GEMVs' fragment order (2: `CudaWeight::tiled`).
fn input_order(w: &CudaWeight) -> usize {
    match w.storage {
        _ if w.tiled => TILE_ORDER,
        Storage::Quant(DType::Q5K) => 1,
        _ => 0,
    }
}
const TILE_ORDER: usize = 2;

/// The tensor-core GEMV's kernel-name stem for tiled weights.
fn tile_stem(st: Storage) -> &'static str {
    match st {
        Storage::Quant(DType::Q4K) => "q4_k",
        Storage::Quant(DType::Q5K) => "q5_kt",
        Storage::Quant(DType::Q6K) => "q6_k",
        Storage::Quant(DType::Q4_0) => "q4_0t",
        Storage::Quant(DType::Q4_1) => "q4_1t",
        Storage::Quant(DType::Q5_0) => "q5_0t",
        Storage::Quant(DType::Q5_1) => "q5_1t",
        Storage::Quant(DType::Q8_0) => "q8_0t",
        // (Not `tiled`: no kernel has this name, so a launch fails loudly.)
        _ => "untiled",
    }
}

/// The tensor-core GEMVs whose names are not their block type's (Q5_K's,
/// kernels/gemv_tile.cu; the 32-value block types', gemv_tile_b32.cu), for
/// the module's function list: 1..=8 input rows, and the batch-invariant
/// mode's batch 1 (`_whole_1`).
pub fn own_tile_names() -> Vec<String> {
    let own = [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q5K];
    let stems = own.map(|q| tile_stem(Storage::Quant(q)));
    stems
        .iter()
        .flat_map(|s| (1..=8).map(move |n| format!("gemv_{s}_{n}")).chain([format!("gemv_{s}_whole_1")]))
        .collect()
}

/// Warps an SM holds of the tensor-core GEMV (its registers: two blocks of
/// 8 warps, or one of 16).
const TILE_WARPS_PER_SM: u32 = 16;

/// Warps per 16-row tile of the tensor-core GEMV (splitting its
/// super-blocks; `nsb` in all) and tiles per block, blocks of up to 16
/// warps. A `target` of 0, the default, takes as many warps as the GPU holds
/// at once: the most that run in one wave, with no second, partial wave
/// starting late; another aims at about that many. On the H200, random
/// Llama-3.1-8B Q4_K_M in one wave against aiming at 2,048 warps (gate/up
/// then ran in 1.7 waves, q/k/v in 1.45): batch 1 398-399 tok/s against
/// 381, batch 2 740 against 710, batch 4 1,355 against 1,298, batch 8 1,989
/// against 1,927.
fn tile_split(target: u32, sms: u32, tiles: u32, nsb: u32) -> (u32, u32) {
    let held = sms * TILE_WARPS_PER_SM;
    let tiles = tiles.max(1);
    let per_tile = match target {
        0 => {
            let fit = (held / tiles).max(1);
            1 << fit.ilog2()
        }
        t => t.div_ceil(tiles).next_power_of_two(),
    }
    .min(16)
    .min(nsb.max(1));
    (per_tile, (8 / per_tile).max(1))
}

/// Room for `len` inputs quantized in `order`, with their squares where
/// normed.
fn alloc_x8(dev: &Device, len: usize, order: usize, squares: bool) -> Result<X8> {
    let group = if order == TILE_ORDER { 256 } else { 32 };
    let alloc = |e| device_err("alloc x8", e);
    // SAFETY: all are fully written by the kernel (k % 32 == 0 for blocks,
    // k % 256 == 0 for k-quants; super-blocks take as much as their groups).
    let xq = unsafe { dev.alloc::<u8>(len.max(1)) }.map_err(alloc)?;
    let meta = unsafe { dev.alloc::<u32>(2 * (len / 32).max(1)) }.map_err(alloc)?;
    let squares = squares.then(|| unsafe { dev.alloc::<f32>((len / 32).max(1)) }).transpose().map_err(alloc)?;
    Ok(X8 { xq, meta, squares, group, order })
}

/// Room for the 8-bit input of `w`'s GEMV over x [n, k] (no input norm) for
/// another kernel to write (`X8::target`) in spans of `span` values each;
/// `None` where that matmul reads none (dense weights, or a GEMM) or the
/// spans are not whole units of its order (groups of 32 in place, else
/// super-blocks).
pub fn x8_room(dev: &Device, n: usize, k: usize, w: &CudaWeight, span: usize) -> Result<Option<X8>> {
    match w.storage {
        Storage::Quant(_) if w.cols == k && uses_gemv(dev, n, k, w.storage) => {
            let order = input_order(w);
            let unit = if order == 0 { 32 } else { 256 };
            let whole = span > 0 && span.is_multiple_of(unit) && k.is_multiple_of(span);
            whole.then(|| alloc_x8(dev, n * k, order, false)).transpose()
        }
        _ => Ok(None),
    }
}

/// Room for the normed 8-bit input of the GEMVs of `ws` over one row of k
/// values, for another kernel to write (`X8::normed_target`): `None` unless
/// all of them are tensor-core GEMVs at that size (super-blocks, with
/// squares).
pub fn x8_normed_room(dev: &Device, k: usize, ws: &[&CudaWeight]) -> Result<Option<X8>> {
    let all = ws.iter().all(|w| w.tiled && w.cols == k && uses_gemv(dev, 1, k, w.storage));
    (all && !ws.is_empty() && k.is_multiple_of(256)).then(|| alloc_x8(dev, k, TILE_ORDER, true)).transpose()
}

/// x normed and quantized as the tensor-core GEMVs read it (with its squares).
pub fn x8_tile_normed(dev: &Device, x: &CudaTensor, norm: Norm) -> Result<X8> {
    quantize_x8(dev, x, TILE_ORDER, Some(norm), None)
}

/// Quantizes x for a matmul group `ws` ahead of its GEMVs where they read it
/// in two orders, the tensor-core GEMVs' super-blocks and the dp4a Q5_K
/// GEMV's pieces (Q5_K_M's layers whose value projection is Q6_K, with
/// `FERRITE_CUDA_FIVE_BIT_TILES=0`): both in one launch
/// (`quantize_x8_dual`), a kernel a layer fewer in those layers. Otherwise
/// nothing: each GEMV quantizes its order at its first use.
pub fn quantize_ahead(
    dev: &Device,
    x: &CudaTensor,
    ws: &[&CudaWeight],
    x8: &mut X8Cache,
    norm: Option<Norm>,
) -> Result<()> {
    let (n, k) = (x.rows, x.cols);
    let reads = |o: usize| {
        ws.iter()
            .any(|w| matches!(w.storage, Storage::Quant(_)) && input_order(w) == o && uses_gemv(dev, n, k, w.storage))
    };
    if !dev.dual_x8 || !reads(TILE_ORDER) || !reads(1) || x8[TILE_ORDER].is_some() || x8[1].is_some() {
        return Ok(());
    }
    let len = n * k;
    let mut sb = alloc_x8(dev, len, TILE_ORDER, norm.is_some())?;
    let mut pc = alloc_x8(dev, len, 1, norm.is_some())?;
    let _span = super::profile::span(&dev.stream, "  quantize_x8 (two orders)");
    let (np, _gn) = opt_ptr(dev, norm.map(|n| n.w.f32(dev)).transpose()?);
    let (ssb, _g1) = opt_ptr(dev, sb.squares.as_ref());
    let (spc, _g2) = opt_ptr(dev, pc.squares.as_ref());
    let sb_groups = (len / 256) as u64;
    let mut a = dev.launch("quantize_x8_dual");
    a.arg(x.f32(dev)?).arg(&mut sb.xq).arg(&mut sb.meta).arg(ssb).arg(&mut pc.xq).arg(&mut pc.meta).arg(spc);
    a.arg(sb_groups).arg(np).arg(k as u32);
    // A warp per super-block and per group of 32 (k % 256 == 0: k-quants).
    a.run(elementwise(32 * 9 * len / 256))?;
    drop((_gn, _g1, _g2));
    (x8[TILE_ORDER], x8[1]) = (Some(sb), Some(pc));
    Ok(())
}

/// q/k/v of one input row where q and k are Q4_K (or Q5_K) and v is Q6_K
/// (Q4_K_M's and Q5_K_M's layers with a wider value projection), in one
/// launch (`gemv_q4k_q6k_1`, `gemv_q5k_q6k_1`: blocks of the tensor-core
/// GEMV on q and k's tiles, then on v's Q6_K ones, one input); `None` for
/// any other group (`mixed_qk`).
pub fn gemv_mixed_qkv(
    dev: &Device,
    x: &CudaTensor,
    ws: &[&CudaWeight],
    x8: &mut X8Cache,
    norm: Option<Norm>,
    rkv: Option<&RopeKvArgs>,
) -> Result<Option<Vec<CudaTensor>>> {
    let (n, k) = (x.rows, x.cols);
    let [wq, wk, wv] = ws else { return Ok(None) };
    // (Not in the batch-invariant mode: the tiles' split of k, and so their
    // sums' order, would differ from the batch's separate launches.)
    let Some(stem) = mixed_qk(dev, ws) else { return Ok(None) };
    if dev.deterministic || n != 1 || !ws.iter().all(|w| w.cols == k && uses_gemv(dev, n, k, w.storage)) {
        return Ok(None);
    }
    let q = x8_of(dev, x, x8, TILE_ORDER, norm, None)?;
    let s = &dev.stream;
    let mut out: Vec<CudaSlice<f32>> = ws.iter().map(|w| alloc_out(dev, n, w.rows)).collect::<Result<_>>()?;
    let qk_tiles = (wq.rows.div_ceil(16) + wk.rows.div_ceil(16)) as u32;
    let tiles = qk_tiles + wv.rows.div_ceil(16) as u32;
    let (per_tile, per_block) = tile_split(dev.q4k_warps, dev.sms, tiles, (k / 256) as u32);
    let qk_blocks = qk_tiles.div_ceil(per_block);
    let grid = qk_blocks + (wv.rows.div_ceil(16) as u32).div_ceil(per_block);
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (32 * per_tile, per_block, 1), shared_mem_bytes: 0 };
    let (yp, yg): (Vec<u64>, Vec<_>) = out.iter_mut().map(|y| y.device_ptr_mut(s)).unzip();
    let (wp, wg): (Vec<u64>, Vec<_>) = ws.iter().map(|w| w.data.device_ptr(s)).unzip();
    let ([xp, mp, sp], _gx) = q.source(dev);
    let name = format!("gemv_{stem}_q6k{}_1", if rkv.is_some() { "_rkv" } else { "" });
    let mut a = dev.launch(&name);
    a.arg(wp[0]).arg(wp[1]).arg(wp[2]).arg(yp[0]).arg(yp[1]).arg(yp[2]);
    a.arg(wq.rows as u32).arg(wk.rows as u32).arg(wv.rows as u32);
    a.arg(xp).arg(mp).arg(k as u32).arg(wq.row_bytes()).arg(dev.prefetch).arg(sp);
    a.arg(norm.map_or(0.0, |n| n.eps)).arg(0i32).arg(wv.row_bytes()).arg(qk_blocks);
    if let Some(r) = rkv {
        r.push(&mut a);
    }
    let _span = super::profile::span(s, "  gemv k-quant + q6_k (q/k/v)");
    // Buffers of the sizes given: outputs [1, m], weights and the input as
    // their own launches take them.
    a.run(cfg)?;
    drop((yg, wg, _gx));
    Ok(Some(out.into_iter().zip(ws).map(|(y, w)| CudaTensor::new(y, n, w.rows)).collect()))
}

/// x quantized to 8 bits (with `glu`, act(x) * up; with `norm`, the squares
/// kept for the GEMV to norm by).
fn quantize_x8(
    dev: &Device,
    x: &CudaTensor,
    order: usize,
    norm: Option<Norm>,
    glu: Option<(&CudaTensor, i32)>,
) -> Result<X8> {
    // Super-blocks: a row of k % 256 != 0 values (tiles padded at upload)
    // ends in one part zeros.
    let row = if order == TILE_ORDER { x.cols.next_multiple_of(256) } else { x.cols };
    let len = x.rows * row;
    let mut out = alloc_x8(dev, len, order, norm.is_some())?;
    let groups = (len / out.group) as u64;
    let _span = super::profile::span(&dev.stream, "  quantize_x8");
    let k32 = x.cols as u32;
    let (np, _gn) = opt_ptr(dev, norm.map(|n| n.w.f32(dev)).transpose()?);
    // (Written by the kernel; one stream orders every use.)
    let (sp, _gs) = opt_ptr(dev, out.squares.as_ref());
    let (up, _gu) = opt_ptr(dev, glu.map(|g| g.0.f32(dev)).transpose()?);
    let act = glu.map_or(0, |g| g.1);
    if order == TILE_ORDER {
        // A warp per super-block, a lane per 8 values.
        let mut a = dev.launch("quantize_x8_sb");
        a.arg(x.f32(dev)?).arg(&mut out.xq).arg(&mut out.meta).arg(groups).arg(np).arg(k32).arg(sp);
        a.arg(up).arg(act);
        a.run(elementwise(len / 8))?;
    } else {
        // One lane per value.
        let mut a = dev.launch("quantize_x8");
        let kperm = order as i32;
        a.arg(x.f32(dev)?).arg(&mut out.xq).arg(&mut out.meta).arg(groups).arg(kperm).arg(np).arg(k32).arg(sp);
        a.arg(up).arg(act);
        a.run(elementwise(len))?;
    }
    drop((_gn, _gs, _gu));
    Ok(out)
}

/// The quantized inputs of one matmul group, by `input_order` (made once).
pub type X8Cache = [Option<X8>; 3];

/// x quantized in `order` as `x8` holds it, made there at its first use.
fn x8_of<'a>(
    dev: &Device,
    x: &CudaTensor,
    x8: &'a mut X8Cache,
    order: usize,
    norm: Option<Norm>,
    glu: Option<(&CudaTensor, i32)>,
) -> Result<&'a X8> {
    Ok(match &mut x8[order] {
        Some(q) => q,
        slot => slot.insert(quantize_x8(dev, x, order, norm, glu)?),
    })
}

/// Decode batches: our memory-bound kernels, up to three weights of one
/// storage per launch, input rows in chunks of eight; 16-bit weights take the
/// f32 input as is, blocks take it quantized once per matmul group (`x8`).
/// With `norm` the input is normed (fused, see the module), with
/// `GemvOut::Add` the sums are added to that tensor (one weight; no outputs
/// returned). Each output row's sums run the same way whatever the batch (the
/// batch-invariant mode uses this for every batch size).
pub fn gemv(
    dev: &Device,
    x: &CudaTensor,
    ws: &[&CudaWeight],
    x8: &mut X8Cache,
    norm: Option<Norm>,
    out: GemvOut,
) -> Result<Vec<CudaTensor>> {
    gemv_in(dev, x, ws, x8, norm, None, out, None)
}

/// Whether `gemv_add_glu` takes an MLP's down projection `w` for `n` rows:
/// quantized blocks at GEMV sizes.
pub fn fuses_glu(dev: &Device, n: usize, w: &CudaWeight) -> bool {
    dev.glu_x8 && matches!(w.storage, Storage::Quant(_)) && uses_gemv(dev, n, w.cols, w.storage)
}

/// x += (act(g) * u) · w^T (`fuses_glu`): the gated activation computed as
/// the GEMV's input is quantized (`quantize_x8`), with no kernel of its own.
pub fn gemv_add_glu(
    dev: &Device,
    x: &mut CudaTensor,
    (g, u, act): (&CudaTensor, &CudaTensor, i32),
    w: &CudaWeight,
) -> Result<()> {
    if (g.rows, g.cols) != (u.rows, u.cols) || g.cols != w.cols || (x.rows, x.cols) != (g.rows, w.rows) {
        return Err(Error::Shape(format!(
            "mlp {}: [{}, {}] += glu([{}, {}], [{}, {}]) x [{}, {}]^T",
            w.name, x.rows, x.cols, g.rows, g.cols, u.rows, u.cols, w.rows, w.cols
        )));
    }
    let y = GemvOut::Add(x.f32_mut(dev)?);
    gemv_in(dev, g, &[w], &mut [None, None, None], None, Some((u, act)), y, None)?;
    Ok(())
}

/// `gemv` whose input is, with `glu` (quantized weights only), act(x) * up;
/// with `rkv` (q/k/v of one k-quant in tiles, one row: `rope_tiles`), RoPE
/// and the KV write in the epilogue.
#[allow(clippy::too_many_arguments)]
fn gemv_in(
    dev: &Device,
    x: &CudaTensor,
    ws: &[&CudaWeight],
    x8: &mut X8Cache,
    norm: Option<Norm>,
    glu: Option<(&CudaTensor, i32)>,
    out: GemvOut,
    rkv: Option<&RopeKvArgs>,
) -> Result<Vec<CudaTensor>> {
    let (n, k) = (x.rows, x.cols);
    let s = &dev.stream;
    let add_flag = matches!(out, GemvOut::Add(_)) as i32;
    let mut fresh = Vec::new();
    let targets: Vec<&mut CudaSlice<f32>> = match out {
        GemvOut::New => {
            fresh = ws.iter().map(|w| alloc_out(dev, n, w.rows)).collect::<Result<Vec<_>>>()?;
            fresh.iter_mut().collect()
        }
        GemvOut::Add(y) if ws.len() == 1 => vec![y],
        GemvOut::Add(_) => return Err(Error::Shape("matmul_add: one weight at a time".into())),
    };
    // Unused slots repeat the first weight with zero rows.
    let mut wp = [0u64; 3];
    let mut yp = [0u64; 3];
    let mut m = [0u32; 3];
    let mut guards = Vec::new();
    for (i, (w, y)) in ws.iter().zip(targets).enumerate() {
        let (p, g) = w.data.device_ptr(s);
        let (q, h) = y.device_ptr_mut(s);
        (wp[i], yp[i], m[i]) = (p, q, w.rows as u32);
        guards.extend([g, h]);
    }
    for i in ws.len()..3 {
        (wp[i], yp[i]) = (wp[0], yp[0]);
    }
    let rows: u32 = m.iter().sum();
    let k32 = k as u32;
    let eps = norm.map_or(0.0, |n| n.eps);
    // Blocks: the input quantized to 8 bits (`input_order`), with each
    // group's scale and sums (kernels/quant.cu).
    let quant = match ws[0].storage {
        Storage::Quant(_) => Some(x8_of(dev, x, x8, input_order(ws[0]), norm, glu)?),
        _ if glu.is_some() => return Err(Error::Shape("gemv: a gated input needs quantized weights".into())),
        _ => None,
    };
    // No launch without rows: a grid in which no thread waits for the kernel
    // before it (pdl_wait) would break the order the kernels after it rely on.
    let n_launched = if rows == 0 { 0 } else { n };
    // 16-bit weights take a norm only folded in (`folds_norm`).
    let dense_norm = quant.is_none() && norm.is_some();
    if dense_norm && !folds_norm(dev, x, ws) {
        return Err(Error::Shape(format!("gemv {}: a norm not folded into the 16-bit weights", ws[0].name)));
    }
    let tiles = ws[0].tiled;
    if tiles && ws[0].rows == 0 {
        return Err(Error::Shape(format!("gemv {}: no rows", ws[0].name)));
    }
    if rkv.is_some() && !(rope_tiles(ws[0]) && n == 1 && ws.len() == 3) {
        return Err(Error::Shape(format!(
            "gemv {}: RoPE in the epilogue needs q/k/v of one k-quant in tiles, one row",
            ws[0].name
        )));
    }
    for r0 in (0..n_launched).step_by(8) {
        let nc = (n - r0).min(8);
        let name = match (dense_norm, rkv) {
            (_, Some(_)) => format!("gemv_{}_rkv_1", tile_stem(ws[0].storage)),
            (true, None) => gemv_name(ws[0].storage, nc).replacen("gemv_", "gemv_norm_", 1),
            // A lone row of tiles sums its blocks in another order than a
            // batch's rows (kernels/gemv_tile.cu `q4k_step_bd`,
            // `q6k_step_bd`): in the batch-invariant mode, as a batch's.
            (false, None) if dev.deterministic && nc == 1 && tiles => {
                format!("gemv_{}_whole_1", tile_stem(ws[0].storage))
            }
            (false, None) if tiles => format!("gemv_{}_{nc}", tile_stem(ws[0].storage)),
            (false, None) => gemv_name(ws[0].storage, nc),
        };
        let cfg = if tiles {
            // Tiles of 16 rows, `tile_split` warps each.
            let tiles: u32 = m.iter().map(|r| r.div_ceil(16)).sum();
            let (per_tile, per_block) = tile_split(dev.q4k_warps, dev.sms, tiles, k32.div_ceil(256));
            let grid = (tiles.div_ceil(per_block), 1, 1);
            LaunchConfig { grid_dim: grid, block_dim: (32 * per_tile, per_block, 1), shared_mem_bytes: 0 }
        } else {
            // Eight warps per block, each on `gemv_rows_per_warp` weight rows.
            let warps = rows.div_ceil(gemv_rows_per_warp(ws[0].storage, nc));
            LaunchConfig { grid_dim: (warps.div_ceil(8).max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
        };
        let y: [u64; 3] = std::array::from_fn(|i| yp[i] + (r0 * m[i] as usize * 4) as u64);
        let mut a = dev.launch(&name);
        a.arg(wp[0]).arg(wp[1]).arg(wp[2]).arg(y[0]).arg(y[1]).arg(y[2]);
        a.arg(m[0]).arg(m[1]).arg(m[2]);
        let _g;
        match &quant {
            Some(q) => {
                let (xp, g1) = q.xq.device_ptr(s);
                let (mp, g2) = q.meta.device_ptr(s);
                let (sp, g3) = opt_ptr(dev, q.squares.as_ref());
                let (sq_row, meta_row, xq_row) = q.row_bytes(k);
                let sp = if sp == 0 { 0 } else { sp + (r0 * sq_row) as u64 };
                _g = (g1, Some(g2), g3);
                let row_bytes = ws[0].row_bytes();
                a.arg(xp + (r0 * xq_row) as u64).arg(mp + (r0 * meta_row) as u64).arg(k32).arg(row_bytes);
                a.arg(dev.prefetch).arg(sp).arg(eps).arg(add_flag);
                if let Some(r) = rkv {
                    r.push(&mut a);
                }
            }
            None => {
                let (xp, g1) = x.f32(dev)?.device_ptr(s);
                _g = (g1, None, None);
                a.arg(xp + (r0 * k * 4) as u64).arg(k32).arg(add_flag).arg(eps);
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
    Ok(fresh.into_iter().zip(ws).map(|(buf, w)| CudaTensor::new(buf, n, w.rows)).collect())
}

#[cfg(test)]
mod tests {
    use super::tile_split;

    #[test]
    fn tile_split_fills_one_wave() {
        // 132 SMs hold 2,112 warps: Llama-3.1-8B's gate/up (1,792 tiles),
        // q/k/v (384), output (256) and a small model's 64 tiles of k = 512.
        assert_eq!(tile_split(0, 132, 1792, 16), (1, 8));
        assert_eq!(tile_split(0, 132, 384, 16), (4, 2));
        assert_eq!(tile_split(0, 132, 256, 56), (8, 1));
        assert_eq!(tile_split(0, 132, 64, 2), (2, 4));
        assert_eq!(tile_split(0, 132, 5000, 16), (1, 8));
        // A target: about that many warps.
        assert_eq!(tile_split(2048, 132, 1792, 16), (2, 4));
        assert_eq!(tile_split(4096, 132, 384, 16), (16, 1));
    }
}
