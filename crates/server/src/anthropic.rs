//! Anthropic's Messages API (`POST /v1/messages`) as the chat pipeline sees
//! it: a request becomes a chat request (`to_chat`), a reply's parts become
//! content blocks (`blocks`), all as pure functions.

use serde_json::{json, Map, Value};

use crate::convert::{function_tools, joined_text, random_id};
use crate::errors::ApiError;
use crate::reply::Parts;
use ferrite_engine::{FinishReason, Summary};

/// The request's fields a chat request takes as they are. (Not `model`:
/// Anthropic's clients name their own models, so any name is served.)
const PASSED: [&str; 4] = ["temperature", "top_p", "top_k", "stream"];

/// The chat request (JSON) a Messages request stands for.
pub fn to_chat(body: &Value) -> Result<Value, ApiError> {
    let req = body.as_object().ok_or_else(|| ApiError::invalid("the body must be a JSON object"))?;
    let given = |k: &str| req.get(k).filter(|v| !v.is_null());
    let mut chat = Map::new();
    for k in PASSED {
        if let Some(v) = given(k) {
            chat.insert(k.into(), v.clone());
        }
    }
    let max = given("max_tokens").ok_or_else(|| ApiError::param("max_tokens", "max_tokens is required"))?;
    chat.insert("max_completion_tokens".into(), max.clone());
    if let Some(stops) = given("stop_sequences") {
        chat.insert("stop".into(), stops.clone());
    }
    // Extended thinking and its effort as the templates that take them name them.
    // (No `thinking`: none, as Anthropic's default is.)
    let on = match given("thinking").map(|t| t.get("type").and_then(Value::as_str)) {
        None | Some(Some("disabled")) => false,
        Some(Some("enabled" | "adaptive")) => true,
        _ => return Err(ApiError::param("thinking", "thinking.type must be enabled, adaptive or disabled")),
    };
    let mut vars = Map::new();
    vars.insert("enable_thinking".into(), json!(on));
    let config = given("output_config");
    if let Some(effort) = config.and_then(|c| c.get("effort")).filter(|e| !e.is_null()) {
        vars.insert("reasoning_effort".into(), effort.clone());
    }
    chat.insert("chat_template_kwargs".into(), Value::Object(vars));
    // Structured outputs: a JSON Schema.
    if let Some(f) = config.and_then(|c| c.get("format")).filter(|f| !f.is_null()) {
        if f.get("type").and_then(Value::as_str) != Some("json_schema") {
            return Err(ApiError::param("output_config.format", "output_config.format.type must be json_schema"));
        }
        let schema = f.get("schema").cloned().unwrap_or(Value::Null);
        chat.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
        );
    }
    let mut messages = Vec::new();
    if let Some(system) = given("system") {
        let text = text_of(system).ok_or_else(|| ApiError::param("system", "system must be text or text blocks"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let list = given("messages").and_then(Value::as_array);
    let list = list.ok_or_else(|| ApiError::param("messages", "messages must be a list"))?;
    for (i, m) in list.iter().enumerate() {
        message(&mut messages, i, m)?;
    }
    // A final assistant message is a prefill: the reply goes on with it.
    if messages.last().is_some_and(|m| m["role"] == "assistant" && m.get("tool_calls").is_none()) {
        chat.insert("continue_final_message".into(), json!(true));
        chat.insert("add_generation_prompt".into(), json!(false));
    }
    chat.insert("messages".into(), Value::Array(merged(messages)));
    if let Some(tools) = given("tools") {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = given("tool_choice") {
        let kind = choice.get("type").and_then(Value::as_str);
        let c = match kind {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                let name = choice.get("name").filter(|n| n.is_string());
                let name = name.ok_or_else(|| ApiError::param("tool_choice", "a tool tool_choice needs a name"))?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => return Err(ApiError::param("tool_choice", "tool_choice.type must be auto, any, tool or none")),
        };
        chat.insert("tool_choice".into(), c);
        if choice.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    Ok(Value::Object(chat))
}

/// One message onto the chat messages: a user's tool results become tool
/// messages (ahead of its text), an assistant's thinking its reasoning and
/// its tool uses its calls.
fn message(messages: &mut Vec<Value>, i: usize, m: &Value) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let bad = |what: &str| ApiError::param(&at, format!("{at}: {what}"));
    let role = m.get("role").and_then(Value::as_str).ok_or_else(|| bad("a message needs a role"))?;
    if role != "user" && role != "assistant" {
        return Err(bad(&format!("role must be user or assistant, not {role:?}")));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        _ => return Err(bad("content must be text or a list of blocks")),
    };
    let (mut text, mut reasoning, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let kind = b.get("type").and_then(Value::as_str).unwrap_or_default();
        let field = |k: &str| b.get(k).ok_or_else(|| bad(&format!("content[{j}] needs `{k}`")));
        let string = |k: &str| field(k)?.as_str().ok_or_else(|| bad(&format!("content[{j}].{k} must be a string")));
        match (role, kind) {
            (_, "text") => text.push(string("text")?.to_string()),
            // A plain-text document or a search result: its text.
            (_, "document" | "search_result") => {
                let source = b.get("source").filter(|s| s.get("type").and_then(Value::as_str) == Some("text"));
                let t = source.and_then(|s| s.get("data")).and_then(Value::as_str);
                let t = t.map(str::to_string).or_else(|| b.get("content").and_then(text_of));
                text.push(t.ok_or_else(|| bad(&format!("content[{j}]: only text documents are supported")))?);
            }
            ("user", "tool_result") => {
                let id = string("tool_use_id")?;
                let content = match b.get("content") {
                    None | Some(Value::Null) => Some(String::new()),
                    Some(c) => text_of(c),
                };
                let content = content.ok_or_else(|| bad(&format!("content[{j}]: a tool result is text")))?;
                let content = if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    format!("Error: {content}")
                } else {
                    content
                };
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("assistant", "thinking") => reasoning.push(string("thinking")?.to_string()),
            ("assistant", "redacted_thinking") => {}
            ("assistant", "tool_use") => {
                let input = field("input")?;
                calls.push(json!({"id": field("id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": input.to_string()}}));
            }
            _ => return Err(bad(&format!("content[{j}]: {role} blocks of type `{kind}` are not supported"))),
        }
    }
    if role == "user" {
        if !text.is_empty() {
            messages.push(json!({"role": "user", "content": text.join("\n")}));
        }
        return Ok(());
    }
    let mut out = json!({"role": "assistant", "content": text.join("\n")});
    if !calls.is_empty() {
        out["tool_calls"] = Value::Array(calls);
    }
    if !reasoning.is_empty() {
        out["reasoning_content"] = json!(reasoning.join("\n"));
    }
    messages.push(out);
    Ok(())
}

/// Consecutive user or assistant messages as one, as Anthropic reads them
/// (templates that want turns to alternate refuse them otherwise).
fn merged(messages: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or_default().to_string();
        let last = out.last_mut().filter(|l| l["role"] == role.as_str() && (role == "user" || role == "assistant"));
        let Some(last) = last else {
            out.push(m);
            continue;
        };
        let text = |v: &Value| v["content"].as_str().unwrap_or_default().to_string();
        let joined = [text(last), text(&m)].into_iter().filter(|t| !t.is_empty()).collect::<Vec<_>>().join("\n");
        last["content"] = json!(joined);
        if let Some(Value::Array(calls)) = m.get("tool_calls") {
            match last.get_mut("tool_calls") {
                Some(Value::Array(mine)) => mine.extend(calls.iter().cloned()),
                _ => last["tool_calls"] = json!(calls),
            }
        }
        if let Some(r) = m.get("reasoning_content") {
            last["reasoning_content"] = r.clone();
        }
    }
    out
}

/// A string, or the text of text blocks, joined (an image, which this
/// server cannot show a model, as a placeholder saying so).
fn text_of(v: &Value) -> Option<String> {
    joined_text(v, |b| match b.get("type").and_then(Value::as_str) {
        Some("text") => b.get("text")?.as_str(),
        Some("image") => Some("[an image, not shown]"),
        _ => None,
    })
}

/// Client tools (`{name, description, input_schema}`) in the chat shape,
/// and the client tools whose schema the API defines (bash, the text
/// editor) with it. Server tools (web search, code execution, ...) run on
/// the API's own servers: refused.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    function_tools(tools, |i, t| {
        let renamed = [("name", "name"), ("description", "description"), ("input_schema", "parameters")];
        let mut f: Map<String, Value> =
            renamed.iter().filter_map(|(from, to)| Some((to.to_string(), t.get(*from)?.clone()))).collect();
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(kind) => {
                let Some((description, parameters)) = defined_tool(kind) else {
                    let msg = format!(
                        "tools[{i}]: tools of type {kind:?} are not supported (custom tools are, and \
                         bash_* and text_editor_*; server tools run on the API's own servers)"
                    );
                    return Err(ApiError::param("tools", msg));
                };
                f.insert("description".into(), json!(description));
                f.insert("parameters".into(), parameters);
            }
        }
        Ok(f)
    })
}

