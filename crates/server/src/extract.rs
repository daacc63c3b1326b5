//! A JSON body extractor whose every rejection is an OpenAI-shaped 400.
//!
//! axum's `Json` answers a bad body with plain text (and 415/422 statuses);
//! OpenAI clients expect `{"error": ...}` and 400 for any malformed request.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;
use std::time::Duration;

use crate::errors::ApiError;

pub struct ApiJson<T>(pub T);

/// The error code of a body not sent as JSON (a 400 here; 415 on TEI's route).
pub const UNSUPPORTED_CONTENT_TYPE: &str = "unsupported_content_type";

/// How long a request's body may take to arrive once its head has: a client
/// that declares a body and never sends it must not hold its connection.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !is_json(content_type) {
            let shown = if content_type.is_empty() { "none".to_string() } else { format!("`{content_type}`") };
            let message = format!("Content-Type must be application/json (got {shown})");
            return Err(ApiError { code: Some(UNSUPPORTED_CONTENT_TYPE), ..ApiError::invalid(message) });
        }
        let read = tokio::time::timeout(BODY_TIMEOUT, Bytes::from_request(req, state));
        let bytes = read
            .await
            .map_err(|_| ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                ..ApiError::invalid(format!("the request body did not arrive within {} s", BODY_TIMEOUT.as_secs()))
            })?
            .map_err(|r| {
                let status = r.status();
                let message = r.body_text();
                let status = if status.is_client_error() { status } else { StatusCode::BAD_REQUEST };
                ApiError { status, ..ApiError::invalid(message) }
            })?;
        parse(&bytes).map(ApiJson)
    }
}

/// `application/json`, with or without parameters, or any `+json` type.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Deserializes a body; serde's message names the field and position.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("Application/JSON"));
        assert!(is_json("application/vnd.api+json"));
        assert!(!is_json(""));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
    }

    #[test]
    fn parse_errors_are_400() {
        let e = parse::<serde_json::Value>(b"{not json").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("invalid request body"), "{}", e.message);
    }
}
