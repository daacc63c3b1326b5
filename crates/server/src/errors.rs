//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`.
//!
//! Every failure a client can see goes through `ApiError`, so clients written
//! against OpenAI (which read `error.message`) get a useful message for any
//! status, including the ones axum would otherwise answer with plain text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_core::Error;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// 400 for a request that can never succeed as written.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending field.
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..ApiError::invalid(message) }
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{model}` does not exist"),
            )
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or incorrect API key; send it as `Authorization: Bearer KEY`",
            )
        }
    }

    pub fn not_found(path: &str) -> Self {
        ApiError {
            code: Some("not_found"),
            ..ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("no route for {path}"))
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body, also used for error events inside an SSE stream.
    pub fn body(&self) -> serde_json::Value {
        let inner = Inner { message: &self.message, kind: self.kind, param: self.param.as_deref(), code: self.code };
        serde_json::to_value(Body { error: inner }).unwrap_or_default()
    }
}

/// Engine and tokenizer errors: bad input is the client's fault (400), a full
/// queue is retryable (429), anything else is ours (500).
impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidInput(m) | Error::Template(m) | Error::Tokenizer(m) => ApiError::invalid(m),
            Error::Busy(m) => ApiError {
                code: Some("server_busy"),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", m)
            },
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_the_openai_shape() {
        let v = ApiError::param("n", "n must be at least 1").body();
        assert_eq!(v["error"]["message"], "n must be at least 1");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "n");
        assert!(v["error"]["code"].is_null());
    }

    #[test]
    fn engine_errors_map_to_statuses() {
        assert_eq!(ApiError::from(Error::InvalidInput("x".into())).status, StatusCode::BAD_REQUEST);
        assert_eq!(ApiError::from(Error::Template("x".into())).status, StatusCode::BAD_REQUEST);
        assert_eq!(ApiError::from(Error::Busy("x".into())).status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(ApiError::from(Error::Format("x".into())).status, StatusCode::INTERNAL_SERVER_ERROR);
        let nf = ApiError::model_not_found("gpt-4");
        assert_eq!((nf.status, nf.code), (StatusCode::NOT_FOUND, Some("model_not_found")));
    }
}
