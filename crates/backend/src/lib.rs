//! The op set every backend implements, on typed tensors. A backend knows nothing
//! about transformers: models compose these ops (see `ferrite-models`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod harness;
pub mod picks;
pub mod quant;
pub mod sampling;

use ferrite_core::{DType, Error, HostBytes, Result};

/// A 2-D weight as stored in the checkpoint: `rows` outputs of `cols` inputs each.
#[derive(Clone)]
pub struct RawWeight {
    pub name: String,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: HostBytes,
}

impl RawWeight {
    /// Rows of whole blocks, and exactly the bytes that [rows, cols] of this
    /// type take: what every backend checks before trusting the bytes.
    pub fn check_size(&self) -> Result<()> {
        let block = self.dtype.block_size();
        let want = self.rows * (self.cols / block) * self.dtype.block_bytes();
        if !self.cols.is_multiple_of(block) {
            return Err(ferrite_core::Error::Shape(format!(
                "{}: row length {} does not fit {} blocks",
                self.name, self.cols, self.dtype
            )));
        }
        if self.bytes.len() != want {
            return Err(ferrite_core::Error::Shape(format!(
                "{}: {} bytes for a [{}, {}] {} tensor (expected {want})",
                self.name,
                self.bytes.len(),
                self.rows,
                self.cols,
                self.dtype
            )));
        }
        Ok(())
    }

    /// Splits a fused weight by rows (e.g. a fused QKV projection), sharing bytes.
    pub fn split_rows(self, rows: &[usize]) -> Result<Vec<RawWeight>> {
        let block = self.dtype.block_size();
        if rows.iter().sum::<usize>() != self.rows || !self.cols.is_multiple_of(block) {
            return Err(ferrite_core::Error::Shape(format!(
                "{}: cannot split {} rows into {rows:?}",
                self.name, self.rows
            )));
        }
        let row_bytes = self.cols / block * self.dtype.block_bytes();
        let mut start = 0;
        let mut out = Vec::with_capacity(rows.len());
        for (i, &r) in rows.iter().enumerate() {
            out.push(RawWeight {
                name: format!("{}[{i}]", self.name),
                dtype: self.dtype,
                rows: r,
                cols: self.cols,
                bytes: self.bytes.sub(start * row_bytes..(start + r) * row_bytes),
            });
            start += r;
        }
        Ok(out)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// GELU, exact erf form.
    Gelu,
}

/// How `reduce_segments` folds a segment's rows into one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Mean,
    /// Element-wise maximum.
    Max,
}

/// Segments for `reduce_segments`: non-empty and inside `rows`.
pub(crate) fn check_segments(segs: &[std::ops::Range<usize>], rows: usize) -> Result<()> {
    match segs.iter().find(|s| s.start >= s.end || s.end > rows) {
        Some(s) => Err(Error::Shape(format!("segment {s:?} of {rows} rows"))),
        None => Ok(()),
    }
}

/// Inputs of `encoder_attention` (element counts of q, k and v for `n` rows):
/// whole heads of at most 256 values, query heads a multiple of the KV heads,
/// and sequences that are non-empty and cover the rows exactly once.
pub(crate) fn check_encoder_attention(
    p: &AttnParams,
    n: usize,
    (q_len, k_len, v_len): (usize, usize, usize),
    seqs: &[std::ops::Range<usize>],
) -> Result<()> {
    let kvd = p.n_kv_heads * p.head_dim;
    if q_len != n * p.n_heads * p.head_dim
        || k_len != n * kvd
        || v_len != k_len
        || p.n_kv_heads == 0
        || !p.n_heads.is_multiple_of(p.n_kv_heads)
        || p.head_dim > 256
    {
        return Err(Error::Shape("encoder attention: q, k or v shapes do not match (head size at most 256)".into()));
    }
    let mut covered = vec![false; n];
    for s in seqs {
        if s.end > n || s.is_empty() || covered[s.clone()].iter().any(|&c| c) {
            return Err(Error::Shape(format!("encoder attention: sequence rows {s:?} of {n}")));
        }
        covered[s.clone()].iter_mut().for_each(|c| *c = true);
    }
    if covered.iter().any(|&c| !c) {
        return Err(Error::Shape("encoder attention: rows without a sequence".into()));
    }
    Ok(())
}

