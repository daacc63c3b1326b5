//! `POST /v1/completions`: the legacy text completion API.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::sampling::TokenScore;
use ferrite_engine::Summary;
use ferrite_loader::tokenizer::Tokenizer;
use serde_json::Value;

use crate::api::request::CompletionRequest;
use crate::api::response::{Completion, CompletionChoice, CompletionLogprobs, Meta, Usage};
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
    let echo = req.echo == Some(true);
    let backend = state.generator()?;
    let limits = Limits {
        max_context: backend.max_context(),
        vocab_size: backend.vocab_size(),
        tokenizer: Some(backend.tokenizer()),
    };
    let top_logprobs = convert::completion_logprobs(req.logprobs)?;
    // With echo, max_tokens 0 asks for the prompt alone (its scores).
    let settings = convert::settings(&req.common, top_logprobs, limits, echo)?;
    let (n, want_logprobs) = (settings.n, top_logprobs.is_some());
    // Several prompts: each one's `n` choices in turn, as OpenAI numbers them.
    let mut requests = Vec::new();
    let mut echoes = Vec::new();
    let tok = backend.tokenizer();
    for input in convert::prompts(&req.prompt, limits.vocab_size)? {
        let text = match (&input, echo) {
            (_, false) => None,
            (convert::Prompt::Text(t), true) => Some(t.clone()),
            // A character the ids stop inside of comes whole in the output,
            // if there is one (and no grammar: `IncrementalDetokenizer::after`).
            (convert::Prompt::Tokens(ids), true) if settings.max_tokens != Some(0) && settings.format.is_none() => {
                Some(tok.decode_finished(ids))
            }
            (convert::Prompt::Tokens(ids), true) => Some(tok.decode(ids, false)),
        };
        let (ids, ends) = match req.suffix.as_deref().filter(|s| !s.is_empty()) {
            Some(suffix) => prompt::fim_ids(tok, input, suffix)?,
            None => (prompt::completion_ids(tok, input)?, Vec::new()),
        };
        if ids.is_empty() {
            return Err(ApiError::param("prompt", "the prompt is empty"));
        }
        for (j, mut r) in settings.requests(ids, limits.max_context).into_iter().enumerate() {
            r.stop_ids.extend(&ends);
            // Scored once, with the more alternatives of the two asks; by
            // each choice where each streams its own echo first.
            if echo && (j == 0 || settings.stream) {
                r.prompt_logprobs = r.prompt_logprobs.max(top_logprobs);
            }
            let top = top_logprobs.unwrap_or(0);
            echoes.push(text.clone().map(|text| Echo { text, first: r.prompt[0], top }));
            requests.push(r);
        }
    }
    let streams = generate::submit_all(&state, requests)?;
    let meta = Meta::new("cmpl", &state.model);
    if settings.stream {
        let opts = sse::Options {
            logprobs: want_logprobs,
            include_usage: settings.include_usage,
            per_prompt: n,
            typed: false,
        };
        let offsets = vec![0; streams.len()];
        let format = CompletionFormat { meta, state: state.clone(), logprobs: want_logprobs, offsets, echoes };
        return Ok(sse::response(streams, format, opts));
    }
    let outputs = generate::collect_all(streams, want_logprobs).await?;
    // Each prompt's echoed logprobs (and where they end) and vLLM's list,
    // built once from its first choice's scores for all its choices.
    let prompt_parts: Vec<_> = (0..outputs.len())
        .step_by(n)
        .map(|first| {
            let scores = &outputs[first].prompt;
            let mut offset = 0;
            let echoed = echoes[first].as_ref().filter(|_| want_logprobs).map(|e| e.logprobs(tok, scores, &mut offset));
            (echoed, offset, settings.prompt_logprobs.map(|k| logprobs::ranked_prompt(tok, scores, k)))
        })
        .collect();
    let choices = outputs
        .iter()
        .zip(echoes)
        .enumerate()
        .map(|(index, (o, echo))| {
            let (echoed, mut offset, ranked) = prompt_parts[index / n].clone();
            let mut logprobs = echoed;
            if want_logprobs {
                let generated = logprobs::completion(tok, &o.tokens, &mut offset);
                logprobs.get_or_insert_with(Default::default).append(generated);
            }
            let text = echo.map_or(String::new(), |e| e.text) + &o.text;
            let finish_reason = Some(o.summary.finish.as_str());
            CompletionChoice { index, text, logprobs, finish_reason, prompt_logprobs: ranked }
        })
        .collect();
    let usage = Some(generate::usage(outputs.iter().map(|o| &o.summary), n));
    let m = meta;
    let body = Completion { id: m.id, object: "text_completion", created: m.created, model: m.model, choices, usage };
    Ok(Json(body).into_response())
}

