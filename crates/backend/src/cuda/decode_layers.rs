//! Every layer of a one-row decode step in one persistent kernel
//! (kernels/decode_layers.cu): a block an SM, one warp streaming the weights
//! into shared memory through the waits between the layers' stages. For
//! Llama-shaped models whose matrices are all Q4_K or Q6_K tiles (Q4_K_M);
//! `FERRITE_CUDA_PERSISTENT=1` turns it on (off by default until measured,
//! docs/cuda-journal.md), `FERRITE_CUDA_PERSISTENT_WARPS` (8 or 16
//! computing warps a block) and `FERRITE_CUDA_PERSISTENT_RING` (2-5 slots)
//! shape it, `FERRITE_CUDA_PERSISTENT_LAYERS=<n>` limits it to a step's
//! first n layers. Anything else runs the layers op by op.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig};
use ferrite_core::{DType, Error, Result};

use super::decode_window::{self, Plan};
use super::device::{device_err, Device};
use super::graph::Field;
use super::kv::{self, CudaKvPool, KvBuf};
use super::{act_code, CudaBackend, CudaTensor, CudaWeight, Storage};
use crate::{AttnBatch, PlainLayer};

/// Bytes of a ring slot, the most slots, the longest input a stage
/// quantizes, the most computing warps (kernels/decode_layers.cu DL_SLOT,
/// DL_MAX_RING, DL_MAX_K, DL_MAX_WARPS).
const SLOT: usize = 36_864;
pub const MAX_RING: usize = 5;
const MAX_K: usize = 16_384;
const MAX_WARPS: usize = 16;
/// Stages a layer (DL_STAGES), whose arrivals the kernel counts.
const STAGES: usize = 5;
/// Attention's parts of the context per KV head at most.
const MAX_PARTS: usize = 32;
/// The kernel's counters (`n_layers x (STAGES + n_kv)` of them) at most.
const COUNT_WORDS: usize = 8192;

/// The kernel's dynamic shared memory with `ring` slots (its `dl_layout`):
/// barriers, the ring, the 8-bit input and its metadata and sums of
/// squares, the warps' partial sums (two buffers), attention's scalars; at least more
/// than half an SM's, so that no SM holds two blocks (the grid is one an SM).
pub fn smem_bytes(ring: usize) -> u32 {
    let sbs = MAX_K / 256;
    let used = 128 + ring * SLOT + MAX_K + sbs * 32 + sbs * 4 + 2 * MAX_WARPS * 32 * 16 + 64 * 4;
    used.max(HALF_SM + 1024) as u32
}

/// Half the shared memory of an H100/H200 SM a block may take (227 KiB).
const HALF_SM: usize = 227 * 1024 / 2;

/// The kernels by the most computing warps a block runs.
pub const KERNELS: [(usize, &str); 2] = [(8, "decode_layers_8"), (16, "decode_layers_16")];

/// How the persistent kernel runs, where it is switched on.
#[derive(Clone, Copy, Debug)]
pub struct Persistent {
    pub warps: usize,
    pub ring: usize,
    /// A one-row decode step the kernel cannot take is an error.
    pub required: bool,
    /// Only a step's first this many layers (the chain runs the rest).
    pub layers: usize,
    /// Each layer's attention half as the window kernel, its MLP as the
    /// chain (decode_window.rs), rather than all in one launch.
    pub window: Option<Window>,
}

/// How the window kernel runs (`FERRITE_CUDA_PERSISTENT_WINDOW`).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// It also writes the MLP's 8-bit input (`=2`).
    pub ffn_input: bool,
    /// Warps a block: 16, or 8 by `FERRITE_CUDA_PERSISTENT_WARPS`.
    pub warps: usize,
}

impl Persistent {
    /// From the environment (`None`: off).
    pub fn from_env() -> Option<Persistent> {
        let required = ferrite_core::env::cuda_persistent()?;
        let warps_set = ferrite_core::env::cuda_persistent_warps();
        let ring = ferrite_core::env::cuda_persistent_ring().unwrap_or(4).clamp(2, MAX_RING);
        let layers = ferrite_core::env::cuda_persistent_layers().unwrap_or(usize::MAX);
        // 8 or 16 warps a block: the persistent kernel 8 unless set, the window kernel 16.
        let warps = |default: usize| if warps_set.unwrap_or(default) > 8 { 16 } else { 8 };
        let level = ferrite_core::env::cuda_persistent_window();
        let window = (level > 0).then(|| Window { ffn_input: level > 1, warps: warps(16) });
        Some(Persistent { warps: warps(8), ring, required, layers, window })
    }
}

