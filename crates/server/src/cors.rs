//! Cross-origin requests, so that a browser page served from elsewhere (a
//! chat front end on another port) can call the API, as vLLM and llama.cpp's
//! server allow by default. Every response to an allowed `Origin` names it,
//! and preflight `OPTIONS` requests are answered here, before routing and the
//! API key check (browsers send no credentials with a preflight).

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// Which origins may call: `--allowed-origins`.
#[derive(Clone, Debug, PartialEq)]
pub enum AllowedOrigins {
    Any,
    /// Exact origins (`scheme://host[:port]`); none at all turns CORS off.
    Only(Vec<String>),
}

impl AllowedOrigins {
    /// `*` for any, `none` for no cross-origin calls, else a comma-separated list.
    pub fn parse(s: &str) -> AllowedOrigins {
        match s.trim() {
            "*" => AllowedOrigins::Any,
            "none" | "" => AllowedOrigins::Only(Vec::new()),
            list => AllowedOrigins::Only(
                list.split(',').map(|o| o.trim().trim_end_matches('/').to_string()).filter(|o| !o.is_empty()).collect(),
            ),
        }
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`.
    fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match self {
            AllowedOrigins::Any => Some(HeaderValue::from_static("*")),
            AllowedOrigins::Only(list) => {
                let o = origin.to_str().ok()?;
                list.iter().any(|a| a == o).then(|| origin.clone())
            }
        }
    }
}

pub async fn cors(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let origins = &state.allowed_origins;
    // With a list, the answer depends on the Origin: caches must know.
    let vary = matches!(origins, AllowedOrigins::Only(list) if !list.is_empty());
    let allow = req.headers().get(header::ORIGIN).and_then(|o| origins.allow(o));
    let mut response = match allow {
        None => next.run(req).await,
        Some(allow) => {
            let preflight =
                req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
            let mut r = if preflight {
                let mut r = StatusCode::NO_CONTENT.into_response();
                preflight_headers(req.headers(), r.headers_mut());
                r
            } else {
                next.run(req).await
            };
            r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            r
        }
    };
    if vary {
        response.headers_mut().append(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

fn preflight_headers(request: &HeaderMap, out: &mut HeaderMap) {
    out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
    // Whatever headers the page means to send (Authorization, Content-Type, ...).
    let asked = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
    let headers = asked.unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, headers);
    out.append(header::VARY, HeaderValue::from_static("access-control-request-headers"));
    out.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("86400"));
}

#[cfg(test)]
mod tests {
    use super::AllowedOrigins;
    use axum::http::HeaderValue;

    #[test]
    fn parsing_and_matching() {
        let page = HeaderValue::from_static("http://localhost:3000");
        assert_eq!(AllowedOrigins::parse("*").allow(&page).unwrap(), "*");
        assert_eq!(AllowedOrigins::parse("none").allow(&page), None);
        let list = AllowedOrigins::parse("https://a.example, http://localhost:3000/");
        assert_eq!(list, AllowedOrigins::Only(vec!["https://a.example".into(), "http://localhost:3000".into()]));
        assert_eq!(list.allow(&page).unwrap(), "http://localhost:3000");
        assert_eq!(list.allow(&HeaderValue::from_static("http://evil.example")), None);
    }
}
