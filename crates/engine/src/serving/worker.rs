//! The engine thread: takes commands, asks the scheduler for a plan, runs it,
//! samples, streams events, and repeats while there is work.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use ferrite_backend::picks::{fed, fed_row, Picks};
use ferrite_backend::RowSampling;
use ferrite_core::Result;
use ferrite_loader::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::{Command, EngineConfig, Event, Request, Shared, Summary};
use crate::constraint::format::Constraint;
use crate::constraint::json::JsonVocab;
use crate::detokenizer::IncrementalDetokenizer;
use crate::runner::Runner;
use crate::sampling::{Sampled, Sampler, Scorer, StopChecker, TokenScore};
use crate::scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, StepPlan};
use crate::FinishReason;

/// A step's result: logits to sample on the host, or tokens drawn on the device.
enum Picked {
    Logits(Vec<f32>),
    Device(Vec<(u32, f32)>),
}

/// A step just launched: its logits, or its device draws on their way back.
enum Launched {
    Logits(Vec<f32>),
    Device(Picks),
}

/// A request the worker is serving: everything besides its tokens and blocks
/// (which the scheduler holds).
struct Active {
    tx: UnboundedSender<Event>,
    req: Request,
    sampler: Sampler,
    detok: IncrementalDetokenizer,
    stops: StopChecker,
    constraint: Option<Constraint>,
    generated: Vec<u32>,
    /// Scores of the prompt's tokens so far (`Request::prompt_logprobs`).
    prompt_scores: Vec<TokenScore>,
    /// Waiting for admission (for the waiting gauge).
    queued: bool,
}

pub(super) struct Worker {
    runner: Runner,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    shared: Arc<Shared>,
    active: HashMap<u64, Active>,
    json_vocab: Option<Arc<JsonVocab>>,
    vocab: usize,
    /// A step launched before its picks were read: the next step's
    /// sequences end with their fed ids (`Scheduler::put_token` fills them).
    ahead: Option<(StepPlan, Picks)>,
    scorer: Scorer,
}

