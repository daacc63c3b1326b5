//! Request bodies -> engine requests, as pure functions (no engine, no I/O) so
//! every validation rule is unit-tested. Defaults follow OpenAI: temperature 1,
//! top_p 1, and top_k / min_p / repetition penalty off unless asked for.

use std::sync::Arc;

use ferrite_engine::constraint::format::OutputFormat;
use ferrite_engine::constraint::schema::Schema;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::Request;
use ferrite_loader::chat_template::{Extras, Message};
use ferrite_loader::tokenizer::Tokenizer;
use serde_json::Value;

use crate::api::request::{ChatMessage, CommonParams};
use crate::errors::ApiError;

/// Most choices one request may ask for.
pub const MAX_N: usize = 128;
/// Most stop strings.
pub const MAX_STOP: usize = 16;
/// Most alternatives per token in logprobs.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What validation needs to know about the model.
#[derive(Clone, Copy)]
pub struct Limits<'a> {
    pub max_context: usize,
    pub vocab_size: usize,
    /// Names tokens by their text (a grammar's `<think>`), where known.
    pub tokenizer: Option<&'a Tokenizer>,
}

/// Validated settings shared by both endpoints, before the prompt is known.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: SamplingParams,
    /// `None`: the rest of the context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub min_tokens: usize,
    pub format: Option<OutputFormat>,
    /// Alternatives per prompt token, when the prompt is to be scored.
    pub prompt_logprobs: Option<usize>,
}

/// The prompt of a completions request.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// `prompt_alone`: max_tokens 0 is allowed (completions' echo: the prompt's
/// scores, nothing generated).
pub fn settings(
    c: &CommonParams,
    logprobs: Option<usize>,
    limits: Limits,
    prompt_alone: bool,
) -> Result<Settings, ApiError> {
    let n = match c.n {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::param("n", format!("n must be between 1 and {MAX_N}, got {n}"))),
    };
    let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
        None => None,
        Some(0) if prompt_alone => Some(0),
        Some(m) if m >= 1 => Some(usize::try_from(m).unwrap_or(usize::MAX)),
        Some(m) => return Err(ApiError::param("max_tokens", format!("max_tokens must be at least 1, got {m}"))),
    };
    if c.stream_options.as_ref().is_some_and(|o| o.include_usage.is_some()) && c.stream != Some(true) {
        return Err(ApiError::param("stream_options", "stream_options needs stream: true"));
    }
    let prompt_logprobs = match c.prompt_logprobs {
        None => None,
        Some(_) if c.stream == Some(true) => {
            return Err(ApiError::param("prompt_logprobs", "prompt_logprobs are not available with stream: true"))
        }
        Some(t) if (0..=MAX_TOP_LOGPROBS as i64).contains(&t) => Some(t as usize),
        Some(t) => {
            let msg = format!("prompt_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {t}");
            return Err(ApiError::param("prompt_logprobs", msg));
        }
    };
    Ok(Settings {
        n,
        stream: c.stream.unwrap_or(false),
        include_usage: c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        sampling: sampling(c, logprobs, limits)?,
        max_tokens,
        stop: stop(c.stop.as_ref())?,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        min_tokens: match c.min_tokens.unwrap_or(0) {
            m @ 0.. => usize::try_from(m).unwrap_or(usize::MAX),
            m => return Err(ApiError::param("min_tokens", format!("min_tokens must be >= 0, got {m}"))),
        },
        format: output_format(c, limits)?,
        prompt_logprobs,
    })
    .and_then(|s| match s.max_tokens {
        Some(max) if s.min_tokens > max => Err(ApiError::param(
            "min_tokens",
            format!("min_tokens ({}) must not exceed max_tokens ({max})", s.min_tokens),
        )),
        _ => Ok(s),
    })
}

