//! The embedding engine for serving: one thread owns the encoder and runs the
//! inputs of all waiting requests together, up to a token budget per forward
//! pass. Inputs are taken from the waiting requests in turn, so a small
//! request is not stuck behind a huge one, and a request is answered as soon
//! as its last input is done. A request whose receiver is dropped (client
//! gone) is skipped; on shutdown, requests not finished get an error.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use ferrite_core::{Error, Result};
use tokio::sync::oneshot;

use super::{l2_normalize, Embedder};
use crate::runner::check_token_ids;

/// Most inputs in one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

#[derive(Clone, Debug)]
pub struct EmbedEngineConfig {
    /// Most tokens in one forward pass (an input longer than this runs alone).
    pub max_batch_tokens: usize,
    /// Most requests waiting; beyond it `submit` fails with `Error::Busy`.
    pub max_waiting: usize,
}

impl Default for EmbedEngineConfig {
    fn default() -> Self {
        EmbedEngineConfig { max_batch_tokens: 16384, max_waiting: 1024 }
    }
}

/// A request's vectors, in input order.
pub type EmbedReply = Result<Vec<Vec<f32>>>;

/// Counters for /metrics.
#[derive(Clone, Debug, Default)]
pub struct EmbedMetrics {
    pub requests: u64,
    pub inputs: u64,
    pub tokens: u64,
    pub batches: u64,
    pub waiting: usize,
}

struct Job {
    inputs: Vec<Vec<u32>>,
    normalize: bool,
    /// Keep the first `dims` values (then normalize again if normalizing).
    dims: Option<usize>,
    reply: oneshot::Sender<EmbedReply>,
    /// Vectors done so far, by input.
    out: Vec<Option<Vec<f32>>>,
    /// Next input to schedule, and how many are done.
    next: usize,
    done: usize,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    inputs: AtomicU64,
    tokens: AtomicU64,
    batches: AtomicU64,
    waiting: AtomicUsize,
}

pub struct EmbedEngine {
    embedder: Arc<Embedder>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    config: EmbedEngineConfig,
}

impl EmbedEngine {
    pub fn start(embedder: Embedder, config: EmbedEngineConfig) -> EmbedEngine {
        let embedder = Arc::new(embedder);
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            embedder: embedder.clone(),
            counters: counters.clone(),
            stop: stop.clone(),
            budget: config.max_batch_tokens.max(1),
        };
        let thread = std::thread::Builder::new()
            .name("ferrite-embed".into())
            .spawn(move || worker.run(rx))
            .expect("spawning the embedding thread");
        EmbedEngine { embedder, tx: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)), counters, stop, config }
    }

    pub fn embedder(&self) -> &Embedder {
        &self.embedder
    }

    pub fn config(&self) -> &EmbedEngineConfig {
        &self.config
    }

    /// Queues tokenized inputs; the receiver gets their vectors. `dims`
    /// (at most the model's dimension) keeps the leading values only;
    /// `normalize` overrides the checkpoint's choice (`None` keeps it).
    pub fn submit(
        &self,
        inputs: Vec<Vec<u32>>,
        normalize: Option<bool>,
        dims: Option<usize>,
    ) -> Result<oneshot::Receiver<EmbedReply>> {
        self.validate(&inputs, dims)?;
        let (reply, rx) = oneshot::channel();
        if inputs.is_empty() {
            let _ = reply.send(Ok(Vec::new()));
            return Ok(rx);
        }
        let max = self.config.max_waiting;
        let waiting = &self.counters.waiting;
        if waiting.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| (w < max).then_some(w + 1)).is_err() {
            return Err(Error::Busy(format!("{max} embedding requests are waiting")));
        }
        let n = inputs.len();
        let job = Job {
            normalize: normalize.unwrap_or(self.embedder.normalize),
            dims,
            reply,
            out: vec![None; n],
            next: 0,
            done: 0,
            inputs,
        };
        let sent = self.tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|tx| tx.send(job).is_ok());
        if !sent {
            waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::Busy("the server is shutting down".into()));
        }
        Ok(rx)
    }

    fn validate(&self, inputs: &[Vec<u32>], dims: Option<usize>) -> Result<()> {
        let e = &self.embedder;
        let (dim, vocab) = (e.dim(), e.model().config().vocab_size);
        if let Some(d) = dims.filter(|&d| d == 0 || d > dim) {
            return Err(Error::InvalidInput(format!("dimensions must be between 1 and {dim}, not {d}")));
        }
        if inputs.len() > MAX_INPUTS {
            return Err(Error::InvalidInput(format!("{} inputs; at most {MAX_INPUTS} per request", inputs.len())));
        }
        for (i, ids) in inputs.iter().enumerate() {
            if ids.is_empty() || ids.len() > e.max_length {
                return Err(Error::InvalidInput(format!(
                    "input {i} has {} tokens; every input needs 1 to {}",
                    ids.len(),
                    e.max_length
                )));
            }
            check_token_ids(ids, vocab).map_err(|e| Error::InvalidInput(format!("input {i}: {e}")))?;
        }
        Ok(())
    }

    pub fn metrics(&self) -> EmbedMetrics {
        let c = &self.counters;
        EmbedMetrics {
            requests: c.requests.load(Ordering::Relaxed),
            inputs: c.inputs.load(Ordering::Relaxed),
            tokens: c.tokens.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
        }
    }

    /// Stops taking requests, fails the ones not finished after the current
    /// forward pass, and joins the thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for EmbedEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Worker {
    embedder: Arc<Embedder>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    budget: usize,
}

