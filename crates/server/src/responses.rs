//! OpenAI's Responses API (`POST /v1/responses`) as the chat pipeline sees
//! it: a request becomes a chat request (`to_chat`), a reply's parts become
//! output items (`items`), all as pure functions. Stateless: the whole
//! conversation comes in `input`, nothing is stored, so
//! `previous_response_id` and `background` are refused.

use serde_json::{json, Map, Value};

use crate::convert::{function_tools, joined_text, random_id};
use crate::errors::ApiError;
use crate::reply::Parts;

/// The request's fields a chat request takes as they are (the chat
/// extensions included, as clients send them in `extra_body`).
const PASSED: [&str; 21] = [
    "model",
    "temperature",
    "top_p",
    "stream",
    "parallel_tool_calls",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
    "include_reasoning",
    "structured_outputs",
    "guided_json",
    "guided_choice",
    "guided_regex",
    "guided_grammar",
];

/// Input messages' roles.
const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// The chat request (JSON) a Responses request stands for.
pub fn to_chat(body: &Value) -> Result<Value, ApiError> {
    let req = body.as_object().ok_or_else(|| ApiError::invalid("the body must be a JSON object"))?;
    let given = |k: &str| req.get(k).filter(|v| !v.is_null());
    for (k, why) in [
        ("previous_response_id", "responses are not stored: send the whole conversation in `input`"),
        ("conversation", "conversations are not stored: send the whole conversation in `input`"),
        ("prompt", "stored prompts are not supported"),
    ] {
        if given(k).is_some() {
            return Err(ApiError::param(k, why));
        }
    }
    if given("background").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::param("background", "background responses are not supported"));
    }
    if given("truncation").is_some_and(|t| t != "disabled" && t != "auto") {
        return Err(ApiError::param("truncation", "truncation must be \"auto\" or \"disabled\""));
    }
    let mut chat = Map::new();
    for k in PASSED {
        if let Some(v) = given(k) {
            chat.insert(k.into(), v.clone());
        }
    }
    // Logprobs come with `include` naming them, or with `top_logprobs` above 0.
    let include = match given("include") {
        Some(Value::Array(names)) => names.clone(),
        Some(_) => return Err(ApiError::param("include", "include must be a list")),
        None => Vec::new(),
    };
    let top = given("top_logprobs");
    if include.iter().any(|n| n == "message.output_text.logprobs") || top.and_then(Value::as_u64).is_some_and(|n| n > 0)
    {
        chat.insert("logprobs".into(), json!(true));
        chat.insert("top_logprobs".into(), top.cloned().unwrap_or(json!(0)));
    }
    if let Some(m) = given("max_output_tokens") {
        chat.insert("max_completion_tokens".into(), m.clone());
    }
    // Template variables, with `reasoning.effort` as the templates that take it name it.
    let mut vars = match given("chat_template_kwargs") {
        Some(Value::Object(v)) => v.clone(),
        Some(_) => return Err(ApiError::param("chat_template_kwargs", "chat_template_kwargs must be an object")),
        None => Map::new(),
    };
    if let Some(effort) = given("reasoning").and_then(|r| r.get("effort")).filter(|e| !e.is_null()) {
        vars.insert("reasoning_effort".into(), effort.clone());
    }
    if !vars.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(vars));
    }
    let mut messages = Vec::new();
    if let Some(i) = given("instructions") {
        let text = i.as_str().ok_or_else(|| ApiError::param("instructions", "instructions must be a string"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    match given("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            let mut reasoning = None;
            for (i, item) in items.iter().enumerate() {
                input_item(&mut messages, &mut reasoning, i, item)?;
            }
        }
        _ => return Err(ApiError::param("input", "input must be a string or a list of items")),
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = given("tools") {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = given("tool_choice") {
        let c = match choice {
            Value::String(_) => choice.clone(),
            c if c.get("type").and_then(Value::as_str) == Some("function") => {
                let name = c.get("name").filter(|n| n.is_string());
                let name = name.ok_or_else(|| ApiError::param("tool_choice", "a function tool_choice needs a name"))?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => return Err(ApiError::param("tool_choice", "tool_choice must be auto, none, required or a function")),
        };
        chat.insert("tool_choice".into(), c);
    }
    if let Some(format) = given("text").and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        if let Some(f) = response_format(format)? {
            chat.insert("response_format".into(), f);
        }
    }
    Ok(Value::Object(chat))
}

/// With `truncation: "auto"`, the chat request (from `to_chat`) less its
/// oldest turn: the messages after the system ones up to the next user
/// message (so roles still alternate, and calls keep their results); false
/// where only the last turn is left.
pub fn drop_oldest(chat: &mut Value) -> bool {
    let Some(messages) = chat.get_mut("messages").and_then(Value::as_array_mut) else { return false };
    let role = |m: &Value| m.get("role").and_then(Value::as_str).unwrap_or_default().to_string();
    let Some(first) = messages.iter().position(|m| role(m) != "system" && role(m) != "developer") else {
        return false;
    };
    let Some(next) = messages.iter().skip(first + 1).position(|m| role(m) == "user") else { return false };
    messages.drain(first..first + 1 + next);
    true
}

/// One input item onto the chat messages: a message, a function call (onto
/// the assistant message before it, or a new one) or a call's output; a
/// reasoning item's text goes with the assistant message after it (the
/// templates that show reasoning do so in a tool-calling loop).
fn input_item(
    messages: &mut Vec<Value>,
    reasoning: &mut Option<String>,
    i: usize,
    item: &Value,
) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let bad = |what: &str| ApiError::param(&at, format!("{at}: {what}"));
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    let new_assistant = |content: Value, reasoning: &mut Option<String>| {
        let mut m = json!({"role": "assistant", "content": content});
        if let Some(r) = reasoning.take() {
            m["reasoning_content"] = json!(r);
        }
        m
    };
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).ok_or_else(|| bad("a message needs a role"))?;
            if !ROLES.contains(&role) {
                let msg = format!("role {role:?} is not one of {}", ROLES.join(", "));
                return Err(ApiError::param(&format!("{at}.role"), format!("{at}: {msg}")));
            }
            let content = text_of(item.get("content")).ok_or_else(|| bad("content must be text or text parts"))?;
            match role {
                "assistant" => messages.push(new_assistant(json!(content), reasoning)),
                _ => messages.push(json!({"role": role, "content": content})),
            }
        }
        "function_call" => {
            let field = |k: &str| item.get(k).and_then(Value::as_str).ok_or_else(|| bad(&format!("`{k}` is missing")));
            let call = json!({"id": field("call_id")?, "type": "function",
                "function": {"name": field("name")?, "arguments": field("arguments")?}});
            if reasoning.is_some() {
                messages.push(new_assistant(Value::Null, reasoning));
            }
            let last = messages.last_mut().and_then(Value::as_object_mut);
            match last.filter(|m| m.get("role").is_some_and(|r| r == "assistant")) {
                Some(m) => match m.entry("tool_calls").or_insert_with(|| json!([])) {
                    Value::Array(calls) => calls.push(call),
                    _ => return Err(bad("the assistant message before it has malformed tool_calls")),
                },
                None => messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| bad("`call_id` is missing"))?;
            let output = text_of(item.get("output")).ok_or_else(|| bad("output must be text or text parts"))?;
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        }
        "reasoning" => {
            let texts = |k: &str| item.get(k).and_then(|c| text_of(Some(c)).filter(|t| !t.is_empty()));
            *reasoning = texts("content").or_else(|| texts("summary"));
        }
        other => return Err(bad(&format!("items of type `{other}` are not supported"))),
    }
    Ok(())
}

