//! The scheduler driven by a fake runner through random sequences of
//! add / step / cancel / finish, checking after every operation that no block
//! is leaked or double-owned, that cached K/V always belongs to the prefix it
//! claims, and that every request finishes.

use std::collections::HashMap;

use super::*;
use crate::blocks::block_hash;

/// Tiny deterministic PRNG (xorshift64*), so failures replay from the seed.
struct Prng(u64);
impl Prng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A fake model: its "KV cache" stores, per slot, a fingerprint of the whole
/// prefix ending at that position, so reading a slot written for a different
/// prefix is caught.
struct FakeRunner {
    block_size: usize,
    kv: Vec<Option<u64>>,
}

impl FakeRunner {
    fn run(&mut self, plan: &StepPlan, tokens: &HashMap<u64, Vec<u32>>, sched: &Scheduler) {
        let bs = self.block_size;
        for p in &plan.seqs {
            let all = &tokens[&p.id];
            assert_eq!(&all[p.start..p.start + p.tokens.len()], &p.tokens[..], "seq {} tokens", p.id);
            // Reads: every earlier position holds this sequence's prefix.
            for pos in 0..p.start {
                let slot = p.block_table[pos / bs] as usize * bs + pos % bs;
                assert_eq!(self.kv[slot], Some(fingerprint(&all[..=pos])), "seq {} reads a wrong K/V at {pos}", p.id);
            }
            // Writes go only to blocks this sequence alone holds.
            for pos in p.start..p.start + p.tokens.len() {
                let block = p.block_table[pos / bs];
                assert_eq!(sched.blocks().ref_count(block), 1, "seq {} writes shared block {block}", p.id);
                self.kv[block as usize * bs + pos % bs] = Some(fingerprint(&all[..=pos]));
            }
        }
    }
}

fn fingerprint(prefix: &[u32]) -> u64 {
    block_hash(prefix.len() as u64, prefix)
}

struct Sim {
    rng: Prng,
    sched: Scheduler,
    runner: FakeRunner,
    tokens: HashMap<u64, Vec<u32>>,
    /// id -> total length at which it finishes.
    limit: HashMap<u64, usize>,
    next_id: u64,
    finished: usize,
    config: SchedulerConfig,
}

impl Sim {
    fn new(seed: u64, n_blocks: usize, block_size: usize, config: SchedulerConfig) -> Sim {
        Sim {
            rng: Prng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
            sched: Scheduler::new(config.clone(), n_blocks, block_size),
            runner: FakeRunner { block_size, kv: vec![None; n_blocks * block_size] },
            tokens: HashMap::new(),
            limit: HashMap::new(),
            next_id: 1,
            finished: 0,
            config,
        }
    }

    fn add(&mut self) {
        let cap = self.sched.capacity_tokens();
        // A small alphabet and shared openings make prefix hits common.
        let opening = self.rng.below(3);
        let len = 1 + self.rng.below(cap.min(48));
        let prompt: Vec<u32> =
            (0..len).map(|i| if i < 20 { (opening * 7 + i) as u32 } else { self.rng.below(4) as u32 }).collect();
        let total = (len + 1 + self.rng.below(12)).min(cap);
        let id = self.next_id;
        self.next_id += 1;
        self.tokens.insert(id, prompt.clone());
        self.limit.insert(id, total.max(len + 1).min(cap));
        if len >= cap {
            self.tokens.remove(&id);
            self.limit.remove(&id);
            return;
        }
        self.sched.add(id, prompt);
    }

