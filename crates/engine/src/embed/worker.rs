//! The embedding engine for serving: one thread owns the encoder and runs the
//! inputs of all waiting requests together, up to a token budget per forward
//! pass, so concurrent small requests share batches and a huge one is split.
//! A request whose receiver is dropped (client gone) is skipped.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use ferrite_core::{Error, Result};
use tokio::sync::oneshot;

use super::{l2_normalize, Embedder};

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
    /// Vectors done so far.
    out: Vec<Vec<f32>>,
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
    config: EmbedEngineConfig,
}

impl EmbedEngine {
    pub fn start(embedder: Embedder, config: EmbedEngineConfig) -> EmbedEngine {
        let embedder = Arc::new(embedder);
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel();
        let worker = Worker { embedder: embedder.clone(), counters: counters.clone(), budget: config.max_batch_tokens };
        let thread = std::thread::Builder::new()
            .name("ferrite-embed".into())
            .spawn(move || worker.run(rx))
            .expect("spawning the embedding thread");
        EmbedEngine { embedder, tx: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)), counters, config }
    }

    pub fn embedder(&self) -> &Embedder {
        &self.embedder
    }

    /// Queues tokenized inputs; the receiver gets their vectors. `dims`
    /// (at most the model's dimension) keeps the leading values only.
    pub fn submit(
        &self,
        inputs: Vec<Vec<u32>>,
        normalize: bool,
        dims: Option<usize>,
    ) -> Result<oneshot::Receiver<EmbedReply>> {
        let dim = self.embedder.dim();
        if let Some(d) = dims.filter(|&d| d == 0 || d > dim) {
            return Err(Error::InvalidInput(format!("dimensions must be between 1 and {dim}, not {d}")));
        }
        if inputs.iter().any(|i| i.is_empty() || i.len() > self.embedder.max_length) {
            return Err(Error::InvalidInput(format!("every input needs 1 to {} tokens", self.embedder.max_length)));
        }
        if self.counters.waiting.load(Ordering::Relaxed) >= self.config.max_waiting {
            return Err(Error::Busy(format!("{} embedding requests are waiting", self.config.max_waiting)));
        }
        let (reply, rx) = oneshot::channel();
        let job = Job { normalize: normalize || self.embedder.normalize, dims, reply, out: Vec::new(), inputs };
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let tx = guard.as_ref().ok_or_else(|| Error::Busy("the server is shutting down".into()))?;
        self.counters.waiting.fetch_add(1, Ordering::Relaxed);
        tx.send(job).map_err(|_| Error::Busy("the server is shutting down".into()))?;
        Ok(rx)
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

    /// Stops taking requests, finishes the queued ones and joins the thread.
    pub fn shutdown(&self) {
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
    budget: usize,
}

impl Worker {
    fn run(self, rx: mpsc::Receiver<Job>) {
        let mut queue: VecDeque<Job> = VecDeque::new();
        loop {
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

    /// One forward pass over the inputs at the front of the queue, within the
    /// token budget (at least one input); finished requests get their reply.
    fn step(&self, queue: &mut VecDeque<Job>) {
        // Requests whose client went away are dropped before they cost anything.
        queue.retain(|j| {
            let keep = !j.reply.is_closed();
            if !keep {
                self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            keep
        });
        let mut picked: Vec<(usize, usize)> = Vec::new(); // (job, input)
        let mut tokens = 0;
        'fill: for (j, job) in queue.iter().enumerate() {
            for i in job.out.len()..job.inputs.len() {
                let len = job.inputs[i].len();
                if !picked.is_empty() && tokens + len > self.budget {
                    break 'fill;
                }
                picked.push((j, i));
                tokens += len;
            }
        }
        if picked.is_empty() {
            return;
        }
        let inputs: Vec<&[u32]> = picked.iter().map(|&(j, i)| queue[j].inputs[i].as_slice()).collect();
        let result = self.embedder.pooled(&inputs);
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        self.counters.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        self.counters.inputs.fetch_add(picked.len() as u64, Ordering::Relaxed);
        let vectors = match result {
            Ok(v) => v,
            Err(e) => {
                // Fail every request that had inputs in this batch.
                let mut failed: Vec<usize> = picked.iter().map(|p| p.0).collect();
                failed.dedup();
                for j in failed.into_iter().rev() {
                    let job = queue.remove(j).expect("picked jobs are queued");
                    self.finish(job, Err(Error::InvalidInput(format!("embedding failed: {e}"))));
                }
                return;
            }
        };
        for (&(j, _), v) in picked.iter().zip(vectors) {
            queue[j].out.push(v);
        }
        while queue.front().is_some_and(|j| j.out.len() == j.inputs.len()) {
            let mut job = queue.pop_front().expect("checked above");
            let (normalize, dims) = (job.normalize, job.dims);
            for v in job.out.iter_mut() {
                if let Some(d) = dims {
                    v.truncate(d);
                }
                if normalize {
                    l2_normalize(v);
                }
            }
            let out = std::mem::take(&mut job.out);
            self.finish(job, Ok(out));
        }
    }

    fn finish(&self, job: Job, reply: EmbedReply) {
        self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let _ = job.reply.send(reply);
    }
}
