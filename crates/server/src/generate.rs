//! Running a request's `n` engine requests: submission, timing metrics and
//! collecting whole outputs for non-streaming responses.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use axum::http::StatusCode;
use ferrite_engine::sampling::{TokenLogprob, TokenScore};
use ferrite_engine::{Event, FinishReason, Request, Summary};
use futures_util::{Stream, StreamExt};

use crate::api::response::Usage;
use crate::backend::EventStream;
use crate::errors::ApiError;
use crate::state::AppState;

/// One generated (or scored prompt) token as kept for logprobs.
#[derive(Clone, Debug)]
pub struct TokenInfo {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<TokenLogprob>,
}

/// One choice, generated to the end.
pub struct Output {
    pub text: String,
    pub tokens: Vec<TokenInfo>,
    /// The prompt's scores, when the request asked for them.
    pub prompt: Vec<TokenScore>,
    pub summary: Summary,
}

/// Submits every request, or none: when one fails, the streams already
/// returned are dropped, which cancels them.
pub fn submit_all(state: &AppState, reqs: Vec<Request>) -> Result<Vec<EventStream>, ApiError> {
    let queue = state.generator()?.max_waiting();
    if reqs.len() > queue {
        let msg = format!(
            "{} choices (n for each prompt) are more than this server queues at once (--max-waiting {queue})",
            reqs.len()
        );
        return Err(ApiError::param("n", msg));
    }
    reqs.into_iter()
        .map(|r| {
            let inner = state.generator()?.submit(r)?;
            state.metrics.request_started();
            let timed = Timed { inner, state: state.clone(), start: Instant::now(), last: None, done: false };
            Ok(Box::pin(timed) as EventStream)
        })
        .collect()
}

/// Drains one stream. `keep_tokens` keeps per-token logprobs.
pub async fn collect(mut stream: EventStream, keep_tokens: bool) -> Output {
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut prompt = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Event::PromptLogprobs(scores) => prompt = scores,
            Event::Token { token, text: t, logprob, top_logprobs } => {
                text.push_str(&t);
                if keep_tokens {
                    tokens.push(TokenInfo { token, logprob, top: top_logprobs });
                }
            }
            Event::Done(summary) => return Output { text, tokens, prompt, summary },
        }
    }
    Output { text, tokens, prompt, summary: vanished(0) }
}

/// Drains all streams concurrently, choices in order; the first choice
/// that did not end normally makes the whole response its error
/// (`finish_error`).
pub async fn collect_all(streams: Vec<EventStream>, keep_tokens: bool) -> Result<Vec<Output>, ApiError> {
    let outputs = futures_util::future::join_all(streams.into_iter().map(|s| collect(s, keep_tokens))).await;
    match outputs.iter().find_map(|o| finish_error(&o.summary)) {
        Some(e) => Err(e),
        None => Ok(outputs),
    }
}

/// The summary of a stream that ended without `Done` (the engine went away).
pub fn vanished(prompt_tokens: usize) -> Summary {
    Summary {
        finish: FinishReason::Error,
        prompt_tokens,
        completion_tokens: 0,
        cached_tokens: 0,
        error: Some("the engine stopped before the request finished".into()),
        stop: None,
    }
}

/// Finishes a client must not take for a normal end: engine errors (500)
/// and cancellation by shutdown (503).
pub fn finish_error(s: &Summary) -> Option<ApiError> {
    match s.finish {
        FinishReason::Stop | FinishReason::Length => None,
        FinishReason::Error => Some(ApiError::internal(s.error.clone().unwrap_or_else(|| "generation failed".into()))),
        FinishReason::Cancelled => Some(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the request was cancelled: the server is shutting down",
        )),
    }
}

/// The prompt counts once however many choices; completions add up.
pub fn usage<'a>(summaries: impl IntoIterator<Item = &'a Summary>, per_prompt: usize) -> Usage {
    let mut u = Usage::default();
    let summaries: Vec<&Summary> = summaries.into_iter().collect();
    // Each prompt's `per_prompt` choices in turn: its tokens count once, and
    // its cached ones as the most any of its choices found.
    for choices in summaries.chunks(per_prompt.max(1)) {
        // (The most: a choice lost before it started reports none.)
        u.prompt_tokens += choices.iter().map(|s| s.prompt_tokens).max().unwrap_or(0);
        u.prompt_tokens_details.cached_tokens += choices.iter().map(|s| s.cached_tokens).max().unwrap_or(0);
        u.completion_tokens += choices.iter().map(|s| s.completion_tokens).sum::<usize>();
    }
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    u
}

/// Wraps an engine stream to time its tokens and count how it finished; a
/// stream dropped before `Done` (client gone) counts as cancelled. It ends
/// after `Done` whether or not the engine closes its channel.
struct Timed {
    inner: EventStream,
    state: AppState,
    start: Instant,
    last: Option<Instant>,
    done: bool,
}

impl Stream for Timed {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let ev = ready!(this.inner.as_mut().poll_next(cx));
        let now = Instant::now();
        let m = &this.state.metrics;
        match &ev {
            Some(Event::Token { .. }) => {
                match this.last {
                    None => m.ttft.observe(now - this.start),
                    Some(t) => m.itl.observe(now - t),
                }
                this.last = Some(now);
            }
            Some(Event::Done(s)) => {
                this.done = true;
                m.request_finished(s.finish);
            }
            Some(Event::PromptLogprobs(_)) => {}
            None => {
                this.done = true;
                m.request_finished(FinishReason::Error);
            }
        }
        Poll::Ready(ev)
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        if !self.done {
            self.state.metrics.request_finished(FinishReason::Cancelled);
        }
    }
}
