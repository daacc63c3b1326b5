//! `ferrite bench-serve`: a load generator for OpenAI-compatible servers, like
//! `vllm bench serve`. Sends --requests streamed completions with at most
//! --concurrency in flight, each with a different random prompt of about
//! --input-len tokens (exactly, when the server can tokenize) and exactly
//! --output-len generated tokens (`ignore_eos`/`min_tokens`), and reports
//! throughput and TTFT / TPOT / ITL / end-to-end latency percentiles.
//!
//! Plain HTTP/1.1 through hyper's client, server-sent events parsed
//! incrementally; one single-threaded tokio runtime, so the client takes as
//! little CPU as possible from a server on the same machine.

mod http;
mod prompt;
mod sse;
mod stats;

use std::collections::HashMap;
use std::future::Future;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use ferrite_core::{Error, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Map, Value};

use http::{Outcome, Server, TokenizeApi};
use stats::Summary;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Endpoint {
    /// POST /v1/completions with the prompt as text.
    Completions,
    /// POST /v1/chat/completions with the prompt as one user message.
    Chat,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Base URL of an OpenAI-compatible server: http://HOST:PORT (a trailing
    /// /v1 is fine; https is not supported).
    #[arg(long)]
    pub url: String,
    /// Most requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Requests to send (each with its own prompt).
    #[arg(long, default_value_t = 32)]
    pub requests: usize,
    /// Prompt length in tokens: exact when the server has a tokenize endpoint,
    /// else about one token per word.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens to generate per request (max_tokens, with ignore_eos and
    /// min_tokens so every request generates exactly this many).
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    /// Model name to send (default: the first id GET /v1/models lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Seed of the random prompts: same seed, same prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,
    /// Print one JSON object (and no progress bar).
    #[arg(long)]
    pub json: bool,
    /// Untimed requests sent one at a time before the benchmark (short
    /// outputs); a failing warm-up stops the run with its error.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Seconds one request may take before it counts as failed.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Don't use the server's tokenize endpoint: prompts of --input-len words.
    #[arg(long)]
    pub no_tokenize: bool,
    /// JSON object merged into every request body (a null value removes a
    /// field), e.g. '{"min_tokens": null, "top_k": 1}'.
    #[arg(long)]
    pub extra_body: Option<String>,
}

/// Arguments checked and resolved before anything is sent.
struct Config {
    base: String,
    concurrency: usize,
    requests: usize,
    input_len: usize,
    output_len: usize,
    seed: u64,
    endpoint: Endpoint,
    warmup: usize,
    timeout: Duration,
    tokenize: bool,
    extra: Map<String, Value>,
}

fn check(a: &BenchServeArgs) -> Result<Config> {
    let bad = |m: String| Err(Error::InvalidInput(m));
    if a.concurrency == 0 {
        return bad("--concurrency must be at least 1".into());
    }
    if a.requests == 0 {
        return bad("--requests must be at least 1".into());
    }
    if a.input_len == 0 {
        return bad("--input-len must be at least 1".into());
    }
    if a.output_len == 0 {
        return bad("--output-len must be at least 1".into());
    }
    if !(a.timeout.is_finite() && a.timeout > 0.0 && a.timeout < 1e9) {
        return bad(format!("--timeout {}: must be a positive number of seconds", a.timeout));
    }
    let base = http::base_url(&a.url).map_err(Error::InvalidInput)?;
    let extra = match &a.extra_body {
        None => Map::new(),
        Some(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return bad("--extra-body must be a JSON object".into()),
            Err(e) => return bad(format!("--extra-body is not JSON: {e}")),
        },
    };
    Ok(Config {
        base,
        concurrency: a.concurrency.min(a.requests),
        requests: a.requests,
        input_len: a.input_len,
        output_len: a.output_len,
        seed: a.seed,
        endpoint: a.endpoint,
        warmup: a.warmup,
        timeout: Duration::from_secs_f64(a.timeout),
        tokenize: !a.no_tokenize,
        extra,
    })
}

/// One request's prompt.
struct Prompt {
    text: String,
    /// As the server's tokenize endpoint counted it.
    tokens: Option<usize>,
    words: usize,
}