/// The persistent kernel on one device: its shape, why this GPU cannot run
/// it (if so), and its counters, zero between launches (the kernel's last
/// block zeroes them).
pub struct PersistentState {
    pub shape: Persistent,
    unfit: Option<String>,
    pub(super) count: CudaSlice<u32>,
    /// Shared memory a block may have on this GPU.
    optin: u32,
}

/// Where `FERRITE_CUDA_PERSISTENT` is set: the kernel's shared memory asked
/// of the driver (only then: it is more than GPUs before Hopper give a
/// block) and its counters.
pub fn open(
    ctx: &CudaContext,
    stream: &Arc<CudaStream>,
    funcs: &HashMap<String, CudaFunction>,
    arch: u32,
) -> Result<Option<PersistentState>> {
    let Some(shape) = Persistent::from_env() else { return Ok(None) };
    let smem = smem_bytes(shape.ring);
    let optin = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(|e| device_err("shared memory per block", e))? as u32;
    let func = &funcs[kernel(shape)];
    let unfit = if let Some(w) = shape.window {
        decode_window::open(&funcs[decode_window::kernel(w.warps)], w.warps, arch, optin)?
    } else if arch < 90 {
        Some("a GPU before Hopper (bulk copies)".to_string())
    } else if optin < smem {
        Some(format!("{smem} bytes of shared memory a block, more than this GPU's {optin}"))
    } else {
        func.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(|e| device_err("kernel shared memory", e))?;
        let threads = 32 * (shape.warps as u32 + 1);
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
            .map_err(|e| device_err("occupancy", e))?;
        (per_sm == 0).then(|| "its blocks do not fit an SM".to_string())
    };
    let count = stream.alloc_zeros::<u32>(COUNT_WORDS).map_err(|e| device_err("alloc", e))?;
    Ok(Some(PersistentState { shape, unfit, count, optin }))
}

/// The kernel for a shape's computing warps.
fn kernel(p: Persistent) -> &'static str {
    KERNELS.iter().find(|k| k.0 == p.warps).map_or(KERNELS[0].1, |k| k.1)
}

pub(super) type Layer<'a> = PlainLayer<'a, CudaWeight, CudaTensor>;

/// The model's shape as the kernel takes it.
pub(super) struct Shape {
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub ffn: usize,
}

/// The shape of these layers where the kernel can run them (all of them, as
/// one shape), else why not.
fn fits(dev: &Device, p: Persistent, layers: &[Layer], pool: &CudaKvPool) -> std::result::Result<Shape, &'static str> {
    let first = layers.first().ok_or("no layers")?;
    if layers.len() * (STAGES + first.attn.n_kv_heads) > COUNT_WORDS {
        return Err("more layers and KV heads than its counters");
    }
    let (a, hidden, ffn) = (first.attn, first.wo.rows, first.gate.rows);
    let (n_heads, n_kv, hd) = (a.n_heads, a.n_kv_heads, a.head_dim);
    let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
    let group = n_heads.checked_div(n_kv).ok_or("no KV heads")?;
    if dev.deterministic {
        return Err("the batch-invariant mode");
    }
    if !matches!(hd, 64 | 128) || !n_heads.is_multiple_of(n_kv) || group > p.warps || !p.warps.is_multiple_of(group) {
        return Err("heads other than 64 or 128 wide, in groups of 1, 2, 4 or 8");
    }
    if ![hidden, ffn, q_dim].iter().all(|&k| k.is_multiple_of(256) && k <= MAX_K) || kv_dim != pool.kv_dim {
        return Err("widths not multiples of 256 up to 16,384");
    }
    if !pool.k.iter().chain(&pool.v).all(|b| matches!(b, KvBuf::F16(_))) {
        return Err("an f32 KV cache");
    }
    let tiles = |w: &CudaWeight, rows: usize, cols: usize| {
        matches!(w.storage, Storage::Quant(DType::Q4K | DType::Q6K))
            && (w.rows, w.cols) == (rows, cols)
            && rows.is_multiple_of(16)
    };
    let weights_ok = |y: &Layer| {
        let [wq, wk, wv] = y.wqkv;
        tiles(wq, q_dim, hidden)
            && tiles(wk, kv_dim, hidden)
            && tiles(wv, kv_dim, hidden)
            && tiles(y.wo, hidden, q_dim)
            && tiles(y.gate, ffn, hidden)
            && tiles(y.up, ffn, hidden)
            && tiles(y.down, hidden, ffn)
            && (y.attn_norm.rows * y.attn_norm.cols, y.ffn_norm.rows * y.ffn_norm.cols) == (hidden, hidden)
    };
    if !layers.iter().all(weights_ok) {
        return Err("a matrix not of Q4_K or Q6_K blocks (or of another shape)");
    }
    let same = |y: &Layer| {
        (y.attn.n_heads, y.attn.n_kv_heads, y.attn.head_dim) == (n_heads, n_kv, hd)
            && y.attn.scale == a.scale
            && y.rope.inv_freq == first.rope.inv_freq
            && y.eps == first.eps
            && y.act == first.act
    };
    if !layers.iter().all(|y| y.attn.window.is_none() && y.attn.softcap.is_none() && y.rope.interleaved && same(y)) {
        return Err("sliding windows, soft caps, half-split RoPE or layers of different kinds");
    }
    if first.rope.head_dim != hd || first.rope.inv_freq.len() * 2 != hd {
        return Err("RoPE over part of a head");
    }
    Ok(Shape { hidden, n_heads, n_kv, hd, ffn })
}

