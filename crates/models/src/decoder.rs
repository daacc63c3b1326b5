//! The decoder-only transformer shared by the Llama and Gemma 3 families, generic
//! over the backend. Per layer:
//!   h = norm(x); q,k,v = h·Wq,Wk,Wv (+bias); [qk-norm]; rope; cache k,v;
//!   a = attention(q); o = a·Wo; [post-norm]; x += o
//!   h = norm(x); m = act(h·Wgate) * (h·Wup); d = m·Wdown; [post-norm]; x += d
//! Weight names mirror the checkpoint's (canonical GGUF names).

use crate::checkpoint::Checkpoint;
use crate::config::{inv_freq, Family, LmConfig};
use crate::{CausalLm, ForwardBatch};
use ferrite_backend::picks::Picks;
use ferrite_backend::{AttnParams, Backend, DecodeStep, KvDtype, KvSpec, PlainLayer, Rope, RowSampling};
use ferrite_core::{Error, Result};

struct Layer<B: Backend> {
    attn_norm: B::Tensor,              // [hidden]
    wq: B::Weight,                     // [n_heads * head_dim, hidden]
    wk: B::Weight,                     // [n_kv_heads * head_dim, hidden]
    wv: B::Weight,                     // [n_kv_heads * head_dim, hidden]
    wo: B::Weight,                     // [hidden, n_heads * head_dim]
    bias: Option<[B::Tensor; 3]>,      // q, k, v biases (Qwen2)
    q_norm: Option<B::Tensor>,         // [head_dim]
    k_norm: Option<B::Tensor>,         // [head_dim]
    post_attn_norm: Option<B::Tensor>, // [hidden] (Gemma)
    ffn_norm: B::Tensor,               // [hidden]
    gate: B::Weight,                   // [ffn, hidden]
    up: B::Weight,                     // [ffn, hidden]
    down: B::Weight,                   // [hidden, ffn]
    post_ffw_norm: Option<B::Tensor>,  // [hidden] (Gemma)
    rope: Rope,
    attn: AttnParams,
}

pub struct Decoder<B: Backend> {
    backend: B,
    cfg: LmConfig,
    embed: B::Weight, // [vocab, hidden]
    layers: Vec<Layer<B>>,
    out_norm: B::Tensor,       // [hidden]
    output: Option<B::Weight>, // [vocab, hidden]; None: tied to `embed`
    kv: Option<B::KvPool>,
}

/// Loads norm vectors; HF Gemma stores `w` where the model computes with `1 + w`
/// (GGUF files already hold `1 + w`), so the offset is applied here, once.
struct NormLoader<'a, B: Backend> {
    ck: &'a Checkpoint,
    backend: &'a B,
    offset: f32,
}

