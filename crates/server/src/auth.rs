//! API key check for /v1/* and the tokenizer endpoints (not for the page,
//! /health or /metrics, which probes and scrapers reach without a key).

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::errors::ApiError;
use crate::routes::tei::{is_tei_route, TeiError};
use crate::state::AppState;

pub async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        // `Authorization: Bearer KEY`, or Anthropic's clients' `x-api-key: KEY`.
        let headers = req.headers();
        let given = (headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer))
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim));
        if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            let error = ApiError::unauthorized();
            if is_tei_route(req.method(), req.uri().path()) {
                return TeiError::from(error).into_response();
            }
            if req.uri().path().starts_with("/v1/messages") {
                return crate::routes::messages::AnthropicError::from(error).into_response();
            }
            return error.into_response();
        }
    }
    next.run(req).await
}

/// The token of `Bearer TOKEN` (scheme case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Comparison whose time does not depend on where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts every response by status for /metrics.
pub async fn count_status(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    state.metrics.http_response(response.status().as_u16());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("abc"), None);
        assert!(same(b"key", b"key"));
        assert!(!same(b"key", b"kez"));
        assert!(!same(b"key", b"key2"));
    }
}
