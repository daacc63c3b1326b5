//! Every failure is an OpenAI-shaped error with the right status, whatever the input.

use std::sync::atomic::Ordering;

use axum::http::{Method, StatusCode};
use serde_json::json;

use super::*;

fn raw(path: &str, content_type: Option<&str>, body: &str) -> HttpRequest<Body> {
    let mut b = HttpRequest::builder().method(Method::POST).uri(path);
    if let Some(ct) = content_type {
        b = b.header("content-type", ct);
    }
    b.body(Body::from(body.to_string())).unwrap()
}

#[tokio::test]
async fn malformed_bodies_are_400() {
    let (_, app) = app();
    let cases = [
        (Some("application/json"), "{not json"),
        (Some("application/json"), ""),
        (Some("application/json"), "[]"),
        (Some("application/json"), r#"{"model": "tiny"}"#),
        (Some("application/json"), r#"{"messages": "hi"}"#),
        (Some("application/json"), r#"{"messages": [{"content": "hi"}]}"#),
        (Some("application/json"), r#"{"messages": [], "n": "2"}"#),
        (Some("text/plain"), r#"{"messages": [{"role": "user", "content": "hi"}]}"#),
        (None, r#"{"messages": [{"role": "user", "content": "hi"}]}"#),
    ];
    for (ct, body) in cases {
        for path in ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"] {
            let r = send(&app, raw(path, ct, body)).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path} {ct:?} {body}");
            assert_eq!(r.error()["type"], "invalid_request_error");
        }
    }
}

#[tokio::test]
async fn bad_values_are_400() {
    let (fake, app) = app();
    let msgs = json!([{"role": "user", "content": "hello"}]);
    let chat = [
        json!({"n": 1_000_000_000}),
        json!({"n": 0}),
        json!({"max_tokens": 0}),
        json!({"max_tokens": -1}),
        json!({"temperature": -1}),
        json!({"top_p": 2}),
        json!({"logprobs": true, "top_logprobs": 50}),
        json!({"response_format": {"type": "json_schema", "json_schema": {}}}),
        json!({"tools": [{"type": "function", "function": {"name": "f g"}}]}),
        json!({"messages": []}),
        json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        json!({"seed": 1e300}),
        json!({"max_tokens": 1e300}),
        json!({"logit_bias": {"99999999999": 1}}),
    ];
    for mut body in chat {
        if body.get("messages").is_none() {
            body["messages"] = msgs.clone();
        }
        let r = post(&app, "/v1/chat/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
        r.error();
    }
    let completions = [
        json!({"prompt": "a", "echo": true, "max_tokens": -1}),
        json!({"prompt": "a", "suffix": "b"}),
        json!({"prompt": "a", "best_of": 3}),
        json!({"prompt": ["a", 5]}),
        json!({"prompt": [100000]}),
        json!({"prompt": "a", "logprobs": 100}),
    ];
    for body in completions {
        let r = post(&app, "/v1/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
        r.error();
    }
    assert!(fake.requests().iter().all(|r| !r.prompt.is_empty()));
}

#[tokio::test]
async fn context_overflow_is_400_with_the_engine_message() {
    let (_, app) = app();
    let r = post(&app, "/v1/completions", json!({"prompt": "the sky", "max_tokens": 1000})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error()["message"].as_str().unwrap().contains("context holds"), "{}", r.text());
    // Without max_tokens, a prompt that fills the context is refused the same way.
    let long = vec![8; MAX_CONTEXT];
    let r = post(&app, "/v1/completions", json!({"prompt": long})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error()["message"].as_str().unwrap().contains("context holds"));
}

#[tokio::test]
async fn unknown_model_is_404() {
    let (_, app) = app();
    for (path, body) in [
        ("/v1/chat/completions", json!({"model": "gpt-4", "messages": [{"role": "user", "content": "a"}]})),
        ("/v1/completions", json!({"model": "gpt-4", "prompt": "a"})),
    ] {
        let r = post(&app, path, body).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        let e = r.error();
        assert_eq!((e["code"].as_str(), e["param"].as_str()), (Some("model_not_found"), Some("model")));
    }
}

#[tokio::test]
async fn busy_is_429() {
    let (fake, app) = app();
    fake.busy.store(true, Ordering::SeqCst);
    let r = post(&app, "/v1/completions", json!({"prompt": "a", "n": 3})).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    r.error();
    // More choices than the queue ever holds: no retry can help, so a 400.
    fake.busy.store(false, Ordering::SeqCst);
    let r = post(&app, "/v1/completions", json!({"prompt": "a", "n": MAX_WAITING + 1})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error()["param"], "n");
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json() {
    let (_, app) = app();
    let r = get(&app, "/v1/nothing").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error()["code"], "not_found");
    let r = get(&app, "/v1/chat/completions").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    r.error();
}

#[tokio::test]
async fn chat_without_template_is_400() {
    let fake = Fake::new();
    let app = app_with(&fake, None, None);
    let r = post(&app, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "a"}]})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error()["message"].as_str().unwrap().contains("chat template"));
    // Completions still work.
    assert_eq!(post(&app, "/v1/completions", json!({"prompt": "a"})).await.status, StatusCode::OK);
}

#[tokio::test]
async fn template_errors_are_400() {
    let fake = Fake::new();
    let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "<s>", "</s>").unwrap();
    let app = app_with(&fake, None, Some(t));
    let r = post(&app, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "a"}]})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error()["message"].as_str().unwrap().contains("roles must alternate"));
}
