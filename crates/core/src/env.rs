//! The one place ferrite reads environment variables. They locate files
//! (HOME, FERRITE_HOME, the Hugging Face cache variables), point a test at
//! other fixtures or make it strict (`FERRITE_REQUIRE_NVRTC`), switch on
//! debugging output (`FERRITE_PROFILE`), or opt into llama.cpp's 8-bit CPU
//! activations (`FERRITE_CPU_ACTIVATIONS`), or tune the CUDA kernels
//! (`FERRITE_CUDA_PDL`, `FERRITE_CUDA_PREFETCH`, `FERRITE_CUDA_TRACE`, `FERRITE_CUDA_GRAPH_POOL`, `FERRITE_CUDA_ROWS_MMA`,
//! `FERRITE_CUDA_HALF_ONLY`, `FERRITE_CUDA_GEMM_TUNE`, `FERRITE_CUDA_GLU_X8`); models and kernels never read the environment
//! themselves.

use std::ffi::OsString;
use std::path::PathBuf;

/// A variable's value; unset and empty are the same.
pub fn var(key: &str) -> Option<OsString> {
    std::env::var_os(key).filter(|v| !v.is_empty())
}

/// A switch that is on unless set to `0`.
fn on_unless_zero(key: &str) -> bool {
    var(key).is_none_or(|v| v != "0")
}

/// A variable as a path.
pub fn path(key: &str) -> Option<PathBuf> {
    var(key).map(PathBuf::from)
}

/// `FERRITE_PROFILE` set (and not "0" or "phases"): backends time every op
/// (which runs CUDA passes eagerly, without graphs).
pub fn profiling() -> bool {
    var("FERRITE_PROFILE").is_some_and(|v| v != "0" && v != "phases")
}

/// `FERRITE_PROFILE` set (and not "0"): commands print where their time went
/// (`phases`: only that, ops untimed).
pub fn profiling_phases() -> bool {
    var("FERRITE_PROFILE").is_some_and(|v| v != "0")
}

/// `FERRITE_CPU_ACTIVATIONS=8`: quantized CPU matmuls on 8-bit activations
/// (read once per process).
pub fn cpu_activations_8() -> bool {
    use std::sync::OnceLock;
    static ASKED: OnceLock<bool> = OnceLock::new();
    *ASKED.get_or_init(|| var("FERRITE_CPU_ACTIVATIONS").is_some_and(|v| v == "8"))
}

/// `FERRITE_REQUIRE_NVRTC` set: a test that compiles kernels fails, rather
/// than skips, where NVRTC cannot be loaded.
pub fn require_nvrtc() -> bool {
    var("FERRITE_REQUIRE_NVRTC").is_some()
}

/// `FERRITE_CUDA_PDL=0`: CUDA kernels wait for the kernel before them to
/// finish before they start (no programmatic dependent launch).
pub fn cuda_pdl() -> bool {
    on_unless_zero("FERRITE_CUDA_PDL")
}

/// `FERRITE_CUDA_TRACE=1`: CUDA kernels are built to record when each one
/// was released to run (cuda/trace.rs) and `ferrite bench` prints the
/// decode steps' timeline kernel by kernel; for finding where time goes.
/// `=2` also marks stages inside some kernels (`trace_mark`).
pub fn cuda_trace() -> bool {
    cuda_trace_level() > 0
}

/// `FERRITE_CUDA_TRACE=2`: the trace also splits kernels at their stages.
pub fn cuda_trace_marks() -> bool {
    cuda_trace_level() == 2
}

/// The trace's level: 0 (off), 1 (kernels) or 2 (their stages too).
fn cuda_trace_level() -> u8 {
    match var("FERRITE_CUDA_TRACE").as_deref().and_then(|v| v.to_str()) {
        Some("1") => 1,
        Some("2") => 2,
        _ => 0,
    }
}

/// `FERRITE_CUDA_DEFINES=NAME,NAME=VALUE`: preprocessor definitions added
/// to every CUDA kernel's compilation (part of the kernel cache's key), so
/// that a kernel's variants behind `#ifdef` can be measured against each
/// other with one binary (`scripts/gpu-ab.sh`); for kernel work.
pub fn cuda_defines() -> Vec<String> {
    let v = var("FERRITE_CUDA_DEFINES").map(|v| v.to_string_lossy().into_owned()).unwrap_or_default();
    v.split(',').map(str::trim).filter(|d| !d.is_empty()).map(String::from).collect()
}

