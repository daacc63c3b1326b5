//! Router-level tests over scripted fake engines (a generator and an embedder)
//! and a tiny word-level tokenizer, so the HTTP behaviour is tested without a model.

mod echo;
mod embeddings;
mod errors;
mod messages;
mod reasoning;
mod responses;
mod routes;
mod shutdown;
mod streaming;
mod timeouts;
mod tools;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{to_bytes, Body, Bytes};
use axum::http::{HeaderMap, Method, Request as HttpRequest, StatusCode};
use axum::Router;
use ferrite_core::{Error, Result};
use ferrite_engine::sampling::{TokenLogprob, TokenScore};
use ferrite_engine::{Event, FinishReason, Metrics, Request, Summary};
use ferrite_loader::chat_template::ChatTemplate;
use ferrite_loader::tokenizer::Tokenizer;
use futures_util::stream::{self, StreamExt};
use serde_json::Value;
use tower::ServiceExt;

use crate::backend::{Backend, EventStream};
use crate::state::{AppState, Served};

pub const MODEL: &str = "tiny";
pub const MAX_CONTEXT: usize = 64;
/// The fake's queue (`--max-waiting`).
pub const MAX_WAITING: usize = 8;
/// The fake model's output: the middle token's text is held (as a partial
/// character or a possible stop string would be) and released by the next.
pub const OUTPUT: [(u32, &str); 3] = [(5, "hello"), (6, ""), (7, " world")];

const WORDS: [&str; 12] =
    ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "hello", "wor", "ld", "the", "a", "sky", "is"];

/// A scripted engine: three tokens (fewer when max_tokens is smaller), or
/// in `hang` mode one token and then nothing until shutdown.
pub struct Fake {
    tokenizer: Tokenizer,
    pub submitted: Mutex<Vec<Request>>,
    pub busy: AtomicBool,
    pub hang: AtomicBool,
    /// The output's token texts instead of `OUTPUT`'s (ids 8, 9, ...).
    pub script: Mutex<Option<Vec<String>>>,
    /// Streams handed out and not dropped yet.
    pub live: Arc<AtomicUsize>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// Decrements `live` when the stream owning it is dropped.
struct Guard(Arc<AtomicUsize>);
impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    pub fn new() -> Arc<Fake> {
        Fake::with_tokenizer(tokenizer(&[]))
    }

    pub fn with_tokenizer(tokenizer: Tokenizer) -> Arc<Fake> {
        Arc::new(Fake {
            tokenizer,
            submitted: Mutex::default(),
            busy: AtomicBool::new(false),
            hang: AtomicBool::new(false),
            script: Mutex::default(),
            live: Arc::default(),
            stop: tokio::sync::watch::channel(false).0,
        })
    }

    pub fn requests(&self) -> Vec<Request> {
        self.submitted.lock().unwrap().clone()
    }

    fn events(&self, req: &Request) -> Vec<Event> {
        let output: Vec<(u32, String)> = match &*self.script.lock().unwrap() {
            Some(texts) => texts.iter().enumerate().map(|(i, t)| (8 + i as u32, t.clone())).collect(),
            None => OUTPUT.iter().map(|&(id, t)| (id, t.to_string())).collect(),
        };
        let n = req.max_tokens.min(output.len());
        let top = req.sampling.logprobs.unwrap_or(0);
        let mut events: Vec<Event> = output[..n]
            .iter()
            .map(|(token, text)| Event::Token {
                token: *token,
                text: text.clone(),
                logprob: -0.5,
                top_logprobs: (0..top as u32)
                    .map(|i| TokenLogprob { token: 8 + i, logprob: -1.0 - i as f32 })
                    .collect(),
            })
            .collect();
        let finish = if n == req.max_tokens { FinishReason::Length } else { FinishReason::Stop };
        events.push(Event::Done(summary(finish, req.prompt.len(), n)));
        if let Some(top) = req.prompt_logprobs {
            // Each prompt token after the first scores -2 (rank 3), its alternatives as above.
            let alternatives = (0..top as u32).map(|i| TokenLogprob { token: 8 + i, logprob: -1.0 - i as f32 });
            let score =
                |&token: &u32| TokenScore { token, logprob: -2.0, rank: 3, top: alternatives.clone().collect() };
            events.insert(0, Event::PromptLogprobs(req.prompt[1..].iter().map(score).collect()));
        }
        events
    }
}

fn summary(finish: FinishReason, prompt_tokens: usize, completion_tokens: usize) -> Summary {
    Summary { finish, prompt_tokens, completion_tokens, cached_tokens: 1, error: None, stop: None }
}

