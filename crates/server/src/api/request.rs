//! Request bodies as clients send them. Fields whose JSON type varies (stop,
//! prompt, content, logit_bias, response_format) stay `Value` here and are
//! checked in `convert`, which gives clearer messages than untagged enums.
//! Unknown fields (`user`, `store`, ...) are ignored.

use serde::Deserialize;
use serde_json::{Number, Value};

/// Fields shared by /v1/chat/completions and /v1/completions.
#[derive(Debug, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<Number>,
    pub stop: Option<Value>,
    pub max_tokens: Option<i64>,
    /// OpenAI's newer name for `max_tokens`; wins when both are given.
    pub max_completion_tokens: Option<i64>,
    pub logit_bias: Option<Value>,
    pub response_format: Option<Value>,
    /// Extension: keep generating past end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// Extension (as vLLM): end-of-sequence tokens are not sampled before this
    /// many tokens.
    pub min_tokens: Option<i64>,
    /// Extension (as vLLM): each prompt token's logprob and rank, with this
    /// many alternatives (not with `stream`).
    pub prompt_logprobs: Option<i64>,
    /// Extension (as vLLM): the output is a value of this JSON Schema (an
    /// object, or its text).
    pub guided_json: Option<Value>,
    /// Extension (as vLLM): the output is exactly one of these strings.
    pub guided_choice: Option<Value>,
    /// vLLM's newer form of the guides: `{"json": schema}`, `{"choice": [...]}`,
    /// `{"regex": pattern}` or `{"grammar": gbnf}`.
    pub structured_outputs: Option<Value>,
    /// Extension (as vLLM): the output is a whole match of this pattern.
    pub guided_regex: Option<Value>,
    /// Extension (as vLLM): the output is a sentence of this GBNF grammar.
    pub guided_grammar: Option<Value>,
    /// llama.cpp's server's name for `guided_grammar`.
    pub grammar: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// Functions the model may call (`{type: "function", function: {name,
    /// description, parameters}}`), and how: `tool_choice`.
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// vLLM's extension: more chat-template variables (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<Value>,
    /// vLLM's extension: false leaves the reasoning out of the reply.
    pub include_reasoning: Option<bool>,
    /// (Set by the other APIs' routes, never sent:) `max_tokens` cut to the
    /// context's room after the prompt instead of refused.
    #[serde(skip)]
    pub fit_max_tokens: bool,
    /// vLLM's extensions: end with the opening of the assistant's turn
    /// (default true), or leave the final assistant message open.
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    /// vLLM's extension: the reply's content starts with the final message's
    /// when that message is in the reply's role (a continued message whole).
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, a list of `{type: "text", text}` parts, or null.
    #[serde(default)]
    pub content: Option<Value>,
    /// An assistant's calls: `[{id, type: "function", function: {name, arguments}}]`.
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// A tool message's call, and the function's name.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant's reasoning, as replies give it (vLLM's newer name:
    /// `reasoning`); templates such as Qwen3's show it in the turns of a
    /// tool-calling loop.
    #[serde(default, alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// A string or a list of token ids, or a list of either (several prompts).
    pub prompt: Value,
    /// How many alternatives to report per token (0..=20).
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    /// For `prompt`: add BOS/EOS as the model's metadata asks (default true).
    pub add_special_tokens: Option<bool>,
    /// For `messages` (default true).
    pub add_generation_prompt: Option<bool>,
    /// For `messages`: leave the final assistant message open (default false).
    pub continue_final_message: Option<bool>,
    /// For `messages`: the functions offered, and more template variables,
    /// as chat requests give them.
    pub tools: Option<Value>,
    pub chat_template_kwargs: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    /// A string, a list of strings, a list of token ids or a list of token-id lists.
    pub input: Value,
    pub model: Option<String>,
    /// "float" (default) or "base64" (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Keep the leading values only (renormalized when the model normalizes).
    pub dimensions: Option<i64>,
    /// Extension: cut inputs longer than the model's limit instead of failing.
    pub truncate: Option<bool>,
    // `user`, like any unknown field, is accepted and ignored.
}
