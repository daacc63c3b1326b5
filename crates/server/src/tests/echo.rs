//! `echo` on /v1/completions: the prompt leads the text and, with
//! `logprobs`, the token lists (its first token's entries null), plain and
//! streamed; `max_tokens` 0 returns the prompt alone. vLLM's `echo` on chat.

use serde_json::{json, Value};

use super::*;

#[tokio::test]
async fn echo_leads_text_and_logprobs() {
    let (fake, app) = app();
    let r = post(&app, "/v1/completions", json!({"prompt": "the sky", "echo": true, "logprobs": 1})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    assert_eq!(c["text"], "the skyhello world");
    let lp = &c["logprobs"];
    // BOS, "the", "sky", then the three generated tokens.
    assert_eq!(lp["tokens"], json!(["<s>", "the", "sky", "hello", "wor", "ld"]));
    assert_eq!(lp["token_logprobs"], json!([null, -2.0, -2.0, -0.5, -0.5, -0.5]));
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    assert_eq!(lp["top_logprobs"][1], json!({"the": -1.0}));
    assert_eq!(lp["text_offset"], json!([0, 3, 6, 9, 14, 17]));
    assert_eq!(fake.requests()[0].prompt_logprobs, Some(1));

    // Without logprobs the prompt is echoed but not scored.
    let r = post(&app, "/v1/completions", json!({"prompt": [8, 10], "echo": true, "n": 2})).await;
    let v = r.json();
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["text"], "the skyhello world");
        assert!(c["logprobs"].is_null());
    }
    assert_eq!(fake.requests()[1].prompt_logprobs, None);
}

#[tokio::test]
async fn echo_with_max_tokens_zero_is_the_prompt_alone() {
    let (fake, app) = app();
    let body = json!({"prompt": ["the sky", "a"], "echo": true, "logprobs": 0, "max_tokens": 0});
    let r = post(&app, "/v1/completions", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], "the sky");
    assert_eq!(v["choices"][0]["logprobs"]["token_logprobs"], json!([null, -2.0, -2.0]));
    // logprobs 0: only the token's own entry.
    assert_eq!(v["choices"][0]["logprobs"]["top_logprobs"], json!([null, {"the": -2.0}, {"sky": -2.0}]));
    assert_eq!((&v["choices"][1]["text"], &v["choices"][1]["finish_reason"]), (&json!("a"), &json!("length")));
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert!(fake.requests().iter().all(|r| r.max_tokens == 0));
    // max_tokens 0 without echo stays an error, and so does min_tokens over it.
    for body in [
        json!({"prompt": "a", "max_tokens": 0}),
        json!({"prompt": "a", "max_tokens": 0, "echo": true, "min_tokens": 1}),
    ] {
        let r = post(&app, "/v1/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
        assert!(r.error()["message"].as_str().unwrap().contains('0'), "{body}: {}", r.text());
    }
}

#[tokio::test]
async fn streamed_echo_comes_first() {
    let (_, app) = app();
    for logprobs in [json!(null), json!(2)] {
        let body = json!({"prompt": "the sky", "echo": true, "stream": true, "logprobs": logprobs, "n": 2});
        let r = post(&app, "/v1/completions", body).await;
        let events = r.events();
        let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        for index in 0..2 {
            let mine: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]).filter(|c| c["index"] == index).collect();
            assert_eq!(mine[0]["text"], "the sky", "{events:?}");
            let text: String = mine.iter().map(|c| c["text"].as_str().unwrap()).collect();
            assert_eq!(text, "the skyhello world");
            if logprobs.is_null() {
                assert!(mine.iter().all(|c| c["logprobs"].is_null()));
            } else {
                assert_eq!(mine[0]["logprobs"]["token_logprobs"], json!([null, -2.0, -2.0]));
                // The generated tokens' offsets go on from the prompt's.
                assert_eq!(mine[1]["logprobs"]["text_offset"][0], 9);
            }
        }
    }
}

