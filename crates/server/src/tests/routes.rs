//! Non-streaming endpoints: shapes, parameter plumbing, tokenizer endpoints.

use axum::http::{Method, StatusCode};
use ferrite_engine::constraint::format::OutputFormat;
use serde_json::json;

use super::*;

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test]
async fn health_models_page() {
    let (_, app) = app();
    let r = get(&app, "/health").await;
    assert_eq!((r.status, r.json()), (StatusCode::OK, json!({"status": "ok"})));
    let m = get(&app, "/v1/models").await.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["max_model_len"], MAX_CONTEXT);
    assert_eq!(get(&app, "/v1/models/tiny").await.json()["id"], MODEL);
    assert_eq!(get(&app, "/v1/models/other").await.status, StatusCode::NOT_FOUND);
    let bad = get(&app, "/v1/models/%ff%fe").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.json()["error"]["message"].as_str().unwrap().contains("UTF-8"));
    let page = get(&app, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.headers["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = page.text();
    for id in ["id=\"prompt\"", "id=\"send\"", "id=\"stop\"", "id=\"temperature\"", "id=\"messages\""] {
        assert!(html.contains(id), "page lacks {id}");
    }
}

#[tokio::test]
async fn chat_completion() {
    let (fake, app) = app();
    let r =
        post(&app, "/v1/chat/completions", json!({"model": MODEL, "messages": user("the sky is"), "max_tokens": 10}))
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"], json!({"role": "assistant", "content": "hello world"}));
    assert_eq!(c["finish_reason"], "stop");
    assert!(c["logprobs"].is_null());
    // The template's BOS and the tokenizer's are collapsed into one.
    let prompt = vec![0, 3, 8, 10, 11, 4];
    let usage = json!({"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 1}});
    assert_eq!(v["usage"], usage);
    let req = &fake.requests()[0];
    assert_eq!(req.prompt, prompt);
    assert_eq!((req.max_tokens, req.sampling.temperature, req.sampling.top_k), (10, 1.0, 0));
    assert!(req.format.is_none() && !req.ignore_eos);
}

#[tokio::test]
async fn chat_parameters_reach_the_engine() {
    let (fake, app) = app();
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "n": 2, "seed": 5, "temperature": 0, "stop": "x", "response_format": {"type": "json_object"},
        "ignore_eos": true, "logit_bias": {"3": -100}, "user": "u"});
    let v = post(&app, "/v1/chat/completions", body).await.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!((choices[0]["index"].as_u64(), choices[1]["index"].as_u64()), (Some(0), Some(1)));
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    let reqs = fake.requests();
    assert_eq!(reqs.iter().map(|r| r.sampling.seed).collect::<Vec<_>>(), vec![Some(5), Some(6)]);
    let r = &reqs[0];
    assert_eq!((&r.prompt[..], r.max_tokens), (&[0, 3, 5, 4][..], MAX_CONTEXT - 4));
    assert!(r.format == Some(OutputFormat::Object) && r.ignore_eos);
    assert_eq!(r.stop, vec!["x"]);
    assert_eq!(r.sampling.logit_bias, vec![(3, -100.0)]);
    assert_eq!(r.sampling.temperature, 0.0);
}

#[tokio::test]
async fn chat_logprobs() {
    let (_, app) = app();
    let body = json!({"messages": user("hello"), "logprobs": true, "top_logprobs": 2});
    let v = post(&app, "/v1/chat/completions", body).await.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 3);
    assert_eq!(content[1]["token"], "wor");
    assert_eq!(content[1]["bytes"], json!([119, 111, 114]));
    assert_eq!(content[1]["logprob"], -0.5);
    let top = content[0]["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(top[0], json!({"token": "the", "logprob": -1.0, "bytes": [116, 104, 101]}));
}

#[tokio::test]
async fn completion_with_logprobs() {
    let (fake, app) = app();
    let body = json!({"model": MODEL, "prompt": "the sky", "max_tokens": 2, "logprobs": 1});
    let r = post(&app, "/v1/completions", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    let c = &v["choices"][0];
    assert_eq!((c["text"].as_str(), c["finish_reason"].as_str()), (Some("hello"), Some("length")));
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"], json!(["hello", "wor"]));
    assert_eq!(lp["token_logprobs"], json!([-0.5, -0.5]));
    // The chosen token too, where it is not among the most likely (as OpenAI).
    assert_eq!(lp["top_logprobs"], json!([{"the": -1.0, "hello": -0.5}, {"the": -1.0, "wor": -0.5}]));
    assert_eq!(lp["text_offset"], json!([0, 5]));
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(fake.requests()[0].prompt, vec![0, 8, 10]);
}

#[tokio::test]
async fn completion_prompt_forms() {
    let (fake, app) = app();
    for prompt in [json!([8, 9]), json!([[8, 9]])] {
        let r = post(&app, "/v1/completions", json!({"prompt": prompt})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let r = post(&app, "/v1/completions", json!({"prompt": ["the sky"]})).await;
    assert_eq!(r.status, StatusCode::OK);
    let prompts: Vec<_> = fake.requests().into_iter().map(|r| r.prompt).collect();
    assert_eq!(prompts, vec![vec![8, 9], vec![8, 9], vec![0, 8, 10]]);
}

/// Several prompts in one request (as evaluation harnesses send them): each
/// prompt's `n` choices in turn, and usage counting each prompt once.
#[tokio::test]
async fn several_completion_prompts() {
    let (fake, app) = app();
    let one = post(&app, "/v1/completions", json!({"prompt": "sky"})).await.json();
    let per_choice = one["usage"]["completion_tokens"].as_u64().unwrap();
    for stream in [false, true] {
        let mut body = json!({"prompt": ["the sky", "sky"], "n": 2, "stream": stream});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let r = post(&app, "/v1/completions", body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let (mut indices, usage) = if stream {
            let events: Vec<Value> =
                r.events().iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect();
            let indices =
                events.iter().flat_map(|e| e["choices"].as_array().unwrap().clone()).map(|c| c["index"].clone());
            (indices.collect::<Vec<_>>(), events.last().unwrap()["usage"].clone())
        } else {
            let v = r.json();
            (v["choices"].as_array().unwrap().iter().map(|c| c["index"].clone()).collect(), v["usage"].clone())
        };
        indices.sort_by_key(|i| i.as_u64());
        indices.dedup();
        assert_eq!(indices, vec![json!(0), json!(1), json!(2), json!(3)]);
        assert_eq!(usage["prompt_tokens"], 3 + 2, "{usage}");
        assert_eq!(usage["completion_tokens"].as_u64(), Some(4 * per_choice), "{usage}");
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 2, "{usage}");
    }
    let prompts: Vec<_> = fake.requests().into_iter().skip(1).take(4).map(|r| r.prompt).collect();
    assert_eq!(prompts, vec![vec![0, 8, 10], vec![0, 8, 10], vec![0, 10], vec![0, 10]]);
}

#[tokio::test]
async fn tokenize_and_detokenize() {
    let (_, app) = app();
    let v = post(&app, "/tokenize", json!({"prompt": "the sky"})).await.json();
    assert_eq!(v, json!({"tokens": [0, 8, 10], "count": 3, "max_model_len": MAX_CONTEXT}));
    let v = post(&app, "/tokenize", json!({"prompt": "the sky", "add_special_tokens": false})).await.json();
    assert_eq!(v["tokens"], json!([8, 10]));
    let v = post(&app, "/tokenize", json!({"messages": user("the sky is")})).await.json();
    assert_eq!(v["tokens"], json!([0, 3, 8, 10, 11, 4]));
    let v = post(&app, "/detokenize", json!({"tokens": [8, 10]})).await.json();
    assert_eq!(v, json!({"prompt": "the sky"}));
    let r = post(&app, "/detokenize", json!({"tokens": [8, 1000]})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error()["param"], "tokens");
    assert_eq!(post(&app, "/detokenize", json!({"tokens": [-1]})).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(post(&app, "/tokenize", json!({})).await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn api_key() {
    let fake = Fake::new();
    let app = app_with(&fake, Some("sekret"), Some(template()));
    let body = json!({"messages": user("hello")});
    for (path, method, body) in [
        ("/v1/models", Method::GET, None),
        ("/v1/chat/completions", Method::POST, Some(&body)),
        ("/v1/completions", Method::POST, Some(&body)),
        ("/tokenize", Method::POST, Some(&body)),
        ("/detokenize", Method::POST, Some(&body)),
    ] {
        for headers in [&[][..], &[("authorization", "Bearer wrong")][..], &[("authorization", "sekret")][..]] {
            let r = send(&app, request(method.clone(), path, body, headers)).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path} {headers:?}");
            assert_eq!(r.error()["code"], "invalid_api_key");
        }
    }
    let ok = send(&app, request(Method::GET, "/v1/models", None, &[("authorization", "Bearer sekret")])).await;
    assert_eq!(ok.status, StatusCode::OK);
    let ok =
        send(&app, request(Method::POST, "/v1/chat/completions", Some(&body), &[("authorization", "Bearer sekret")]))
            .await;
    assert_eq!(ok.status, StatusCode::OK);
    for open in ["/", "/health", "/metrics"] {
        assert_eq!(get(&app, open).await.status, StatusCode::OK, "{open}");
    }
}

#[tokio::test]
async fn metrics_exposition() {
    let (_, app) = app();
    post(&app, "/v1/chat/completions", json!({"messages": user("hello")})).await;
    post(&app, "/v1/chat/completions", json!({"messages": user("hello"), "n": 0})).await;
    let r = get(&app, "/metrics").await;
    assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = r.text();
    for line in [
        "ferrite_requests_total 1\n",
        "ferrite_requests_finished_total{finish_reason=\"stop\"} 1\n",
        "ferrite_time_to_first_token_seconds_count 1\n",
        "ferrite_inter_token_latency_seconds_count 2\n",
        "ferrite_num_requests_running 1\n",
        "ferrite_num_requests_waiting 2\n",
        "ferrite_kv_cache_usage_ratio 0.25\n",
        "ferrite_http_requests_total{status=\"200\"} 1\n",
        "ferrite_http_requests_total{status=\"400\"} 1\n",
        "# TYPE ferrite_prefix_cache_hits_total counter\n",
        "# TYPE ferrite_prefix_cache_hit_rate gauge\n",
        "# TYPE ferrite_preemptions_total counter\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

/// A page from another origin may call the API: preflights are answered
/// before the key check, and every response to an allowed origin says so.
#[tokio::test]
async fn cross_origin_calls() {
    let fake = Fake::new();
    let app = app_with(&fake, Some("sekret"), Some(template()));
    let page = ("origin", "http://localhost:3000");
    let preflight = [
        page,
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", "authorization, content-type"),
    ];
    let r = send(&app, request(Method::OPTIONS, "/v1/chat/completions", None, &preflight)).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    assert_eq!(r.headers["access-control-allow-headers"], "authorization, content-type");
    assert!(r.headers["access-control-allow-methods"].to_str().unwrap().contains("POST"));
    let body = json!({"messages": user("hello")});
    let call = [page, ("authorization", "Bearer sekret")];
    let r = send(&app, request(Method::POST, "/v1/chat/completions", Some(&body), &call)).await;
    assert_eq!((r.status, &r.headers["access-control-allow-origin"]), (StatusCode::OK, &"*".parse().unwrap()));
    // Errors carry the header too, so the page can read them.
    let r = send(&app, request(Method::POST, "/v1/chat/completions", Some(&body), &[page])).await;
    assert_eq!(
        (r.status, &r.headers["access-control-allow-origin"]),
        (StatusCode::UNAUTHORIZED, &"*".parse().unwrap())
    );
    // Without an Origin (not a browser's cross-origin call): no CORS headers.
    let r = send(&app, request(Method::GET, "/health", None, &[])).await;
    assert!(r.headers.get("access-control-allow-origin").is_none());

    // Only listed origins, echoed back; others get no header (the browser refuses).
    let only = crate::cors::AllowedOrigins::parse("http://localhost:3000");
    let state = AppState::new(Served::Generator(fake.clone()), MODEL.into(), None, Some(template()));
    let app = crate::router::router(state.with_allowed_origins(only));
    let r = send(&app, request(Method::OPTIONS, "/v1/completions", None, &preflight)).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(r.headers["access-control-allow-origin"], "http://localhost:3000");
    assert!(r.headers.get_all("vary").iter().any(|v| v == "origin"));
    let other = [("origin", "http://elsewhere.example"), ("access-control-request-method", "POST")];
    let r = send(&app, request(Method::OPTIONS, "/v1/completions", None, &other)).await;
    assert!(r.headers.get("access-control-allow-origin").is_none());
    // Every answer varies with the Origin, those without one included.
    assert!(get(&app, "/health").await.headers.get_all("vary").iter().any(|v| v == "origin"));
}

/// vLLM's `add_generation_prompt` and `continue_final_message`, the same on
/// chat and /tokenize.
#[tokio::test]
async fn chat_prompt_endings() {
    let (fake, app) = app();
    let two = json!([{"role": "user", "content": "the sky"}, {"role": "assistant", "content": "the sky is"}]);
    let cases = [
        (json!({"messages": user("the sky")}), vec![0, 3, 8, 10, 4]),
        (json!({"messages": user("the sky"), "add_generation_prompt": false}), vec![0, 3, 8, 10]),
        // The reply goes on from "is", inside the assistant's message.
        (json!({"messages": two, "continue_final_message": true}), vec![0, 3, 8, 10, 4, 8, 10, 11]),
        // Cut where the final message's text ends, not where its text last occurs.
        (
            json!({"messages": [{"role": "user", "content": "the sky the sky"}, {"role": "assistant", "content": "the"}],
                "continue_final_message": true}),
            vec![0, 3, 8, 10, 8, 10, 4, 8],
        ),
    ];
    for (body, want) in cases {
        let r = post(&app, "/v1/chat/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{body}: {}", r.text());
        assert_eq!(fake.requests().last().unwrap().prompt, want, "{body}");
        assert_eq!(post(&app, "/tokenize", body.clone()).await.json()["tokens"], json!(want), "{body}");
    }
    let bad = [
        json!({"messages": two, "continue_final_message": true, "add_generation_prompt": true}),
        json!({"messages": user("the sky"), "continue_final_message": true}),
    ];
    for body in bad {
        let r = post(&app, "/v1/chat/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
        assert_eq!(post(&app, "/tokenize", body.clone()).await.status, StatusCode::BAD_REQUEST, "{body}");
    }
}

/// Structured outputs: OpenAI's `json_schema` response format and vLLM's
/// `guided_json` (a schema or its text), `guided_regex` and the grammars
/// reach the engine compiled; a schema or pattern the grammar cannot enforce is a 400
/// naming the keyword.
#[tokio::test]
async fn json_schema_reaches_the_engine() {
    let (fake, app) = app();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let bodies = [
        json!({"messages": user("x"), "response_format": {"type": "json_schema",
            "json_schema": {"name": "t", "schema": schema, "strict": true}}}),
        json!({"messages": user("x"), "guided_json": schema}),
        json!({"messages": user("x"), "guided_json": schema.to_string()}),
    ];
    for body in bodies {
        let r = post(&app, "/v1/chat/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{body}: {}", r.text());
        assert!(matches!(fake.requests().last().unwrap().format, Some(OutputFormat::Schema(_))), "{body}");
    }
    let r = post(&app, "/v1/completions", json!({"prompt": "x", "guided_json": schema})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // vLLM's choices, and its newer `structured_outputs` form of both.
    for body in [
        json!({"prompt": "x", "guided_choice": ["yes", "no"]}),
        json!({"prompt": "x", "structured_outputs": {"choice": ["yes", "no"]}}),
        json!({"prompt": "x", "structured_outputs": {"json": schema}}),
    ] {
        let r = post(&app, "/v1/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{body}: {}", r.text());
        assert!(matches!(fake.requests().last().unwrap().format, Some(OutputFormat::Schema(_))), "{body}");
    }
    // vLLM's regular expressions: a whole match.
    for body in [
        json!({"prompt": "x", "guided_regex": "(yes|no)[.!]"}),
        json!({"prompt": "x", "structured_outputs": {"regex": "[0-9]{3}"}}),
    ] {
        let r = post(&app, "/v1/completions", body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{body}: {}", r.text());
        assert!(matches!(fake.requests().last().unwrap().format, Some(OutputFormat::Regex(_))), "{body}");
    }
    // GBNF grammars: vLLM's names and llama.cpp's.
    for body in [
        json!({"prompt": "x", "guided_grammar": "root ::= (\"yes\" | \"no\") \".\""}),
        json!({"prompt": "x", "structured_outputs": {"grammar": "root ::= [0-9]+"}}),
        json!({"messages": user("x"), "grammar": "root ::= item+\nitem ::= \"- \" [a-z]+ \"\\n\""}),
        json!({"prompt": "x", "guided_grammar": "root ::= <[1]> !<[2]>* \"a\""}),
        json!({"prompt": "x", "guided_grammar": "root ::= <|assistant|> \"a\" !<|user|>"}),
    ] {
        let path = if body.get("messages").is_some() { "/v1/chat/completions" } else { "/v1/completions" };
        let r = post(&app, path, body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{body}: {}", r.text());
        assert!(matches!(fake.requests().last().unwrap().format, Some(OutputFormat::Grammar(_))), "{body}");
    }
    for (body, param) in [
        (json!({"prompt": "x", "guided_regex": "(a"}), "guided_regex"),
        (json!({"prompt": "x", "guided_regex": "(?=a)a"}), "guided_regex"),
        (json!({"prompt": "x", "guided_grammar": "root ::= root \"a\""}), "guided_grammar"),
        (json!({"prompt": "x", "grammar": "start ::= \"a\""}), "grammar"),
        (json!({"prompt": "x", "guided_grammar": 5}), "guided_grammar"),
        (json!({"prompt": "x", "guided_grammar": "root ::= <[99999999]>"}), "guided_grammar"),
        (json!({"prompt": "x", "grammar": "root ::= <think> \"a\""}), "grammar"),
        (json!({"prompt": "x", "guided_choice": "yes"}), "guided_choice"),
        (json!({"prompt": "x", "guided_choice": ["a"], "guided_json": schema}), "guided_json"),
        (json!({"prompt": "x", "structured_outputs": {"grammar": "a"}}), "structured_outputs.grammar"),
        (json!({"prompt": "x", "guided_regex": "a", "grammar": "root ::= \"a\""}), "grammar"),
        (json!({"prompt": "x", "structured_outputs": {"regex": 5}}), "structured_outputs.regex"),
    ] {
        let r = post(&app, "/v1/completions", body.clone()).await;
        assert_eq!((r.status, r.error()["param"].as_str()), (StatusCode::BAD_REQUEST, Some(param)), "{body}");
    }
    let bad = json!({"prompt": "x", "response_format": {"type": "json_schema",
        "json_schema": {"schema": {"type": "string", "format": "idn-email"}}}});
    let r = post(&app, "/v1/completions", bad).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error()["message"].as_str().unwrap().contains("\"idn-email\" is not supported"), "{}", r.text());
}

#[tokio::test]
async fn a_suffix_fills_in_the_middle() {
    let fim = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"];
    let fake = Fake::with_tokenizer(tokenizer(&fim));
    let app = app_with(&fake, None, None);
    let r = post(&app, "/v1/completions", json!({"prompt": "the", "suffix": "sky is"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // BOS, prefix token, the prompt, suffix token, the suffix, middle token (llama.cpp's order).
    let req = &fake.requests()[0];
    assert_eq!(req.prompt, [0, 12, 8, 13, 10, 11, 14]);
    assert!(req.stop_ids.contains(&15), "{:?}", req.stop_ids);
    // Token-id prompts too; not with echo; and not for a model without the tokens.
    post(&app, "/v1/completions", json!({"prompt": [8, 9], "suffix": "sky"})).await;
    assert_eq!(fake.requests()[1].prompt, [0, 12, 8, 9, 13, 10, 14]);
    let r = post(&app, "/v1/completions", json!({"prompt": "the", "suffix": "sky", "echo": true})).await;
    assert_eq!((r.status, r.error()["param"].clone()), (StatusCode::BAD_REQUEST, json!("suffix")));
    // Other families' spellings: DeepSeek-Coder's, Code Llama's (ending at its <EOT>).
    for fim in [["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "</s>"], ["<PRE>", "<SUF>", "<MID>", "<EOT>"]]
    {
        let fake = Fake::with_tokenizer(tokenizer(&fim));
        let app = app_with(&fake, None, None);
        let r = post(&app, "/v1/completions", json!({"prompt": "the", "suffix": "sky is"})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let req = &fake.requests()[0];
        assert_eq!(req.prompt, [0, 12, 8, 13, 10, 11, 14], "{fim:?}");
        if fim[3] == "<EOT>" {
            assert!(req.stop_ids.contains(&15), "{:?}", req.stop_ids);
        }
    }
    let (_, plain) = super::app();
    let r = post(&plain, "/v1/completions", json!({"prompt": "the", "suffix": "sky"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error()["message"].as_str().unwrap().contains("fill-in-the-middle"));
}
