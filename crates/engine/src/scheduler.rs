//! Iteration-level scheduler: decides, before every forward pass, which
//! sequences run and how many tokens each, over the paged KV cache.
//!
//! - Continuous batching: sequences join and leave the running set every step.
//! - Chunked prefill: a per-step token budget; running sequences (decodes and
//!   unfinished prefills, oldest first) are served before new admissions, and a
//!   long prompt is split across steps.
//! - Prefix caching: on admission a prompt's leading full blocks are taken from
//!   the cache (`BlockManager`), never its last token, which must be computed to
//!   produce logits; none for a prompt whose every row's logits are wanted.
//! - Preemption by recompute: when blocks run out, the newest running sequence
//!   gives up its blocks and goes back to the front of the queue with all its
//!   tokens (prompt + generated) as its new prompt. Nothing is dropped.
//! - FIFO admission: the queue head is admitted first; if it does not fit,
//!   nothing behind it jumps ahead.
//!
//! The scheduler emits plain data (`StepPlan`) and knows nothing about models,
//! sampling or text; it is tested with a fake runner (`tests` below).

use std::collections::VecDeque;

use ferrite_backend::picks::fed_row;

use crate::blocks::{block_hash, BlockManager, ROOT_HASH};

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_batched_tokens: usize,
    pub prefix_caching: bool,
}

/// One sequence's part of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledSeq {
    pub id: u64,
    /// Position of the first token to compute (tokens before it are cached).
    pub start: usize,
    /// The tokens to compute, at positions `start..start + tokens.len()`.
    pub tokens: Vec<u32>,
    pub block_table: Vec<u32>,
    /// This chunk reaches the sequence's end: sample the next token from its
    /// last row.
    pub sample: bool,
    /// Leading rows of this chunk whose logits the request wants (prompt
    /// logprobs: `Scheduler::add_scored`), besides the sampled row.
    pub scored_rows: usize,
}

/// What to run in one forward pass.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences that lost their blocks this step (they will be recomputed).
    pub preempted: Vec<u64>,
}

impl StepPlan {
    pub fn n_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}

struct SeqState {
    id: u64,
    tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    n_computed: usize,
    block_table: Vec<u32>,
    /// Chained hashes of the leading full blocks already registered or hit.
    hashes: Vec<u64>,
    /// Prompt tokens served from the prefix cache at first admission.
    cached_tokens: Option<usize>,
    /// Positions below this want their logits (each scores the token after
    /// it); 0 once they have all run. Such a sequence takes no cached prefix.
    scored: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub preemptions: u64,
}

pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    waiting: VecDeque<SeqState>,
    /// Oldest admission first.
    running: Vec<SeqState>,
    stats: SchedulerStats,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, n_blocks: usize, block_size: usize) -> Self {
        Scheduler {
            config,
            blocks: BlockManager::new(n_blocks, block_size),
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: SchedulerStats::default(),
        }
    }

    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }
    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn n_running(&self) -> usize {
        self.running.len()
    }
    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }
    /// Most tokens one sequence can ever hold.
    pub fn capacity_tokens(&self) -> usize {
        self.blocks.n_blocks() * self.blocks.block_size()
    }

    /// Queues a new sequence. The caller guarantees `tokens` is non-empty and
    /// that the sequence, fully grown, fits `capacity_tokens`.
    pub fn add(&mut self, id: u64, tokens: Vec<u32>) {
        self.push(id, tokens, 0);
    }

    /// `add`, with the logits of every prompt row but the last (which is
    /// sampled) in the plans (`ScheduledSeq::scored_rows`): the prompt is
    /// computed whole, not taken from the prefix cache.
    pub fn add_scored(&mut self, id: u64, tokens: Vec<u32>) {
        let scored = tokens.len().saturating_sub(1);
        self.push(id, tokens, scored);
    }

    fn push(&mut self, id: u64, tokens: Vec<u32>, scored: usize) {
        self.waiting.push_back(SeqState {
            id,
            tokens,
            n_computed: 0,
            block_table: Vec::new(),
            hashes: Vec::new(),
            cached_tokens: None,
            scored,
        });
    }

    /// Prompt tokens that came from the prefix cache at the sequence's first
    /// admission (0 while it waits).
    pub fn cached_tokens(&self, id: u64) -> usize {
        self.find(id).and_then(|s| s.cached_tokens).unwrap_or(0)
    }

    fn find(&self, id: u64) -> Option<&SeqState> {
        self.running.iter().chain(self.waiting.iter()).find(|s| s.id == id)
    }

    /// Appends a sampled token to a running sequence; it is computed next step.
    pub fn append_token(&mut self, id: u64, token: u32) {
        if let Some(s) = self.running.iter_mut().find(|s| s.id == id) {
            s.tokens.push(token);
        }
    }

    /// A sampled token: in place of the sequence's last token where that is
    /// a fed id (`ferrite_backend::picks`: a step already took it from the
    /// device), else appended; running or preempted.
    pub fn put_token(&mut self, id: u64, token: u32) {
        let Some(s) = self.running.iter_mut().chain(self.waiting.iter_mut()).find(|s| s.id == id) else { return };
        match s.tokens.last_mut() {
            Some(last) if fed_row(*last).is_some() => *last = token,
            _ => s.tokens.push(token),
        }
    }

    /// Removes a sequence (finished, cancelled or failed) wherever it is and
    /// frees its blocks. Unknown ids are ignored.
    pub fn remove(&mut self, id: u64) {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            Some(self.running.remove(i))
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i)
        } else {
            None
        };
        if let Some(mut s) = seq {
            self.blocks.release(&mut s.block_table);
        }
    }

    /// Plans the next forward pass. An empty plan means there is no work.
    pub fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.config.max_batched_tokens;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let want = (self.running[i].tokens.len() - self.running[i].n_computed).min(budget);
            if want == 0 {
                i += 1;
                continue;
            }
            let end = self.running[i].n_computed + want;
            // Make room by preempting the newest sequences, possibly this one.
            while i < self.running.len() && !self.blocks.can_reserve(&self.running[i].block_table, end) {
                let victim = self.running.pop().expect("i < len");
                plan.preempted.push(victim.id);
                self.preempt(victim);
            }
            if i == self.running.len() {
                break;
            }
            let s = &mut self.running[i];
            self.blocks.reserve(&mut s.block_table, end).expect("checked by can_reserve");
            plan.seqs.push(scheduled(s, want));
            budget -= want;
            i += 1;
        }
        // Admitting while preempting would only thrash.
        if plan.preempted.is_empty() {
            self.admit(&mut plan, budget);
        }
        plan
    }

    fn admit(&mut self, plan: &mut StepPlan, mut budget: usize) {
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(mut s) = self.waiting.pop_front() else { break };
            let first_time = s.cached_tokens.is_none();
            let hits = if self.config.prefix_caching && s.scored == 0 { self.take_cached_prefix(&mut s) } else { 0 };
            let want = (s.tokens.len() - s.n_computed).min(budget);
            let end = s.n_computed + want;
            if !self.blocks.can_reserve(&s.block_table, end) {
                // Put it back as it was; FIFO: nobody overtakes it.
                self.blocks.release(&mut s.block_table);
                s.hashes.clear();
                s.n_computed = 0;
                self.waiting.push_front(s);
                break;
            }
            self.blocks.reserve(&mut s.block_table, end).expect("checked by can_reserve");
            if s.scored == 0 {
                // (A scored prompt never looks.)
                self.stats.prefix_query_tokens += s.tokens.len() as u64;
                self.stats.prefix_hit_tokens += hits as u64;
            }
            if first_time {
                s.cached_tokens = Some(hits);
            }
            plan.seqs.push(scheduled(&s, want));
            budget -= want;
            self.running.push(s);
        }
    }

    /// Takes the cached blocks that match the sequence's leading full blocks,
    /// leaving at least its last token to compute. Returns the tokens covered.
    fn take_cached_prefix(&mut self, s: &mut SeqState) -> usize {
        let bs = self.blocks.block_size();
        let max_blocks = (s.tokens.len() - 1) / bs;
        let mut parent = ROOT_HASH;
        for b in 0..max_blocks {
            let Some((block, hash)) = self.blocks.lookup(parent, &s.tokens[b * bs..(b + 1) * bs]) else { break };
            self.blocks.acquire(block);
            s.block_table.push(block);
            s.hashes.push(hash);
            parent = hash;
        }
        s.n_computed = s.block_table.len() * bs;
        s.n_computed
    }

    fn preempt(&mut self, mut s: SeqState) {
        self.stats.preemptions += 1;
        self.blocks.release(&mut s.block_table);
        s.n_computed = 0;
        s.hashes.clear();
        self.waiting.push_front(s);
    }

    /// Records that `plan` ran: its tokens are now cached, and blocks they
    /// filled are registered in the prefix cache.
    pub fn step_done(&mut self, plan: &StepPlan) {
        let bs = self.blocks.block_size();
        for p in &plan.seqs {
            let Some(s) = self.running.iter_mut().find(|s| s.id == p.id) else { continue };
            s.n_computed = p.start + p.tokens.len();
            if s.n_computed >= s.scored {
                // (A preemption after this recomputes without scoring again.)
                s.scored = 0;
            }
            if !self.config.prefix_caching {
                continue;
            }
            while s.hashes.len() < s.n_computed / bs {
                let b = s.hashes.len();
                let parent = s.hashes.last().copied().unwrap_or(ROOT_HASH);
                let tokens = &s.tokens[b * bs..(b + 1) * bs];
                let hash = block_hash(parent, tokens);
                self.blocks.register(s.block_table[b], hash, tokens);
                s.hashes.push(hash);
            }
        }
    }

    /// Checks the block accounting against the sequences: every table entry
    /// is referenced once per holder and nothing else is referenced.
    pub fn check(&self) -> Result<(), String> {
        self.blocks.check()?;
        let mut refs = vec![0u32; self.blocks.n_blocks()];
        for s in self.running.iter().chain(self.waiting.iter()) {
            for &b in &s.block_table {
                refs[b as usize] += 1;
            }
            if s.block_table.len() * self.blocks.block_size() < s.n_computed {
                return Err(format!("sequence {} has computed tokens outside its blocks", s.id));
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            if self.blocks.ref_count(b as u32) != r {
                return Err(format!("block {b}: {} references recorded, {r} held", self.blocks.ref_count(b as u32)));
            }
        }
        Ok(())
    }
}

fn scheduled(s: &SeqState, n: usize) -> ScheduledSeq {
    let end = s.n_computed + n;
    ScheduledSeq {
        id: s.id,
        start: s.n_computed,
        tokens: s.tokens[s.n_computed..end].to_vec(),
        block_table: s.block_table.clone(),
        sample: end == s.tokens.len(),
        scored_rows: end.min(s.scored).saturating_sub(s.n_computed),
    }
}

#[cfg(test)]
mod tests;