/// `FERRITE_CUDA_GRAPH_POOL=1` (or `=0`): captured decode steps of up to 4
/// rows take (or do not take) their memory from a pool of their own instead
/// of the stream-ordered pool, whose nodes in the graph keep each kernel from
/// starting before the one before it ends; unset, the backend decides by the
/// weights (cuda/capture_alloc.rs).
pub fn cuda_graph_pool() -> Option<bool> {
    var("FERRITE_CUDA_GRAPH_POOL").map(|v| v != "0")
}

/// `FERRITE_CUDA_ROWS_MMA=0`: attention rows (decode) on CUDA cores even
/// where the tensor-core row kernel serves (f16 caches, heads of 64 or 128,
/// up to 8 query heads per KV head); for comparison.
pub fn cuda_rows_mma() -> bool {
    on_unless_zero("FERRITE_CUDA_ROWS_MMA")
}

/// `FERRITE_CUDA_HALF_ONLY=0`: CUDA ops whose output only GEMMs read write
/// it in f32 too (prefill's norms, gated activations and attention); for
/// comparison.
pub fn cuda_half_only() -> bool {
    on_unless_zero("FERRITE_CUDA_HALF_ONLY")
}

/// `FERRITE_CUDA_FLASH_WG=0`: prefill attention on the mma.sync flash kernel
/// even on Hopper (sm_90a), where the wgmma one serves; for comparison.
pub fn cuda_flash_wg() -> bool {
    on_unless_zero("FERRITE_CUDA_FLASH_WG")
}

/// `FERRITE_CUDA_ROPE_ROWS=0`: prefill's RoPE and KV write on the kernel
/// with a block per row; for comparison.
pub fn cuda_rope_rows() -> bool {
    on_unless_zero("FERRITE_CUDA_ROPE_ROWS")
}

/// `FERRITE_CUDA_GEMM_TUNE=1`: prefill-sized CUDA GEMMs take the fastest of
/// cuBLASLt's heuristic's first few algorithms, timed once per shape, instead
/// of its first; for comparison.
pub fn cuda_gemm_tune() -> bool {
    var("FERRITE_CUDA_GEMM_TUNE").is_some_and(|v| v == "1")
}

/// `FERRITE_CUDA_PINNED_N=<tokens>`: the token count whose cuBLASLt algorithm
/// every GEMM of a weight shape uses in the batch-invariant mode (default
/// 256): smaller counts pick smaller tiles, more blocks at one token and
/// fewer for prefill; for measuring that trade.
pub fn cuda_pinned_n() -> Option<usize> {
    var("FERRITE_CUDA_PINNED_N").and_then(|v| v.to_str()?.parse().ok()).filter(|&n| n > 0)
}

/// `FERRITE_CUDA_PREFETCH=<bytes>`: how much of its weight row each CUDA GEMV
/// warp on quantized blocks prefetches into L2 before its input is ready.
pub fn cuda_prefetch() -> Option<u32> {
    var("FERRITE_CUDA_PREFETCH").and_then(|v| v.to_str()?.parse().ok())
}

/// `FERRITE_CUDA_ATTN_LATE_TRIGGER=0`: the tensor-core decode attention lets
/// the kernel after it start at once rather than once its keys are read;
/// for comparison.
pub fn cuda_attn_late_trigger() -> bool {
    on_unless_zero("FERRITE_CUDA_ATTN_LATE_TRIGGER")
}

/// `FERRITE_CUDA_PERSISTENT=1`: a one-row decode step of a Q4_K_M Llama
/// runs all its layers as one persistent kernel (cuda/decode_layers.rs);
/// off by default until measured faster. `=require`: a one-row decode step
/// it cannot take is an error that says why (for checks).
pub fn cuda_persistent() -> Option<bool> {
    match var("FERRITE_CUDA_PERSISTENT")?.to_str()? {
        "1" => Some(false),
        "require" => Some(true),
        _ => None,
    }
}

/// Runs `f` with `FERRITE_CUDA_PERSISTENT` set to `setting` (`None`:
/// unset), then restores it: a check that opens the chain and the
/// persistent kernel side by side (devices read it as they open).
pub fn with_cuda_persistent<T>(setting: Option<&str>, f: impl FnOnce() -> T) -> T {
    with_var("FERRITE_CUDA_PERSISTENT", setting, f)
}

/// Runs `f` with `FERRITE_CUDA_MLP_FUSED` set to `setting` (`None`: unset),
/// then restores it (as `with_cuda_persistent`).
pub fn with_cuda_mlp_fused<T>(setting: Option<&str>, f: impl FnOnce() -> T) -> T {
    with_var("FERRITE_CUDA_MLP_FUSED", setting, f)
}

