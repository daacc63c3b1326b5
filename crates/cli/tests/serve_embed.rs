//! `ferrite serve` with embedding models, end to end: the real binary on a free
//! port, driven with curl (a tiny ModernBERT checkpoint, checked against the
//! sentence-transformers vectors of its fixture) and with the official
//! `openai` Python package (all-MiniLM-L6-v2 against its reference vectors).
//! The Python client runs from the repo's `.venv` (scripts/setup-test-models.sh
//! installs it and fetches the model).

mod common;
use common::server::{curl, python, Server};
use common::*;

use std::process::Command;

use serde_json::{json, Value};

const KEY: &str = "embed-key";

fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let url = format!("{base}{path}");
    let auth = format!("Authorization: Bearer {KEY}");
    let (code, text) = curl(&["-H", &auth, "-H", "Content-Type: application/json", "-d", &body.to_string(), &url]);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (code, v)
}

/// POST /v1/embeddings, expecting 200.
fn embed(base: &str, body: Value) -> Value {
    let (code, v) = post(base, "/v1/embeddings", &body);
    assert_eq!(code, 200, "{body}: {v}");
    v
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap_or_else(|| panic!("not a list: {v}")).iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// The float vectors of a response, by index.
fn vectors(resp: &Value) -> Vec<Vec<f32>> {
    let data = resp["data"].as_array().unwrap();
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"].as_u64(), Some(i as u64));
            floats(&d["embedding"])
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Standard base64 -> little-endian f32s.
fn decode_base64(s: &str) -> Vec<f32> {
    let abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut bits, mut n, mut bytes) = (0u32, 0, Vec::new());
    for c in s.trim_end_matches('=').chars() {
        bits = bits << 6 | abc.find(c).unwrap_or_else(|| panic!("{c:?} is not base64")) as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            bytes.push((bits >> n) as u8);
        }
    }
    assert_eq!(bytes.len() % 4, 0);
    bytes.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn tiny_modernbert_vectors_batching_concurrency_and_errors() {
    let fx = read_json("embed/modernbert.json");
    let items = fx["checkpoints"]["modernbert-tiny-a"]["items"].as_array().unwrap().clone();
    let dir = fixture("embed/modernbert-tiny-a");
    let s = Server::start(dir.to_str().unwrap(), KEY, &["--max-embed-tokens", "256", "--precision", "f32"]);
    let b = s.base.as_str();
    let model = "modernbert-tiny-a";

    // One input per request: the fixture's pooled vectors, and its token counts.
    let mut singles = Vec::new();
    for item in &items {
        let v = embed(b, json!({"model": model, "input": item["text"]}));
        assert_eq!(v["model"], model);
        assert_eq!(v["object"], "list");
        assert_eq!(v["usage"]["prompt_tokens"], item["n_tokens"], "{}", item["text"]);
        assert_eq!(v["usage"]["total_tokens"], item["n_tokens"]);
        let got = &vectors(&v)[0];
        let diff = max_abs_diff(got, &floats(&item["pooled"]));
        assert!(diff < 1e-4, "{}: max abs diff {diff}", item["text"]);
        singles.push(got.clone());
    }

    // All inputs in one request (several forward passes under the 256-token
    // budget) give the same vectors, and so do their token ids.
    let texts: Vec<Value> = items.iter().map(|i| i["text"].clone()).collect();
    let v = embed(b, json!({"input": texts}));
    let total: u64 = items.iter().map(|i| i["n_tokens"].as_u64().unwrap()).sum();
    assert_eq!(v["usage"]["prompt_tokens"], total);
    for (got, single) in vectors(&v).iter().zip(&singles) {
        assert!(max_abs_diff(got, single) < 1e-5, "batched != single");
    }
    let ids: Vec<Value> = items.iter().map(|i| i["ids"].clone()).collect();
    let v = embed(b, json!({"input": ids}));
    for (got, single) in vectors(&v).iter().zip(&singles) {
        assert!(max_abs_diff(got, single) < 1e-5, "token ids != text");
    }

    // 16 concurrent requests: all succeed and agree with the single results.
    let handles: Vec<_> = (0..16)
        .map(|k| {
            let (base, text) = (b.to_string(), items[k % items.len()]["text"].clone());
            std::thread::spawn(move || vectors(&embed(&base, json!({"input": [text]})))[0].clone())
        })
        .collect();
    for (k, h) in handles.into_iter().enumerate() {
        let got = h.join().unwrap();
        assert!(max_abs_diff(&got, &singles[k % items.len()]) < 1e-5, "concurrent request {k}");
    }

    // base64: the same floats, bit for bit.
    let plain = embed(b, json!({"input": texts[..3]}));
    let encoded = embed(b, json!({"input": texts[..3], "encoding_format": "base64"}));
    for i in 0..3 {
        let s = encoded["data"][i]["embedding"].as_str().expect("base64 string");
        assert_eq!(decode_base64(s), floats(&plain["data"][i]["embedding"]));
    }

    // dimensions: the leading values (this model does not normalize).
    let v = embed(b, json!({"input": texts[1], "dimensions": 16}));
    assert_eq!(vectors(&v)[0], singles[1][..16].to_vec());

    // truncate: a long input is refused, or cut to the model's 128 tokens.
    let long = items.last().unwrap()["text"].as_str().unwrap().repeat(3);
    let (code, e) = post(b, "/v1/embeddings", &json!({"input": ["a", long]}));
    assert_eq!(code, 400, "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.contains("input[1] has") && m.contains("maximum of 128") && m.contains("\"truncate\": true"), "{m}");
    let v = embed(b, json!({"input": long, "truncate": true}));
    assert_eq!(v["usage"]["prompt_tokens"], 128);

    // Bad requests: 400 with a message naming the problem.
    let bad = [
        (json!({"input": []}), "empty list"),
        (json!({"input": ""}), "empty string"),
        (json!({"input": ["a", ""]}), "input[1] is an empty string"),
        (json!({"input": ["a", 3]}), "mixes kinds"),
        (json!({"input": [1, 600]}), "600 is not a token id"),
        (json!({"input": "a", "dimensions": 65}), "between 1 and 64"),
        (json!({"input": "a", "dimensions": 0}), "between 1 and 64"),
        (json!({"input": "a", "encoding_format": "int8"}), "encoding_format"),
        (json!({"messages": [{"role": "user", "content": "a"}]}), "missing field `input`"),
    ];
    for (body, want) in bad {
        let (code, e) = post(b, "/v1/embeddings", &body);
        assert_eq!(code, 400, "{body}: {e}");
        let m = e["error"]["message"].as_str().unwrap();
        assert!(m.contains(want), "{body}: {m}");
    }
    let (code, _) = post(b, "/v1/embeddings", &json!({"input": "a", "model": "other"}));
    assert_eq!(code, 404);
    let (code, e) = post(b, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "a"}]}));
    assert_eq!(code, 400);
    assert_eq!(e["error"]["message"], format!("model {model} is an embedding model; it does not generate text"));
    let (code, _) =
        curl(&["-H", "Content-Type: application/json", "-d", r#"{"input":"a"}"#, &format!("{b}/v1/embeddings")]);
    assert_eq!(code, 401, "the API key applies");

    // The other routes answer for the embedding model.
    let (code, body) = curl(&["-H", &format!("Authorization: Bearer {KEY}"), &format!("{b}/v1/models")]);
    assert_eq!(code, 200);
    let m: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((m["data"][0]["id"].as_str(), m["data"][0]["max_model_len"].as_u64()), (Some(model), Some(128)));
    let (code, v) = post(b, "/tokenize", &json!({"prompt": items[1]["text"]}));
    assert_eq!(code, 200);
    assert_eq!(v["tokens"], items[1]["ids"]);
    let (code, v) = post(b, "/detokenize", &json!({"tokens": items[1]["ids"]}));
    assert_eq!(code, 200, "{v}");
    assert!(v["prompt"].as_str().unwrap().contains("river keeper"), "{v}");
    assert_eq!(curl(&[&format!("{b}/health")]).0, 200);
    let (code, metrics) = curl(&[&format!("{b}/metrics")]);
    assert_eq!(code, 200);
    let value = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("ferrite_embedding_requests_total") >= 8 + 2 + 16);
    assert!(value("ferrite_embedding_inputs_total") >= 3 * items.len() as u64 + 16);
    assert!(value("ferrite_embedding_tokens_total") >= 3 * total);
    assert!(value("ferrite_embedding_batches_total") >= 8);
    assert_eq!(value("ferrite_num_requests_waiting"), 0);

    assert!(s.terminate().success(), "SIGTERM should exit cleanly");
}

