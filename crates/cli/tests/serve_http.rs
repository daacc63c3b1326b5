//! `ferrite serve` end to end, driven by real clients: curl for the raw HTTP
//! surface, the official `openai` and `anthropic` Python packages, a 200-request load test with
//! early disconnects, and the chat page in headless Chromium (Playwright).
//! The Python clients run from the repo's `.venv` (scripts/setup-test-models.sh
//! installs them), Chromium from the system (`/usr/bin/chromium`).

mod common;
use common::server::{curl, python, Server};
use common::*;

use std::process::{Command, Stdio};
use std::time::Duration;

const KEY: &str = "test-key";
const MODEL: &str = "smollm2";

/// SmolLM2 served with a 2048-token context and the test key.
fn start(extra: &[&str]) -> Server {
    model_path("smollm2.gguf");
    let mut args = vec!["--ctx-size", "2048"];
    args.extend_from_slice(extra);
    Server::start(MODEL, KEY, &args)
}

fn auth() -> String {
    format!("Authorization: Bearer {KEY}")
}

fn post(base: &str, path: &str, body: &str) -> (u16, String) {
    let url = format!("{base}{path}");
    curl(&["-H", &auth(), "-H", "Content-Type: application/json", "-d", body, &url])
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn run_script(script: &str, args: &[&str]) {
    let out = Command::new(python())
        .arg(repo_root().join("tests/serve").join(script))
        .args(args)
        .output()
        .expect("cannot run python");
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} failed:\n{o}\n{e}");
    eprintln!("{}", o.trim());
}

