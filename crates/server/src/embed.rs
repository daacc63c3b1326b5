//! /v1/embeddings request -> inputs and options, as pure functions (no engine,
//! no I/O) so every validation rule is unit-tested; and the base64 encoding
//! of vectors.

use ferrite_engine::embed::MAX_INPUTS;
use serde_json::Value;

use crate::api::request::EmbeddingRequest;
use crate::errors::ApiError;

/// What the request asks to embed.
#[derive(Clone, Debug, PartialEq)]
pub enum Inputs {
    /// Texts, tokenized with the model's special tokens.
    Texts(Vec<String>),
    /// Token ids, embedded as given (no special tokens added).
    Tokens(Vec<Vec<u32>>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Float,
    Base64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub encoding: Encoding,
    /// Keep the leading values only.
    pub dims: Option<usize>,
    /// Cut inputs longer than the model's limit.
    pub truncate: bool,
}

const FORMS: &str = "send a string, a list of strings, a list of token ids or a list of token-id lists";

/// `encoding_format`, `dimensions` (1..=dim) and `truncate`.
pub fn options(req: &EmbeddingRequest, dim: usize) -> Result<Options, ApiError> {
    let encoding = match req.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("encoding_format must be \"float\" or \"base64\", not {other:?}"),
            ))
        }
    };
    let dims = match req.dimensions {
        None => None,
        Some(d) if d >= 1 && d as u64 <= dim as u64 => Some(d as usize),
        Some(d) => {
            return Err(ApiError::param(
                "dimensions",
                format!("dimensions must be between 1 and {dim} (this model's vectors), got {d}"),
            ))
        }
    };
    Ok(Options { encoding, dims, truncate: req.truncate.unwrap_or(false) })
}

/// How `input`'s `i`-th item is named in messages: `input` when the request
/// sent one input (a string or one list of token ids), else `input[i]`.
pub fn label(input: &Value, i: usize) -> String {
    match input {
        Value::Array(items) if !items.first().is_some_and(Value::is_number) => format!("input[{i}]"),
        _ => "input".to_string(),
    }
}

/// The inputs of `input`; token ids must be below `vocab_size`.
pub fn inputs(input: &Value, vocab_size: usize) -> Result<Inputs, ApiError> {
    let bad = |m: String| ApiError::param("input", m);
    match input {
        Value::String(s) if s.is_empty() => Err(bad("input must not be an empty string".into())),
        Value::String(s) => Ok(Inputs::Texts(vec![s.clone()])),
        Value::Array(items) if items.is_empty() => Err(bad("input must not be an empty list".into())),
        Value::Array(items) if !items[0].is_number() && items.len() > MAX_INPUTS => {
            Err(bad(format!("{} inputs; at most {MAX_INPUTS} per request", items.len())))
        }
        Value::Array(items) => {
            check_one_kind(items)?;
            match &items[0] {
                Value::String(_) => texts(items).map(Inputs::Texts),
                Value::Number(_) => token_ids(items, vocab_size, "input").map(|ids| Inputs::Tokens(vec![ids])),
                _ => items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        let name = format!("input[{i}]");
                        match item.as_array() {
                            Some(ids) if ids.is_empty() => Err(bad(format!("{name} is an empty list of token ids"))),
                            Some(ids) => token_ids(ids, vocab_size, &name),
                            None => Err(bad(format!("{name} is not a list of token ids"))),
                        }
                    })
                    .collect::<Result<_, _>>()
                    .map(Inputs::Tokens),
            }
        }
        other => Err(bad(format!("input must not be {}: {FORMS}", kind(other)))),
    }
}

/// Every item of a list input has the first item's kind (string, number or list).
fn check_one_kind(items: &[Value]) -> Result<(), ApiError> {
    let first = &items[0];
    if !(first.is_string() || first.is_number() || first.is_array()) {
        return Err(ApiError::param("input", format!("input[0] must not be {}: {FORMS}", kind(first))));
    }
    let same = |v: &Value| std::mem::discriminant(v) == std::mem::discriminant(first);
    match items.iter().position(|v| !same(v)) {
        None => Ok(()),
        Some(i) => Err(ApiError::param(
            "input",
            format!("input mixes kinds: input[0] is {} but input[{i}] is {}; {FORMS}", kind(first), kind(&items[i])),
        )),
    }
}

fn texts(items: &[Value]) -> Result<Vec<String>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_str() {
            Some("") => Err(ApiError::param("input", format!("input[{i}] is an empty string"))),
            Some(s) => Ok(s.to_string()),
            None => Err(ApiError::param("input", format!("input[{i}] is not a string"))),
        })
        .collect()
}

fn token_ids(items: &[Value], vocab_size: usize, name: &str) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(j, v)| {
            v.as_u64().filter(|&id| id < vocab_size as u64).map(|id| id as u32).ok_or_else(|| {
                ApiError::param(
                    "input",
                    format!("{name}[{j}] = {v} is not a token id (the vocabulary holds 0..{vocab_size})"),
                )
            })
        })
        .collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The 400 for an input over the model's limit without `truncate`.
