use serde_json::json;

use super::*;
use crate::api::request::{ChatRequest, CompletionRequest};

const LIMITS: Limits<'static> = Limits { max_context: 100, vocab_size: 1000, tokenizer: None };

fn chat(body: Value) -> Result<Settings, ApiError> {
    let req: ChatRequest = serde_json::from_value(body).expect("parses");
    let lp = chat_logprobs(req.logprobs, req.top_logprobs)?;
    settings(&req.common, lp, LIMITS, false)
}

fn err_param(r: Result<Settings, ApiError>) -> Option<String> {
    let e = r.expect_err("should be rejected");
    assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{e:?}");
    e.param
}

#[test]
fn openai_defaults() {
    let s = chat(json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
    let p = &s.sampling;
    assert_eq!((p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty), (1.0, 1.0, 0, 0.0, 1.0));
    assert_eq!((p.presence_penalty, p.frequency_penalty, p.penalty_last_n), (0.0, 0.0, 64));
    assert_eq!((p.seed, p.logprobs), (None, None));
    assert_eq!(
        (s.n, s.stream, s.include_usage, s.max_tokens, s.ignore_eos, s.format),
        (1, false, false, None, false, None)
    );
    assert!(p.validate().is_ok());
}

#[test]
fn every_field_is_carried() {
    let s = chat(json!({
        "messages": [], "n": 3, "stream": true, "stream_options": {"include_usage": true},
        "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.1, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 42, "stop": ["a", "b"],
        "max_tokens": 10, "logprobs": true, "top_logprobs": 5, "logit_bias": {"7": -100, "8": 2.5},
        "response_format": {"type": "json_object"}, "ignore_eos": true, "user": "ignored", "unknown": [1]
    }))
    .unwrap();
    let p = &s.sampling;
    assert_eq!(
        (s.n, s.stream, s.include_usage, s.max_tokens, s.ignore_eos, s.format),
        (3, true, true, Some(10), true, Some(OutputFormat::Object))
    );
    assert_eq!((p.temperature, p.top_p, p.top_k, p.min_p), (0.5, 0.9, 20, 0.1));
    assert_eq!((p.presence_penalty, p.frequency_penalty, p.repetition_penalty), (0.5, -0.5, 1.1));
    assert_eq!((p.seed, p.logprobs), (Some(42), Some(5)));
    assert_eq!(p.logit_bias, vec![(7, -100.0), (8, 2.5)]);
    assert_eq!(s.stop, vec!["a", "b"]);
}

#[test]
fn requests_get_consecutive_seeds_and_default_max_tokens() {
    let s = chat(json!({"messages": [], "n": 3, "seed": 10})).unwrap();
    let reqs = s.requests(vec![1, 2, 3], 100);
    assert_eq!(reqs.len(), 3);
    let seeds: Vec<_> = reqs.iter().map(|r| r.sampling.seed).collect();
    assert_eq!(seeds, vec![Some(10), Some(11), Some(12)]);
    assert!(reqs.iter().all(|r| r.max_tokens == 97 && r.prompt == vec![1, 2, 3]));
    // A prompt that fills the context still asks for one token, so the engine explains.
    assert_eq!(s.requests(vec![0; 100], 100)[0].max_tokens, 1);
    // n > 1 without a seed: distinct seeds all the same.
    let s = chat(json!({"messages": [], "n": 2})).unwrap();
    let r = s.requests(vec![1], 100);
    assert_ne!(r[0].sampling.seed, r[1].sampling.seed);
    let one = chat(json!({"messages": []})).unwrap().requests(vec![1], 100);
    assert_eq!(one[0].sampling.seed, None);
}

#[test]
fn max_completion_tokens_wins() {
    let s = chat(json!({"messages": [], "max_tokens": 5, "max_completion_tokens": 7})).unwrap();
    assert_eq!(s.max_tokens, Some(7));
}

#[test]
fn bad_values_are_400_naming_the_field() {
    let cases = [
        (json!({"n": 0}), "n"),
        (json!({"n": 1_000_000_000}), "n"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": -5}), "max_tokens"),
        (json!({"temperature": -0.1}), "temperature"),
        (json!({"temperature": 1e308}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"min_p": -1}), "min_p"),
        (json!({"top_k": -2}), "top_k"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"repetition_penalty": 1e308}), "repetition_penalty"),
        (json!({"repetition_penalty": 1e-300}), "repetition_penalty"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
        (json!({"seed": 1.5}), "seed"),
        (json!({"stop": 5}), "stop"),
        (json!({"stop": ["a", 1]}), "stop"),
        (json!({"stop": vec!["x"; 17]}), "stop"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"1000": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias"),
        (json!({"logit_bias": [1]}), "logit_bias"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema.schema"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(?!a)"}}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"guided_json": "{not json"}), "guided_json"),
        (json!({"guided_json": {}, "response_format": {"type": "json_object"}}), "guided_json"),
        (json!({"response_format": "json"}), "response_format"),
        (json!({"top_logprobs": 21, "logprobs": true}), "top_logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"min_tokens": 5, "max_tokens": 2}), "min_tokens"),
        (json!({"stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"stream_options": {"include_usage": false}, "stream": false}), "stream_options"),
    ];
    for (mut body, field) in cases {
        body["messages"] = json!([]);
        assert_eq!(err_param(chat(body.clone())).as_deref(), Some(field), "{body}");
    }
}

#[test]
fn lenient_forms() {
    let s = chat(json!({"messages": [], "top_k": -1, "seed": -1, "stop": "END", "response_format": {"type": "text"},
        "stream_options": null, "max_tokens": null, "logprobs": false, "top_logprobs": 0}))
    .unwrap();
    assert_eq!((s.sampling.top_k, s.sampling.seed, s.format), (0, Some(u64::MAX), None));
    assert_eq!(s.stop, vec!["END"]);
    assert_eq!(stop(Some(&json!(["", "x"]))).unwrap(), vec!["x"]);
    // An empty stream_options asks for nothing, streamed or not (as in vLLM).
    assert!(chat(json!({"messages": [], "stream_options": {}})).is_ok());
}

#[test]
fn chat_logprob_settings() {
    assert_eq!(chat_logprobs(None, None).unwrap(), None);
    assert_eq!(chat_logprobs(Some(true), None).unwrap(), Some(0));
    assert_eq!(chat_logprobs(Some(true), Some(3)).unwrap(), Some(3));
    assert_eq!(completion_logprobs(Some(5)).unwrap(), Some(5));
    assert!(completion_logprobs(Some(-1)).is_err());
    assert!(completion_logprobs(Some(21)).is_err());
}

#[test]
fn message_contents() {
    let req: ChatRequest = serde_json::from_value(json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": []},
        {"role": "user", "name": "x", "content": "q"}
    ]}))
    .unwrap();
    let m = messages(&req.messages).unwrap();
    let got: Vec<_> = m.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
    assert_eq!(got, vec![("system", "be brief"), ("user", "a\nb"), ("assistant", ""), ("user", "q")]);

    let bad = [
        json!([]),
        json!([{"role": "user", "content": 5}]),
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        json!([{"role": "user", "content": [{"type": "text"}]}]),
        json!([{"role": "user", "content": [{"text": "a"}]}]),
        json!([{"role": "wizard", "content": "a"}]),
        json!([{"role": "user", "content": null}]),
        json!([{"role": "system"}]),
    ];
    for b in bad {
        let req: ChatRequest = serde_json::from_value(json!({ "messages": b })).unwrap();
        assert_eq!(messages(&req.messages).unwrap_err().status, axum::http::StatusCode::BAD_REQUEST, "{b}");
    }
}

