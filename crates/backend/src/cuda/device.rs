//! Opening a GPU: libraries, context, stream, cuBLAS and the compiled kernels.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig};
use cudarc::nvrtc::Ptx;
use ferrite_core::{Error, Result};

use super::compile;
use super::gemv::{gemv_name, own_tile_names};
use super::weight::{Storage, QUANT_KERNELS};

/// How a CUDA backend is opened.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// Device index (`--device cuda:N`).
    pub ordinal: usize,
    /// Where compiled kernels are cached; `None` compiles at every start.
    pub kernel_cache: Option<PathBuf>,
    /// Keep f32 weights in f32 (exact, FP32 GEMMs) instead of bf16.
    pub exact_f32: bool,
    /// Batch-invariant arithmetic: every row is computed the same way whatever
    /// else is in the batch (matmuls by our row kernel, attention by the row
    /// kernel), so batched and one-at-a-time results are identical, bit for bit.
    pub deterministic: bool,
    /// Never capture decode steps as CUDA graphs (`--enforce-eager`).
    pub eager: bool,
}

pub(crate) fn device_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("{what}: {e:?}"))
}

/// One GPU: its context, the one stream all work is ordered on, cuBLAS, and
/// every kernel function by name.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    /// cuBLASLt for dense GEMMs, when its library is present (else GemmEx).
    pub lt: Option<super::lt::Lt>,
    _workspace: cudarc::driver::CudaSlice<u8>,
    /// Decode attention's blocks per SM (cuda/sm_busy.rs), kept while the kernels run.
    _sm_busy: super::sm_busy::SmBusy,
    pub deterministic: bool,
    /// Multiprocessors: how many warps a launch can hold at once.
    pub sms: u32,
    pub name: String,
    pub arch: String,
    funcs: HashMap<String, CudaFunction>,
    /// Where `alloc` takes memory while a decode step is captured.
    pub(super) capture: super::capture_alloc::CaptureAlloc,
    /// What the uploaded matrices take (`capture_alloc::own_pool_pays`).
    pub(super) weight_bytes: super::capture_alloc::WeightBytes,
    /// Launch the kernels that wait for their input (`launch_pdl`) with
    /// programmatic dependent launch (sm_90 and later).
    pub(super) pdl: bool,
    /// Bytes of its weight row each quantized GEMV warp prefetches into L2
    /// before it waits for its input.
    pub prefetch: u32,
    /// Ops whose output only GEMMs read may write its 16-bit copy alone
    /// (`CudaTensor`; off with `FERRITE_CUDA_HALF_ONLY=0`).
    pub half_only: bool,
    /// Gated MLPs on blocks at GEMV sizes compute the activation in the down
    /// projection's input quantization (`gemv::gemv_add_glu`; off with
    /// `FERRITE_CUDA_GLU_X8=0`).
    pub glu_x8: bool,
    /// RMS norms read by 16-bit weights alone are folded into them at load
    /// (`CudaBackend::fold_norm`; off with `FERRITE_CUDA_FOLD_NORM=0`).
    pub fold_norm: bool,
    /// A matmul group whose GEMVs read the input in two orders quantizes it
    /// for both in one launch (`gemv::quantize_ahead`; off with
    /// `FERRITE_CUDA_DUAL_X8=0`).
    pub dual_x8: bool,
    /// Q4_K q/k with a Q6_K v run in one launch at batch 1
    /// (`gemv::gemv_mixed_qkv`; off with `FERRITE_CUDA_MIXED_QKV=0`).
    pub mixed_qkv: bool,
    /// At batch 1, Q4_K q/k/v GEMVs apply RoPE and write the KV cache
    /// (`gemv::gemv_qkv_rope_kv`; off with `FERRITE_CUDA_QKV_ROPE=0`).
    pub qkv_rope: bool,
    /// The attention row kernels also write their output quantized for the
    /// output projection's GEMV on blocks (`CudaBackend::attention_project_add`;
    /// off with `FERRITE_CUDA_ATTN_X8=0`).
    pub attn_x8: bool,
    /// The tensor-core decode attention lets the kernel after it start only
    /// once its keys are read (kernels/attention_rows_mma.cu; off with
    /// `FERRITE_CUDA_ATTN_LATE_TRIGGER=0`).
    pub attn_late_trigger: bool,
    /// Warps the tensor-core GEMVs aim at (`FERRITE_CUDA_Q4K_WARPS`;
    /// 0, the default: one wave, see `gemv::tile_split`).
    pub q4k_warps: u32,
    /// The persistent decode kernel's shape, where it is switched on
    /// (decode_layers.rs).
    pub persistent: Option<super::decode_layers::PersistentState>,
    /// The fused MLP's sums and counters, where it is switched on
    /// (mlp_fused.rs).
    pub mlp_fused: Option<super::mlp_fused::MlpFused>,
    /// Finished splits per (row, KV head) block of a split-K attention
    /// launch, which its last split resets to zero (kernels/attention.cu,
    /// `merge_if_last`); `kv::SPLIT_BLOCKS` of them.
    pub split_done: cudarc::driver::CudaSlice<u32>,
    /// Finished shares per row of a `sample_split` launch, which its last
    /// block resets to zero (kernels/sample.cu); `SAMPLE_ROWS` of them.
    pub sample_done: cudarc::driver::CudaSlice<u32>,
    /// The sampling kernels' output, which fed token ids read (picks.rs).
    pub picks: super::picks::PickBuffers,
}

