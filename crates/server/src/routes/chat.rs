//! `POST /v1/chat/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::Summary;
use serde_json::Value;

use crate::api::request::ChatRequest;
use crate::api::response::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChunkChoice, Delta, Meta, ToolCall, Usage,
};
use crate::convert::{self, Limits};
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::generate::{self, TokenInfo};
use crate::reply::{Rules, Streamed};
use crate::state::AppState;
use crate::tools::{self, ToolUse};
use crate::{logprobs, prompt, reasoning, sse};
use ferrite_loader::chat_template::{Extras, Message};
use std::sync::Arc;

pub async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let Started { streams, rules, settings, role, echo, short_ids, want_logprobs, .. } = start(&state, &req)?;
    let meta = Meta::new("chatcmpl", &state.model);
    if settings.stream {
        let opts = sse::Options {
            logprobs: want_logprobs,
            include_usage: settings.include_usage,
            per_prompt: settings.n,
            typed: false,
        };
        let streamed = (0..streams.len()).map(|_| Streamed::new(&rules)).collect();
        let held_tokens = vec![Vec::new(); streams.len()];
        let (logprobs, state) = (want_logprobs, state.clone());
        let format = ChatFormat { meta, state, logprobs, role, echo, rules, streamed, held_tokens, short_ids };
        return Ok(sse::response(streams, format, opts));
    }
    let outputs = generate::collect_all(streams, want_logprobs).await?;
    let tok = state.tokenizer();
    let choices = outputs
        .iter()
        .enumerate()
        .map(|(index, o)| {
            // (The generated text alone is read, as streams read it.)
            let mut reply = rules.read(&o.text);
            if let Some(echo) = &echo {
                reply.content = Some(echo.clone() + reply.content.as_deref().unwrap_or_default());
            }
            let called = !reply.calls.is_empty();
            ChatChoice {
                index,
                message: AssistantMessage {
                    role,
                    content: reply.content,
                    reasoning_content: reply.reasoning,
                    tool_calls: called.then(|| ToolCall::list(reply.calls, false, short_ids)),
                },
                logprobs: want_logprobs.then(|| logprobs::chat(tok, &o.tokens)),
                finish_reason: if called { "tool_calls" } else { o.summary.finish.as_str() },
            }
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

/// A chat request submitted: its choices' streams, and how to read them.
pub struct Started {
    pub streams: Vec<crate::backend::EventStream>,
    pub rules: Arc<Rules>,
    pub settings: convert::Settings,
    pub role: &'static str,
    /// The final message's text, where it leads the reply (`echo`).
    pub echo: Option<String>,
    /// Call ids as Mistral's templates want them (`tools::call_id`).
    pub short_ids: bool,
    pub want_logprobs: bool,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
}

/// Checks and submits a chat request (also the other APIs', converted).
pub fn start(state: &AppState, req: &ChatRequest) -> Result<Started, ApiError> {
    submit(state, render(state, req)?)
}

/// Submits a rendered chat request.
pub fn submit(state: &AppState, rendered: Rendered) -> Result<Started, ApiError> {
    let Rendered { ids, rules, settings, role, echo, short_ids, want_logprobs, max_context } = rendered;
    let prompt_tokens = ids.len();
    let streams = generate::submit_all(state, settings.requests(ids, max_context))?;
    Ok(Started { streams, rules, settings, role, echo, short_ids, want_logprobs, prompt_tokens })
}

/// A chat request checked and its prompt rendered, before submitting.
pub struct Rendered {
    pub ids: Vec<u32>,
    rules: Arc<Rules>,
    settings: convert::Settings,
    role: &'static str,
    echo: Option<String>,
    short_ids: bool,
    want_logprobs: bool,
    max_context: usize,
}

impl Rendered {
    /// Whether the prompt leaves the context room for the reply (its
    /// `max_tokens`, or one token).
    pub fn fits(&self) -> bool {
        self.ids.len() + self.settings.max_tokens.unwrap_or(1) <= self.max_context
    }
}

/// Checks a chat request and renders its prompt.
pub fn render(state: &AppState, req: &ChatRequest) -> Result<Rendered, ApiError> {
    state.check_model(req.common.model.as_deref())?;
    let tools = tools::from_request(req.tools.as_ref(), req.tool_choice.as_ref(), req.parallel_tool_calls)?;
    let backend = state.generator()?;
    let limits = Limits {
        max_context: backend.max_context(),
        vocab_size: backend.vocab_size(),
        tokenizer: Some(backend.tokenizer()),
    };
    let top_logprobs = convert::chat_logprobs(req.logprobs, req.top_logprobs)?;
    let mut settings = convert::settings(&req.common, top_logprobs, limits, false)?;
    if let Some(format) = tools.as_ref().map(ToolUse::format).transpose()?.flatten() {
        if settings.format.is_some() {
            let msg = "a required or named tool_choice constrains the reply itself: drop response_format or the guide";
            return Err(ApiError::param("tool_choice", msg));
        }
        settings.format = Some(format);
    }
    let mut messages = convert::messages(&req.messages)?;
    let template = prompt::require_template(state.template.as_ref())?;
    if let Some(t) = &tools {
        messages = t.prepare(template, state.template_tools.shown, &messages);
    }
    let short_ids = state.template_tools.short_ids;
    let ending = prompt::Ending::from_request(req.add_generation_prompt, req.continue_final_message)?;
    let vars = convert::template_vars(req.chat_template_kwargs.as_ref())?;
    let extras = Extras { tools: tools.as_ref().map(|t| t.tools.as_slice()), vars: vars.as_ref() };
    let mut text = prompt::chat_text(template, &messages, extras, ending)?;
    // A constrained reply is the answer alone: a block the prompt opens is closed.
    let constrained = settings.format.is_some();
    if constrained {
        text = reasoning::closed(text);
    }
    let ids = prompt::chat_tokens(backend.tokenizer(), &text)?;
    let open = match ending {
        prompt::Ending::Continue => messages.last().is_some_and(|m| reasoning::left_open(&m.content)),
        _ => reasoning::opened_by(&text),
    };
    let think = (state.reasoning && !constrained).then_some(open);
    let keep_reasoning = req.include_reasoning != Some(false);
    let rules = Arc::new(Rules { tools: tools.map(Arc::new), think, keep_reasoning });
    let role = reply_role(&messages, req.add_generation_prompt);
    let echo = messages.last().filter(|m| req.echo == Some(true) && m.role == role).map(|m| m.content.clone());
    let (want_logprobs, max_context) = (top_logprobs.is_some(), limits.max_context);
    if req.fit_max_tokens {
        let room = max_context.saturating_sub(ids.len()).max(1);
        settings.max_tokens = settings.max_tokens.map(|m| m.min(room));
    }
    Ok(Rendered { ids, rules, settings, role, echo, short_ids, want_logprobs, max_context })
}

/// The reply's role, as vLLM names it: the assistant's, or with
/// `add_generation_prompt: false` the final message's, whose turn goes on.
fn reply_role(messages: &[Message], add_generation_prompt: Option<bool>) -> &'static str {
    let last = messages.last().filter(|_| add_generation_prompt == Some(false));
    last.and_then(|m| convert::ROLES.into_iter().find(|r| *r == m.role)).unwrap_or("assistant")
}

/// `chat.completion.chunk`s: a role delta first (then the echoed final
/// message, if any), then reasoning and content deltas; with tools, a
/// reply's calls in one delta before its finish (`Streamed` keeps back the
/// text that may be a tag or a call).
struct ChatFormat {
    meta: Meta,
    state: AppState,
    logprobs: bool,
    role: &'static str,
    echo: Option<String>,
    rules: Arc<Rules>,
    /// Per choice: its text read so far, and the tokens of text held back.
    streamed: Vec<Streamed>,
    held_tokens: Vec<Vec<TokenInfo>>,
    short_ids: bool,
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

    /// The tokens of held text, then `tokens`.
    fn take_tokens(&mut self, index: usize, tokens: Vec<TokenInfo>) -> Vec<TokenInfo> {
        let mut all = std::mem::take(&mut self.held_tokens[index]);
        all.extend(tokens);
        all
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
            let delta = Delta { role: Some(self.role), content: Some(String::new()), ..Delta::default() };
            chunks.push(self.chunk(vec![ChunkChoice { index, delta, logprobs: None, finish_reason: None }], None));
            if let Some(text) = &echo {
                let delta = Delta { content: Some(text.clone()), ..Delta::default() };
                chunks.push(self.chunk(vec![ChunkChoice { index, delta, logprobs: None, finish_reason: None }], None));
            }
        }
        chunks
    }
    fn text(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Vec<Value> {
        let (reasoning, content) = self.streamed[index].push(&self.rules, &text);
        // (Held text's logprobs go with the next chunk that has text.)
        if reasoning.is_empty() && content.is_empty() {
            self.held_tokens[index].extend(tokens);
            return Vec::new();
        }
        let tokens = self.take_tokens(index, tokens);
        let some = |s: String| Some(s).filter(|s| !s.is_empty());
        let delta = Delta { reasoning_content: some(reasoning), content: some(content), ..Delta::default() };
        vec![self.choice(index, delta, &tokens, None)]
    }
    fn finish(&mut self, index: usize, summary: &Summary, tokens: Vec<TokenInfo>) -> Vec<Value> {
        let reason = summary.finish.as_str();
        let tokens = self.take_tokens(index, tokens);
        let reply = self.streamed[index].finish(&self.rules);
        let mut deltas = Vec::new();
        if reply.reasoning.is_some() || reply.content.is_some() {
            deltas.push(Delta { reasoning_content: reply.reasoning, content: reply.content, ..Delta::default() });
        }
        let called = !reply.calls.is_empty();
        if called {
            let calls = ToolCall::list(reply.calls, true, self.short_ids);
            deltas.push(Delta { tool_calls: Some(calls), ..Delta::default() });
        }
        let reason = if called { "tool_calls" } else { reason };
        deltas.push(Delta::default());
        let last = deltas.len() - 1;
        // The tokens go with the first chunk, the finish with the last.
        (deltas.into_iter().enumerate())
            .map(|(i, d)| {
                let tokens = if i == 0 { tokens.as_slice() } else { &[] };
                self.choice(index, d, tokens, (i == last).then_some(reason))
            })
            .collect()
    }

    fn usage(&mut self, usage: Usage) -> Value {
        self.chunk(Vec::new(), Some(usage))
    }
}
