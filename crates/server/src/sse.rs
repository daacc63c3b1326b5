//! Server-sent events for streaming responses: `data: {json}\n\n` per chunk,
//! `data: [DONE]\n\n` at the end; or typed events (the Responses API's,
//! Anthropic's): `event: TYPE` before each chunk, no `[DONE]`.
//!
//! The response body owns the engine streams. When the client disconnects,
//! hyper drops the body, which drops the streams, which cancels the requests;
//! nothing else may hold them (no spawned task outlives the body).

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use ferrite_engine::sampling::TokenScore;
use ferrite_engine::{Event, Summary};
use futures_util::stream::{self, BoxStream, SelectAll};
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::api::response::Usage;
use crate::backend::EventStream;
use crate::errors::ApiError;
use crate::generate::{finish_error, usage, vanished, TokenInfo};

/// How one endpoint writes its chunks.
pub trait Format: Send + 'static {
    /// Chunks before any token (chat: each choice's assistant role).
    fn opening(&mut self, n: usize) -> Vec<Value>;
    /// The chunk for choice `index`'s prompt scores, if the format shows them.
    fn prompt(&mut self, _index: usize, _scores: Vec<TokenScore>) -> Option<Value> {
        None
    }
    /// The chunks for newly final text of choice `index`, with the tokens
    /// since the last chunk (none: the text is held back).
    fn text(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Vec<Value>;
    /// The last chunks of a choice that ended normally (`summary`: how, and its counts).
    fn finish(&mut self, index: usize, summary: &Summary, tokens: Vec<TokenInfo>) -> Vec<Value>;
    /// The `stream_options.include_usage` chunk: no choices, just usage.
    fn usage(&mut self, usage: Usage) -> Value;
    /// A typed stream's events for a choice that failed (none: the
    /// generic `error` event).
    fn failed(&mut self, _index: usize, _error: &ApiError) -> Vec<Value> {
        Vec::new()
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Keep per-token logprobs for the chunks.
    pub logprobs: bool,
    pub include_usage: bool,
    /// `n`: the streams are each prompt's `n` choices in turn (for usage).
    pub per_prompt: usize,
    /// Typed events (the Responses API's, Anthropic's): each chunk's `type`
    /// also as the event's name, errors as `error` events, no `[DONE]`.
    pub typed: bool,
}

pub fn data(v: &impl Serialize) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    // Serializing our own types cannot fail; an empty object is the fallback.
    if serde_json::to_writer(&mut out, v).is_err() {
        out.extend_from_slice(b"{}");
    }
    out.extend_from_slice(b"\n\n");
    out
}

const DONE: &[u8] = b"data: [DONE]\n\n";

/// The streaming response for `streams` (choice i is `streams[i]`).
pub fn response<F: Format>(streams: Vec<EventStream>, format: F, opts: Options) -> Response {
    let n = streams.len();
    let events: SelectAll<BoxStream<'static, (usize, Event)>> =
        stream::select_all(streams.into_iter().enumerate().map(|(i, s)| s.map(move |ev| (i, ev)).boxed()));
    let driver =
        Driver { events, format, opts, pending: vec![Vec::new(); n], summaries: vec![None; n], phase: Phase::Open };
    let body =
        stream::unfold(driver, |mut d| async move { d.step().await.map(|b| (Ok::<_, Infallible>(Bytes::from(b)), d)) });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

enum Phase {
    Open,
    Events,
    Tail,
    End,
}

struct Driver<F> {
    events: SelectAll<BoxStream<'static, (usize, Event)>>,
    format: F,
    opts: Options,
    /// Per choice: tokens whose text is still held (their logprobs go with the next text).
    pending: Vec<Vec<TokenInfo>>,
    summaries: Vec<Option<Summary>>,
    phase: Phase,
}

impl<F: Format> Driver<F> {
    /// The next bytes of the body; `None` ends it.
    async fn step(&mut self) -> Option<Vec<u8>> {
        loop {
            match self.phase {
                Phase::Open => {
                    self.phase = Phase::Events;
                    let chunks = self.format.opening(self.pending.len());
                    if !chunks.is_empty() {
                        return Some(self.all(chunks));
                    }
                }
                Phase::Events => match self.events.next().await {
                    Some((i, ev)) => {
                        if let Some(out) = self.event(i, ev) {
                            return Some(out);
                        }
                    }
                    None => self.phase = Phase::Tail,
                },
                Phase::Tail => {
                    self.phase = Phase::End;
                    return Some(self.tail());
                }
                Phase::End => return None,
            }
        }
    }

    /// With `include_usage`, every chunk before the last has `"usage": null`,
    /// as OpenAI's do.
    fn usage_field(&self, mut chunk: Value) -> Value {
        if let (true, Some(o)) = (self.opts.include_usage, chunk.as_object_mut()) {
            o.entry("usage").or_insert(Value::Null);
        }
        chunk
    }

    fn all(&self, chunks: Vec<Value>) -> Vec<u8> {
        chunks.into_iter().flat_map(|c| self.chunk(c)).collect()
    }

    fn chunk(&self, c: Value) -> Vec<u8> {
        if !self.opts.typed {
            return data(&self.usage_field(c));
        }
        let mut out = match c.get("type").and_then(Value::as_str) {
            Some(kind) => format!("event: {kind}\n").into_bytes(),
            None => Vec::new(),
        };
        out.extend(data(&c));
        out
    }

    /// A failed choice's error: the error body, or in a typed stream the
    /// format's events (by default an `error` event carrying the body, and
    /// its message where clients look).
    fn error(&mut self, i: usize, e: &ApiError) -> Vec<u8> {
        let body = e.body();
        if !self.opts.typed {
            return data(&body);
        }
        let events = self.format.failed(i, e);
        if !events.is_empty() {
            return self.all(events);
        }
        let message = body["error"]["message"].clone();
        self.chunk(serde_json::json!({"type": "error", "error": body["error"], "message": message}))
    }

    fn event(&mut self, i: usize, ev: Event) -> Option<Vec<u8>> {
        match ev {
            Event::PromptLogprobs(scores) => {
                let chunk = self.format.prompt(i, scores)?;
                Some(data(&self.usage_field(chunk)))
            }
            Event::Token { token, text, logprob, top_logprobs } => {
                if self.opts.logprobs {
                    self.pending[i].push(TokenInfo { token, logprob, top: top_logprobs });
                }
                if text.is_empty() {
                    return None;
                }
                let tokens = std::mem::take(&mut self.pending[i]);
                let chunks = self.format.text(i, text, tokens);
                (!chunks.is_empty()).then(|| self.all(chunks))
            }
            Event::Done(s) => {
                let out = match finish_error(&s) {
                    Some(e) => self.error(i, &e),
                    None => {
                        let tokens = std::mem::take(&mut self.pending[i]);
                        let chunks = self.format.finish(i, &s, tokens);
                        self.all(chunks)
                    }
                };
                self.summaries[i] = Some(s);
                Some(out)
            }
        }
    }

    /// Errors for choices that never finished, the usage chunk, `[DONE]`.
    fn tail(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..self.summaries.len() {
            if self.summaries[i].is_some() {
                continue;
            }
            let lost = vanished(0);
            if let Some(e) = finish_error(&lost) {
                out.extend(self.error(i, &e));
            }
            self.summaries[i] = Some(lost);
        }
        if self.opts.include_usage {
            let u = usage(self.summaries.iter().flatten(), self.opts.per_prompt);
            out.extend(data(&self.format.usage(u)));
        }
        if !self.opts.typed {
            out.extend_from_slice(DONE);
        }
        out
    }
}