/// Rotary embedding of one attention layer.
#[derive(Clone, Debug)]
pub struct Rope {
    pub head_dim: usize,
    /// One inverse frequency per rotated pair (head_dim / 2), scaling already applied.
    pub inv_freq: Vec<f32>,
    /// Rotate pairs (x[2i], x[2i+1]) (GGUF `llama` layout) instead of
    /// (x[i], x[i + d/2]) (HF / NeoX layout).
    pub interleaved: bool,
}

/// One sequence's share of a flat batch.
#[derive(Clone, Debug)]
pub struct SeqSlice {
    /// First row of this sequence's new tokens in the flat batch.
    pub q_start: usize,
    pub q_len: usize,
    /// Tokens in the cache after this step (earlier context plus the new ones).
    pub ctx_len: usize,
    pub block_table: Vec<u32>,
}

/// Per-batch attention metadata, the same for every layer.
#[derive(Clone, Debug, Default)]
pub struct AttnBatch {
    pub seqs: Vec<SeqSlice>,
    pub block_size: usize,
    /// Cache slot of every new token, in flat-batch order.
    pub slots: Vec<usize>,
}

impl AttnBatch {
    /// Checks that the sequences' rows lie back to back, in order, covering
    /// rows 0..n (as the engine lays them out), and that every sequence's
    /// block table fits a pool of `n_blocks` blocks of `block_size`.
    pub fn validate(&self, n: usize, n_blocks: usize, block_size: usize) -> Result<()> {
        if self.block_size != block_size {
            return Err(ferrite_core::Error::Shape(format!(
                "attention batch uses blocks of {} tokens, the pool {block_size}",
                self.block_size
            )));
        }
        let mut next_row = 0;
        for (si, s) in self.seqs.iter().enumerate() {
            let used = s.ctx_len.div_ceil(block_size);
            if s.q_start != next_row
                || s.q_start + s.q_len > n
                || s.q_len > s.ctx_len
                || used > s.block_table.len()
                || s.block_table[..used].iter().any(|&b| b as usize >= n_blocks)
            {
                return Err(ferrite_core::Error::Shape(format!("attention batch entry {si} is inconsistent")));
            }
            next_row += s.q_len;
        }
        if next_row != n {
            return Err(ferrite_core::Error::Shape("attention batch leaves rows without a sequence".into()));
        }
        Ok(())
    }
}

/// A decode step's inputs: one new token per sequence (row i belongs to the
/// i-th sequence of `attn`), every row's logits wanted, in order.
/// A decoder layer with nothing between its matmuls but RMS norms, RoPE,
/// attention and a gated MLP (no biases, head norms or post-norms): what
/// `Backend::decode_layers` may run as a whole.
pub struct PlainLayer<'a, W, T> {
    pub attn_norm: &'a T,
    pub wqkv: [&'a W; 3],
    pub wo: &'a W,
    pub ffn_norm: &'a T,
    pub gate: &'a W,
    pub up: &'a W,
    pub down: &'a W,
    pub rope: &'a Rope,
    pub attn: &'a AttnParams,
    pub eps: f32,
    pub act: Activation,
}

pub struct DecodeStep<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub attn: &'a AttnBatch,
}

/// An encoder pass's inputs as its ops see them: flat token ids, each
/// token's position in its sequence, and the sequences back to back (any
/// padding rows last, as sequences of their own). The first `pooled`
/// sequences are the inputs the pass returns vectors for; `key` tells apart
/// passes whose ops differ beyond these shapes (the pooling).
pub struct EncodeStep<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub seqs: &'a [std::ops::Range<usize>],
    pub pooled: usize,
    pub key: u32,
}

/// Per-layer attention shape.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Sliding window: a query at position p sees keys at positions > p - window.
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

