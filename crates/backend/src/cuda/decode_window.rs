//! The window decode kernel (kernels/decode_window.cu): a one-row decode
//! step's layer, attention half (input norm, q/k/v with RoPE and the KV
//! write, attention, the output projection added to x) in one launch, its
//! MLP then as the chain of kernels runs it. Every block asks for all of its
//! weight tiles at once, by bulk copies into shared memory before it waits
//! for the kernel before, so the stretch's weights must fit the GPU's shared
//! memory; the stages depend on each other per KV head, never grid-wide.
//! `FERRITE_CUDA_PERSISTENT=1` with `FERRITE_CUDA_PERSISTENT_WINDOW=1`
//! turns it on (off by default until measured, docs/cuda-journal.md); the
//! layers it takes are those the persistent kernel would (decode_layers.rs
//! `fits`) whose stretch fits (`plan`).

use cudarc::driver::{sys, CudaFunction, CudaSlice, CudaView, LaunchConfig};
use ferrite_core::{DType, Result};

use super::decode_layers::{scratch, Layer, Shape, Window};
use super::device::device_err;
use super::gemv::{self, GemvOut};
use super::{act_code, CudaBackend, CudaTensor, CudaWeight, Storage};
use crate::Backend;

/// The kernel's instances by the warps a block runs: 16 (the default), or 8
/// at the same registers a thread, half an SM's, so that a block may start
/// beside the kernel before's last blocks (`FERRITE_CUDA_PERSISTENT_WARPS=8`).
pub const KERNELS: [(usize, &str); 2] = [(16, "decode_window"), (8, "decode_window_8")];
/// The instance for `warps` a block.
pub fn kernel(warps: usize) -> &'static str {
    KERNELS.iter().find(|k| k.0 == warps).map_or(KERNELS[0].1, |k| k.1)
}
/// Warps a block at most (the reduction buffers), the most tiles a block
/// takes (DW_MAX_WARPS, DW_MAX_TILES).
const MAX_WARPS: usize = 16;
const MAX_TILES: usize = 16;
/// Attention's parts of the context per KV head at most.
const MAX_PARTS: usize = 32;

/// Bytes of a tile's super-block: Q4_K or Q6_K (16 rows each).
fn block_bytes(q6: bool) -> usize {
    if q6 {
        3360
    } else {
        2304
    }
}

/// The model's widths as the kernel divides its tiles.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub hidden: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
}

impl Dims {
    pub fn of(sh: &Shape) -> Dims {
        Dims { hidden: sh.hidden, q_dim: sh.n_heads * sh.hd, kv_dim: sh.n_kv * sh.hd }
    }
    /// Tiles of q, k, v and the output projection.
    fn tiles(&self) -> [usize; 4] {
        [self.q_dim / 16, self.kv_dim / 16, self.kv_dim / 16, self.hidden / 16]
    }
}

/// A tile's bytes for each of q, k, v and the output projection, by
/// whether each is Q6_K (else Q4_K).
fn tile_sizes(d: Dims, q6: [bool; 4]) -> [usize; 4] {
    let k = [d.hidden, d.hidden, d.hidden, d.q_dim];
    std::array::from_fn(|m| k[m] / 256 * block_bytes(q6[m]))
}

/// The tiles block b of `grid` takes, as (matrix 0-3, bytes), in the order
/// the kernel lays them out: q/k/v tiles b, b + grid, ..., then output
/// tiles grid - 1 - b, 2 grid - 1 - b, ... (`dw_tile`).
pub fn block_tiles(d: Dims, q6: [bool; 4], b: usize, grid: usize) -> Vec<(usize, usize)> {
    let [tq, tk, tv, to] = d.tiles();
    let sizes = tile_sizes(d, q6);
    let matrix = |i: usize| {
        if i < tq {
            0
        } else if i < tq + tk {
            1
        } else {
            2
        }
    };
    let qkv = (b..tq + tk + tv).step_by(grid).map(|i| (matrix(i), sizes[matrix(i)]));
    let o = (grid - 1 - b..to).step_by(grid).map(|_| (3, sizes[3]));
    qkv.chain(o).collect()
}

