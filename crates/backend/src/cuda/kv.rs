//! The paged KV pool on the GPU, KV writes and attention.
//!
//! K and V are stored row-major per slot, `[slot][kv_dim]`, in f16 (as
//! llama.cpp's default cache) or f32. Per-batch metadata (row ranges, block
//! tables, slots) is the same for every layer of a step; `MetaCache` uploads
//! each distinct array once and reuses it.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use ferrite_core::{Error, Result};

use super::device::{device_err, per_row, Device};
use super::gemv::X8;
use super::graph::{Field, StepInputs, Words};
use super::tensor::HalfOut;
use super::{CudaTensor, Storage};
use crate::{AttnBatch, AttnParams, KvDtype, KvSpec};

pub enum KvBuf {
    F32(CudaSlice<f32>),
    F16(CudaSlice<u16>),
}

/// A borrowed K or V buffer: a cache layer or an encoder's K/V tensor.
#[derive(Clone, Copy)]
pub enum KvRef<'a> {
    F32(&'a CudaSlice<f32>),
    F16(&'a CudaSlice<u16>),
}

impl KvBuf {
    pub fn as_ref(&self) -> KvRef<'_> {
        match self {
            KvBuf::F32(b) => KvRef::F32(b),
            KvBuf::F16(b) => KvRef::F16(b),
        }
    }
}

pub struct CudaKvPool {
    pub k: Vec<KvBuf>,
    pub v: Vec<KvBuf>,
    pub kv_dim: usize,
    pub block_size: usize,
    pub slots: usize,
}

impl CudaKvPool {
    pub fn new(dev: &Device, spec: KvSpec) -> Result<CudaKvPool> {
        let slots = spec.n_blocks * spec.block_size;
        let len =
            slots.checked_mul(spec.kv_dim).ok_or_else(|| Error::InvalidInput("KV cache size overflows".into()))?;
        let elem = if spec.dtype == KvDtype::F16 { 2 } else { 4 };
        let need = len as f64 * elem as f64 * 2.0 * spec.n_layers as f64;
        let (free, _) = dev.memory()?;
        if need > free as f64 {
            return Err(Error::InvalidInput(format!(
                "a KV cache of {slots} tokens needs {:.2} GB; the GPU has {:.2} GB free",
                need / 1e9,
                free as f64 / 1e9
            )));
        }
        let alloc = || -> Result<KvBuf> {
            let s = &dev.stream;
            Ok(match spec.dtype {
                KvDtype::F16 => KvBuf::F16(s.alloc_zeros::<u16>(len).map_err(|e| device_err("KV cache", e))?),
                KvDtype::F32 => KvBuf::F32(s.alloc_zeros::<f32>(len).map_err(|e| device_err("KV cache", e))?),
            })
        };
        let mut k = Vec::with_capacity(spec.n_layers);
        let mut v = Vec::with_capacity(spec.n_layers);
        for _ in 0..spec.n_layers {
            k.push(alloc()?);
            v.push(alloc()?);
        }
        Ok(CudaKvPool { k, v, kv_dim: spec.kv_dim, block_size: spec.block_size, slots })
    }
}

/// A host array and its device copy.
type MetaEntry = (Vec<u32>, Arc<CudaSlice<u32>>);

/// Device copies of the last few metadata arrays, matched by content, and of
/// every constant array (kept for good: graph captures may not upload).
#[derive(Default)]
pub struct MetaCache {
    entries: Mutex<Vec<MetaEntry>>,
    constants: Mutex<Vec<MetaEntry>>,
}

impl MetaCache {
    const CAPACITY: usize = 8;

    pub fn get(&self, dev: &Device, host: Vec<u32>) -> Result<Arc<CudaSlice<u32>>> {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = e.iter().position(|(h, _)| *h == host) {
            let hit = e.remove(i);
            let buf = hit.1.clone();
            e.push(hit);
            return Ok(buf);
        }
        // A zero-length allocation is not allowed: an empty array uploads one 0.
        let data: &[u32] = if host.is_empty() { &[0] } else { &host };
        let buf = Arc::new(dev.stream.clone_htod(data).map_err(|e| device_err("uploading metadata", e))?);
        if e.len() == Self::CAPACITY {
            e.remove(0);
        }
        e.push((host, buf.clone()));
        Ok(buf)
    }