pub fn too_long(name: &str, tokens: usize, max_length: usize) -> ApiError {
    ApiError::param(
        "input",
        format!(
            "{name} has {tokens} tokens, more than this model's maximum of {max_length}; \
             send \"truncate\": true to cut longer inputs to {max_length} tokens"
        ),
    )
}

/// Token-id inputs within the limit: cut at the end with `truncate`, else a 400.
pub fn fit_tokens(
    mut inputs: Vec<Vec<u32>>,
    input: &Value,
    truncate: bool,
    max_length: usize,
) -> Result<Vec<Vec<u32>>, ApiError> {
    for (i, ids) in inputs.iter_mut().enumerate() {
        if ids.len() > max_length {
            if !truncate {
                return Err(too_long(&label(input, i), ids.len(), max_length));
            }
            ids.truncate(max_length);
        }
    }
    Ok(inputs)
}

/// Standard base64 (with padding) of the vector's little-endian f32 bytes, as
/// OpenAI sends `encoding_format: "base64"`.
pub fn base64(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn req(v: Value) -> EmbeddingRequest {
        serde_json::from_value(v).unwrap()
    }

    fn message(r: Result<impl std::fmt::Debug, ApiError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        e.message
    }

    #[test]
    fn input_forms() {
        let t = |v: &[&str]| Inputs::Texts(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(inputs(&json!("hi"), 10).unwrap(), t(&["hi"]));
        assert_eq!(inputs(&json!(["a", "b"]), 10).unwrap(), t(&["a", "b"]));
        assert_eq!(inputs(&json!([1, 2]), 10).unwrap(), Inputs::Tokens(vec![vec![1, 2]]));
        assert_eq!(inputs(&json!([[1], [2, 9]]), 10).unwrap(), Inputs::Tokens(vec![vec![1], vec![2, 9]]));
    }

    #[test]
    fn bad_inputs_name_the_problem() {
        let cases = [
            (json!(""), "empty string"),
            (json!([]), "empty list"),
            (json!(["a", ""]), "input[1] is an empty string"),
            (json!(["a", 1]), "input mixes kinds: input[0] is a string but input[1] is a number"),
            (json!([[1], "a"]), "input[1] is a string"),
            (json!([1, [2]]), "input[1] is a list"),
            (json!([1, 10]), "input[1] = 10 is not a token id"),
            (json!([1, -1]), "input[1] = -1 is not a token id"),
            (json!([1.5]), "input[0] = 1.5 is not a token id"),
            (json!([[1], [2, 99]]), "input[1][1] = 99 is not a token id"),
            (json!([[1], []]), "input[1] is an empty list of token ids"),
            (json!([[1], ["a"]]), "input[1][0] = \"a\" is not a token id"),
            (json!([{"text": "a"}]), "input[0] must not be an object"),
            (json!([null]), "input[0] must not be null"),
            (json!(null), "input must not be null"),
            (json!(3), "input must not be a number"),
            (json!({"a": 1}), "input must not be an object"),
        ];
        for (v, want) in cases {
            let m = message(inputs(&v, 10));
            assert!(m.contains(want), "{v}: {m}");
            assert_eq!(inputs(&v, 10).unwrap_err().param.as_deref(), Some("input"));
        }
    }

    #[test]
    fn labels() {
        assert_eq!(label(&json!("a"), 0), "input");
        assert_eq!(label(&json!([1, 2]), 0), "input");
        assert_eq!(label(&json!(["a", "b"]), 1), "input[1]");
        assert_eq!(label(&json!([[1], [2]]), 1), "input[1]");
    }

    #[test]
    fn options_and_their_errors() {
        let o = options(&req(json!({"input": "a"})), 8).unwrap();
        assert_eq!(o, Options { encoding: Encoding::Float, dims: None, truncate: false });
        let o = options(&req(json!({"input": "a", "encoding_format": "base64", "dimensions": 8, "truncate": true})), 8);
        assert_eq!(o.unwrap(), Options { encoding: Encoding::Base64, dims: Some(8), truncate: true });
        assert!(message(options(&req(json!({"input": "a", "encoding_format": "bytes"})), 8)).contains("\"bytes\""));
        for d in [0, -1, 9, i64::MAX] {
            let e = options(&req(json!({"input": "a", "dimensions": d})), 8).unwrap_err();
            assert!(e.message.contains("between 1 and 8"), "{}", e.message);
            assert_eq!(e.param.as_deref(), Some("dimensions"));
        }
    }

    #[test]
    fn token_inputs_over_the_limit() {
        let input = json!([[1, 2, 3], [1]]);
        let m = message(fit_tokens(vec![vec![1, 2, 3], vec![1]], &input, false, 2));
        assert!(m.contains("input[0] has 3 tokens") && m.contains("maximum of 2") && m.contains("\"truncate\": true"));
        assert_eq!(fit_tokens(vec![vec![1, 2, 3], vec![1]], &input, true, 2).unwrap(), vec![vec![1, 2], vec![1]]);
    }

    #[test]
    fn base64_of_floats() {
        // Reference values from Python: base64.b64encode(struct.pack("<f", x)).
        assert_eq!(base64(&[1.0]), "AACAPw==");
        assert_eq!(base64(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(base64(&[0.0, 0.0, 0.5]), "AAAAAAAAAAAAAAA/");
        assert_eq!(base64(&[]), "");
    }
}
