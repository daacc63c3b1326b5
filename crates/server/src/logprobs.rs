//! Token logprobs in both OpenAI layouts. Token strings come from the token's
//! bytes (lossy for a partial UTF-8 character; `bytes` keeps them exact).

use ferrite_loader::tokenizer::Tokenizer;
use serde_json::{Map, Value};

use crate::api::response::{ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob};
use crate::generate::TokenInfo;

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
        let (text, _) = token(tok, i.token);
        out.text_offset.push(*offset);
        *offset += text.chars().count();
        out.tokens.push(text);
        out.token_logprobs.push(finite(i.logprob));
        let mut top = Map::new();
        for t in &i.top {
            let logprob = serde_json::Number::from_f64(finite(t.logprob) as f64).map(Value::Number);
            top.insert(token(tok, t.token).0, logprob.unwrap_or(Value::Null));
        }
        out.top_logprobs.push(top);
    }
    out
}
