//! /v1/embeddings over a fake embedder, and the other routes on an embedding
//! server: shapes, every 400, base64, dimensions, usage, the wrong kind of
//! model both ways, metrics, the API key, disconnects and shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use ferrite_engine::embed::{EmbedMetrics, EmbedReply};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::*;
use crate::backend::{EmbedBackend, EmbedInfo, EmbedReceiver};

const EMBED_MODEL: &str = "tiny-embed";
/// Longest input in tokens (BOS included).
const MAX_LEN: usize = 6;
const DIM: usize = 4;

/// One `submit`: the inputs and `dims`.
type Submission = (Vec<Vec<u32>>, Option<usize>);

/// An embedder whose vector for ids is `[len, sum, first, last]` (cut to `dims`).
pub struct FakeEmbedder {
    tokenizer: Tokenizer,
    /// Every submission: (inputs, dims).
    pub submitted: Mutex<Vec<Submission>>,
    /// Each submission's normalization override.
    pub normalize: Mutex<Vec<Option<bool>>>,
    pub busy: AtomicBool,
    /// Keep the reply senders instead of answering.
    pub hang: AtomicBool,
    pub pending: Mutex<Vec<oneshot::Sender<EmbedReply>>>,
    pub stopped: AtomicBool,
}

impl FakeEmbedder {
    pub fn new() -> Arc<FakeEmbedder> {
        Arc::new(FakeEmbedder {
            tokenizer: tokenizer(&[]),
            submitted: Mutex::default(),
            normalize: Mutex::default(),
            busy: AtomicBool::new(false),
            hang: AtomicBool::new(false),
            pending: Mutex::default(),
            stopped: AtomicBool::new(false),
        })
    }

    fn vector(ids: &[u32], dims: Option<usize>) -> Vec<f32> {
        let sum: u32 = ids.iter().sum();
        let mut v = vec![ids.len() as f32, sum as f32, ids[0] as f32, ids[ids.len() - 1] as f32 + 0.25];
        v.truncate(dims.unwrap_or(DIM));
        v
    }

    fn inputs(&self) -> Vec<Vec<u32>> {
        self.submitted.lock().unwrap().iter().flat_map(|(i, _)| i.clone()).collect()
    }
}