    /// A constant array (RoPE frequencies): uploaded once, kept. While a step
    /// is captured (`capturing`) nothing may be uploaded, so a miss is an error.
    pub fn constant(&self, dev: &Device, host: Vec<u32>, capturing: bool) -> Result<Arc<CudaSlice<u32>>> {
        let mut c = self.constants.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, buf)) = c.iter().find(|(h, _)| *h == host) {
            return Ok(buf.clone());
        }
        if capturing {
            return Err(Error::Device("a constant was first uploaded during a graph capture".into()));
        }
        let buf = Arc::new(dev.stream.clone_htod(&host).map_err(|e| device_err("uploading constants", e))?);
        c.push((host, buf.clone()));
        Ok(buf)
    }
}

/// Where an op's metadata comes from: uploaded now (cached by content), or a
/// captured decode step's inputs.
pub enum Source<'a> {
    Upload(&'a MetaCache),
    Step(StepInputs),
}

pub fn write_kv(
    dev: &Device,
    src: &Source,
    pool: &mut CudaKvPool,
    layer: usize,
    k: &CudaTensor,
    v: &CudaTensor,
    batch: &AttnBatch,
) -> Result<()> {
    check_write(pool, layer, k, v, batch)?;
    let (d, n) = (pool.kv_dim, batch.slots.len());
    if n == 0 {
        return Ok(());
    }
    let slots = match src {
        Source::Step(step) => step.words(Field::Slots),
        Source::Upload(meta) => Words::all(meta.get(dev, batch.slots.iter().map(|&s| s as u32).collect())?),
    };
    let slots = slots.view();
    let kv_dim = d as u32;
    let cfg = per_row(n, d);
    macro_rules! go {
        ($f:literal, $kc:expr, $vc:expr) => {{
            // Slots were checked.
            dev.launch($f).arg(k.f32(dev)?).arg(v.f32(dev)?).arg(&slots).arg($kc).arg($vc).arg(&kv_dim).run(cfg)
        }};
    }
    let r = match (&mut pool.k[layer], &mut pool.v[layer]) {
        (KvBuf::F16(kc), KvBuf::F16(vc)) => go!("write_kv_f16", kc, vc),
        (KvBuf::F32(kc), KvBuf::F32(vc)) => go!("write_kv_f32", kc, vc),
        _ => unreachable!("K and V share a dtype"),
    };
    r
}

/// Checks that k and v [n, kv_dim] fit layer `layer` of the pool and that
/// every slot lies in it.
pub fn check_write(pool: &CudaKvPool, layer: usize, k: &CudaTensor, v: &CudaTensor, batch: &AttnBatch) -> Result<()> {
    let d = pool.kv_dim;
    let n = batch.slots.len();
    if k.cols != d || v.cols != d || k.rows != n || v.rows != n || layer >= pool.k.len() {
        return Err(Error::Shape(format!("write_kv: {n} slots for [{}, {}] values", k.rows, k.cols)));
    }
    check_slots(pool, batch)
}

/// Checks that every slot of `batch` is in the pool.
pub fn check_slots(pool: &CudaKvPool, batch: &AttnBatch) -> Result<()> {
    match batch.slots.iter().find(|&&s| s >= pool.slots) {
        Some(s) => Err(Error::Shape(format!("KV slot {s} outside the pool ({} slots)", pool.slots))),
        None => Ok(()),
    }
}

/// Per row (lo, hi, table offset), then every sequence's block table: one
/// array, one upload. Also returns each sequence's (first row, rows).
pub fn paged_meta(batch: &AttnBatch, n: usize) -> (Vec<u32>, Vec<(usize, usize)>) {
    let mut meta = vec![0u32; 3 * n];
    let mut tables = Vec::new();
    let mut spans = Vec::new();
    for s in &batch.seqs {
        let off = tables.len() as u32;
        tables.extend_from_slice(&s.block_table[..s.ctx_len.div_ceil(batch.block_size)]);
        for r in 0..s.q_len {
            let pos = s.ctx_len - s.q_len + r;
            let row = s.q_start + r;
            meta[3 * row..3 * row + 3].copy_from_slice(&[0, pos as u32 + 1, off]);
        }
        spans.push((s.q_start, s.q_len));
    }
    meta.extend(tables);
    (meta, spans)
}