/// Rows a `sample_split` launch takes at most (more: `sample_rows`).
pub const SAMPLE_ROWS: usize = crate::picks::MAX_FED_ROWS;

/// Kernel entry points of each module (`extern "C"` names in kernels/*.cu).
const FUNCTIONS: &[(&str, &[&str])] = &[
    (
        "ops",
        &[
            "to_bf16",
            "to_f16",
            "from_half",
            "add",
            "add_row",
            "scale",
            "softcap",
            "activate",
            "activate_half",
            "glu",
            "glu_bf16in",
            "rms_norm",
            "layer_norm",
            "layer_norm_w2",
            "layer_norm_w4",
            "layer_norm_w8",
            "rope",
            "gather_rows",
            "reduce_segments",
            "embedding",
            "write_kv_f32",
            "write_kv_f16",
            "rope_kv_f32",
            "rope_kv_f16",
            "rope_kv_f16_bf16in",
            "rope_kv_rows",
            "rms_norm4",
            "scale_cols_half",
            "read_rate",
        ],
    ),
    (
        "attention",
        &[
            "attention_rows_f32",
            "attention_rows_f16",
            "attention_rows_f32_small",
            "attention_rows_f16_small",
            "attention_rows_mma_64",
            "attention_rows_mma_128",
            "flash_f16_64",
            "flash_f16_128",
            "flash_wg_64",
            "flash_wg_128",
        ],
    ),
    (
        "encoder",
        &[
            "encoder_attention_d16_g1",
            "encoder_attention_d16_g1_s",
            "encoder_attention_d16_g2",
            "encoder_attention_d16_g2_s",
            "encoder_attention_d32_g2",
            "encoder_attention_d32_g2_s",
            "encoder_attention_d32_g4",
            "encoder_attention_d32_g4_s",
            "encoder_attention_d32_g8",
            "encoder_attention_d32_g8_s",
            "encoder_attention_hd32",
            "encoder_attention_hd64",
            "encoder_attention_hd128",
        ],
    ),
    ("gemv", &["gemv_norm_bf16_1", "gemv_norm_f16_1", "gemv_glu_norm_bf16_1", "gemv_glu_norm_f16_1"]),
    (
        "quant",
        &[
            "dequant_f16",
            "dequant_f16_tiled",
            "embedding_q",
            "quantize_x8",
            "quantize_x8_sb",
            "quantize_x8_dual",
            "gemv_q4k_q6k_1",
            "gemv_q5k_q6k_1",
            "gemv_q4_k_whole_1",
            "gemv_q6_k_whole_1",
            "gemv_q4_k_rkv_1",
            "gemv_q5_kt_rkv_1",
            "gemv_q6_k_rkv_1",
            "gemv_q4k_q6k_rkv_1",
            "gemv_q5k_q6k_rkv_1",
            "decode_layers_8",
            "decode_layers_16",
            "decode_window",
            "decode_window_8",
            "mlp_fused",
        ],
    ),
    ("sample", &["sample_rows", "sample_split"]),
];

