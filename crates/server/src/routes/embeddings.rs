//! `POST /v1/embeddings`: validate, tokenize off the async runtime, queue the
//! inputs on the embedding engine and await the vectors. A client that goes
//! away drops the receiver, and the engine skips the request.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_core::Error;
use serde_json::Value;

use crate::api::request::EmbeddingRequest;
use crate::api::response::{EmbeddingData, EmbeddingList, EmbeddingUsage, EmbeddingValue};
use crate::backend::EmbedBackend;
use crate::embed::{self, Encoding, Inputs, Options};
use crate::errors::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;

pub async fn embeddings(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<EmbeddingRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let (vectors, opts, tokens) = vectors(&state, req, None).await?;
    Ok(Json(response(vectors, opts.encoding, &state.model, tokens)).into_response())
}

/// A request's vectors, its options and its token count; `normalize`
/// overrides the checkpoint's choice (text-embeddings-inference's `/embed`).
pub async fn vectors(
    state: &AppState,
    req: EmbeddingRequest,
    normalize: Option<bool>,
) -> Result<(Vec<Vec<f32>>, Options, usize), ApiError> {
    let backend = state.embedder()?.clone();
    let opts = embed::options(&req, backend.dim())?;
    let ids = match embed::inputs(&req.input, backend.vocab_size())? {
        Inputs::Tokens(ids) => embed::fit_tokens(ids, &req.input, opts.truncate, backend.max_length())?,
        Inputs::Texts(texts) => {
            let (b, input) = (backend.clone(), req.input);
            tokio::task::spawn_blocking(move || tokenize(b.as_ref(), &texts, &input, opts.truncate))
                .await
                .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))??
        }
    };
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let reply = backend.submit(ids, normalize, opts.dims)?;
    let vectors = reply.await.map_err(|_| ApiError::internal("the embedding engine stopped"))??;
    Ok((vectors, opts, tokens))
}

/// Every text's ids; the first failure is the answer, naming the input.
fn tokenize(
    backend: &dyn EmbedBackend,
    texts: &[String],
    input: &Value,
    truncate: bool,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let max = backend.max_length();
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            backend.tokenize(text, truncate).map_err(|e| match e {
                Error::InvalidInput(m) => {
                    // Without truncate, the only refusal of a non-empty text is its length.
                    let n = backend.tokenizer().encode(text, true).map(|ids| ids.len()).unwrap_or(0);
                    if !truncate && n > max {
                        embed::too_long(&embed::label(input, i), n, max)
                    } else {
                        ApiError::param("input", format!("{}: {m}", embed::label(input, i)))
                    }
                }
                other => ApiError::from(other),
            })
        })
        .collect()
}

fn response(vectors: Vec<Vec<f32>>, encoding: Encoding, model: &str, tokens: usize) -> EmbeddingList {
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingData {
            object: "embedding",
            index,
            embedding: match encoding {
                Encoding::Float => EmbeddingValue::Float(v),
                Encoding::Base64 => EmbeddingValue::Base64(embed::base64(&v)),
            },
        })
        .collect();
    EmbeddingList {
        object: "list",
        data,
        model: model.to_string(),
        usage: EmbeddingUsage { prompt_tokens: tokens, total_tokens: tokens },
    }
}