/// Sequences with at least this many new rows go to the tensor-core kernel.
const FLASH_MIN_ROWS: usize = 16;
/// Query rows per flash block (kernels/attention.cu FA_ROWS).
const FLASH_ROWS: usize = 64;

/// Flash tiles (first row, rows; flattened) for sequences with enough new
/// rows when `flash`, and the rows left to the row kernel: every row once.
/// The tiles that see the most keys (`meta`: each row's lo, hi) come first,
/// so that the blocks that run last are short ones (in causal prefill a
/// sequence's last tile sees all its keys, its first tile 64).
fn partition(meta: &[u32], spans: &[(usize, usize)], flash: bool) -> (Vec<u32>, Vec<u32>) {
    let (mut tiles, mut rows) = (Vec::new(), Vec::new());
    for &(start, len) in spans {
        if flash && len >= FLASH_MIN_ROWS {
            for t in (0..len).step_by(FLASH_ROWS) {
                tiles.push([(start + t) as u32, (len - t).min(FLASH_ROWS) as u32]);
            }
        } else {
            rows.extend((start..start + len).map(|r| r as u32));
        }
    }
    // Keys up to the tile's last row's end, from its first row's start.
    let keys = |&[r0, n]: &[u32; 2]| meta[3 * (r0 + n - 1) as usize + 1].saturating_sub(meta[3 * r0 as usize]);
    tiles.sort_by_key(|t| std::cmp::Reverse(keys(t)));
    (tiles.concat(), rows)
}

/// Keys per split-K block, at least (whole warp tiles of the row kernel);
/// each row's keys are shared out over the splits in multiples of this.
const SPLIT_KEYS: u32 = 128;
/// Row-kernel blocks that fill the GPU about twice over.
const BUSY_BLOCKS: usize = 264;
/// (row, KV head) blocks of a split launch at most: fewer than half the
/// busy blocks (`busy_splits`); the size of `Device::split_done`.
pub const SPLIT_BLOCKS: usize = BUSY_BLOCKS / 2;

/// Splits of the row kernel that keep the GPU busy with `rows` rows of
/// `n_kv_heads` heads (1: no split), whatever their lengths.
pub fn busy_splits(rows: usize, n_kv_heads: usize) -> u32 {
    let blocks = rows * n_kv_heads;
    if blocks == 0 || blocks >= BUSY_BLOCKS / 2 {
        return 1;
    }
    // At most 64: kernels/attention.cu MAX_SPLITS.
    (BUSY_BLOCKS / blocks).clamp(1, 64) as u32
}

/// Splits of the row kernel for these rows: few rows with long contexts get
/// their keys split so that the GPU is busy.
fn split_count(meta: &[u32], rows: &[u32], window: Option<usize>, n_kv_heads: usize) -> u32 {
    let span = |r: usize| {
        let (lo, hi) = (meta[3 * r] as usize, meta[3 * r + 1] as usize);
        let lo = window.map_or(lo, |w| lo.max(hi.saturating_sub(w)));
        hi - lo
    };
    let longest = rows.iter().map(|&r| span(r as usize)).max().unwrap_or(0);
    let splits = busy_splits(rows.len(), n_kv_heads);
    splits.min((longest / (2 * SPLIT_KEYS as usize)) as u32).max(1)
}

/// One attention call: q, K and V, and the metadata of `paged_meta` (or the
/// encoder's), with each sequence's span of rows.
pub struct AttnLaunch<'a> {
    pub q: &'a CudaTensor,
    pub k: KvRef<'a>,
    pub v: KvRef<'a>,
    /// (lo, hi, table offset) per row, then the block tables.
    pub meta: Vec<u32>,
    pub spans: Vec<(usize, usize)>,
    pub bs: usize,
    pub window: Option<usize>,
}