impl Worker {
    fn run(self, rx: mpsc::Receiver<Job>) {
        let mut queue: VecDeque<Job> = VecDeque::new();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                queue.extend(rx.try_iter());
                for job in queue.drain(..) {
                    self.finish(job, Err(Error::Busy("the server is shutting down".into())));
                }
                return;
            }
            if queue.is_empty() {
                match rx.recv() {
                    Ok(job) => queue.push_back(job),
                    Err(_) => return,
                }
            }
            queue.extend(rx.try_iter());
            self.step(&mut queue);
        }
    }

    /// Picks inputs from the waiting requests in turn, one per request per
    /// round, until the token budget is reached (at least one input).
    fn pick(&self, queue: &mut VecDeque<Job>) -> Vec<(usize, usize)> {
        let mut picked = Vec::new();
        let mut tokens = 0;
        loop {
            let mut progress = false;
            for (j, job) in queue.iter_mut().enumerate() {
                if job.next == job.inputs.len() {
                    continue;
                }
                let len = job.inputs[job.next].len();
                if !picked.is_empty() && tokens + len > self.budget {
                    return picked;
                }
                picked.push((j, job.next));
                job.next += 1;
                tokens += len;
                progress = true;
            }
            if !progress {
                return picked;
            }
        }
    }

    /// One forward pass; requests whose inputs are all done get their reply.
    fn step(&self, queue: &mut VecDeque<Job>) {
        // Requests whose client went away are dropped before they cost anything.
        queue.retain(|j| {
            let keep = !j.reply.is_closed();
            if !keep {
                self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            keep
        });
        let picked = self.pick(queue);
        if picked.is_empty() {
            return;
        }
        let inputs: Vec<&[u32]> = picked.iter().map(|&(j, i)| queue[j].inputs[i].as_slice()).collect();
        let tokens: usize = inputs.iter().map(|i| i.len()).sum();
        // A panic in a kernel must not take the service down with it.
        let result = catch_unwind(AssertUnwindSafe(|| self.embedder.pooled(&inputs)))
            .unwrap_or_else(|_| Err(Error::InvalidInput("the embedding forward pass failed".into())));
        match result {
            Ok(vectors) => {
                self.counters.batches.fetch_add(1, Ordering::Relaxed);
                self.counters.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
                self.counters.inputs.fetch_add(picked.len() as u64, Ordering::Relaxed);
                for (&(j, i), v) in picked.iter().zip(vectors) {
                    queue[j].out[i] = Some(v);
                    queue[j].done += 1;
                }
            }
            Err(e) => {
                // Inputs are validated on submit, so this is an internal
                // failure: the requests in this batch get it.
                let mut failed: Vec<usize> = picked.iter().map(|p| p.0).collect();
                failed.sort_unstable();
                failed.dedup();
                for &j in failed.iter().rev() {
                    let job = queue.remove(j).expect("picked jobs are queued");
                    self.finish(job, Err(Error::InvalidInput(format!("embedding failed: {e}"))));
                }
                return;
            }
        }
        let mut j = 0;
        while j < queue.len() {
            if queue[j].done < queue[j].inputs.len() {
                j += 1;
                continue;
            }
            let mut job = queue.remove(j).expect("index checked");
            let vectors: Vec<Vec<f32>> = std::mem::take(&mut job.out)
                .into_iter()
                .map(|v| {
                    let mut v = v.expect("every input is done");
                    if let Some(d) = job.dims {
                        v.truncate(d);
                    }
                    if job.normalize {
                        l2_normalize(&mut v);
                    }
                    v
                })
                .collect();
            self.finish(job, Ok(vectors));
        }
    }

    fn finish(&self, job: Job, reply: EmbedReply) {
        self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let _ = job.reply.send(reply);
    }
}
