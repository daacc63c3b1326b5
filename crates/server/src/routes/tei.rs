//! `POST /embed`: text-embeddings-inference's route, so its clients work
//! unchanged: the vectors of /v1/embeddings as a bare list of lists,
//! normalized unless `normalize: false`, and errors in its shape,
//! `{"error", "error_type"}`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::request::EmbeddingRequest;
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::routes::embeddings::vectors;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
pub struct EmbedRequest {
    /// A string or a list of strings (or, as /v1/embeddings, token ids).
    pub inputs: Value,
    pub normalize: Option<bool>,
    pub truncate: Option<bool>,
    pub truncation_direction: Option<String>,
    pub prompt_name: Option<Value>,
    pub dimensions: Option<i64>,
}

pub async fn embed(
    State(state): State<AppState>,
    req: Result<ApiJson<EmbedRequest>, ApiError>,
) -> Result<Json<Vec<Vec<f32>>>, TeiError> {
    let ApiJson(req) = req?;
    if state.embedder().is_err() {
        return Err(TeiError(StatusCode::FAILED_DEPENDENCY, "this server's model is not an embedding model".into()));
    }
    if req.truncation_direction.as_deref().is_some_and(|d| !d.eq_ignore_ascii_case("right")) {
        return Err(invalid("only truncation_direction \"right\" is supported"));
    }
    if req.prompt_name.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(invalid("prompt_name is not supported: put the prompt's text before each input"));
    }
    let openai = EmbeddingRequest {
        input: req.inputs,
        model: None,
        encoding_format: None,
        dimensions: req.dimensions,
        truncate: req.truncate,
    };
    // TEI normalizes unless told not to, whatever the checkpoint says.
    let (vectors, _, _) = vectors(&state, openai, Some(req.normalize.unwrap_or(true))).await?;
    Ok(Json(vectors))
}

fn invalid(message: &str) -> TeiError {
    TeiError(StatusCode::UNPROCESSABLE_ENTITY, message.into())
}

/// An error as text-embeddings-inference writes it: a request it cannot
/// take is a 422 (413 when too large), a full queue a 429.
#[derive(Debug)]
pub struct TeiError(StatusCode, String);

impl From<ApiError> for TeiError {
    fn from(e: ApiError) -> Self {
        let status = match e.status {
            StatusCode::BAD_REQUEST => StatusCode::UNPROCESSABLE_ENTITY,
            s => s,
        };
        TeiError(status, e.message)
    }
}

impl IntoResponse for TeiError {
    fn into_response(self) -> Response {
        let kind = match self.0 {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => "overloaded",
            s if s.is_server_error() => "backend",
            StatusCode::FAILED_DEPENDENCY => "backend",
            _ => "validation",
        };
        (self.0, Json(json!({"error": self.1, "error_type": kind}))).into_response()
    }
}
