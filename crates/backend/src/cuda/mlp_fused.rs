//! A one-row decode step's MLP in one launch (kernels/mlp_fused.cu): gate/up
//! and down of Q4_K tiles with down depending on gate/up per 256-row group
//! of the intermediate rather than on the whole of it, so that down's
//! weights stream while gate/up's last groups finish. Off unless
//! `FERRITE_CUDA_MLP_FUSED=1`; never in the batch-invariant mode (a row's
//! down sums are added to x in an order that varies).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig};
use ferrite_core::{DType, Result};

use super::device::{device_err, Device};
use super::gemv::{self, Norm};
use super::weight::{CudaWeight, Storage};
use super::CudaTensor;

/// The widest intermediate it takes (its sums' room, allocated once).
const MAX_FFN: usize = 1 << 16;
/// Steps a unit of the kernel (`MF_STEPS`): super-blocks of a gate/up tile,
/// or down tiles.
const STEPS: usize = 4;
/// Warps a block: one block an SM, so that every warp is resident.
const WARPS: u32 = 16;

/// What every launch shares, zero between launches: the gate/up sums and
/// the counters (per group two, then one).
pub struct MlpFused {
    acc: CudaSlice<f32>,
    cnt: CudaSlice<u32>,
    /// Groups between a group's gate/up units and its down units in the
    /// list (`FERRITE_CUDA_MLP_LAG`; default: a wave of units and one more).
    lag: Option<usize>,
}

impl MlpFused {
    /// Where `FERRITE_CUDA_MLP_FUSED=1` asks for it.
    pub fn open(stream: &Arc<CudaStream>) -> Result<Option<MlpFused>> {
        if !ferrite_core::env::cuda_mlp_fused() {
            return Ok(None);
        }
        let alloc = |e| device_err("alloc", e);
        let acc = stream.alloc_zeros::<f32>(2 * MAX_FFN).map_err(alloc)?;
        let cnt = stream.alloc_zeros::<u32>(2 * MAX_FFN / 256 + 1).map_err(alloc)?;
        Ok(Some(MlpFused { acc, cnt, lag: ferrite_core::env::cuda_mlp_lag() }))
    }
}

/// Whether the fused MLP takes this one: switched on, one row, not the
/// batch-invariant mode, Q4_K gate, up and down of shapes its units divide.
pub fn takes(dev: &Device, rows: usize, gate: &CudaWeight, up: &CudaWeight, down: &CudaWeight) -> bool {
    let q4k = |w: &CudaWeight| w.storage == Storage::Quant(DType::Q4K);
    let (hidden, ffn) = (gate.cols, gate.rows);
    dev.mlp_fused.is_some()
        && rows == 1
        && !dev.deterministic
        && [gate, up, down].iter().all(|w| q4k(w))
        && shapes_fit(hidden, ffn)
        && (up.rows, up.cols, down.rows, down.cols) == (ffn, hidden, hidden, ffn)
}

/// Whether the kernel's units divide a hidden size and an intermediate.
fn shapes_fit(hidden: usize, ffn: usize) -> bool {
    hidden.is_multiple_of(256 * STEPS) && ffn.is_multiple_of(256) && ffn > 0 && ffn <= MAX_FFN
}

/// A group's units (gate/up, down) and all of them.
fn units(hidden: usize, ffn: usize) -> (usize, usize, usize) {
    let (ua, ub) = (32 * (hidden / 256 / STEPS), hidden / 16 / STEPS);
    (ua, ub, ffn / 256 * (ua + ub))
}

/// Groups between a group's gate/up units and its down units, so that a
/// group's last gate/up unit comes a wave of `warps` units before its
/// first down unit (the list's first rows hold gate/up units alone): at
/// most all groups.
fn default_lag(warps: usize, hidden: usize, ffn: usize) -> usize {
    let (ua, _, _) = units(hidden, ffn);
    (warps.div_ceil(ua) + 1).min(ffn / 256)
}