/// An attention call's metadata on the device, and how its kernels split it.
struct AttnWords {
    meta: Words,
    tables: Words,
    /// Flash tiles (first row, rows: two words each), and the rows left to
    /// the row kernel.
    tiles: Words,
    rows: Words,
    nsplit: u32,
    /// The flash kernel and its shared memory (`flash_kernel`).
    flash: Option<(&'static str, u32)>,
}

/// The flash kernels (kernels/attention.cu): name, head size, keys staged a
/// barrier; the wgmma ones (`flash_wg_*`) run on sm_90a alone.
pub const FLASH_KERNELS: [(&str, usize, usize); 4] =
    [("flash_f16_64", 64, 32), ("flash_f16_128", 128, 32), ("flash_wg_64", 64, 32), ("flash_wg_128", 128, 32)];

/// Dynamic shared memory of a flash kernel: two buffers of K and V tiles of
/// `keys` keys, rows padded by 8 values.
pub fn flash_smem(hd: usize, keys: usize) -> u32 {
    (2 * 2 * keys * (hd + 8) * 2) as u32
}

/// The flash kernel for f16 caches of heads of `hd`: its name and shared
/// memory (none in the batch-invariant mode, whose rows must not depend on
/// the batch).
fn flash_kernel(dev: &Device, k: KvRef, hd: usize) -> Option<(&'static str, u32)> {
    if dev.deterministic || !matches!(k, KvRef::F16(_)) {
        return None;
    }
    // wgmma: Hopper's own target alone (`Device::open` compiles for it on 9.0).
    let wg = dev.arch == "sm_90a" && ferrite_core::env::cuda_flash_wg();
    let prefix = if wg { "flash_wg_" } else { "flash_f16_" };
    FLASH_KERNELS.iter().find(|f| f.1 == hd && f.0.starts_with(prefix)).map(|f| (f.0, flash_smem(hd, f.2)))
}

/// The tensor-core row kernels (kernels/attention_rows_mma.cu
/// `attention_rows_mma_*`) by head size.
pub const ROWS_MMA: [(usize, &str); 2] = [(64, "attention_rows_mma_64"), (128, "attention_rows_mma_128")];

/// The tensor-core row kernel for f16 caches of these heads, if one serves
/// (kernels/attention_rows_mma.cu RM_HEADS: up to 8 query heads per KV head).
fn rows_mma_kernel(p: &AttnParams) -> Option<&'static str> {
    if p.n_heads / p.n_kv_heads > 8 || !ferrite_core::env::cuda_rows_mma() {
        return None;
    }
    ROWS_MMA.iter().find(|(hd, _)| *hd == p.head_dim).map(|(_, f)| *f)
}

/// Dynamic shared memory of the tensor-core row kernel for heads of `hd`:
/// each of its 4 warps has a ring of three K or V tiles of 16 keys (rows
/// padded by 8 values), later reused for the warps' outputs (8 heads, f32).
/// At hd 128, four blocks fit an SM (Llama 3 8B at 64 streams: 512 blocks,
/// one wave; two buffers of K and V, three blocks an SM, took 1.3 waves).
pub fn rows_mma_smem(hd: usize) -> u32 {
    let tiles = 4 * 3 * 16 * (hd + 8) * 2;
    tiles.max(4 * 8 * hd * 4) as u32
}

/// Uploads the metadata of `a` (one array: meta | tables | tiles | rows).
fn upload_words(dev: &Device, cache: &MetaCache, a: &mut AttnLaunch, p: &AttnParams) -> Result<AttnWords> {
    let n = a.q.rows;
    let flash = flash_kernel(dev, a.k, p.head_dim);
    let (tiles, rows) = partition(&a.meta, &a.spans, flash.is_some());
    let nsplit = if dev.deterministic { 1 } else { split_count(&a.meta, &rows, a.window, p.n_kv_heads) };
    let n_meta = a.meta.len();
    let (n_tiles, n_rows) = (tiles.len() / 2, rows.len());
    let mut host = std::mem::take(&mut a.meta);
    host.extend(&tiles);
    host.extend(&rows);
    let buf = cache.get(dev, host)?;
    let part = |range: std::ops::Range<usize>| Words::part(buf.clone(), range);
    Ok(AttnWords {
        meta: part(0..3 * n),
        tables: part(3 * n..n_meta.max(3 * n + 1)),
        tiles: part(n_meta..n_meta + 2 * n_tiles),
        rows: part(n_meta + 2 * n_tiles..n_meta + 2 * n_tiles + n_rows),
        nsplit,
        flash,
    })
}

