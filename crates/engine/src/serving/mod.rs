//! The serving engine: a background thread that owns the model runner and the
//! scheduler, and many concurrent requests, each a handle with a stream of
//! events. Dropping a `RequestStream` cancels its request and frees its blocks.
//!
//! ```text
//! Engine::submit(Request) -> RequestStream --(Event::Token ... Event::Done)-->
//! ```

mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use ferrite_core::{Error, Result};
use ferrite_loader::tokenizer::Tokenizer;

use crate::constraint::format::OutputFormat;
use crate::runner::{check_token_ids, Runner};
use crate::sampling::{SamplingParams, TokenLogprob, TokenScore};
pub use crate::FinishReason;

/// Limits of the scheduler; typed, built once by the CLI.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most sequences in one batch.
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks + decodes) in one forward pass.
    pub max_batched_tokens: usize,
    /// Most requests waiting for admission; beyond it `submit` fails with `Error::Busy`.
    pub max_waiting: usize,
    /// Share KV blocks between requests with a common prompt prefix.
    pub prefix_caching: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_num_seqs: 64, max_batched_tokens: 256, max_waiting: 4096, prefix_caching: true }
    }
}

/// One generation request, already tokenized.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most new tokens; prompt + max_tokens must fit the context. 0: the
    /// prompt is computed (and scored, with `prompt_logprobs`), nothing drawn.
    pub max_tokens: usize,
    /// Stop strings: generation ends before the first occurrence, which is not emitted.
    pub stop: Vec<String>,
    /// Extra stop token ids besides the tokenizer's end-of-generation ids.
    pub stop_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// End-of-generation and stop ids are masked, and stop strings not looked
    /// for, until this many tokens exist.
    pub min_tokens: usize,
    /// Constrain the output to one JSON object (OpenAI `response_format:
    /// json_object`), a value of a JSON Schema (`json_schema`) or a match
    /// of a pattern (`guided_regex`).
    pub format: Option<OutputFormat>,
    /// Score the prompt: `Event::PromptLogprobs` with this many alternatives
    /// a position (callers bound it: the server takes at most 20). The
    /// prompt is then computed whole (no cached prefix), and the steps that
    /// hold its rows sample on the host, the worker scoring each row (a few
    /// passes over the vocabulary) while the step's other requests wait.
    pub prompt_logprobs: Option<usize>,
}

impl Request {
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Self {
        Request {
            prompt,
            sampling,
            max_tokens,
            stop: Vec::new(),
            stop_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            format: None,
            prompt_logprobs: None,
        }
    }
}

/// What a request's stream yields: with `prompt_logprobs`, one
/// `PromptLogprobs` first (unless it ends before its prompt has run);
/// tokens; then exactly one `Done`.
#[derive(Clone, Debug)]
pub enum Event {
    /// Each prompt token after the first: its score given the tokens
    /// before it (log-probability, rank) and the most likely alternatives.
    PromptLogprobs(Vec<TokenScore>),
    /// One generated token. `text` is the text it made final: empty while a
    /// UTF-8 character or a possible stop string is incomplete, and possibly
    /// several tokens' worth when held text is released.
    Token {
        token: u32,
        text: String,
        logprob: f32,
        top_logprobs: Vec<TokenLogprob>,
    },
    Done(Summary),
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
    /// Set when finish is `FinishReason::Error`.
    pub error: Option<String>,
    /// The stop string that ended the output, where one did.
    pub stop: Option<String>,
}

/// A snapshot of the engine's counters and gauges (for /metrics and tests).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_total: usize,
    /// Blocks held by live sequences (cached-but-free blocks count as free).
    pub kv_blocks_used: usize,
    pub requests_submitted: u64,
    pub requests_finished: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Prompt tokens looked up in / found in the prefix cache.
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub preemptions: u64,
    /// Forward passes run.
    pub steps: u64,
}

/// Receives one request's events. Dropping it cancels the request.
pub struct RequestStream {
    id: u64,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    engine: Arc<Shared>,
}

impl RequestStream {
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The next event; `None` after `Done`.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
    /// Blocking form of `next`, for callers outside an async runtime.
    pub fn next_blocking(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        // Wake the worker so it frees the blocks now, not at its next step.
        let _ = self.engine.send(Command::Cancel(self.id));
    }
}