/// A module's entry points: the fixed ones, plus one GEMV (and for 16-bit
/// weights one gate/up GEMV) per storage and input-row count (1..=8).
pub(super) fn functions(module: &str) -> Vec<String> {
    let mut names: Vec<String> =
        FUNCTIONS.iter().find(|(n, _)| *n == module).map_or(&[][..], |f| f.1).iter().map(|s| s.to_string()).collect();
    let stores: Vec<Storage> = match module {
        "gemv" => vec![Storage::Bf16, Storage::F16],
        "quant" => QUANT_KERNELS.iter().map(|(q, _)| Storage::Quant(*q)).collect(),
        _ => vec![],
    };
    for st in stores {
        names.extend((1..=8).map(|n| gemv_name(st, n)));
    }
    if module == "quant" {
        names.extend(own_tile_names());
    }
    if module == "gemv" {
        names.extend((1..=8).flat_map(|n| [format!("gemv_glu_bf16_{n}"), format!("gemv_glu_f16_{n}")]));
    }
    names
}

/// Number of CUDA devices, or why there are none usable.
pub fn device_count() -> Result<usize> {
    // SAFETY: only probes for the shared library.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Device("no NVIDIA driver found (libcuda could not be loaded)".into()));
    }
    let n = CudaContext::device_count().map_err(|e| device_err("no usable CUDA device", e))?;
    if n <= 0 {
        return Err(Error::Device("the NVIDIA driver reports no CUDA device".into()));
    }
    Ok(n as usize)
}

impl Device {
    pub fn open(opts: &CudaOptions) -> Result<Device> {
        let n = device_count()?;
        if opts.ordinal >= n {
            return Err(Error::Device(format!("cuda:{} does not exist ({n} device(s))", opts.ordinal)));
        }
        // SAFETY: only probes for the shared library.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Device("cuBLAS (libcublas) could not be loaded".into()));
        }
        let ctx = CudaContext::new(opts.ordinal).map_err(|e| device_err("creating a CUDA context", e))?;
        // One stream orders all work: no per-buffer events are needed.
        // SAFETY: called before any buffer exists.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| device_err("creating a stream", e))?;
        keep_pool_memory(&ctx)?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| device_err("starting cuBLAS", e))?;
        // cuBLAS picks faster Hopper kernels with a larger workspace (its
        // guide suggests 32 MiB); it lives as long as the device.
        let workspace = stream.alloc_zeros::<u8>(32 << 20).map_err(|e| device_err("cuBLAS workspace", e))?;
        let lt = {
            let (ptr, _guard) = cudarc::driver::DevicePtr::device_ptr(&workspace, &stream);
            // SAFETY: only probes for the shared library.
            if unsafe { cudarc::cublaslt::sys::is_culib_present() } {
                // The workspace is shared: cuBLAS and cuBLASLt calls are ordered on one stream.
                Some(
                    super::lt::Lt::new((ptr, 32 << 20), opts.deterministic, ferrite_core::env::cuda_gemm_tune())
                        .map_err(|e| device_err("starting cuBLASLt", e))?,
                )
            } else {
                None
            }
        };
        {
            let (ptr, _guard) = cudarc::driver::DevicePtr::device_ptr(&workspace, &stream);
            // SAFETY: the buffer outlives the handle (both live in `Device`).
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut std::ffi::c_void, 32 << 20)
            }
            .result()
            .map_err(|e| device_err("cuBLAS workspace", e))?;
        }
        let (major, minor) = ctx.compute_capability().map_err(|e| device_err("compute capability", e))?;
        // Hopper's own target (sm_90a): its wgmma instructions run on compute
        // capability 9.0 alone, which is what this cubin is built for.
        let arch = if (major, minor) == (9, 0) { "sm_90a".to_string() } else { format!("sm_{major}{minor}") };
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| device_err("multiprocessor count", e))? as u32;
        let mut driver = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut driver) };
        let mut funcs = HashMap::new();
        let sm_busy = super::sm_busy::SmBusy::new(&stream)?;
        for ((module, _), cubin) in
            compile::MODULES.iter().zip(compile::cached_all(opts.kernel_cache.as_deref(), &arch, driver))
        {
            let cubin = cubin.map_err(Error::Device)?;
            let m = ctx.load_module(Ptx::from_binary(cubin)).map_err(|e| device_err("loading kernels", e))?;
            super::trace::watch(&m, &stream);
            sm_busy.attach(&m, &stream)?;
            for f in functions(module) {
                let func = m.load_function(&f).map_err(|e| device_err(&f, e))?;
                funcs.insert(f, func);
            }
        }
        // Kernels with more than the default 48 KiB of dynamic shared memory.
        let flash = super::kv::FLASH_KERNELS.iter().map(|&(f, hd, keys)| (f, super::kv::flash_smem(hd, keys)));
        let rows = super::kv::ROWS_MMA.iter().map(|&(hd, f)| (f, super::kv::rows_mma_smem(hd)));
        for (f, bytes) in rows.chain(flash) {
            let bytes = bytes as i32;
            funcs[f]
                .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)
                .map_err(|e| device_err("kernel shared memory", e))?;
        }
        let persistent = super::decode_layers::open(&ctx, &stream, &funcs, major as u32 * 10 + minor as u32)?;
        let mlp_fused = super::mlp_fused::MlpFused::open(&stream)?;
        let side = ctx.new_stream().map_err(|e| device_err("creating a stream", e))?;
        let split_done = stream.alloc_zeros::<u32>(super::kv::SPLIT_BLOCKS).map_err(|e| device_err("alloc", e))?;
        let sample_done = stream.alloc_zeros::<u32>(SAMPLE_ROWS).map_err(|e| device_err("alloc", e))?;
        let picks = super::picks::PickBuffers::new(&stream)?;
        Ok(Device {
            _sm_busy: sm_busy,
            split_done,
            sample_done,
            picks,
            ctx,
            stream,
            blas,
            lt,
            _workspace: workspace,
            deterministic: opts.deterministic,
            sms,
            name,
            // Profiling times ops one by one: overlapping them would blur it.
            pdl: major >= 9 && ferrite_core::env::cuda_pdl() && !ferrite_core::env::profiling(),
            prefetch: ferrite_core::env::cuda_prefetch().unwrap_or(DEFAULT_PREFETCH),
            half_only: ferrite_core::env::cuda_half_only(),
            glu_x8: ferrite_core::env::cuda_glu_x8(),
            fold_norm: ferrite_core::env::cuda_fold_norm(),
            dual_x8: ferrite_core::env::cuda_dual_x8(),
            mixed_qkv: ferrite_core::env::cuda_mixed_qkv(),
            qkv_rope: ferrite_core::env::cuda_qkv_rope(),
            attn_x8: ferrite_core::env::cuda_attn_x8(),
            attn_late_trigger: ferrite_core::env::cuda_attn_late_trigger(),
            q4k_warps: ferrite_core::env::cuda_q4k_warps().unwrap_or(0),
            persistent,
            mlp_fused,
            arch,
            funcs,
            capture: super::capture_alloc::CaptureAlloc::new(side),
            weight_bytes: Default::default(),
        })
    }

    /// `len` values of uninitialized memory for an op, ordered on the
    /// stream; while a decode step is captured, from its graph's own pool
    /// (capture_alloc.rs).
    ///
    /// SAFETY: as `CudaStream::alloc`: the caller writes before it reads.
    pub unsafe fn alloc<T: DeviceRepr>(&self, len: usize) -> std::result::Result<CudaSlice<T>, DriverError> {
        match self.capture.alloc::<T>(len) {
            Some(r) => r,
            None => self.stream.alloc::<T>(len),
        }
    }

    pub fn func(&self, name: &str) -> &CudaFunction {
        self.funcs.get(name).unwrap_or_else(|| panic!("kernel {name} is not in FUNCTIONS"))
    }

    /// (free, total) bytes of device memory.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(|e| device_err("memory info", e))
    }

    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| device_err("kernel failed", e))
    }
}

