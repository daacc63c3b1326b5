//! Decode attention's SMs, counted for the tile GEMVs (kernels/common.cuh
//! `sm_busy`; off with `FERRITE_CUDA_SM_BUSY=0`): a count per SM of the
//! attention blocks running there, which a tile GEMV launched early reads
//! before it loads weights ahead of its wait, so that those loads stay off
//! attention's SMs. One buffer, given to every module that declares
//! `ferrite_busy` (each, when the kernels are built with SM_BUSY).

use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaSlice, CudaStream, DevicePtr};
use ferrite_core::Result;

use super::device::device_err;

/// Entries of the buffer: `%smid` is below 1,024 (kernels/common.cuh `sm_index`).
const SMS: usize = 1024;

/// The counts, where the kernels are built with SM_BUSY.
pub struct SmBusy(Option<CudaSlice<u32>>);

impl SmBusy {
    pub fn new(stream: &Arc<CudaStream>) -> Result<SmBusy> {
        if !ferrite_core::env::cuda_sm_busy() {
            return Ok(SmBusy(None));
        }
        let counts = stream.alloc_zeros::<u32>(SMS).map_err(|e| device_err("alloc", e))?;
        Ok(SmBusy(Some(counts)))
    }

    /// Points `module`'s `ferrite_busy` at the counts, where it has one.
    pub fn attach(&self, module: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> Result<()> {
        let Some(counts) = &self.0 else { return Ok(()) };
        let Ok(mut global) = module.get_global("ferrite_busy", stream) else { return Ok(()) };
        let ptr = counts.device_ptr(stream).0;
        let err = |e| device_err("the attention SMs' counts", e);
        stream.memcpy_htod(&ptr.to_le_bytes(), &mut global).map_err(err)?;
        stream.synchronize().map_err(err)
    }
}