impl Settings {
    /// The `n` engine requests for `prompt`; choice i gets seed + i, so a
    /// seeded request is reproducible and its choices still differ.
    pub fn requests(&self, prompt: Vec<u32>, max_context: usize) -> Vec<Request> {
        // The default leaves at least 1, so an over-long prompt gets the engine's context message.
        let max_tokens = self.max_tokens.unwrap_or_else(|| max_context.saturating_sub(prompt.len()).max(1));
        let base_seed = match self.sampling.seed {
            None if self.n > 1 => Some(random_u64()),
            s => s,
        };
        (0..self.n)
            .map(|i| {
                let sampling =
                    SamplingParams { seed: base_seed.map(|s| s.wrapping_add(i as u64)), ..self.sampling.clone() };
                // The prompt is the same for every choice: scored once, by the first.
                let prompt_logprobs = if i == 0 { self.prompt_logprobs } else { None };
                Request {
                    prompt: prompt.clone(),
                    sampling,
                    max_tokens,
                    stop: self.stop.clone(),
                    stop_ids: Vec::new(),
                    ignore_eos: self.ignore_eos,
                    min_tokens: self.min_tokens,
                    prompt_logprobs,
                    format: self.format.clone(),
                }
            })
            .collect()
    }
}

fn sampling(c: &CommonParams, logprobs: Option<usize>, limits: Limits) -> Result<SamplingParams, ApiError> {
    // Checked as the f32 the sampler gets: 1e308 is a finite f64 but no f32.
    let temperature = c.temperature.unwrap_or(1.0) as f32;
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::param("temperature", format!("temperature must be >= 0, got {temperature}")));
    }
    let top_p = unit("top_p", c.top_p, 1.0)?;
    let min_p = unit("min_p", c.min_p, 0.0)?;
    let top_k = match c.top_k.unwrap_or(0) {
        k @ 0.. => usize::try_from(k).unwrap_or(usize::MAX),
        -1 => 0,
        k => return Err(ApiError::param("top_k", format!("top_k must be >= 0 (or -1 for off), got {k}"))),
    };
    let repetition_penalty = c.repetition_penalty.unwrap_or(1.0) as f32;
    if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
        return Err(ApiError::param(
            "repetition_penalty",
            format!("repetition_penalty must be > 0, got {repetition_penalty}"),
        ));
    }
    let seed = match &c.seed {
        None => None,
        // Negative seeds are fine: any 64 bits will do.
        Some(s) => Some(
            s.as_u64()
                .or_else(|| s.as_i64().map(|v| v as u64))
                .ok_or_else(|| ApiError::param("seed", format!("seed must be an integer, got {s}")))?,
        ),
    };
    Ok(SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        penalty_last_n: 64,
        presence_penalty: penalty("presence_penalty", c.presence_penalty)?,
        frequency_penalty: penalty("frequency_penalty", c.frequency_penalty)?,
        seed,
        logit_bias: logit_bias(c.logit_bias.as_ref(), limits.vocab_size)?,
        logprobs,
    })
}

/// A probability-like setting in [0, 1].
fn unit(name: &str, v: Option<f64>, default: f64) -> Result<f32, ApiError> {
    match v.unwrap_or(default) {
        x if (0.0..=1.0).contains(&x) => Ok(x as f32),
        x => Err(ApiError::param(name, format!("{name} must be between 0 and 1, got {x}"))),
    }
}

/// OpenAI's presence/frequency penalties, in [-2, 2].
fn penalty(name: &str, v: Option<f64>) -> Result<f32, ApiError> {
    match v.unwrap_or(0.0) {
        x if (-2.0..=2.0).contains(&x) => Ok(x as f32),
        x => Err(ApiError::param(name, format!("{name} must be between -2 and 2, got {x}"))),
    }
}

/// A string or a list of strings; empty strings are dropped (they would match at once).
pub fn stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match v {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::param("stop", "stop must be a string or a list of strings"))?,
        Some(_) => return Err(ApiError::param("stop", "stop must be a string or a list of strings")),
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::param("stop", format!("at most {MAX_STOP} stop strings, got {}", list.len())));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// `{"token id": bias}` with biases in [-100, 100].
pub fn logit_bias(v: Option<&Value>, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(ApiError::param("logit_bias", "logit_bias must be an object of token id -> bias")),
    };
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(map.len());
    for (key, bias) in map {
        let id = key
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocab_size)
            .ok_or_else(|| ApiError::param("logit_bias", format!("logit_bias key `{key}` is not a token id")))?;
        let b = bias
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| ApiError::param("logit_bias", format!("logit_bias for {key} must be in [-100, 100]")))?;
        out.push((id, b as f32));
    }
    out.sort_by_key(|&(id, _)| id);
    Ok(out)
}

