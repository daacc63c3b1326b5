//! `POST /v1/responses` over the scripted engine.

use axum::http::StatusCode;
use serde_json::json;

use super::*;

#[tokio::test]
async fn a_response_whole_and_streamed() {
    let (fake, app) = app();
    let r =
        post(&app, "/v1/responses", json!({"input": "hello", "instructions": "the sky", "metadata": {"k": 1}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(
        (v["object"].clone(), v["status"].clone(), v["model"].clone()),
        (json!("response"), json!("completed"), json!(MODEL))
    );
    assert_eq!(v["output"].as_array().unwrap().len(), 1);
    let message = &v["output"][0];
    assert_eq!((message["type"].clone(), message["role"].clone()), (json!("message"), json!("assistant")));
    assert_eq!(
        message["content"][0],
        json!({"type": "output_text", "text": "hello world", "annotations": [], "logprobs": []})
    );
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert_eq!(v["metadata"], json!({"k": 1}));
    // The instructions came first, as a system message.
    let prompt = fake.tokenizer().decode(&fake.requests()[0].prompt, false);
    assert!(prompt.contains("the sky <|user|> hello"), "{prompt}");
    // Cut by max_output_tokens: incomplete.
    let v = post(&app, "/v1/responses", json!({"input": "hello", "max_output_tokens": 1})).await.json();
    assert_eq!(
        (v["status"].clone(), v["incomplete_details"]["reason"].clone()),
        (json!("incomplete"), json!("max_output_tokens"))
    );
    // Streamed: typed events, numbered in order, the text's deltas adding up.
    let r = post(&app, "/v1/responses", json!({"input": "hello", "stream": true})).await;
    let events: Vec<Value> = r.typed_events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert!(events.iter().enumerate().all(|(i, e)| e["sequence_number"] == i), "{events:?}");
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "hello world");
    let done = &events.last().unwrap()["response"];
    assert_eq!(
        (done["status"].clone(), done["output"][0]["content"][0]["text"].clone()),
        (json!("completed"), json!("hello world"))
    );
    assert_eq!(done["usage"]["total_tokens"], done["usage"]["input_tokens"].as_u64().unwrap() + 3);
}

#[tokio::test]
async fn calls_come_back_as_items() {
    let fake = Fake::new();
    *fake.script.lock().unwrap() = Some(vec!["[{\"name\": \"sky\", \"arguments\": {\"a\": 1}}]".into()]);
    // (A template that shows the tools briefly: the fake's context is small.)
    let src = "{% if tools %}{{ tools[0].function.name }} {% endif %}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} \
               {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
    let app = app_with(&fake, None, Some(ChatTemplate::new(src, "<s>", "</s>").unwrap()));
    let tools = json!([{"type": "function", "name": "sky", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}]);
    let body = json!({"input": "hello", "tools": tools, "tool_choice": "required"});
    let v = post(&app, "/v1/responses", body.clone()).await.json();
    let call = &v["output"][0];
    assert_eq!(
        (call["type"].clone(), call["name"].clone(), call["arguments"].clone()),
        (json!("function_call"), json!("sky"), json!("{\"a\":1}"))
    );
    assert!(fake.requests()[0].format.is_some());
    let mut stream = body;
    stream["stream"] = json!(true);
    let r = post(&app, "/v1/responses", stream).await;
    let events: Vec<Value> = r.typed_events();
    let args = events.iter().find(|e| e["type"] == "response.function_call_arguments.done").unwrap();
    assert_eq!(args["arguments"], "{\"a\":1}");
    assert_eq!(events.last().unwrap()["response"]["output"][0]["name"], "sky");
    // A conversation with a call and its output goes to the template as chat messages.
    let input = json!([{"role": "user", "content": "hello"}, {"type": "function_call", "call_id": "c1", "name": "sky",
        "arguments": "{}"}, {"type": "function_call_output", "call_id": "c1", "output": "is"}]);
    let r = post(&app, "/v1/responses", json!({"input": input, "tools": tools})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = post(&app, "/v1/responses", json!({"input": "x", "previous_response_id": "resp_1"})).await;
    assert_eq!((r.status, r.error()["param"].clone()), (StatusCode::BAD_REQUEST, json!("previous_response_id")));
}

#[tokio::test]
async fn a_failure_mid_stream_ends_in_response_failed() {
    let (fake, app) = app();
    fake.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let call = tokio::spawn({
        let app = app.clone();
        async move { post(&app, "/v1/responses", json!({"input": "hello", "stream": true})).await }
    });
    while fake.requests().is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Shutting down cancels the request: the stream ends failed, its open message closed.
    fake.shutdown();
    let events = call.await.unwrap().typed_events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[kinds.len() - 5..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "error",
            "response.failed"
        ]
    );
    assert!(events.iter().enumerate().all(|(i, e)| e["sequence_number"] == i), "{events:?}");
    let failed = &events.last().unwrap()["response"];
    assert_eq!(
        (failed["status"].clone(), failed["output"][0]["status"].clone()),
        (json!("failed"), json!("incomplete"))
    );
    assert!(failed["error"]["message"].as_str().unwrap().contains("shutting down"));
}

#[tokio::test]
async fn logprobs_whole_and_streamed() {
    let (_, app) = app();
    let body = json!({"input": "hello", "include": ["message.output_text.logprobs"], "top_logprobs": 2});
    let v = post(&app, "/v1/responses", body.clone()).await.json();
    let whole = v["output"][0]["content"][0]["logprobs"].clone();
    let tokens: Vec<&str> = whole.as_array().unwrap().iter().map(|t| t["token"].as_str().unwrap()).collect();
    assert_eq!(tokens, ["hello", "wor", "ld"], "{whole}");
    assert_eq!((whole[0]["logprob"].clone(), whole[0]["bytes"].clone()), (json!(-0.5), json!(b"hello".to_vec())));
    let top: Vec<&str> =
        whole[0]["top_logprobs"].as_array().unwrap().iter().map(|t| t["token"].as_str().unwrap()).collect();
    assert_eq!(top, ["the", "a"]);
    assert_eq!(v["top_logprobs"], 2);
    // Streamed: the deltas' logprobs add up to the done event's and the item's
    // (tokens that showed no text go on the done event only).
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = post(&app, "/v1/responses", streamed).await.typed_events();
    let of = |kind: &str| events.iter().filter(|e| e["type"] == kind).cloned().collect::<Vec<Value>>();
    let deltas: Vec<Value> =
        of("response.output_text.delta").iter().flat_map(|e| e["logprobs"].as_array().unwrap().clone()).collect();
    assert_eq!(json!(deltas), whole);
    assert_eq!(of("response.output_text.done")[0]["logprobs"], whole);
    assert_eq!(of("response.completed")[0]["response"]["output"][0]["content"][0]["logprobs"], whole);
    // Without asking: none.
    let v = post(&app, "/v1/responses", json!({"input": "hello"})).await.json();
    assert_eq!(v["output"][0]["content"][0]["logprobs"], json!([]));
}

#[tokio::test]
async fn truncation_auto_drops_the_oldest_turns() {
    let (fake, app) = app();
    // Six turns of ten words and more: past the fake's context of 64 tokens.
    let turn = |i: usize| {
        let role = if i.is_multiple_of(2) { "user" } else { "assistant" };
        json!({"role": role, "content": format!("{} a a a a a a a a a", ["the", "sky", "is", "a", "hello", "sky"][i])})
    };
    let input: Vec<Value> = (0..6).map(turn).collect();
    let body = json!({"input": input, "instructions": "is", "max_output_tokens": 3});
    let r = post(&app, "/v1/responses", body.clone()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let mut auto = body;
    auto["truncation"] = json!("auto");
    let r = post(&app, "/v1/responses", auto).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["truncation"], "auto");
    let req = fake.requests().pop().unwrap();
    assert!(req.prompt.len() + 3 <= MAX_CONTEXT, "{}", req.prompt.len());
    let prompt = fake.tokenizer().decode(&req.prompt, false);
    // The instructions (the system turn, its tag unknown to the fake's
    // words) and the latest turns stay; the oldest user turn and its answer went.
    let kept =
        (2..6).map(|i| format!("<|{}|> {}", turn(i)["role"].as_str().unwrap(), turn(i)["content"].as_str().unwrap()));
    let expected = format!("<s> <unk> <unk> <unk> is {} <|assistant|>", kept.collect::<Vec<_>>().join(" "));
    assert_eq!(prompt, expected);
    // Of a longer conversation, the fewest turns go: the turns kept fit,
    // and one more would not.
    let short = |i: usize| json!({"role": if i.is_multiple_of(2) { "user" } else { "assistant" }, "content": "a a"});
    let input: Vec<Value> = (0..40).map(short).collect();
    let body = |from: usize, auto: bool| json!({"input": input[from..], "max_output_tokens": 3, "truncation": if auto { "auto" } else { "disabled" }});
    assert_eq!(post(&app, "/v1/responses", body(0, true)).await.status, StatusCode::OK);
    let prompt = fake.tokenizer().decode(&fake.requests().pop().unwrap().prompt, false);
    let kept = prompt.matches("<|user|>").count();
    assert!((2..20).contains(&kept), "{prompt}");
    let first = 40 - 2 * kept;
    assert_eq!(post(&app, "/v1/responses", body(first, false)).await.status, StatusCode::OK);
    assert_eq!(post(&app, "/v1/responses", body(first - 2, false)).await.status, StatusCode::BAD_REQUEST);
}
