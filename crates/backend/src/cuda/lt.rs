//! Dense GEMMs through cuBLASLt. A plan (operation and layout descriptors and
//! the heuristic's fastest algorithm) is made once per shape and element
//! types and reused; a shape cuBLASLt has no algorithm for falls back to
//! cublasGemmEx (the caller's job). The heuristic costs about a millisecond
//! of host time, and encoders and prefills see a new token count (n) nearly
//! every batch: its choice is kept per power-of-two range of n and reused,
//! after cuBLASLt confirms it supports the exact shape. In the batch-invariant
//! mode one algorithm serves every n of a weight shape (chosen for PINNED_N
//! tokens, or `FERRITE_CUDA_PINNED_N`, without split-K): a token's output is then summed in the same
//! order whatever else is in the batch. With `FERRITE_CUDA_GEMM_TUNE=1`,
//! prefill-sized GEMMs (`TUNE_MIN_N` tokens and more) time the heuristic's
//! first candidates on their own operands instead, once per range, and keep
//! the fastest.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublas::sys::cudaDataType;
use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::{result as lt, sys as lsys};

/// The token count whose algorithm every GEMM of a shape uses in the
/// batch-invariant mode (`FERRITE_CUDA_PINNED_N` sets another). 256 against
/// 4,096 (fifty-ninth session, H100, bf16 8B): batch-1 decode +67%, 64
/// streams +59%, prefill of 8 x 2,048 tokens -12%.
const PINNED_N: usize = 256;

/// Token counts from which a shape's algorithm is chosen by timing
/// (`Lt::tuned`): there a GEMM takes milliseconds, and its timing is steady.
const TUNE_MIN_N: usize = 1024;
/// Heuristic candidates timed.
const TUNE_CANDIDATES: usize = 8;

/// Plans kept at most; serving sees many batch sizes, so the cache is reset
/// when full rather than grown without bound.
const MAX_PLANS: usize = 512;

/// C (m x n, leading dimension ldc) = A^T · B with A k x m and B k x n,
/// column-major, f32 accumulation: the element types and sizes of one GEMM;
/// `bias`: plus an f32 vector of m values on every column (the epilogue).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ldc: usize,
    pub a: cudaDataType,
    pub b: cudaDataType,
    pub c: cudaDataType,
    pub bias: bool,
}

struct Plan {
    desc: lsys::cublasLtMatmulDesc_t,
    layouts: [lsys::cublasLtMatrixLayout_t; 3],
    algo: lsys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created once and is destroyed once, here.
        unsafe {
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// The cuBLASLt handle and its plans.
pub struct Lt {
    handle: lsys::cublasLtHandle_t,
    plans: Mutex<HashMap<Shape, Plan>>,
    /// The heuristic's algorithm per shape with n rounded up to a power of two.
    algos: Mutex<HashMap<Shape, lsys::cublasLtMatmulAlgo_t>>,
    workspace: (u64, usize),
    /// Batch-invariant mode: one algorithm per (m, k, types) whatever n,
    /// without split-K, so that a token's output never depends on the others.
    pinned: bool,
    /// The token count whose algorithm the batch-invariant mode pins.
    pinned_n: usize,
    /// Time candidates for prefill-sized GEMMs (`Lt::tuned`).
    tune: bool,
}

// SAFETY: the handle and descriptors are used under the plans' mutex or
// read-only, and all work goes to the device's one stream.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn lt_type(t: cudaDataType) -> lsys::cudaDataType {
    match t {
        cudaDataType::CUDA_R_16F => lsys::cudaDataType::CUDA_R_16F,
        cudaDataType::CUDA_R_16BF => lsys::cudaDataType::CUDA_R_16BF,
        _ => lsys::cudaDataType::CUDA_R_32F,
    }
}

impl Lt {
    /// `workspace`: a device buffer (pointer, bytes) that outlives this.
    /// `pinned`: the batch-invariant mode (see `Lt::pinned`).
    /// `tune`: time candidates for prefill-sized GEMMs (`Lt::tuned`).
    pub fn new(workspace: (u64, usize), pinned: bool, tune: bool) -> Result<Lt, CublasError> {
        let handle = lt::create_handle()?;
        let pinned_n = ferrite_core::env::cuda_pinned_n().unwrap_or(PINNED_N);
        Ok(Lt { handle, plans: Mutex::default(), algos: Mutex::default(), workspace, pinned, pinned_n, tune })
    }