pub fn launch_attention(
    dev: &Device,
    cache: &MetaCache,
    mut a: AttnLaunch,
    p: &AttnParams,
    half: HalfOut,
    x8: Option<&mut X8>,
) -> Result<(CudaTensor, bool)> {
    if a.q.rows == 0 {
        // SAFETY: nothing is read from an empty tensor.
        let out = unsafe { dev.alloc::<f32>(1) }.map_err(|e| device_err("alloc", e))?;
        return Ok((CudaTensor::new(out, 0, a.q.cols), false));
    }
    let w = upload_words(dev, cache, &mut a, p)?;
    run_kernels(dev, &a, &w, p, half, x8)
}

/// The flash kernel over the tiles and the row kernel (split or not) over the
/// rows; both write `half`, the output's 16-bit copy, where given. With
/// `half.only` and no rows for the row kernel, the flash kernel writes that
/// copy alone. Where every row is the row kernel's, it also writes `x8`, the
/// output quantized for the output projection's GEMV (each block its query
/// heads: whole groups, as `gemv::x8_room` made sure), and says so.
fn run_kernels(
    dev: &Device,
    a: &AttnLaunch,
    w: &AttnWords,
    p: &AttnParams,
    half: HalfOut,
    x8: Option<&mut X8>,
) -> Result<(CudaTensor, bool)> {
    let n = a.q.rows;
    let hd = p.head_dim;
    let s = &dev.stream;
    let (meta, tables) = (w.meta.view(), w.tables.view());
    let (tiles_v, rows_v) = (w.tiles.view(), w.rows.view());
    let (nh, nkv, hd32, bs) = (p.n_heads as u32, p.n_kv_heads as u32, hd as u32, a.bs as u32);
    let window = a.window.unwrap_or(0) as u32;
    let softcap = p.softcap.unwrap_or(0.0);
    let (n_tiles, n_rows) = (w.tiles.len() / 2, w.rows.len());
    let x8 = x8.filter(|_| n_tiles == 0);
    let quantized = x8.is_some();
    let (x8p, x8o, _x8g) = match x8 {
        Some(x8) => {
            let (ptrs, order, guards) = x8.target(s);
            (ptrs, order, Some(guards))
        }
        None => ([0, 0], 0, None),
    };
    let HalfOut { mut half, only } = half;
    // Every row of every head is written by one of the two kernels; the row
    // kernel always writes f32.
    let (out, out_p) = super::tensor::f32_output(dev, n * a.q.cols, &half, only && n_rows == 0)?;
    let (hp, bf16) = super::half_args(s, &mut half);
    // q's f32 values, or for the flash kernel alone its bf16 copy where
    // only that holds them (`qh`).
    let (q_p, qh_p) = match a.q.half() {
        Some((Storage::Bf16, h)) if a.q.is_half_only() && n_rows == 0 => (0, h.device_ptr(s).0),
        _ => (a.q.f32(dev)?.device_ptr(s).0, 0),
    };
    macro_rules! go {
        ($f:expr, $cfg:expr, $k:expr, $v:expr, $list:expr, $with_hd:expr $(, $extra:expr)*) => {{
            let mut b = dev.launch($f);
            b.arg(&q_p).arg($k).arg($v).arg(&out_p).arg(&meta).arg(&tables).arg($list).arg(&nh).arg(&nkv);
            if $with_hd {
                b.arg(&hd32);
            }
            b.arg(&bs).arg(&window).arg(&p.scale).arg(&softcap);
            $( b.arg($extra); )*
            // Metadata was validated.
            b.run($cfg)
        }};
    }
    if n_tiles > 0 {
        let (f, smem) = w.flash.expect("tiles only with a flash kernel");
        // A block per (tile, head), the heads of a tile adjacent.
        let blocks = n_tiles as u32 * nh;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem };
        match (a.k, a.v) {
            (KvRef::F16(k), KvRef::F16(v)) => go!(f, cfg, k, v, &tiles_v, false, &hp, &bf16, &qh_p)?,
            _ => unreachable!("flash kernels read f16 caches"),
        }
    }
    if n_rows > 0 {
        let nsplit = w.nsplit;
        let split = if nsplit > 1 { SPLIT_KEYS } else { 0 };
        let cfg = LaunchConfig { grid_dim: (n_rows as u32, nkv, nsplit), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: with splits, every partial is written before the last split reads it.
        let mut part =
            unsafe { dev.alloc::<f32>(if nsplit > 1 { n_rows * p.n_heads * nsplit as usize * (hd + 2) } else { 1 }) }
                .map_err(|e| device_err("alloc", e))?;
        // With splits, the last of each (row, KV head)'s blocks merges them,
        // counting in the device's `split_done` (zero between launches).
        if nsplit > 1 && n_rows * p.n_kv_heads > SPLIT_BLOCKS {
            return Err(Error::Shape(format!("{n_rows} rows of {} KV heads in {nsplit} splits", p.n_kv_heads)));
        }
        // (Written by the kernel's atomics; one stream orders every use.)
        let done = &dev.split_done;
        // The small instance: heads of up to 128, up to 4 query heads per KV head.
        let small = hd <= 128 && p.n_heads / p.n_kv_heads <= 4;
        match (a.k, a.v, rows_mma_kernel(p)) {
            (KvRef::F16(k), KvRef::F16(v), Some(f)) => {
                let cfg = LaunchConfig { shared_mem_bytes: rows_mma_smem(hd), ..cfg };
                // (Where the output projection is a quantized GEMV, which
                // loads its weights before its wait; bf16 8B measured -0.7%.)
                let late = (dev.attn_late_trigger && quantized) as i32;
                go!(f, cfg, k, v, &rows_v, true, &split, &mut part, done, &hp, &bf16, &x8p[0], &x8p[1], &x8o, &late)?
            }
            (KvRef::F16(k), KvRef::F16(v), None) => {
                let f = if small { "attention_rows_f16_small" } else { "attention_rows_f16" };
                go!(f, cfg, k, v, &rows_v, true, &split, &mut part, done, &hp, &bf16, &x8p[0], &x8p[1], &x8o)?
            }
            (KvRef::F32(k), KvRef::F32(v), _) => {
                let f = if small { "attention_rows_f32_small" } else { "attention_rows_f32" };
                go!(f, cfg, k, v, &rows_v, true, &split, &mut part, done, &hp, &bf16, &x8p[0], &x8p[1], &x8o)?
            }
            _ => unreachable!("K and V share a dtype"),
        }
    }
    Ok((super::tensor::output(out, n, a.q.cols, half)?, quantized))
}