/// Shared memory after the tiles (`dw_layout`): the 8-bit input, its
/// metadata and sums of squares, the reduction buffers, attention's
/// scalars.
pub fn fixed_bytes(hidden: usize) -> usize {
    let nsb = hidden / 256;
    hidden + 32 * nsb + 16 * nsb.div_ceil(4) + 2 * MAX_WARPS * 32 * 16 + 256
}

/// How the kernel runs a model: the most tile bytes a block takes over its
/// layers (where the fixed part starts) and the shared memory a block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub tile_bytes: usize,
    pub smem: usize,
}

/// The plan for layers whose q, k, v and output projection are Q6_K or not
/// (`q6`, a layer each) on `grid` blocks with `optin` bytes of shared memory
/// a block, or why the kernel cannot take them.
pub fn plan(d: Dims, n_kv: usize, q6: &[[bool; 4]], grid: usize, optin: usize) -> std::result::Result<Plan, String> {
    let group = d.q_dim / d.kv_dim.max(1);
    let hd = d.kv_dim / n_kv.max(1);
    if group > 8 || !(group * hd).is_multiple_of(256) {
        return Err(format!("{group} query heads of {hd} a KV head (at most 8, whole super-blocks of 256)"));
    }
    if n_kv > grid {
        return Err(format!("{n_kv} KV heads, more than the GPU's {grid} SMs"));
    }
    let (mut tile_bytes, mut most) = (0, 0);
    for &types in q6 {
        for b in 0..grid {
            let tiles = block_tiles(d, types, b, grid);
            most = most.max(tiles.len());
            tile_bytes = tile_bytes.max(tiles.iter().map(|t| t.1).sum());
        }
    }
    if most > MAX_TILES {
        return Err(format!("{most} weight tiles a block, more than {MAX_TILES}"));
    }
    let smem = 8 * MAX_TILES + tile_bytes + fixed_bytes(d.hidden);
    if smem > optin {
        return Err(format!("{smem} bytes of shared memory a block, more than this GPU's {optin}"));
    }
    Ok(Plan { tile_bytes, smem })
}

/// Where the window kernel is switched on: its shared memory asked of the
/// driver (all a block may have), or why this GPU cannot run it.
pub fn open(func: &CudaFunction, warps: usize, arch: u32, optin: u32) -> Result<Option<String>> {
    if arch < 90 {
        return Ok(Some("a GPU before Hopper (bulk copies)".into()));
    }
    func.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin as i32)
        .map_err(|e| device_err("kernel shared memory", e))?;
    let per_sm = func
        .occupancy_max_active_blocks_per_multiprocessor(32 * warps as u32, optin as usize, None)
        .map_err(|e| device_err("occupancy", e))?;
    Ok((per_sm == 0).then(|| "its blocks do not fit an SM".to_string()))
}

/// Whether each of a layer's q, k, v and output projection is Q6_K.
pub fn layer_types(y: &Layer) -> [bool; 4] {
    let [wq, wk, wv] = y.wqkv;
    [wq, wk, wv, y.wo].map(|w: &CudaWeight| w.storage == Storage::Quant(DType::Q6K))
}

/// What every layer's launch shares: the layer table, the counters (zero
/// between launches), the step's inputs.
pub(super) struct Step<'a> {
    pub table: &'a CudaSlice<u32>,
    pub count: &'a CudaSlice<u32>,
    pub pos: &'a CudaView<'a, u32>,
    pub slots: &'a CudaView<'a, u32>,
    pub meta: &'a CudaView<'a, u32>,
    pub tables: &'a CudaView<'a, u32>,
    pub freq: &'a CudaSlice<u32>,
    pub block_size: usize,
    /// The MLP's input too (`FERRITE_CUDA_PERSISTENT_WINDOW=2`), the warps
    /// a block.
    pub window: Window,
}

