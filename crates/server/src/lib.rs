//! OpenAI-compatible HTTP server over the engine's public API. It serves one
//! model: a text generator (`serve`) or an embedding model (`serve_embeddings`).
//!
//! - `router`: the route table; `routes/*`: handlers; `auth`: the API key;
//!   `cors`: cross-origin calls from browser pages.
//! - `backend`: the engines as traits; `state`: what handlers share.
//! - `embed`: /v1/embeddings requests -> token ids and options (pure, tested).
//! - `api`: wire types; `convert`: request -> engine request (pure, tested);
//!   `prompt`: chat template + tokenization as `ferrite run` does it.
//! - `reply`: a chat reply read into its parts: `reasoning` (think blocks)
//!   and `tools` (function calls, and the tools' way into the prompt).
//! - `responses`, `anthropic`: OpenAI's Responses API and Anthropic's
//!   Messages API as chat requests and back (pure, tested).
//! - `generate`: submitting and collecting; `sse`: streaming bodies.
//! - `listen`: the accept loop, with a deadline on request heads.
//! - `metrics`: Prometheus text; `errors`/`extract`: OpenAI-shaped errors.

mod anthropic;
mod api;
mod auth;
mod backend;
mod convert;
mod cors;
mod embed;
mod errors;
mod extract;
mod generate;
mod listen;
mod logprobs;
mod metrics;
mod prompt;
mod reasoning;
mod reply;
mod responses;
mod router;
mod routes;
mod sse;
mod state;
mod tools;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrite_core::{Error, Result};
use ferrite_engine::embed::EmbedEngine;
use ferrite_engine::Engine;
use ferrite_loader::chat_template::ChatTemplate;
use tokio::net::TcpListener;

use crate::state::{AppState, Served};

pub use crate::cors::AllowedOrigins;

/// How long in-flight responses get to finish after the engine has cancelled
/// them on shutdown, before the server stops regardless.
const GRACE: Duration = Duration::from_secs(5);

/// Everything `ferrite serve` decides before the server starts.
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on /v1/* when set.
    pub api_key: Option<String>,
    /// The model id clients use and /v1/models lists.
    pub served_model_name: String,
    /// The model's chat template; without one /v1/chat/completions answers 400.
    /// Unused for an embedding model.
    pub template: Option<ChatTemplate>,
    /// Origins whose browser pages may call the API (`--allowed-origins`).
    pub allowed_origins: AllowedOrigins,
    /// Replies' `<think>` blocks apart as `reasoning_content`, where the
    /// template has them (`--reasoning-format auto`); else left in the content.
    pub reasoning: bool,
}

/// Serves a text generator until Ctrl-C or SIGTERM, then cancels in-flight
/// requests, stops the engine and returns. Prints `listening on
/// http://HOST:PORT` to stderr once the socket is bound.
pub fn serve(engine: Engine, config: ServeConfig) -> Result<()> {
    serve_model(Served::Generator(Arc::new(engine)), config)
}

/// Serves an embedding model (/v1/embeddings; chat and completions answer 400)
/// as `serve` does; on shutdown the queued embedding requests finish first.
pub fn serve_embeddings(engine: EmbedEngine, config: ServeConfig) -> Result<()> {
    serve_model(Served::Embedder(Arc::new(engine)), config)
}

fn serve_model(served: Served, config: ServeConfig) -> Result<()> {
    let ServeConfig { host, port, api_key, served_model_name, template, allowed_origins, reasoning } = config;
    let template = if matches!(served, Served::Embedder(_)) { None } else { template };
    let api_key = api_key.filter(|k| !k.is_empty());
    let mut state = AppState::new(served, served_model_name, api_key, template).with_allowed_origins(allowed_origins);
    if !reasoning {
        state = state.without_reasoning();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ferrite-http")
        .enable_all()
        .build()
        .map_err(|e| Error::InvalidInput(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(run(state.clone(), &host, port, shutdown_signal()));
    // Idempotent; covers the paths where the server never started.
    state.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Binds, serves until `stop` resolves, then shuts the engine down (which ends
/// every in-flight stream) and waits for open responses to finish.
async fn run(state: AppState, host: &str, port: u16, stop: impl Future<Output = ()> + Send + 'static) -> Result<()> {
    let listener = TcpListener::bind((host, port))
        .await
        .map_err(|e| Error::InvalidInput(format!("cannot listen on {}:{port}: {e}", url_host(host))))?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
    eprintln!("listening on http://{}:{port}", url_host(host));
    serve_on(listener, state, stop).await
}

async fn serve_on(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let engine = state.clone();
    let app = router::router(state);
    let (stopped_tx, mut stopped_rx) = tokio::sync::watch::channel(false);
    let stopper: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
    let stopper_slot = stopper.clone();
    let graceful = async move {
        stop.await;
        eprintln!("shutting down: cancelling in-flight requests");
        // shutdown() blocks until the engine thread exits: keep it off the runtime.
        let handle = std::thread::spawn(move || engine.shutdown());
        if let Ok(mut slot) = stopper_slot.lock() {
            *slot = Some(handle);
        }
        let _ = stopped_tx.send(true);
    };
    let server = listen::serve_until(listener, app, graceful, listen::HEADER_TIMEOUT);
    let deadline = async {
        if stopped_rx.wait_for(|&s| s).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(GRACE).await;
    };
    tokio::select! {
        _ = server => {}
        _ = deadline => eprintln!("some connections did not close in time; stopping anyway"),
    }
    let handle = stopper.lock().ok().and_then(|mut h| h.take());
    if let Some(h) = handle {
        let _ = tokio::task::spawn_blocking(move || h.join()).await;
    }
    Ok(())
}

/// Ctrl-C or SIGTERM. A signal we cannot listen for never fires (rather than
/// stopping the server at once).
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// IPv6 literals need brackets in a URL.
fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}