/// The prompt of request `index`: `target` words, then (with a tokenize API)
/// grown or trimmed until the server counts `target` tokens, or as close as
/// a few tries get.
async fn make_prompt(server: &Server, api: Option<TokenizeApi>, seed: u64, index: u64, target: usize) -> Prompt {
    let mut words = prompt::Words::new(seed, index);
    let estimate = |words: &mut prompt::Words| Prompt { text: words.text(target), tokens: None, words: target };
    let Some(api) = api else { return estimate(&mut words) };
    let mut n = target;
    let mut tried = Vec::new();
    let mut best: Option<(usize, usize)> = None; // (words, tokens)
    for _ in 0..8 {
        let Ok(t) = server.tokenize(api, &words.text(n)).await else { return estimate(&mut words) };
        tried.push(n);
        let better = match best {
            None => true,
            // Closer wins; on a tie, the shorter one.
            Some((_, bt)) => (t.abs_diff(target), t) < (bt.abs_diff(target), bt),
        };
        if better {
            best = Some((n, t));
        }
        if t == target {
            break;
        }
        let next = prompt::next_word_count(n, t, target);
        if tried.contains(&next) {
            break;
        }
        n = next;
    }
    let (n, t) = best.unwrap_or((target, target));
    Prompt { text: words.text(n), tokens: Some(t), words: n }
}

fn request_body(c: &Config, model: &str, prompt: &str, max_tokens: usize) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
        // Exactly max_tokens, so runs are comparable: ignore_eos for ferrite,
        // vLLM and llama-server; min_tokens for llama-cpp-python and vLLM.
        "ignore_eos": true,
        "min_tokens": max_tokens,
    });
    let obj = body.as_object_mut().expect("a JSON object literal");
    match c.endpoint {
        Endpoint::Completions => obj.insert("prompt".into(), json!(prompt)),
        Endpoint::Chat => obj.insert("messages".into(), json!([{"role": "user", "content": prompt}])),
    };
    for (k, v) in &c.extra {
        if v.is_null() {
            obj.remove(k);
        } else {
            obj.insert(k.clone(), v.clone());
        }
    }
    body
}

/// Runs `f(0..n)` on `workers` tasks, each taking the next index when its
/// previous call finishes; the results in index order.
async fn pool<T, F, Fut>(n: usize, workers: usize, f: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..workers.clamp(1, n.max(1)))
        .map(|_| {
            let (f, next) = (f.clone(), next.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break out;
                    }
                    out.push((i, f(i).await));
                }
            })
        })
        .collect();
    let mut all: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for h in handles {
        let part = h.await.map_err(|e| Error::Format(format!("bench-serve: a task failed: {e}")))?;
        for (i, t) in part {
            all[i] = Some(t);
        }
    }
    Ok(all.into_iter().flatten().collect())
}

/// Where a token count came from, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Source {
    /// The usage chunk of the response: what the server counted.
    Usage,
    /// The server's tokenize endpoint, before the request.
    Tokenize,
    /// Chunks with text (one token each, usually).
    Chunks,
    /// One token per prompt word.
    Estimate,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Usage => "usage",
            Source::Tokenize => "tokenize",
            Source::Chunks => "chunks",
            Source::Estimate => "estimate",
        }
    }
}

/// The sources of a total: one name, or "mixed (…)".
fn sources(s: &HashMap<Source, usize>) -> String {
    let mut v: Vec<_> = s.iter().collect();
    v.sort();
    match v.as_slice() {
        [] => "none".into(),
        [(s, _)] => s.name().into(),
        many => {
            format!("mixed ({})", many.iter().map(|(s, n)| format!("{} {n}", s.name())).collect::<Vec<_>>().join(", "))
        }
    }
}

struct Report {
    model: String,
    tokenize_api: Option<TokenizeApi>,
    duration: f64,
    completed: usize,
    failed: usize,
    /// Distinct messages in order of first occurrence, with counts.
    errors: Vec<(String, usize)>,
    input_tokens: u64,
    output_tokens: u64,
    /// Prompt tokens served from a prefix cache, when the server says.
    cached_tokens: Option<u64>,
    input_sources: HashMap<Source, usize>,
    output_sources: HashMap<Source, usize>,
    /// Successful requests that generated other than --output-len tokens.
    output_len_mismatch: usize,
    /// Of successful requests ("none" when the stream gave none).
    finish_reasons: Vec<(String, usize)>,
    ttft: Summary,
    tpot: Summary,
    itl: Summary,
    e2e: Summary,
}