/// Paged attention of `q` over one layer of the pool (`kv`: the pool and
/// the layer), writing the output's 16-bit copy into `half` where given,
/// and its quantized copy into `x8` where the row kernel can (`run_kernels`;
/// true where it did).
/// While a decode step is captured (`Source::Step`), the metadata is the
/// step's inputs and the row kernel's splits depend on the shapes only, so
/// that replays may change them.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    dev: &Device,
    src: &Source,
    q: &CudaTensor,
    (pool, layer): (&CudaKvPool, usize),
    batch: &AttnBatch,
    p: &AttnParams,
    half: HalfOut,
    x8: Option<&mut X8>,
) -> Result<(CudaTensor, bool)> {
    check_shapes(q, p, pool.kv_dim)?;
    if layer >= pool.k.len() {
        return Err(Error::Shape(format!("layer {layer} of a {}-layer KV pool", pool.k.len())));
    }
    batch.validate(q.rows, pool.slots / pool.block_size, pool.block_size)?;
    let mut a = AttnLaunch {
        q,
        k: pool.k[layer].as_ref(),
        v: pool.v[layer].as_ref(),
        meta: Vec::new(),
        spans: Vec::new(),
        bs: pool.block_size,
        window: p.window,
    };
    match src {
        Source::Step(step) => {
            let n = q.rows;
            let w = AttnWords {
                meta: step.words(Field::AttnMeta),
                tables: step.words(Field::Tables),
                tiles: step.words(Field::Rows).none(),
                rows: step.words(Field::Rows),
                nsplit: if dev.deterministic { 1 } else { busy_splits(n, p.n_kv_heads) },
                flash: None,
            };
            run_kernels(dev, &a, &w, p, half, x8)
        }
        Source::Upload(meta) => {
            (a.meta, a.spans) = paged_meta(batch, q.rows);
            launch_attention(dev, meta, a, p, half, x8)
        }
    }
}