/// A string, or the text of `input_text`/`output_text` parts, joined.
fn text_of(v: Option<&Value>) -> Option<String> {
    joined_text(v?, |p| match p.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text" | "reasoning_text" | "summary_text") => p.get("text")?.as_str(),
        _ => None,
    })
}

/// Function tools (flat: `{type, name, description, parameters}`) in the chat shape.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    function_tools(tools, |i, t| {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::param("tools", format!("tools[{i}]: only function tools are supported")));
        }
        let mut f = t.as_object().cloned().unwrap_or_default();
        f.remove("type");
        f.remove("strict");
        Ok(f)
    })
}

/// `text.format` as a chat `response_format` (`None`: plain text).
fn response_format(f: &Value) -> Result<Option<Value>, ApiError> {
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = f.get("schema").cloned().unwrap_or(Value::Null);
            let name = f.get("name").cloned().unwrap_or_else(|| json!("output"));
            Ok(Some(json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}})))
        }
        _ => Err(ApiError::param("text.format", "text.format.type must be text, json_object or json_schema")),
    }
}

/// A reply's output items: its reasoning, its message (with `logprobs`,
/// a list), its calls.
pub fn items(parts: Parts, complete: bool, short_ids: bool, logprobs: Value) -> Vec<Value> {
    let status = if complete { "completed" } else { "incomplete" };
    let mut out = Vec::new();
    if let Some(r) = parts.reasoning {
        out.push(reasoning_item(&random_id("rs_"), &r, status));
    }
    if let Some(text) = parts.content {
        out.push(message_item(&random_id("msg_"), &text, status, logprobs));
    }
    for c in parts.calls {
        out.push(call_item(&random_id("fc_"), &crate::tools::call_id(short_ids), &c.name, &c.arguments, "completed"));
    }
    out
}

pub fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    let content = if text.is_empty() { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) };
    json!({"type": "reasoning", "id": id, "summary": [], "content": content, "status": status})
}

pub fn message_item(id: &str, text: &str, status: &str, logprobs: Value) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([text_part(text, logprobs)]) };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

pub fn text_part(text: &str, logprobs: Value) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

pub fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments,
           "status": status})
}

/// The response object: `request` is the Responses request (its settings
/// are echoed back, as OpenAI's are), `usage` null while in progress.
pub fn response(
    id: &str,
    created: u64,
    model: &str,
    request: &Value,
    status: &str,
    output: Vec<Value>,
    usage: Value,
) -> Value {
    let r = |k: &str, default: Value| request.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
    json!({
        "id": id, "object": "response", "created_at": created, "status": status, "error": null,
        "incomplete_details": incomplete, "instructions": r("instructions", Value::Null), "model": model,
        "output": output, "parallel_tool_calls": r("parallel_tool_calls", json!(true)),
        "tool_choice": r("tool_choice", json!("auto")), "tools": r("tools", json!([])),
        "temperature": r("temperature", json!(1.0)), "top_p": r("top_p", json!(1.0)),
        "max_output_tokens": r("max_output_tokens", Value::Null), "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null}, "store": false,
        "text": r("text", json!({"format": {"type": "text"}})), "truncation": r("truncation", json!("disabled")),
        "top_logprobs": r("top_logprobs", json!(0)),
        "metadata": r("metadata", json!({})), "usage": usage,
    })
}

/// Usage in the API's shape.
pub fn usage(input: usize, cached: usize, output: usize) -> Value {
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output,
           "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input + output})
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
