//! The slice of the engine the server uses, as a trait so the HTTP layer can be
//! tested with a scripted fake (no model needed).

use std::pin::Pin;

use ferrite_core::Result;
use ferrite_engine::{Engine, Event, Metrics, Request};
use ferrite_loader::tokenizer::Tokenizer;
use futures_util::Stream;

/// One request's events. It owns the engine's `RequestStream`: dropping it
/// (e.g. when the client disconnects and axum drops the body) cancels the request.
pub type EventStream = Pin<Box<dyn Stream<Item = Event> + Send>>;

pub trait Backend: Send + Sync + 'static {
    fn submit(&self, req: Request) -> Result<EventStream>;
    fn metrics(&self) -> Metrics;
    fn tokenizer(&self) -> &Tokenizer;
    fn max_context(&self) -> usize;
    fn vocab_size(&self) -> usize;
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
    fn shutdown(&self) {
        Engine::shutdown(self)
    }
}
