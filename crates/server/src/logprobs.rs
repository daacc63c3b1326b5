//! Token logprobs in both OpenAI layouts. Token strings come from the token's
//! bytes (lossy for a partial UTF-8 character; `bytes` keeps them exact).

use crate::api::response::{
    Alternatives, ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, RankedLogprob, RankedLogprobs, TopLogprob,
};
use crate::generate::TokenInfo;
use ferrite_engine::sampling::TokenScore;
use ferrite_loader::tokenizer::Tokenizer;

/// JSON has no -inf; OpenAI reports impossible tokens as -9999.
fn finite(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        -9999.0
    }
}

fn token(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// A token in the legacy layout, which has no `bytes`: its text, or where
/// that is not whole UTF-8 (part of a character), `bytes:\xe6\x97` as OpenAI
/// writes it, so distinct partial tokens keep distinct names.
fn legacy_text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => e.into_bytes().iter().fold("bytes:".to_string(), |s, b| s + &format!("\\x{b:02x}")),
    }
}

pub fn chat(tok: &Tokenizer, infos: &[TokenInfo]) -> ChatLogprobs {
    let content = infos
        .iter()
        .map(|i| {
            let (text, bytes) = token(tok, i.token);
            let top_logprobs = i
                .top
                .iter()
                .map(|t| {
                    let (token, bytes) = token(tok, t.token);
                    TopLogprob { token, logprob: finite(t.logprob), bytes }
                })
                .collect();
            ChatTokenLogprob { token: text, logprob: finite(i.logprob), bytes, top_logprobs }
        })
        .collect();
    ChatLogprobs { content }
}

/// `offset` is the completion's length in characters so far; it advances by
/// each token's text, giving `text_offset`.
pub fn completion(tok: &Tokenizer, infos: &[TokenInfo], offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for i in infos {
        let top = i.top.iter().map(|t| (legacy_text(tok.token_bytes(t.token)), finite(t.logprob))).collect();
        push_legacy(tok, &mut out, i.token, Some((finite(i.logprob), Alternatives(top))), offset);
    }
    out
}

/// An echoed prompt's tokens: `first`, which has no logprob (null, as
/// OpenAI writes it), then each scored token (`Event::PromptLogprobs`) with
/// `top` alternatives. `offset` advances as in `completion`, from 0: the
/// echo leads the text.
pub fn echoed_prompt(
    tok: &Tokenizer,
    first: u32,
    scores: &[TokenScore],
    top: usize,
    offset: &mut usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    push_legacy(tok, &mut out, first, None, offset);
    let infos: Vec<TokenInfo> = scores
        .iter()
        .map(|s| TokenInfo { token: s.token, logprob: s.logprob, top: s.top.iter().take(top).copied().collect() })
        .collect();
    out.append(completion(tok, &infos, offset));
    out
}

/// vLLM's `prompt_logprobs`: null for the first token, then each scored
/// token with its rank and `top` alternatives.
pub fn ranked_prompt(tok: &Tokenizer, scores: &[TokenScore], top: usize) -> Vec<Option<RankedLogprobs>> {
    let entry = |id: u32, logprob: f32, rank: usize| {
        let decoded_token = String::from_utf8_lossy(&tok.token_bytes(id)).into_owned();
        (id, RankedLogprob { logprob: finite(logprob), rank, decoded_token })
    };
    let position = |s: &TokenScore| {
        let mut entries = vec![entry(s.token, s.logprob, s.rank)];
        let others = s.top.iter().take(top).enumerate().filter(|(_, t)| t.token != s.token);
        entries.extend(others.map(|(i, t)| entry(t.token, t.logprob, i + 1)));
        Some(RankedLogprobs(entries))
    };
    std::iter::once(None).chain(scores.iter().map(position)).collect()
}

fn push_legacy(
    tok: &Tokenizer,
    out: &mut CompletionLogprobs,
    id: u32,
    scored: Option<(f32, Alternatives)>,
    offset: &mut usize,
) {
    let bytes = tok.token_bytes(id);
    out.text_offset.push(*offset);
    *offset += String::from_utf8_lossy(&bytes).chars().count();
    out.tokens.push(legacy_text(bytes));
    let (logprob, top) = scored.unzip();
    out.token_logprobs.push(logprob);
    out.top_logprobs.push(top);
}

#[cfg(test)]
mod tests {
    use super::legacy_text;
    use crate::api::response::Alternatives;

    #[test]
    fn legacy_layout_names_and_order() {
        assert_eq!(legacy_text(b" world".to_vec()), " world");
        assert_eq!(legacy_text(vec![0xe6, 0x97]), "bytes:\\xe6\\x97");
        // Most likely first, whatever the tokens' text.
        let top = Alternatives(vec![("b".into(), -0.25), ("a".into(), -2.0)]);
        assert_eq!(serde_json::to_string(&top).unwrap(), r#"{"b":-0.25,"a":-2.0}"#);
        // Streamed chunks go through a JSON value first: the order holds there too.
        assert_eq!(serde_json::to_value(&top).unwrap().to_string(), r#"{"b":-0.25,"a":-2.0}"#);
    }
}
