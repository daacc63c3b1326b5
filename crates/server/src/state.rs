//! What every handler shares: the engine, the model's name and template, the
//! API key and the metrics.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ferrite_loader::chat_template::ChatTemplate;

use crate::backend::Backend;
use crate::errors::ApiError;
use crate::metrics::ServerMetrics;

#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub backend: Arc<dyn Backend>,
    pub model: String,
    pub api_key: Option<String>,
    pub template: Option<ChatTemplate>,
    pub metrics: ServerMetrics,
    /// When the server started, as /v1/models' `created`.
    pub started: u64,
}

impl AppState {
    pub fn new(
        backend: Arc<dyn Backend>,
        model: String,
        api_key: Option<String>,
        template: Option<ChatTemplate>,
    ) -> Self {
        let metrics = ServerMetrics::default();
        AppState(Arc::new(Shared { backend, model, api_key, template, metrics, started: unix_now() }))
    }

    /// The request's `model` must be ours when given.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model => Err(ApiError::model_not_found(m)),
            _ => Ok(()),
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
