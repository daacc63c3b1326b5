//! Activations on the GPU: a row-major f32 matrix and, where the op that made
//! it wrote one, a 16-bit copy for the GEMM that reads it next.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaSlice, DevicePtrMut};
use ferrite_core::{Error, Result};

use super::device::{device_err, elementwise, Device};
use super::weight::Storage;

/// A tensor's 16-bit copy, with its type (see `CudaTensor`).
pub type HalfCopy = Option<(Storage, CudaSlice<u16>)>;

/// A row-major [rows, cols] matrix of f32 in device memory. The norms, the
/// activations and attention also write a 16-bit copy when a GEMM may read
/// them (more rows than the GEMV kernel takes), which the GEMM then reads as
/// it is. In prefill, where only GEMMs read them, they write that copy alone
/// (`half_only`): their f32 writes were a third of the bytes of a layer's
/// elementwise work. Other ops read the f32 values through `f32`, which
/// converts the copy at the first such read, so every op sees the values
/// either way.
pub struct CudaTensor {
    /// The f32 values; unset while only `half` holds them.
    buf: OnceLock<CudaSlice<f32>>,
    pub(super) rows: usize,
    pub(super) cols: usize,
    half: HalfCopy,
}

impl CudaTensor {
    pub(super) fn new(buf: CudaSlice<f32>, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor { buf: OnceLock::from(buf), rows, cols, half: None }
    }

    /// A tensor whose values only its 16-bit copy `half` (of type `st`) holds.
    pub(super) fn half_only(rows: usize, cols: usize, st: Storage, half: CudaSlice<u16>) -> CudaTensor {
        CudaTensor { buf: OnceLock::new(), rows, cols, half: Some((st, half)) }
    }

    /// Whether only the 16-bit copy holds the values so far.
    pub(super) fn is_half_only(&self) -> bool {
        self.buf.get().is_none()
    }

    /// The f32 values, converted from the 16-bit copy first where the op
    /// that made the tensor wrote only that.
    pub(super) fn f32(&self, dev: &Device) -> Result<&CudaSlice<f32>> {
        if let Some(b) = self.buf.get() {
            return Ok(b);
        }
        let Some((st, h)) = &self.half else {
            return Err(Error::Device("a tensor without values".into()));
        };
        let n = self.rows * self.cols;
        let _span = super::profile::span(&dev.stream, "16-bit copy to f32");
        // SAFETY: fully written by the conversion.
        let mut b = unsafe { dev.alloc::<f32>(n.max(1)) }.map_err(|e| device_err("alloc", e))?;
        let bf16 = (*st == Storage::Bf16) as i32;
        dev.launch("from_half").arg(h).arg(&mut b).arg(n as u64).arg(bf16).run(elementwise(n))?;
        // (Set here unless set meanwhile: `&self` is not shared across streams.)
        let _ = self.buf.set(b);
        self.buf.get().ok_or_else(|| Error::Device("f32 values not kept".into()))
    }

    /// The f32 values, to be changed in place: the 16-bit copy is dropped.
    pub(super) fn f32_mut(&mut self, dev: &Device) -> Result<&mut CudaSlice<f32>> {
        self.f32(dev)?;
        self.half = None;
        self.buf.get_mut().ok_or_else(|| Error::Device("f32 values not kept".into()))
    }

    /// Sets the 16-bit copy of the f32 values.
    pub(super) fn set_half(&mut self, half: HalfCopy) {
        self.half = half;
    }

    /// The 16-bit copy, where there is one.
    pub(super) fn half(&self) -> Option<(Storage, &CudaSlice<u16>)> {
        self.half.as_ref().map(|(st, b)| (*st, b))
    }

    /// The 16-bit copy of a `half_only` tensor, to be changed in place (the
    /// tensor stays 16-bit only); `None` for any other tensor.
    pub(super) fn half_only_mut(&mut self) -> Option<&mut CudaSlice<u16>> {
        match self.buf.get() {
            Some(_) => None,
            None => self.half.as_mut().map(|h| &mut h.1),
        }
    }
}

/// An op's f32 output of `n` values, or none where it writes its 16-bit copy
/// `half` alone (`half_only`, and a copy to write); with the output's kernel
/// argument (0: none).
pub(super) fn f32_output(
    dev: &Device,
    n: usize,
    half: &HalfCopy,
    half_only: bool,
) -> Result<(Option<CudaSlice<f32>>, u64)> {
    if half_only && half.is_some() {
        return Ok((None, 0));
    }
    // SAFETY: the op writes every element.
    let mut out = unsafe { dev.alloc::<f32>(n.max(1)) }.map_err(|e| device_err("alloc", e))?;
    let ptr = out.device_ptr_mut(&dev.stream).0;
    Ok((Some(out), ptr))
}

/// An op's output: f32 values `out` (none when `half.only`) and the 16-bit
/// copy, as `HalfOut` asked.
pub(super) fn output(out: Option<CudaSlice<f32>>, rows: usize, cols: usize, half: HalfCopy) -> Result<CudaTensor> {
    match (out, half) {
        (Some(b), half) => {
            let mut t = CudaTensor::new(b, rows, cols);
            t.set_half(half);
            Ok(t)
        }
        (None, Some((st, h))) => Ok(CudaTensor::half_only(rows, cols, st, h)),
        (None, None) => Err(Error::Device("an output without values".into())),
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