/// Warps a block (of one block an SM) that share the units out evenly:
/// as many rounds of units as 16 warps an SM need, over as few warps as
/// take them in that many (a last round that leaves most warps idle would
/// cost a unit's time with little of the copy rate).
fn block_warps(sms: usize, hidden: usize, ffn: usize) -> usize {
    let (_, _, total) = units(hidden, ffn);
    let rounds = total.div_ceil(sms * WARPS as usize);
    total.div_ceil(rounds).div_ceil(sms).clamp(1, WARPS as usize)
}

/// x += down(act(gate(xn)) * up(xn)), xn = x normed by `norm` (`takes` has
/// been checked): the normed quantization, then the one launch.
pub fn mlp_add(
    dev: &Device,
    x: &mut CudaTensor,
    norm: Norm,
    (gate, up, down): (&CudaWeight, &CudaWeight, &CudaWeight),
    act: i32,
) -> Result<()> {
    let state = dev.mlp_fused.as_ref().ok_or_else(|| ferrite_core::Error::Device("fused MLP not open".into()))?;
    let (hidden, ffn) = (gate.cols, gate.rows);
    let mut xn = gemv::x8_tile_normed(dev, x, norm)?;
    let mut mid = gemv::x8_tile_room(dev, ffn)?;
    let s = &dev.stream;
    let per_block = block_warps(dev.sms as usize, hidden, ffn);
    let warps = dev.sms as usize * per_block;
    let lag = state.lag.unwrap_or_else(|| default_lag(warps, hidden, ffn)).min(ffn / 256);
    let ([xq, meta, ss], _g1) = xn.normed_target(s)?;
    let ([xq2, meta2], _, _g2) = mid.target(s);
    let _span = super::profile::span(s, "mlp_fused");
    let mut a = dev.launch("mlp_fused");
    a.arg(&gate.data).arg(&up.data).arg(&down.data).arg(gate.row_bytes()).arg(down.row_bytes());
    a.arg(xq).arg(meta).arg(ss).arg(norm.eps).arg(act).arg(x.f32_mut(dev)?);
    a.arg(&state.acc).arg(xq2).arg(meta2).arg(&state.cnt);
    a.arg(hidden as u32).arg(ffn as u32).arg(lag as u32);
    let cfg = LaunchConfig { grid_dim: (dev.sms, 1, 1), block_dim: (32 * per_block as u32, 1, 1), shared_mem_bytes: 0 };
    // The weights, x and the sums as `takes` checked them; the 8-bit
    // buffers of the sizes their kernels write.
    a.run(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-3.1-8B and 3.2-1B shapes fit; sizes the units do not divide fall
    /// back to the chain.
    #[test]
    fn units_divide_llama_shapes() {
        assert!(shapes_fit(4096, 14336));
        assert!(shapes_fit(2048, 8192));
        assert!(!shapes_fit(576, 1536), "SmolLM2-135M: 2.25 super-blocks a row");
        assert!(!shapes_fit(4096, 14336 + 128));
        assert!(!shapes_fit(4096, 2 * MAX_FFN));
    }

    /// Llama-3.1-8B on 132 SMs: 10,752 units, six rounds of 14 warps a
    /// block (1,848 warps; 16 would leave a last round of 192 units); a
    /// group's down units 16 groups after its gate/up units (128 of those a
    /// group: 1,848 units, a wave, between them); never more than the
    /// groups there are.
    #[test]
    fn units_spread_over_the_warps() {
        assert_eq!(units(4096, 14336), (128, 64, 10_752));
        assert_eq!(block_warps(132, 4096, 14336), 14);
        assert_eq!(default_lag(132 * 14, 4096, 14336), 16);
        assert_eq!(default_lag(132 * 14, 4096, 256 * 4), 4);
        assert_eq!(block_warps(132, 1024, 768), 2, "144 units: a round");
    }
}