#[test]
fn minilm_with_the_openai_client() {
    model_path("all-minilm-l6-v2");
    let s = Server::start("all-minilm-l6-v2", KEY, &[]);
    let script = repo_root().join("tests/serve/openai_embed.py");
    let out = Command::new(python())
        .arg(&script)
        .args([s.base.as_str(), KEY, "all-minilm-l6-v2"])
        .arg(fixture("embed/minilm.json"))
        .output()
        .expect("cannot run python");
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openai_embed.py failed:\n{o}\n{e}");
    eprintln!("{}", o.trim());
    assert!(s.terminate().success(), "SIGTERM should exit cleanly");
}

/// text-embeddings-inference's `POST /embed` with all-MiniLM-L6-v2 (f32),
/// against sentence-transformers: normalized vectors by default, and with
/// `normalize: false` the mean pooling before its Normalize module.
#[test]
fn minilm_through_the_tei_embed_route() {
    model_path("all-minilm-l6-v2");
    let s = Server::start("all-minilm-l6-v2", KEY, &["--precision", "f32"]);
    let fx = read_json("embed/minilm.json");
    // (An empty text is refused, as on /v1/embeddings.)
    let items: Vec<&Value> =
        fx["cases"]["default"]["items"].as_array().unwrap().iter().filter(|i| i["text"] != "").collect();
    let texts: Vec<&Value> = items.iter().map(|i| &i["text"]).collect();
    let (code, v) = post(&s.base, "/embed", &json!({"inputs": texts, "truncate": true}));
    assert_eq!(code, 200, "{v}");
    for (item, got) in items.iter().zip(v.as_array().unwrap()) {
        let diff = max_abs_diff(&floats(got), &floats(&item["embedding"]));
        assert!(diff < 1e-4, "{}: max abs diff {diff}", item["text"]);
    }
    let raw: Vec<&&Value> = items.iter().filter(|i| i.get("mean_pooled").is_some()).collect();
    assert!(raw.len() >= 4);
    let texts: Vec<&Value> = raw.iter().map(|i| &i["text"]).collect();
    let (code, v) = post(&s.base, "/embed", &json!({"inputs": texts, "normalize": false, "truncate": true}));
    assert_eq!(code, 200, "{v}");
    for (item, got) in raw.iter().zip(v.as_array().unwrap()) {
        let diff = max_abs_diff(&floats(got), &floats(&item["mean_pooled"]));
        assert!(diff < 1e-4, "{}: max abs diff {diff} before normalizing", item["text"]);
    }
    let (code, v) = post(&s.base, "/embed", &json!({"inputs": ["a"], "truncation_direction": "left"}));
    assert_eq!((code, v["error_type"].as_str()), (413, Some("validation")), "{v}");
    // GET /info: the checkpoint's pooling and length (sentence_bert_config's 256), f32 as asked.
    let (code, text) = curl(&["-H", &format!("Authorization: Bearer {KEY}"), &format!("{}/info", s.base)]);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["model_type"], json!({"embedding": {"pooling": "mean"}}), "{v}");
    assert_eq!((&v["max_input_length"], &v["model_dtype"]), (&json!(256), &json!("float32")), "{v}");
    assert!(s.terminate().success(), "SIGTERM should exit cleanly");
}
