//! Prompt text -> token ids, exactly as `ferrite run` builds them, so a chat
//! through the server sees the same tokens as one in the terminal.

use ferrite_core::Result;
use ferrite_loader::chat_template::{ChatTemplate, Extras, Message};
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

/// Renders the conversation and tokenizes it (`chat_text`, `chat_tokens`).
pub fn chat_ids(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
    extras: Extras,
    ending: Ending,
) -> Result<Vec<u32>> {
    chat_tokens(tok, &chat_text(template, messages, extras, ending)?)
}

/// The conversation as the template writes it, with `extras` (the
/// functions the model may call, more template variables).
pub fn chat_text(template: &ChatTemplate, messages: &[Message], extras: Extras, ending: Ending) -> Result<String> {
    match ending {
        Ending::Continue => open_final_message(template, messages, extras),
        _ => template.render_with(messages, extras, ending == Ending::Reply),
    }
}

/// A rendered conversation's tokens, special tokens included; templates
/// usually print BOS themselves, so a doubled BOS is collapsed to one.
pub fn chat_tokens(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = tok.encode(text, true)?;
    if let Some(bos) = tok.bos_id() {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    Ok(ids)
}

/// The conversation rendered up to the end of its final message's text,
/// which must be the assistant's: rendered with a marker and a space after
/// that text, and cut at the marker (wherever the template puts the text).
/// As in Hugging Face's implementation, the text's trailing whitespace stays
/// where the template keeps spacing as given (the space after the marker
/// survives) and goes where it trims the message.
fn open_final_message(template: &ChatTemplate, messages: &[Message], extras: Extras) -> Result<String> {
    const MARK: &str = "\u{1}ferrite:continue\u{1}";
    let invalid = |m: &str| ferrite_core::Error::InvalidInput(format!("continue_final_message: {m}"));
    let mut marked = messages.to_vec();
    match marked.last_mut() {
        Some(last) if last.role == "assistant" => last.content.push_str(&format!("{MARK} ")),
        _ => return Err(invalid("the last message must be the assistant's")),
    }
    let text = template.render_with(&marked, extras, false)?;
    let at = text.rfind(MARK).ok_or_else(|| invalid("the chat template does not write the final message's text"))?;
    let kept_spacing = text[at + MARK.len()..].starts_with(' ');
    Ok(if kept_spacing { &text[..at] } else { text[..at].trim_end() }.to_string())
}

/// A fill-in-the-middle prompt, as llama.cpp builds it: BOS (where the
/// model adds one), the prefix token and the prompt, the suffix token and
/// `suffix`, the middle token; and the ids that end the middle.
pub fn fim_ids(tok: &Tokenizer, prompt: Prompt, suffix: &str) -> std::result::Result<(Vec<u32>, Vec<u32>), ApiError> {
    let fim = tok.fim().ok_or_else(|| {
        ApiError::param("suffix", "this model has no fill-in-the-middle tokens, so it cannot take a suffix")
    })?;
    let mut out: Vec<u32> =
        tok.bos_id().filter(|&b| tok.encode("a", true).is_ok_and(|e| e.first() == Some(&b))).into_iter().collect();
    out.push(fim.prefix);
    match prompt {
        Prompt::Text(t) => out.extend(tok.encode(&t, false)?),
        Prompt::Tokens(t) => out.extend(t),
    }
    out.push(fim.suffix);
    out.extend(tok.encode(suffix, false)?);
    out.push(fim.middle);
    Ok((out, fim.ends.clone()))
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

#[cfg(test)]
mod tests {
    use super::{open_final_message, ChatTemplate, Extras, Message};

    #[test]
    fn a_final_message_is_left_open_as_hugging_face_does() {
        let m = |role: &str, content: &str| Message::new(role, content);
        let messages = [m("user", "q"), m("assistant", "Sure, here is ")];
        let keeps = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}";
        let trims = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}";
        let open = |src: &str| {
            open_final_message(&ChatTemplate::new(src, "<s>", "</s>").unwrap(), &messages, Extras::default()).unwrap()
        };
        // Spacing kept as given where the template keeps it; trimmed where it trims.
        assert_eq!(open(keeps), "<user>q</s><assistant>Sure, here is ");
        assert_eq!(open(trims), "<user>q</s><assistant>Sure, here is");
        // Cut where the final text ends, even when that text also occurs earlier.
        let messages = [m("user", "Sure"), m("assistant", "Sure")];
        let template = ChatTemplate::new(keeps, "<s>", "</s>").unwrap();
        let open = open_final_message(&template, &messages, Extras::default()).unwrap();
        assert_eq!(open, "<user>Sure</s><assistant>Sure");
    }
}