impl CudaBackend {
    /// The layers of a one-row decode step, each as the window kernel then
    /// the chain's MLP (`plan` has been checked by the caller).
    pub(super) fn window_layers(
        &self,
        x: &mut CudaTensor,
        layers: &[Layer],
        sh: &Shape,
        plan: Plan,
        step: &Step,
    ) -> Result<()> {
        let dev = &self.dev;
        let d = Dims::of(sh);
        let grid = dev.sms as usize;
        let nparts = (grid / sh.n_kv).clamp(1, MAX_PARTS);
        let q = scratch::<f32>(dev, d.q_dim)?;
        let parts = scratch::<f32>(dev, nparts * sh.n_heads * (sh.hd + 2))?;
        // The output projection's 8-bit input: q_dim bytes, 8 words a super-block.
        let oq = scratch::<u32>(dev, d.q_dim / 4)?;
        let ometa = scratch::<u32>(dev, d.q_dim / 256 * 8)?;
        let u = |v: usize| v as u32;
        let cfg = LaunchConfig {
            grid_dim: (dev.sms, 1, 1),
            block_dim: (u(32 * step.window.warps), 1, 1),
            shared_mem_bytes: u(plan.smem),
        };
        for (l, y) in layers.iter().enumerate() {
            // The MLP's input from the kernel, where the chain's GEMVs take it.
            let mut ffn_in = match step.window.ffn_input && gemv::fuses_glu(dev, 1, y.down) {
                true => gemv::x8_normed_room(dev, sh.hidden, &[y.gate, y.up])?,
                false => None,
            };
            {
                let ([fq, fmeta, fss], _guards) = match &mut ffn_in {
                    Some(x8) => {
                        let (p, g) = x8.normed_target(&dev.stream)?;
                        (p, Some(g))
                    }
                    None => ([0; 3], None),
                };
                let _span = super::profile::span(&dev.stream, "decode_window");
                let mut b = dev.launch(kernel(step.window.warps));
                b.arg(step.table).arg(u(l)).arg(x.f32_mut(dev)?).arg(&q).arg(&parts).arg(&oq).arg(&ometa);
                b.arg(step.count).arg(step.pos).arg(step.slots).arg(step.meta).arg(step.tables).arg(step.freq);
                b.arg(u(sh.hidden)).arg(u(sh.n_heads)).arg(u(sh.n_kv)).arg(u(sh.hd)).arg(u(step.block_size));
                b.arg(u(nparts)).arg(u(plan.tile_bytes)).arg(y.eps).arg(y.attn.scale);
                b.arg(fq).arg(fmeta).arg(fss);
                b.run(cfg)?;
            }
            match ffn_in {
                Some(x8) => self.mlp_add_from_x8(x, x8, y)?,
                None => self.mlp_add(x, y.ffn_norm, y.eps, y.gate, y.up, y.down, y.act)?,
            }
        }
        Ok(())
    }

