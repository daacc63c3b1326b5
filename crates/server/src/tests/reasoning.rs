//! Think blocks apart from the answer, and `chat_template_kwargs`.

use axum::http::StatusCode;
use serde_json::json;

use super::*;

/// A template with think blocks that opens one unless `enable_thinking` is
/// false (the fake's vocabulary has "sky" and "is").
fn thinking_template() -> ChatTemplate {
    let src =
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.reasoning_content }} {{ m.content }} {% endfor %}\
               {% if add_generation_prompt %}<|assistant|>{% if enable_thinking is false %} sky is \
               {% endif %}{% endif %}{# </think> #}";
    ChatTemplate::new(src, "<s>", "</s>").unwrap()
}

fn scripted(texts: &[&str], reasoning: bool) -> (Arc<Fake>, Router) {
    let fake = Fake::new();
    *fake.script.lock().unwrap() = Some(texts.iter().map(|t| t.to_string()).collect());
    let mut state = AppState::new(Served::Generator(fake.clone()), MODEL.into(), None, Some(thinking_template()));
    if !reasoning {
        state = state.without_reasoning();
    }
    (fake, crate::router::router(state))
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hello"}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

const THOUGHT: [&str; 5] = ["<think>", "\nHmm", ", yes.\n", "</think>\n\n", "The sky."];

#[tokio::test]
async fn reasoning_comes_apart_from_the_answer() {
    let (_, app) = scripted(&THOUGHT, true);
    let r = post(&app, "/v1/chat/completions", chat(json!({}))).await;
    let message = &r.json()["choices"][0]["message"];
    assert_eq!(
        (message["reasoning_content"].clone(), message["content"].clone()),
        (json!("Hmm, yes."), json!("The sky."))
    );
    // Streamed: reasoning deltas, then content deltas, adding up to the same.
    let r = post(&app, "/v1/chat/completions", chat(json!({"stream": true}))).await;
    let events = r.events();
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let part = |key: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][key].as_str()).collect() };
    assert_eq!((part("reasoning_content"), part("content")), ("Hmm, yes.".to_string(), "The sky.".to_string()));
    let first_content = chunks.iter().position(|c| c["choices"][0]["delta"]["content"] == "The sky.").unwrap();
    assert!(chunks[first_content..].iter().all(|c| c["choices"][0]["delta"].get("reasoning_content").is_none()));
    // `--reasoning-format none`, or a constrained reply: all content.
    let (_, app) = scripted(&THOUGHT, false);
    let r = post(&app, "/v1/chat/completions", chat(json!({}))).await;
    let message = &r.json()["choices"][0]["message"];
    assert_eq!(message["content"], THOUGHT.concat());
    assert!(message.get("reasoning_content").is_none(), "{message}");
    let (_, app) = scripted(&THOUGHT, true);
    let r = post(&app, "/v1/chat/completions", chat(json!({"guided_regex": ".*"}))).await;
    assert!(r.json()["choices"][0]["message"].get("reasoning_content").is_none());
    // `include_reasoning: false` leaves it out.
    for stream in [false, true] {
        let r = post(&app, "/v1/chat/completions", chat(json!({"include_reasoning": false, "stream": stream}))).await;
        assert!(!r.text().contains("reasoning_content") && !r.text().contains("Hmm"), "{}", r.text());
        assert!(r.text().contains("The sky."), "{}", r.text());
    }
    // A plain reply has no reasoning.
    let (_, app) = scripted(&["The", " sky."], true);
    let r = post(&app, "/v1/chat/completions", chat(json!({}))).await;
    let message = &r.json()["choices"][0]["message"];
    assert_eq!(message["content"], "The sky.");
    assert!(message.get("reasoning_content").is_none(), "{message}");
}

#[tokio::test]
async fn chat_template_kwargs_reach_the_template() {
    let (fake, app) = scripted(&["ok"], true);
    let plain = post(&app, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(plain.status, StatusCode::OK);
    let off = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let r = post(&app, "/v1/chat/completions", chat(off.clone())).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let prompts: Vec<String> = fake.requests().iter().map(|q| fake.tokenizer().decode(&q.prompt, false)).collect();
    assert!(!prompts[0].contains("sky is") && prompts[1].ends_with("sky is"), "{prompts:?}");
    // /tokenize counts the same prompt.
    let mut body = off.clone();
    body["messages"] = json!([{"role": "user", "content": "hello"}]);
    let t = post(&app, "/tokenize", body).await.json();
    assert_eq!(t["tokens"], json!(fake.requests()[1].prompt));
    // An assistant's reasoning sent back reaches the template.
    let messages = json!([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "a",
        "reasoning_content": "wor"}, {"role": "user", "content": "hello"}]);
    post(&app, "/v1/chat/completions", chat(json!({"messages": messages}))).await;
    let prompt = fake.tokenizer().decode(&fake.requests().last().unwrap().prompt, false);
    assert!(prompt.contains("wor a"), "{prompt}");
    for bad in [json!({"chat_template_kwargs": [1]}), json!({"chat_template_kwargs": {"messages": []}})] {
        let r = post(&app, "/v1/chat/completions", chat(bad.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.error()["param"], "chat_template_kwargs");
    }
}
