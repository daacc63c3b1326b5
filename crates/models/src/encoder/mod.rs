//! Encoder-only transformers for embeddings (BERT, ModernBERT), generic over the
//! backend. They run a flat batch of whole sequences back to back (no padding,
//! no KV cache) and return the last hidden state of every token; pooling and
//! normalization belong to the caller (`ferrite_engine::embed`).

pub mod bert;
pub mod modernbert;
mod pooling;

pub use pooling::Pooling;

use std::borrow::Cow;
use std::ops::Range;

use crate::checkpoint::{Checkpoint, HfCheckpoint};
use ferrite_backend::{Backend, EncodeStep, RawWeight};
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

    /// This batch with `rows - tokens` padding rows after its tokens (id 0),
    /// as sequences of their own of at most `PAD_SEQ` rows (and at most
    /// `max_positions`), so that attention over them costs little.
    fn padded(&self, rows: usize, max_positions: usize) -> Cow<'_, EncodeBatch> {
        const PAD_SEQ: usize = 64;
        if rows <= self.tokens.len() {
            return Cow::Borrowed(self);
        }
        let mut b = self.clone();
        let chunk = PAD_SEQ.min(max_positions).max(1);
        while b.tokens.len() < rows {
            let start = b.tokens.len();
            let end = rows.min(start + chunk);
            b.tokens.resize(end, 0);
            b.seqs.push(start..end);
        }
        Cow::Owned(b)
    }

    #[cfg(test)]
    fn lens(&self) -> Vec<usize> {
        self.seqs.iter().map(|s| s.len()).collect()
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

/// What an encoder architecture provides; `EncoderModel` follows from it
/// (the same checks, padding and pooling for every architecture).
trait EncoderNet: Send + Sync {
    type B: Backend;
    fn backend(&self) -> &Self::B;
    fn cfg(&self) -> &EncoderConfig;
    /// The last hidden states of `batch`'s rows, on the backend.
    fn hidden(&self, batch: &EncodeBatch) -> Result<<Self::B as Backend>::Tensor>;
}

impl<T: EncoderNet> EncoderModel for T {
    fn config(&self) -> &EncoderConfig {
        self.cfg()
    }

    fn backend_name(&self) -> String {
        self.backend().name()
    }

    fn forward(&self, batch: &EncodeBatch) -> Result<Vec<f32>> {
        self.backend().to_host(&self.hidden(batch)?)
    }

    fn forward_pooled(&self, batch: &EncodeBatch, pooling: Pooling) -> Result<Vec<f32>> {
        forward_pooled(self.backend(), self.cfg(), batch, pooling, &|b| self.hidden(b))
    }
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

/// The pooled pass both encoders share: checks `batch`, pads it to the rows
/// the backend asks for, and runs `hidden` then the pooling through the
/// backend's `encode_step` (replayed as a CUDA graph there).
fn forward_pooled<B: Backend>(
    be: &B,
    cfg: &EncoderConfig,
    batch: &EncodeBatch,
    pooling: Pooling,
    hidden: &dyn Fn(&EncodeBatch) -> Result<B::Tensor>,
) -> Result<Vec<f32>> {
    let rows = be.encoder_rows(batch.tokens.len());
    forward_padded(be, cfg, batch, pooling, hidden, rows)
}

/// `forward_pooled` padded to `rows`; the padding rows are never pooled.
fn forward_padded<B: Backend>(
    be: &B,
    cfg: &EncoderConfig,
    batch: &EncodeBatch,
    pooling: Pooling,
    hidden: &dyn Fn(&EncodeBatch) -> Result<B::Tensor>,
    rows: usize,
) -> Result<Vec<f32>> {
    batch.check(cfg)?;
    let padded = batch.padded(rows, cfg.max_positions);
    let positions = padded.positions();
    let step = EncodeStep {
        tokens: &padded.tokens,
        positions: &positions,
        seqs: &padded.seqs,
        pooled: batch.seqs.len(),
        key: pooling as u32,
    };
    let pooled = be.encode_step(&step, &mut || pooling::pool(be, &hidden(&padded)?, &batch.seqs, pooling))?;
    be.to_host(&pooled)
}

/// Tests of both encoders: padding rows change no vector, in any pooling.
#[cfg(test)]
fn check_padding_changes_nothing<B: Backend>(
    be: &B,
    cfg: &EncoderConfig,
    hidden: &dyn Fn(&EncodeBatch) -> Result<B::Tensor>,
) {
    let inputs: Vec<Vec<u32>> = [5usize, 1, 40, 17]
        .iter()
        .enumerate()
        .map(|(i, &len)| (0..len).map(|j| ((i * 31 + j * 7) % cfg.vocab_size) as u32).collect())
        .collect();
    let batch = EncodeBatch::new(&inputs);
    let n = batch.tokens.len();
    for pooling in [Pooling::Cls, Pooling::Mean, Pooling::LastToken, Pooling::Max] {
        let plain = forward_padded(be, cfg, &batch, pooling, hidden, n).unwrap();
        for rows in [n + 1, n + 63, n + 200] {
            let padded = forward_padded(be, cfg, &batch, pooling, hidden, rows).unwrap();
            let worst = plain.iter().zip(&padded).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(plain.len() == padded.len() && worst < 1e-5, "{pooling:?}, {rows} rows: {worst}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_comes_as_short_sequences_after_the_tokens() {
        let b = EncodeBatch::new(&[vec![7, 8, 9], vec![5]]);
        let p = b.padded(4 + 150, 512);
        assert_eq!(p.lens(), [3, 1, 64, 64, 22]);
        assert_eq!(&p.tokens[..4], &[7, 8, 9, 5]);
        assert!(p.tokens[4..].iter().all(|&t| t == 0) && p.tokens.len() == 154);
        // Never longer than the model accepts; no padding asked, none added.
        assert_eq!(b.padded(4 + 5, 2).lens(), [3, 1, 2, 2, 1]);
        assert_eq!(b.padded(4, 512).lens(), [3, 1]);
    }
}
