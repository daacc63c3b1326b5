//! OpenAI-compatible HTTP server over the engine's public API.

use ferrite_core::Result;
use ferrite_engine::Engine;
use ferrite_loader::chat_template::ChatTemplate;

/// Everything `ferrite serve` decides before the server starts.
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on /v1/* when set.
    pub api_key: Option<String>,
    /// The model id clients use and /v1/models lists.
    pub served_model_name: String,
    /// The model's chat template; without one /v1/chat/completions answers 400.
    pub template: Option<ChatTemplate>,
}

/// Serves until Ctrl-C or SIGTERM, then cancels in-flight requests, stops the
/// engine and returns. Prints `listening on http://HOST:PORT` to stderr once
/// the socket is bound.
pub fn serve(engine: Engine, config: ServeConfig) -> Result<()> {
    let _ = (engine, config);
    Err(ferrite_core::Error::Unsupported("serve: being written".into()))
}
