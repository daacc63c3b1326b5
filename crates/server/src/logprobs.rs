//! Token logprobs in both OpenAI layouts. Token strings come from the token's
//! bytes (lossy for a partial UTF-8 character; `bytes` keeps them exact).

use crate::api::response::{
    Alternatives, ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, RankedLogprob, RankedLogprobs, TopLogprob,
};
use crate::generate::TokenInfo;
use ferrite_engine::sampling::TokenScore;
use ferrite_loader::tokenizer::Tokenizer;

/// A logprob for JSON: -9999 for an impossible token (JSON has no -inf; as
/// OpenAI reports them), and the f32's shortest decimal as an f64, so a value
/// prints the same whether a response is written directly or, as streamed
/// chunks are, through a JSON value (which widens an f32 to its exact f64).
fn finite(x: f32) -> f64 {
    let x = if x.is_finite() { x } else { -9999.0 };
    ryu::Buffer::new().format_finite(x).parse().unwrap_or(f64::from(x))
}

fn token(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Where a token of these bytes starts in the text, in characters, given
/// `started`, the characters begun before it (which it advances). A token
/// that starts inside a character (with a byte continuing one) starts
/// where that character does.
fn text_offset(bytes: &[u8], started: &mut usize) -> usize {
    let continuation = |b: &&u8| **b & 0xc0 == 0x80;
    let at = started.saturating_sub(usize::from(bytes.first().is_some_and(|b| continuation(&b))));
    *started += bytes.iter().filter(|b| !continuation(b)).count();
    at
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

/// `offset` counts the characters the tokens' texts have started so far
/// (an echoed prompt's included, its BOS too, as vLLM counts them: so
/// offsets index the tokens' text, not always the prompt as sent); it
/// advances by each token's, giving `text_offset`.
pub fn completion(tok: &Tokenizer, infos: &[TokenInfo], offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for i in infos {
        let mut top: Vec<(String, f64)> =
            i.top.iter().map(|t| (legacy_text(tok.token_bytes(t.token)), finite(t.logprob))).collect();
        // The chosen token is always listed, as OpenAI's legacy layout does
        // (up to `logprobs` + 1 entries); by its text, the map's key.
        let chosen = legacy_text(tok.token_bytes(i.token));
        if !top.iter().any(|(t, _)| *t == chosen) {
            top.push((chosen, finite(i.logprob)));
        }
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
    scored: Option<(f64, Alternatives)>,
    offset: &mut usize,
) {
    let bytes = tok.token_bytes(id);
    out.text_offset.push(text_offset(&bytes, offset));
    out.tokens.push(legacy_text(bytes));
    let (logprob, top) = scored.unzip();
    out.token_logprobs.push(logprob);
    out.top_logprobs.push(top);
}

#[cfg(test)]
mod tests {
    use super::{legacy_text, text_offset};
    use crate::api::response::Alternatives;

    #[test]
    fn offsets_count_characters_and_fragments_share_theirs() {
        // "a", then 日 (e6 97 a5) split over two tokens, then "本 b".
        let tokens: [&[u8]; 4] = [b"a", &[0xe6, 0x97], &[0xa5], "本 b".as_bytes()];
        let mut started = 0;
        let offsets: Vec<usize> = tokens.iter().map(|t| text_offset(t, &mut started)).collect();
        assert_eq!(offsets, [0, 1, 1, 2]);
        assert_eq!(started, "a日本 b".chars().count());
    }

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