fn summarize(
    model: String,
    tokenize_api: Option<TokenizeApi>,
    duration: f64,
    c: &Config,
    prompts: &[Prompt],
    outcomes: &[Outcome],
) -> Report {
    let mut r = Report {
        model,
        tokenize_api,
        duration,
        completed: 0,
        failed: 0,
        errors: Vec::new(),
        input_tokens: 0,
        output_tokens: 0,
        cached_tokens: None,
        input_sources: HashMap::new(),
        output_sources: HashMap::new(),
        output_len_mismatch: 0,
        finish_reasons: Vec::new(),
        ttft: Summary::default(),
        tpot: Summary::default(),
        itl: Summary::default(),
        e2e: Summary::default(),
    };
    let (mut ttft, mut tpot, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (p, o) in prompts.iter().zip(outcomes) {
        if let Some(e) = &o.error {
            r.failed += 1;
            match r.errors.iter_mut().find(|(m, _)| m == e) {
                Some((_, n)) => *n += 1,
                None => r.errors.push((e.clone(), 1)),
            }
            continue;
        }
        r.completed += 1;
        let (inp, isrc) = match (o.usage_prompt_tokens, p.tokens) {
            (Some(u), _) => (u, Source::Usage),
            (None, Some(t)) => (t as u64, Source::Tokenize),
            (None, None) => (p.words as u64, Source::Estimate),
        };
        let (out, osrc) = match o.usage_completion_tokens {
            Some(u) => (u, Source::Usage),
            None => (o.content_chunks, Source::Chunks),
        };
        if let Some(ct) = o.usage_cached_tokens {
            *r.cached_tokens.get_or_insert(0) += ct;
        }
        r.input_tokens += inp;
        r.output_tokens += out;
        *r.input_sources.entry(isrc).or_default() += 1;
        *r.output_sources.entry(osrc).or_default() += 1;
        let reason = o.finish_reason.clone().unwrap_or_else(|| "none".into());
        match r.finish_reasons.iter_mut().find(|(f, _)| *f == reason) {
            Some((_, n)) => *n += 1,
            None => r.finish_reasons.push((reason, 1)),
        }
        if out != c.output_len as u64 {
            r.output_len_mismatch += 1;
        }
        if let Some(t) = o.ttft {
            ttft.push(t);
            if out > 1 {
                tpot.push((o.e2e - t) / (out - 1) as f64);
            }
        }
        itl.extend_from_slice(&o.itl);
        e2e.push(o.e2e);
    }
    r.ttft = Summary::of_seconds(&ttft);
    r.tpot = Summary::of_seconds(&tpot);
    r.itl = Summary::of_seconds(&itl);
    r.e2e = Summary::of_seconds(&e2e);
    r
}

fn per_s(x: f64, d: f64) -> f64 {
    if d > 0.0 {
        x / d
    } else {
        0.0
    }
}

/// Prompt index of the first warm-up request.
const WARMUP_INDEX: u64 = 1 << 63;

/// At most this many distinct error messages are reported.
const MAX_ERRORS: usize = 5;

fn to_json(r: &Report, c: &Config) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.into(), v);
    };
    put("url", json!(c.base));
    put("endpoint", json!(c.endpoint.path()));
    put("model", json!(r.model));
    put("concurrency", json!(c.concurrency));
    put("num_requests", json!(c.requests));
    put("input_len", json!(c.input_len));
    put("output_len", json!(c.output_len));
    put("seed", json!(c.seed));
    put("tokenize_api", json!(r.tokenize_api.map(TokenizeApi::describe)));
    put("completed", json!(r.completed));
    put("failed", json!(r.failed));
    put(
        "errors",
        json!(r.errors.iter().take(MAX_ERRORS).map(|(e, n)| json!({"message": e, "count": n})).collect::<Vec<_>>()),
    );
    put("duration_s", json!(r.duration));
    put("request_throughput", json!(per_s(r.completed as f64, r.duration)));
    put("output_throughput", json!(per_s(r.output_tokens as f64, r.duration)));
    put("total_token_throughput", json!(per_s((r.input_tokens + r.output_tokens) as f64, r.duration)));
    put("total_input_tokens", json!(r.input_tokens));
    put("total_output_tokens", json!(r.output_tokens));
    put("cached_input_tokens", json!(r.cached_tokens));
    put("input_tokens_source", json!(sources(&r.input_sources)));
    put("output_tokens_source", json!(sources(&r.output_sources)));
    put("output_len_mismatch", json!(r.output_len_mismatch));
    put("finish_reasons", Value::Object(r.finish_reasons.iter().map(|(f, n)| (f.clone(), json!(n))).collect()));
    r.ttft.add_json(&mut m, "ttft");
    r.tpot.add_json(&mut m, "tpot");
    r.itl.add_json(&mut m, "itl");
    r.e2e.add_json(&mut m, "e2el");
    Value::Object(m)
}