/// Scratch a kernel writes before it reads.
pub(super) fn scratch<T: DeviceRepr>(dev: &Device, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every element is written by the kernel before it is read.
    unsafe { dev.alloc::<T>(n) }.map_err(|e| device_err("alloc", e))
}

/// The window kernel's plan for these layers on this GPU, else why not.
fn window_plan(dev: &Device, sh: &Shape, layers: &[Layer], optin: u32) -> std::result::Result<Plan, String> {
    let types: Vec<[bool; 4]> = layers.iter().map(decode_window::layer_types).collect();
    decode_window::plan(decode_window::Dims::of(sh), sh.n_kv, &types, dev.sms as usize, optin as usize)
}

/// The layers as the kernel reads them (its `DlLayer`): per matrix its
/// address, type (0 Q4_K, 1 Q6_K) and rows; the norms' addresses, then the
/// layer's K and V caches'.
fn layer_words(dev: &Device, layers: &[Layer], pool: &CudaKvPool) -> Result<Vec<u32>> {
    let s = &dev.stream;
    let mut w = Vec::with_capacity(layers.len() * 36);
    let addr = |w: &mut Vec<u32>, a: u64| w.extend([a as u32, (a >> 32) as u32]);
    for (l, y) in layers.iter().enumerate() {
        let [wq, wk, wv] = y.wqkv;
        for m in [wq, wk, wv, y.wo, y.gate, y.up, y.down] {
            addr(&mut w, m.data.device_ptr(s).0);
            w.extend([u32::from(m.storage == Storage::Quant(DType::Q6K)), m.rows as u32]);
        }
        addr(&mut w, y.attn_norm.f32(dev)?.device_ptr(s).0);
        addr(&mut w, y.ffn_norm.f32(dev)?.device_ptr(s).0);
        for c in [&pool.k[l], &pool.v[l]] {
            let KvBuf::F16(b) = c else { return Err(Error::Device("persistent decode: an f32 cache".into())) };
            addr(&mut w, b.device_ptr(s).0);
        }
    }
    Ok(w)
}

