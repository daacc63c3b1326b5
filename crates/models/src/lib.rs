//! Model architectures, generic over the backend, and the registry that picks
//! one for a checkpoint.

pub mod checkpoint;
pub mod config;
mod decoder;
pub mod encoder;
pub mod gemma3;
mod gguf_meta;
pub mod hf;
pub mod llama;
pub mod random;
pub mod registry;

pub use checkpoint::Checkpoint;
pub use config::LmConfig;
pub use registry::load_causal_lm;

use ferrite_backend::picks::Picks;
use ferrite_backend::AttnBatch;
pub use ferrite_backend::KvDtype;
pub use ferrite_backend::{LogitEdit, RowSampling};
use ferrite_core::Result;

/// One step's flat batch: the new tokens of every sequence, back to back.
#[derive(Clone, Debug, Default)]
pub struct ForwardBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub attn: AttnBatch,
    /// Rows whose logits are wanted (e.g. each sequence's last token).
    pub logit_rows: Vec<usize>,
}

impl ForwardBatch {
    /// Whether every row's logits are wanted, in order (no gather needed).
    pub fn wants_every_row(&self) -> bool {
        self.logit_rows.len() == self.tokens.len() && self.logit_rows.iter().enumerate().all(|(i, &r)| i == r)
    }
}

/// A causal LM ready to run: owns its weights and its paged KV pool.
pub trait CausalLm: Send {
    fn config(&self) -> &LmConfig;
    fn backend_name(&self) -> String;
    /// (Re)allocates the KV pool: `n_blocks` blocks of `block_size` tokens.
    fn alloc_kv(&mut self, n_blocks: usize, block_size: usize, dtype: KvDtype) -> Result<()>;
    /// Runs the batch and returns logits [logit_rows.len(), vocab] row-major.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>>;
    /// Whether `forward_sample` draws tokens where the logits are (a GPU),
    /// so that only token ids come back.
    fn samples_on_device(&self) -> bool {
        false
    }
    /// Runs the batch and draws one token per logit row by `rows` (one each):
    /// (token, logprob). Only where `samples_on_device`.
    fn forward_sample(&mut self, batch: &ForwardBatch, rows: &[RowSampling]) -> Result<Vec<(u32, f32)>> {
        let _ = (batch, rows);
        Err(ferrite_core::Error::Unsupported(format!("sampling on {}", self.backend_name())))
    }
    /// `forward_sample` without waiting for the picks: where `feeds_tokens`,
    /// the next batch may be run before they are back, its token ids naming
    /// them (`ferrite_backend::picks::fed`).
    fn forward_sample_begin(&mut self, batch: &ForwardBatch, rows: &[RowSampling]) -> Result<Picks> {
        self.forward_sample(batch, rows).map(Picks::ready)
    }
    /// Whether batches may hold fed token ids (see `forward_sample_begin`).
    fn feeds_tokens(&self) -> bool {
        false
    }
}
