//! What every handler shares: the served model (a text generator or an
//! embedding model), its name and template, the API key and the metrics.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ferrite_loader::chat_template::ChatTemplate;
use ferrite_loader::tokenizer::Tokenizer;

use crate::backend::{Backend, EmbedBackend};
use crate::cors::AllowedOrigins;
use crate::errors::ApiError;
use crate::metrics::ServerMetrics;

/// The model behind the server: exactly one kind.
#[derive(Clone)]
pub enum Served {
    Generator(Arc<dyn Backend>),
    Embedder(Arc<dyn EmbedBackend>),
}

#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub served: Served,
    pub model: String,
    pub api_key: Option<String>,
    pub template: Option<ChatTemplate>,
    pub metrics: ServerMetrics,
    /// When the server started, as /v1/models' `created`.
    pub started: u64,
    /// Origins whose pages may call the API from a browser.
    pub allowed_origins: AllowedOrigins,
    /// Replies' `<think>` blocks apart as `reasoning_content` (`reasoning`).
    pub reasoning: bool,
    /// What the template does with tools (`tools::TemplateTools`).
    pub template_tools: crate::tools::TemplateTools,
}

impl AppState {
    pub fn new(served: Served, model: String, api_key: Option<String>, template: Option<ChatTemplate>) -> Self {
        let metrics = ServerMetrics::default();
        let allowed_origins = AllowedOrigins::Any;
        // Where the template has think blocks (`--reasoning-format auto`).
        let reasoning = template.as_ref().is_some_and(crate::reasoning::thinks);
        let template_tools = template.as_ref().map(crate::tools::TemplateTools::of).unwrap_or_default();
        let started = unix_now();
        AppState(Arc::new(Shared {
            served,
            model,
            api_key,
            template,
            metrics,
            started,
            allowed_origins,
            reasoning,
            template_tools,
        }))
    }

    /// This state leaving replies' think blocks in their content (before it is shared).
    pub fn without_reasoning(mut self) -> Self {
        Arc::get_mut(&mut self.0).expect("a state not yet shared").reasoning = false;
        self
    }

    /// This state allowing only `origins` (before it is shared).
    pub fn with_allowed_origins(mut self, origins: AllowedOrigins) -> Self {
        Arc::get_mut(&mut self.0).expect("a state not yet shared").allowed_origins = origins;
        self
    }

    /// The request's `model` must be ours when given.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model => Err(ApiError::model_not_found(m)),
            _ => Ok(()),
        }
    }

    /// The text generator, or a 400 when we serve an embedding model.
    pub fn generator(&self) -> Result<&Arc<dyn Backend>, ApiError> {
        match &self.served {
            Served::Generator(g) => Ok(g),
            Served::Embedder(_) => Err(ApiError {
                code: Some("wrong_model_kind"),
                ..ApiError::param(
                    "model",
                    format!("model {} is an embedding model; it does not generate text", self.model),
                )
            }),
        }
    }

    /// The embedding model, or a 400 when we serve a text generator.
    pub fn embedder(&self) -> Result<&Arc<dyn EmbedBackend>, ApiError> {
        match &self.served {
            Served::Embedder(e) => Ok(e),
            Served::Generator(_) => Err(ApiError {
                code: Some("wrong_model_kind"),
                ..ApiError::param("model", format!("model {} does not produce embeddings", self.model))
            }),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        match &self.served {
            Served::Generator(g) => g.tokenizer(),
            Served::Embedder(e) => e.tokenizer(),
        }
    }

    /// Longest request in tokens: the context, or the embedder's input limit.
    pub fn max_model_len(&self) -> usize {
        match &self.served {
            Served::Generator(g) => g.max_context(),
            Served::Embedder(e) => e.max_length(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.served {
            Served::Generator(g) => g.vocab_size(),
            Served::Embedder(e) => e.vocab_size(),
        }
    }

    /// Stops the engine; blocks until it has (keep it off the async runtime).
    pub fn shutdown(&self) {
        match &self.served {
            Served::Generator(g) => g.shutdown(),
            Served::Embedder(e) => e.shutdown(),
        }
    }
}

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
