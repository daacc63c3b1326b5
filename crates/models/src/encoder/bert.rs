//! BERT ("classic" encoder: learned absolute positions, token types, post-norm
//! LayerNorm with bias, GELU): all-MiniLM, BGE, E5, GTE-style checkpoints.
//!   x = LN(word[id] + position[p] + token_type[0])
//!   per layer: a = attention(x·Wq+bq, x·Wk+bk, x·Wv+bv)
//!              x = LN(x + a·Wo + bo)
//!              x = LN(x + act(x·Wi + bi)·Wo2 + bo2)
//! Weight names mirror the checkpoint (`encoder.layer.N.attention.self.query`).

use super::{EncodeBatch, EncoderArch, EncoderConfig, EncoderNet, Weights};
use crate::checkpoint::HfCheckpoint;
use crate::config::{check_eps, check_layers};
use crate::hf::HfConfig;
use ferrite_backend::{Activation, AttnParams, Backend};
use ferrite_core::{Error, Result};

struct Norm<B: Backend> {
    w: B::Tensor, // [hidden]
    b: B::Tensor, // [hidden]
}

struct Layer<B: Backend> {
    q: (B::Weight, B::Tensor),    // [hidden, hidden], [hidden]
    k: (B::Weight, B::Tensor),    // [hidden, hidden], [hidden]
    v: (B::Weight, B::Tensor),    // [hidden, hidden], [hidden]
    out: (B::Weight, B::Tensor),  // attention.output.dense [hidden, hidden]
    attn_norm: Norm<B>,           // attention.output.LayerNorm
    up: (B::Weight, B::Tensor),   // intermediate.dense [ffn, hidden]
    down: (B::Weight, B::Tensor), // output.dense [hidden, ffn]
    ffn_norm: Norm<B>,            // output.LayerNorm
}

pub struct Bert<B: Backend> {
    backend: B,
    cfg: EncoderConfig,
    word: B::Weight,       // [vocab, hidden]
    position: B::Weight,   // [max_positions, hidden]
    token_type: B::Tensor, // [1, hidden]: row 0 (single-segment inputs)
    embed_norm: Norm<B>,
    layers: Vec<Layer<B>>,
    attn: AttnParams,
    act: Activation,
    eps: f32,
}

impl<B: Backend> Bert<B> {
    pub fn load(backend: B, ck: &HfCheckpoint) -> Result<Self> {
        let c = HfConfig::new(&ck.config);
        let (h, n_heads, ffn) = (c.req("hidden_size")?, c.req("num_attention_heads")?, c.req("intermediate_size")?);
        let (vocab, n_layers, max_pos) =
            (c.req("vocab_size")?, check_layers(c.req("num_hidden_layers")?)?, c.req("max_position_embeddings")?);
        ck.check_layer_count(n_layers)?;
        let eps = check_eps(c.f32("layer_norm_eps").unwrap_or(1e-12))?;
        if n_heads == 0 || !h.is_multiple_of(n_heads) {
            return Err(Error::format(format!("bert: hidden size {h} is not a multiple of {n_heads} heads")));
        }
        if let Some(t) = c.str("position_embedding_type").filter(|t| *t != "absolute") {
            return Err(Error::Unsupported(format!("bert: position_embedding_type {t:?} (only absolute)")));
        }
        let act = c.activation("hidden_act")?.unwrap_or(Activation::Gelu);
        let w = Weights::new(ck, &backend, "embeddings.word_embeddings.weight", &["", "bert."])?;
        let norm = |p: &str| -> Result<Norm<B>> {
            Ok(Norm { w: w.vector(&format!("{p}.weight"), h)?, b: w.vector(&format!("{p}.bias"), h)? })
        };
        let lin = |p: &str, rows, cols| -> Result<(B::Weight, B::Tensor)> {
            Ok((w.matrix(&format!("{p}.weight"), rows, cols)?, w.vector(&format!("{p}.bias"), rows)?))
        };
        let n_types = c.opt("type_vocab_size").unwrap_or(2);
        if n_types == 0 {
            return Err(Error::format("bert: type_vocab_size is 0 (inputs need token type 0)"));
        }
        let types = w.raw("embeddings.token_type_embeddings.weight", n_types, h)?;
        let mut type0 = vec![0f32; h];
        ferrite_backend::quant::dequantize_row(
            types.dtype,
            &types.bytes.as_slice()[..types.bytes.len() / types.rows],
            &mut type0,
        )?;
        let mut layers = Vec::with_capacity(n_layers);
        for l in 0..n_layers {
            let p = |s: &str| format!("encoder.layer.{l}.{s}");
            layers.push(Layer {
                q: lin(&p("attention.self.query"), h, h)?,
                k: lin(&p("attention.self.key"), h, h)?,
                v: lin(&p("attention.self.value"), h, h)?,
                out: lin(&p("attention.output.dense"), h, h)?,
                attn_norm: norm(&p("attention.output.LayerNorm"))?,
                up: lin(&p("intermediate.dense"), ffn, h)?,
                down: lin(&p("output.dense"), h, ffn)?,
                ffn_norm: norm(&p("output.LayerNorm"))?,
            });
        }
        let head_dim = h / n_heads;
        c.checked(Ok(()))?;
        Ok(Bert {
            word: w.matrix("embeddings.word_embeddings.weight", vocab, h)?,
            position: w.matrix("embeddings.position_embeddings.weight", max_pos, h)?,
            token_type: backend.upload(type0, 1, h)?,
            embed_norm: norm("embeddings.LayerNorm")?,
            layers,
            attn: AttnParams {
                n_heads,
                n_kv_heads: n_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: None,
                softcap: None,
            },
            act,
            eps,
            cfg: EncoderConfig {
                arch: EncoderArch::Bert,
                hidden: h,
                n_layers,
                vocab_size: vocab,
                max_positions: max_pos,
            },
            backend,
        })
    }

