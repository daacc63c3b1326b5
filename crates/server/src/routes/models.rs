//! `GET /v1/models` and `GET /v1/models/{id}`: the one model we serve.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use crate::errors::ApiError;
use crate::state::AppState;

fn model(state: &AppState) -> Value {
    json!({
        "id": state.model,
        "object": "model",
        "created": state.started,
        "owned_by": "ferrite",
        "max_model_len": state.max_model_len(),
    })
}

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model(&state)]}))
}

pub async fn get(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    // An id that is not UTF-8 once decoded: an OpenAI-shaped 400, not axum's plain text.
    let Path(id) = id.map_err(|e| ApiError::invalid(e.body_text()))?;
    state.check_model(Some(&id))?;
    Ok(Json(model(&state)))
}