pub fn check_shapes(q: &CudaTensor, p: &AttnParams, kv_dim: usize) -> Result<()> {
    if q.cols != p.n_heads * p.head_dim
        || p.n_kv_heads == 0
        || p.n_kv_heads * p.head_dim != kv_dim
        || !p.n_heads.is_multiple_of(p.n_kv_heads)
        || p.head_dim > 256
        || !p.head_dim.is_multiple_of(8)
        || p.n_heads / p.n_kv_heads > 8
    {
        return Err(Error::Shape(
            "attention: q or KV shapes do not match the layer (on CUDA: head_dim a multiple of 8 up to 256, at most 8 query heads per KV head)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqSlice;

    #[test]
    fn every_row_goes_to_exactly_one_kernel() {
        let spans = [(0, 150), (150, 1), (151, 15), (166, 16), (182, 64)];
        // Each sequence's rows see its keys up to their own.
        let meta: Vec<u32> = spans.iter().flat_map(|&(_, n)| (0..n).flat_map(|r| [0, r as u32 + 1, 0])).collect();
        for flash in [false, true] {
            let (tiles, rows) = partition(&meta, &spans, flash);
            let mut seen = vec![0; 246];
            let mut last_keys = u32::MAX;
            for t in tiles.chunks(2) {
                assert!(t[1] as usize <= FLASH_ROWS && t[1] > 0);
                (t[0]..t[0] + t[1]).for_each(|r| seen[r as usize] += 1);
                // The tiles with the most keys first.
                let keys = meta[3 * (t[0] + t[1] - 1) as usize + 1];
                assert!(keys <= last_keys);
                last_keys = keys;
            }
            rows.iter().for_each(|&r| seen[r as usize] += 1);
            assert!(seen.iter().all(|&c| c == 1), "flash={flash}");
            // Short sequences (decode rows, 15-row prompts) take the row kernel.
            assert_eq!(rows.len(), if flash { 16 } else { 246 });
        }
    }

    #[test]
    fn splits_fill_the_gpu_only_when_rows_are_few_and_long() {
        // Decode graphs: by shape alone, at most MAX_SPLITS (64).
        assert_eq!(busy_splits(1, 8), 33);
        assert_eq!(busy_splits(1, 1), 64);
        assert_eq!(busy_splits(64, 8), 1);
        // Eager: no split below 2 x SPLIT_KEYS keys, then one per 256 keys at most.
        let meta = |ctx: u32| vec![0, ctx, 0];
        assert_eq!(split_count(&meta(300), &[0], None, 8), 1);
        assert_eq!(split_count(&meta(1024), &[0], None, 8), 4);
        assert_eq!(split_count(&meta(100_000), &[0], None, 8), 33);
        // A sliding window bounds the keys a row sees.
        assert_eq!(split_count(&meta(100_000), &[0], Some(512), 8), 2);
        // Every split launch fits the device's split counters.
        for rows in 1..300 {
            for kv_heads in 1..=64 {
                if busy_splits(rows, kv_heads) > 1 {
                    assert!(rows * kv_heads <= SPLIT_BLOCKS, "{rows} rows x {kv_heads} KV heads");
                }
            }
        }
    }

    #[test]
    fn metadata_rows_see_their_causal_prefix() {
        let batch = AttnBatch {
            seqs: vec![
                SeqSlice { q_start: 0, q_len: 3, ctx_len: 5, block_table: vec![7] },
                SeqSlice { q_start: 3, q_len: 1, ctx_len: 20, block_table: vec![2, 4, 9] },
            ],
            block_size: 8,
            slots: vec![0; 4],
        };
        let (meta, spans) = paged_meta(&batch, 4);
        // (lo, hi, table offset) per row, then the tables (blocks in use only).
        assert_eq!(&meta[..12], &[0, 3, 0, 0, 4, 0, 0, 5, 0, 0, 20, 1]);
        assert_eq!(&meta[12..], &[7, 2, 4, 9]);
        assert_eq!(spans, vec![(0, 3), (3, 1)]);
    }
}