/// A choice's echoed prompt: its text (as sent, or the ids decoded), first
/// token, and alternatives a position (`logprobs`).
struct Echo {
    text: String,
    first: u32,
    top: usize,
}

impl Echo {
    fn logprobs(&self, tok: &Tokenizer, scores: &[TokenScore], offset: &mut usize) -> CompletionLogprobs {
        logprobs::echoed_prompt(tok, self.first, scores, self.top, offset)
    }
}

/// Options we do not implement get a clear 400 rather than being ignored.
fn unsupported(req: &CompletionRequest) -> Result<(), ApiError> {
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) && req.echo == Some(true) {
        return Err(ApiError::param("suffix", "suffix (fill-in-the-middle) cannot be combined with echo"));
    }
    let n = req.common.n.unwrap_or(1);
    if req.best_of.is_some_and(|b| b != 1 && b != n) {
        return Err(ApiError::param("best_of", "best_of is not supported (only best_of = n)"));
    }
    Ok(())
}

/// `text_completion` chunks; `offsets` tracks each choice's `text_offset`.
/// An echoed prompt is each choice's first chunk: at the start, or with
/// logprobs once its scores come.
struct CompletionFormat {
    meta: Meta,
    state: AppState,
    logprobs: bool,
    offsets: Vec<usize>,
    echoes: Vec<Option<Echo>>,
}

impl CompletionFormat {
    fn chunk(&mut self, index: usize, text: String, tokens: &[TokenInfo], finish: Option<&'static str>) -> Value {
        let tok = self.state.tokenizer();
        let logprobs =
            (self.logprobs && !tokens.is_empty()).then(|| logprobs::completion(tok, tokens, &mut self.offsets[index]));
        let choice = CompletionChoice { index, text, logprobs, finish_reason: finish, prompt_logprobs: None };
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
        if self.logprobs {
            return Vec::new();
        }
        let echoes: Vec<(usize, String)> =
            self.echoes.iter_mut().enumerate().filter_map(|(i, e)| Some((i, e.take()?.text))).collect();
        echoes.into_iter().map(|(i, text)| self.chunk(i, text, &[], None)).collect()
    }
    fn prompt(&mut self, index: usize, scores: Vec<TokenScore>) -> Option<Value> {
        let echo = self.echoes.get_mut(index)?.take()?;
        let logprobs = Some(echo.logprobs(self.state.tokenizer(), &scores, &mut self.offsets[index]));
        let choice = CompletionChoice { index, text: echo.text, logprobs, finish_reason: None, prompt_logprobs: None };
        Some(self.wrap(vec![choice], None))
    }
    fn text(&mut self, index: usize, text: String, tokens: Vec<TokenInfo>) -> Vec<Value> {
        vec![self.chunk(index, text, &tokens, None)]
    }
    fn finish(&mut self, index: usize, summary: &Summary, tokens: Vec<TokenInfo>) -> Vec<Value> {
        vec![self.chunk(index, String::new(), &tokens, Some(summary.finish.as_str()))]
    }
    fn usage(&mut self, usage: Usage) -> Value {
        self.wrap(Vec::new(), Some(usage))
    }
}
