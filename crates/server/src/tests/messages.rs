//! `POST /v1/messages` (Anthropic's API) over the scripted engine.

use axum::http::StatusCode;
use serde_json::json;

use super::*;

#[tokio::test]
async fn a_message_whole_and_streamed() {
    let (fake, app) = app();
    let body = json!({"model": MODEL, "max_tokens": 10, "system": "the sky", "messages": [{"role": "user", "content": "hello"}]});
    let r = post(&app, "/v1/messages", body.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (v["type"].clone(), v["role"].clone(), v["stop_reason"].clone()),
        (json!("message"), json!("assistant"), json!("end_turn"))
    );
    assert_eq!(v["content"], json!([{"type": "text", "text": "hello world"}]));
    assert_eq!(v["usage"]["output_tokens"], 3);
    let prompt = fake.tokenizer().decode(&fake.requests()[0].prompt, false);
    assert!(prompt.contains("the sky <|user|> hello"), "{prompt}");
    // Cut by max_tokens.
    let mut cut = body.clone();
    cut["max_tokens"] = json!(1);
    assert_eq!(post(&app, "/v1/messages", cut).await.json()["stop_reason"], "max_tokens");
    // Any model name is served and echoed; max_tokens past the context is cut to its room.
    let mut other = body.clone();
    other["model"] = json!("claude-some-model");
    other["max_tokens"] = json!(64000);
    let r = post(&app, "/v1/messages", other).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["model"], "claude-some-model");
    assert!(fake.requests().last().unwrap().max_tokens < MAX_CONTEXT);
    // Errors in Anthropic's shape.
    let r = post(&app, "/v1/messages", json!({"messages": []})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        (r.json()["type"].clone(), r.json()["error"]["type"].clone()),
        (json!("error"), json!("invalid_request_error"))
    );
    // Streamed: Anthropic's typed events.
    let mut stream = body;
    stream["stream"] = json!(true);
    let events = post(&app, "/v1/messages", stream).await.typed_events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let text: String = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
    assert_eq!(text, "hello world");
    assert_eq!(events[6]["delta"]["stop_reason"], "end_turn");
    assert_eq!(events[6]["usage"]["output_tokens"], 3);
    assert!(events[0]["message"]["usage"]["input_tokens"].as_u64().unwrap() > 0);
    // count_tokens: the prompt's length, as the request renders it.
    let body = json!({"model": MODEL, "system": "the sky", "messages": [{"role": "user", "content": "hello"}]});
    let counted = post(&app, "/v1/messages/count_tokens", body).await.json();
    assert_eq!(counted["input_tokens"], json!(fake.requests()[0].prompt.len()));
}

#[tokio::test]
async fn tool_uses_and_the_api_key_header() {
    let fake = Fake::new();
    *fake.script.lock().unwrap() = Some(vec!["[{\"name\": \"sky\", \"arguments\": {\"a\": 1}}]".into()]);
    let src = "{% if tools %}{{ tools[0].function.name }} {% endif %}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} \
               {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
    let app = app_with(&fake, Some("k"), Some(ChatTemplate::new(src, "<s>", "</s>").unwrap()));
    let body = json!({"max_tokens": 20, "messages": [{"role": "user", "content": "hello"}], "tools": [{"name": "sky",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}], "tool_choice": {"type": "any"}});
    let unauthorized = post(&app, "/v1/messages", body.clone()).await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    assert_eq!(unauthorized.json()["error"]["type"], "authentication_error");
    let req = request(Method::POST, "/v1/messages", Some(&body), &[("x-api-key", "k")]);
    let v = send(&app, req).await.json();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        (v["content"][0]["type"].clone(), v["content"][0]["name"].clone(), v["content"][0]["input"].clone()),
        (json!("tool_use"), json!("sky"), json!({"a": 1}))
    );
    let mut stream = body;
    stream["stream"] = json!(true);
    let events =
        send(&app, request(Method::POST, "/v1/messages", Some(&stream), &[("x-api-key", "k")])).await.typed_events();
    let start = events.iter().find(|e| e["type"] == "content_block_start").unwrap();
    assert_eq!((start["content_block"]["type"].clone(), start["index"].clone()), (json!("tool_use"), json!(0)));
    let args: String = events.iter().filter_map(|e| e["delta"]["partial_json"].as_str()).collect();
    assert_eq!(args, "{\"a\":1}");
    assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "tool_use");
}