#[test]
fn http_surface_with_curl_openai_client_load_and_browser() {
    let s = start(&["--max-num-seqs", "64"]);
    let b = s.base.as_str();

    // Health, models, metrics need no key; the API does.
    assert_eq!(curl(&[&format!("{b}/health")]).0, 200);
    let (code, body) = curl(&[&format!("{b}/v1/models")]);
    assert_eq!(code, 401, "{body}");
    assert!(json(&body)["error"]["message"].is_string(), "{body}");
    let (code, body) = curl(&["-H", "Authorization: Bearer wrong", &format!("{b}/v1/models")]);
    assert_eq!(code, 401, "{body}");
    let (code, body) = curl(&["-H", &auth(), &format!("{b}/v1/models")]);
    assert_eq!(code, 200);
    assert_eq!(json(&body)["data"][0]["id"], MODEL);

    // Greedy chat, plain and streamed over SSE, agree.
    let req =
        r#"{"model":"smollm2","messages":[{"role":"user","content":"Name a fruit."}],"temperature":0,"max_tokens":12"#;
    let (code, body) = post(b, "/v1/chat/completions", &format!("{req}}}"));
    assert_eq!(code, 200, "{body}");
    let plain = json(&body)["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let (code, body) = post(b, "/v1/chat/completions", &format!(r#"{req},"stream":true}}"#));
    assert_eq!(code, 200, "{body}");
    let mut streamed = String::new();
    let events: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    for e in &events[..events.len() - 1] {
        streamed += json(e)["choices"][0]["delta"]["content"].as_str().unwrap_or("");
    }
    assert_eq!(streamed, plain);

    // Completions.
    let (code, body) = post(b, "/v1/completions", r#"{"prompt":"1, 2, 3,","max_tokens":6,"temperature":0}"#);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["usage"]["completion_tokens"], 6);

    // Tokenize / detokenize round trip.
    let (code, body) = post(b, "/tokenize", r#"{"prompt":"Hello world","add_special_tokens":false}"#);
    assert_eq!(code, 200, "{body}");
    let tokens = json(&body)["tokens"].clone();
    let (code, body) = post(b, "/detokenize", &format!(r#"{{"tokens":{tokens}}}"#));
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["prompt"], "Hello world");

    // Bad requests: one OpenAI-shaped error each, never a crash.
    let bad: &[(&str, &str, u16)] = &[
        ("/v1/chat/completions", "{not json", 400),
        ("/v1/chat/completions", r#"{"messages":"nope"}"#, 400),
        ("/v1/chat/completions", r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#, 404),
        ("/v1/chat/completions", r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100000}"#, 400),
        ("/v1/chat/completions", r#"{"messages":[{"role":"user","content":"x"}],"temperature":-2}"#, 400),
        ("/v1/chat/completions", r#"{"messages":[{"role":"user","content":"x"}],"top_p":7}"#, 400),
        ("/v1/chat/completions", r#"{"messages":[{"role":"user","content":"x"}],"n":1000000000}"#, 400),
        ("/v1/completions", r#"{"prompt":"x","max_tokens":0}"#, 400),
        ("/v1/completions", r#"{"prompt":""}"#, 400),
        ("/v1/completions", r#"{"prompt":[999999999]}"#, 400),
        ("/detokenize", r#"{"tokens":[4294967295]}"#, 400),
        ("/v1/nothing", "{}", 404),
    ];
    for (path, body, want) in bad {
        let (code, out) = post(b, path, body);
        assert_eq!(code, *want, "{path} {body}: {out}");
        assert!(json(&out)["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{path} {body}: {out}");
    }

    let key = KEY;
    run_script("openai_client.py", &[b, key, MODEL]);
    run_script("anthropic_client.py", &[b, key, MODEL]);
    run_script("load_test.py", &[b, key, MODEL, "200"]);
    run_script("chat_page.py", &[b, key]);

    // Metrics after all that: every block free, counters moved.
    let (code, metrics) = curl(&[&format!("{b}/metrics")]);
    assert_eq!(code, 200);
    for name in [
        "ferrite_requests_total",
        "ferrite_time_to_first_token_seconds_bucket",
        "ferrite_inter_token_latency_seconds_bucket",
        "ferrite_prefix_cache_hit_rate",
        "ferrite_num_requests_waiting",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    assert!(metrics.lines().any(|l| l == "ferrite_kv_cache_blocks_used 0"), "{metrics}");

    assert!(s.terminate().success(), "SIGTERM should exit cleanly");
}

#[test]
fn sigterm_with_streams_in_flight_exits_cleanly_and_bad_startup_fails_clearly() {
    let s = start(&[]);
    let url = format!("{}/v1/completions", s.base);
    let stream = Command::new("curl")
        .args(["-s", "-N", "-H", &auth(), "-H", "Content-Type: application/json", &url, "-d"])
        .arg(r#"{"prompt":"Once upon a time","max_tokens":1500,"stream":true,"ignore_eos":true}"#)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(s.terminate().success(), "SIGTERM with a stream in flight should exit cleanly");
    // The client sees its stream end (not hang).
    let out = stream.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("data: "), "the stream never started");

    // Bad startup: one error line, exit 1.
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite")).args(["serve", "/no/such/model.gguf"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
    let out =
        Command::new(env!("CARGO_BIN_EXE_ferrite")).args(["serve", MODEL, "--max-num-seqs", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// `echo` with `logprobs`, as evaluation harnesses score text: each prompt
/// token's logprob against the exact float64 forward pass of
/// scripts/golden_exact.py, with `max_tokens` 0 (the prompt alone) and 1
/// (lm-eval's request, the drawn token last); vLLM's `prompt_logprobs`
/// ranks; streamed, the echo is the first chunk.
#[test]
fn echo_scores_the_prompt_as_the_exact_reference_does() {
    let s = start(&[]);
    let b = s.base.as_str();
    let fx = read_json("llamacpp/smollm2_exact.json");
    let seq = &fx["sequences"][0];
    let ids: Vec<u64> = seq["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let ids_json = serde_json::to_string(&ids).unwrap();
    let request = |max_tokens: usize, extra: &str| {
        format!(r#"{{"prompt":{ids_json},"echo":true,"max_tokens":{max_tokens},"temperature":0{extra}}}"#)
    };
    let mut texts = Vec::new();
    for max_tokens in [0, 1] {
        let (code, body) = post(b, "/v1/completions", &request(max_tokens, r#","logprobs":5"#));
        assert_eq!(code, 200, "{body}");
        let v = json(&body);
        let c = &v["choices"][0];
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len() + max_tokens, "{body}");
        assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null(), "{body}");
        assert_eq!(v["usage"]["completion_tokens"], max_tokens);
        let mut checked = 0;
        for p in 1..ids.len() {
            let at = &seq["positions"][p - 1];
            let lse = at["logsumexp"].as_f64().unwrap();
            let top10: Vec<(u64, f64)> = at["top10"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e[0].as_u64().unwrap(), e[1].as_f64().unwrap()))
                .collect();
            // The best alternative's logprob, and the prompt token's where the reference lists it.
            let best = lp["top_logprobs"][p].as_object().unwrap();
            // The five most likely, and the prompt's token where it is not among them.
            assert!((5..=6).contains(&best.len()), "{best:?}");
            let got_best = best.values().next().unwrap().as_f64().unwrap();
            assert!((got_best - (top10[0].1 - lse)).abs() < 1e-2, "position {p}: best {got_best}");
            if let Some(&(_, logit)) = top10.iter().find(|(id, _)| *id == ids[p]) {
                let got = lp["token_logprobs"][p].as_f64().unwrap();
                assert!((got - (logit - lse)).abs() < 1e-2, "position {p}: {got} against {}", logit - lse);
                checked += 1;
            }
        }
        assert!(checked >= 30, "only {checked} prompt tokens in the reference's top 10");
        texts.push(c["text"].as_str().unwrap().to_string());
    }
    assert!(texts[0].starts_with("The old lighthouse keeper") && texts[1].starts_with(&texts[0]), "{texts:?}");
    // The other reference sequences (code; Russian and Japanese), sent together.
    let others: Vec<&serde_json::Value> = fx["sequences"].as_array().unwrap()[1..].iter().collect();
    let prompts: Vec<&serde_json::Value> = others.iter().map(|q| &q["ids"]).collect();
    let body = format!(r#"{{"prompt":{},"echo":true,"max_tokens":0,"logprobs":0}}"#, serde_json::json!(prompts));
    let (code, body) = post(b, "/v1/completions", &body);
    assert_eq!(code, 200, "{body}");
    let v = json(&body);
    for (q, c) in others.iter().zip(v["choices"].as_array().unwrap()) {
        let ids = q["ids"].as_array().unwrap();
        let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), ids.len());
        let mut checked = 0;
        for p in 1..ids.len() {
            let at = &q["positions"][p - 1];
            let Some(e) = at["top10"].as_array().unwrap().iter().find(|e| e[0] == ids[p]) else { continue };
            let want = e[1].as_f64().unwrap() - at["logsumexp"].as_f64().unwrap();
            let got = lps[p].as_f64().unwrap();
            assert!((got - want).abs() < 1e-2, "{}: position {p}: {got} against {want}", q["name"]);
            checked += 1;
        }
        assert!(checked >= 40, "{}: only {checked} checked", q["name"]);
    }

    // vLLM's prompt_logprobs: the prompt token's rank too, where the
    // reference's order is clear (neighbours more than 0.05 apart).
    let body = format!(r#"{{"prompt":{ids_json},"prompt_logprobs":2,"max_tokens":1}}"#);
    let (code, body) = post(b, "/v1/completions", &body);
    assert_eq!(code, 200, "{body}");
    let ranked = json(&body)["choices"][0]["prompt_logprobs"].clone();
    let mut ranks = 0;
    for p in 1..ids.len() {
        let logits: Vec<f64> =
            seq["positions"][p - 1]["top10"].as_array().unwrap().iter().map(|e| e[1].as_f64().unwrap()).collect();
        let at = seq["positions"][p - 1]["top10"].as_array().unwrap().iter().position(|e| e[0] == ids[p]);
        let entry = &ranked[p][ids[p].to_string()];
        assert!(entry["logprob"].is_number() && entry["decoded_token"].is_string(), "{entry}");
        let Some(i) = at else { continue };
        let clear = |j: usize| logits.get(j).is_none_or(|&x| (x - logits[i]).abs() > 0.05);
        if (i == 0 || clear(i - 1)) && clear(i + 1) {
            assert_eq!(entry["rank"], i + 1, "position {p}: {entry}");
            ranks += 1;
        }
    }
    assert!(ranks >= 25, "only {ranks} ranks checked");

    // Streamed: the echoed prompt (with its scores) first, then the tokens.
    let (code, body) = post(b, "/v1/completions", &request(1, r#","logprobs":1,"stream":true"#));
    assert_eq!(code, 200, "{body}");
    let chunks: Vec<serde_json::Value> =
        body.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]").map(json).collect();
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["text"], texts[0].as_str());
    assert_eq!(first["logprobs"]["tokens"].as_array().unwrap().len(), ids.len());
    let streamed: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap_or("")).collect();
    assert_eq!(streamed, texts[1]);

    // A prompt that fills the context may be scored alone; an empty one is refused.
    let full: Vec<u64> = ids.iter().copied().cycle().take(2048).collect();
    let body =
        format!(r#"{{"prompt":{},"echo":true,"max_tokens":0,"logprobs":0}}"#, serde_json::to_string(&full).unwrap());
    let (code, body) = post(b, "/v1/completions", &body);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len(), 2048);
    let (code, body) = post(b, "/v1/completions", r#"{"prompt":["a",""],"echo":true}"#);
    assert_eq!(code, 400, "{body}");

    // Echo without logprobs: the prompt text as sent, then the completion.
    let (code, body) = post(b, "/v1/completions", r#"{"prompt":"Hi there","echo":true,"max_tokens":2}"#);
    assert_eq!(code, 200, "{body}");
    assert!(json(&body)["choices"][0]["text"].as_str().unwrap().starts_with("Hi there"), "{body}");

    // Ids that stop inside a character: the echo leaves it out and the
    // output brings it whole; with nothing generated, the echo shows it as
    // decoding those ids does (U+FFFD).
    let (_, body) = post(b, "/tokenize", r#"{"prompt":"My pet is a crab: 🦀","add_special_tokens":false}"#);
    let all = json(&body)["tokens"].clone();
    let cut = serde_json::json!(all.as_array().unwrap()[..all.as_array().unwrap().len() - 1]);
    let text = |max_tokens: usize, stream: bool| {
        let body =
            format!(r#"{{"prompt":{cut},"echo":true,"max_tokens":{max_tokens},"temperature":0,"stream":{stream}}}"#);
        let (code, body) = post(b, "/v1/completions", &body);
        assert_eq!(code, 200, "{body}");
        let chunks: Vec<serde_json::Value> = if stream {
            body.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]").map(json).collect()
        } else {
            vec![json(&body)]
        };
        chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap_or("").to_string()).collect::<String>()
    };
    assert_eq!(text(0, false), "My pet is a crab: \u{FFFD}");
    for stream in [false, true] {
        let got = text(1, stream);
        assert!(got.starts_with("My pet is a crab: ") && !got.contains('\u{FFFD}'), "{got:?}");
        assert_eq!(got.chars().count(), "My pet is a crab: 🦀".chars().count(), "{got:?}");
    }
    // Under a grammar, the output starts at a whole character: the
    // prompt's part of one stays its own.
    let body = format!(r#"{{"prompt":{cut},"max_tokens":5,"temperature":0,"guided_regex":"(yes|no)"}}"#);
    let (code, body) = post(b, "/v1/completions", &body);
    assert_eq!(code, 200, "{body}");
    let got = json(&body)["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(got == "yes" || got == "no", "{got:?}");
    assert!(s.terminate().success());
}
