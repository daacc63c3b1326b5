//! Prompt text -> token ids, exactly as `ferrite run` builds them, so a chat
//! through the server sees the same tokens as one in the terminal.

use ferrite_core::Result;
use ferrite_loader::chat_template::{ChatTemplate, Message};
use ferrite_loader::tokenizer::Tokenizer;

use crate::convert::Prompt;
use crate::errors::ApiError;

/// How a rendered conversation ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ending {
    /// With the opening of the assistant's reply (the usual).
    Reply,
    /// With the last message as the template closes it.
    Closed,
    /// Inside the final (assistant) message, right after its text, so that
    /// the model goes on with it (vLLM's `continue_final_message`).
    Continue,
}

impl Ending {
    /// From the request's `add_generation_prompt` and `continue_final_message`.
    pub fn from_request(
        add_generation_prompt: Option<bool>,
        continue_final: Option<bool>,
    ) -> std::result::Result<Ending, ApiError> {
        match (add_generation_prompt, continue_final.unwrap_or(false)) {
            (Some(true), true) => Err(ApiError::param(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            )),
            (_, true) => Ok(Ending::Continue),
            (Some(false), false) => Ok(Ending::Closed),
            (_, false) => Ok(Ending::Reply),
        }
    }
}

/// Renders the conversation and tokenizes it with special tokens; templates
/// usually print BOS themselves, so a doubled BOS is collapsed to one.
pub fn chat_ids(tok: &Tokenizer, template: &ChatTemplate, messages: &[Message], ending: Ending) -> Result<Vec<u32>> {
    let text = match ending {
        Ending::Continue => open_final_message(template, messages)?,
        _ => template.render(messages, ending == Ending::Reply)?,
    };
    let mut ids = tok.encode(&text, true)?;
    if let Some(bos) = tok.bos_id() {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    Ok(ids)
}

/// The conversation rendered up to the end of its final message's text,
/// which must be the assistant's: rendered with a marker after that text, and
/// cut at the marker (wherever the template puts the text, trimmed or not).
fn open_final_message(template: &ChatTemplate, messages: &[Message]) -> Result<String> {
    const MARK: &str = "\u{1}ferrite:continue\u{1}";
    let invalid = |m: &str| ferrite_core::Error::InvalidInput(format!("continue_final_message: {m}"));
    let mut marked = messages.to_vec();
    match marked.last_mut() {
        // Trailing whitespace goes, as Hugging Face's implementation strips it.
        Some(last) if last.role == "assistant" => last.content = format!("{}{MARK}", last.content.trim_end()),
        _ => return Err(invalid("the last message must be the assistant's")),
    }
    let text = template.render(&marked, false)?;
    let at = text.rfind(MARK).ok_or_else(|| invalid("the chat template does not write the final message's text"))?;
    Ok(text[..at].to_string())
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