fn to_text(r: &Report, c: &Config) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let row = |s: &mut String, k: &str, v: String| {
        let _ = writeln!(s, "{:<38}{v}", format!("{k}:"));
    };
    let _ = writeln!(s, "{:=^62}", " Serving Benchmark Result ");
    row(&mut s, "Server", format!("{}{}", c.base, c.endpoint.path()));
    row(&mut s, "Model", r.model.clone());
    row(&mut s, "Concurrency", c.concurrency.to_string());
    row(&mut s, "Successful requests", r.completed.to_string());
    row(&mut s, "Failed requests", r.failed.to_string());
    row(&mut s, "Benchmark duration (s)", format!("{:.2}", r.duration));
    row(&mut s, "Total input tokens", format!("{} ({})", r.input_tokens, sources(&r.input_sources)));
    if let Some(ct) = r.cached_tokens {
        row(&mut s, "Input tokens from a prefix cache", ct.to_string());
    }
    row(&mut s, "Total generated tokens", format!("{} ({})", r.output_tokens, sources(&r.output_sources)));
    row(&mut s, "Request throughput (req/s)", format!("{:.2}", per_s(r.completed as f64, r.duration)));
    row(&mut s, "Output token throughput (tok/s)", format!("{:.2}", per_s(r.output_tokens as f64, r.duration)));
    row(
        &mut s,
        "Total token throughput (tok/s)",
        format!("{:.2}", per_s((r.input_tokens + r.output_tokens) as f64, r.duration)),
    );
    let _ = writeln!(s, "{:-^62}", " Latency (ms) ");
    let _ = writeln!(s, "{:<8}{:>12}{:>12}{:>12}{:>12}", "", "mean", "median", "p90", "p99");
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for (name, x) in [("TTFT", &r.ttft), ("TPOT", &r.tpot), ("ITL", &r.itl), ("E2E", &r.e2e)] {
        let _ = writeln!(s, "{name:<8}{:>12}{:>12}{:>12}{:>12}", f(x.mean), f(x.median), f(x.p90), f(x.p99));
    }
    let _ = writeln!(s, "{}", "=".repeat(62));
    if r.output_len_mismatch > 0 {
        let _ = writeln!(
            s,
            "note: {} of {} requests did not generate exactly {} tokens (does the server honor ignore_eos or \
             min_tokens?)",
            r.output_len_mismatch, r.completed, c.output_len
        );
        let reasons: Vec<String> = r.finish_reasons.iter().map(|(f, n)| format!("{f} {n}")).collect();
        let _ = writeln!(s, "finish reasons: {}", reasons.join(", "));
    }
    if c.endpoint == Endpoint::Chat && r.input_sources.keys().any(|s| *s != Source::Usage) {
        let _ = writeln!(s, "note: without usage from the server, input tokens leave out the chat template's");
    }
    if let Some(ct) = r.cached_tokens.filter(|&ct| ct > 0) {
        let _ = writeln!(
            s,
            "note: the server's prefix cache served {ct} of {} prompt tokens (a shared chat-template prefix, or \
             prompts repeated from an earlier run with the same --seed)",
            r.input_tokens
        );
    }
    if r.failed > 0 {
        let _ = writeln!(s, "errors:");
        for (e, n) in r.errors.iter().take(MAX_ERRORS) {
            let _ = writeln!(s, "  {n} × {e}");
        }
        if r.errors.len() > MAX_ERRORS {
            let _ = writeln!(s, "  … and {} other messages", r.errors.len() - MAX_ERRORS);
        }
    }
    s
}