/// The output's format: `response_format` `{type: "json_object"}` (one JSON
/// object), `{type: "json_schema", json_schema: {schema}}` (a value of that
/// schema) or `{type: "text"}` (the default); or vLLM's guides:
/// `guided_json` (a schema, or its text), `guided_choice` (one of these
/// strings), `guided_regex` (a whole match), `guided_grammar` (a sentence
/// of a GBNF grammar; llama.cpp's `grammar`), or `structured_outputs` with
/// `json`, `choice`, `regex` or `grammar`.
fn output_format(c: &CommonParams, limits: Limits) -> Result<Option<OutputFormat>, ApiError> {
    fn given(v: &Option<Value>) -> Option<&Value> {
        v.as_ref().filter(|g| !g.is_null())
    }
    let mut guides = Vec::new();
    if let Some(v) = given(&c.guided_grammar) {
        guides.push(("guided_grammar", guided_grammar(v, "guided_grammar", limits)?));
    }
    if let Some(v) = given(&c.grammar) {
        guides.push(("grammar", guided_grammar(v, "grammar", limits)?));
    }
    if let Some(v) = given(&c.guided_json) {
        guides.push(("guided_json", guided_json(v, "guided_json")?));
    }
    if let Some(v) = given(&c.guided_choice) {
        guides.push(("guided_choice", guided_choice(v, "guided_choice")?));
    }
    if let Some(v) = given(&c.guided_regex) {
        guides.push(("guided_regex", guided_regex(v, "guided_regex")?));
    }
    if let Some(v) = given(&c.structured_outputs) {
        let param = "structured_outputs";
        let obj = v.as_object().ok_or_else(|| ApiError::param(param, "structured_outputs must be an object"))?;
        let keys: Vec<&str> = obj.iter().filter(|(_, x)| !x.is_null()).map(|(k, _)| k.as_str()).collect();
        let format = match keys.as_slice() {
            ["json"] => guided_json(&obj["json"], "structured_outputs.json")?,
            ["choice"] => guided_choice(&obj["choice"], "structured_outputs.choice")?,
            ["regex"] => guided_regex(&obj["regex"], "structured_outputs.regex")?,
            ["grammar"] => guided_grammar(&obj["grammar"], "structured_outputs.grammar", limits)?,
            _ => {
                let msg = "structured_outputs takes one of `json`, `choice`, `regex` and `grammar`";
                return Err(ApiError::param(param, msg));
            }
        };
        guides.push((param, format));
    }
    let format = response_format(c.response_format.as_ref())?;
    match (format, guides.len()) {
        (format, 0) => Ok(format),
        (None, 1) => Ok(guides.pop().map(|(_, f)| f)),
        (_, _) => Err(ApiError::param(guides[0].0, "give one output format: response_format or one guide")),
    }
}

/// A schema, or its text.
fn guided_json(v: &Value, param: &str) -> Result<OutputFormat, ApiError> {
    match v {
        Value::String(text) => {
            let schema: Value =
                serde_json::from_str(text).map_err(|e| ApiError::param(param, format!("{param} is not JSON: {e}")))?;
            compile_schema(&schema, param)
        }
        v => compile_schema(v, param),
    }
}

fn guided_choice(v: &Value, param: &str) -> Result<OutputFormat, ApiError> {
    let choices: Option<Vec<String>> =
        v.as_array().and_then(|l| l.iter().map(|x| x.as_str().map(str::to_string)).collect());
    let choices = choices.ok_or_else(|| ApiError::param(param, format!("{param} must be a list of strings")))?;
    let schema = Schema::choice(&choices).map_err(|e| ApiError::param(param, e))?;
    Ok(OutputFormat::Schema(Arc::new(schema)))
}

fn guided_grammar(v: &Value, param: &str, limits: Limits) -> Result<OutputFormat, ApiError> {
    let source = v.as_str().ok_or_else(|| ApiError::param(param, format!("{param} must be a string")))?;
    let format = OutputFormat::grammar(source).map_err(|e| ApiError::param(param, e))?;
    let id_of = |text: &str| limits.tokenizer.and_then(|t| t.token_to_id(text));
    format.in_vocabulary(limits.vocab_size, id_of).map_err(|e| ApiError::param(param, e))
}

