//! Sentence embeddings: tokenize (with explicit truncation), run an encoder over
//! a flat unpadded batch, pool, and optionally L2-normalize.

mod pooling;
mod worker;

pub use pooling::{l2_normalize, Pooling, PoolingConfig};
pub use worker::{EmbedEngine, EmbedEngineConfig, EmbedMetrics, EmbedReply, MAX_INPUTS};

use ferrite_core::{Error, Result};
use ferrite_loader::tokenizer::Tokenizer;
use ferrite_models::encoder::{EncodeBatch, EncoderModel};
use rayon::prelude::*;

/// A loaded embedding model: encoder, tokenizer and pooling.
pub struct Embedder {
    model: Box<dyn EncoderModel>,
    tokenizer: Tokenizer,
    pub pooling: Pooling,
    /// Normalize unless the caller says otherwise (a Normalize module).
    pub normalize: bool,
    /// Longest input in tokens, special tokens included.
    pub max_length: usize,
    /// Its matmuls run in bf16 (else f32), as loaded.
    pub bf16: bool,
}

impl Embedder {
    pub fn new(model: Box<dyn EncoderModel>, tokenizer: Tokenizer, cfg: &PoolingConfig) -> Embedder {
        let limit = model.config().max_positions;
        Embedder {
            max_length: cfg.max_length.unwrap_or(limit).min(limit),
            model,
            tokenizer,
            pooling: cfg.pooling,
            normalize: cfg.normalize,
            bf16: false,
        }
    }

    pub fn model(&self) -> &dyn EncoderModel {
        self.model.as_ref()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Length of the vectors.
    pub fn dim(&self) -> usize {
        self.model.config().hidden
    }

    /// Token ids of one input, special tokens included. Longer than
    /// `max_length`: cut to fit (keeping the special tokens around it) with
    /// `truncate`, else an error that says so.
    pub fn tokenize(&self, text: &str, truncate: bool) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(Error::InvalidInput("empty text".into()));
        }
        let ids = self.tokenizer.encode(text, true)?;
        if ids.len() <= self.max_length {
            return Ok(ids);
        }
        if !truncate {
            return Err(Error::InvalidInput(format!(
                "{} tokens, more than the model's {} (shorten it, or ask for truncation)",
                ids.len(),
                self.max_length
            )));
        }
        // The special tokens the post-processor wraps the text in stay; the
        // text's own tokens are cut at the end, as the reference tokenizers do.
        let body = self.tokenizer.encode(text, false)?;
        let extra = ids
            .len()
            .checked_sub(body.len())
            .ok_or_else(|| Error::Tokenizer("special tokens shorten the encoding; cannot truncate".into()))?;
        let prefix = (0..=extra)
            .find(|&p| ids[p..p + body.len()] == body[..])
            .ok_or_else(|| Error::Tokenizer("cannot locate the text between the special tokens".into()))?;
        if extra >= self.max_length {
            return Err(Error::InvalidInput(format!("max length {} leaves no room for text", self.max_length)));
        }
        let mut out = ids[..prefix].to_vec();
        out.extend_from_slice(&body[..self.max_length - extra]);
        out.extend_from_slice(&ids[prefix + body.len()..]);
        Ok(out)
    }

    /// `tokenize` for every input, on all cores; an error names the input.
    pub fn tokenize_all(&self, texts: &[String], truncate: bool) -> Result<Vec<Vec<u32>>> {
        self.tokenize_numbered(texts, 0, truncate)
    }

    /// `tokenize_all` for inputs numbered from `first` (in error messages).
    pub fn tokenize_numbered(&self, texts: &[String], first: usize, truncate: bool) -> Result<Vec<Vec<u32>>> {
        texts
            .par_iter()
            .enumerate()
            .map(|(i, t)| {
                self.tokenize(t, truncate).map_err(|e| match e {
                    Error::InvalidInput(m) => Error::InvalidInput(format!("input {}: {m}", first + i)),
                    other => other,
                })
            })
            .collect()
    }

    /// Pooled vectors for already tokenized inputs, in one forward pass, before
    /// any normalization.
    pub fn pooled(&self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let batch = EncodeBatch::from_slices(inputs);
        let flat = self.model.forward_pooled(&batch, self.pooling)?;
        Ok(flat.chunks(self.dim()).map(|v| v.to_vec()).collect())
    }

    /// Vectors for already tokenized inputs, in one forward pass.
    pub fn embed_tokens(&self, inputs: &[Vec<u32>], normalize: bool) -> Result<Vec<Vec<f32>>> {
        let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut out = self.pooled(&refs)?;
        if normalize || self.normalize {
            out.iter_mut().for_each(|v| l2_normalize(v));
        }
        Ok(out)
    }
}