/// The description and input schema of a client tool the API defines, by
/// its versioned type (`bash_20250124`, `text_editor_20250728`, ...).
fn defined_tool(kind: &str) -> Option<(&'static str, Value)> {
    let (family, version) = kind.rsplit_once('_')?;
    if version.len() != 8 || !version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match family {
        "bash" => Some((
            "Runs a command in a persistent bash session; `restart` starts a new session.",
            json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "The command to run."},
                "restart": {"type": "boolean", "description": "Restart the session."}}}),
        )),
        "text_editor" => {
            // (Undoing an edit went after the January 2025 version.)
            let mut commands = vec!["view", "create", "str_replace", "insert"];
            if version < "20250429" {
                commands.push("undo_edit");
            }
            Some((
                "Views, creates and edits text files: `view` a file (`view_range`: first and last line, \
                 1-based, -1 for the end) or a directory, `create` one with `file_text`, `str_replace` \
                 the one occurrence of `old_str` with `new_str`, `insert` `new_str` after line \
                 `insert_line` (0: at the start).",
                json!({"type": "object", "properties": {
                    "command": {"type": "string", "enum": commands},
                    "path": {"type": "string", "description": "The file's or directory's absolute path."},
                    "file_text": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                    "insert_line": {"type": "integer", "minimum": 0},
                    "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}},
                    "required": ["command", "path"]}),
            ))
        }
        _ => None,
    }
}

