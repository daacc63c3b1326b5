//! `POST /embed` (and `POST /`, where TEI's clients given the server's bare
//! address post): text-embeddings-inference's route, so its clients work
//! unchanged: the vectors of /v1/embeddings as a bare list of lists,
//! normalized unless `normalize: false`, and errors in its shape,
//! `{"error", "error_type"}`, with its status codes. `GET /info`: the
//! model and the limits, as TEI describes them.

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use ferrite_engine::embed::MAX_INPUTS;

use crate::api::request::EmbeddingRequest;
use crate::errors::ApiError;
use crate::extract::{ApiJson, UNSUPPORTED_CONTENT_TYPE};
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
    // A body that is not the request: 415 for its content type, else 422.
    let ApiJson(req) = req.map_err(|e| {
        let status = if e.code == Some(UNSUPPORTED_CONTENT_TYPE) {
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        };
        TeiError(status, "validation", e.message)
    })?;
    if state.embedder().is_err() {
        let msg = "this server's model is not an embedding model";
        return Err(TeiError(StatusCode::FAILED_DEPENDENCY, "backend", msg.into()));
    }
    if req.inputs.as_array().is_some_and(Vec::is_empty) {
        return Err(TeiError(StatusCode::BAD_REQUEST, "empty", "inputs must not be an empty list".into()));
    }
    match req.truncation_direction.as_deref() {
        None => {}
        Some(d) if d.eq_ignore_ascii_case("right") => {}
        Some(d) if d.eq_ignore_ascii_case("left") => return Err(invalid("only right truncation is supported")),
        Some(d) => return Err(invalid(&format!("truncation_direction must be \"right\" or \"left\", not {d:?}"))),
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

/// `GET /info`: the embedding model and the server's limits in TEI's
/// layout (`huggingface_hub`'s `get_endpoint_info` reads it).
pub async fn info(State(state): State<AppState>) -> Result<Json<Value>, TeiError> {
    let Ok(e) = state.embedder() else {
        let msg = "GET /info describes an embedding model; this server's model is a text generator";
        return Err(TeiError(StatusCode::NOT_FOUND, "validation", msg.into()));
    };
    let i = e.info();
    // Inputs are tokenized on the server's blocking threads, as many at once as it has cores.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(Json(json!({
        "model_id": state.model,
        "model_sha": null,
        "model_dtype": i.dtype,
        "model_type": {"embedding": {"pooling": i.pooling}},
        "max_concurrent_requests": i.max_waiting,
        "max_input_length": e.max_length(),
        "max_batch_tokens": i.max_batch_tokens,
        "max_batch_requests": null,
        "max_client_batch_size": MAX_INPUTS,
        "auto_truncate": false,
        "tokenization_workers": workers,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": null,
    })))
}

/// Whether a request is for one of TEI's routes, so that the errors
/// answered before it reaches them (the key check, a wrong method) take
/// TEI's shape too. `POST /` is TEI's; `GET /` is the chat page.
pub fn is_tei_route(method: &Method, path: &str) -> bool {
    matches!(path, "/embed" | "/info") || (path == "/" && method == Method::POST)
}

fn invalid(message: &str) -> TeiError {
    TeiError(StatusCode::PAYLOAD_TOO_LARGE, "validation", message.into())
}

/// An error as text-embeddings-inference writes it, with its status codes:
/// a request it refuses is a "validation" error, 413 (as TEI answers
/// every one, too large or not); a full queue 429.
#[derive(Debug)]
pub struct TeiError(StatusCode, &'static str, String);

impl From<ApiError> for TeiError {
    fn from(e: ApiError) -> Self {
        match e.status {
            StatusCode::BAD_REQUEST => TeiError(StatusCode::PAYLOAD_TOO_LARGE, "validation", e.message),
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                TeiError(e.status, "overloaded", e.message)
            }
            s if s.is_server_error() => TeiError(s, "backend", e.message),
            s => TeiError(s, "validation", e.message),
        }
    }
}

impl IntoResponse for TeiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.2, "error_type": self.1}))).into_response()
    }
}
