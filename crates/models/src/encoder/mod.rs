//! Encoder-only transformers for embeddings (BERT, ModernBERT), generic over the
//! backend. They run a flat batch of whole sequences back to back (no padding,
//! no KV cache) and return the last hidden state of every token; pooling and
//! normalization belong to the caller (`ferrite_engine::embed`).

pub mod bert;
pub mod modernbert;
mod pooling;

pub use pooling::Pooling;

use std::ops::Range;

use crate::checkpoint::{Checkpoint, HfCheckpoint};
use ferrite_backend::{Backend, RawWeight};
use ferrite_core::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderArch {
    Bert,
    ModernBert,
}

/// What callers need to know about an encoder.
#[derive(Clone, Debug)]
pub struct EncoderConfig {
    pub arch: EncoderArch,
    pub hidden: usize,
    pub n_layers: usize,
    pub vocab_size: usize,
    /// Longest sequence the model accepts (position table or trained context).
    pub max_positions: usize,
}

/// A flat batch: every sequence's token ids back to back.
#[derive(Clone, Debug, Default)]
pub struct EncodeBatch {
    pub tokens: Vec<u32>,
    pub seqs: Vec<Range<usize>>,
}

impl EncodeBatch {
    pub fn new(inputs: &[Vec<u32>]) -> EncodeBatch {
        let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
        EncodeBatch::from_slices(&refs)
    }

    pub fn from_slices(inputs: &[&[u32]]) -> EncodeBatch {
        let mut b = EncodeBatch::default();
        for ids in inputs {
            let start = b.tokens.len();
            b.tokens.extend_from_slice(ids);
            b.seqs.push(start..b.tokens.len());
        }
        b
    }

    /// Each token's position within its sequence.
    pub fn positions(&self) -> Vec<u32> {
        self.seqs.iter().flat_map(|s| 0..s.len() as u32).collect()
    }

    fn check(&self, cfg: &EncoderConfig) -> Result<()> {
        for s in &self.seqs {
            if s.is_empty() {
                return Err(Error::InvalidInput("an input has no tokens".into()));
            }
            if s.len() > cfg.max_positions {
                return Err(Error::InvalidInput(format!(
                    "an input has {} tokens; the model accepts at most {}",
                    s.len(),
                    cfg.max_positions
                )));
            }
        }
        if self.seqs.last().map_or(0, |s| s.end) != self.tokens.len() {
            return Err(Error::Shape("encode batch: sequences do not cover the tokens".into()));
        }
        Ok(())
    }
}

pub trait EncoderModel: Send + Sync {
    fn config(&self) -> &EncoderConfig;
    fn backend_name(&self) -> String;
    /// Last hidden states [tokens, hidden], row-major, in batch order.
    fn forward(&self, batch: &EncodeBatch) -> Result<Vec<f32>>;
    /// One pooled vector per sequence [seqs, hidden], row-major, in batch
    /// order (pooled where the model runs: only the vectors are copied back).
    fn forward_pooled(&self, batch: &EncodeBatch, pooling: Pooling) -> Result<Vec<f32>>;
}

/// The HF `model_type`s with an encoder implementation.
const ENCODERS: &[&str] = &["bert", "modernbert"];

/// The checkpoint's `model_type` if it names an encoder architecture.
pub fn encoder_arch(ck: &Checkpoint) -> Option<EncoderArch> {
    let Checkpoint::Hf(h) = ck else { return None };
    match h.config.get("model_type")?.as_str()? {
        "bert" => Some(EncoderArch::Bert),
        "modernbert" => Some(EncoderArch::ModernBert),
        _ => None,
    }
}

pub fn load_encoder<B: Backend + 'static>(backend: B, ck: &Checkpoint) -> Result<Box<dyn EncoderModel>>
where
    B::Tensor: 'static,
    B::Weight: 'static,
{
    let Checkpoint::Hf(h) = ck else {
        return Err(Error::Unsupported(format!(
            "{}: embedding models load from HF safetensors directories (GGUF encoders are not supported)",
            ck.path().display()
        )));
    };
    match encoder_arch(ck) {
        Some(EncoderArch::Bert) => Ok(Box::new(bert::Bert::load(backend, h)?)),
        Some(EncoderArch::ModernBert) => Ok(Box::new(modernbert::ModernBert::load(backend, h)?)),
        None => {
            let t = h.config.get("model_type").and_then(|v| v.as_str()).unwrap_or("unknown");
            Err(Error::Unsupported(format!(
                "{}: model type {t:?} is not an embedding model (supported encoders: {})",
                h.dir.display(),
                ENCODERS.join(", ")
            )))
        }
    }
}

/// Weights of an HF encoder under one name prefix (`bert.`, `model.` or none,
/// whichever the checkpoint uses), uploaded to the backend.
struct Weights<'a, B: Backend> {
    ck: &'a HfCheckpoint,
    backend: &'a B,
    prefix: String,
}

impl<'a, B: Backend> Weights<'a, B> {
    /// Finds the prefix under which `probe` exists.
    fn new(ck: &'a HfCheckpoint, backend: &'a B, probe: &str, prefixes: &[&str]) -> Result<Self> {
        let prefix =
            prefixes.iter().find(|p| ck.tensors.tensor(&format!("{p}{probe}")).is_some()).ok_or_else(|| {
                Error::format(format!("{}: no tensor named {probe} (under prefixes {prefixes:?})", ck.dir.display()))
            })?;
        Ok(Weights { ck, backend, prefix: prefix.to_string() })
    }

    fn raw(&self, name: &str, rows: usize, cols: usize) -> Result<RawWeight> {
        let full = format!("{}{name}", self.prefix);
        let w = self
            .ck
            .raw(&full)?
            .ok_or_else(|| Error::format(format!("{}: missing weight {full}", self.ck.dir.display())))?;
        if w.rows != rows || w.cols != cols {
            return Err(Error::Shape(format!("weight {full} is [{}, {}], expected [{rows}, {cols}]", w.rows, w.cols)));
        }
        Ok(w)
    }

    /// A matrix [rows, cols] as a backend weight.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        self.backend.weight(self.raw(name, rows, cols)?)
    }

    /// A vector of `len` values as a [1, len] tensor.
    fn vector(&self, name: &str, len: usize) -> Result<B::Tensor> {
        let w = self.raw(name, 1, len)?;
        let mut v = vec![0f32; len];
        ferrite_backend::quant::dequantize_row(w.dtype, w.bytes.as_slice(), &mut v)?;
        self.backend.upload(v, 1, len)
    }
}
