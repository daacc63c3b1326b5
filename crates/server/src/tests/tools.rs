//! Function calling through /v1/chat/completions, over scripted replies.

use axum::http::StatusCode;
use serde_json::json;

use super::*;

/// A template that shows the tools' names, briefly (the fake's context is small;
/// its vocabulary has "sky" and "is").
fn tool_template() -> ChatTemplate {
    let src = "{{ bos_token }}{% if tools %}<|user|> {% for t in tools %}{{ t.function.name }} {% endfor %}{% endif %}\
               {% for m in messages %}<|{{ m.role }}|> {{ m.content }} \
               {% for c in m.tool_calls %}{{ c.function.name }} {{ c.function.arguments.a }} {% endfor %}{% endfor %}\
               {% if add_generation_prompt %}<|assistant|>{% endif %}";
    ChatTemplate::new(src, "<s>", "</s>").unwrap()
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "sky", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])
}

fn scripted(texts: &[&str]) -> (Arc<Fake>, Router) {
    let fake = Fake::new();
    *fake.script.lock().unwrap() = Some(texts.iter().map(|t| t.to_string()).collect());
    let app = app_with(&fake, None, Some(tool_template()));
    (fake, app)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hello"}], "tools": tools()});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

const CALL: [&str; 3] =
    ["Sure.", "<tool_call>{\"name\": \"sky\", ", "\"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>"];

#[tokio::test]
async fn an_auto_reply_with_a_call() {
    let (fake, app) = scripted(&CALL);
    let r = post(&app, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["content"], "Sure.");
    let call = &message["tool_calls"][0];
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!((call["type"].clone(), call["function"]["name"].clone()), (json!("function"), json!("sky")));
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"a": 1, "b": 2}));
    assert!(call.get("index").is_none());
    // The template saw the tools; `auto` does not constrain the reply.
    let req = &fake.requests()[0];
    let prompt = fake.tokenizer().decode(&req.prompt, false);
    assert!(prompt.contains("sky"), "{prompt}");
    assert!(req.format.is_none());
    // A reply with no call is plain content, finishing as the engine says.
    let (_, app) = scripted(&["no", " call"]);
    let r = post(&app, "/v1/chat/completions", chat(json!({}))).await;
    let choice = &r.json()["choices"][0];
    assert_eq!(
        (choice["message"]["content"].clone(), choice["finish_reason"].clone()),
        (json!("no call"), json!("stop"))
    );
    assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
}

#[tokio::test]
async fn a_streamed_call() {
    let (_, app) = scripted(&CALL);
    let r = post(&app, "/v1/chat/completions", chat(json!({"stream": true}))).await;
    let events = r.events();
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    let text: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!(text, "Sure.");
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
    assert_eq!(calls.len(), 1, "{chunks:?}");
    let call = &calls[0][0];
    assert_eq!((call["index"].clone(), call["function"]["name"].clone()), (json!(0), json!("sky")));
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["type"], "function");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"a": 1, "b": 2}));
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!((last["finish_reason"].clone(), last["delta"].clone()), (json!("tool_calls"), json!({})));
    // n = 2: each choice's call, in its own chunks.
    let r = post(&app, "/v1/chat/completions", chat(json!({"stream": true, "n": 2}))).await;
    let events = r.events();
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    for index in 0..2 {
        let mine: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]).filter(|c| c["index"] == index).collect();
        let calls = mine.iter().filter(|c| c["delta"].get("tool_calls").is_some()).count();
        let text: String = mine.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
        assert_eq!((calls, text.as_str()), (1, "Sure."), "choice {index}: {chunks:?}");
        assert_eq!(mine.last().unwrap()["finish_reason"], "tool_calls");
    }
}

#[tokio::test]
async fn required_and_named_choices_constrain_the_reply() {
    let (fake, app) = scripted(&["[{\"name\": \"sky\", \"arguments\": {\"a\": 4, \"b\": 5}}]"]);
    let r = post(&app, "/v1/chat/completions", chat(json!({"tool_choice": "required"}))).await;
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\":4,\"b\":5}");
    assert!(fake.requests()[0].format.is_some());
    let (fake, app) = scripted(&["{\"a\": 4, ", "\"b\": 5}"]);
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "sky"}}, "stream": true});
    let r = post(&app, "/v1/chat/completions", chat(named)).await;
    let events = r.events();
    assert!(events.iter().all(|e| !e.contains("\"content\":\"{")), "{events:?}");
    let call = events.iter().find(|e| e.contains("tool_calls")).unwrap();
    assert!(call.contains(r#""name":"sky","arguments":"{\"a\":4,\"b\":5}""#), "{call}");
    assert!(fake.requests()[0].format.is_some());
    // "none": the tools are not shown and the reply is content.
    let (fake, app) = scripted(&["{\"a\": 4}"]);
    let r = post(&app, "/v1/chat/completions", chat(json!({"tool_choice": "none"}))).await;
    assert_eq!(r.json()["choices"][0]["message"]["content"], "{\"a\": 4}");
    let prompt = fake.tokenizer().decode(&fake.requests()[0].prompt, false);
    assert!(!prompt.contains("sky"), "{prompt}");
}

#[tokio::test]
async fn a_conversation_with_calls_and_results() {
    let (fake, app) = scripted(&["3"]);
    let messages = json!([
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "sky", "arguments": "{\"a\": \"is\", \"b\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    ]);
    let r = post(&app, "/v1/chat/completions", chat(json!({"messages": messages}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // The template got the call with its arguments as an object.
    let prompt = fake.tokenizer().decode(&fake.requests()[0].prompt, false);
    assert!(prompt.contains("sky is"), "{prompt}");
}

#[tokio::test]
async fn bad_tool_requests_are_400() {
    let (_, app) = scripted(&CALL);
    for (extra, param) in [
        (json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}), "tools[0]"),
        (json!({"tools": {"sky": 1}}), "tools"),
        (json!({"tool_choice": {"type": "function", "function": {"name": "sub"}}}), "tool_choice"),
        (json!({"tool_choice": "required", "response_format": {"type": "json_object"}}), "tool_choice"),
        (json!({"tools": [], "tool_choice": "required"}), "tool_choice"),
        (json!({"messages": [{"role": "assistant", "tool_calls": {"x": 1}}]}), "messages[0].tool_calls"),
        (json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}), "messages[0].tool_calls"),
    ] {
        let r = post(&app, "/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{extra}: {}", r.text());
        assert_eq!(r.error()["param"], param, "{extra}");
    }
}

#[tokio::test]
async fn tokenize_counts_the_prompt_with_tools() {
    let (fake, app) = scripted(&["x"]);
    let messages = json!([{"role": "user", "content": "hello"}]);
    let with = post(&app, "/tokenize", json!({"messages": messages, "tools": tools()})).await.json();
    post(&app, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(with["tokens"], json!(fake.requests()[0].prompt));
    let without = post(&app, "/tokenize", json!({"messages": messages})).await.json();
    assert!(without["count"].as_u64() < with["count"].as_u64(), "{without} {with}");
}