    /// The operation and layout descriptors of shape `s` (no algorithm yet).
    fn plan_layouts(&self, s: &Shape) -> Result<Plan, CublasError> {
        let desc =
            lt::create_matmul_desc(lsys::cublasComputeType_t::CUBLAS_COMPUTE_32F, lsys::cudaDataType::CUDA_R_32F)?;
        let transpose: i32 = 1; // CUBLAS_OP_T
        let layout = |t, rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(lt_type(t), rows as u64, cols as u64, ld as i64)
        };
        // SAFETY: the descriptor is live; the attribute is an i32.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &transpose as *const i32 as *const c_void,
                4,
            )?;
        }
        if s.bias {
            let epilogue = lsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
            // SAFETY: the descriptor is live; the attribute is the enum (32 bits).
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc,
                    lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    &epilogue as *const _ as *const c_void,
                    std::mem::size_of_val(&epilogue),
                )?;
            }
        }
        let mut plan = Plan { desc, layouts: [std::ptr::null_mut(); 3], algo: unsafe { std::mem::zeroed() } };
        plan.layouts[0] = layout(s.a, s.k, s.m, s.k)?;
        plan.layouts[1] = layout(s.b, s.k, s.n, s.k)?;
        plan.layouts[2] = layout(s.c, s.m, s.n, s.ldc)?;
        Ok(plan)
    }

    /// `ops`: A's and B's pointers and the stream, for timing candidates.
    fn plan(&self, s: &Shape, ops: ([u64; 2], lsys::cudaStream_t)) -> Result<Plan, CublasError> {
        let mut plan = self.plan_layouts(s)?;
        let range = Shape { n: if self.pinned { self.pinned_n } else { s.n.next_power_of_two() }, ..*s };
        let known = self.algos.lock().unwrap_or_else(|e| e.into_inner()).get(&range).copied();
        if let Some(algo) = known {
            if self.supports(&plan, &algo) {
                plan.algo = algo;
                return Ok(plan);
            }
            if self.pinned {
                return Err(CublasError(lsys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED));
            }
        }
        plan.algo = match (self.pinned, self.tune && s.n >= TUNE_MIN_N && !s.bias) {
            (true, _) => self.pinned_algo(&range)?,
            // SAFETY: the caller's operands, on its stream.
            (false, true) => match unsafe { self.tuned(&plan, s, ops) } {
                Ok(Some(algo)) => algo,
                _ => self.heuristic(&plan, false)?,
            },
            (false, false) => self.heuristic(&plan, false)?,
        };
        if self.pinned && !self.supports(&plan, &plan.algo) {
            return Err(CublasError(lsys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED));
        }
        let mut algos = self.algos.lock().unwrap_or_else(|e| e.into_inner());
        if algos.len() >= MAX_PLANS {
            algos.clear();
        }
        algos.insert(range, plan.algo);
        Ok(plan)
    }

    /// The batch-invariant mode's algorithm for `range` (n = pinned_n): the
    /// heuristic's choice among those that reduce in place (no split-K), with
    /// the split count set to one.
    fn pinned_algo(&self, range: &Shape) -> Result<lsys::cublasLtMatmulAlgo_t, CublasError> {
        let mut algo = self.heuristic(&self.plan_layouts(range)?, true)?;
        let one: i32 = 1;
        // SAFETY: `algo` is a live value; the attribute is an i32.
        unsafe {
            lsys::cublasLtMatmulAlgoConfigSetAttribute(
                &mut algo,
                lsys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                &one as *const i32 as *const c_void,
                4,
            )
            .result()?;
        }
        Ok(algo)
    }

    /// Whether `algo` runs `plan`'s exact shape within the workspace.
    fn supports(&self, plan: &Plan, algo: &lsys::cublasLtMatmulAlgo_t) -> bool {
        let [a, b, c] = plan.layouts;
        let mut result = std::mem::MaybeUninit::<lsys::cublasLtMatmulHeuristicResult_t>::uninit();
        // SAFETY: live descriptors; `result` is written by the call.
        let status =
            unsafe { lsys::cublasLtMatmulAlgoCheck(self.handle, plan.desc, a, b, c, c, algo, result.as_mut_ptr()) };
        // SAFETY: written when the status is success.
        status == lsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && unsafe { result.assume_init() }.workspaceSize <= self.workspace.1
    }

    /// The heuristic's fastest algorithm for `plan`; `in_place`: only among
    /// those that reduce in place (no split-K).
    fn heuristic(&self, plan: &Plan, in_place: bool) -> Result<lsys::cublasLtMatmulAlgo_t, CublasError> {
        let pref = lt::create_matmul_pref()?;
        let max_ws = self.workspace.1 as u64;
        let none = lsys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        // SAFETY: live descriptors; the preference is destroyed below.
        let found = unsafe {
            let mut set = lt::set_matmul_pref_attribute(
                pref,
                lsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &max_ws as *const u64 as *const c_void,
                8,
            );
            if in_place {
                set = set.and_then(|_| {
                    lt::set_matmul_pref_attribute(
                        pref,
                        lsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                        &none as *const u32 as *const c_void,
                        4,
                    )
                });
            }
            let [a, b, c] = plan.layouts;
            let found = set.and_then(|_| lt::get_matmul_algo_heuristic(self.handle, plan.desc, a, b, c, c, pref));
            let _ = lt::destroy_matmul_pref(pref);
            found
        }?;
        Ok(found.algo)
    }

    /// The fastest of the heuristic's first candidates for `plan`, timed on
    /// A and B (`ops`) with a scratch C; `None` while the stream is captured
    /// into a graph (no timing there) or with fewer than two candidates.
    ///
    /// SAFETY: A and B must be live buffers of the shape's sizes, ordered by `stream`.
    unsafe fn tuned(
        &self,
        plan: &Plan,
        s: &Shape,
        ([a, b], stream): ([u64; 2], lsys::cudaStream_t),
    ) -> Result<Option<lsys::cublasLtMatmulAlgo_t>, String> {
        use cudarc::driver::{result as dr, sys as ds};
        let cu = stream as ds::CUstream;
        let idle = ds::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if dr::stream::is_capturing(cu).map_err(|e| e.to_string())? != idle {
            return Ok(None);
        }
        let pref = lt::create_matmul_pref().map_err(|e| format!("{e:?}"))?;
        let max_ws = self.workspace.1 as u64;
        let mut found: [lsys::cublasLtMatmulHeuristicResult_t; TUNE_CANDIDATES] = std::mem::zeroed();
        let mut count = 0i32;
        let [la, lb, lc] = plan.layouts;
        let asked = lt::set_matmul_pref_attribute(
            pref,
            lsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &max_ws as *const u64 as *const c_void,
            8,
        )
        .and_then(|_| {
            let n = TUNE_CANDIDATES as i32;
            let (f, c) = (found.as_mut_ptr(), &mut count);
            lsys::cublasLtMatmulAlgoGetHeuristic(self.handle, plan.desc, la, lb, lc, lc, pref, n, f, c).result()
        });
        let _ = lt::destroy_matmul_pref(pref);
        asked.map_err(|e| format!("{e:?}"))?;
        if count < 2 {
            return Ok(None);
        }
        let elem = if s.c == cudaDataType::CUDA_R_32F { 4 } else { 2 };
        let c = dr::malloc_async(cu, s.ldc * s.n * elem).map_err(|e| e.to_string())?;
        let events = [
            dr::event::create(ds::CUevent_flags::CU_EVENT_DEFAULT),
            dr::event::create(ds::CUevent_flags::CU_EVENT_DEFAULT),
        ];
        let (mut best, mut best_ms) = (None, f32::MAX);
        if let [Ok(start), Ok(end)] = events {
            let (alpha, beta) = (1f32, 0f32);
            let run = |algo: &lsys::cublasLtMatmulAlgo_t| {
                let (al, be) = (&alpha as *const f32 as *const c_void, &beta as *const f32 as *const c_void);
                let (ap, bp, cp) = (a as *const c_void, b as *const c_void, c as *mut c_void);
                let ws = self.workspace.0 as *mut c_void;
                lt::matmul(
                    self.handle,
                    plan.desc,
                    al,
                    be,
                    ap,
                    la,
                    bp,
                    lb,
                    cp,
                    lc,
                    cp,
                    lc,
                    algo,
                    ws,
                    self.workspace.1,
                    stream,
                )
            };
            for r in &found[..count as usize] {
                // A warm-up, then two timed runs.
                let timed = run(&r.algo).is_ok()
                    && dr::event::record(start, cu).is_ok()
                    && run(&r.algo).is_ok()
                    && run(&r.algo).is_ok()
                    && dr::event::record(end, cu).is_ok()
                    && dr::event::synchronize(end).is_ok();
                if let (true, Ok(ms)) = (timed, dr::event::elapsed(start, end)) {
                    if ms < best_ms {
                        (best, best_ms) = (Some(r.algo), ms);
                    }
                }
            }
        }
        for e in events.into_iter().flatten() {
            let _ = dr::event::destroy(e);
        }
        dr::free_async(c, cu).map_err(|e| e.to_string())?;
        Ok(best)
    }

    /// Runs the GEMM on `stream` with operands A, B and C; `bias` (an f32 vector of m values) when the
    /// shape has one; `beta` 1 adds the product to C (in place), 0 replaces it.
    ///
    /// SAFETY: the pointers must be live device buffers of the shape's sizes
    /// and types, and `stream` the stream that orders them.
    pub unsafe fn gemm(
        &self,
        s: &Shape,
        [a, b, c]: [u64; 3],
        bias: u64,
        beta: f32,
        stream: lsys::cudaStream_t,
    ) -> Result<(), CublasError> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if !plans.contains_key(s) {
            if plans.len() >= MAX_PLANS {
                plans.clear();
            }
            let plan = self.plan(s, ([a, b], stream))?;
            plans.insert(*s, plan);
        }
        let p = &plans[s];
        if s.bias {
            // The plan is shared: its bias pointer is set for each call, under the lock.
            lt::set_matmul_desc_attribute(
                p.desc,
                lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bias as *const u64 as *const c_void,
                8,
            )?;
        }
        let alpha = 1f32;
        let [la, lb, lc] = p.layouts;
        lt::matmul(
            self.handle,
            p.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            a as *const c_void,
            la,
            b as *const c_void,
            lb,
            c as *const c_void,
            lc,
            c as *mut c_void,
            lc,
            &p.algo,
            self.workspace.0 as *mut c_void,
            self.workspace.1,
            stream,
        )
    }
}