fn guided_regex(v: &Value, param: &str) -> Result<OutputFormat, ApiError> {
    let source = v.as_str().ok_or_else(|| ApiError::param(param, format!("{param} must be a string")))?;
    OutputFormat::regex(source).map_err(|e| ApiError::param(param, e))
}

pub fn response_format(v: Option<&Value>) -> Result<Option<OutputFormat>, ApiError> {
    let kind = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v.get("type").and_then(Value::as_str),
    };
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputFormat::Object)),
        Some("json_schema") => {
            let param = "response_format.json_schema.schema";
            let schema = v
                .and_then(|v| v.get("json_schema"))
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| ApiError::param(param, "json_schema needs a `schema`"))?;
            compile_schema(schema, param).map(Some)
        }
        Some(other) => Err(ApiError::param(
            "response_format",
            format!("response_format type `{other}` is not supported (use `text`, `json_object` or `json_schema`)"),
        )),
        None => Err(ApiError::param("response_format", "response_format must be an object with a `type`")),
    }
}

fn compile_schema(schema: &Value, param: &str) -> Result<OutputFormat, ApiError> {
    OutputFormat::schema(schema).map_err(|e| ApiError::param(param, format!("unsupported schema: {e}")))
}

/// Chat: `logprobs: bool` and `top_logprobs: 0..=20` -> alternatives per token.
pub fn chat_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    let top = match top {
        None => None,
        Some(t) if (0..=MAX_TOP_LOGPROBS as i64).contains(&t) => Some(t as usize),
        Some(t) => {
            return Err(ApiError::param(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {t}"),
            ))
        }
    };
    match (logprobs.unwrap_or(false), top) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, Some(t)) if t > 0 => Err(ApiError::param("top_logprobs", "top_logprobs needs logprobs: true")),
        (false, _) => Ok(None),
    }
}

/// Completions: `logprobs: int` -> alternatives per token.
pub fn completion_logprobs(v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(t) if (0..=MAX_TOP_LOGPROBS as i64).contains(&t) => Ok(Some(t as usize)),
        Some(t) => {
            Err(ApiError::param("logprobs", format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {t}")))
        }
    }
}

/// The roles OpenAI's chat API knows, and Llama 3.1's `ipython` (tool results).
pub const ROLES: [&str; 7] = ["system", "developer", "user", "assistant", "tool", "function", "ipython"];

/// Chat messages for the template: string content, text parts joined by
/// newlines, or null (only an assistant turn, one that called tools) as "".
pub fn messages(list: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if list.is_empty() {
        return Err(ApiError::param("messages", "messages must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            if !ROLES.contains(&m.role.as_str()) {
                let msg = format!("unknown role {:?} (one of {})", m.role, ROLES.join(", "));
                return Err(ApiError::param(&format!("messages[{i}].role"), msg));
            }
            let tool_calls = match &m.tool_calls {
                None | Some(Value::Null) => None,
                Some(calls) => Some(tool_calls(i, calls)?),
            };
            let content = match m.content.as_ref() {
                None | Some(Value::Null) if tool_calls.is_some() => String::new(),
                v => content(i, &m.role, v)?,
            };
            Ok(Message {
                role: m.role.clone(),
                content,
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
                reasoning_content: m.reasoning_content.clone(),
            })
        })
        .collect()
}

/// `chat_template_kwargs`: an object of variables, none of those the
/// render sets itself.
pub fn template_vars(v: Option<&Value>) -> Result<Option<serde_json::Map<String, Value>>, ApiError> {
    let param = "chat_template_kwargs";
    let vars = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(vars)) => vars,
        Some(_) => return Err(ApiError::param(param, "chat_template_kwargs must be an object")),
    };
    if let Some(k) = vars.keys().find(|k| Extras::RESERVED.contains(&k.as_str())) {
        return Err(ApiError::param(param, format!("chat_template_kwargs cannot set `{k}`")));
    }
    Ok(Some(vars.clone()))
}