/// Bytes of its weight row a quantized GEMV warp prefetches by default: on
/// the H200, Q4_K_M decode ran 7% faster with 4 KiB than with none, and no
/// faster with 2 or 8 KiB (`FERRITE_CUDA_PREFETCH` overrides it).
const DEFAULT_PREFETCH: u32 = 4096;

/// The stream-ordered allocator would return freed memory to the driver at
/// every synchronization; keeping it makes per-op allocation nearly free.
fn keep_pool_memory(ctx: &CudaContext) -> Result<()> {
    // SAFETY: plain driver calls on this context's device.
    unsafe {
        let pool = cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device())
            .map_err(|e| device_err("memory pool", e))?;
        let mut max = u64::MAX;
        cudarc::driver::result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut max as *mut u64 as *mut std::ffi::c_void,
        )
        .map_err(|e| device_err("memory pool", e))?;
    }
    Ok(())
}

/// A 1-D launch over `n` elements, grid-stride loops in the kernel.
pub fn elementwise(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 132 * 16) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// One block per row, `threads` rounded to whole warps.
pub fn per_row(rows: usize, width: usize) -> LaunchConfig {
    let t = width.clamp(32, 1024).div_ceil(32) * 32;
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (t.min(256) as u32, 1, 1), shared_mem_bytes: 0 }
}
