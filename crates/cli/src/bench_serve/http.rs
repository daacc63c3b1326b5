//! Plain-HTTP client for an OpenAI-compatible server: base-URL checks, JSON
//! requests, tokenize probing, and one streamed completion, timed.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::sse;

/// Checks `url` and returns the base that paths like `/v1/models` append to:
/// no trailing slash, and no trailing `/v1` (so both `http://h:8000` and
/// `http://h:8000/v1` work).
pub fn base_url(url: &str) -> Result<String, String> {
    let url = url.trim();
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(format!("--url {url}: https is not supported, only plain http:// (put a TLS proxy in front)"));
    }
    if !lower.starts_with("http://") {
        return Err(format!("--url {url}: expected http://HOST:PORT"));
    }
    let uri: hyper::Uri = url.parse().map_err(|e| format!("--url {url}: {e}"))?;
    match uri.host() {
        Some(h) if !h.is_empty() => {}
        _ => return Err(format!("--url {url}: no host")),
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    if authority.contains('@') {
        return Err(format!("--url {url}: credentials in the URL are not supported (use --api-key)"));
    }
    // After an IPv6 literal's `]`, if any.
    let after_host = authority.rsplit(']').next().unwrap_or("");
    if let Some((_, port)) = after_host.rsplit_once(':') {
        if port.parse::<u16>().is_err() {
            return Err(format!("--url {url}: bad port {port:?}"));
        }
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(format!("--url {url}: a base URL takes no query or fragment"));
    }
    let mut base = format!("http://{authority}{}", uri.path());
    while base.ends_with('/') {
        base.pop();
    }
    if let Some(b) = base.strip_suffix("/v1") {
        base = b.to_string();
    }
    Ok(base)
}

/// An error and its causes on one line ("client error (Connect): tcp connect
/// error: Connection refused (os error 111)").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !parts.last().is_some_and(|p| p.contains(&m)) {
            parts.push(m);
        }
        src = s.source();
    }
    parts.join(": ")
}

/// The message in an error body: OpenAI's `{"error": {"message": …}}`,
/// `{"error": "…"}`, FastAPI's `{"detail": …}`, `{"message": …}`, else the
/// text itself (shortened).
pub fn error_message(body: &[u8]) -> String {
    fn pick(x: &Value) -> Option<String> {
        match x {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }
    let text = String::from_utf8_lossy(body);
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        let found = match v.get("error") {
            Some(e) => e.get("message").and_then(pick).or_else(|| pick(e)),
            None => v.get("detail").and_then(pick).or_else(|| v.get("message").and_then(pick)),
        };
        if let Some(m) = found {
            return shorten(&m, 300);
        }
    }
    let t = text.trim();
    if t.is_empty() {
        "(empty body)".into()
    } else {
        shorten(t, 300)
    }
}

/// At most `n` characters, on one line.
pub fn shorten(s: &str, n: usize) -> String {
    let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= n {
        one
    } else {
        format!("{}…", one.chars().take(n).collect::<String>())
    }
}

/// How a server tokenizes text, if it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizeApi {
    /// `POST /tokenize {"prompt"}` → `{"tokens"}`: ferrite and vLLM.
    Prompt,
    /// `POST /tokenize {"content"}` → `{"tokens"}`: llama.cpp's llama-server.
    Content,
    /// `POST /extras/tokenize {"input"}` → `{"tokens"}`: llama-cpp-python.
    Extras,
}

impl TokenizeApi {
    pub fn describe(self) -> &'static str {
        match self {
            TokenizeApi::Prompt => "POST /tokenize {\"prompt\"}",
            TokenizeApi::Content => "POST /tokenize {\"content\"}",
            TokenizeApi::Extras => "POST /extras/tokenize {\"input\"}",
        }
    }
}

#[derive(Clone)]
pub struct Server {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    api_key: Option<String>,
}

type Fail = String;

