//! Memory for a decode step captured as a graph, without memory nodes in it.
//!
//! Our ops allocate their outputs and temporaries from the stream-ordered
//! pool. Captured, each allocation and free becomes a graph node between
//! two kernels, and a kernel after such a node starts only when the kernel
//! before it has ended: the edge from a kernel to a kernel is what lets it
//! start early (programmatic dependent launch, launch.rs). `FERRITE_CUDA_TRACE`
//! showed no kernel of a decode step starting early, and a test on the H200
//! showed an allocation between two kernels in a graph turning a start 9.7 us
//! before the first kernel's end into one 0.7 us after it.
//!
//! So while a decode step is captured, `Device::alloc` takes memory from the
//! graph's own pool through a side stream that is not capturing: the
//! allocations and frees happen then and there, in the order the graph will
//! run (a buffer freed early in the step is reused later in it, as the
//! stream-ordered pool would), and nothing else ever allocates from that pool,
//! so the graph's buffers stay its own for as long as it lives (nothing
//! trims the pool: the memory it holds is what the graphs run on). The
//! capture runs in the relaxed mode when it uses a pool: the thread-local
//! mode refuses the side stream's allocations.
//!
//! Whether it pays depends on the weights (`own_pool_pays`): measured on the
//! H200 at batch 1, with the pool decode ran 3.7% faster on Llama-3.1-8B in
//! Q4_K_M (5.4% on Qwen3-8B, 8% on Llama-3.2-1B), but 4.5% slower on
//! Llama-3.1-8B in bf16 (6.2% at batch 4; 4.4% faster at 1B): there the
//! long dense GEMVs ran 2-3 us slower each once the next kernel's blocks
//! could be resident before they ended, more than the short kernels gained.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaSlice, CudaStream, DeviceRepr, DriverError};
use ferrite_core::Result;

use super::device::{device_err, Device};

/// A memory pool of the device (a driver handle, used under the graph map's
/// lock or the capture's).
#[derive(Clone, Copy)]
pub struct Pool(sys::CUmemoryPool);
// SAFETY: a handle; the driver serializes its uses.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    /// Gives the pool back (the driver waits for what is still allocated
    /// from it to be freed).
    pub fn destroy(self) {
        // SAFETY: a pool created by `new_pool`, destroyed once by its owner.
        let _ = unsafe { sys::cuMemPoolDestroy(self.0) };
    }
}

/// Bytes of the matrices uploaded, 16-bit (or f32) and in quantized blocks.
#[derive(Default)]
pub struct WeightBytes {
    dense: AtomicU64,
    quant: AtomicU64,
}

impl WeightBytes {
    pub fn add(&self, quantized: bool, bytes: usize) {
        let to = if quantized { &self.quant } else { &self.dense };
        to.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Whether captured decode steps take their memory from a pool of their
/// own: `FERRITE_CUDA_GRAPH_POOL=1` or `=0`, else when quantized blocks
/// hold most of the weights' bytes (see the module's note).
pub fn own_pool_pays(dev: &Device) -> bool {
    ferrite_core::env::cuda_graph_pool().unwrap_or_else(|| {
        let w = &dev.weight_bytes;
        w.quant.load(Ordering::Relaxed) > w.dense.load(Ordering::Relaxed)
    })
}

/// The side stream and, while a step is captured, the pool to allocate from.
pub struct CaptureAlloc {
    side: Arc<CudaStream>,
    pool: Mutex<Option<Pool>>,
}

impl CaptureAlloc {
    pub fn new(side: Arc<CudaStream>) -> CaptureAlloc {
        CaptureAlloc { side, pool: Mutex::new(None) }
    }

    /// `len` values from the capture's pool, if one is set.
    ///
    /// SAFETY: as `CudaStream::alloc`: uninitialized memory.
    pub unsafe fn alloc<T: DeviceRepr>(&self, len: usize) -> Option<std::result::Result<CudaSlice<T>, DriverError>> {
        let pool = (*self.pool.lock().unwrap_or_else(|e| e.into_inner()))?;
        let mut ptr = 0;
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        if let Err(e) = sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool.0, self.side.cu_stream()).result() {
            return Some(Err(e));
        }
        // Freed on the side stream too, back into this pool.
        Some(Ok(self.side.upgrade_device_ptr::<T>(ptr, len)))
    }

    /// Allocations come from `pool` until the guard drops (`None`: from
    /// the stream-ordered pool).
    pub fn from(&self, pool: Option<Pool>) -> FromPool<'_> {
        *self.pool.lock().unwrap_or_else(|e| e.into_inner()) = pool;
        FromPool(self)
    }
}

/// Allocations from a capture's pool until dropped.
pub struct FromPool<'a>(&'a CaptureAlloc);

impl Drop for FromPool<'_> {
    fn drop(&mut self) {
        *self.0.pool.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A new pool of device memory that keeps what it holds.
pub fn new_pool(dev: &Device) -> Result<Pool> {
    // SAFETY: all-zero properties, then the fields a device pool needs.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev.ctx.ordinal() as i32;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid properties; the handle is written by the call.
    unsafe { sys::cuMemPoolCreate(&mut pool, &props) }.result().map_err(|e| device_err("graph memory pool", e))?;
    let mut max = u64::MAX;
    // SAFETY: a live pool; the attribute takes a u64.
    unsafe {
        cudarc::driver::result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut max as *mut u64 as *mut std::ffi::c_void,
        )
    }
    .map_err(|e| device_err("graph memory pool", e))?;
    Ok(Pool(pool))
}
