//! Activations on the GPU: a row-major f32 matrix and, where the op that made
//! it wrote one, a 16-bit copy for the GEMM that reads it next.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtrMut};
use ferrite_core::{Error, Result};

use super::device::{elementwise, Device};
use super::weight::Storage;

/// A tensor's 16-bit copy, with its type (see `CudaTensor`).
pub type HalfCopy = Option<(Storage, CudaSlice<u16>)>;

/// A row-major [rows, cols] matrix of f32 in device memory. The norms, the
/// activations and attention also write a 16-bit copy when a GEMM may read
/// them (more rows than the GEMV kernel takes), which the GEMM then reads as
/// it is. In prefill, where only GEMMs read them, they write that copy alone
/// (`half_only`): their f32 writes were a third of the bytes of a layer's
/// elementwise work. Other ops read the f32 values through `f32`, which
/// converts the copy first if needed, so every op sees the values either way.
pub struct CudaTensor {
    buf: CudaSlice<f32>,
    pub(super) rows: usize,
    pub(super) cols: usize,
    half: HalfCopy,
    /// Only `half` holds the values; `buf` is allocated but unwritten.
    half_only: AtomicBool,
}

impl CudaTensor {
    pub(super) fn new(buf: CudaSlice<f32>, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor { buf, rows, cols, half: None, half_only: AtomicBool::new(false) }
    }

    /// A tensor with the 16-bit copy `half`; `half_only`: the op wrote only
    /// that copy (ignored without one).
    pub(super) fn with_half(buf: CudaSlice<f32>, rows: usize, cols: usize, half: HalfCopy, half_only: bool) -> Self {
        let half_only = AtomicBool::new(half_only && half.is_some());
        CudaTensor { buf, rows, cols, half, half_only }
    }

    /// The f32 values, converted from the 16-bit copy first where the op
    /// that made the tensor wrote only that.
    pub(super) fn f32(&self, dev: &Device) -> Result<&CudaSlice<f32>> {
        if self.half_only.load(Ordering::Acquire) {
            let Some((st, h)) = &self.half else {
                return Err(Error::Device("a 16-bit-only tensor without its copy".into()));
            };
            let n = (self.rows * self.cols) as u64;
            let bf16 = (*st == Storage::Bf16) as i32;
            let _span = super::profile::span(&dev.stream, "16-bit copy to f32");
            // The kernel writes `buf` through this shared borrow: its values
            // were never read, and the one stream orders this write before
            // every read that follows.
            dev.launch("from_half").arg(h).arg(&self.buf).arg(n).arg(bf16).run(elementwise(n as usize))?;
            self.half_only.store(false, Ordering::Release);
        }
        Ok(&self.buf)
    }

    /// The f32 values, to be changed in place: the 16-bit copy is dropped.
    pub(super) fn f32_mut(&mut self, dev: &Device) -> Result<&mut CudaSlice<f32>> {
        self.f32(dev)?;
        self.half = None;
        Ok(&mut self.buf)
    }

    /// Sets the 16-bit copy of values just written in f32 too.
    pub(super) fn set_half(&mut self, half: HalfCopy) {
        self.half = half;
        *self.half_only.get_mut() = false;
    }

    /// The 16-bit copy, where there is one.
    pub(super) fn half(&self) -> Option<(Storage, &CudaSlice<u16>)> {
        self.half.as_ref().map(|(st, b)| (*st, b))
    }
}

/// What an op writes besides its f32 output: its 16-bit copy (where GEMMs
/// may read it) and whether that copy alone (`only`: only GEMMs read it).
pub struct HalfOut {
    pub half: HalfCopy,
    pub only: bool,
}

/// A 16-bit copy's kernel arguments: pointer (0: none) and whether bf16.
pub fn half_args(stream: &Arc<cudarc::driver::CudaStream>, half: &mut HalfCopy) -> (u64, i32) {
    let bf16 = half.as_ref().is_some_and(|h| h.0 == Storage::Bf16) as i32;
    (half.as_mut().map_or(0, |h| h.1.device_ptr_mut(stream).0), bf16)
}
