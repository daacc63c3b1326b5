//! `POST /v1/completions`: the legacy text completion API.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use crate::api::request::CompletionRequest;
use crate::api::response::{Completion, CompletionChoice, Meta, Usage};
use crate::convert::{self, Limits};
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::generate::{self, TokenInfo};
use crate::state::AppState;
use crate::{logprobs, prompt, sse};

pub async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.common.model.as_deref())?;
    unsupported(&req)?;
    let backend = state.generator()?;
    let limits = Limits { max_context: backend.max_context(), vocab_size: backend.vocab_size() };
    let top_logprobs = convert::completion_logprobs(req.logprobs)?;
    let settings = convert::settings(&req.common, top_logprobs, limits)?;
    // Several prompts: each one's `n` choices in turn, as OpenAI numbers them.
    let mut requests = Vec::new();
    for input in convert::prompts(&req.prompt, limits.vocab_size)? {
        let ids = prompt::completion_ids(backend.tokenizer(), input)?;
        requests.extend(settings.requests(ids, limits.max_context));
    }
    let streams = generate::submit_all(&state, requests)?;
    let meta = Meta::new("cmpl", &state.model);
    let want_logprobs = top_logprobs.is_some();
    if settings.stream {
        let opts =
            sse::Options { logprobs: want_logprobs, include_usage: settings.include_usage, per_prompt: settings.n };
        let offsets = vec![0; streams.len()];
        let format = CompletionFormat { meta, state: state.clone(), logprobs: want_logprobs, offsets };
        return Ok(sse::response(streams, format, opts));
    }
    let outputs = generate::collect_all(streams, want_logprobs).await?;
    let tok = backend.tokenizer();
    let choices = outputs
        .iter()
        .enumerate()
        .map(|(index, o)| CompletionChoice {
            index,
            text: o.text.clone(),
            logprobs: want_logprobs.then(|| logprobs::completion(tok, &o.tokens, &mut 0)),
            finish_reason: Some(o.summary.finish.as_str()),
        })
        .collect();
    let usage = Some(generate::usage(outputs.iter().map(|o| &o.summary), settings.n));
    let m = meta;
    let body = Completion { id: m.id, object: "text_completion", created: m.created, model: m.model, choices, usage };
    Ok(Json(body).into_response())
}

/// Options we do not implement get a clear 400 rather than being ignored.
fn unsupported(req: &CompletionRequest) -> Result<(), ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::param("echo", "echo is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param("suffix", "suffix is not supported"));
    }
    let n = req.common.n.unwrap_or(1);
    if req.best_of.is_some_and(|b| b != 1 && b != n) {
        return Err(ApiError::param("best_of", "best_of is not supported (only best_of = n)"));
    }
    Ok(())
}

/// `text_completion` chunks; `offsets` tracks each choice's `text_offset`.
struct CompletionFormat {
    meta: Meta,
    state: AppState,
    logprobs: bool,
    offsets: Vec<usize>,
}

impl CompletionFormat {
    fn chunk(&mut self, index: usize, text: String, tokens: &[TokenInfo], finish: Option<&'static str>) -> Value {
        let tok = self.state.tokenizer();
        let logprobs =
            (self.logprobs && !tokens.is_empty()).then(|| logprobs::completion(tok, tokens, &mut self.offsets[index]));
        let choice = CompletionChoice { index, text, logprobs, finish_reason: finish };
        self.wrap(vec![choice], None)
    }

    fn wrap(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Value {
        let m = &self.meta;
        let c = Completion {
            id: m.id.clone(),
            object: "text_completion",
            created: m.created,
            model: m.model.clone(),
            choices,
            usage,
        };
        serde_json::to_value(c).unwrap_or_default()
    }
}

impl sse::Format for CompletionFormat {
    fn opening(&mut self, _n: usize) -> Vec<Value> {
        Vec::new()
    }
    fn text(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Value {
        self.chunk(index, text, &tokens, None)
    }
    fn finish(&mut self, index: usize, reason: &'static str, tokens: Vec<TokenInfo>) -> Value {
        self.chunk(index, String::new(), &tokens, Some(reason))
    }
    fn usage(&mut self, usage: Usage) -> Value {
        self.wrap(Vec::new(), Some(usage))
    }
}