impl<B: Backend> NormLoader<'_, B> {
    fn load(&self, name: &str, len: usize) -> Result<B::Tensor> {
        let mut v = self.ck.vector(name, len)?;
        v.iter_mut().for_each(|x| *x += self.offset);
        self.backend.upload(v, 1, len)
    }
    fn opt(&self, name: &str, len: usize) -> Result<Option<B::Tensor>> {
        if self.ck.has(name) {
            self.load(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl<B: Backend> Decoder<B> {
    pub fn load(backend: B, cfg: LmConfig, ck: &Checkpoint, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        cfg.validate()?;
        ck.check_layer_count(cfg.n_layers)?;
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let (qd, kvd) = (cfg.n_heads * hd, cfg.kv_dim());
        let gemma_hf = cfg.family == Family::Gemma3 && matches!(ck, Checkpoint::Hf(_));
        let norms = NormLoader { ck, backend: &backend, offset: if gemma_hf { 1.0 } else { 0.0 } };
        let w = |name: &str, rows, cols| ck.require(name, rows, cols).and_then(|raw| backend.weight(raw));
        let embed = w("token_embd.weight", cfg.vocab_size, h)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            progress(l, cfg.n_layers);
            let p = |s: &str| format!("blk.{l}.{s}");
            let bias = if cfg.qkv_bias {
                let b = |s: &str, n| ck.vector(&p(s), n).and_then(|v| backend.upload(v, 1, n));
                Some([b("attn_q.bias", qd)?, b("attn_k.bias", kvd)?, b("attn_v.bias", kvd)?])
            } else {
                None
            };
            let kind = &cfg.layers[l];
            let mut layer = Layer {
                attn_norm: norms.load(&p("attn_norm.weight"), h)?,
                wq: w(&p("attn_q.weight"), qd, h)?,
                wk: w(&p("attn_k.weight"), kvd, h)?,
                wv: w(&p("attn_v.weight"), kvd, h)?,
                wo: w(&p("attn_output.weight"), h, qd)?,
                bias,
                q_norm: if cfg.qk_norm { Some(norms.load(&p("attn_q_norm.weight"), hd)?) } else { None },
                k_norm: if cfg.qk_norm { Some(norms.load(&p("attn_k_norm.weight"), hd)?) } else { None },
                post_attn_norm: if cfg.sandwich_norms { norms.opt(&p("post_attention_norm.weight"), h)? } else { None },
                ffn_norm: norms.load(&p("ffn_norm.weight"), h)?,
                gate: w(&p("ffn_gate.weight"), cfg.ffn, h)?,
                up: w(&p("ffn_up.weight"), cfg.ffn, h)?,
                down: w(&p("ffn_down.weight"), h, cfg.ffn)?,
                post_ffw_norm: if cfg.sandwich_norms { norms.opt(&p("post_ffw_norm.weight"), h)? } else { None },
                rope: Rope { head_dim: hd, inv_freq: inv_freq(hd, kind), interleaved: cfg.rope_interleaved },
                attn: AttnParams {
                    n_heads: cfg.n_heads,
                    n_kv_heads: cfg.n_kv_heads,
                    head_dim: hd,
                    scale: cfg.attn_scale,
                    window: kind.window,
                    softcap: cfg.attn_softcap,
                },
            };
            // Each of these norms is read by these matmuls alone.
            if let Some(n) = backend.fold_norm(&layer.attn_norm, &mut [&mut layer.wq, &mut layer.wk, &mut layer.wv])? {
                layer.attn_norm = n;
            }
            if let Some(n) = backend.fold_norm(&layer.ffn_norm, &mut [&mut layer.gate, &mut layer.up])? {
                layer.ffn_norm = n;
            }
            layers.push(layer);
        }
        progress(cfg.n_layers, cfg.n_layers);
        let out_norm = norms.load("output_norm.weight", h)?;
        let output = match ck.get("output.weight")? {
            Some(raw) if !cfg.tied_embeddings || ck.has("output.weight") => {
                if raw.rows != cfg.vocab_size || raw.cols != h {
                    return Err(Error::Shape(format!("output weight is [{}, {}]", raw.rows, raw.cols)));
                }
                Some(backend.weight(raw)?)
            }
            _ => None,
        };
        if output.is_none() && !cfg.tied_embeddings {
            return Err(Error::format("checkpoint has no output weight and its embeddings are not tied"));
        }
        Ok(Decoder { backend, cfg, embed, layers, out_norm, output, kv: None })
    }

    /// One layer on the residual stream `x`: adds its attention and MLP
    /// outputs to it. Each norm of x goes into the matmuls that read it
    /// (`norm_matmul_*`, `mlp_add`) and each projection back into x
    /// (`attention_project_add`, `mlp_add`), so a backend can fuse both with
    /// its matmuls and keep what only the matmuls read in their input type.
    fn layer_forward(&self, l: usize, x: &mut B::Tensor, batch: &ForwardBatch, kv: &mut B::KvPool) -> Result<()> {
        let (b, c, layer) = (&self.backend, &self.cfg, &self.layers[l]);
        let (norm, wqkv) = ((&layer.attn_norm, c.norm_eps), [&layer.wq, &layer.wk, &layer.wv]);
        let q = if layer.bias.is_none() && layer.q_norm.is_none() {
            b.norm_qkv_rope_kv(x, norm, wqkv, &layer.rope, &batch.positions, (kv, l), &batch.attn)?
        } else {
            let [mut q, mut k, mut v] = b.norm_matmul_many(x, norm.0, norm.1, wqkv)?;
            if let Some([bq, bk, bv]) = &layer.bias {
                b.add_row(&mut q, bq)?;
                b.add_row(&mut k, bk)?;
                b.add_row(&mut v, bv)?;
            }
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                q = b.rms_norm(&q, qn, c.norm_eps)?;
                k = b.rms_norm(&k, kn, c.norm_eps)?;
            }
            b.rope_write_kv(&mut q, &mut k, &v, &layer.rope, &batch.positions, (kv, l), &batch.attn)?;
            q
        };
        match &layer.post_attn_norm {
            None => b.attention_project_add(x, &q, kv, l, &batch.attn, &layer.attn, &layer.wo)?,
            Some(post) => {
                let a = b.attention(&q, kv, l, &batch.attn, &layer.attn)?;
                self.post_norm_add(x, &a, &layer.wo, post)?;
            }
        }
        let (gate, up, down, act) = (&layer.gate, &layer.up, &layer.down, c.activation);
        match &layer.post_ffw_norm {
            None => b.mlp_add(x, &layer.ffn_norm, c.norm_eps, gate, up, down, act),
            Some(post) => {
                let m = b.norm_matmul_glu(x, &layer.ffn_norm, c.norm_eps, gate, up, act)?;
                self.post_norm_add(x, &m, down, post)
            }
        }
    }

    /// x += norm(a · w^T): a projection through Gemma's post-norm.
    fn post_norm_add(&self, x: &mut B::Tensor, a: &B::Tensor, w: &B::Weight, post: &B::Tensor) -> Result<()> {
        let b = &self.backend;
        let y = b.rms_norm(&b.matmul(a, w)?, post, self.cfg.norm_eps)?;
        b.add(x, &y)
    }
}

impl<B: Backend> CausalLm for Decoder<B> {
    fn config(&self) -> &LmConfig {
        &self.cfg
    }

    fn backend_name(&self) -> String {
        self.backend.name()
    }

    fn alloc_kv(&mut self, n_blocks: usize, block_size: usize, dtype: KvDtype) -> Result<()> {
        let spec = KvSpec { n_layers: self.cfg.n_layers, n_blocks, block_size, kv_dim: self.cfg.kv_dim(), dtype };
        self.kv = Some(self.backend.kv_pool(spec)?);
        Ok(())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>> {
        match self.with_kv(|d, kv| d.logits(batch, kv))? {
            Some(l) => self.backend.to_host(&l),
            // A prefill chunk that ends mid-prompt: only the KV writes matter.
            None => Ok(Vec::new()),
        }
    }

    fn samples_on_device(&self) -> bool {
        self.backend.samples_on_device()
    }

    fn forward_sample(&mut self, batch: &ForwardBatch, rows: &[RowSampling]) -> Result<Vec<(u32, f32)>> {
        let Some(mut logits) = self.sampled_logits(batch, rows)? else { return Ok(Vec::new()) };
        self.backend.sample(&mut logits, rows)?.ok_or_else(|| self.no_sampling())
    }

    fn forward_sample_begin(&mut self, batch: &ForwardBatch, rows: &[RowSampling]) -> Result<Picks> {
        let Some(mut logits) = self.sampled_logits(batch, rows)? else { return Ok(Picks::ready(Vec::new())) };
        self.backend.sample_begin(&mut logits, rows)?.ok_or_else(|| self.no_sampling())
    }

    fn feeds_tokens(&self) -> bool {
        self.backend.feeds_tokens()
    }
}

impl<B: Backend> Decoder<B> {
    /// The logits `forward_sample` draws from (`None`: no row wants any).
    fn sampled_logits(&mut self, batch: &ForwardBatch, rows: &[RowSampling]) -> Result<Option<B::Tensor>> {
        if rows.len() != batch.logit_rows.len() {
            return Err(Error::InvalidInput(format!(
                "forward_sample: {} sampling rows for {} logit rows",
                rows.len(),
                batch.logit_rows.len()
            )));
        }
        self.with_kv(|d, kv| d.logits(batch, kv))
    }

    fn no_sampling(&self) -> Error {
        Error::Unsupported(format!("sampling on {}", self.backend.name()))
    }

    fn with_kv<T>(&mut self, f: impl FnOnce(&Self, &mut B::KvPool) -> Result<T>) -> Result<T> {
        let mut kv = self.kv.take().ok_or_else(|| Error::InvalidInput("KV cache not allocated".into()))?;
        let result = f(self, &mut kv);
        self.kv = Some(kv);
        result
    }

    /// The logits of `batch.logit_rows`, where the backend keeps them; `None`
    /// when no row's logits are wanted. Decode steps go through the backend's
    /// `decode_step` (replayed as a CUDA graph there).
    fn logits(&self, batch: &ForwardBatch, kv: &mut B::KvPool) -> Result<Option<B::Tensor>> {
        let b = &self.backend;
        if batch.tokens.len() != batch.positions.len() || batch.tokens.is_empty() {
            return Err(Error::InvalidInput("forward: empty batch or positions mismatch".into()));
        }
        if batch.wants_every_row() && batch.attn.seqs.iter().all(|s| s.q_len == 1) {
            let step = DecodeStep { tokens: &batch.tokens, positions: &batch.positions, attn: &batch.attn };
            return b.decode_step(&step, &mut || self.head(self.hidden(batch, kv)?, batch)).map(Some);
        }
        let h = self.hidden(batch, kv)?;
        if batch.logit_rows.is_empty() {
            return Ok(None);
        }
        self.head(h, batch).map(Some)
    }

    /// Every row through every layer: the residual stream after the last.
    fn hidden(&self, batch: &ForwardBatch, kv: &mut B::KvPool) -> Result<B::Tensor> {
        let b = &self.backend;
        let mut x = b.embedding(&self.embed, &batch.tokens)?;
        if let Some(s) = self.cfg.embed_scale {
            b.scale(&mut x, s)?;
        }
        let one_row_decode = batch.tokens.len() == 1 && batch.attn.seqs.iter().all(|s| s.q_len == 1);
        let plain = |l: usize| self.plain_layer(l);
        let done = match one_row_decode {
            true => b.decode_layers(&mut x, self.layers.len(), &plain, &batch.positions, kv, &batch.attn)?,
            false => 0,
        };
        for l in done..self.layers.len() {
            self.layer_forward(l, &mut x, batch, kv)?;
        }
        Ok(x)
    }

    /// Layer l as `Backend::decode_layers` takes it, if it is plain.
    fn plain_layer(&self, l: usize) -> Option<PlainLayer<'_, B::Weight, B::Tensor>> {
        let (c, y) = (&self.cfg, &self.layers[l]);
        let plain = y.bias.is_none() && y.q_norm.is_none() && y.post_attn_norm.is_none() && y.post_ffw_norm.is_none();
        plain.then_some(PlainLayer {
            attn_norm: &y.attn_norm,
            wqkv: [&y.wq, &y.wk, &y.wv],
            wo: &y.wo,
            ffn_norm: &y.ffn_norm,
            gate: &y.gate,
            up: &y.up,
            down: &y.down,
            rope: &y.rope,
            attn: &y.attn,
            eps: c.norm_eps,
            act: c.activation,
        })
    }

    /// The logits of `batch.logit_rows` of the residual stream `x`, through
    /// the output norm.
    fn head(&self, x: B::Tensor, batch: &ForwardBatch) -> Result<B::Tensor> {
        let b = &self.backend;
        let x = if batch.wants_every_row() { x } else { b.rows(&x, &batch.logit_rows)? };
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let [mut logits] = b.norm_matmul_many(&x, &self.out_norm, self.cfg.norm_eps, [head])?;
        if let Some(cap) = self.cfg.final_softcap {
            b.softcap(&mut logits, cap)?;
        }
        Ok(logits)
    }
}
