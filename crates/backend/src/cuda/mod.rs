//! The CUDA backend: f32 activations on the GPU, 16-bit weights multiplied by
//! cuBLASLt on tensor cores, and our own kernels (kernels/*.cu) compiled with
//! NVRTC for the device at first use. The same op set as the CPU backend,
//! checked against it op by op (`ferrite gpu-check`).

mod capture_alloc;
mod ceilings;
mod compile;
mod device;
mod encode_graph;
mod gemv;
mod graph;
mod kv;
mod launch;
mod lt;
mod picks;
pub mod profile;
mod tensor;
pub mod trace;
mod weight;

pub use ceilings::Ceilings;
pub use compile::{compile, nvrtc_available, MODULES};
pub use device::{device_count, CudaOptions};
pub use kv::CudaKvPool;
pub use tensor::CudaTensor;
pub use weight::{CudaWeight, Storage};

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use ferrite_core::{Error, Result};

use crate::picks::Picks;
use crate::{
    check_encoder_attention, check_segments, Activation, AttnBatch, AttnParams, Backend, DecodeStep, EncodeStep,
    KvSpec, PlainLayer, RawWeight, Reduce, Rope, RowSampling,
};
use device::{device_err, elementwise, per_row, Device};
use gemv::Norm;
use graph::{Field, Graphs, Words, MAX_GRAPH_ROWS};
use kv::{KvBuf, MetaCache, Source};
use sample::Drawn;
use tensor::{half_args, HalfCopy, HalfOut};

/// Launches kernel `$name` with the given arguments, in the kernel's order.
macro_rules! launch {
    ($self:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let mut b = $self.dev.launch($name);
        $( b.arg($arg); )*
        b.run($cfg)
    }};
}

// After `launch!`, which they use.
mod decode_layers;
mod decode_window;
mod mlp_fused;
mod rope;
mod sample;
mod sm_busy;

pub struct CudaBackend {
    dev: Arc<Device>,
    meta: Arc<MetaCache>,
    exact_f32: bool,
    /// Capture decode steps as CUDA graphs (not with `--enforce-eager`, nor
    /// while profiling, which times ops one by one).
    use_graphs: bool,
    graphs: Graphs,
}

/// A clone shares the GPU and its caches; its graphs are its own (a graph
/// holds one model's weights and KV pool).
impl Clone for CudaBackend {
    fn clone(&self) -> Self {
        CudaBackend {
            dev: self.dev.clone(),
            meta: self.meta.clone(),
            exact_f32: self.exact_f32,
            use_graphs: self.use_graphs,
            graphs: Graphs::default(),
        }
    }
}

fn act_code(a: Activation) -> i32 {
    match a {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
        Activation::Gelu => 2,
    }
}

