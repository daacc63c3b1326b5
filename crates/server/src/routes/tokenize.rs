//! `POST /tokenize` and `POST /detokenize` (vLLM's shapes), for clients that
//! count tokens or check what a prompt becomes.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::api::request::{DetokenizeRequest, TokenizeRequest};
use crate::convert;
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::prompt;
use crate::state::AppState;
use ferrite_loader::chat_template::Extras;

pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    state.check_model(req.model.as_deref())?;
    let tok = state.tokenizer();
    let tokens = match (&req.prompt, &req.messages) {
        (Some(text), None) => tok.encode(text, req.add_special_tokens.unwrap_or(true))?,
        (None, Some(messages)) => {
            let mut messages = convert::messages(messages)?;
            let template = prompt::require_template(state.template.as_ref())?;
            let tools = crate::tools::from_request(req.tools.as_ref(), None, None)?;
            if let Some(t) = &tools {
                messages = t.prepare(template, state.template_tools.shown, &messages);
            }
            let ending = prompt::Ending::from_request(req.add_generation_prompt, req.continue_final_message)?;
            let vars = convert::template_vars(req.chat_template_kwargs.as_ref())?;
            let extras = Extras { tools: tools.as_ref().map(|t| t.tools.as_slice()), vars: vars.as_ref() };
            prompt::chat_ids(tok, template, &messages, extras, ending)?
        }
        _ => return Err(ApiError::invalid("send exactly one of `prompt` and `messages`")),
    };
    Ok(Json(json!({"count": tokens.len(), "max_model_len": state.max_model_len(), "tokens": tokens})))
}

pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    state.check_model(req.model.as_deref())?;
    let vocab = state.vocab_size();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::param("tokens", format!("token id {bad} is outside the vocabulary of {vocab}")));
    }
    Ok(Json(json!({"prompt": state.tokenizer().decode(&req.tokens, false)})))
}