impl Server {
    pub fn new(base: String, api_key: Option<String>) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(Duration::from_secs(10)));
        conn.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(conn);
        Server { client, base, api_key }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Response<Incoming>, Fail> {
        let mut b = Request::builder().method(method).uri(self.url(path));
        if let Some(k) = &self.api_key {
            b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let body = match body {
            Some(v) => {
                b = b.header(header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(serde_json::to_vec(v).map_err(|e| e.to_string())?))
            }
            None => Full::new(Bytes::new()),
        };
        let req = b.body(body).map_err(|e| format!("bad request for {}: {e}", self.url(path)))?;
        self.client.request(req).await.map_err(|e| format!("{}: {}", self.url(path), error_chain(&e)))
    }

    /// A JSON request and its JSON answer; non-2xx statuses are errors
    /// carrying the body's message.
    pub async fn json(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, Fail> {
        let resp = self.send(method, path, body).await?;
        let status = resp.status();
        let bytes = read_limited(resp.into_body(), 16 << 20).await?;
        if !status.is_success() {
            return Err(format!("{}: HTTP {}: {}", self.url(path), status.as_u16(), error_message(&bytes)));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            format!("{}: answer is not JSON ({e}): {}", self.url(path), shorten(&String::from_utf8_lossy(&bytes), 200))
        })
    }

    /// The first model `GET /v1/models` lists.
    pub async fn first_model(&self) -> Result<String, Fail> {
        let v = self.json(Method::GET, "/v1/models", None).await?;
        v.get("data")
            .and_then(|d| d.as_array())
            .and_then(|d| d.first())
            .and_then(|m| m.get("id"))
            .and_then(|id| id.as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("{}: no model listed; pass --model", self.url("/v1/models")))
    }

    /// Token count of `text` through `api`.
    pub async fn tokenize(&self, api: TokenizeApi, text: &str) -> Result<usize, Fail> {
        let (path, body) = match api {
            TokenizeApi::Prompt => ("/tokenize", serde_json::json!({ "prompt": text })),
            TokenizeApi::Content => ("/tokenize", serde_json::json!({ "content": text, "add_special": true })),
            TokenizeApi::Extras => ("/extras/tokenize", serde_json::json!({ "input": text })),
        };
        let v = self.json(Method::POST, path, Some(&body)).await?;
        v.get("tokens")
            .and_then(|t| t.as_array())
            .map(|t| t.len())
            .ok_or_else(|| format!("{}: no \"tokens\" array in the answer", self.url(path)))
    }

    /// The first tokenize API that works: answers a tokens array, non-empty
    /// for a non-empty text (llama-server answers `{"tokens": []}` to a body
    /// without "content").
    pub async fn probe_tokenize(&self) -> Option<TokenizeApi> {
        for api in [TokenizeApi::Prompt, TokenizeApi::Content, TokenizeApi::Extras] {
            if let Ok(n) = self.tokenize(api, "hello world").await {
                if n > 0 {
                    return Some(api);
                }
            }
        }
        None
    }

    /// Sends one streaming request and times it.
    pub async fn stream(&self, path: &str, body: &Value, chat: bool, timeout: Duration) -> Outcome {
        let start = Instant::now();
        let mut state = StreamState::new(chat);
        let res = tokio::time::timeout(timeout, self.stream_inner(path, body, start, &mut state)).await;
        let err = match res {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("timed out after {}s (--timeout)", timeout.as_secs_f64())),
        };
        state.into_outcome(err, start.elapsed().as_secs_f64())
    }

    async fn stream_inner(&self, path: &str, body: &Value, start: Instant, st: &mut StreamState) -> Result<(), Fail> {
        let resp = self.send(Method::POST, path, Some(body)).await?;
        let status = resp.status();
        let mut body = resp.into_body();
        if status != StatusCode::OK {
            let bytes = read_limited(body, 1 << 20).await.unwrap_or_default();
            return Err(format!("HTTP {}: {}", status.as_u16(), error_message(&bytes)));
        }
        let mut parser = sse::Parser::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the stream: {}", error_chain(&e)))?;
            let Ok(data) = frame.into_data() else { continue };
            let t = start.elapsed().as_secs_f64();
            st.saw_bytes(&data);
            for ev in parser.push(&data) {
                st.on_event(&ev, t)?;
            }
            if st.done.is_some() {
                // Let the response finish so the connection goes back to the
                // pool; don't wait on a server that keeps it open.
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(Ok(_)) = body.frame().await {}
                })
                .await;
                return Ok(());
            }
        }
        let t = start.elapsed().as_secs_f64();
        for ev in parser.finish() {
            st.on_event(&ev, t)?;
        }
        st.end_of_body(t);
        Ok(())
    }
}

async fn read_limited(mut body: Incoming, limit: usize) -> Result<Vec<u8>, Fail> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the answer: {}", error_chain(&e)))?;
        if let Ok(d) = frame.into_data() {
            out.extend_from_slice(&d);
            if out.len() >= limit {
                break;
            }
        }
    }
    Ok(out)
}

