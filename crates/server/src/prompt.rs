//! Prompt text -> token ids, exactly as `ferrite run` builds them, so a chat
//! through the server sees the same tokens as one in the terminal.

use ferrite_core::Result;
use ferrite_loader::chat_template::{ChatTemplate, Message};
use ferrite_loader::tokenizer::Tokenizer;

use crate::convert::Prompt;
use crate::errors::ApiError;

/// Renders the conversation and tokenizes it with special tokens; templates
/// usually print BOS themselves, so a doubled BOS is collapsed to one.
pub fn chat_ids(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<Vec<u32>> {
    let text = template.render(messages, add_generation_prompt)?;
    let mut ids = tok.encode(&text, true)?;
    if let Some(bos) = tok.bos_id() {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    Ok(ids)
}

/// A completions prompt: text gets BOS as the model's metadata says; token
/// ids are used as given.
pub fn completion_ids(tok: &Tokenizer, prompt: Prompt) -> Result<Vec<u32>> {
    match prompt {
        Prompt::Text(t) => tok.encode(&t, true),
        Prompt::Tokens(ids) => Ok(ids),
    }
}

/// The template, or the 400 a model without one answers to chat requests.
pub fn require_template(t: Option<&ChatTemplate>) -> std::result::Result<&ChatTemplate, ApiError> {
    t.ok_or_else(|| ApiError::invalid("this model has no chat template; use /v1/completions with a plain prompt"))
}