impl CudaBackend {
    /// `Backend::decode_layers`: the persistent kernel where it is switched
    /// on and fits (`fits`); false, nothing done, elsewhere.
    pub(super) fn decode_layers_fused<'l>(
        &self,
        x: &mut CudaTensor,
        n_layers: usize,
        layer: &dyn Fn(usize) -> Option<Layer<'l>>,
        positions: &[u32],
        pool: &mut CudaKvPool,
        batch: &AttnBatch,
    ) -> Result<usize> {
        let dev = &self.dev;
        let Some(state) = &dev.persistent else { return Ok(0) };
        let p = state.shape;
        if x.rows != 1 || positions.len() != 1 || batch.slots.len() != 1 || batch.seqs.len() != 1 {
            return Ok(0);
        }
        let total = n_layers;
        let n_layers = n_layers.min(p.layers);
        let layers = (0..n_layers).map(layer).collect::<Option<Vec<_>>>();
        let shape = match (&layers, &state.unfit) {
            (_, Some(why)) => Err(why.clone()),
            (Some(l), None) if total == pool.k.len() => fits(dev, p, l, pool).map_err(String::from),
            (Some(_), None) => Err("a KV pool of another depth".into()),
            (None, None) => Err("layers with biases, head norms or post-norms".into()),
        };
        // The window kernel: its plan, or why the layers' stretch does not fit it.
        let shape = match (shape, &layers, p.window) {
            (Ok(sh), Some(l), Some(w)) => window_plan(dev, &sh, l, state.optin).map(|plan| (sh, Some((plan, w)))),
            (shape, _, _) => shape.map(|sh| (sh, None)),
        };
        let (layers, (sh, window)) = match (layers, shape) {
            (Some(l), Ok(sh)) => (l, sh),
            (_, Err(why)) if p.required => {
                let kind = if p.window.is_some() { "window" } else { "persistent" };
                return Err(Error::Unsupported(format!(
                    "the {kind} decode kernel (FERRITE_CUDA_PERSISTENT=require): {why}"
                )));
            }
            _ => return Ok(0),
        };
        if x.cols != sh.hidden {
            return Err(Error::Shape(format!("decode_layers: x has {} columns, the model {}", x.cols, sh.hidden)));
        }
        kv::check_slots(pool, batch)?;
        let (kv_blocks, block_size) = (pool.slots / pool.block_size, pool.block_size);
        batch.validate(1, kv_blocks, block_size)?;
        // What a replay checks its step against (as attention notes it).
        self.graphs.note(|l| (l.kv_blocks, l.block_size) = (kv_blocks, block_size));
        let _span = p.window.is_none().then(|| super::profile::span(&dev.stream, "decode_layers (persistent)"));
        let table = self.meta.constant(dev, layer_words(dev, &layers, pool)?, self.graphs.is_capturing())?;
        let first = &layers[0];
        let (pos, freq) = self.rope_inputs(first.rope, positions)?;
        let slots = self.step_words(Field::Slots, || batch.slots.iter().map(|&s| s as u32).collect())?;
        let (meta_host, _) = kv::paged_meta(batch, 1);
        let meta = self.step_words(Field::AttnMeta, || meta_host[..3].to_vec())?;
        let tables = self.step_words(Field::Tables, || meta_host[3..].to_vec())?;
        let (pos, slots, meta, tables) = (pos.view(), slots.view(), meta.view(), tables.view());
        if let Some((plan, window)) = window {
            let block_size = pool.block_size;
            let step = decode_window::Step {
                table: &table,
                count: &state.count,
                pos: &pos,
                slots: &slots,
                meta: &meta,
                tables: &tables,
                freq: &freq,
                block_size,
                window,
            };
            self.window_layers(x, &layers, &sh, plan, &step)?;
            return Ok(n_layers);
        }
        let nparts = (dev.sms as usize / sh.n_kv).clamp(1, MAX_PARTS);
        let q_dim = sh.n_heads * sh.hd;
        let alloc = |n: usize| scratch::<f32>(dev, n);
        let (q, attn, h) = (alloc(q_dim)?, alloc(q_dim)?, alloc(sh.ffn)?);
        let parts = alloc(nparts * sh.n_heads * (sh.hd + 2))?;
        let name = kernel(p);
        let u = |v: usize| v as u32;
        let cfg = LaunchConfig {
            grid_dim: (dev.sms, 1, 1),
            block_dim: (u(32 * (p.warps + 1)), 1, 1),
            shared_mem_bytes: smem_bytes(p.ring),
        };
        let mut b = dev.launch(name);
        b.arg(&*table).arg(u(n_layers)).arg(x.f32_mut(dev)?).arg(&q).arg(&attn).arg(&parts).arg(&h).arg(&state.count);
        b.arg(&pos).arg(&slots).arg(&meta).arg(&tables).arg(&*freq);
        b.arg(u(sh.hidden)).arg(u(sh.n_heads)).arg(u(sh.n_kv)).arg(u(sh.hd)).arg(u(sh.ffn));
        b.arg(u(pool.block_size)).arg(u(nparts)).arg(u(p.ring));
        b.arg(first.eps).arg(first.attn.scale).arg(act_code(first.act));
        b.run(cfg)?;
        Ok(n_layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest ring leaves the kernel within an H100/H200 block's
    /// shared memory (227 KiB), one block an SM.
    #[test]
    fn the_largest_ring_fits_a_block() {
        assert!(smem_bytes(MAX_RING) as usize <= 227 * 1024);
        assert!(smem_bytes(2) as usize > HALF_SM, "two blocks could share an SM");
    }
}