impl Backend for Fake {
    fn submit(&self, req: Request) -> Result<EventStream> {
        if req.prompt.is_empty() {
            return Err(Error::InvalidInput("the prompt is empty".into()));
        }
        if req.prompt.len() + req.max_tokens > MAX_CONTEXT {
            return Err(Error::InvalidInput(format!("this model's context holds {MAX_CONTEXT} tokens")));
        }
        req.sampling.validate().map_err(Error::InvalidInput)?;
        if self.busy.load(Ordering::SeqCst) || *self.stop.borrow() {
            return Err(Error::Busy("too many requests".into()));
        }
        self.submitted.lock().unwrap().push(req.clone());
        self.live.fetch_add(1, Ordering::SeqCst);
        let guard = Guard(self.live.clone());
        let owned = move |e: Event| {
            let _ = &guard;
            e
        };
        if self.hang.load(Ordering::SeqCst) {
            let first = self.events(&req).remove(0);
            let mut rx = self.stop.subscribe();
            let prompt_tokens = req.prompt.len();
            let end = stream::once(async move {
                let _ = rx.wait_for(|&s| s).await;
                Event::Done(summary(FinishReason::Cancelled, prompt_tokens, 1))
            });
            return Ok(Box::pin(stream::iter([first]).chain(end).map(owned)));
        }
        // The channel stays open after `Done`: the server must not wait for it to close.
        Ok(Box::pin(stream::iter(self.events(&req)).chain(stream::pending()).map(owned)))
    }
    fn metrics(&self) -> Metrics {
        Metrics { running: 1, waiting: 2, kv_blocks_total: 100, kv_blocks_used: 25, ..Default::default() }
    }
    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    fn max_context(&self) -> usize {
        MAX_CONTEXT
    }
    fn vocab_size(&self) -> usize {
        WORDS.len()
    }
    fn max_waiting(&self) -> usize {
        MAX_WAITING
    }
    fn shutdown(&self) {
        let _ = self.stop.send(true);
    }
}

/// A word-level tokenizer.json with BOS added, written to a temp folder:
/// `WORDS`, then `special` (more special tokens, ids from 12 on).
pub fn tokenizer(special: &[&str]) -> Tokenizer {
    let words: Vec<&str> = WORDS.iter().chain(special).copied().collect();
    let vocab: serde_json::Map<String, Value> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), Value::from(i))).collect();
    let specials = (0..5).chain(WORDS.len()..words.len());
    let added: Vec<Value> = specials
        .map(|i| (i, words[i]))
        .map(|(i, w)| {
            serde_json::json!({"id": i, "content": w, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let dir = std::env::temp_dir().join(format!(
        "ferrite-server-test-{}-{}",
        std::process::id(),
        crate::convert::random_u64()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    let config = r#"{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true}"#;
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    tok
}

/// A template that prints BOS itself, like most do.
pub fn template() -> ChatTemplate {
    let src = "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}\
               {% if add_generation_prompt %}<|assistant|>{% endif %}";
    ChatTemplate::new(src, "<s>", "</s>").unwrap()
}

pub fn app_with(fake: &Arc<Fake>, api_key: Option<&str>, template: Option<ChatTemplate>) -> Router {
    let state = AppState::new(Served::Generator(fake.clone()), MODEL.into(), api_key.map(str::to_string), template);
    crate::router::router(state)
}

pub fn app() -> (Arc<Fake>, Router) {
    let fake = Fake::new();
    let app = app_with(&fake, None, Some(template()));
    (fake, app)
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    pub fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).unwrap()
    }
    /// The `data:` payloads of an SSE body, `[DONE]` included.
    pub fn events(&self) -> Vec<String> {
        let text = self.text();
        assert!(text.ends_with("\n\n"), "{text}");
        text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").expect(e).to_string()).collect()
    }
    /// A typed SSE body's events, checking that each one's name is its `type`.
    pub fn typed_events(&self) -> Vec<Value> {
        let text = self.text();
        assert!(text.ends_with("\n\n") && !text.contains("[DONE]"), "{text}");
        (text.split("\n\n").filter(|e| !e.is_empty()))
            .map(|e| {
                let (name, data) = e.split_once('\n').expect(e);
                let v: Value = serde_json::from_str(data.strip_prefix("data: ").expect(e)).unwrap();
                assert_eq!(name.strip_prefix("event: "), v["type"].as_str(), "{e}");
                v
            })
            .collect()
    }
    /// The error body's `error` object, checking its shape.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }
}

pub fn request(method: Method, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> HttpRequest<Body> {
    let mut b = HttpRequest::builder().method(method).uri(path);
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body.map(|v| Body::from(v.to_string())).unwrap_or_default()).unwrap()
}

pub async fn send(app: &Router, req: HttpRequest<Body>) -> Reply {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = to_bytes(res.into_body(), usize::MAX).await.unwrap();
    Reply { status, headers, body }
}

pub async fn post(app: &Router, path: &str, body: Value) -> Reply {
    send(app, request(Method::POST, path, Some(&body), &[])).await
}

pub async fn get(app: &Router, path: &str) -> Reply {
    send(app, request(Method::GET, path, None, &[])).await
}
