//! `POST /v1/responses`: OpenAI's Responses API over the chat pipeline
//! (`crate::responses` converts), whole or streamed as its typed events.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::{FinishReason, Summary};
use serde_json::{json, Value};

use crate::api::request::ChatRequest;
use crate::api::response::Usage;
use crate::convert::random_id;
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::generate::{self, TokenInfo};
use crate::logprobs;
use crate::reply::{Parts, Rules, Streamed};
use crate::responses as api;
use crate::routes::chat::{self, Rendered, Started};
use crate::sse;
use crate::state::AppState;
use std::sync::Arc;

pub async fn create(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response, ApiError> {
    let auto = body.get("truncation").is_some_and(|t| t == "auto");
    let rendered = fitted(&state, api::to_chat(&body)?, auto)?;
    let Started { mut streams, rules, settings, short_ids, want_logprobs, .. } = chat::submit(&state, rendered)?;
    let (id, created) = (random_id("resp_"), crate::state::unix_now());
    if settings.stream {
        let opts = sse::Options { logprobs: want_logprobs, include_usage: false, per_prompt: 1, typed: true };
        let logprobs = want_logprobs.then(|| state.clone());
        let format = EventFormat::new(id, created, state.model.clone(), body, rules, short_ids, logprobs);
        return Ok(sse::response(streams, format, opts));
    }
    let Some(stream) = streams.pop() else { return Err(ApiError::invalid("nothing was generated")) };
    let outputs = generate::collect_all(vec![stream], want_logprobs).await?;
    let o = &outputs[0];
    let complete = o.summary.finish != FinishReason::Length;
    let s = &o.summary;
    let usage = api::usage(s.prompt_tokens, s.cached_tokens, s.completion_tokens);
    let lp = json!(logprobs::chat(state.tokenizer(), &o.tokens).content);
    let output = api::items(rules.read(&o.text), complete, short_ids, lp);
    let status = if complete { "completed" } else { "incomplete" };
    Ok(Json(api::response(&id, created, &state.model, &body, status, output, usage)).into_response())
}

/// The chat request's prompt; with `truncation: "auto"`, less the fewest
/// oldest turns that make it fit (found by halving, so a long conversation
/// is rendered a few times, not once per turn dropped: a prompt is taken
/// to grow no longer as turns go), or less all but the last where none
/// does (its error then says why).
fn fitted(state: &AppState, chat_body: Value, auto: bool) -> Result<Rendered, ApiError> {
    let render = |body: &Value| {
        let req: ChatRequest =
            serde_json::from_value(body.clone()).map_err(|e| ApiError::invalid(format!("invalid request: {e}")))?;
        chat::render(state, &req)
    };
    let whole = render(&chat_body)?;
    if !auto || whole.fits() {
        return Ok(whole);
    }
    // The request less its k oldest turns, and the most that can go.
    let less = |k: usize| {
        let mut body = chat_body.clone();
        for _ in 0..k {
            api::drop_oldest(&mut body);
        }
        body
    };
    let mut most = 0;
    let mut probe = chat_body.clone();
    while api::drop_oldest(&mut probe) {
        most += 1;
    }
    if most == 0 {
        return Ok(whole);
    }
    // The fewest turns dropped that fit lie in lo..=hi.
    let (mut lo, mut hi, mut at_hi) = (1, most, None);
    while lo < hi {
        let mid = (lo + hi) / 2;
        let r = render(&less(mid))?;
        if r.fits() {
            (hi, at_hi) = (mid, Some(r));
        } else {
            lo = mid + 1;
        }
    }
    match at_hi {
        Some(r) => Ok(r),
        None => render(&less(hi)),
    }
}

/// An output item being streamed: its id and place in `output`, its text
/// and (a message's) logprobs.
struct Open {
    id: String,
    index: usize,
    text: String,
    logprobs: Vec<Value>,
}

/// The Responses API's stream: `response.created`, then each output item
/// added, its text's deltas, done; calls whole at the end; then
/// `response.completed` with the whole response. Every event numbered.
struct EventFormat {
    id: String,
    created: u64,
    model: String,
    request: Value,
    rules: Arc<Rules>,
    streamed: Streamed,
    short_ids: bool,
    seq: u64,
    /// The items done so far.
    output: Vec<Value>,
    reasoning: Option<Open>,
    message: Option<Open>,
    /// With logprobs: the server (its tokenizer), and the tokens of text
    /// not shown yet.
    logprobs: Option<AppState>,
    held: Vec<TokenInfo>,
}

impl EventFormat {
    fn new(
        id: String,
        created: u64,
        model: String,
        request: Value,
        rules: Arc<Rules>,
        short_ids: bool,
        logprobs: Option<AppState>,
    ) -> Self {
        let streamed = Streamed::new(&rules);
        let (output, reasoning, message, held) = (Vec::new(), None, None, Vec::new());
        let seq = 0;
        EventFormat {
            id,
            created,
            model,
            request,
            rules,
            streamed,
            short_ids,
            seq,
            output,
            reasoning,
            message,
            logprobs,
            held,
        }
    }

    /// The held tokens' logprobs, in the API's shape (none without logprobs).
    fn take_logprobs(&mut self) -> Vec<Value> {
        let held = std::mem::take(&mut self.held);
        let Some(state) = &self.logprobs else { return Vec::new() };
        logprobs::chat(state.tokenizer(), &held).content.iter().map(|t| json!(t)).collect()
    }

    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.seq);
        self.seq += 1;
        fields
    }

    fn response(&self, status: &str, usage: Value) -> Value {
        api::response(&self.id, self.created, &self.model, &self.request, status, self.output.clone(), usage)
    }

    /// Events for newly final reasoning and content (the held tokens'
    /// logprobs go with the next content, reasoning's too: a whole
    /// response's message has every token's).
    fn parts(&mut self, reasoning: &str, content: &str, out: &mut Vec<Value>) {
        if !reasoning.is_empty() {
            if self.reasoning.is_none() {
                let open =
                    Open { id: random_id("rs_"), index: self.output.len(), text: String::new(), logprobs: vec![] };
                let item = api::reasoning_item(&open.id, "", "in_progress");
                out.push(self.event("response.output_item.added", json!({"output_index": open.index, "item": item})));
                let part = json!({"item_id": open.id, "output_index": open.index, "content_index": 0,
                                  "part": {"type": "reasoning_text", "text": ""}});
                out.push(self.event("response.content_part.added", part));
                self.reasoning = Some(open);
            }
            let r = self.reasoning.as_mut().map(|r| (r.id.clone(), r.index)).unwrap_or_default();
            if let Some(open) = &mut self.reasoning {
                open.text += reasoning;
            }
            let delta = json!({"item_id": r.0, "output_index": r.1, "content_index": 0, "delta": reasoning});
            out.push(self.event("response.reasoning_text.delta", delta));
        }
        if content.is_empty() {
            return;
        }
        self.close_reasoning("completed", out);
        if self.message.is_none() {
            let open = Open { id: random_id("msg_"), index: self.output.len(), text: String::new(), logprobs: vec![] };
            let item = api::message_item(&open.id, "", "in_progress", json!([]));
            out.push(self.event("response.output_item.added", json!({"output_index": open.index, "item": item})));
            let part = json!({"item_id": open.id, "output_index": open.index, "content_index": 0,
                              "part": api::text_part("", json!([]))});
            out.push(self.event("response.content_part.added", part));
            self.message = Some(open);
        }
        let logprobs = self.take_logprobs();
        let Some(m) = self.message.as_mut() else { return };
        m.text += content;
        m.logprobs.extend(logprobs.iter().cloned());
        let delta = json!({"item_id": m.id, "output_index": m.index, "content_index": 0, "delta": content,
                           "logprobs": logprobs});
        out.push(self.event("response.output_text.delta", delta));
    }

    fn close_reasoning(&mut self, status: &str, out: &mut Vec<Value>) {
        let Some(r) = self.reasoning.take() else { return };
        let done = json!({"item_id": r.id, "output_index": r.index, "content_index": 0, "text": r.text});
        out.push(self.event("response.reasoning_text.done", done));
        let part = json!({"item_id": r.id, "output_index": r.index, "content_index": 0,
                          "part": {"type": "reasoning_text", "text": r.text}});
        out.push(self.event("response.content_part.done", part));
        let item = api::reasoning_item(&r.id, &r.text, status);
        out.push(self.event("response.output_item.done", json!({"output_index": r.index, "item": item})));
        self.output.push(item);
    }

    fn close_message(&mut self, status: &str, out: &mut Vec<Value>) {
        let Some(m) = self.message.take() else { return };
        let at = json!({"item_id": m.id, "output_index": m.index, "content_index": 0});
        let mut done = at.clone();
        done["text"] = json!(m.text);
        done["logprobs"] = json!(m.logprobs);
        out.push(self.event("response.output_text.done", done));
        let mut part = at;
        part["part"] = api::text_part(&m.text, json!(m.logprobs));
        out.push(self.event("response.content_part.done", part));
        let item = api::message_item(&m.id, &m.text, status, json!(m.logprobs));
        out.push(self.event("response.output_item.done", json!({"output_index": m.index, "item": item})));
        self.output.push(item);
    }
}