fn progress(n: usize, visible: bool) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(n as u64), ProgressDrawTarget::stderr());
    if let Ok(st) = ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}") {
        pb.set_style(st);
    }
    pb
}

async fn run(a: &BenchServeArgs, c: Config) -> Result<()> {
    let server = Server::new(c.base.clone(), a.api_key.clone());
    let fail = |m: String| Error::Format(m);
    let model = match &a.model {
        Some(m) => m.clone(),
        None => server.first_model().await.map_err(|e| fail(format!("cannot get the model name: {e}")))?,
    };
    let verbose = !a.json;
    let show_bar = verbose && std::io::stderr().is_terminal();
    let api = if c.tokenize { server.probe_tokenize().await } else { None };
    if verbose {
        let mut how = match api {
            Some(api) => format!("exactly, counted with {}", api.describe()),
            None if c.tokenize => "about: one token per word, no tokenize endpoint found".into(),
            None => "about: one token per word (--no-tokenize)".into(),
        };
        if c.endpoint == Endpoint::Chat {
            how += ", in the message: the chat template adds its own";
        }
        eprintln!(
            "bench-serve: {} at {}{}: {} requests, concurrency {}, {} input tokens ({how}), {} output tokens",
            model,
            c.base,
            c.endpoint.path(),
            c.requests,
            c.concurrency,
            c.input_len,
            c.output_len
        );
    }

    // Prompts, benchmark ones first, then the warm-up ones.
    let total = c.requests + c.warmup;
    let pb = progress(total, show_bar);
    pb.set_prefix("prompts");
    let prompts = {
        let (server, pb, seed, target, requests) = (server.clone(), pb.clone(), c.seed, c.input_len, c.requests);
        pool(total, c.concurrency, move |i| {
            let (server, pb) = (server.clone(), pb.clone());
            async move {
                // Warm-up prompts come from their own index range, so they
                // never equal a benchmark prompt (a prefix cache would hit).
                let index = if i < requests { i as u64 } else { WARMUP_INDEX + (i - requests) as u64 };
                let p = make_prompt(&server, api, seed, index, target).await;
                pb.inc(1);
                p
            }
        })
        .await?
    };
    pb.finish_and_clear();
    let (prompts, warm) = prompts.split_at(c.requests);

    for (i, p) in warm.iter().enumerate() {
        let body = request_body(&c, &model, &p.text, c.output_len.min(8));
        let o = server.stream(c.endpoint.path(), &body, c.endpoint == Endpoint::Chat, c.timeout).await;
        if let Some(e) = o.error {
            return Err(fail(format!("warm-up request {} of {} failed: {e}", i + 1, warm.len())));
        }
    }

    let pb = progress(c.requests, show_bar);
    pb.set_prefix("requests");
    let bodies: Arc<Vec<Value>> =
        Arc::new(prompts.iter().map(|p| request_body(&c, &model, &p.text, c.output_len)).collect());
    let failed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let outcomes = {
        let (server, pb, failed) = (server.clone(), pb.clone(), failed.clone());
        let (path, chat, timeout) = (c.endpoint.path(), c.endpoint == Endpoint::Chat, c.timeout);
        pool(c.requests, c.concurrency, move |i| {
            let (server, pb, failed, bodies) = (server.clone(), pb.clone(), failed.clone(), bodies.clone());
            async move {
                let o = server.stream(path, &bodies[i], chat, timeout).await;
                if o.error.is_some() {
                    let n = failed.fetch_add(1, Ordering::Relaxed) + 1;
                    pb.set_message(format!("({n} failed)"));
                }
                pb.inc(1);
                o
            }
        })
        .await?
    };
    let duration = start.elapsed().as_secs_f64();
    pb.finish_and_clear();

    let r = summarize(model, api, duration, &c, prompts, &outcomes);
    if a.json {
        outln!("{}", to_json(&r, &c))?;
    } else {
        out!("{}", to_text(&r, &c))?;
    }
    if r.completed == 0 {
        let first = r.errors.first().map_or(String::new(), |(e, _)| e.clone());
        return Err(fail(format!("all {} requests failed; the first error: {first}", c.requests)));
    }
    if r.failed > 0 && verbose {
        eprintln!("warning: {} of {} requests failed", r.failed, c.requests);
    }
    Ok(())
}

