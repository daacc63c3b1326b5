//! The hardware's ceilings, measured in the same run as a benchmark: device
//! copy bandwidth (bytes read plus written) and the bf16 GEMM rate (cuBLAS).
//! Roofline fractions are reported against these, not against data sheets.
//! The read rate (bytes read alone, loaded as the quantized GEMVs load their
//! weights) is reported beside the copy rate: how near a decode GEMV's
//! stream is to what reading alone reaches.
//!
//! The GEMM rate is measured on random values: tensor cores fed zeros draw
//! less power and hold higher clocks, so a GEMM on zeros runs faster than any
//! model's will (on the H200 about 10% faster). That rate is kept too, for
//! comparison.

use cudarc::cublas::sys::cudaDataType;
use cudarc::driver::{sys, CudaEvent, DevicePtr, DevicePtrMut, LaunchConfig};
use ferrite_core::Result;

use super::device::{device_err, Device};
use super::weight::Gemm;
use super::CudaBackend;

#[derive(Clone, Copy, Debug)]
pub struct Ceilings {
    /// Device-to-device copy, bytes read plus written per second.
    pub copy_bytes_per_s: f64,
    /// Bytes read per second by a kernel that only reads (`read_rate`);
    /// `None` where its launch failed (a comparison only: never fatal).
    pub read_bytes_per_s: Option<f64>,
    /// bf16 GEMM (8192³ of random values in ±1, f32 accumulation), FLOP per second.
    pub bf16_flops: f64,
    /// The same GEMM writing f32 (as ferrite's matmuls do).
    pub bf16_f32_out_flops: f64,
    /// The bf16 GEMM on zeros (for comparison: not a rate real data reaches).
    pub bf16_zeros_flops: f64,
}

/// `n` bf16 values uniform in ±1 (splitmix64; on one thread: a caller may
/// not have sized the thread pool yet, and this takes a fraction of a second).
fn random_bf16(n: usize, seed: u64) -> Vec<u16> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            // 24 random bits to a float in [-1, 1), its top 16 bits as bf16.
            let f = (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            (f.to_bits() >> 16) as u16
        })
        .collect()
}

fn event(dev: &Device) -> Result<CudaEvent> {
    dev.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| device_err("event", e))
}

/// Seconds per call of `f`, averaged over `iters` after one warm-up call.
fn time(dev: &Device, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let (start, end) = (event(dev)?, event(dev)?);
    start.record(&dev.stream).map_err(|e| device_err("event", e))?;
    for _ in 0..iters {
        f()?;
    }
    end.record(&dev.stream).map_err(|e| device_err("event", e))?;
    end.synchronize().map_err(|e| device_err("timing", e))?;
    let ms = start.elapsed_ms(&end).map_err(|e| device_err("timing", e))?;
    Ok(ms as f64 / 1e3 / iters as f64)
}

impl CudaBackend {
    pub fn measure_ceilings(&self) -> Result<Ceilings> {
        let dev = &self.dev;
        let s = &dev.stream;
        let n = 1usize << 30;
        let src = s.alloc_zeros::<u8>(n).map_err(|e| device_err("alloc", e))?;
        let mut dst = s.alloc_zeros::<u8>(n).map_err(|e| device_err("alloc", e))?;
        let copy = time(dev, 20, || s.memcpy_dtod(&src, &mut dst).map_err(|e| device_err("copy", e)))?;
        let read = time(dev, 20, || {
            let mut a = dev.launch("read_rate");
            a.arg(&src).arg((n / 16) as u64).arg(&mut dst);
            // Four blocks of 512 an SM: every thread the SM holds, four loads each in flight.
            a.run(LaunchConfig { grid_dim: (4 * dev.sms, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 })
        })
        .inspect_err(|e| eprintln!("warning: the read rate was not measured: {e}"))
        .ok();
        drop((src, dst));
        let d = 8192usize;
        let zeros = s.alloc_zeros::<u16>(d * d).map_err(|e| device_err("alloc", e))?;
        let a = s.clone_htod(&random_bf16(d * d, 1)).map_err(|e| device_err("upload", e))?;
        let b = s.clone_htod(&random_bf16(d * d, 2)).map_err(|e| device_err("upload", e))?;
        let mut c = s.alloc_zeros::<u16>(d * d).map_err(|e| device_err("alloc", e))?;
        let mut c32 = s.alloc_zeros::<f32>(d * d).map_err(|e| device_err("alloc", e))?;
        let mut gemm_rate = |f32_out: bool, on_zeros: bool| -> Result<f64> {
            let (a, b) = if on_zeros { (&zeros, &zeros) } else { (&a, &b) };
            let secs = time(dev, 20, || {
                let (ap, _ga) = a.device_ptr(s);
                let (bp, _gb) = b.device_ptr(s);
                let (cp, _gc) = if f32_out { c32.device_ptr_mut(s) } else { c.device_ptr_mut(s) };
                let ct = if f32_out { cudaDataType::CUDA_R_32F } else { cudaDataType::CUDA_R_16BF };
                let bf = cudaDataType::CUDA_R_16BF;
                let g = Gemm {
                    m: d,
                    n: d,
                    k: d,
                    ldc: d,
                    a: (ap, bf),
                    b: (bp, bf),
                    c: (cp, ct),
                    bias: None,
                    accumulate: false,
                };
                // SAFETY: live d x d buffers of the types given.
                unsafe { g.run(dev) }.map(drop).map_err(|e| device_err("GEMM", e))
            })?;
            Ok(2.0 * (d as f64).powi(3) / secs)
        };
        let bf16_zeros_flops = gemm_rate(false, true)?;
        let bf16_flops = gemm_rate(false, false)?;
        let bf16_f32_out_flops = gemm_rate(true, false)?;
        Ok(Ceilings {
            copy_bytes_per_s: 2.0 * n as f64 / copy,
            read_bytes_per_s: read.map(|t| n as f64 / t),
            bf16_flops,
            bf16_f32_out_flops,
            bf16_zeros_flops,
        })
    }

    /// Seconds per call of `f` on this GPU's stream (CUDA events).
    pub fn time<T>(&self, iters: usize, mut f: impl FnMut() -> Result<T>) -> Result<f64> {
        time(&self.dev, iters, || f().map(drop))
    }
}