impl sse::Format for EventFormat {
    fn opening(&mut self, _n: usize) -> Vec<Value> {
        let response = self.response("in_progress", Value::Null);
        let created = self.event("response.created", json!({"response": response}));
        vec![created, self.event("response.in_progress", json!({"response": response}))]
    }

    fn text(&mut self, _index: usize, text: String, tokens: Vec<TokenInfo>) -> Vec<Value> {
        self.held.extend(tokens);
        let (reasoning, content) = self.streamed.push(&self.rules, &text);
        let mut out = Vec::new();
        self.parts(&reasoning, &content, &mut out);
        out
    }

    fn finish(&mut self, _index: usize, summary: &Summary, tokens: Vec<TokenInfo>) -> Vec<Value> {
        self.held.extend(tokens);
        let Parts { reasoning, content, calls } = self.streamed.finish(&self.rules);
        let mut out = Vec::new();
        self.parts(&reasoning.unwrap_or_default(), &content.unwrap_or_default(), &mut out);
        // Tokens that showed no text (the end token): on the message, as a whole response's.
        let rest = self.take_logprobs();
        if let Some(m) = &mut self.message {
            m.logprobs.extend(rest);
        }
        let complete = summary.finish != FinishReason::Length;
        let status = if complete { "completed" } else { "incomplete" };
        self.close_reasoning(status, &mut out);
        self.close_message(status, &mut out);
        for c in calls {
            let (item_id, call_id, index) =
                (random_id("fc_"), crate::tools::call_id(self.short_ids), self.output.len());
            let item = api::call_item(&item_id, &call_id, &c.name, "", "in_progress");
            out.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
            let delta = json!({"item_id": item_id, "output_index": index, "delta": c.arguments});
            out.push(self.event("response.function_call_arguments.delta", delta));
            let done = json!({"item_id": item_id, "output_index": index, "name": c.name, "arguments": c.arguments});
            out.push(self.event("response.function_call_arguments.done", done));
            let item = api::call_item(&item_id, &call_id, &c.name, &c.arguments, "completed");
            out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
            self.output.push(item);
        }
        let usage = api::usage(summary.prompt_tokens, summary.cached_tokens, summary.completion_tokens);
        let response = self.response(status, usage);
        let kind = if complete { "response.completed" } else { "response.incomplete" };
        out.push(self.event(kind, json!({"response": response})));
        out
    }

    fn usage(&mut self, _usage: Usage) -> Value {
        Value::Null
    }

    /// An `error` event, then `response.failed` with what was made so far
    /// (open items closed as incomplete).
    fn failed(&mut self, _index: usize, error: &ApiError) -> Vec<Value> {
        let body = error.body();
        let (code, message) = (body["error"]["type"].clone(), body["error"]["message"].clone());
        let mut out = Vec::new();
        self.close_reasoning("incomplete", &mut out);
        self.close_message("incomplete", &mut out);
        out.push(self.event("error", json!({"code": code, "message": message, "param": null})));
        let mut response = self.response("failed", Value::Null);
        response["error"] = json!({"code": "server_error", "message": message});
        out.push(self.event("response.failed", json!({"response": response})));
        out
    }
}