pub fn main(args: BenchServeArgs) -> Result<()> {
    let c = check(&args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Format(format!("bench-serve: cannot start the async runtime: {e}")))?;
    rt.block_on(run(&args, c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: BenchServeArgs,
    }

    fn args(extra: &[&str]) -> BenchServeArgs {
        let mut v = vec!["x"];
        if !extra.contains(&"--url") {
            v.extend(["--url", "http://127.0.0.1:1"]);
        }
        v.extend_from_slice(extra);
        Cli::try_parse_from(v).unwrap().a
    }

    #[test]
    fn argument_checks() {
        let msg = |a: &[&str]| match check(&args(a)) {
            Err(Error::InvalidInput(m)) => m,
            Err(e) => panic!("{e}"),
            Ok(_) => String::new(),
        };
        assert!(msg(&["--concurrency", "0"]).contains("--concurrency"));
        assert!(msg(&["--requests", "0"]).contains("--requests"));
        assert!(msg(&["--output-len", "0"]).contains("--output-len"));
        assert!(msg(&["--input-len", "0"]).contains("--input-len"));
        assert!(msg(&["--timeout", "0"]).contains("--timeout"));
        assert!(msg(&["--url", "https://a"]).contains("https"));
        assert!(msg(&["--extra-body", "[1]"]).contains("JSON object"));
        assert!(msg(&["--extra-body", "{"]).contains("not JSON"));
        assert_eq!(msg(&[]), "");
        // More concurrency than requests is fine: capped.
        assert_eq!(check(&args(&["--concurrency", "64", "--requests", "3"])).unwrap().concurrency, 3);
    }

    #[test]
    fn request_bodies() {
        let c = check(&args(&["--extra-body", r#"{"min_tokens": null, "top_k": 1}"#])).unwrap();
        let b = request_body(&c, "m", "hello there", 7);
        assert_eq!(b["prompt"], "hello there");
        assert_eq!(b["max_tokens"], 7);
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["top_k"], 1);
        assert!(b.get("min_tokens").is_none());
        let c = check(&args(&["--endpoint", "chat"])).unwrap();
        let b = request_body(&c, "m", "hi", 3);
        assert_eq!(b["messages"][0]["content"], "hi");
        assert_eq!(b["min_tokens"], 3);
        assert!(b.get("prompt").is_none());
    }

    #[test]
    fn summary_of_outcomes() {
        let c = check(&args(&["--output-len", "3"])).unwrap();
        let p = |t| Prompt { text: String::new(), tokens: t, words: 10 };
        let ok = |usage: Option<(u64, u64)>, chunks| Outcome {
            ttft: Some(0.1),
            itl: vec![0.05, 0.05],
            e2e: 0.3,
            usage_prompt_tokens: usage.map(|u| u.0),
            usage_completion_tokens: usage.map(|u| u.1),
            content_chunks: chunks,
            ..Outcome::default()
        };
        let bad = Outcome { error: Some("HTTP 500: x".into()), ..Outcome::default() };
        let r = summarize(
            "m".into(),
            None,
            2.0,
            &c,
            &[p(None), p(Some(11)), p(None), p(None)],
            &[ok(Some((12, 3)), 3), ok(None, 3), ok(None, 2), bad.clone()],
        );
        assert_eq!((r.completed, r.failed), (3, 1));
        assert_eq!(r.errors, vec![("HTTP 500: x".to_string(), 1)]);
        assert_eq!(r.input_tokens, 12 + 11 + 10);
        assert_eq!(r.output_tokens, 3 + 3 + 2);
        assert_eq!(sources(&r.input_sources), "mixed (usage 1, tokenize 1, estimate 1)");
        assert_eq!(sources(&r.output_sources), "mixed (usage 1, chunks 2)");
        assert_eq!(r.output_len_mismatch, 1);
        // TPOT = (0.3 - 0.1) / (3 - 1) = 100 ms twice, (0.3 - 0.1) / 1 = 200 ms once.
        assert!((r.tpot.mean.unwrap() - 400.0 / 3.0).abs() < 1e-9);
        assert_eq!(r.itl.count, 6);
        let j = to_json(&r, &c);
        assert_eq!(j["failed"], 1);
        assert!((j["output_throughput"].as_f64().unwrap() - 4.0).abs() < 1e-9);
        assert!(to_text(&r, &c).contains("1 × HTTP 500: x"));
    }
}
