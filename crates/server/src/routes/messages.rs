//! `POST /v1/messages`: Anthropic's Messages API over the chat pipeline
//! (`crate::anthropic` converts), whole or streamed as its typed events.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::Summary;
use serde_json::{json, Value};

use crate::anthropic as api;
use crate::api::request::ChatRequest;
use crate::api::response::Usage;
use crate::convert::random_id;
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::generate::{self, TokenInfo};
use crate::reply::{Parts, Rules, Streamed};
use crate::routes::chat::{self, Started};
use crate::sse;
use crate::state::AppState;
use std::sync::Arc;

/// Errors in Anthropic's shape.
pub struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let (status, body) = api::error(&self.0);
        (status, Json(body)).into_response()
    }
}

/// The chat request a Messages request stands for: any model name is
/// served (and echoed back), and `max_tokens` is cut to the context's room,
/// as Anthropic's clients ask for far more than local models hold.
fn chat_request(body: &Value) -> Result<ChatRequest, ApiError> {
    let mut req: ChatRequest =
        serde_json::from_value(api::to_chat(body)?).map_err(|e| ApiError::invalid(format!("invalid request: {e}")))?;
    req.fit_max_tokens = true;
    Ok(req)
}

pub async fn create(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, AnthropicError> {
    let req = chat_request(&body)?;
    let Started { mut streams, rules, settings, prompt_tokens, .. } = chat::start(&state, &req)?;
    let id = random_id("msg_");
    let model = body.get("model").and_then(Value::as_str).unwrap_or(&state.model).to_string();
    if settings.stream {
        let opts = sse::Options { logprobs: false, include_usage: false, per_prompt: 1, typed: true };
        let format = EventFormat::new(id, model, rules, prompt_tokens);
        return Ok(sse::response(streams, format, opts));
    }
    let Some(stream) = streams.pop() else { return Err(ApiError::invalid("nothing was generated").into()) };
    let outputs = generate::collect_all(vec![stream], false).await?;
    let (o, s) = (&outputs[0], &outputs[0].summary);
    let parts = rules.read(&o.text);
    let stop = api::stop_reason(s, !parts.calls.is_empty());
    let usage = api::usage(s.prompt_tokens, s.cached_tokens, s.completion_tokens);
    Ok(Json(api::message_object(&id, &model, api::blocks(parts), Some(stop), usage)).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's length, as the request
/// would render it (no `max_tokens` needed).
pub async fn count_tokens(
    State(state): State<AppState>,
    ApiJson(mut body): ApiJson<Value>,
) -> Result<Response, AnthropicError> {
    if let Some(b) = body.as_object_mut() {
        b.entry("max_tokens").or_insert(json!(1));
    }
    let rendered = chat::render(&state, &chat_request(&body)?)?;
    Ok(Json(json!({"input_tokens": rendered.ids.len()})).into_response())
}

/// The block being streamed: its place and kind (`thinking` or `text`).
struct Open {
    index: usize,
    kind: &'static str,
}

/// Anthropic's stream: `message_start`, `ping`, then each content block
/// started, its deltas, stopped; tool uses whole at the end; then
/// `message_delta` (the stop reason, the output's count) and `message_stop`.
struct EventFormat {
    id: String,
    model: String,
    rules: Arc<Rules>,
    streamed: Streamed,
    prompt_tokens: usize,
    /// Blocks started so far.
    blocks: usize,
    open: Option<Open>,
}

impl EventFormat {
    fn new(id: String, model: String, rules: Arc<Rules>, prompt_tokens: usize) -> Self {
        let streamed = Streamed::new(&rules);
        EventFormat { id, model, rules, streamed, prompt_tokens, blocks: 0, open: None }
    }

    /// A delta of a block of `kind`, starting that block (and stopping the one before) where needed.
    fn delta(&mut self, kind: &'static str, text: &str, out: &mut Vec<Value>) {
        if text.is_empty() {
            return;
        }
        if self.open.as_ref().is_none_or(|o| o.kind != kind) {
            self.stop_block(out);
            let block = match kind {
                "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            out.push(json!({"type": "content_block_start", "index": self.blocks, "content_block": block}));
            self.open = Some(Open { index: self.blocks, kind });
            self.blocks += 1;
        }
        let index = self.open.as_ref().map_or(0, |o| o.index);
        let delta = match kind {
            "thinking" => json!({"type": "thinking_delta", "thinking": text}),
            _ => json!({"type": "text_delta", "text": text}),
        };
        out.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }

    fn stop_block(&mut self, out: &mut Vec<Value>) {
        let Some(o) = self.open.take() else { return };
        if o.kind == "thinking" {
            let signature = json!({"type": "signature_delta", "signature": ""});
            out.push(json!({"type": "content_block_delta", "index": o.index, "delta": signature}));
        }
        out.push(json!({"type": "content_block_stop", "index": o.index}));
    }
}

impl sse::Format for EventFormat {
    fn opening(&mut self, _n: usize) -> Vec<Value> {
        let usage = api::usage(self.prompt_tokens, 0, 0);
        let message = api::message_object(&self.id, &self.model, Vec::new(), None, usage);
        vec![json!({"type": "message_start", "message": message}), json!({"type": "ping"})]
    }

    fn text(&mut self, _index: usize, text: String, _tokens: Vec<TokenInfo>) -> Vec<Value> {
        let (reasoning, content) = self.streamed.push(&self.rules, &text);
        let mut out = Vec::new();
        self.delta("thinking", &reasoning, &mut out);
        self.delta("text", &content, &mut out);
        out
    }

    fn finish(&mut self, _index: usize, summary: &Summary, _tokens: Vec<TokenInfo>) -> Vec<Value> {
        let Parts { reasoning, content, calls } = self.streamed.finish(&self.rules);
        let mut out = Vec::new();
        self.delta("thinking", &reasoning.unwrap_or_default(), &mut out);
        self.delta("text", &content.unwrap_or_default(), &mut out);
        self.stop_block(&mut out);
        let (stop, sequence) = api::stop_reason(summary, !calls.is_empty());
        for c in calls {
            let block = json!({"type": "tool_use", "id": random_id("toolu_"), "name": c.name, "input": {}});
            out.push(json!({"type": "content_block_start", "index": self.blocks, "content_block": block}));
            let delta = json!({"type": "input_json_delta", "partial_json": c.arguments});
            out.push(json!({"type": "content_block_delta", "index": self.blocks, "delta": delta}));
            out.push(json!({"type": "content_block_stop", "index": self.blocks}));
            self.blocks += 1;
        }
        let usage = api::usage(summary.prompt_tokens, summary.cached_tokens, summary.completion_tokens);
        out.push(
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": sequence}, "usage": usage}),
        );
        out.push(json!({"type": "message_stop"}));
        out
    }

    fn usage(&mut self, _usage: Usage) -> Value {
        Value::Null
    }

    /// Anthropic's `error` event.
    fn failed(&mut self, _index: usize, error: &ApiError) -> Vec<Value> {
        vec![api::error(error).1]
    }
}