/// What one request measured. Times are seconds from sending the request.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub error: Option<String>,
    /// First chunk with generated text.
    pub ttft: Option<f64>,
    /// Gaps between consecutive chunks with generated text.
    pub itl: Vec<f64>,
    /// Until `[DONE]` (or the end of the body, or the failure).
    pub e2e: f64,
    /// From the usage chunk.
    pub usage_prompt_tokens: Option<u64>,
    pub usage_completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`: prompt tokens a prefix
    /// cache served.
    pub usage_cached_tokens: Option<u64>,
    /// Chunks with generated text.
    pub content_chunks: u64,
    pub finish_reason: Option<String>,
}

/// The per-request stream state machine, fed parsed events.
pub struct StreamState {
    chat: bool,
    events: usize,
    /// The first bytes, for the error message of a stream that isn't SSE.
    head: Vec<u8>,
    first: Option<f64>,
    last: Option<f64>,
    itl: Vec<f64>,
    chunks: u64,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    finish_reason: Option<String>,
    /// When `[DONE]` arrived.
    done: Option<f64>,
    /// When the body ended without `[DONE]`.
    eof: Option<f64>,
}

impl StreamState {
    pub fn new(chat: bool) -> Self {
        StreamState {
            chat,
            events: 0,
            head: Vec::new(),
            first: None,
            last: None,
            itl: Vec::new(),
            chunks: 0,
            prompt_tokens: None,
            completion_tokens: None,
            cached_tokens: None,
            finish_reason: None,
            done: None,
            eof: None,
        }
    }

    fn saw_bytes(&mut self, b: &[u8]) {
        if self.head.len() < 200 {
            self.head.extend_from_slice(&b[..b.len().min(200 - self.head.len())]);
        }
    }

    pub fn end_of_body(&mut self, t: f64) {
        self.eof = Some(t);
    }

    /// One event at time `t`; an error ends the request.
    pub fn on_event(&mut self, ev: &sse::Event, t: f64) -> Result<(), Fail> {
        self.events += 1;
        if self.done.is_some() {
            return Ok(());
        }
        if ev.event.as_deref() == Some("error") {
            return Err(format!("error event in the stream: {}", error_message(ev.data.as_bytes())));
        }
        let data = ev.data.trim();
        if data == "[DONE]" {
            self.done = Some(t);
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| format!("malformed stream: data is not JSON ({e}): {}", shorten(data, 200)))?;
        if v.get("error").is_some_and(|e| !e.is_null()) {
            return Err(format!("error in the stream: {}", error_message(data.as_bytes())));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            if let Some(p) = u.get("prompt_tokens").and_then(Value::as_u64) {
                self.prompt_tokens = Some(p);
            }
            if let Some(c) = u.get("completion_tokens").and_then(Value::as_u64) {
                self.completion_tokens = Some(c);
            }
            if let Some(c) = u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64) {
                self.cached_tokens = Some(c);
            }
        }
        let mut content = false;
        for c in v.get("choices").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
            let has = |x: Option<&Value>| x.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
            content |= if self.chat {
                let d = c.get("delta");
                has(d.and_then(|d| d.get("content"))) || has(d.and_then(|d| d.get("reasoning_content")))
            } else {
                has(c.get("text"))
            };
            if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(f.to_string());
            }
        }
        if content {
            match self.last {
                None => self.first = Some(t),
                Some(l) => self.itl.push(t - l),
            }
            self.last = Some(t);
            self.chunks += 1;
        }
        Ok(())
    }

    /// The measurement, or the reason the request failed. `now` is the time of
    /// the failure or of the end.
    pub fn into_outcome(self, err: Option<Fail>, now: f64) -> Outcome {
        let err = err.or_else(|| {
            if self.events == 0 {
                let head = String::from_utf8_lossy(&self.head).into_owned();
                Some(if head.trim().is_empty() {
                    "malformed stream: empty response body".to_string()
                } else {
                    format!("malformed stream: no server-sent events in the answer: {}", shorten(&head, 200))
                })
            } else if self.done.is_none() && self.finish_reason.is_none() {
                Some("malformed stream: it ended without [DONE] or a finish_reason".into())
            } else if self.finish_reason.is_none() {
                // llama-cpp-python's server does this to a stream when another
                // request arrives, unless started with --interrupt_requests False.
                Some("the stream ended without a finish_reason (interrupted by the server?)".into())
            } else if self.chunks == 0 {
                Some("the stream carried no generated text".into())
            } else {
                None
            }
        });
        let e2e = if err.is_some() { now } else { self.done.or(self.eof).unwrap_or(now) };
        Outcome {
            error: err,
            ttft: self.first,
            itl: self.itl,
            e2e,
            usage_prompt_tokens: self.prompt_tokens,
            usage_completion_tokens: self.completion_tokens,
            usage_cached_tokens: self.cached_tokens,
            content_chunks: self.chunks,
            finish_reason: self.finish_reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(chat: bool, stream: &str, times: &[f64]) -> Outcome {
        let mut p = sse::Parser::new();
        let mut st = StreamState::new(chat);
        st.saw_bytes(stream.as_bytes());
        let mut evs = p.push(stream.as_bytes());
        evs.extend(p.finish());
        for (i, ev) in evs.iter().enumerate() {
            if let Err(e) = st.on_event(ev, times.get(i).copied().unwrap_or(9.0)) {
                return st.into_outcome(Some(e), 9.5);
            }
        }
        st.into_outcome(None, 10.0)
    }

    #[test]
    fn completion_stream_with_usage() {
        let s = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\n\
                 data: {\"choices\":[{\"text\":\"\",\"finish_reason\":null}]}\n\n\
                 data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":null}]}\n\n\
                 data: {\"choices\":[{\"text\":\"c\",\"finish_reason\":\"length\"}],\"usage\":null}\n\n\
                 data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,\
                 \"prompt_tokens_details\":{\"cached_tokens\":5}}}\n\n\
                 data: [DONE]\n\n";
        let o = feed(false, s, &[0.5, 0.6, 0.7, 1.0, 1.1, 1.2]);
        assert_eq!(o.error, None);
        assert_eq!(o.ttft, Some(0.5));
        assert_eq!(o.content_chunks, 3);
        assert_eq!(o.itl.len(), 2);
        assert!((o.itl[0] - 0.2).abs() < 1e-12 && (o.itl[1] - 0.3).abs() < 1e-12);
        assert_eq!(o.e2e, 1.2);
        assert_eq!((o.usage_prompt_tokens, o.usage_completion_tokens), (Some(12), Some(4)));
        assert_eq!(o.usage_cached_tokens, Some(5));
        assert_eq!(o.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn chat_stream_counts_delta_content_only() {
        let s = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n\
                 data: [DONE]\n\n";
        let o = feed(true, s, &[0.1, 0.2, 0.3, 0.4]);
        assert_eq!(o.error, None);
        assert_eq!(o.ttft, Some(0.2));
        assert_eq!(o.content_chunks, 1);
        assert_eq!(o.usage_completion_tokens, None);
    }

    #[test]
    fn stream_failures() {
        let o = feed(false, "data: {not json}\n\n", &[]);
        assert!(o.error.unwrap().starts_with("malformed stream: data is not JSON"));
        let o = feed(false, "data: {\"error\":{\"message\":\"out of memory\"}}\n\n", &[]);
        assert_eq!(o.error.unwrap(), "error in the stream: out of memory");
        let o = feed(false, "event: error\ndata: {\"message\":\"boom\"}\n\n", &[]);
        assert_eq!(o.error.unwrap(), "error event in the stream: boom");
        let o = feed(false, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", &[]);
        assert!(o.error.unwrap().contains("without [DONE]"));
        let o = feed(false, "{\"choices\": []}", &[]);
        assert!(o.error.unwrap().contains("no server-sent events"));
        let o =
            feed(false, "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", &[]);
        assert_eq!(o.error.unwrap(), "the stream carried no generated text");
        let o = feed(false, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n", &[]);
        assert!(o.error.unwrap().contains("without a finish_reason"));
        // A finish_reason without [DONE] is accepted.
        let o = feed(false, "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"stop\"}]}\n\n", &[1.0]);
        assert_eq!(o.error, None);
        assert_eq!(o.e2e, 10.0);
    }

    #[test]
    fn base_urls() {
        assert_eq!(base_url("http://localhost:8090").unwrap(), "http://localhost:8090");
        assert_eq!(base_url("http://localhost:8090/").unwrap(), "http://localhost:8090");
        assert_eq!(base_url("http://localhost:8090/v1/").unwrap(), "http://localhost:8090");
        assert_eq!(base_url(" http://10.0.0.1/api ").unwrap(), "http://10.0.0.1/api");
        assert!(base_url("https://x").unwrap_err().contains("https is not supported"));
        assert!(base_url("localhost:8090").unwrap_err().contains("expected http://"));
        assert!(base_url("http://").is_err());
        assert!(base_url("http://a b").is_err());
        assert!(base_url("http://h:99999").is_err());
        assert!(base_url("http://h:").is_err());
        assert!(base_url("http://u:p@h:80").unwrap_err().contains("--api-key"));
        assert_eq!(base_url("http://[::1]:8000").unwrap(), "http://[::1]:8000");
        assert!(base_url("http://h/?q=1").is_err());
    }

    #[test]
    fn error_messages() {
        assert_eq!(error_message(br#"{"error":{"message":"bad model","type":"x"}}"#), "bad model");
        assert_eq!(error_message(br#"{"error":"nope"}"#), "nope");
        assert_eq!(error_message(br#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message(br#"{"detail":[{"msg":"x"}]}"#), r#"[{"msg":"x"}]"#);
        assert_eq!(error_message(b"plain\ntext"), "plain text");
        assert_eq!(error_message(b""), "(empty body)");
    }
}