/// vLLM's `prompt_logprobs`: per prompt token after the first, the token's
/// logprob and rank, then the most likely others; on completions each
/// choice's, on chat the response's; not with `stream`.
#[tokio::test]
async fn prompt_logprobs_as_vllm_lists_them() {
    let (fake, app) = app();
    let body = json!({"prompt": "the sky", "prompt_logprobs": 1, "max_tokens": 1});
    let r = post(&app, "/v1/completions", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let want = json!([
        null,
        {"8": {"logprob": -2.0, "rank": 3, "decoded_token": "the"}},
        {"10": {"logprob": -2.0, "rank": 3, "decoded_token": "sky"},
         "8": {"logprob": -1.0, "rank": 1, "decoded_token": "the"}}
    ]);
    assert_eq!(v["choices"][0]["prompt_logprobs"], want);
    assert_eq!(v["choices"][0]["text"], "hello");
    assert_eq!(fake.requests()[0].prompt_logprobs, Some(1));
    // Echo's alternatives and prompt_logprobs' differ in number: scored once, with the more.
    let body = json!({"prompt": "the sky", "prompt_logprobs": 0, "echo": true, "logprobs": 2, "max_tokens": 1});
    let v = post(&app, "/v1/completions", body).await.json();
    assert_eq!(fake.requests()[1].prompt_logprobs, Some(2));
    assert_eq!(v["choices"][0]["prompt_logprobs"][1].as_object().unwrap().len(), 1);
    assert_eq!(v["choices"][0]["logprobs"]["top_logprobs"][1].as_object().unwrap().len(), 2);
    // n choices of one prompt: scored once, by the first, listed for each.
    let body = json!({"prompt": ["the sky", "a"], "prompt_logprobs": 1, "echo": true, "logprobs": 1, "n": 2});
    let v = post(&app, "/v1/completions", body).await.json();
    let asked: Vec<Option<usize>> = fake.requests()[2..6].iter().map(|r| r.prompt_logprobs).collect();
    assert_eq!(asked, [Some(1), None, Some(1), None]);
    let c = v["choices"].as_array().unwrap();
    assert_eq!((&c[1]["prompt_logprobs"], &c[1]["logprobs"]), (&c[0]["prompt_logprobs"], &c[0]["logprobs"]));
    assert_eq!(c[3]["logprobs"]["token_logprobs"], json!([null, -2.0, -0.5, -0.5, -0.5]));
    // Not asked for: no field.
    let v = post(&app, "/v1/completions", json!({"prompt": "the sky", "max_tokens": 1})).await.json();
    assert!(v["choices"][0].get("prompt_logprobs").is_none());

    let msgs = json!([{"role": "user", "content": "the sky"}]);
    let v = post(&app, "/v1/chat/completions", json!({"messages": msgs, "prompt_logprobs": 0, "n": 2})).await.json();
    let p = v["prompt_logprobs"].as_array().unwrap();
    assert!(p[0].is_null() && p.len() == fake.requests()[7].prompt.len(), "{v}");

    for (path, body) in [
        ("/v1/completions", json!({"prompt": "a", "prompt_logprobs": 1, "stream": true})),
        ("/v1/completions", json!({"prompt": "a", "prompt_logprobs": 21})),
        ("/v1/chat/completions", json!({"messages": msgs, "prompt_logprobs": -1})),
    ] {
        let r = post(&app, path, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
        assert_eq!(r.error()["param"], "prompt_logprobs");
    }
}

/// vLLM's `echo` on chat: the final message leads the reply's content when
/// it is in the reply's role (a continued assistant message comes back
/// whole), plain and streamed; otherwise nothing is added.
#[tokio::test]
async fn chat_echo_leads_with_a_continued_message() {
    let (_, app) = app();
    let two = json!([{"role": "user", "content": "the sky"}, {"role": "assistant", "content": "the sky is"}]);
    let continued = json!({"messages": two, "continue_final_message": true, "add_generation_prompt": false,
        "echo": true});
    let v = post(&app, "/v1/chat/completions", continued.clone()).await.json();
    assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": "the sky ishello world"}));
    // Streamed: the role, then the echo, then the reply's deltas.
    let mut body = continued;
    body["stream"] = json!(true);
    body["n"] = json!(2);
    let events = post(&app, "/v1/chat/completions", body).await.events();
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    for index in 0..2 {
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].as_array()?.first())
            .filter(|c| c["index"] == index)
            .map(|c| &c["delta"])
            .collect();
        assert_eq!(deltas[0], &json!({"role": "assistant", "content": ""}));
        assert_eq!(deltas[1], &json!({"content": "the sky is"}));
        let text: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!(text, "the sky ishello world");
    }
    // The final message is the user's: the reply is the assistant's, nothing echoed.
    let user_last = json!({"messages": [{"role": "user", "content": "the sky"}], "echo": true});
    let v = post(&app, "/v1/chat/completions", user_last).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], "hello world");
    // Without a generation prompt the reply goes on in the final message's role.
    let closed = json!({"messages": [{"role": "user", "content": "the sky"}], "echo": true,
        "add_generation_prompt": false});
    let v = post(&app, "/v1/chat/completions", closed).await.json();
    assert_eq!(v["choices"][0]["message"], json!({"role": "user", "content": "the skyhello world"}));
}
