//! ModernBERT: pre-norm encoder with RoPE, GeGLU, optional biases, and layers
//! alternating global attention with local (sliding-window band) attention.
//!   x = LN(tok[id])
//!   per layer: a = (layer 0 ? x : LN(x)); q,k,v = a·Wqkv (fused, split at load)
//!              rope(q, k) with the layer kind's theta (half-split layout)
//!              x += attention(q, k, v; band |i-j| <= local_attention/2 on local layers)·Wo
//!              u = LN(x)·Wi (fused input|gate, split at load); x += (gelu(input) * gate)·Wo
//!   out = LN_final(x)
//! Weight names mirror the checkpoint (`layers.N.attn.Wqkv`), under an optional
//! `model.` prefix (masked-LM checkpoints).

use super::{EncodeBatch, EncoderArch, EncoderConfig, EncoderNet, Weights};
use crate::checkpoint::HfCheckpoint;
use crate::config::{check_eps, check_layers, check_positive, inv_freq, LayerKind, RopeScaling};
use crate::hf::HfConfig;
use ferrite_backend::{Activation, AttnParams, Backend, Rope};
use ferrite_core::{Error, Result};

struct Norm<B: Backend> {
    w: B::Tensor,         // [hidden]
    b: Option<B::Tensor>, // [hidden] with norm_bias
}

/// A linear layer's weight and optional bias.
struct Linear<B: Backend> {
    w: B::Weight,
    b: Option<B::Tensor>,
}

struct Layer<B: Backend> {
    attn_norm: Option<Norm<B>>, // absent on layer 0 (identity)
    q: Linear<B>,               // Wqkv rows 0..H       [hidden, hidden]
    k: Linear<B>,               // Wqkv rows H..2H
    v: Linear<B>,               // Wqkv rows 2H..3H
    wo: Linear<B>,              // attn.Wo [hidden, hidden]
    mlp_norm: Norm<B>,
    input: Linear<B>, // mlp.Wi rows 0..I (activated)  [ffn, hidden]
    gate: Linear<B>,  // mlp.Wi rows I..2I
    down: Linear<B>,  // mlp.Wo [hidden, ffn]
    rope: Rope,
    attn: AttnParams,
}

pub struct ModernBert<B: Backend> {
    backend: B,
    cfg: EncoderConfig,
    tok: B::Weight, // [vocab, hidden]
    embed_norm: Norm<B>,
    layers: Vec<Layer<B>>,
    final_norm: Norm<B>,
    act: Activation,
    eps: f32,
}

/// Whether layer `l` attends globally: `layer_types` when the config has it,
/// else every `global_attn_every_n_layers`-th layer from layer 0.
fn is_global(c: &HfConfig, l: usize) -> Result<bool> {
    if let Some(types) = c.str_list("layer_types") {
        return match types.get(l).map(String::as_str) {
            Some("full_attention") => Ok(true),
            Some("sliding_attention") => Ok(false),
            other => Err(Error::format(format!("modernbert: layer_types[{l}] is {other:?}"))),
        };
    }
    let every = c.opt("global_attn_every_n_layers").unwrap_or(3).max(1);
    Ok(l.is_multiple_of(every))
}

/// RoPE base of a global or local layer, from either config generation.
fn rope_theta(c: &HfConfig, global: bool) -> f32 {
    let (kind, old_key, default) = if global {
        ("full_attention", "global_rope_theta", 160_000.0)
    } else {
        ("sliding_attention", "local_rope_theta", 10_000.0)
    };
    c.rope_object_theta(kind).or_else(|| c.f32(old_key)).unwrap_or(default)
}