    fn step(&mut self) -> bool {
        let plan = self.sched.schedule();
        if plan.seqs.is_empty() {
            assert!(self.sched.is_idle(), "work is waiting but nothing was scheduled");
            return false;
        }
        assert!(plan.n_tokens() <= self.config.max_batched_tokens);
        assert!(plan.seqs.len() <= self.config.max_num_seqs);
        for p in &plan.seqs {
            let need = (p.start + p.tokens.len()).div_ceil(self.sched.blocks().block_size());
            assert!(p.block_table.len() >= need, "seq {} lacks blocks", p.id);
        }
        self.runner.run(&plan, &self.tokens, &self.sched);
        self.sched.step_done(&plan);
        for p in plan.seqs.iter().filter(|p| p.sample) {
            let toks = self.tokens.get_mut(&p.id).unwrap();
            let t = self.rng.below(4) as u32;
            toks.push(t);
            if toks.len() >= self.limit[&p.id] {
                self.sched.remove(p.id);
                self.tokens.remove(&p.id);
                self.finished += 1;
            } else {
                self.sched.append_token(p.id, t);
            }
        }
        true
    }

    fn cancel_random(&mut self) {
        let ids: Vec<u64> = self.tokens.keys().copied().collect();
        if !ids.is_empty() {
            let id = ids[self.rng.below(ids.len())];
            self.sched.remove(id);
            self.tokens.remove(&id);
        }
    }

    fn check(&self) {
        if let Err(e) = self.sched.check() {
            panic!("accounting broken: {e}");
        }
        assert_eq!(self.sched.n_running() + self.sched.n_waiting(), self.tokens.len());
    }
}

fn configs() -> Vec<(usize, usize, SchedulerConfig)> {
    let c = |max_num_seqs, max_batched_tokens, prefix_caching| SchedulerConfig {
        max_num_seqs,
        max_batched_tokens,
        prefix_caching,
    };
    vec![
        (8, 4, c(4, 16, true)),
        (6, 2, c(8, 7, true)),
        (32, 4, c(16, 64, true)),
        (8, 4, c(4, 16, false)),
        (3, 16, c(2, 5, true)),
    ]
}

#[test]
fn random_operations_never_leak_or_double_own_blocks() {
    let (mut preemptions, mut hits, mut finished) = (0, 0, 0);
    for seed in 0..300u64 {
        for (n_blocks, block_size, config) in configs() {
            let mut sim = Sim::new(seed, n_blocks, block_size, config);
            for _ in 0..200 {
                match sim.rng.below(10) {
                    0..=2 => sim.add(),
                    3 => sim.cancel_random(),
                    _ => {
                        sim.step();
                    }
                }
                sim.check();
            }
            // Drain: everything left must finish, and then every block is free.
            let mut steps = 0;
            while sim.step() {
                sim.check();
                steps += 1;
                assert!(steps < 10_000, "seed {seed}: requests starve");
            }
            assert_eq!(sim.sched.blocks().n_free(), n_blocks, "seed {seed}: blocks leaked");
            assert!(sim.tokens.is_empty());
            preemptions += sim.sched.stats().preemptions;
            hits += sim.sched.stats().prefix_hit_tokens;
            finished += sim.finished;
        }
    }
    // The runs did exercise the interesting paths.
    assert!(preemptions > 1000 && hits > 1000 && finished > 10_000, "{preemptions} {hits} {finished}");
}

#[test]
fn preemption_recomputes_and_prefix_hits_are_counted() {
    let config = SchedulerConfig { max_num_seqs: 8, max_batched_tokens: 64, prefix_caching: true };
    let mut s = Scheduler::new(config, 4, 4);
    s.add(1, (0..8).collect());
    s.add(2, (0..7).collect());
    let plan = s.schedule();
    assert_eq!(plan.seqs.len(), 2);
    assert_eq!(s.blocks().n_free(), 0);
    s.step_done(&plan);
    s.append_token(1, 9);
    s.append_token(2, 9);
    // Seq 1 needs a third block: seq 2 (newest) is preempted.
    let plan = s.schedule();
    assert_eq!(plan.preempted, vec![2]);
    assert_eq!((plan.seqs.len(), plan.seqs[0].id, plan.seqs[0].start), (1, 1, 8));
    s.step_done(&plan);
    s.remove(1);
    // Seq 2 comes back; its first block (tokens 0..4) is shared with seq 1's
    // cached one, so only the rest is recomputed.
    let plan = s.schedule();
    assert_eq!((plan.seqs[0].id, plan.seqs[0].start, plan.seqs[0].tokens.len()), (2, 4, 4));
    assert_eq!(s.stats().preemptions, 1);
    assert_eq!(s.stats().prefix_hit_tokens, 4);
    s.step_done(&plan);
    s.remove(2);
    s.check().unwrap();
    assert_eq!(s.blocks().n_free(), 4);
}