/// An assistant message's calls as templates take them: OpenAI's shape, the
/// arguments' JSON text read into an object (as vLLM hands them over; text
/// that is no JSON object stays text).
fn tool_calls(i: usize, calls: &Value) -> Result<Vec<Value>, ApiError> {
    let param = format!("messages[{i}].tool_calls");
    let bad = || {
        ApiError::param(
            &param,
            format!("{param} must be a list of {{id, type: \"function\", function: {{name, arguments}}}}"),
        )
    };
    let list = calls.as_array().ok_or_else(bad)?;
    list.iter()
        .map(|c| {
            let f = c.get("function").filter(|f| f.get("name").is_some_and(Value::is_string)).ok_or_else(bad)?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => Value::Object(Default::default()),
                Some(Value::String(s)) => {
                    serde_json::from_str(s).ok().filter(Value::is_object).unwrap_or_else(|| Value::String(s.clone()))
                }
                Some(a) => a.clone(),
            };
            let mut call = c.clone();
            call["type"] = Value::from("function");
            call["function"]["arguments"] = arguments;
            Ok(call)
        })
        .collect()
}

fn content(i: usize, role: &str, v: Option<&Value>) -> Result<String, ApiError> {
    let bad = |what: &str| ApiError::param(&format!("messages[{i}].content"), what.to_string());
    match v {
        None | Some(Value::Null) if role == "assistant" => Ok(String::new()),
        None | Some(Value::Null) => Err(bad(&format!("a {role} message needs content"))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => texts.push(t),
                    (Some("text"), None) => return Err(bad("a text part needs a string `text`")),
                    (Some(kind), _) => return Err(bad(&format!("content parts of type `{kind}` are not supported"))),
                    (None, _) => return Err(bad("each content part needs a `type`")),
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(bad("content must be a string or a list of text parts")),
    }
}

/// A completions request's prompts: a string, a list of token ids, or a list
/// of either (several prompts, each answered with its own `n` choices).
pub fn prompts(v: &Value, vocab_size: usize) -> Result<Vec<Prompt>, ApiError> {
    let empty = || ApiError::param("prompt", "prompt must not be empty");
    match v {
        Value::String(s) => Ok(vec![Prompt::Text(s.clone())]),
        Value::Array(items) if items.is_empty() => Err(empty()),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            Ok(items.iter().filter_map(Value::as_str).map(|s| Prompt::Text(s.to_string())).collect())
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            Ok(vec![Prompt::Tokens(token_ids(items, vocab_size)?)])
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|ids| match ids.as_array() {
                Some(ids) if !ids.is_empty() => token_ids(ids, vocab_size).map(Prompt::Tokens),
                _ => Err(empty()),
            })
            .collect(),
        _ => Err(ApiError::param("prompt", "prompt must be a string, a list of token ids, or a list of either")),
    }
}

fn token_ids(items: &[Value], vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| id < vocab_size as u64)
                .map(|id| id as u32)
                .ok_or_else(|| ApiError::param("prompt", format!("{v} is not a token id (vocabulary: {vocab_size})")))
        })
        .collect()
}

/// The other APIs' text: a string, or a list of parts joined by newlines,
/// each part's text as `part` reads it (a part it cannot read refuses the whole).
pub fn joined_text<'a>(v: &'a Value, part: impl Fn(&'a Value) -> Option<&'a str>) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts.iter().map(part).collect::<Option<Vec<&str>>>().map(|t| t.join("\n")),
        _ => None,
    }
}

/// The other APIs' `tools` in the chat shape: each entry's function object
/// from `function` (or its refusal).
pub fn function_tools(
    tools: &Value,
    function: impl Fn(usize, &Value) -> Result<serde_json::Map<String, Value>, ApiError>,
) -> Result<Value, ApiError> {
    let list = tools.as_array().ok_or_else(|| ApiError::param("tools", "tools must be a list"))?;
    let tool = |(i, t)| function(i, t).map(|f| serde_json::json!({"type": "function", "function": f}));
    list.iter().enumerate().map(tool).collect::<Result<Vec<Value>, ApiError>>().map(Value::Array)
}

/// An id of the APIs' shape: `prefix` (its separator included), then 24
/// random hex digits.
pub fn random_id(prefix: &str) -> String {
    format!("{prefix}{:016x}{:08x}", random_u64(), random_u64() as u32)
}

/// Unpredictable 64 bits without a RNG crate: std's randomly keyed hasher.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