    /// `mlp_add` whose gate/up GEMVs take their normed input as the window
    /// kernel wrote it (no quantization kernel), then the chain's down GEMV
    /// with the gated activation in its input (`gemv_add_glu`).
    fn mlp_add_from_x8(&self, x: &mut CudaTensor, x8: gemv::X8, y: &Layer) -> Result<()> {
        let dev = &self.dev;
        let norm = gemv::Norm { w: y.ffn_norm, eps: y.eps };
        let mut cache = x8.into_cache();
        let (gate, up) = (y.gate, y.up);
        let [g, u] = {
            let _span = super::profile::span(&dev.stream, "norm_matmul_many (window's input)");
            // One launch for both where they are of one storage, as the chain's.
            let mut out = match gate.storage == up.storage {
                true => gemv::gemv(dev, x, &[gate, up], &mut cache, Some(norm), GemvOut::New)?,
                false => {
                    let mut g = gemv::gemv(dev, x, &[gate], &mut cache, Some(norm), GemvOut::New)?;
                    g.extend(gemv::gemv(dev, x, &[up], &mut cache, Some(norm), GemvOut::New)?);
                    g
                }
            };
            let (u, g) = (out.pop(), out.pop());
            [g, u].map(|t| t.ok_or_else(|| ferrite_core::Error::Shape("gate/up: no output".into())))
        };
        let _span = super::profile::span(&dev.stream, "matmul_add (+ glu)");
        gemv::gemv_add_glu(dev, x, (&g?, &u?, act_code(y.act)), y.down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA_8B: Dims = Dims { hidden: 4096, q_dim: 4096, kv_dim: 1024 };
    const LLAMA_1B: Dims = Dims { hidden: 2048, q_dim: 2048, kv_dim: 512 };
    /// An H100/H200 block's shared memory (227 KiB) and SMs (H200, H100 SXM).
    const OPTIN: usize = 232_448;

    /// Every tile of every matrix goes to exactly one block, in the order
    /// the kernel takes them.
    #[test]
    fn every_tile_has_one_block() {
        for (d, grid) in [(LLAMA_8B, 132), (LLAMA_8B, 78), (LLAMA_1B, 132), (LLAMA_1B, 200)] {
            let mut count = [0; 4];
            for b in 0..grid {
                let tiles = block_tiles(d, [false; 4], b, grid);
                let first_o = tiles.iter().position(|t| t.0 == 3).unwrap_or(tiles.len());
                assert!(tiles[first_o..].iter().all(|t| t.0 == 3), "q/k/v tiles come first");
                for t in tiles {
                    count[t.0] += 1;
                }
            }
            assert_eq!(count, d.tiles(), "{d:?} on {grid}");
        }
    }

    /// Blocks with a q/k/v tile fewer take an output tile more: on 132 SMs
    /// no block of Llama-3.1-8B takes more than five tiles.
    #[test]
    fn tiles_even_out_over_the_grid() {
        let loads: Vec<usize> = (0..132).map(|b| block_tiles(LLAMA_8B, [false; 4], b, 132).len()).collect();
        assert_eq!(loads.iter().max(), Some(&5));
        assert_eq!(loads.iter().min(), Some(&4));
    }

    /// Llama-3.1-8B Q4_K_M (its v projection Q6_K in some layers) fits an
    /// H200 block; the sizes are those the kernel lays out.
    #[test]
    fn llama_8b_q4_k_m_fits_hopper() {
        let types = [[false, false, true, false], [false; 4]];
        let p = plan(LLAMA_8B, 8, &types, 132, OPTIN).unwrap();
        assert!(p.smem <= OPTIN, "{p:?}");
        // The heaviest block: three q/k/v tiles, one of them v in Q6_K, and two output tiles.
        assert_eq!(p.tile_bytes, 4 * 16 * 2304 + 16 * 3360);
        assert_eq!(p.smem, 128 + p.tile_bytes + 4096 + 16 * 32 + 16 * 4 + 16_384 + 256);
        let one_b = plan(LLAMA_1B, 8, &[[false, false, true, false]], 132, OPTIN).unwrap();
        assert!(one_b.smem < p.smem);
    }

    /// What it cannot hold it refuses, saying why.
    #[test]
    fn refuses_what_it_cannot_hold() {
        let all_q6 = [[true; 4]];
        assert!(plan(LLAMA_8B, 8, &all_q6, 132, OPTIN).unwrap_err().contains("shared memory"));
        assert!(plan(LLAMA_8B, 8, &[[false; 4]], 30, OPTIN).unwrap_err().contains("tiles a block"));
        let wide_group = Dims { hidden: 4096, q_dim: 4096, kv_dim: 256 };
        assert!(plan(wide_group, 2, &[[false; 4]], 132, OPTIN).unwrap_err().contains("query heads"));
        let small_group = Dims { hidden: 2048, q_dim: 2048, kv_dim: 2048 };
        assert!(plan(small_group, 32, &[[false; 4]], 132, OPTIN).unwrap_err().contains("super-blocks"));
        assert!(plan(LLAMA_8B, 8, &[[false; 4]], 4, OPTIN).unwrap_err().contains("KV heads"));
    }
}
