//! The route table and the layers around it.

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;

use crate::routes::{chat, completions, embeddings, messages, misc, models, responses, tei, tokenize};
use crate::state::AppState;
use crate::{auth, cors};

/// Long prompts are fine; a runaway upload is not.
const BODY_LIMIT: usize = 32 << 20;

pub fn router(state: AppState) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/embed", post(tei::embed))
        .route("/info", get(tei::info))
        // (TEI's clients given the bare address post there.)
        .route("/", post(tei::embed))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::get))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_key));
    Router::new()
        .route("/", get(misc::page))
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .merge(protected)
        .fallback(misc::not_found)
        .method_not_allowed_fallback(misc::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(state.clone(), auth::count_status))
        // Outermost: preflights are answered before routing and the key check.
        .layer(middleware::from_fn_with_state(state.clone(), cors::cors))
        .with_state(state)
}