/// Shape of a paged KV pool: every layer has `n_blocks * block_size` slots.
#[derive(Clone, Copy, Debug)]
pub struct KvSpec {
    pub n_layers: usize,
    pub n_blocks: usize,
    pub block_size: usize,
    pub kv_dim: usize,
    pub dtype: KvDtype,
}

/// Precision of cached keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    /// f16 precision, llama.cpp's default.
    F16,
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(format!("unknown KV cache type {s:?} (f32 or f16)")),
        }
    }
}

/// How to draw one token from one row of logits where the logits are (the
/// host sampler's rules; see cuda/kernels/sample.cu).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowSampling {
    /// 0 (or less): greedy.
    pub temperature: f32,
    /// 0: off.
    pub top_k: u32,
    /// 1.0: off.
    pub top_p: f32,
    /// 0.0: off.
    pub min_p: f32,
    /// Seeds this draw's noise; the host draws it from the request's RNG.
    pub seed: u64,
    /// Per-token changes before anything else, one per distinct token.
    pub edits: Vec<LogitEdit>,
    /// A token generated but not yet on the host: this row's pick in the
    /// last sampling launch (the device's own, read there; it is the row's
    /// input, fed), which `edits` leave out and which counts as the newest
    /// token of the history.
    pub pending: Option<PendingEdit>,
}

/// `x += bias`, then the repetition penalty (`x / rep` if positive, `x * rep`
/// if not; 1.0 for none), then `x -= sub` (presence and frequency penalties).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitEdit {
    pub token: u32,
    pub bias: f32,
    pub rep: f32,
    pub sub: f32,
    /// How many times the token was generated (what `sub` counts; 0 where
    /// neither presence nor frequency penalty is on), for a pending token
    /// equal to it (`PendingEdit`).
    pub count: u32,
}

/// What a pending token (`RowSampling::pending`) does to its own edit: the
/// repetition penalty `rep` (1.0 for none), and where `presence` or
/// `frequency` is not zero, `sub` as for one generation more.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PendingEdit {
    pub rep: f32,
    pub presence: f32,
    pub frequency: f32,
}

/// What the presence and frequency penalties subtract from a token generated
/// `count` times: the one rounding every sampler (host, reference, device's
/// `sample.cu`) applies, so that their edits agree bit for bit.
pub fn penalty_sub(count: u32, presence: f32, frequency: f32) -> f32 {
    count as f32 * frequency + presence
}

impl RowSampling {
    /// Plain argmax: every filter and edit off.
    pub fn greedy() -> RowSampling {
        RowSampling { top_p: 1.0, ..RowSampling::default() }
    }
}

impl PendingEdit {
    /// `e` (the pending token's edit, or the empty one) once the token is
    /// generated once more (`sub` as the host writes it, `count * frequency +
    /// presence`, so that a step fed ahead draws as one that waits).
    pub fn after(&self, e: &LogitEdit) -> LogitEdit {
        let count = e.count + 1;
        let counted = self.presence != 0.0 || self.frequency != 0.0;
        LogitEdit {
            rep: if self.rep != 1.0 { self.rep } else { e.rep },
            sub: if counted { penalty_sub(count, self.presence, self.frequency) } else { e.sub },
            count,
            ..*e
        }
    }
}

impl LogitEdit {
    /// No change to `token`.
    pub fn none(token: u32) -> LogitEdit {
        LogitEdit { token, bias: 0.0, rep: 1.0, sub: 0.0, count: 0 }
    }

    pub fn apply(&self, x: f32) -> f32 {
        let mut v = x + self.bias;
        if self.rep != 1.0 {
            v = if v > 0.0 { v / self.rep } else { v * self.rep };
        }
        v - self.sub
    }
}

pub trait Backend: Send + Sync {
    /// Activations: a row-major matrix [rows, cols].
    type Tensor: Send + Sync;
    type Weight: Send + Sync;
    type KvPool: Send + Sync;