impl Worker {
    pub(super) fn new(
        runner: Runner,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
        shared: Arc<Shared>,
    ) -> Result<Self> {
        let sc = SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_batched_tokens: cfg.max_batched_tokens,
            prefix_caching: cfg.prefix_caching,
        };
        let scheduler = Scheduler::new(sc, runner.n_blocks(), runner.block_size());
        let vocab = runner.config().vocab_size;
        let w = Worker {
            runner,
            tokenizer,
            scheduler,
            shared,
            active: HashMap::new(),
            json_vocab: None,
            vocab,
            ahead: None,
            scorer: Scorer::default(),
        };
        w.publish_metrics();
        Ok(w)
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<Command>) {
        loop {
            // Block only when there is nothing to run.
            let first = if self.idle() {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                }
            } else {
                None
            };
            let mut shutdown = false;
            for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                shutdown |= self.handle(cmd);
            }
            if shutdown {
                self.cancel_all();
                break;
            }
            self.drop_disconnected();
            if !self.idle() {
                self.step();
            }
            self.publish_metrics();
        }
        self.publish_metrics();
    }

    /// Nothing to run, and no picks on their way back to stream.
    fn idle(&self) -> bool {
        self.scheduler.is_idle() && self.ahead.is_none()
    }

    /// Returns true on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit { id, req, tx } => {
                let constraint = req.format.as_ref().map(|f| Constraint::new(self.json_vocab(), f));
                if req.prompt_logprobs.is_some() {
                    self.scheduler.add_scored(id, req.prompt.clone());
                    if req.prompt.len() == 1 {
                        // Nothing to score: the event still comes first.
                        let _ = tx.send(Event::PromptLogprobs(Vec::new()));
                    }
                } else {
                    self.scheduler.add(id, req.prompt.clone());
                }
                let a = Active {
                    tx,
                    sampler: Sampler::new(req.sampling.clone()),
                    detok: IncrementalDetokenizer::after(&self.tokenizer, &req.prompt, req.format.is_some()),
                    stops: StopChecker::new(req.stop.clone()),
                    constraint,
                    generated: Vec::new(),
                    prompt_scores: Vec::new(),
                    queued: true,
                    req: *req,
                };
                self.active.insert(id, a);
                self.metric(|m| m.requests_submitted += 1);
            }
            Command::Cancel(id) => self.finish(id, FinishReason::Cancelled, None),
            Command::Shutdown => return true,
        }
        false
    }

    fn json_vocab(&mut self) -> Arc<JsonVocab> {
        let (tok, vocab) = (&self.tokenizer, self.vocab);
        self.json_vocab.get_or_insert_with(|| Arc::new(JsonVocab::for_tokenizer(tok, vocab))).clone()
    }

    /// Frees the blocks of requests whose client has gone away.
    fn drop_disconnected(&mut self) {
        let gone: Vec<u64> = self.active.iter().filter(|(_, a)| a.tx.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            self.finish(id, FinishReason::Cancelled, None);
        }
    }

    fn cancel_all(&mut self) {
        let ids: Vec<u64> = self.active.keys().copied().collect();
        for id in ids {
            self.finish(id, FinishReason::Cancelled, None);
        }
    }

    /// Plans and runs one step. Where the device feeds its picks to the
    /// next step (`feeds_ahead`), that step is launched before this one's
    /// picks are read: they are read, and streamed, while it runs.
    fn step(&mut self) {
        let plan = self.scheduler.schedule();
        if plan.seqs.is_empty() {
            self.read_ahead();
            return;
        }
        for s in &plan.seqs {
            if let Some(a) = self.active.get_mut(&s.id) {
                if std::mem::take(&mut a.queued) {
                    self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        let rows = self.device_rows(&plan);
        let feed = rows.is_some() && self.feeds_ahead(&plan);
        let launched = match rows {
            Some(rows) => self.runner.execute_sampled_begin(&plan.seqs, &rows).map(Launched::Device),
            None => {
                // (This step returns only once it has run: the step before's
                // tokens go out first.)
                self.read_ahead();
                self.runner.execute(&plan.seqs).map(Launched::Logits)
            }
        };
        // The step before, whose picks this one took from the device.
        self.read_ahead();
        match launched {
            Ok(Launched::Device(picks)) if feed => {
                self.scheduler.step_done(&plan);
                // The next step's input: each sampled row's pick, fed on the
                // device; not for a sequence whose pick is its last token.
                for (j, s) in plan.seqs.iter().filter(|s| s.sample).enumerate() {
                    if self.active.get(&s.id).is_some_and(|a| a.generated.len() + 1 < a.req.max_tokens) {
                        self.scheduler.append_token(s.id, fed(j));
                    }
                }
                self.ahead = Some((plan, picks));
            }
            Ok(launched) => {
                let picked = match launched {
                    Launched::Device(picks) => picks.wait().map(Picked::Device),
                    Launched::Logits(l) => Ok(Picked::Logits(l)),
                };
                match picked {
                    Ok(picked) => {
                        self.scheduler.step_done(&plan);
                        self.sample_all(&plan, &picked);
                    }
                    Err(e) => self.fail(&plan, &e),
                }
            }
            Err(e) => self.fail(&plan, &e),
        }
        self.metric(|m| m.steps += 1);
    }

    /// Streams the picks of the step launched ahead, if any.
    fn read_ahead(&mut self) {
        let Some((plan, picks)) = self.ahead.take() else { return };
        match picks.wait() {
            Ok(p) => self.sample_all(&plan, &Picked::Device(p)),
            Err(e) => self.fail(&plan, &e),
        }
    }

    /// Ends every request of `plan` with the step's error.
    fn fail(&mut self, plan: &StepPlan, e: &ferrite_core::Error) {
        let msg = e.to_string();
        for s in &plan.seqs {
            self.finish(s.id, FinishReason::Error, Some(msg.clone()));
        }
    }

    /// Whether the step after `plan` may go out before `plan`'s picks are
    /// read: the device feeds them, and no sampled request's next draw
    /// depends on their values (a JSON constraint; penalties, unless the
    /// device counts the unread picks in, `Runner::feeds_pending`).
    fn feeds_ahead(&self, plan: &StepPlan) -> bool {
        let pending = self.runner.feeds_pending();
        self.runner.feeds_ahead(plan.seqs.iter().filter(|s| s.sample).count())
            && plan.seqs.iter().filter(|s| s.sample).all(|s| {
                self.active
                    .get(&s.id)
                    .is_some_and(|a| (pending || !a.sampler.reads_history()) && a.constraint.is_none())
            })
    }

    /// Each sampled sequence's draw, for the device, when the model samples
    /// there and no request of the step needs its logits on the host (a JSON
    /// constraint, top logprobs or scored prompt rows).
    fn device_rows(&mut self, plan: &StepPlan) -> Option<Vec<RowSampling>> {
        if !self.runner.samples_on_device() || plan.seqs.iter().any(|s| s.scored_rows > 0) {
            return None;
        }
        let sampled = || plan.seqs.iter().filter(|s| s.sample).filter_map(|s| self.active.get(&s.id));
        if sampled().any(|a| a.constraint.is_some() || a.sampler.params().logprobs.is_some_and(|n| n > 0)) {
            return None;
        }
        // A row's unread pick is counted in on the device as its own slot of
        // the last launch's picks: a request whose draw reads its history
        // and whose pick was another row's waits for the picks instead.
        let fed_input = |s: &ScheduledSeq| s.tokens.last().and_then(|&t| fed_row(t));
        let moved = plan.seqs.iter().filter(|s| s.sample).enumerate().any(|(r, s)| {
            fed_input(s).is_some_and(|j| j != r) && self.active.get(&s.id).is_some_and(|a| a.sampler.reads_history())
        });
        if moved {
            self.read_ahead();
        }
        let unread = self.ahead.is_some();
        let mut rows = Vec::new();
        for s in plan.seqs.iter().filter(|s| s.sample) {
            let Some(a) = self.active.get_mut(&s.id) else {
                // Ended by the picks just read: its draw goes unused.
                rows.push(RowSampling::greedy());
                continue;
            };
            // A fed input not yet read counts as generated.
            let pending = unread && fed_input(s).is_some();
            let banned: Vec<u32> = if a.generated.len() + usize::from(pending) < a.req.min_tokens {
                self.tokenizer.eos_ids().iter().chain(&a.req.stop_ids).copied().collect()
            } else {
                Vec::new()
            };
            let counted = pending && a.sampler.reads_history();
            rows.push(a.sampler.device_request(&a.req.prompt, &a.generated, &banned, counted)?);
        }
        Some(rows)
    }

    fn sample_all(&mut self, plan: &StepPlan, picked: &Picked) {
        let vocab = self.vocab;
        let (mut rows, mut tokens) = match picked {
            Picked::Logits(l) => (Some(l.chunks_exact(vocab)), None),
            Picked::Device(t) => (None, Some(t.iter())),
        };
        let mut work = Vec::new();
        for s in &plan.seqs {
            // (Scored rows come only with host logits: `device_rows`.)
            if let (true, Some(r)) = (s.scored_rows > 0, rows.as_mut()) {
                // (All taken here, whatever `score_prompt` uses: the next row is the next sequence's.)
                let scored: Vec<&[f32]> = r.by_ref().take(s.scored_rows).collect();
                self.score_prompt(s, &scored);
            }
            if !s.sample {
                continue;
            }
            let device = match tokens.as_mut() {
                Some(t) => match t.next() {
                    Some(&(token, logprob)) => Some(Sampled { token, logprob, top: Vec::new() }),
                    None => break,
                },
                None => None,
            };
            let row = match (&device, rows.as_mut()) {
                (None, Some(r)) => match r.next() {
                    Some(row) => row,
                    None => break,
                },
                _ => &[][..],
            };
            let Some(a) = self.active.get_mut(&s.id) else { continue };
            if a.req.max_tokens == 0 {
                // The prompt alone was asked for: its row's draw goes unused.
                self.finish(s.id, FinishReason::Length, None);
                continue;
            }
            let too_short = a.generated.len() < a.req.min_tokens;
            let row = if device.is_some() {
                row
            } else if a.constraint.is_some() || too_short {
                work.clear();
                work.extend_from_slice(row);
                if let Some(c) = &a.constraint {
                    c.mask(&mut work);
                }
                if too_short {
                    for &t in self.tokenizer.eos_ids().iter().chain(&a.req.stop_ids) {
                        if let Some(x) = work.get_mut(t as usize) {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                &work[..]
            } else {
                row
            };
            let sampled = match device {
                Some(d) => d,
                None => a.sampler.sample(row, &a.req.prompt, &a.generated),
            };
            let token = sampled.token;
            a.generated.push(token);
            if let Some(c) = &mut a.constraint {
                c.advance(token);
            }
            let eog =
                (!a.req.ignore_eos && self.tokenizer.eos_ids().contains(&token)) || a.req.stop_ids.contains(&token);
            let (mut text, stop_string) = if eog {
                (String::new(), false)
            } else {
                let piece = a.detok.push(&self.tokenizer.token_bytes(token));
                // Stop strings, like end-of-generation ids, wait for min_tokens (as vLLM's do).
                if a.generated.len() < a.req.min_tokens {
                    (piece, false)
                } else {
                    a.stops.push(&piece)
                }
            };
            let constraint_done = a.constraint.as_ref().is_some_and(|c| c.is_complete());
            let length = a.generated.len() >= a.req.max_tokens;
            let finish = if eog || stop_string || constraint_done {
                Some(FinishReason::Stop)
            } else if length {
                Some(FinishReason::Length)
            } else {
                None
            };
            if finish.is_some() && !stop_string {
                // Ended, but not by a stop string: release the text held back
                // for a possible one, and a UTF-8 tail.
                text += &a.stops.finish(&a.detok.flush());
            }
            let event = Event::Token { token, text, logprob: sampled.logprob, top_logprobs: sampled.top };
            let _ = a.tx.send(event);
            self.metric(|m| m.generation_tokens += 1);
            match finish {
                Some(reason) => self.finish(s.id, reason, None),
                None => self.scheduler.put_token(s.id, token),
            }
        }
    }

    /// Scores the prompt tokens after the rows of `s`'s chunk; once every
    /// one is, sends them (before the request's first token).
    fn score_prompt(&mut self, s: &ScheduledSeq, rows: &[&[f32]]) {
        let Some(a) = self.active.get_mut(&s.id) else { return };
        let top = a.req.prompt_logprobs.unwrap_or(0);
        // A chunk recomputed after a preemption replaces what it covers.
        a.prompt_scores.truncate(s.start);
        debug_assert_eq!(a.prompt_scores.len(), s.start, "prompt rows scored out of order");
        for (p, &row) in (s.start..).zip(rows) {
            let Some(&next) = a.req.prompt.get(p + 1) else { break };
            a.prompt_scores.push(self.scorer.score(row, next, top));
        }
        if a.prompt_scores.len() + 1 == a.req.prompt.len() {
            let _ = a.tx.send(Event::PromptLogprobs(std::mem::take(&mut a.prompt_scores)));
        }
    }

    /// Ends a request: sends `Done` (if anyone listens) and frees its blocks.
    fn finish(&mut self, id: u64, finish: FinishReason, error: Option<String>) {
        let Some(a) = self.active.remove(&id) else { return };
        if a.queued {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        let summary = Summary {
            finish,
            prompt_tokens: a.req.prompt.len(),
            completion_tokens: a.generated.len(),
            cached_tokens: self.scheduler.cached_tokens(id),
            error,
            stop: a.stops.matched().map(str::to_string),
        };
        self.scheduler.remove(id);
        let _ = a.tx.send(Event::Done(summary));
        self.metric(|m| {
            m.requests_finished += 1;
            m.prompt_tokens += a.req.prompt.len() as u64;
        });
    }

    fn metric(&self, f: impl FnOnce(&mut super::Metrics)) {
        if let Ok(mut m) = self.shared.metrics.lock() {
            f(&mut m);
        }
    }

    fn publish_metrics(&self) {
        let s = &self.scheduler;
        let stats = s.stats();
        self.metric(|m| {
            m.running = s.n_running();
            m.waiting = s.n_waiting();
            m.kv_blocks_total = s.blocks().n_blocks();
            m.kv_blocks_used = s.blocks().n_blocks() - s.blocks().n_free();
            m.prefix_query_tokens = stats.prefix_query_tokens;
            m.prefix_hit_tokens = stats.prefix_hit_tokens;
            m.preemptions = stats.preemptions;
        });
    }
}
