//! The slices of the engines the server uses, as traits so the HTTP layer can
//! be tested with scripted fakes (no model needed): `Backend` for a text
//! generator, `EmbedBackend` for an embedding model.

use std::pin::Pin;

use ferrite_core::Result;
use ferrite_engine::embed::{EmbedEngine, EmbedMetrics, EmbedReply, Pooling};
use ferrite_engine::{Engine, Event, Metrics, Request};
use ferrite_loader::tokenizer::Tokenizer;
use futures_util::Stream;
use tokio::sync::oneshot;

/// One request's events. It owns the engine's `RequestStream`: dropping it
/// (e.g. when the client disconnects and axum drops the body) cancels the request.
pub type EventStream = Pin<Box<dyn Stream<Item = Event> + Send>>;

pub trait Backend: Send + Sync + 'static {
    fn submit(&self, req: Request) -> Result<EventStream>;
    fn metrics(&self) -> Metrics;
    fn tokenizer(&self) -> &Tokenizer;
    fn max_context(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// Most requests the queue holds (`--max-waiting`): a request of more
    /// choices than that could never be admitted.
    fn max_waiting(&self) -> usize {
        usize::MAX
    }
    /// Cancels every request and stops the engine; blocks until it has.
    fn shutdown(&self);
}

impl Backend for Engine {
    fn submit(&self, req: Request) -> Result<EventStream> {
        let stream = Engine::submit(self, req)?;
        // End right after `Done` (dropping the handle then) rather than waiting for the channel to close.
        Ok(Box::pin(futures_util::stream::unfold(Some(stream), |s| async move {
            let mut s = s?;
            let ev = s.next().await?;
            let rest = if matches!(ev, Event::Done(_)) { None } else { Some(s) };
            Some((ev, rest))
        })))
    }
    fn metrics(&self) -> Metrics {
        Engine::metrics(self)
    }
    fn tokenizer(&self) -> &Tokenizer {
        Engine::tokenizer(self)
    }
    fn max_context(&self) -> usize {
        Engine::max_context(self)
    }
    fn vocab_size(&self) -> usize {
        Engine::vocab_size(self)
    }
    fn max_waiting(&self) -> usize {
        Engine::max_waiting(self)
    }
    fn shutdown(&self) {
        Engine::shutdown(self)
    }
}

/// A request's vectors arrive here; dropping it (the client went away) makes
/// the embedding worker skip the request.
pub type EmbedReceiver = oneshot::Receiver<EmbedReply>;

/// The slice of the embedding engine the server uses.
pub trait EmbedBackend: Send + Sync + 'static {
    /// One input's token ids, special tokens included; longer than
    /// `max_length`: cut with `truncate`, else `Error::InvalidInput`.
    fn tokenize(&self, text: &str, truncate: bool) -> Result<Vec<u32>>;
    /// Queues tokenized inputs (each 1..=max_length tokens); `dims` keeps the
    /// leading values (renormalized when normalizing); `normalize` overrides
    /// the checkpoint's choice (`None` keeps it).
    fn submit(&self, inputs: Vec<Vec<u32>>, normalize: Option<bool>, dims: Option<usize>) -> Result<EmbedReceiver>;
    fn metrics(&self) -> EmbedMetrics;
    fn tokenizer(&self) -> &Tokenizer;
    /// Length of the vectors.
    fn dim(&self) -> usize;
    /// Longest input in tokens, special tokens included.
    fn max_length(&self) -> usize;
    /// Token ids the model's embedding table holds.
    fn vocab_size(&self) -> usize;
    /// How it was loaded and is run, for `GET /info`.
    fn info(&self) -> EmbedInfo;
    /// Stops taking requests, finishes the queued ones; blocks until it has.
    fn shutdown(&self);
}

/// An embedding model's settings as text-embeddings-inference's `/info`
/// reports them.
#[derive(Clone, Debug)]
pub struct EmbedInfo {
    /// TEI's name of the pooling: "cls", "mean", "last_token" or "max".
    pub pooling: &'static str,
    /// The matmuls' arithmetic: "bfloat16" or "float32".
    pub dtype: &'static str,
    /// Most tokens in one forward pass.
    pub max_batch_tokens: usize,
    /// Most requests waiting at once.
    pub max_waiting: usize,
}

impl EmbedBackend for EmbedEngine {
    fn tokenize(&self, text: &str, truncate: bool) -> Result<Vec<u32>> {
        self.embedder().tokenize(text, truncate)
    }
    fn submit(&self, inputs: Vec<Vec<u32>>, normalize: Option<bool>, dims: Option<usize>) -> Result<EmbedReceiver> {
        EmbedEngine::submit(self, inputs, normalize, dims)
    }
    fn metrics(&self) -> EmbedMetrics {
        EmbedEngine::metrics(self)
    }
    fn tokenizer(&self) -> &Tokenizer {
        self.embedder().tokenizer()
    }
    fn dim(&self) -> usize {
        self.embedder().dim()
    }
    fn max_length(&self) -> usize {
        self.embedder().max_length
    }
    fn vocab_size(&self) -> usize {
        self.embedder().model().config().vocab_size
    }
    fn info(&self) -> EmbedInfo {
        let e = self.embedder();
        let pooling = match e.pooling {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::LastToken => "last_token",
            Pooling::Max => "max",
        };
        let dtype = if e.bf16 { "bfloat16" } else { "float32" };
        let c = self.config();
        EmbedInfo { pooling, dtype, max_batch_tokens: c.max_batch_tokens, max_waiting: c.max_waiting }
    }
    fn shutdown(&self) {
        EmbedEngine::shutdown(self)
    }
}