fn same_shape(a: &CudaTensor, b: &CudaTensor, op: &str) -> Result<()> {
    if a.rows != b.rows || a.cols != b.cols {
        return Err(Error::Shape(format!("{op}: [{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols)));
    }
    Ok(())
}

impl CudaBackend {
    /// Opens a GPU and compiles (or loads cached) kernels. Errors say why no
    /// GPU is usable (no driver, no device, a library missing).
    pub fn open(opts: &CudaOptions) -> Result<CudaBackend> {
        let dev = Device::open(opts)?;
        Ok(CudaBackend {
            dev: Arc::new(dev),
            meta: Arc::default(),
            exact_f32: opts.exact_f32,
            use_graphs: !opts.eager && !ferrite_core::env::profiling(),
            graphs: Graphs::default(),
        })
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.dev.memory()
    }

    /// Waits for all queued work; a failed kernel surfaces here.
    pub fn synchronize(&self) -> Result<()> {
        self.dev.sync()
    }

    fn alloc(&self, n: usize) -> Result<CudaSlice<f32>> {
        // SAFETY: callers write every element before it is read.
        unsafe { self.dev.alloc::<f32>(n.max(1)) }.map_err(|e| device_err("alloc", e))
    }

    fn tensor(&self, buf: CudaSlice<f32>, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor::new(buf, rows, cols)
    }

    /// The 16-bit type ops write their outputs in too, for the GEMMs that read
    /// them: bf16 where f32 weights are kept in bf16 (not `--precision f32`).
    fn half_acts(&self) -> Option<Storage> {
        (!self.exact_f32).then_some(Storage::Bf16)
    }

    /// Float4s per lane of the warp-per-row LayerNorm kernel for rows of
    /// `cols` (None: the block-per-row kernel).
    fn layer_norm_vec(cols: usize) -> Option<usize> {
        if cols == 0 || !cols.is_multiple_of(4) {
            return None;
        }
        [2, 4, 8].into_iter().find(|v| cols / 4 <= 32 * v)
    }

    /// LayerNorm of x (+ y, written back to x, when given) over each row,
    /// with its 16-bit copy where ops write one.
    fn layer_norm_rows(
        &self,
        x: &CudaTensor,
        y: Option<&CudaTensor>,
        w: &CudaTensor,
        b: Option<&CudaTensor>,
        eps: f32,
    ) -> Result<CudaTensor> {
        let len = |t: &CudaTensor| t.rows * t.cols;
        if len(w) != x.cols || b.is_some_and(|b| len(b) != x.cols) {
            return Err(Error::Shape(format!("layer_norm: weights do not match {} columns", x.cols)));
        }
        let mut out = self.alloc(x.rows * x.cols)?;
        if x.rows == 0 {
            return Ok(self.tensor(out, x.rows, x.cols));
        }
        let (cols, null) = (x.cols as u32, 0u64);
        let Some(vec) = Self::layer_norm_vec(x.cols) else {
            // A residual only comes with rows the warp kernel takes.
            let cfg = per_row(x.rows, x.cols);
            match b {
                Some(b) => launch!(
                    self,
                    "layer_norm",
                    cfg,
                    x.f32(&self.dev)?,
                    w.f32(&self.dev)?,
                    b.f32(&self.dev)?,
                    &mut out,
                    &cols,
                    &eps
                ),
                None => {
                    launch!(self, "layer_norm", cfg, x.f32(&self.dev)?, w.f32(&self.dev)?, &null, &mut out, &cols, &eps)
                }
            }?;
            return Ok(self.tensor(out, x.rows, x.cols));
        };
        const ROWS_PER_BLOCK: usize = 8;
        let cfg = LaunchConfig {
            grid_dim: (x.rows.div_ceil(ROWS_PER_BLOCK) as u32, 1, 1),
            block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut half = self.alloc_half(x.rows, x.cols)?;
        let (hp, bf16) = half_args(&self.dev.stream, &mut half);
        let rows = x.rows as u32;
        let ptr = |t: Option<&CudaTensor>| -> Result<u64> {
            Ok(match t {
                Some(t) => t.f32(&self.dev)?.device_ptr(&self.dev.stream).0,
                None => 0,
            })
        };
        let (yp, bp) = (ptr(y)?, ptr(b)?);
        // The residual's sum is written back into x's buffer (the caller's &mut).
        let xp = x.f32(&self.dev)?.device_ptr(&self.dev.stream).0;
        let name = format!("layer_norm_w{vec}");
        launch!(self, &name, cfg, &xp, &yp, w.f32(&self.dev)?, &bp, &mut out, &hp, &bf16, &rows, &cols, &eps)?;
        let mut t = self.tensor(out, x.rows, x.cols);
        t.set_half(half);
        Ok(t)
    }

    /// A buffer for the 16-bit copy of a [rows, cols] output, when ops write
    /// one and a GEMM may read it.
    fn alloc_half(&self, rows: usize, cols: usize) -> Result<HalfCopy> {
        let Some(st) = self.half_acts().filter(|_| weight::gemm_rows(&self.dev, rows)) else { return Ok(None) };
        // SAFETY: the op that asked writes every element.
        let buf = unsafe { self.dev.alloc::<u16>((rows * cols).max(1)) }.map_err(|e| device_err("alloc", e))?;
        Ok(Some((st, buf)))
    }

    /// The gated activation of gate and up ([rows, cols]) by `kernel`, which
    /// takes (gate, up, out, n, act, half, bf16) and one thread per `per`
    /// values; `G` is the element type gate and up come in.
    fn glu_launch<G: cudarc::driver::DeviceRepr>(
        &self,
        kernel: &str,
        per: usize,
        (gate, up): (&CudaSlice<G>, &CudaSlice<G>),
        (rows, cols): (usize, usize),
        act: Activation,
        half_only: bool,
    ) -> Result<CudaTensor> {
        let n = rows * cols;
        let mut half = self.alloc_half(rows, cols)?;
        let (out, op) = tensor::f32_output(&self.dev, n, &half, half_only)?;
        let (n64, code) = (n as u64, act_code(act));
        let (hp, bf16) = half_args(&self.dev.stream, &mut half);
        launch!(self, kernel, elementwise(n.div_ceil(per)), gate, up, &op, &n64, &code, &hp, &bf16)?;
        tensor::output(out, rows, cols, half)
    }

    /// Whether GEMMs reading the 16-bit copy ops write (`half_acts`) are all
    /// that runs `n` rows times each of `ws`: then that copy alone may be written.
    fn gemms_read_half(&self, n: usize, ws: &[&CudaWeight]) -> bool {
        let Some(st) = self.half_acts().filter(|_| self.dev.half_only) else { return false };
        weight::gemm_rows(&self.dev, n)
            && ws.iter().all(|w| w.storage == st && !gemv::uses_gemv(&self.dev, n, w.cols, w.storage))
    }

    /// Paged attention of q over one layer of the pool; `half_only`: only
    /// GEMMs of the 16-bit type read the output (`gemms_read_half`).
    fn attention_out(
        &self,
        q: &CudaTensor,
        (pool, layer): (&CudaKvPool, usize),
        batch: &AttnBatch,
        p: &AttnParams,
        half_only: bool,
        x8: Option<&mut gemv::X8>,
    ) -> Result<(CudaTensor, bool)> {
        let (kv_blocks, block_size) = (pool.slots / pool.block_size, pool.block_size);
        self.graphs.note(|l| (l.kv_blocks, l.block_size) = (kv_blocks, block_size));
        let half = HalfOut { half: self.alloc_half(q.rows, q.cols)?, only: half_only };
        kv::attention(&self.dev, &self.source(), q, (pool, layer), batch, p, half, x8)
    }

    /// RMS norm over each group of `w`'s length, its 16-bit copy alone with
    /// `half_only` (rows for GEMMs only: `gemms_read_half`).
    fn rms_norm_out(&self, x: &CudaTensor, w: &CudaTensor, eps: f32, half_only: bool) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "rms_norm");
        let g = w.rows * w.cols;
        if g == 0 || !x.cols.is_multiple_of(g) {
            return Err(Error::Shape(format!("rms_norm: {} columns in groups of {g}", x.cols)));
        }
        let groups = x.rows * x.cols / g;
        // Per head (QK-norm), the output goes to RoPE, not a GEMM.
        let mut half = if g == x.cols { self.alloc_half(x.rows, x.cols)? } else { None };
        let (out, op) = tensor::f32_output(&self.dev, x.rows * x.cols, &half, half_only)?;
        if groups > 0 {
            let g32 = g as u32;
            let (hp, bf16) = half_args(&self.dev.stream, &mut half);
            let (xb, wb) = (x.f32(&self.dev)?, w.f32(&self.dev)?);
            let n4 = g / 4;
            if g == x.cols && g.is_multiple_of(4) && n4 <= 1024 * 8 {
                // Whole rows of float4s: kernels/ops.cu `rms_norm4`. Many
                // rows: four a thread (more rows in flight per SM); decode's
                // few: one a thread (shortest row). The batch-invariant mode
                // keeps one a thread: the block's sum order must not depend
                // on the batch.
                let per = if x.rows > 8 && !self.dev.deterministic { 4 } else { 1 };
                let threads = n4.div_ceil(per).clamp(32, 1024).div_ceil(32) as u32 * 32;
                let cfg =
                    LaunchConfig { grid_dim: (groups as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
                launch!(self, "rms_norm4", cfg, xb, wb, &op, &g32, &eps, &hp, &bf16)?;
            } else {
                launch!(self, "rms_norm", per_row(groups, g), xb, wb, &op, &g32, &eps, &hp, &bf16)?;
            }
        }
        tensor::output(out, x.rows, x.cols, half)
    }

    /// `norm_matmul_glu`, its output's 16-bit copy alone with `half_only`
    /// as in `matmul_glu_out`.
    fn norm_glu_out(
        &self,
        x: &CudaTensor,
        norm: Norm,
        (gate, up): (&CudaWeight, &CudaWeight),
        act: Activation,
        half_only: bool,
    ) -> Result<CudaTensor> {
        // Blocks: gate and up GEMVs with the norm fused, then `glu`.
        if gemv::fuses_norm(&self.dev, x, norm, &[gate, up]) {
            let [g, u] = self.norm_matmul_many(x, norm.w, norm.eps, [gate, up])?;
            return self.glu(&g, &u, act);
        }
        // 16-bit weights with the norm folded in: one GEMV.
        if gemv::folds_norm(&self.dev, x, &[gate, up]) {
            let _span = profile::span(&self.dev.stream, "matmul_glu (norm folded)");
            if let Some(y) = gemv::gemv_glu(&self.dev, x, gate, up, act_code(act), Some(norm.eps))? {
                return Ok(y);
            }
        }
        let h = self.rms_norm_out(x, norm.w, norm.eps, self.gemms_read_half(x.rows, &[gate, up]))?;
        self.matmul_glu_out(&h, (gate, up), act, half_only)
    }

    /// `matmul_glu`, its output's 16-bit copy alone with `half_only` where
    /// the fused GEMMs run (`gemms_read_half` of the matmul that reads it).
    fn matmul_glu_out(
        &self,
        x: &CudaTensor,
        (gate, up): (&CudaWeight, &CudaWeight),
        act: Activation,
        half_only: bool,
    ) -> Result<CudaTensor> {
        // Shapes the fused kernel does not take (mismatches included) go to
        // the matmuls, which check them.
        let fused = {
            let _span = profile::span(&self.dev.stream, "matmul_glu");
            gemv::gemv_glu(&self.dev, x, gate, up, act_code(act), None)?
        };
        if let Some(y) = fused {
            return Ok(y);
        }
        let gate_up = {
            let _span = profile::span(&self.dev.stream, "matmul_many");
            weight::gemm_gate_up(&self.dev, x, gate, up)?
        };
        let Some([g, u]) = gate_up else {
            let [g, u] = self.matmul_many(x, [gate, up])?;
            return self.glu(&g, &u, act);
        };
        let _span = profile::span(&self.dev.stream, "glu");
        // Four values a thread.
        self.glu_launch("glu_bf16in", 4, (&g, &u), (x.rows, gate.rows), act, half_only)
    }

    fn upload_u32(&self, v: Vec<u32>) -> Result<Arc<CudaSlice<u32>>> {
        self.meta.get(&self.dev, v)
    }

    fn source(&self) -> Source<'_> {
        match self.graphs.capturing() {
            Some(step) => Source::Step(step),
            None => Source::Upload(&self.meta),
        }
    }

    /// A step input: from the captured step's inputs while a decode step is
    /// captured, else as `words`.
    fn step_words(&self, field: Field, host: impl FnOnce() -> Vec<u32>) -> Result<Words> {
        match self.graphs.capturing() {
            Some(step) => Ok(step.words(field)),
            None => self.words(host()),
        }
    }

    /// An array an op reads: uploaded, or while an encoder pass is captured,
    /// the field of its inputs holding these words.
    fn words(&self, host: Vec<u32>) -> Result<Words> {
        if let Some(e) = self.graphs.encoding() {
            return e.find(&host);
        }
        if self.graphs.is_capturing() {
            return Err(Error::Device("an upload inside a captured decode step".into()));
        }
        self.upload_u32(host).map(Words::all)
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvPool = CudaKvPool;

    fn name(&self) -> String {
        format!("cuda:{} ({}, {})", self.dev.ctx.ordinal(), self.dev.name, self.dev.arch)
    }

    fn weight(&self, raw: RawWeight) -> Result<CudaWeight> {
        weight::upload(&self.dev, raw, self.exact_f32)
    }

    fn upload(&self, data: Vec<f32>, rows: usize, cols: usize) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "upload");
        if data.len() != rows * cols {
            return Err(Error::Shape(format!("{} values for [{rows}, {cols}]", data.len())));
        }
        let src = if data.is_empty() { vec![0f32] } else { data };
        let buf = self.dev.stream.clone_htod(&src).map_err(|e| device_err("upload", e))?;
        Ok(self.tensor(buf, rows, cols))
    }

    fn to_host(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        let _span = profile::span(&self.dev.stream, "to_host");
        let mut v = self.dev.stream.clone_dtoh(t.f32(&self.dev)?).map_err(|e| device_err("download", e))?;
        v.truncate(t.rows * t.cols);
        Ok(v)
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn embedding(&self, table: &CudaWeight, ids: &[u32]) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "embedding");
        picks::check_ids(ids, table.rows)?;
        let d = table.cols;
        let mut out = self.alloc(ids.len() * d)?;
        self.graphs.note(|l| l.vocab = table.rows);
        if !ids.is_empty() {
            let ids = self.step_words(Field::Ids, || ids.to_vec())?;
            self.graphs.note(|l| l.bounds.push((ids.range(), table.rows)));
            let ids = ids.view();
            let (cols, code, picks) = (d as u32, table.code(), &self.dev.picks.device);
            if let Storage::Quant(_) = table.storage {
                let row_bytes = table.row_bytes();
                let cfg = per_row(ids.len(), d / 32);
                launch!(self, "embedding_q", cfg, &table.data, &ids, picks, &mut out, &code, &row_bytes, &cols)?;
            } else {
                launch!(self, "embedding", per_row(ids.len(), d), &table.data, &ids, picks, &mut out, &cols, &code)?;
            }
        }
        Ok(self.tensor(out, ids.len(), d))
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaWeight) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "matmul");
        weight::matmul(&self.dev, x, w)
    }

    fn matmul_many<const N: usize>(&self, x: &CudaTensor, ws: [&CudaWeight; N]) -> Result<[CudaTensor; N]> {
        let _span = profile::span(&self.dev.stream, "matmul_many");
        let out = weight::matmul_many(&self.dev, x, &ws, None)?;
        Ok(out.try_into().unwrap_or_else(|_| unreachable!("one output per weight")))
    }

    fn matmul_add(&self, x: &mut CudaTensor, a: &CudaTensor, w: &CudaWeight) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "matmul_add");
        weight::matmul_add(&self.dev, x, a, w)
    }

    fn norm_matmul_many<const N: usize>(
        &self,
        x: &CudaTensor,
        norm: &CudaTensor,
        eps: f32,
        ws: [&CudaWeight; N],
    ) -> Result<[CudaTensor; N]> {
        let fused = Norm { w: norm, eps };
        if !gemv::fuses_norm(&self.dev, x, fused, &ws) && !gemv::folds_norm(&self.dev, x, &ws) {
            let h = self.rms_norm_out(x, norm, eps, self.gemms_read_half(x.rows, &ws))?;
            return self.matmul_many(&h, ws);
        }
        let _span = profile::span(&self.dev.stream, "norm_matmul_many");
        let out = weight::matmul_many(&self.dev, x, &ws, Some(fused))?;
        Ok(out.try_into().unwrap_or_else(|_| unreachable!("one output per weight")))
    }

    /// Bf16 and f16 weights: each weight times the norm's, rounded once, so
    /// that a decode GEMV reads its input as it is and norms by the squares it
    /// loads (`gemv::folds_norm`; the norm's scale factors out of each dot
    /// product), with no norm kernel. Other sizes norm by the ones returned.
    /// On the H200, random Llama-3.1-8B bf16 batch 1: see README.
    fn fold_norm(&self, norm: &CudaTensor, ws: &mut [&mut CudaWeight]) -> Result<Option<CudaTensor>> {
        let k = norm.rows * norm.cols;
        let dense = |w: &CudaWeight| matches!(w.storage, Storage::Bf16 | Storage::F16) && w.cols == k && !w.norm_folded;
        if !self.dev.fold_norm || self.dev.deterministic || ws.is_empty() || !ws.iter().all(|w| dense(w)) {
            return Ok(None);
        }
        let s = norm.f32(&self.dev)?;
        for w in ws.iter_mut() {
            let n = w.rows * w.cols;
            let bf16 = (w.storage == Storage::Bf16) as i32;
            // `data` holds n 16-bit values; s holds k = w.cols.
            let mut a = self.dev.launch("scale_cols_half");
            a.arg(&mut w.data).arg(s).arg(n as u64).arg(k as u32).arg(bf16);
            a.run(elementwise(n))?;
            w.norm_folded = true;
        }
        self.upload(vec![1.0; k], norm.rows, norm.cols).map(Some)
    }

    fn norm_matmul_glu(
        &self,
        x: &CudaTensor,
        norm: &CudaTensor,
        eps: f32,
        gate: &CudaWeight,
        up: &CudaWeight,
        act: Activation,
    ) -> Result<CudaTensor> {
        self.norm_glu_out(x, Norm { w: norm, eps }, (gate, up), act, false)
    }

    fn mlp_add(
        &self,
        x: &mut CudaTensor,
        norm: &CudaTensor,
        eps: f32,
        gate: &CudaWeight,
        up: &CudaWeight,
        down: &CudaWeight,
        act: Activation,
    ) -> Result<()> {
        let in_norm = Norm { w: norm, eps };
        if mlp_fused::takes(&self.dev, x.rows, gate, up, down) {
            return mlp_fused::mlp_add(&self.dev, x, in_norm, (gate, up, down), act_code(act));
        }
        // Blocks at GEMV sizes: the gated activation in the down GEMV's
        // input quantization (one kernel a layer fewer).
        let blocks = |w: &CudaWeight| matches!(w.storage, Storage::Quant(_));
        if gemv::fuses_glu(&self.dev, x.rows, down) && blocks(gate) && blocks(up) {
            let [g, u] = self.norm_matmul_many(x, norm, eps, [gate, up])?;
            let _span = profile::span(&self.dev.stream, "matmul_add (+ glu)");
            return gemv::gemv_add_glu(&self.dev, x, (&g, &u, act_code(act)), down);
        }
        let m = self.norm_glu_out(x, in_norm, (gate, up), act, self.gemms_read_half(x.rows, &[down]))?;
        self.matmul_add(x, &m, down)
    }

    fn matmul_glu(&self, x: &CudaTensor, gate: &CudaWeight, up: &CudaWeight, act: Activation) -> Result<CudaTensor> {
        self.matmul_glu_out(x, (gate, up), act, false)
    }

    fn linear(&self, x: &CudaTensor, w: &CudaWeight, bias: Option<&CudaTensor>) -> Result<CudaTensor> {
        let Some(b) = bias else { return self.matmul(x, w) };
        if b.rows * b.cols != w.rows {
            return Err(Error::Shape(format!(
                "linear {}: {} bias values for {} outputs",
                w.name,
                b.rows * b.cols,
                w.rows
            )));
        }
        let (mut y, added) = {
            let _span = profile::span(&self.dev.stream, "matmul (+ bias)");
            weight::matmul_bias(&self.dev, x, w, b)?
        };
        if !added {
            self.add_row(&mut y, b)?;
        }
        Ok(y)
    }

    fn add_row(&self, x: &mut CudaTensor, v: &CudaTensor) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "add_row");
        if v.rows * v.cols != x.cols {
            return Err(Error::Shape(format!("add_row: {} values for {} columns", v.rows * v.cols, x.cols)));
        }
        let (n, cols) = ((x.rows * x.cols) as u64, x.cols as u32);
        launch!(self, "add_row", elementwise(n as usize), x.f32_mut(&self.dev)?, v.f32(&self.dev)?, &n, &cols)
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "add");
        same_shape(x, y, "add")?;
        let n = (x.rows * x.cols) as u64;
        launch!(self, "add", elementwise(n as usize), x.f32_mut(&self.dev)?, y.f32(&self.dev)?, &n)
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "scale");
        let n = (x.rows * x.cols) as u64;
        launch!(self, "scale", elementwise(n as usize), x.f32_mut(&self.dev)?, &s, &n)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        self.rms_norm_out(x, w, eps, false)
    }

    fn glu(&self, gate: &CudaTensor, up: &CudaTensor, act: Activation) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "glu");
        same_shape(gate, up, "glu")?;
        self.glu_launch("glu", 1, (gate.f32(&self.dev)?, up.f32(&self.dev)?), (gate.rows, gate.cols), act, false)
    }

    fn rope(&self, x: &mut CudaTensor, rope: &Rope, positions: &[u32]) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "rope");
        self.rope_launch(x, None, rope, positions)
    }

    fn rope_qk(&self, q: &mut CudaTensor, k: &mut CudaTensor, rope: &Rope, positions: &[u32]) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "rope");
        self.rope_launch(q, Some(k), rope, positions)
    }

    fn layer_norm(&self, x: &CudaTensor, w: &CudaTensor, b: Option<&CudaTensor>, eps: f32) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "layer_norm");
        self.layer_norm_rows(x, None, w, b, eps)
    }

    fn add_layer_norm(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        w: &CudaTensor,
        b: Option<&CudaTensor>,
        eps: f32,
    ) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "add_layer_norm");
        same_shape(x, y, "add_layer_norm")?;
        if Self::layer_norm_vec(x.cols).is_none() {
            self.add(x, y)?;
            return self.layer_norm_rows(x, None, w, b, eps);
        }
        // The kernel writes the sum back into x's f32 values.
        x.f32_mut(&self.dev)?;
        self.layer_norm_rows(x, Some(y), w, b, eps)
    }

    fn activate(&self, x: &mut CudaTensor, act: Activation) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "activate");
        let (n, code) = ((x.rows * x.cols) as u64, act_code(act));
        let Some((st, mut half)) = self.alloc_half(x.rows, x.cols)? else {
            return launch!(self, "activate", elementwise(n as usize), x.f32_mut(&self.dev)?, &n, &code);
        };
        let bf16 = (st == Storage::Bf16) as i32;
        launch!(self, "activate_half", elementwise(n as usize), x.f32_mut(&self.dev)?, &mut half, &n, &code, &bf16)?;
        x.set_half(Some((st, half)));
        Ok(())
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "softcap");
        let n = (x.rows * x.cols) as u64;
        launch!(self, "softcap", elementwise(n as usize), x.f32_mut(&self.dev)?, &cap, &n)
    }

    fn rows(&self, x: &CudaTensor, rows: &[usize]) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "rows");
        if let Some(r) = rows.iter().find(|&&r| r >= x.rows) {
            return Err(Error::Shape(format!("row {r} of {}", x.rows)));
        }
        let mut out = self.alloc(rows.len() * x.cols)?;
        if !rows.is_empty() {
            let idx = self.words(rows.iter().map(|&r| r as u32).collect())?;
            let idx = idx.view();
            let cols = x.cols as u32;
            launch!(self, "gather_rows", per_row(rows.len(), x.cols), x.f32(&self.dev)?, &idx, &mut out, &cols)?;
        }
        Ok(self.tensor(out, rows.len(), x.cols))
    }

    fn decode_step(&self, step: &DecodeStep, forward: &mut dyn FnMut() -> Result<CudaTensor>) -> Result<CudaTensor> {
        let n = step.tokens.len();
        if !self.use_graphs || n == 0 || n > MAX_GRAPH_ROWS {
            return forward();
        }
        self.graphs.run(&self.dev, step, forward)
    }

    fn encoder_rows(&self, n: usize) -> usize {
        if self.use_graphs {
            graph::encoder_rows(n)
        } else {
            n
        }
    }

    fn encode_step(&self, step: &EncodeStep, forward: &mut dyn FnMut() -> Result<CudaTensor>) -> Result<CudaTensor> {
        if !self.use_graphs || step.tokens.is_empty() {
            let _span = profile::pass_span(&self.dev.stream, "encoder pass (eager)");
            return forward();
        }
        self.graphs.run_encode(&self.dev, step, forward)
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn sample(&self, logits: &mut CudaTensor, rows: &[RowSampling]) -> Result<Option<Vec<(u32, f32)>>> {
        let _span = profile::span(&self.dev.stream, "sample");
        match self.launch_sample(logits, rows)? {
            Drawn::Nothing => Ok(Some(Vec::new())),
            Drawn::Picks => self.dev.picks.read(&self.dev.stream, rows.len()).map(Some),
            Drawn::Own(out) => picks::download(&self.dev.stream, &out).map(Some),
        }
    }

    fn sample_begin(&self, logits: &mut CudaTensor, rows: &[RowSampling]) -> Result<Option<Picks>> {
        let _span = profile::span(&self.dev.stream, "sample");
        match self.launch_sample(logits, rows)? {
            Drawn::Nothing => Ok(Some(Picks::ready(Vec::new()))),
            Drawn::Picks => self.dev.picks.copy_back(&self.dev.stream, rows.len()).map(Some),
            // (Too many rows for fed ids to name: the picks come back now.)
            Drawn::Own(out) => picks::download(&self.dev.stream, &out).map(|p| Some(Picks::ready(p))),
        }
    }

    fn feeds_tokens(&self) -> bool {
        true
    }

    fn encoder_attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        seqs: &[std::ops::Range<usize>],
        p: &AttnParams,
    ) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "encoder_attention");
        let len = |t: &CudaTensor| t.rows * t.cols;
        check_encoder_attention(p, q.rows, (len(q), len(k), len(v)), seqs)?;
        let tiles = encode_graph::attention_tiles(seqs);
        let mut out = self.alloc(q.rows * q.cols)?;
        if tiles.is_empty() {
            return Ok(self.tensor(out, q.rows, q.cols));
        }
        // In a captured pass, the field of tiles is longer (empty tiles).
        let tiles = self.words(tiles)?;
        let n_tiles = (tiles.len() / 4) as u32;
        let tiles = tiles.view();
        // Head sizes compiled in, else values per thread (d) and threads per
        // query row (g): 16 values for small heads, else 32.
        let hd = p.head_dim;
        let (name, g) = match hd {
            32 | 64 | 128 => (format!("encoder_attention_hd{hd}"), hd / 32),
            _ => {
                let d = if hd <= 32 { 16 } else { 32 };
                let g = hd.div_ceil(d).next_power_of_two();
                let units = if hd.is_multiple_of(4) { "" } else { "_s" };
                (format!("encoder_attention_d{d}_g{g}{units}"), g)
            }
        };
        let cfg = LaunchConfig {
            grid_dim: (n_tiles, p.n_heads as u32, 1),
            block_dim: ((encode_graph::TILE_ROWS * g) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (nh, nkv, hd) = (p.n_heads as u32, p.n_kv_heads as u32, p.head_dim as u32);
        let window = p.window.unwrap_or(0) as u32;
        let mut half = self.alloc_half(q.rows, q.cols)?;
        let (hp, bf16) = half_args(&self.dev.stream, &mut half);
        launch!(
            self,
            &name,
            cfg,
            q.f32(&self.dev)?,
            k.f32(&self.dev)?,
            v.f32(&self.dev)?,
            &mut out,
            &hp,
            &bf16,
            &tiles,
            &nh,
            &nkv,
            &hd,
            &window,
            &p.scale
        )?;
        let mut t = self.tensor(out, q.rows, q.cols);
        t.set_half(half);
        Ok(t)
    }

    fn reduce_segments(&self, x: &CudaTensor, segs: &[std::ops::Range<usize>], how: Reduce) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "reduce_segments");
        check_segments(segs, x.rows)?;
        let mut out = self.alloc(segs.len() * x.cols)?;
        if !segs.is_empty() {
            let bounds = self.words(segs.iter().flat_map(|s| [s.start as u32, s.end as u32]).collect())?;
            let bounds = bounds.view();
            let (cols, mode) = (x.cols as u32, (how == Reduce::Max) as i32);
            let cfg = per_row(segs.len(), x.cols);
            launch!(self, "reduce_segments", cfg, x.f32(&self.dev)?, &bounds, &mut out, &cols, &mode)?;
        }
        Ok(self.tensor(out, segs.len(), x.cols))
    }

    fn kv_pool(&self, spec: KvSpec) -> Result<CudaKvPool> {
        // Graphs hold the old pool's buffers.
        self.graphs.clear();
        CudaKvPool::new(&self.dev, spec)
    }

    fn write_kv(
        &self,
        pool: &mut CudaKvPool,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        batch: &AttnBatch,
    ) -> Result<()> {
        let _span = profile::span(&self.dev.stream, "write_kv");
        kv::write_kv(&self.dev, &self.source(), pool, layer, k, v, batch)
    }

    fn rope_write_kv(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        rope: &Rope,
        positions: &[u32],
        pool: (&mut CudaKvPool, usize),
        batch: &AttnBatch,
    ) -> Result<()> {
        self.rope_kv((q, k, v), rope, positions, pool, batch)
    }

    fn decode_layers<'l>(
        &self,
        x: &mut CudaTensor,
        n_layers: usize,
        layer: &dyn Fn(usize) -> Option<PlainLayer<'l, CudaWeight, CudaTensor>>,
        positions: &[u32],
        kv: &mut CudaKvPool,
        batch: &AttnBatch,
    ) -> Result<usize> {
        self.decode_layers_fused(x, n_layers, layer, positions, kv, batch)
    }

    fn norm_qkv_rope_kv(
        &self,
        x: &CudaTensor,
        (norm, eps): (&CudaTensor, f32),
        wqkv: [&CudaWeight; 3],
        rope: &Rope,
        positions: &[u32],
        (pool, layer): (&mut CudaKvPool, usize),
        batch: &AttnBatch,
    ) -> Result<CudaTensor> {
        let fused = Norm { w: norm, eps };
        if let Some(q) = self.qkv_rope_kv_fused(x, fused, wqkv, rope, positions, (&mut *pool, layer), batch)? {
            return Ok(q);
        }
        // Prefill with bf16 weights and an f16 cache: q, k and v in bf16
        // alone (the GEMMs write half the bytes; RoPE and the flash kernel
        // read them as they are).
        let f16_cache = pool.k.get(layer).is_some_and(|k| matches!(k, KvBuf::F16(_)));
        let qkv = match f16_cache && self.gemms_read_half(x.rows, &wqkv) {
            true => {
                let h = self.rms_norm_out(x, norm, eps, true)?;
                let _span = profile::span(&self.dev.stream, "matmul_many (bf16 out)");
                weight::gemm_bf16_out(&self.dev, &h, &wqkv)?.and_then(|v| <[CudaTensor; 3]>::try_from(v).ok())
            }
            false => None,
        };
        let [mut q, mut k, v] = match qkv {
            Some(qkv) => qkv,
            None => self.norm_matmul_many(x, norm, eps, wqkv)?,
        };
        self.rope_write_kv(&mut q, &mut k, &v, rope, positions, (pool, layer), batch)?;
        Ok(q)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        pool: &CudaKvPool,
        layer: usize,
        batch: &AttnBatch,
        p: &AttnParams,
    ) -> Result<CudaTensor> {
        let _span = profile::span(&self.dev.stream, "attention");
        let (kv_blocks, block_size) = (pool.slots / pool.block_size, pool.block_size);
        self.graphs.note(|l| (l.kv_blocks, l.block_size) = (kv_blocks, block_size));
        self.attention_out(q, (pool, layer), batch, p, false, None).map(|(a, _)| a)
    }

    fn attention_project_add(
        &self,
        x: &mut CudaTensor,
        q: &CudaTensor,
        pool: &CudaKvPool,
        layer: usize,
        batch: &AttnBatch,
        p: &AttnParams,
        wo: &CudaWeight,
    ) -> Result<()> {
        // A quantized GEMV's input: written by the attention kernel too,
        // where it can (one kernel a layer fewer).
        // (Each row-kernel block quantizes its KV head's query heads.)
        let span = p.n_heads / p.n_kv_heads.max(1) * p.head_dim;
        let mut x8 = match self.dev.attn_x8 {
            true => gemv::x8_room(&self.dev, q.rows, q.cols, wo, span)?,
            false => None,
        };
        let (a, quantized) = {
            let _span = profile::span(&self.dev.stream, "attention");
            self.attention_out(q, (pool, layer), batch, p, self.gemms_read_half(q.rows, &[wo]), x8.as_mut())?
        };
        let _span = profile::span(&self.dev.stream, "matmul_add");
        let x8 = x8.filter(|_| quantized).map_or([None, None, None], gemv::X8::into_cache);
        weight::matmul_add_x8(&self.dev, x, &a, wo, x8)
    }
}
