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

/// Groups between a group's gate/up units and its down units: the units
/// one wave of warps takes, and one group more (at most all groups).
fn default_lag(warps: usize, hidden: usize, ffn: usize) -> usize {
    let per_group = 32 * (hidden / 256 / STEPS) + hidden / 16 / STEPS;
    (warps.div_ceil(per_group) + 1).min(ffn / 256)
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
    let warps = dev.sms * WARPS;
    let lag = state.lag.unwrap_or_else(|| default_lag(warps as usize, hidden, ffn)).min(ffn / 256);
    let ([xq, meta, ss], _g1) = xn.normed_target(s)?;
    let ([xq2, meta2], _, _g2) = mid.target(s);
    let _span = super::profile::span(s, "mlp_fused");
    let mut a = dev.launch("mlp_fused");
    a.arg(&gate.data).arg(&up.data).arg(&down.data).arg(gate.row_bytes()).arg(down.row_bytes());
    a.arg(xq).arg(meta).arg(ss).arg(norm.eps).arg(act).arg(x.f32_mut(dev)?);
    a.arg(&state.acc).arg(xq2).arg(meta2).arg(&state.cnt);
    a.arg(hidden as u32).arg(ffn as u32).arg(lag as u32);
    let cfg = LaunchConfig { grid_dim: (dev.sms, 1, 1), block_dim: (32 * WARPS, 1, 1), shared_mem_bytes: 0 };
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

    /// On 132 SMs of 16 warps, Llama-3.1-8B's down units of a group start
    /// about a wave after its gate/up units: 192 units a group, 11 groups a
    /// wave, so 12 groups apart; never more than the groups there are.
    #[test]
    fn lag_is_a_wave_of_units() {
        assert_eq!(default_lag(132 * 16, 4096, 14336), 12);
        assert_eq!(default_lag(132 * 16, 4096, 256 * 4), 4);
    }
}