    fn layer(&self, x: B::Tensor, l: &Layer<B>, batch: &EncodeBatch) -> Result<B::Tensor> {
        let be = &self.backend;
        let q = be.linear(&x, &l.q.0, Some(&l.q.1))?;
        let k = be.linear(&x, &l.k.0, Some(&l.k.1))?;
        let v = be.linear(&x, &l.v.0, Some(&l.v.1))?;
        let a = be.encoder_attention(&q, &k, &v, &batch.seqs, &self.attn)?;
        let mut o = be.linear(&a, &l.out.0, Some(&l.out.1))?;
        let x = be.add_layer_norm(&mut o, &x, &l.attn_norm.w, Some(&l.attn_norm.b), self.eps)?;
        let mut m = be.linear(&x, &l.up.0, Some(&l.up.1))?;
        be.activate(&mut m, self.act)?;
        let mut d = be.linear(&m, &l.down.0, Some(&l.down.1))?;
        be.add_layer_norm(&mut d, &x, &l.ffn_norm.w, Some(&l.ffn_norm.b), self.eps)
    }
}

impl<B: Backend> EncoderNet for Bert<B> {
    type B = B;

    fn backend(&self) -> &B {
        &self.backend
    }

    fn cfg(&self) -> &EncoderConfig {
        &self.cfg
    }

    fn hidden(&self, batch: &EncodeBatch) -> Result<B::Tensor> {
        batch.check(&self.cfg)?;
        let be = &self.backend;
        let mut x = be.embedding(&self.word, &batch.tokens)?;
        be.add(&mut x, &be.embedding(&self.position, &batch.positions())?)?;
        be.add_row(&mut x, &self.token_type)?;
        let mut x = be.layer_norm(&x, &self.embed_norm.w, Some(&self.embed_norm.b), self.eps)?;
        for l in &self.layers {
            x = self.layer(x, l, batch)?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::HfCheckpoint;
    use ferrite_backend::cpu::CpuBackend;

    #[test]
    fn padding_rows_change_no_vector() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/embed/bert-tiny-cls");
        let m = Bert::load(CpuBackend::F32, &HfCheckpoint::open(&dir).unwrap()).unwrap();
        super::super::check_padding_changes_nothing(&m.backend, &m.cfg, &|b| m.hidden(b));
    }
}