fn with_var<T>(key: &str, setting: Option<&str>, f: impl FnOnce() -> T) -> T {
    let put = |v: Option<&std::ffi::OsStr>| match v {
        Some(v) => std::env::set_var(key, v),
        None => std::env::remove_var(key),
    };
    let before = std::env::var_os(key);
    put(setting.map(std::ffi::OsStr::new));
    let out = f();
    put(before.as_deref());
    out
}

/// `FERRITE_CPU_AVX512=0`: the CPU kernels keep to AVX2 where AVX-512 is
/// there too; for comparison.
pub fn cpu_avx512() -> bool {
    on_unless_zero("FERRITE_CPU_AVX512")
}

/// `FERRITE_CUDA_PERSISTENT_WARPS=<8|16>`: the persistent kernel's computing
/// warps a block (default: 8; 16 for the window kernel).
pub fn cuda_persistent_warps() -> Option<usize> {
    var("FERRITE_CUDA_PERSISTENT_WARPS").and_then(|v| v.to_str()?.parse().ok())
}

/// `FERRITE_CUDA_PERSISTENT_LAYERS=<n>`: the persistent kernel runs only
/// a step's first n layers, the chain of kernels the rest (to find where
/// the two part).
pub fn cuda_persistent_layers() -> Option<usize> {
    var("FERRITE_CUDA_PERSISTENT_LAYERS").and_then(|v| v.to_str()?.parse().ok())
}

/// `FERRITE_CUDA_PERSISTENT_WINDOW=1` (with `FERRITE_CUDA_PERSISTENT`): a
/// one-row decode step runs each layer's attention half (input norm, q/k/v,
/// attention, output projection) as one launch, the window kernel
/// (cuda/decode_window.rs), and its MLP as the chain runs it; `=2`: the
/// window kernel also writes the MLP's normed 8-bit input (no quantization
/// kernel before gate/up). 0 (unset): off, the default (correct but 0.82x
/// the chain's speed on an H100, docs/cuda-journal.md).
pub fn cuda_persistent_window() -> usize {
    match var("FERRITE_CUDA_PERSISTENT_WINDOW").as_ref().and_then(|v| v.to_str()) {
        Some("1") => 1,
        Some("2") => 2,
        _ => 0,
    }
}

/// `FERRITE_CUDA_MLP_FUSED=1`: a one-row decode step's MLP of Q4_K gate, up
/// and down runs as one launch (cuda/mlp_fused.rs), down depending on
/// gate/up per group of 256 intermediate rows; off by default (0.94x the
/// chain's speed on an H100, docs/cuda-journal.md).
pub fn cuda_mlp_fused() -> bool {
    var("FERRITE_CUDA_MLP_FUSED").is_some_and(|v| v == "1")
}

/// `FERRITE_CUDA_PERSISTENT_RING=<2..5>`: the persistent kernel's weight
/// slots in shared memory a block (4, the default).
pub fn cuda_persistent_ring() -> Option<usize> {
    var("FERRITE_CUDA_PERSISTENT_RING").and_then(|v| v.to_str()?.parse().ok())
}

/// `FERRITE_CUDA_Q4K_WARPS=<n>`: warps the tensor-core GEMVs (Q4_K, Q6_K)
/// aim to run, k split between a tile's warps (0, the default: as many as the GPU
/// holds at once); for comparison.
pub fn cuda_q4k_warps() -> Option<u32> {
    var("FERRITE_CUDA_Q4K_WARPS").and_then(|v| v.to_str()?.parse().ok())
}

/// `FERRITE_CUDA_SM_BUSY=0`: the tile GEMVs load their first weights ahead
/// of their wait on every SM, decode attention's too (cuda/sm_busy.rs); for
/// comparison.
pub fn cuda_sm_busy() -> bool {
    on_unless_zero("FERRITE_CUDA_SM_BUSY")
}

/// `FERRITE_CUDA_GLU_X8=0`: a gated MLP on quantized blocks at decode sizes
/// runs its activation as a kernel of its own instead of in the down
/// projection's input quantization; for comparison.
pub fn cuda_glu_x8() -> bool {
    on_unless_zero("FERRITE_CUDA_GLU_X8")
}

/// `FERRITE_CUDA_FOLD_NORM=0`: RMS norms stay kernels of their own at
/// decode sizes instead of being folded into the 16-bit weights that read
/// them; for comparison.
pub fn cuda_fold_norm() -> bool {
    on_unless_zero("FERRITE_CUDA_FOLD_NORM")
}

/// `FERRITE_CUDA_ATTN_X8=0`: the output projection's quantized input (GGUF
/// blocks, decode sizes) made by a kernel of its own after attention instead
/// of by the attention row kernel; for comparison.
pub fn cuda_attn_x8() -> bool {
    on_unless_zero("FERRITE_CUDA_ATTN_X8")
}