impl EmbedBackend for FakeEmbedder {
    fn tokenize(&self, text: &str, truncate: bool) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(Error::InvalidInput("an input is empty".into()));
        }
        let mut ids = self.tokenizer.encode(text, true)?;
        if ids.len() > MAX_LEN {
            if !truncate {
                return Err(Error::InvalidInput("too long".into()));
            }
            ids.truncate(MAX_LEN);
        }
        Ok(ids)
    }
    fn submit(&self, inputs: Vec<Vec<u32>>, normalize: Option<bool>, dims: Option<usize>) -> Result<EmbedReceiver> {
        assert!(inputs.iter().all(|i| !i.is_empty() && i.len() <= MAX_LEN), "{inputs:?}");
        assert!(inputs.iter().flatten().all(|&id| (id as usize) < WORDS.len()));
        if self.busy.load(Ordering::SeqCst) {
            return Err(Error::Busy("1 embedding request is waiting".into()));
        }
        self.submitted.lock().unwrap().push((inputs.clone(), dims));
        self.normalize.lock().unwrap().push(normalize);
        let (tx, rx) = oneshot::channel();
        if self.hang.load(Ordering::SeqCst) {
            self.pending.lock().unwrap().push(tx);
        } else {
            let _ = tx.send(Ok(inputs.iter().map(|i| FakeEmbedder::vector(i, dims)).collect()));
        }
        Ok(rx)
    }
    fn metrics(&self) -> EmbedMetrics {
        EmbedMetrics { requests: 7, inputs: 9, tokens: 30, batches: 4, waiting: 3 }
    }
    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    fn dim(&self) -> usize {
        DIM
    }
    fn max_length(&self) -> usize {
        MAX_LEN
    }
    fn vocab_size(&self) -> usize {
        WORDS.len()
    }
    fn info(&self) -> EmbedInfo {
        EmbedInfo { pooling: "cls", dtype: "float32", max_batch_tokens: 64, max_waiting: 5 }
    }
    fn shutdown(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

fn embed_state(fake: &Arc<FakeEmbedder>, api_key: Option<&str>) -> AppState {
    AppState::new(Served::Embedder(fake.clone()), EMBED_MODEL.into(), api_key.map(str::to_string), None)
}

fn embed_app() -> (Arc<FakeEmbedder>, Router) {
    let fake = FakeEmbedder::new();
    let app = crate::router::router(embed_state(&fake, None));
    (fake, app)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Standard base64 -> little-endian f32s.
fn decode_base64(s: &str) -> Vec<f32> {
    let abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut bytes = Vec::new();
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

#[tokio::test]
async fn one_string() {
    let (fake, app) = embed_app();
    let r = post(&app, "/v1/embeddings", json!({"model": EMBED_MODEL, "input": "the sky", "user": "u1"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], EMBED_MODEL);
    assert_eq!(v["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!((data[0]["object"].as_str(), data[0]["index"].as_u64()), (Some("embedding"), Some(0)));
    assert_eq!(floats(&data[0]["embedding"]), vec![3.0, 18.0, 0.0, 10.25]);
    assert_eq!(fake.inputs(), vec![vec![0, 8, 10]]);
}

#[tokio::test]
async fn lists_of_strings_and_token_ids() {
    let (fake, app) = embed_app();
    let v = post(&app, "/v1/embeddings", json!({"input": ["hello", "the sky is", "a"]})).await.json();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.iter().map(|d| d["index"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(floats(&data[1]["embedding"]), vec![4.0, 29.0, 0.0, 11.25]);
    assert_eq!(v["usage"]["prompt_tokens"], 2 + 4 + 2);
    assert_eq!(v["usage"]["total_tokens"], 8);
    // Token ids are embedded as given: no BOS added.
    let v = post(&app, "/v1/embeddings", json!({"input": [8, 10]})).await.json();
    assert_eq!((v["data"].as_array().unwrap().len(), v["usage"]["prompt_tokens"].as_u64()), (1, Some(2)));
    let v = post(&app, "/v1/embeddings", json!({"input": [[8], [9, 10, 11]]})).await.json();
    assert_eq!(floats(&v["data"][1]["embedding"]), vec![3.0, 30.0, 9.0, 11.25]);
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    let sent = fake.inputs();
    assert_eq!(sent, vec![vec![0, 5], vec![0, 8, 10, 11], vec![0, 9], vec![8, 10], vec![8], vec![9, 10, 11]]);
}

#[tokio::test]
async fn base64_round_trip() {
    let (_, app) = embed_app();
    let body = json!({"input": ["hello", "the sky is"]});
    let plain = post(&app, "/v1/embeddings", body.clone()).await.json();
    let mut b64 = body;
    b64["encoding_format"] = json!("base64");
    let encoded = post(&app, "/v1/embeddings", b64).await.json();
    for i in 0..2 {
        let s = encoded["data"][i]["embedding"].as_str().expect("base64 is a string");
        assert_eq!(decode_base64(s), floats(&plain["data"][i]["embedding"]));
    }
    assert_eq!(encoded["usage"], plain["usage"]);
    let explicit = post(&app, "/v1/embeddings", json!({"input": "a", "encoding_format": "float"})).await.json();
    assert!(explicit["data"][0]["embedding"].is_array());
}

#[tokio::test]
async fn dimensions_reach_the_engine() {
    let (fake, app) = embed_app();
    let v = post(&app, "/v1/embeddings", json!({"input": ["hello", "a"], "dimensions": 2})).await.json();
    assert_eq!(floats(&v["data"][0]["embedding"]), vec![2.0, 5.0]);
    assert_eq!(floats(&v["data"][1]["embedding"]), vec![2.0, 9.0]);
    let v = post(&app, "/v1/embeddings", json!({"input": "a", "dimensions": DIM})).await.json();
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), DIM);
    let dims: Vec<_> = fake.submitted.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(dims, vec![Some(2), Some(DIM)]);
}

#[tokio::test]
async fn truncate_cuts_long_inputs_and_usage_counts_what_was_embedded() {
    let (fake, app) = embed_app();
    let long = "the sky is a sky is the sky";
    let r = post(&app, "/v1/embeddings", json!({"input": ["a", long]})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let e = r.error();
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("input[1] has 9 tokens") && m.contains("maximum of 6"), "{m}");
    assert!(m.contains("\"truncate\": true"), "{m}");
    assert_eq!(e["param"], "input");
    let r = post(&app, "/v1/embeddings", json!({"input": long})).await;
    assert!(r.error()["message"].as_str().unwrap().starts_with("input has 9 tokens"), "{}", r.text());
    let ids = json!([[8, 9, 10, 11, 8, 9, 10]]);
    let r = post(&app, "/v1/embeddings", json!({"input": ids})).await;
    assert!(r.error()["message"].as_str().unwrap().contains("input[0] has 7 tokens"), "{}", r.text());
    assert!(fake.inputs().is_empty());

    let v = post(&app, "/v1/embeddings", json!({"input": ["a", long], "truncate": true})).await.json();
    assert_eq!(v["usage"]["prompt_tokens"], 2 + MAX_LEN);
    let v = post(&app, "/v1/embeddings", json!({"input": ids, "truncate": true})).await.json();
    assert_eq!(v["usage"]["prompt_tokens"], MAX_LEN);
    assert_eq!(fake.inputs()[1], vec![0, 8, 10, 11, 9, 10]);
    assert_eq!(fake.inputs()[2], vec![8, 9, 10, 11, 8, 9]);
}

#[tokio::test]
async fn bad_requests_are_400_naming_the_problem() {
    let (fake, app) = embed_app();
    let cases = [
        (json!({"input": []}), "input", "empty list"),
        (json!({"input": ""}), "input", "empty string"),
        (json!({"input": ["a", ""]}), "input", "input[1] is an empty string"),
        (json!({"input": ["a", 5]}), "input", "mixes kinds"),
        (json!({"input": [[5], "a"]}), "input", "mixes kinds"),
        (json!({"input": [{"text": "a"}]}), "input", "must not be an object"),
        (json!({"input": [5, 100]}), "input", "100 is not a token id"),
        (json!({"input": [[5], [-1]]}), "input", "-1 is not a token id"),
        (json!({"input": [[5], []]}), "input", "empty list of token ids"),
        (json!({"input": null}), "input", "must not be null"),
        (json!({"input": "a", "dimensions": 0}), "dimensions", "between 1 and 4"),
        (json!({"input": "a", "dimensions": 5}), "dimensions", "between 1 and 4"),
        (json!({"input": "a", "encoding_format": "int8"}), "encoding_format", "\"float\" or \"base64\""),
    ];
    for (body, param, want) in cases {
        let r = post(&app, "/v1/embeddings", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
        let e = r.error();
        assert!(e["message"].as_str().unwrap().contains(want), "{body}: {e}");
        assert_eq!(e["param"], param, "{body}");
    }
    // Malformed bodies: serde's message.
    for body in [json!({}), json!({"input": "a", "truncate": "yes"}), json!({"input": "a", "dimensions": 1.5})] {
        let r = post(&app, "/v1/embeddings", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(r.error()["message"].as_str().unwrap().contains("invalid request body"), "{body}");
    }
    let r = post(&app, "/v1/embeddings", json!({"input": "a", "model": "text-embedding-3-small"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error()["code"], "model_not_found");
    assert!(fake.inputs().is_empty(), "nothing reaches the engine");
}

#[tokio::test]
async fn busy_is_429() {
    let (fake, app) = embed_app();
    fake.busy.store(true, Ordering::SeqCst);
    let r = post(&app, "/v1/embeddings", json!({"input": "a"})).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.error()["code"], "server_busy");
}

#[tokio::test]
async fn wrong_kind_of_model_is_400_both_ways() {
    let (_, app) = embed_app();
    let chat = json!({"messages": [{"role": "user", "content": "a"}]});
    for (path, body) in [("/v1/chat/completions", chat), ("/v1/completions", json!({"prompt": "a"}))] {
        let r = post(&app, path, body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}");
        let e = r.error();
        assert_eq!(e["message"], "model tiny-embed is an embedding model; it does not generate text");
        assert_eq!(e["code"], "wrong_model_kind");
    }
    let (_, app) = super::app();
    let r = post(&app, "/v1/embeddings", json!({"input": "a"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error()["message"], "model tiny does not produce embeddings");
}

#[tokio::test]
async fn other_routes_on_an_embedding_server() {
    let (_, app) = embed_app();
    assert_eq!(get(&app, "/health").await.json(), json!({"status": "ok"}));
    let m = get(&app, "/v1/models").await.json();
    assert_eq!((m["data"][0]["id"].as_str(), m["data"][0]["max_model_len"].as_u64()), (Some(EMBED_MODEL), Some(6)));
    assert_eq!(get(&app, "/v1/models/tiny-embed").await.status, StatusCode::OK);
    let v = post(&app, "/tokenize", json!({"prompt": "the sky"})).await.json();
    assert_eq!(v, json!({"tokens": [0, 8, 10], "count": 3, "max_model_len": MAX_LEN}));
    let r = post(&app, "/tokenize", json!({"messages": [{"role": "user", "content": "a"}]})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(post(&app, "/detokenize", json!({"tokens": [8, 10]})).await.json(), json!({"prompt": "the sky"}));
    assert_eq!(post(&app, "/detokenize", json!({"tokens": [99]})).await.status, StatusCode::BAD_REQUEST);

    post(&app, "/v1/embeddings", json!({"input": "a"})).await;
    let text = get(&app, "/metrics").await.text();
    for line in [
        "ferrite_embedding_requests_total 7\n",
        "ferrite_embedding_inputs_total 9\n",
        "ferrite_embedding_tokens_total 30\n",
        "ferrite_embedding_batches_total 4\n",
        "ferrite_num_requests_waiting 3\n",
        "ferrite_requests_total 0\n",
        "ferrite_http_requests_total{status=\"200\"} 6\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    // A generation server reports the embedding counters as zeros.
    let (_, app) = super::app();
    assert!(get(&app, "/metrics").await.text().contains("ferrite_embedding_requests_total 0\n"));
}

#[tokio::test]
async fn api_key_applies() {
    let fake = FakeEmbedder::new();
    let app = crate::router::router(embed_state(&fake, Some("sekret")));
    let body = json!({"input": "a"});
    for headers in [&[][..], &[("authorization", "Bearer wrong")][..]] {
        let r = send(&app, request(Method::POST, "/v1/embeddings", Some(&body), headers)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.error()["code"], "invalid_api_key");
    }
    let ok = send(&app, request(Method::POST, "/v1/embeddings", Some(&body), &[("authorization", "Bearer sekret")]));
    assert_eq!(ok.await.status, StatusCode::OK);
    assert_eq!(fake.inputs().len(), 1);
    // TEI's routes answer in TEI's shape.
    let tei = json!({"inputs": "a"});
    for (method, path, body) in
        [(Method::POST, "/embed", Some(&tei)), (Method::POST, "/", Some(&tei)), (Method::GET, "/info", None)]
    {
        let r = send(&app, request(method, path, body, &[])).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(r.json()["error_type"], "validation", "{path}");
        assert!(r.json()["error"].as_str().unwrap().contains("API key"), "{path}");
    }
    let ok = send(&app, request(Method::POST, "/embed", Some(&tei), &[("authorization", "Bearer sekret")]));
    assert_eq!(ok.await.status, StatusCode::OK);
}

#[tokio::test]
async fn wrong_methods_on_tei_routes_answer_in_its_shape() {
    let (_, app) = embed_app();
    for (method, path) in [(Method::GET, "/embed"), (Method::POST, "/info")] {
        let r = send(&app, request(method, path, None, &[])).await;
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert!(r.json()["error"].as_str().unwrap().contains("not allowed"), "{path}");
    }
    // `/` is the chat page's too: a wrong method there stays OpenAI-shaped.
    let r = send(&app, request(Method::DELETE, "/", None, &[])).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.error()["code"], "method_not_allowed");
}

#[tokio::test]
async fn a_client_that_goes_away_drops_its_receiver() {
    let (fake, app) = embed_app();
    fake.hang.store(true, Ordering::SeqCst);
    let request = post(&app, "/v1/embeddings", json!({"input": ["a", "hello"]}));
    let queued = async {
        while fake.pending.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        r = request => panic!("answered while the engine holds the request: {}", r.text()),
        _ = tokio::time::timeout(Duration::from_secs(5), queued) => {}
    }
    // The handler future is gone, as when axum drops a disconnected client's.
    let pending = fake.pending.lock().unwrap();
    assert_eq!(pending.len(), 1);
    assert!(pending[0].is_closed(), "the worker would still embed it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_embedder() {
    let fake = FakeEmbedder::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(crate::serve_on(listener, embed_state(&fake, None), async move {
        let _ = stop_rx.await;
    }));
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap().unwrap();
    assert!(fake.stopped.load(Ordering::SeqCst));
}

/// text-embeddings-inference's `POST /embed`: the same vectors as a bare
/// list of lists, normalized unless asked not to; its error shape.
#[tokio::test]
async fn tei_embed_route() {
    let (fake, app) = embed_app();
    let r = post(&app, "/embed", json!({"inputs": "the sky"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json(), json!([[3.0, 18.0, 0.0, 10.25]]));
    let body = json!({"inputs": ["the sky", "a"], "normalize": false, "dimensions": 2, "truncate": true});
    let r = post(&app, "/embed", body).await;
    assert_eq!(r.json().as_array().unwrap().len(), 2);
    assert_eq!(*fake.normalize.lock().unwrap(), [Some(true), Some(false)]);
    assert_eq!(fake.submitted.lock().unwrap()[1].1, Some(2));
    // The OpenAI route leaves it to the checkpoint.
    post(&app, "/v1/embeddings", json!({"input": "a"})).await;
    assert_eq!(fake.normalize.lock().unwrap()[2], None);

    // TEI's codes: a refused request 413 ("validation"), a body that is not
    // one 422, an empty list 400 ("empty").
    for (body, status, kind) in [
        (json!({"inputs": ""}), StatusCode::PAYLOAD_TOO_LARGE, "validation"),
        (json!({"inputs": "a", "truncation_direction": "left"}), StatusCode::PAYLOAD_TOO_LARGE, "validation"),
        (json!({"inputs": "a", "prompt_name": "query"}), StatusCode::PAYLOAD_TOO_LARGE, "validation"),
        (json!({"inputs": "a", "dimensions": 99}), StatusCode::PAYLOAD_TOO_LARGE, "validation"),
        (json!({"input": "a"}), StatusCode::UNPROCESSABLE_ENTITY, "validation"),
        (json!({"inputs": []}), StatusCode::BAD_REQUEST, "empty"),
    ] {
        let r = post(&app, "/embed", body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
        let v = r.json();
        assert!(v["error"].as_str().is_some_and(|m| !m.is_empty()) && v["error_type"] == kind, "{v}");
    }
    let plain = request(Method::POST, "/embed", None, &[("content-type", "text/plain")]);
    assert_eq!(send(&app, plain).await.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // TEI's clients given the bare address post to "/".
    let r = post(&app, "/", json!({"inputs": "the sky"})).await;
    assert_eq!(r.json(), json!([[3.0, 18.0, 0.0, 10.25]]));
    fake.busy.store(true, Ordering::SeqCst);
    let r = post(&app, "/embed", json!({"inputs": "a"})).await;
    assert_eq!((r.status, &r.json()["error_type"]), (StatusCode::TOO_MANY_REQUESTS, &json!("overloaded")));
    // A text generator has no /embed.
    let (_, app) = super::app();
    let r = post(&app, "/embed", json!({"inputs": "a"})).await;
    assert_eq!(r.status, StatusCode::FAILED_DEPENDENCY);
}

/// TEI's `GET /info`: the model and the server's limits in its layout; a
/// text generator's server has none.
#[tokio::test]
async fn tei_info_route() {
    let (_, app) = embed_app();
    let r = get(&app, "/info").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model_id"], EMBED_MODEL);
    assert_eq!(v["model_type"], json!({"embedding": {"pooling": "cls"}}));
    assert_eq!(v["model_dtype"], "float32");
    assert_eq!(v["max_input_length"], MAX_LEN);
    assert_eq!((&v["max_batch_tokens"], &v["max_concurrent_requests"]), (&json!(64), &json!(5)));
    assert_eq!(v["max_client_batch_size"], ferrite_engine::embed::MAX_INPUTS);
    assert_eq!(v["auto_truncate"], false);
    assert!(v["version"].as_str().is_some_and(|s| !s.is_empty()) && v["tokenization_workers"].as_u64() >= Some(1));
    let (_, app) = super::app();
    let r = get(&app, "/info").await;
    assert_eq!((r.status, &r.json()["error_type"]), (StatusCode::NOT_FOUND, &json!("validation")));
}
