//! SSE responses, and cancellation when the client goes away.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use super::*;

fn parse(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect()
}

#[tokio::test]
async fn chat_stream() {
    let (_, app) = app();
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "stream": true,
        "stream_options": {"include_usage": true}});
    let r = post(&app, "/v1/chat/completions", body).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let chunks = parse(&r.events());
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    assert!(chunks.iter().all(|c| c["id"] == id && c["object"] == "chat.completion.chunk" && c["model"] == MODEL));
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "hello world");
    // role, "hello", " world" (the held token sends nothing), finish, usage
    assert_eq!(chunks.len(), 5);
    let finish = &chunks[3]["choices"][0];
    assert_eq!((finish["delta"].clone(), finish["finish_reason"].as_str()), (json!({}), Some("stop")));
    assert_eq!(chunks[4]["choices"], json!([]));
    assert_eq!(chunks[4]["usage"]["total_tokens"], 7);
    // The others carry `"usage": null`, as OpenAI's do.
    assert!(chunks[..4].iter().all(|c| c.get("usage") == Some(&Value::Null)), "{chunks:?}");
}

#[tokio::test]
async fn chat_stream_logprobs_follow_held_tokens() {
    let (_, app) = app();
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "stream": true, "logprobs": true});
    let chunks = parse(&post(&app, "/v1/chat/completions", body).await.events());
    let per_chunk: Vec<usize> =
        chunks[1..].iter().map(|c| c["choices"][0]["logprobs"]["content"].as_array().map_or(0, Vec::len)).collect();
    // "hello" with its token; " world" with the held token and its own; the finish chunk with none.
    assert_eq!(per_chunk, vec![1, 2, 0]);
    assert!(chunks[3]["choices"][0]["logprobs"].is_null());
    // Without include_usage, no chunk has a usage field.
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn chat_stream_n() {
    let (_, app) = app();
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "stream": true, "n": 3});
    let chunks = parse(&post(&app, "/v1/chat/completions", body).await.events());
    for i in 0..3 {
        let mine: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]).filter(|c| c["index"] == i).collect();
        let text: String = mine.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
        assert_eq!(text, "hello world");
        assert_eq!(mine.iter().filter(|c| c["finish_reason"] == "stop").count(), 1);
    }
}

#[tokio::test]
async fn completion_stream() {
    let (_, app) = app();
    let body = json!({"prompt": "the sky", "stream": true, "max_tokens": 3, "logprobs": 0,
        "stream_options": {"include_usage": true}});
    let chunks = parse(&post(&app, "/v1/completions", body).await.events());
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, "hello world");
    assert_eq!(chunks[1]["choices"][0]["logprobs"]["text_offset"], json!([5, 8]));
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[3]["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn dropping_a_stream_cancels_its_requests() {
    let (fake, app) = app();
    fake.hang.store(true, Ordering::SeqCst);
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "stream": true, "n": 2});
    let res = app.clone().oneshot(request(Method::POST, "/v1/chat/completions", Some(&body), &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut data = res.into_body().into_data_stream();
    let first = data.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("assistant"));
    assert_eq!(fake.live.load(Ordering::SeqCst), 2);
    drop(data);
    assert_eq!(fake.live.load(Ordering::SeqCst), 0);
    let metrics = get(&app, "/metrics").await.text();
    assert!(metrics.contains("ferrite_requests_finished_total{finish_reason=\"cancelled\"} 2\n"), "{metrics}");
}

#[tokio::test]
async fn dropping_a_waiting_request_cancels_it() {
    let (fake, app) = app();
    fake.hang.store(true, Ordering::SeqCst);
    let body = json!({"prompt": "a"});
    let call = app.clone().oneshot(request(Method::POST, "/v1/completions", Some(&body), &[]));
    assert!(tokio::time::timeout(Duration::from_millis(50), call).await.is_err());
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(fake.live.load(Ordering::SeqCst), 0);
}
