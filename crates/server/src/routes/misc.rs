//! Health, metrics, the chat page and the JSON answers for unknown routes.

use axum::extract::State;
use axum::http::{header, Method, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use ferrite_engine::embed::EmbedMetrics;
use ferrite_engine::Metrics;
use serde_json::{json, Value};

use crate::errors::ApiError;
use crate::routes::tei::TeiError;
use crate::state::{AppState, Served};

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let (engine, embed) = match &state.served {
        Served::Generator(g) => (g.metrics(), EmbedMetrics::default()),
        Served::Embedder(e) => {
            let m = e.metrics();
            (Metrics { waiting: m.waiting, ..Metrics::default() }, m)
        }
    };
    let text = state.metrics.render(&engine, &embed);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The chat page: one self-contained HTML file, no external assets.
pub async fn page() -> Html<&'static str> {
    Html(include_str!("../../static/chat.html"))
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let error = ApiError {
        code: Some("method_not_allowed"),
        ..ApiError::new(
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{method} is not allowed on {}", uri.path()),
        )
    };
    // (Not `is_tei_route`: `POST /` is TEI's, but a wrong method on `/` is not.)
    if matches!(uri.path(), "/embed" | "/info") {
        return TeiError::from(error).into_response();
    }
    error.into_response()
}