#[test]
fn missing_messages_is_a_parse_error() {
    assert!(serde_json::from_value::<ChatRequest>(json!({"model": "m"})).is_err());
    assert!(serde_json::from_value::<ChatRequest>(json!({"messages": "hi"})).is_err());
    assert!(serde_json::from_value::<ChatRequest>(json!({"messages": [], "n": "2"})).is_err());
    assert!(serde_json::from_value::<CompletionRequest>(json!({"model": "m"})).is_err());
}

#[test]
fn prompt_forms() {
    let text = |s: &str| Prompt::Text(s.into());
    assert_eq!(prompts(&json!("hi"), 10).unwrap(), vec![text("hi")]);
    assert_eq!(prompts(&json!(["hi"]), 10).unwrap(), vec![text("hi")]);
    assert_eq!(prompts(&json!(["a", "b"]), 10).unwrap(), vec![text("a"), text("b")]);
    assert_eq!(prompts(&json!([1, 2, 3]), 10).unwrap(), vec![Prompt::Tokens(vec![1, 2, 3])]);
    assert_eq!(prompts(&json!([[4, 5]]), 10).unwrap(), vec![Prompt::Tokens(vec![4, 5])]);
    assert_eq!(prompts(&json!([[1], [2]]), 10).unwrap(), vec![Prompt::Tokens(vec![1]), Prompt::Tokens(vec![2])]);
    let bad = [
        json!(null),
        json!(5),
        json!([]),
        json!([1, "a"]),
        json!(["a", 1]),
        json!([10]),
        json!([-1]),
        json!([1.5]),
        json!([[1], []]),
        json!([[]]),
        json!([[1], [10]]),
        json!({"text": "a"}),
    ];
    for b in bad {
        assert_eq!(prompts(&b, 10).unwrap_err().param.as_deref(), Some("prompt"), "{b}");
    }
}
