//! Runs flat batches of sequences through a model over the paged KV cache:
//! block reservation, slot mapping, positions and the attention metadata.

use crate::blocks::BlockManager;
use crate::scheduler::ScheduledSeq;
use ferrite_backend::picks::{Picks, MAX_FED_ROWS};
use ferrite_backend::{RowSampling, SeqSlice};
use ferrite_core::{Error, Result};
use ferrite_models::{CausalLm, ForwardBatch, KvDtype, LmConfig};

pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// A request's token ids, which must be rows of the vocabulary: ids from
/// `ferrite_backend::picks::FED_TOKEN` up name a device's picks, which only
/// the engine may put in a sequence.
pub fn check_token_ids(ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => Err(Error::InvalidInput(format!("token id {t} is outside the vocabulary of {vocab}"))),
        None => Ok(()),
    }
}

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
    /// The last step's batch, whose lists the next step refills (a warm
    /// decode step allocates nothing for them).
    batch: ForwardBatch,
    /// `feeds_pending`.
    feed_pending: bool,
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
    pub fn new(model: Box<dyn CausalLm>, context: usize, block_size: usize, kv: KvDtype) -> Result<Self> {
        Self::with_pool(model, context, context.div_ceil(block_size.max(1)), block_size, kv)
    }

    /// A KV pool of `n_blocks` blocks shared by many sequences, each holding at
    /// most `context` tokens (less if the pool is smaller).
    pub fn with_pool(
        mut model: Box<dyn CausalLm>,
        context: usize,
        n_blocks: usize,
        block_size: usize,
        kv: KvDtype,
    ) -> Result<Self> {
        if context == 0 || block_size == 0 || n_blocks == 0 {
            return Err(Error::InvalidInput("context, KV blocks and block size must be positive".into()));
        }
        model.alloc_kv(n_blocks, block_size, kv)?;
        let max_context = context.min(n_blocks * block_size);
        let blocks = BlockManager::new(n_blocks, block_size);
        let feed_pending = ferrite_core::env::feed_pending();
        Ok(Runner { model, blocks, max_context, batch: ForwardBatch::default(), feed_pending })
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
    pub fn n_blocks(&self) -> usize {
        self.blocks.n_blocks()
    }
    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
    }

    /// Whether `execute_sampled_begin` and `step_sampled` draw tokens on the device.
    pub fn samples_on_device(&self) -> bool {
        self.model.samples_on_device()
    }

    /// Whether steps may go out before the last one's picks are read, their
    /// token ids fed ids (`ferrite_backend::picks`) naming the tokens
    /// `step_sampled_begin` drew, still on the device: where the model
    /// samples there and feeds them, for steps that sample `rows` rows,
    /// unless `FERRITE_FEED_AHEAD=0`.
    pub fn feeds_ahead(&self, rows: usize) -> bool {
        rows <= MAX_FED_ROWS
            && self.model.samples_on_device()
            && self.model.feeds_tokens()
            && ferrite_core::env::feed_ahead()
    }

    /// Whether steps fed ahead may carry requests whose draws read their
    /// history (penalties): the device counts each row's last pick, still
    /// unread, in them (`RowSampling::pending`); unless
    /// `FERRITE_FEED_PENDING=0` or `set_feeds_pending`.
    pub fn feeds_pending(&self) -> bool {
        self.feed_pending
    }

    pub fn set_feeds_pending(&mut self, on: bool) {
        self.feed_pending = on;
    }

    /// Runs a scheduler's plan in one forward pass. Block tables come from the
    /// scheduler (which then owns the KV pool; don't mix with `step`). Returns
    /// logits, in order: each sequence's first `scored_rows` rows, then its
    /// last row if it is marked `sample`.
    pub fn execute(&mut self, plan: &[ScheduledSeq]) -> Result<Vec<f32>> {
        let batch = self.plan_batch(plan)?;
        let logits = self.model.forward(&batch);
        self.batch = batch;
        logits
    }

    /// `execute`, drawing the token of each sequence marked `sample` on the
    /// device by its entry of `rows`: (token, logprob) in order, once waited
    /// for (`Picks::wait`; see `step_sampled_begin`).
    pub fn execute_sampled_begin(&mut self, plan: &[ScheduledSeq], rows: &[RowSampling]) -> Result<Picks> {
        // (Scored rows want their logits on the host: `execute`.)
        debug_assert!(plan.iter().all(|s| s.scored_rows == 0));
        let batch = self.plan_batch(plan)?;
        let picked = self.model.forward_sample_begin(&batch, rows);
        self.batch = batch;
        picked
    }

    /// The kept batch, emptied (its lists keep their capacity).
    fn take_batch(&mut self) -> ForwardBatch {
        let mut batch = std::mem::take(&mut self.batch);
        batch.tokens.clear();
        batch.positions.clear();
        batch.logit_rows.clear();
        batch.attn.slots.clear();
        batch.attn.block_size = self.blocks.block_size();
        batch
    }

    fn plan_batch(&mut self, plan: &[ScheduledSeq]) -> Result<ForwardBatch> {
        let bs = self.blocks.block_size();
        let mut batch = self.take_batch();
        let mut n_seqs = 0;
        for seq in plan {
            let end = seq.start + seq.tokens.len();
            if seq.tokens.is_empty() || end > self.max_context || seq.block_table.len() * bs < end {
                return Err(Error::InvalidInput(format!("execute: bad plan for sequence {}", seq.id)));
            }
            let q_start = batch.tokens.len();
            for (i, &t) in seq.tokens.iter().enumerate() {
                let pos = seq.start + i;
                batch.tokens.push(t);
                batch.positions.push(pos as u32);
                batch.attn.slots.push(seq.block_table[pos / bs] as usize * bs + pos % bs);
            }
            set_seq(&mut batch.attn.seqs, &mut n_seqs, q_start, seq.tokens.len(), end, &seq.block_table);
            // A sampled chunk's scored rows stop before its last: the
            // prompt's last row is never scored.
            debug_assert!(!seq.sample || seq.scored_rows < seq.tokens.len());
            batch.logit_rows.extend(q_start..q_start + seq.scored_rows.min(seq.tokens.len()));
            if seq.sample {
                batch.logit_rows.push(batch.tokens.len() - 1);
            }
        }
        batch.attn.seqs.truncate(n_seqs);
        Ok(batch)
    }

    /// Processes up to `chunk` uncached tokens of every sequence in one forward
    /// pass; returns the requested logits, `vocab` floats per row.
    pub fn step(&mut self, seqs: &mut [&mut Sequence], chunk: usize, which: Logits) -> Result<Vec<f32>> {
        self.run_step(seqs, chunk, which, |m, b| m.forward(b))
    }

    /// `step` with each sequence's last row's token drawn on the device by its
    /// entry of `rows`: (token, logprob) per sequence.
    pub fn step_sampled(
        &mut self,
        seqs: &mut [&mut Sequence],
        chunk: usize,
        rows: &[RowSampling],
    ) -> Result<Vec<(u32, f32)>> {
        self.run_step(seqs, chunk, Logits::Last, |m, b| m.forward_sample(b, rows))
    }

    /// `step_sampled` without waiting for the picks: where `feeds_ahead`,
    /// the next step may be run first, each sequence's new token the fed id
    /// of its row here (`ferrite_backend::picks::fed`), and the picks read
    /// while it runs. Fed ids in `tokens` stay until replaced by the picks.
    pub fn step_sampled_begin(
        &mut self,
        seqs: &mut [&mut Sequence],
        chunk: usize,
        rows: &[RowSampling],
    ) -> Result<Picks> {
        self.run_step(seqs, chunk, Logits::Last, |m, b| m.forward_sample_begin(b, rows))
    }

    /// One forward pass of `seqs` by `run`; their cached counts advance when it succeeds.
    fn run_step<T>(
        &mut self,
        seqs: &mut [&mut Sequence],
        chunk: usize,
        which: Logits,
        run: impl FnOnce(&mut dyn CausalLm, &ForwardBatch) -> Result<T>,
    ) -> Result<T> {
        let batch = self.step_batch(seqs, chunk, which)?;
        let out = run(self.model.as_mut(), &batch);
        self.batch = batch;
        let out = out?;
        Self::advance(seqs, chunk);
        Ok(out)
    }

    fn advance(seqs: &mut [&mut Sequence], chunk: usize) {
        for seq in seqs.iter_mut() {
            seq.n_cached = seq.tokens.len().min(seq.n_cached.saturating_add(chunk));
        }
    }

    fn step_batch(&mut self, seqs: &mut [&mut Sequence], chunk: usize, which: Logits) -> Result<ForwardBatch> {
        let bs = self.blocks.block_size();
        let mut batch = self.take_batch();
        let mut n_seqs = 0;
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
            set_seq(&mut batch.attn.seqs, &mut n_seqs, q_start, end - start, end, &seq.block_table);
            match which {
                Logits::Last => batch.logit_rows.push(batch.tokens.len() - 1),
                Logits::All => batch.logit_rows.extend(q_start..batch.tokens.len()),
            }
        }
        batch.attn.seqs.truncate(n_seqs);
        Ok(batch)
    }

    /// Returns the sequence's blocks to the pool.
    pub fn release(&mut self, seq: &mut Sequence) {
        self.blocks.release(&mut seq.block_table);
        seq.n_cached = 0;
    }
}

/// Sets entry `*n` of `seqs` (reusing its block table's buffer), then counts it.
fn set_seq(seqs: &mut Vec<SeqSlice>, n: &mut usize, q_start: usize, q_len: usize, ctx_len: usize, table: &[u32]) {
    if *n == seqs.len() {
        seqs.push(SeqSlice { q_start, q_len, ctx_len, block_table: Vec::new() });
    }
    let s = &mut seqs[*n];
    (s.q_start, s.q_len, s.ctx_len) = (q_start, q_len, ctx_len);
    s.block_table.clear();
    s.block_table.extend_from_slice(table);
    *n += 1;
}