/// A reply's content blocks: its thinking, its text, its tool uses.
pub fn blocks(parts: Parts) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = parts.reasoning {
        out.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(text) = parts.content.filter(|t| !t.is_empty()) {
        out.push(json!({"type": "text", "text": text}));
    }
    for c in parts.calls {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        out.push(json!({"type": "tool_use", "id": random_id("toolu_"), "name": c.name, "input": input}));
    }
    out
}

/// Why a reply ended, in the API's words: `stop_reason`, and the
/// `stop_sequence` that ended it, where one did.
pub fn stop_reason(s: &Summary, called: bool) -> (&'static str, Option<String>) {
    match (s.finish == FinishReason::Length, called, &s.stop) {
        (true, _, _) => ("max_tokens", None),
        (false, true, _) => ("tool_use", None),
        (false, false, Some(stop)) => ("stop_sequence", Some(stop.clone())),
        (false, false, None) => ("end_turn", None),
    }
}

/// Usage in the API's terms: `input_tokens` are the prompt's not read from
/// the prefix cache (`prompt` counts all of them).
pub fn usage(prompt: usize, cached: usize, output: usize) -> Value {
    json!({"input_tokens": prompt.saturating_sub(cached), "output_tokens": output, "cache_read_input_tokens": cached,
           "cache_creation_input_tokens": 0})
}

/// An error in Anthropic's shape (`{"type": "error", "error": {type, message}}`),
/// its status kept; a prompt past the context says so as Anthropic does.
pub fn error(e: &ApiError) -> (axum::http::StatusCode, Value) {
    let kind = match e.status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    };
    let message = match e.status.as_u16() {
        400 if e.message.contains("context") => format!("prompt is too long: {}", e.message),
        401 => "missing or incorrect API key; send it as `x-api-key: KEY`".to_string(),
        _ => e.message.clone(),
    };
    (e.status, json!({"type": "error", "error": {"type": kind, "message": message}}))
}

/// The message object (`content` empty and no `stop_reason` while streaming).
pub fn message_object(
    id: &str,
    model: &str,
    content: Vec<Value>,
    stop: Option<(&str, Option<String>)>,
    usage: Value,
) -> Value {
    let (reason, sequence) = stop.unzip();
    json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": reason, "stop_sequence": sequence.flatten(), "usage": usage})
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