    fn name(&self) -> String;
    fn weight(&self, raw: RawWeight) -> Result<Self::Weight>;
    fn upload(&self, data: Vec<f32>, rows: usize, cols: usize) -> Result<Self::Tensor>;
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);

    /// Rows of `table` for `ids`, dequantized.
    fn embedding(&self, table: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor>;
    /// x [n, k] times w [m, k] transposed: [n, m].
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor>;
    /// x times each of `ws` (projections sharing their input, as q, k and v):
    /// one pass where a backend can. A fixed count, so that the results need
    /// no list (the CPU decode loop allocates nothing).
    fn matmul_many<const N: usize>(&self, x: &Self::Tensor, ws: [&Self::Weight; N]) -> Result<[Self::Tensor; N]> {
        let mut out = Vec::with_capacity(N);
        for w in ws {
            out.push(self.matmul(x, w)?);
        }
        Ok(out.try_into().unwrap_or_else(|_| unreachable!("one output per weight")))
    }
    /// act(x · gate^T) * (x · up^T): a gated MLP's input to its down
    /// projection, in one pass where a backend can.
    fn matmul_glu(
        &self,
        x: &Self::Tensor,
        gate: &Self::Weight,
        up: &Self::Weight,
        act: Activation,
    ) -> Result<Self::Tensor> {
        let [g, u] = self.matmul_many(x, [gate, up])?;
        self.glu(&g, &u, act)
    }
    /// x += a · w^T: a projection added to the residual stream `x`, in one
    /// pass where a backend can (the add in the matmul's epilogue).
    fn matmul_add(&self, x: &mut Self::Tensor, a: &Self::Tensor, w: &Self::Weight) -> Result<()> {
        let y = self.matmul(a, w)?;
        self.add(x, &y)
    }
    /// `matmul_many` of the RMS norm of x's rows (weights `norm`): a layer's
    /// projections of its normed residual stream, the norm fused into the
    /// matmuls where a backend can (decode: the norm's scale factors out of
    /// each row's dot product).
    fn norm_matmul_many<const N: usize>(
        &self,
        x: &Self::Tensor,
        norm: &Self::Tensor,
        eps: f32,
        ws: [&Self::Weight; N],
    ) -> Result<[Self::Tensor; N]> {
        let h = self.rms_norm(x, norm, eps)?;
        self.matmul_many(&h, ws)
    }
    /// Folds the weights of an RMS norm into the matmuls that alone read its
    /// output (w[r, c] *= norm[c], rounded to the weights' type) where the
    /// backend runs faster so, and returns the norm to pass with them from
    /// then on (all ones); `None`: nothing folded, keep `norm`.
    fn fold_norm(&self, _norm: &Self::Tensor, _ws: &mut [&mut Self::Weight]) -> Result<Option<Self::Tensor>> {
        Ok(None)
    }
    /// `matmul_glu` of the RMS norm of x's rows, fused as `norm_matmul_many`.
    fn norm_matmul_glu(
        &self,
        x: &Self::Tensor,
        norm: &Self::Tensor,
        eps: f32,
        gate: &Self::Weight,
        up: &Self::Weight,
        act: Activation,
    ) -> Result<Self::Tensor> {
        let h = self.rms_norm(x, norm, eps)?;
        self.matmul_glu(&h, gate, up, act)
    }
    /// x += `matmul_glu` of the RMS norm of x's rows, times `down`^T: a
    /// layer's MLP added to the residual stream. Its inner activations are
    /// read by the matmuls alone, so a backend may keep them in the matmuls'
    /// input type only.
    #[allow(clippy::too_many_arguments)]
    fn mlp_add(
        &self,
        x: &mut Self::Tensor,
        norm: &Self::Tensor,
        eps: f32,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        act: Activation,
    ) -> Result<()> {
        let m = self.norm_matmul_glu(x, norm, eps, gate, up, act)?;
        self.matmul_add(x, &m, down)
    }
    /// x · w^T plus `bias` [1, m] on every row.
    fn linear(&self, x: &Self::Tensor, w: &Self::Weight, bias: Option<&Self::Tensor>) -> Result<Self::Tensor> {
        let mut y = self.matmul(x, w)?;
        if let Some(b) = bias {
            self.add_row(&mut y, b)?;
        }
        Ok(y)
    }
    /// Adds `v` [1, cols] to every row of `x`.
    fn add_row(&self, x: &mut Self::Tensor, v: &Self::Tensor) -> Result<()>;
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    fn scale(&self, x: &mut Self::Tensor, s: f32) -> Result<()>;
    /// RMS norm over each group of `w.cols` elements (a whole row, or one head).
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
    /// act(gate) * up.
    fn glu(&self, gate: &Self::Tensor, up: &Self::Tensor, act: Activation) -> Result<Self::Tensor>;
    /// Rotates every head of every row by its token's position.
    fn rope(&self, x: &mut Self::Tensor, rope: &Rope, positions: &[u32]) -> Result<()>;
    /// `rope` on q and on k (same rows, same positions), in one pass where a
    /// backend can.
    fn rope_qk(&self, q: &mut Self::Tensor, k: &mut Self::Tensor, rope: &Rope, positions: &[u32]) -> Result<()> {
        self.rope(q, rope, positions)?;
        self.rope(k, rope, positions)
    }
    /// LayerNorm of each row: (x - mean) / sqrt(var + eps) * w, plus `b` if given.
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        b: Option<&Self::Tensor>,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// x += y, then the LayerNorm of every row of x (the residual add fused
    /// with the norm after it).
    fn add_layer_norm(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        w: &Self::Tensor,
        b: Option<&Self::Tensor>,
        eps: f32,
    ) -> Result<Self::Tensor> {
        self.add(x, y)?;
        self.layer_norm(x, w, b, eps)
    }
    /// act(x) elementwise, in place.
    fn activate(&self, x: &mut Self::Tensor, act: Activation) -> Result<()>;
    /// `cap * tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Tensor, cap: f32) -> Result<()>;
    /// Selected rows, in the given order.
    fn rows(&self, x: &Self::Tensor, rows: &[usize]) -> Result<Self::Tensor>;

    /// Runs `forward`, the model's pass over decode step `step`, returning
    /// its logits. A backend may capture the pass once per batch size and
    /// then replay it with new inputs (CUDA graphs); the default runs it.
    fn decode_step(
        &self,
        step: &DecodeStep,
        forward: &mut dyn FnMut() -> Result<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        let _ = step;
        forward()
    }

    /// The first layers of a decode step on the residual stream `x` at
    /// once, where a backend can (one persistent kernel on CUDA): of
    /// `n_layers` layers, `layer(l)` each (`None`: not a plain layer).
    /// Returns how many it ran (0: none, nothing done); the caller runs the
    /// rest.
    fn decode_layers<'l>(
        &self,
        x: &mut Self::Tensor,
        n_layers: usize,
        layer: &dyn Fn(usize) -> Option<PlainLayer<'l, Self::Weight, Self::Tensor>>,
        positions: &[u32],
        kv: &mut Self::KvPool,
        batch: &AttnBatch,
    ) -> Result<usize> {
        let _ = (x, n_layers, layer, positions, kv, batch);
        Ok(0)
    }

    /// The rows an encoder batch of `n` tokens is padded to: more than `n`
    /// where a backend replays passes of a few sizes (CUDA graphs).
    fn encoder_rows(&self, n: usize) -> usize {
        n
    }

    /// Runs `forward`, an encoder's pass over `step`, returning its output.
    /// A backend may capture the pass once per shape and replay it with new
    /// inputs (CUDA graphs); the default runs it.
    fn encode_step(
        &self,
        step: &EncodeStep,
        forward: &mut dyn FnMut() -> Result<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        let _ = step;
        forward()
    }

    /// Whether `sample` runs here (else logits go to the host to be sampled).
    fn samples_on_device(&self) -> bool {
        false
    }
    /// One token per row of `logits` [rows.len(), vocab], drawn where the
    /// logits are: (token, log-softmax of the edited logits at the token).
    /// The logits are overwritten. `None` when this backend does not sample.
    fn sample(&self, _logits: &mut Self::Tensor, _rows: &[RowSampling]) -> Result<Option<Vec<(u32, f32)>>> {
        Ok(None)
    }
    /// `sample`, without waiting for the picks to come back: a backend that
    /// `feeds_tokens` keeps them on the device for the next step too.
    fn sample_begin(&self, logits: &mut Self::Tensor, rows: &[RowSampling]) -> Result<Option<picks::Picks>> {
        Ok(self.sample(logits, rows)?.map(picks::Picks::ready))
    }
    /// Whether token ids may be fed ids (`picks::FED_TOKEN`): the tokens the
    /// last `sample_begin` drew, read on the device.
    fn feeds_tokens(&self) -> bool {
        false
    }

    /// Bidirectional attention inside each sequence of a flat batch, for
    /// encoders (no KV cache): q, k, v [n, n_heads * head_dim], `seqs` the rows
    /// of each sequence. `p.window` is a band: the query at i sees the keys j
    /// with |i - j| <= window. GQA as in `attention`.
    fn encoder_attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        seqs: &[std::ops::Range<usize>],
        p: &AttnParams,
    ) -> Result<Self::Tensor>;

    /// One row per segment of `x`'s rows (sentence pooling): their mean or
    /// element-wise maximum. Segments are non-empty and inside `x`.
    fn reduce_segments(&self, x: &Self::Tensor, segs: &[std::ops::Range<usize>], how: Reduce) -> Result<Self::Tensor>;

    fn kv_pool(&self, spec: KvSpec) -> Result<Self::KvPool>;
    /// Stores k and v [n, kv_dim] of layer `layer` at `batch.slots`.
    fn write_kv(
        &self,
        pool: &mut Self::KvPool,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        batch: &AttnBatch,
    ) -> Result<()>;
    /// `rope_qk`, then k and v stored as by `write_kv`: one kernel where a
    /// backend can (a decoder layer's steps between its q/k/v projections and
    /// attention).
    #[allow(clippy::too_many_arguments)] // the two ops' arguments, unchanged
    fn rope_write_kv(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        rope: &Rope,
        positions: &[u32],
        (pool, layer): (&mut Self::KvPool, usize),
        batch: &AttnBatch,
    ) -> Result<()> {
        self.rope_qk(q, k, rope, positions)?;
        self.write_kv(pool, layer, k, v, batch)
    }
    /// A layer's attention inputs: q, k and v projected from x's RMS norm
    /// (`norm_matmul_many`), then `rope_write_kv`; returns q. Its q, k and v
    /// are read by RoPE and attention alone, so a backend may keep them in
    /// 16 bits (where the model adds no bias and norms no head between).
    #[allow(clippy::too_many_arguments)]
    fn norm_qkv_rope_kv(
        &self,
        x: &Self::Tensor,
        (norm, eps): (&Self::Tensor, f32),
        wqkv: [&Self::Weight; 3],
        rope: &Rope,
        positions: &[u32],
        kv: (&mut Self::KvPool, usize),
        batch: &AttnBatch,
    ) -> Result<Self::Tensor> {
        let [mut q, mut k, v] = self.norm_matmul_many(x, norm, eps, wqkv)?;
        self.rope_write_kv(&mut q, &mut k, &v, rope, positions, kv, batch)?;
        Ok(q)
    }
    /// Causal attention of q [n, n_heads * head_dim] over each sequence's cached keys.
    fn attention(
        &self,
        q: &Self::Tensor,
        pool: &Self::KvPool,
        layer: usize,
        batch: &AttnBatch,
        p: &AttnParams,
    ) -> Result<Self::Tensor>;
    /// x += `attention`(q) · wo^T: the output projection added to the
    /// residual stream. The attention output is read by that matmul alone,
    /// so a backend may keep it in the matmul's input type only.
    #[allow(clippy::too_many_arguments)]
    fn attention_project_add(
        &self,
        x: &mut Self::Tensor,
        q: &Self::Tensor,
        pool: &Self::KvPool,
        layer: usize,
        batch: &AttnBatch,
        p: &AttnParams,
        wo: &Self::Weight,
    ) -> Result<()> {
        let a = self.attention(q, pool, layer, batch, p)?;
        self.matmul_add(x, &a, wo)
    }
}