#[test]
fn chunked_prefill_shares_the_budget_with_decodes_fifo() {
    let config = SchedulerConfig { max_num_seqs: 8, max_batched_tokens: 10, prefix_caching: false };
    let mut s = Scheduler::new(config, 64, 4);
    s.add(1, vec![1; 3]);
    let p = s.schedule();
    s.step_done(&p);
    s.append_token(1, 2);
    s.add(2, vec![3; 25]);
    s.add(3, vec![4; 2]);
    // Decode of 1 first, then 9 tokens of 2's prompt; 3 waits behind 2 (FIFO).
    let p = s.schedule();
    let lens: Vec<(u64, usize, bool)> = p.seqs.iter().map(|q| (q.id, q.tokens.len(), q.sample)).collect();
    assert_eq!(lens, vec![(1, 1, true), (2, 9, false)]);
    s.step_done(&p);
    s.append_token(1, 2);
    let p = s.schedule();
    let lens: Vec<(u64, usize, bool)> = p.seqs.iter().map(|q| (q.id, q.tokens.len(), q.sample)).collect();
    assert_eq!(lens, vec![(1, 1, true), (2, 9, false)]);
}

#[test]
fn scored_prompts_take_no_cached_prefix_and_score_each_position_once() {
    let config = SchedulerConfig { max_num_seqs: 8, max_batched_tokens: 5, prefix_caching: true };
    let mut s = Scheduler::new(config, 8, 4);
    let prompt: Vec<u32> = (0..11).collect();
    // Cache the prompt's blocks first.
    s.add(1, prompt.clone());
    for _ in 0..3 {
        let p = s.schedule();
        s.step_done(&p);
    }
    s.remove(1);
    // Scored: positions 0..10 (each scores the next token), in chunks of 5;
    // the last row (10) is sampled, not scored.
    s.add_scored(2, prompt.clone());
    let mut rows = Vec::new();
    loop {
        let p = s.schedule();
        let q = &p.seqs[0];
        assert!(q.scored_rows <= q.tokens.len() && !(q.sample && q.scored_rows == q.tokens.len()));
        rows.push((q.start, q.tokens.len(), q.scored_rows, q.sample));
        s.step_done(&p);
        if q.sample {
            break;
        }
    }
    assert_eq!(rows, [(0, 5, 5, false), (5, 5, 5, false), (10, 1, 0, true)]);
    assert_eq!(s.cached_tokens(2), 0);
    assert_eq!((s.stats().prefix_query_tokens, s.stats().prefix_hit_tokens), (11, 0));
    s.remove(2);
    s.check().unwrap();
}

#[test]
fn a_preempted_scored_prompt_is_scored_again_only_if_it_was_not_yet() {
    for (budget, first_rows, again_rows) in [(10, 2, 5), (20, 5, 0)] {
        let config = SchedulerConfig { max_num_seqs: 8, max_batched_tokens: budget, prefix_caching: false };
        // Four blocks of 4: the older sequence's growth preempts the scored one.
        let mut s = Scheduler::new(config, 4, 4);
        s.add(1, (0..8).collect());
        s.add_scored(2, (0..6).collect());
        let p = s.schedule();
        assert_eq!((p.seqs[1].id, p.seqs[1].scored_rows), (2, first_rows));
        s.step_done(&p);
        s.append_token(1, 8);
        let p = s.schedule();
        assert_eq!(p.preempted, [2]);
        s.step_done(&p);
        s.remove(1);
        let p = s.schedule();
        assert_eq!((p.seqs[0].id, p.seqs[0].start, p.seqs[0].scored_rows), (2, 0, again_rows), "budget {budget}");
        s.step_done(&p);
        s.check().unwrap();
    }
}
