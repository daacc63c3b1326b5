//! `POST /v1/chat/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use crate::api::request::ChatRequest;
use crate::api::response::{AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChunkChoice, Delta, Meta, Usage};
use crate::convert::{self, Limits};
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::generate::{self, TokenInfo};
use crate::state::AppState;
use crate::{logprobs, prompt, sse};
use ferrite_loader::chat_template::Message;

pub async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.common.model.as_deref())?;
    if req.tools.as_ref().and_then(Value::as_array).is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::param("tools", "tool calling is not supported"));
    }
    let backend = state.generator()?;
    let limits = Limits {
        max_context: backend.max_context(),
        vocab_size: backend.vocab_size(),
        tokenizer: Some(backend.tokenizer()),
    };
    let top_logprobs = convert::chat_logprobs(req.logprobs, req.top_logprobs)?;
    let settings = convert::settings(&req.common, top_logprobs, limits, false)?;
    let messages = convert::messages(&req.messages)?;
    let template = prompt::require_template(state.template.as_ref())?;
    let ending = prompt::Ending::from_request(req.add_generation_prompt, req.continue_final_message)?;
    let ids = prompt::chat_ids(backend.tokenizer(), template, &messages, ending)?;
    let role = reply_role(&messages, req.add_generation_prompt);
    let echo = messages.last().filter(|m| req.echo == Some(true) && m.role == role).map(|m| m.content.clone());
    let streams = generate::submit_all(&state, settings.requests(ids, limits.max_context))?;
    let meta = Meta::new("chatcmpl", &state.model);
    let want_logprobs = top_logprobs.is_some();
    if settings.stream {
        let opts =
            sse::Options { logprobs: want_logprobs, include_usage: settings.include_usage, per_prompt: settings.n };
        let format = ChatFormat { meta, state: state.clone(), logprobs: want_logprobs, role, echo };
        return Ok(sse::response(streams, format, opts));
    }
    let outputs = generate::collect_all(streams, want_logprobs).await?;
    let tok = backend.tokenizer();
    let choices = outputs
        .iter()
        .enumerate()
        .map(|(index, o)| ChatChoice {
            index,
            message: AssistantMessage { role, content: echo.clone().unwrap_or_default() + &o.text },
            logprobs: want_logprobs.then(|| logprobs::chat(tok, &o.tokens)),
            finish_reason: o.summary.finish.as_str(),
        })
        .collect();
    let usage = generate::usage(outputs.iter().map(|o| &o.summary), settings.n);
    let prompt_logprobs = settings.prompt_logprobs.map(|k| logprobs::ranked_prompt(tok, &outputs[0].prompt, k));
    let body = ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage,
        prompt_logprobs,
    };
    Ok(Json(body).into_response())
}

/// The reply's role, as vLLM names it: the assistant's, or with
/// `add_generation_prompt: false` the final message's, whose turn goes on.
fn reply_role(messages: &[Message], add_generation_prompt: Option<bool>) -> &'static str {
    let last = messages.last().filter(|_| add_generation_prompt == Some(false));
    last.and_then(|m| convert::ROLES.into_iter().find(|r| *r == m.role)).unwrap_or("assistant")
}

/// `chat.completion.chunk`s: a role delta first (then the echoed final
/// message, if any), then content deltas.
struct ChatFormat {
    meta: Meta,
    state: AppState,
    logprobs: bool,
    role: &'static str,
    echo: Option<String>,
}

impl ChatFormat {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> Value {
        let m = &self.meta;
        let c = ChatChunk {
            id: m.id.clone(),
            object: "chat.completion.chunk",
            created: m.created,
            model: m.model.clone(),
            choices,
            usage,
        };
        serde_json::to_value(c).unwrap_or_default()
    }

    fn choice(&self, index: usize, delta: Delta, tokens: &[TokenInfo], finish: Option<&'static str>) -> Value {
        // The finish chunk usually has no tokens left: null, as OpenAI sends.
        let logprobs = (self.logprobs && !tokens.is_empty()).then(|| logprobs::chat(self.state.tokenizer(), tokens));
        self.chunk(vec![ChunkChoice { index, delta, logprobs, finish_reason: finish }], None)
    }
}

impl sse::Format for ChatFormat {
    fn opening(&mut self, n: usize) -> Vec<Value> {
        let echo = self.echo.take().filter(|e| !e.is_empty());
        let mut chunks = Vec::new();
        for index in 0..n {
            let delta = Delta { role: Some(self.role), content: Some(String::new()) };
            chunks.push(self.chunk(vec![ChunkChoice { index, delta, logprobs: None, finish_reason: None }], None));
            if let Some(text) = &echo {
                let delta = Delta { role: None, content: Some(text.clone()) };
                chunks.push(self.chunk(vec![ChunkChoice { index, delta, logprobs: None, finish_reason: None }], None));
            }
        }
        chunks
    }
    fn text(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Value {
        self.choice(index, Delta { role: None, content: Some(text) }, &tokens, None)
    }
    fn finish(&mut self, index: usize, reason: &'static str, tokens: Vec<TokenInfo>) -> Value {
        self.choice(index, Delta::default(), &tokens, Some(reason))
    }
    fn usage(&mut self, usage: Usage) -> Value {
        self.chunk(Vec::new(), Some(usage))
    }
}