/// `FERRITE_CUDA_DUAL_X8=0`: a decode matmul group of Q4_K and other
/// k-quant weights quantizes its input once per order, in two launches;
/// for comparison.
pub fn cuda_dual_x8() -> bool {
    on_unless_zero("FERRITE_CUDA_DUAL_X8")
}

/// `FERRITE_CUDA_B32_TILES=0`: rows of whole super-blocks of 32-value
/// blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) keep the file's blocks on the GPU and decode on the dp4a
/// GEMVs, instead of tiles of 16 rows on the tensor cores
/// (kernels/gemv_tile_b32.cu); for comparison.
pub fn cuda_b32_tiles() -> bool {
    use std::sync::OnceLock;
    // (Read once: a weight's layout and its kernels must agree.)
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| on_unless_zero("FERRITE_CUDA_B32_TILES"))
}

/// `FERRITE_CUDA_PAD_TILES=1`: rows of 32-value blocks that are not whole
/// super-blocks (SmolLM2's k = 576, Gemma-3-270M's 640) go to the
/// tensor-core GEMVs too, their last super-block padded with zero blocks at
/// upload; off until measured on a GPU.
pub fn cuda_pad_tiles() -> bool {
    use std::sync::OnceLock;
    // (Read once: a weight's layout and its kernels must agree.)
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| var("FERRITE_CUDA_PAD_TILES").is_some_and(|v| v == "1"))
}

/// `FERRITE_CUDA_FIVE_BIT_TILES=0`: Q5_K weights, and Q5_0 and Q5_1 rows of
/// whole super-blocks, keep the file's blocks on the GPU and decode on the
/// dp4a GEMVs, instead of tiles of 16 rows on the tensor cores
/// (kernels/gemv_tile.cu `Q5kTile`, gemv_tile_b32.cu); for comparison.
pub fn cuda_five_bit_tiles() -> bool {
    use std::sync::OnceLock;
    // (Read once: a weight's layout and its kernels must agree.)
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| on_unless_zero("FERRITE_CUDA_FIVE_BIT_TILES"))
}

/// `FERRITE_CUDA_DEQUANT_KTILED=0`: prefill dequantizes Q4_K and Q5_K
/// tiles a thread per 32 values, instead of a warp per tile column with the
/// GEMV's coalesced loads (`dequant_ktiled`: on an H100 pp512 Q4_K_M 1.14x,
/// Q5_K_M 1.03x of its file blocks where a thread a chunk was 0.86x); for
/// comparison.
pub fn cuda_dequant_ktiled() -> bool {
    on_unless_zero("FERRITE_CUDA_DEQUANT_KTILED")
}

/// `FERRITE_CUDA_DEQUANT_TILED=0`: prefill dequantizes tiled Q4_0, Q4_1
/// and Q8_0 weights a block a thread (`dequant_f16`), instead of a warp per
/// tile column with the GEMV's coalesced loads (`dequant_f16_tiled`: Q8_0
/// pp512 1.21x on the H200); for comparison.
pub fn cuda_dequant_tiled() -> bool {
    on_unless_zero("FERRITE_CUDA_DEQUANT_TILED")
}

/// `FERRITE_CUDA_MIXED_QKV=0`: Q4_K q/k and a Q6_K v at batch 1 run as two
/// GEMV launches instead of one; for comparison.
pub fn cuda_mixed_qkv() -> bool {
    on_unless_zero("FERRITE_CUDA_MIXED_QKV")
}

/// `FERRITE_CUDA_QKV_ROPE=0`: at batch 1, Q4_K q/k/v GEMVs (with a Q4_K or
/// Q6_K v) write their output, and a kernel of its own applies RoPE and
/// writes the KV cache, instead of their epilogue (kernels/rope_kv.cuh;
/// measured 1.2% faster on the H200); for comparison.
pub fn cuda_qkv_rope() -> bool {
    on_unless_zero("FERRITE_CUDA_QKV_ROPE")
}

/// `FERRITE_FEED_PENDING=0`: requests with repetition, presence or frequency
/// penalties wait for each pick, instead of being fed ahead with the device
/// counting each row's last pick (still unread) in their penalties
/// (`RowSampling::pending`); for comparison.
pub fn feed_pending() -> bool {
    on_unless_zero("FERRITE_FEED_PENDING")
}

/// `FERRITE_FEED_AHEAD=0`: `run`, `serve` and `bench` wait for each step's sampled token
/// before launching the next step, instead of launching it fed from the
/// device (`ferrite_backend::picks`); for measuring what feeding saves.
pub fn feed_ahead() -> bool {
    on_unless_zero("FERRITE_FEED_AHEAD")
}