enum Command {
    Submit { id: u64, req: Box<Request>, tx: tokio::sync::mpsc::UnboundedSender<Event> },
    Cancel(u64),
    Shutdown,
}

/// State shared by the handle, the streams and the worker thread.
struct Shared {
    commands: Mutex<mpsc::Sender<Command>>,
    next_id: AtomicU64,
    waiting: AtomicUsize,
    stopped: AtomicBool,
    metrics: Mutex<Metrics>,
}

impl Shared {
    fn send(&self, cmd: Command) -> std::result::Result<(), ()> {
        self.commands.lock().map_err(|_| ())?.send(cmd).map_err(|_| ())
    }
}

/// Handle to the serving engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    max_context: usize,
    vocab_size: usize,
    worker: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Engine {
    /// Starts the worker thread that owns `runner`.
    pub fn start(runner: Runner, tokenizer: Arc<Tokenizer>, config: EngineConfig) -> Result<Engine> {
        if config.max_num_seqs == 0 || config.max_batched_tokens == 0 {
            return Err(Error::InvalidInput("max-num-seqs and max-batched-tokens must be positive".into()));
        }
        let max_context = runner.max_context();
        let vocab_size = runner.config().vocab_size;
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            commands: Mutex::new(tx),
            next_id: AtomicU64::new(1),
            waiting: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            metrics: Mutex::new(Metrics::default()),
        });
        let w = worker::Worker::new(runner, tokenizer.clone(), config.clone(), shared.clone())?;
        let handle = std::thread::Builder::new()
            .name("ferrite-engine".into())
            .spawn(move || w.run(rx))
            .map_err(|e| Error::InvalidInput(format!("cannot start the engine thread: {e}")))?;
        Ok(Engine { shared, tokenizer, config, max_context, vocab_size, worker: Arc::new(Mutex::new(Some(handle))) })
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    /// Most tokens (prompt + generated) one request may hold.
    pub fn max_context(&self) -> usize {
        self.max_context
    }
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    pub fn max_waiting(&self) -> usize {
        self.config.max_waiting
    }

    /// Queues a request. Fails with `Error::InvalidInput` for a request that can
    /// never run (empty prompt, prompt + max_tokens over the context, bad
    /// sampling settings) and `Error::Busy` when the queue is full.
    pub fn submit(&self, req: Request) -> Result<RequestStream> {
        self.validate(&req)?;
        if self.shared.stopped.load(Ordering::SeqCst) {
            return Err(Error::Busy("the server is shutting down".into()));
        }
        if self.shared.waiting.load(Ordering::SeqCst) >= self.config.max_waiting {
            return Err(Error::Busy(format!("{} requests are already waiting; retry later", self.config.max_waiting)));
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.shared.waiting.fetch_add(1, Ordering::SeqCst);
        if self.shared.send(Command::Submit { id, req: Box::new(req), tx }).is_err() {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::Busy("the engine has stopped".into()));
        }
        Ok(RequestStream { id, rx, engine: self.shared.clone() })
    }

    fn validate(&self, req: &Request) -> Result<()> {
        if req.prompt.is_empty() {
            return Err(Error::InvalidInput("the prompt is empty".into()));
        }
        check_token_ids(&req.prompt, self.vocab_size)?;
        let total = req.prompt.len().saturating_add(req.max_tokens);
        if total > self.max_context {
            return Err(Error::InvalidInput(format!(
                "this model's context holds {} tokens, but the request needs {} ({} in the prompt + {} to generate); \
                 shorten the prompt or lower max_tokens",
                self.max_context,
                total,
                req.prompt.len(),
                req.max_tokens
            )));
        }
        if req.min_tokens > req.max_tokens {
            return Err(Error::InvalidInput(format!(
                "min_tokens ({}) is more than this request may generate ({}: max_tokens, or the context's room \
                 after the prompt)",
                req.min_tokens, req.max_tokens
            )));
        }
        req.sampling.validate().map_err(Error::InvalidInput)
    }

    pub fn metrics(&self) -> Metrics {
        self.shared.metrics.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Cancels every request (their streams end with `FinishReason::Cancelled`),
    /// stops the worker and waits for it. Idempotent.
    pub fn shutdown(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        let _ = self.shared.send(Command::Shutdown);
        let handle = self.worker.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}
