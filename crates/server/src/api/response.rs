//! Response bodies and stream chunks, shaped like OpenAI's.

use serde::Serialize;

/// Identity shared by a response and all its stream chunks.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Meta {
    /// `prefix` is `chatcmpl` or `cmpl`.
    pub fn new(prefix: &str, model: &str) -> Meta {
        let id = crate::convert::random_id(&format!("{prefix}-"));
        Meta { id, created: crate::state::unix_now(), model: model.to_string() }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// vLLM's extension, when asked for (the prompt is every choice's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<RankedLogprobs>>>,
}

#[derive(Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when the reply is calls alone.
    pub content: Option<String>,
    /// The reply's thinking, where the model's template has think blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A function call of a reply; in a stream's delta with its `index`.
#[derive(Clone, Debug, Serialize)]
pub struct ToolCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The calls of a reply, each with a fresh id (`indexed`: for a delta;
    /// `short_ids`: Mistral's, `tools::call_id`).
    pub fn list(calls: Vec<crate::tools::Call>, indexed: bool, short_ids: bool) -> Vec<ToolCall> {
        let call = |(i, c): (usize, crate::tools::Call)| ToolCall {
            index: indexed.then_some(i),
            id: crate::tools::call_id(short_ids),
            kind: "function",
            function: FunctionCall { name: c.name, arguments: c.arguments },
        };
        calls.into_iter().enumerate().map(call).collect()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

#[derive(Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Serialize)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A /v1/completions response, and (with `usage: None`) one of its stream chunks.
#[derive(Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM's extension, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<RankedLogprobs>>>,
}

/// A prompt position in vLLM's `prompt_logprobs`: `{token id: {logprob,
/// rank, decoded_token}}`, the prompt's own token first, then the most
/// likely others.
#[derive(Clone, Debug, Default)]
pub struct RankedLogprobs(pub Vec<(u32, RankedLogprob)>);

#[derive(Clone, Debug, Serialize)]
pub struct RankedLogprob {
    pub logprob: f64,
    pub rank: usize,
    pub decoded_token: String,
}

impl Serialize for RankedLogprobs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (id, entry) in &self.0 {
            map.serialize_entry(&id.to_string(), entry)?;
        }
        map.end()
    }
}

/// The legacy completions logprobs: parallel lists, alternatives as `{token: logprob}`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// Null for an echoed prompt's first token, which nothing predicts.
    pub token_logprobs: Vec<Option<f64>>,
    pub top_logprobs: Vec<Option<Alternatives>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// `other`'s tokens after these.
    pub fn append(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

/// A position's alternatives as `{token: logprob}`, most likely first (a map
/// type would sort them by token text).
#[derive(Clone, Debug, Default)]
pub struct Alternatives(pub Vec<(String, f64)>);

impl Serialize for Alternatives {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

/// A /v1/embeddings response.
#[derive(Serialize)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Serialize)]
pub struct EmbeddingData {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingValue,
}

/// A list of floats, or (encoding_format "base64") their little-endian bytes.
#[derive(Serialize)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}
