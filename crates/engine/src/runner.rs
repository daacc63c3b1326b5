//! Runs flat batches of sequences through a model over the paged KV cache:
//! block reservation, slot mapping, positions and the attention metadata.

use crate::blocks::BlockManager;
use ferrite_backend::{AttnBatch, SeqSlice};
use ferrite_core::{Error, Result};
use ferrite_models::{CausalLm, ForwardBatch, KvDtype, LmConfig};

pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// A sequence's tokens and its share of the KV cache.
#[derive(Default, Debug, Clone)]
pub struct Sequence {
    pub tokens: Vec<u32>,
    /// Tokens whose K/V are already in the cache.
    pub n_cached: usize,
    pub block_table: Vec<u32>,
}

impl Sequence {
    pub fn new(tokens: Vec<u32>) -> Self {
        Sequence { tokens, n_cached: 0, block_table: Vec::new() }
    }
}

pub struct Runner {
    model: Box<dyn CausalLm>,
    blocks: BlockManager,
    /// Most tokens a sequence may hold: the KV cache size.
    max_context: usize,
}

/// Which logits a step returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Each sequence's last processed token.
    Last,
    /// Every processed token, in batch order.
    All,
}

impl Runner {
    /// `context`: tokens of KV cache to allocate (the most one sequence can use).
    pub fn new(mut model: Box<dyn CausalLm>, context: usize, block_size: usize, kv: KvDtype) -> Result<Self> {
        if context == 0 || block_size == 0 {
            return Err(Error::InvalidInput("context and block size must be positive".into()));
        }
        let n_blocks = context.div_ceil(block_size);
        model.alloc_kv(n_blocks, block_size, kv)?;
        let max_context = context;
        Ok(Runner { model, blocks: BlockManager::new(n_blocks, block_size), max_context })
    }

    pub fn config(&self) -> &LmConfig {
        self.model.config()
    }
    pub fn backend_name(&self) -> String {
        self.model.backend_name()
    }
    pub fn max_context(&self) -> usize {
        self.max_context
    }
    pub fn free_blocks(&self) -> usize {
        self.blocks.n_free()
    }

    /// Processes up to `chunk` uncached tokens of every sequence in one forward
    /// pass; returns the requested logits, `vocab` floats per row.
    pub fn step(&mut self, seqs: &mut [&mut Sequence], chunk: usize, which: Logits) -> Result<Vec<f32>> {
        let bs = self.blocks.block_size();
        let mut batch = ForwardBatch {
            tokens: Vec::new(),
            positions: Vec::new(),
            attn: AttnBatch { seqs: Vec::new(), block_size: bs, slots: Vec::new() },
            logit_rows: Vec::new(),
        };
        for seq in seqs.iter_mut() {
            let start = seq.n_cached;
            let end = seq.tokens.len().min(start.saturating_add(chunk));
            if end <= start {
                return Err(Error::InvalidInput("step: a sequence has no new tokens".into()));
            }
            if end > self.max_context {
                return Err(Error::InvalidInput(format!(
                    "sequence of {end} tokens exceeds the context of {} tokens",
                    self.max_context
                )));
            }
            self.blocks.reserve(&mut seq.block_table, end)?;
            let q_start = batch.tokens.len();
            for pos in start..end {
                batch.tokens.push(seq.tokens[pos]);
                batch.positions.push(pos as u32);
                batch.attn.slots.push(seq.block_table[pos / bs] as usize * bs + pos % bs);
            }
            batch.attn.seqs.push(SeqSlice {
                q_start,
                q_len: end - start,
                ctx_len: end,
                block_table: seq.block_table.clone(),
            });
            match which {
                Logits::Last => batch.logit_rows.push(batch.tokens.len() - 1),
                Logits::All => batch.logit_rows.extend(q_start..batch.tokens.len()),
            }
        }
        let logits = self.model.forward(&batch)?;
        for seq in seqs.iter_mut() {
            seq.n_cached = seq.tokens.len().min(seq.n_cached.saturating_add(chunk));
        }
        Ok(logits)
    }

    /// Returns the sequence's blocks to the pool.
    pub fn release(&mut self, seq: &mut Sequence) {
        self.blocks.release(&mut seq.block_table);
        seq.n_cached = 0;
    }
}
