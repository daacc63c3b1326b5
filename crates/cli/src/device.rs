//! `--device`: where a model runs, and the fallback to the CPU when no GPU is
//! usable.

use clap::Args;
use ferrite_backend::cpu::CpuBackend;
use ferrite_backend::cuda::{CudaBackend, CudaOptions};
use ferrite_core::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| format!("unknown device {s:?} (cpu, cuda or cuda:N)")),
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Where to run: cpu, cuda or cuda:N (default: cuda when an NVIDIA GPU is
    /// usable, else cpu).
    #[arg(long)]
    pub device: Option<DeviceChoice>,
    /// Fraction of the GPU's memory ferrite may fill (weights, KV cache, work buffers).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Batch-invariant GPU arithmetic: a request's results never depend on
    /// what else is batched with it (dense weights: about 2x slower prefill,
    /// 1.6x slower batch-1 decode, 64 streams 8% slower; GPU only: the CPU's
    /// arithmetic is batch-invariant always).
    #[arg(long)]
    pub deterministic: bool,
    /// Never capture decode steps or encoder passes as CUDA graphs: every
    /// step launches its kernels one by one (slower; for debugging and
    /// comparison).
    #[arg(long)]
    pub enforce_eager: bool,
}

/// A backend chosen at run time. The CPU may carry why no GPU is in use
/// (shown in the "loaded ..." line, so an error stays the only stderr line).
pub enum Backend {
    Cpu(CpuBackend, Option<String>),
    Cuda(CudaBackend),
}

impl Backend {
    /// ", no GPU: <reason>" when the CPU runs because the GPU could not.
    pub fn fallback_note(&self) -> String {
        match self {
            Backend::Cpu(_, Some(why)) => format!("; no GPU: {why}"),
            _ => String::new(),
        }
    }
}

/// Where compiled GPU kernels are cached: `$FERRITE_HOME/kernels`.
fn kernel_cache() -> Option<std::path::PathBuf> {
    let home =
        ferrite_core::env::path("FERRITE_HOME").or_else(|| ferrite_core::env::path("HOME").map(|h| h.join(".ferrite")));
    home.map(|h| h.join("kernels"))
}

impl DeviceArgs {
    /// The CPU, with no GPU probe.
    pub fn cpu() -> DeviceArgs {
        DeviceArgs {
            device: Some(DeviceChoice::Cpu),
            gpu_memory_utilization: 0.9,
            deterministic: false,
            enforce_eager: false,
        }
    }

    /// Opens the chosen device. With no `--device`, a missing GPU means the
    /// CPU (with the reason kept for the log); an explicit `--device cuda`
    /// that fails is an error.
    /// `exact_f32`: keep f32 weights in f32 on the GPU.
    pub fn open(&self, cpu: CpuBackend, exact_f32: bool) -> Result<Backend> {
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            return Err(Error::InvalidInput(format!(
                "--gpu-memory-utilization must be in (0, 1], got {}",
                self.gpu_memory_utilization
            )));
        }
        let on_cpu = |why: Option<String>| {
            if self.deterministic {
                eprintln!("note: --deterministic changes nothing on the CPU, whose arithmetic is batch-invariant");
            }
            Ok(Backend::Cpu(cpu, why))
        };
        let ordinal = match self.device {
            Some(DeviceChoice::Cpu) => return on_cpu(None),
            Some(DeviceChoice::Cuda(n)) => n,
            None => 0,
        };
        let opts = CudaOptions {
            ordinal,
            kernel_cache: kernel_cache(),
            exact_f32,
            deterministic: self.deterministic,
            eager: self.enforce_eager,
        };
        match CudaBackend::open(&opts) {
            Ok(b) => Ok(Backend::Cuda(b)),
            Err(e) if self.device.is_none() => on_cpu(Some(e.to_string())),
            Err(e) => Err(e),
        }
    }
}