impl<B: Backend> ModernBert<B> {
    pub fn load(backend: B, ck: &HfCheckpoint) -> Result<Self> {
        let c = HfConfig::new(&ck.config);
        let (h, n_heads, ffn) = (c.req("hidden_size")?, c.req("num_attention_heads")?, c.req("intermediate_size")?);
        let (vocab, n_layers) = (c.req("vocab_size")?, check_layers(c.req("num_hidden_layers")?)?);
        ck.check_layer_count(n_layers)?;
        let max_pos = c.opt("max_position_embeddings").unwrap_or(8192);
        if n_heads == 0 || !h.is_multiple_of(n_heads) || !(h / n_heads).is_multiple_of(2) {
            return Err(Error::format(format!("modernbert: hidden size {h} does not split into {n_heads} heads")));
        }
        let hd = h / n_heads;
        let half_window = c.opt("local_attention").unwrap_or(128) / 2;
        let eps = check_eps(c.f32("norm_eps").unwrap_or(1e-5))?;
        let (norm_bias, attn_bias, mlp_bias) = (
            c.bool("norm_bias").unwrap_or(false),
            c.bool("attention_bias").unwrap_or(false),
            c.bool("mlp_bias").unwrap_or(false),
        );
        let act = c.activation("hidden_activation")?.unwrap_or(Activation::Gelu);
        let w = Weights::new(ck, &backend, "embeddings.tok_embeddings.weight", &["", "model."])?;
        let norm = |p: &str| -> Result<Norm<B>> {
            let b = if norm_bias { Some(w.vector(&format!("{p}.bias"), h)?) } else { None };
            Ok(Norm { w: w.vector(&format!("{p}.weight"), h)?, b })
        };
        // A fused linear split by output rows into parts of `sizes`.
        let split = |p: &str, sizes: &[usize], cols: usize, bias: bool| -> Result<Vec<Linear<B>>> {
            let rows = sizes.iter().sum();
            let parts = w.raw(&format!("{p}.weight"), rows, cols)?.split_rows(sizes)?;
            let b = if bias { Some(w.raw(&format!("{p}.bias"), 1, rows)?) } else { None };
            let mut out = Vec::new();
            let mut start = 0;
            for (part, &n) in parts.into_iter().zip(sizes) {
                let b = match &b {
                    Some(raw) => {
                        let mut all = vec![0f32; rows];
                        ferrite_backend::quant::dequantize_row(raw.dtype, raw.bytes.as_slice(), &mut all)?;
                        Some(backend.upload(all[start..start + n].to_vec(), 1, n)?)
                    }
                    None => None,
                };
                out.push(Linear { w: backend.weight(part)?, b });
                start += n;
            }
            Ok(out)
        };
        let mut layers = Vec::with_capacity(n_layers);
        for l in 0..n_layers {
            let p = |s: &str| format!("layers.{l}.{s}");
            let global = is_global(&c, l)?;
            let kind = LayerKind { window: None, rope_theta: rope_theta(&c, global), rope_scaling: RopeScaling::None };
            check_positive("the RoPE base", kind.rope_theta)?;
            let [q, k, v]: [Linear<B>; 3] =
                split(&p("attn.Wqkv"), &[h, h, h], h, attn_bias)?.try_into().ok().expect("three parts");
            let [input, gate]: [Linear<B>; 2] =
                split(&p("mlp.Wi"), &[ffn, ffn], h, mlp_bias)?.try_into().ok().expect("two parts");
            let [wo]: [Linear<B>; 1] = split(&p("attn.Wo"), &[h], h, attn_bias)?.try_into().ok().expect("one part");
            let [down]: [Linear<B>; 1] = split(&p("mlp.Wo"), &[h], ffn, mlp_bias)?.try_into().ok().expect("one part");
            layers.push(Layer {
                attn_norm: if l == 0 { None } else { Some(norm(&p("attn_norm"))?) },
                q,
                k,
                v,
                wo,
                mlp_norm: norm(&p("mlp_norm"))?,
                input,
                gate,
                down,
                rope: Rope { head_dim: hd, inv_freq: inv_freq(hd, &kind), interleaved: false },
                attn: AttnParams {
                    n_heads,
                    n_kv_heads: n_heads,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    window: if global { None } else { Some(half_window) },
                    softcap: None,
                },
            });
        }
        c.checked(Ok(()))?;
        Ok(ModernBert {
            tok: w.matrix("embeddings.tok_embeddings.weight", vocab, h)?,
            embed_norm: norm("embeddings.norm")?,
            final_norm: norm("final_norm")?,
            layers,
            act,
            eps,
            cfg: EncoderConfig {
                arch: EncoderArch::ModernBert,
                hidden: h,
                n_layers,
                vocab_size: vocab,
                max_positions: max_pos,
            },
            backend,
        })
    }

    fn norm(&self, x: &B::Tensor, n: &Norm<B>) -> Result<B::Tensor> {
        self.backend.layer_norm(x, &n.w, n.b.as_ref(), self.eps)
    }

    fn linear(&self, x: &B::Tensor, l: &Linear<B>) -> Result<B::Tensor> {
        self.backend.linear(x, &l.w, l.b.as_ref())
    }

    fn layer(&self, mut x: B::Tensor, l: &Layer<B>, batch: &EncodeBatch, positions: &[u32]) -> Result<B::Tensor> {
        let be = &self.backend;
        let normed;
        let a = match &l.attn_norm {
            Some(n) => {
                normed = self.norm(&x, n)?;
                &normed
            }
            None => &x,
        };
        let (mut q, mut k, v) = (self.linear(a, &l.q)?, self.linear(a, &l.k)?, self.linear(a, &l.v)?);
        be.rope(&mut q, &l.rope, positions)?;
        be.rope(&mut k, &l.rope, positions)?;
        let att = be.encoder_attention(&q, &k, &v, &batch.seqs, &l.attn)?;
        let m =
            be.add_layer_norm(&mut x, &self.linear(&att, &l.wo)?, &l.mlp_norm.w, l.mlp_norm.b.as_ref(), self.eps)?;
        let g = be.glu(&self.linear(&m, &l.input)?, &self.linear(&m, &l.gate)?, self.act)?;
        be.add(&mut x, &self.linear(&g, &l.down)?)?;
        Ok(x)
    }
}

impl<B: Backend> EncoderNet for ModernBert<B> {
    type B = B;

    fn backend(&self) -> &B {
        &self.backend
    }

    fn cfg(&self) -> &EncoderConfig {
        &self.cfg
    }

    fn hidden(&self, batch: &EncodeBatch) -> Result<B::Tensor> {
        batch.check(&self.cfg)?;
        let positions = batch.positions();
        let mut x = self.norm(&self.backend.embedding(&self.tok, &batch.tokens)?, &self.embed_norm)?;
        for l in &self.layers {
            x = self.layer(x, l, batch, &positions)?;
        }
        self.norm(&x, &self.final_norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::HfCheckpoint;
    use ferrite_backend::cpu::CpuBackend;

    #[test]
    fn padding_rows_change_no_vector() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/embed/modernbert-tiny-a");
        let m = ModernBert::load(CpuBackend::F32, &HfCheckpoint::open(&dir).unwrap()).unwrap();
        super::super::check_padding_changes_nothing(&m.backend, &m.cfg, &|b| m.hidden(b));
    }
}
