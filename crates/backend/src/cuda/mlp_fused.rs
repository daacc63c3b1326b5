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
/// The sums of one launch: gate's then up's.
const ROOM: usize = 2 * MAX_FFN;
/// The counters before the groups' (the kernel's `MF_CNT`).
const HEAD_COUNTERS: usize = 3;
/// Steps a unit of the kernel (`MF_A_STEPS` as built by default,
/// `MF_B_STEPS`): super-blocks of a gate/up tile, or down tiles.
const STEPS: usize = 4;
/// Warps a block (the kernel's `MF_WARPS`): one block an SM, so that
/// every warp is resident.
const WARPS: u32 = 14;

/// What every launch shares, whatever its shape: the gate/up sums, two
/// halves of `ROOM` that launches take in turn (the one a launch takes
/// zeroed by the launch before), and the counters (the launches; the warps
/// done and the units handed out, then one a group, zero between
/// launches).
pub struct MlpFused {
    acc: CudaSlice<f32>,
    cnt: CudaSlice<u32>,
}

impl MlpFused {
    /// Where `FERRITE_CUDA_MLP_FUSED=1` asks for it.
    pub fn open(stream: &Arc<CudaStream>) -> Result<Option<MlpFused>> {
        if !ferrite_core::env::cuda_mlp_fused() {
            return Ok(None);
        }
        let alloc = |e| device_err("alloc", e);
        let acc = stream.alloc_zeros::<f32>(2 * ROOM).map_err(alloc)?;
        let cnt = stream.alloc_zeros::<u32>(HEAD_COUNTERS + MAX_FFN / 256).map_err(alloc)?;
        Ok(Some(MlpFused { acc, cnt }))
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
    let xn = gemv::x8_tile_normed(dev, x, norm)?;
    let s = &dev.stream;
    let ([xq, meta, ss], _gx) = xn.source(dev);
    let _span = super::profile::span(s, "mlp_fused");
    let mut a = dev.launch("mlp_fused");
    a.arg(&gate.data).arg(&up.data).arg(&down.data).arg(gate.row_bytes()).arg(down.row_bytes());
    a.arg(xq).arg(meta).arg(ss).arg(norm.eps).arg(act).arg(x.f32_mut(dev)?);
    a.arg(&state.acc).arg(ROOM as u32).arg(&state.cnt);
    a.arg(hidden as u32).arg(ffn as u32);
    let cfg = LaunchConfig { grid_dim: (dev.sms, 1, 1), block_dim: (32 * WARPS, 1, 1), shared_mem_bytes: 0 };
    // The weights, x and the sums as `takes` checked them; the 8-bit
    // input of the size its kernel writes.
    a.run(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group's units (gate/up, down) and all of them.
    fn units(hidden: usize, ffn: usize) -> (usize, usize, usize) {
        let (ua, ub) = (32 * (hidden / 256 / STEPS), hidden / 16 / STEPS);
        (ua, ub, ffn / 256 * (ua + ub))
    }

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

    /// Llama-3.1-8B: 10,752 units (7,168 gate/up, 3,584 down).
    #[test]
    fn units_of_llama_shapes() {
        assert_eq!(units(4096, 14336), (128, 64, 10_752));
        assert_eq!(units(1024, 768), (32, 16, 144));
    }

    /// Unit `u` of the kernel's list as `mf_step` lays it out: (a down
    /// unit, its group): every gate/up unit, group by group, then every
    /// down unit.
    fn list_unit(ua: usize, ub: usize, groups: usize, u: usize) -> (bool, usize) {
        if u < groups * ua {
            (false, u / ua)
        } else {
            (true, (u - groups * ua) / ub)
        }
    }

    /// The list in lockstep (warp w takes units w, w + W, ... one a
    /// round, as the kernel built with MF_STATIC hands them out; the
    /// counter hands them out in the same order): every group has all its
    /// units, its gate/up units before its down units, and no down unit
    /// shares a round with the last gate/up unit of its group (none
    /// waits): Llama-3.1-8B on an H200 or H100 SXM (132 SMs) and PCIe
    /// (114), Llama-3.1-70B. (A list with down units a wave of gate/up
    /// units behind their group's, tried first, left the last groups'
    /// down units waiting.)
    #[test]
    fn no_down_unit_waits_in_lockstep() {
        for (sms, hidden, ffn) in [(132, 4096, 14336), (114, 4096, 14336), (132, 8192, 28672)] {
            let (ua, ub, total) = units(hidden, ffn);
            let groups = ffn / 256;
            let warps = sms * WARPS as usize;
            let mut count = vec![(0, 0); groups];
            let mut last_a = vec![0; groups];
            let mut first_b = vec![usize::MAX; groups];
            for u in 0..total {
                let (b, g) = list_unit(ua, ub, groups, u);
                let round = u / warps;
                if b {
                    count[g].1 += 1;
                    first_b[g] = first_b[g].min(round);
                } else {
                    count[g].0 += 1;
                    last_a[g] = last_a[g].max(round);
                }
            }
            let shape = format!("{hidden} x {ffn} on {sms} SMs, {warps} warps");
            assert!(count.iter().all(|&c| c == (ua, ub)), "{shape}: {count:?}");
            assert!((0..groups).all(|g| first_b[g] > last_a[g]), "{shape}: a down unit waits");
        }
    }
}
