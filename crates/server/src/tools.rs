//! Function calling: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`.
//!
//! The functions go to the chat template as transformers passes them; a
//! template that shows none of them (it ignores `tools`) gets them in a
//! system message instead, with the call syntax to use. `tool_choice:
//! "required"` and a named function constrain the reply to JSON (as vLLM
//! does): a list of calls, or the named function's arguments. `auto` replies
//! are read for calls in the shapes models are trained to write:
//! `<tool_call>{...}</tool_call>` blocks (Hermes, Qwen) anywhere in the
//! reply, or a reply that is wholly a call object or a list of them
//! (`{"name", "arguments" | "parameters"}`, Llama 3 and Mistral, after an
//! optional `<|python_tag|>` or `[TOOL_CALLS]`). A reply with no call that
//! reads whole is plain content.

use ferrite_engine::constraint::format::OutputFormat;
use ferrite_loader::chat_template::{ChatTemplate, Extras, Message};
use serde_json::{json, Map, Value};

use crate::errors::ApiError;

/// The opening and closing of a Hermes-style call block.
pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// Markers some models write before a call in JSON.
const MARKERS: [&str; 2] = ["<|python_tag|>", "[TOOL_CALLS]"];

/// What a request's tools allow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Choice {
    /// The model decides (the default).
    Auto,
    /// At least one call (one only without `parallel_tool_calls`).
    Required,
    /// A call of this function (its index in `tools`).
    Named(usize),
}

/// A request's functions and how they may be called.
#[derive(Debug)]
pub struct ToolUse {
    /// The request's `tools` list as given: what templates take.
    pub tools: Vec<Value>,
    names: Vec<String>,
    /// Each function's arguments schema (an empty object's when not given).
    params: Vec<Value>,
    pub choice: Choice,
    parallel: bool,
}

/// One call read from a reply; `arguments` is JSON text, as OpenAI sends it.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// A reply read for calls: `calls` empty means plain content.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

/// The request's tools, or `None` where there are none or `tool_choice` is
/// "none" (the functions are then not shown to the model at all).
pub fn from_request(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolUse>, ApiError> {
    let choice = choice.filter(|c| !c.is_null());
    let list = match tools {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(list)) => list.as_slice(),
        Some(_) => return Err(ApiError::param("tools", "tools must be a list")),
    };
    if list.is_empty() {
        let harmless = choice.is_none_or(|c| c == "none" || c == "auto");
        return match harmless {
            true => Ok(None),
            false => Err(ApiError::param("tool_choice", "tool_choice needs a non-empty tools list")),
        };
    }
    let (mut names, mut params) = (Vec::new(), Vec::new());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::param(&at, format!("{at}.type must be \"function\"")));
        }
        let f = tool.get("function").and_then(Value::as_object);
        let f = f.ok_or_else(|| ApiError::param(&at, format!("{at}.function must be an object")))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
            let msg = format!("{at}.function.name must be 1 to 64 letters, digits, underscores or dashes");
            return Err(ApiError::param(&at, msg));
        }
        if names.iter().any(|n| n == name) {
            return Err(ApiError::param(&at, format!("two tools are named {name:?}")));
        }
        // Arguments are an object: a schema that does not say so is made to.
        let p = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(Value::Object(p)) if p.get("type").is_none_or(|t| t == "object") => {
                let mut p = p.clone();
                p.insert("type".into(), json!("object"));
                Value::Object(p)
            }
            Some(_) => {
                let msg = format!("{at}.function.parameters must be the JSON Schema of an object");
                return Err(ApiError::param(&at, msg));
            }
        };
        names.push(name.to_string());
        params.push(p);
    }
    let choice = match choice {
        None => Choice::Auto,
        Some(Value::String(c)) if c == "none" => return Ok(None),
        Some(Value::String(c)) if c == "auto" => Choice::Auto,
        Some(Value::String(c)) if c == "required" => Choice::Required,
        Some(c) => {
            let named = c.get("type").and_then(Value::as_str) == Some("function");
            let name = c.pointer("/function/name").and_then(Value::as_str).filter(|_| named);
            let bad = "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
            let name = name.ok_or_else(|| ApiError::param("tool_choice", bad))?;
            let i = names.iter().position(|n| n == name);
            Choice::Named(i.ok_or_else(|| ApiError::param("tool_choice", format!("no tool is named {name:?}")))?)
        }
    };
    Ok(Some(ToolUse { tools: list.to_vec(), names, params, choice, parallel: parallel.unwrap_or(true) }))
}

impl ToolUse {
    /// The reply's constraint: `required`, a list of calls; a named
    /// function, its arguments; `auto`, none.
    pub fn format(&self) -> Result<Option<OutputFormat>, ApiError> {
        let compile = |schema: &Value, at: &str| {
            OutputFormat::schema(schema).map_err(|e| ApiError::param("tools", format!("{at}.function.parameters: {e}")))
        };
        match self.choice {
            Choice::Auto => Ok(None),
            Choice::Named(i) => compile(&self.params[i], &format!("tools[{i}]")).map(Some),
            Choice::Required => {
                for (i, p) in self.params.iter().enumerate() {
                    compile(p, &format!("tools[{i}]"))?;
                }
                // A schema with references goes whole into `$defs`, its
                // references rewritten to point into that copy.
                let mut defs = Map::new();
                let alternatives: Vec<Value> = (self.names.iter().zip(&self.params).enumerate())
                    .map(|(i, (name, p))| {
                        let args = match has_ref(p) {
                            true => {
                                let key = format!("tool{i}");
                                let mut copy = p.clone();
                                rebase_refs(&mut copy, &format!("#/$defs/{key}"));
                                defs.insert(key.clone(), copy);
                                json!({"$ref": format!("#/$defs/{key}")})
                            }
                            false => p.clone(),
                        };
                        json!({"type": "object", "properties": {"name": {"const": name}, "arguments": args},
                               "required": ["name", "arguments"], "additionalProperties": false})
                    })
                    .collect();
                let mut list = json!({"type": "array", "items": {"anyOf": alternatives}, "minItems": 1});
                if !defs.is_empty() {
                    list["$defs"] = Value::Object(defs);
                }
                if !self.parallel {
                    list["maxItems"] = json!(1);
                }
                compile(&list, "tools").map(Some)
            }
        }
    }

    /// Whether the reply is constrained to calls (so streams hold it all).
    pub fn constrained(&self) -> bool {
        self.choice != Choice::Auto
    }

    /// The messages as the template is to get them: where `template` shows
    /// no tools, a system message that lists them (added to the first
    /// system message, if any; for a template that takes no system
    /// message, ahead of the first user message's text), and earlier calls
    /// written into their assistant messages' text in the syntax the note
    /// asks for.
    pub fn prepare(&self, template: &ChatTemplate, shown: bool, messages: &[Message]) -> Vec<Message> {
        if shown {
            return messages.to_vec();
        }
        let calls_written = results_as_user(messages.iter().map(written_calls).collect());
        let note = self.note();
        let mut out = calls_written.clone();
        match out.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{note}", first.content),
            _ => out.insert(0, Message::new("system", note.clone())),
        }
        if template.render(&out, true).is_ok() || template.render(&calls_written, true).is_err() {
            return out;
        }
        let mut out = calls_written;
        if let Some(user) = out.iter_mut().find(|m| m.role == "user") {
            user.content = format!("{note}\n\n{}", user.content);
        }
        out
    }

    /// The functions and the call syntax, for templates that show no tools.
    fn note(&self) -> String {
        let mut s = String::from("You can call these functions (their arguments are JSON Schemas):\n");
        for tool in &self.tools {
            let f = &tool["function"];
            let mut line = Map::new();
            line.insert("name".into(), f["name"].clone());
            if let Some(d) = f.get("description").filter(|d| d.is_string()) {
                line.insert("description".into(), d.clone());
            }
            let i = self.names.iter().position(|n| f["name"] == n.as_str()).unwrap_or(0);
            line.insert("parameters".into(), self.params[i].clone());
            s += &Value::Object(line).to_string();
            s.push('\n');
        }
        s + "To call a function, reply with <tool_call>{\"name\": <function name>, \"arguments\": <arguments \
             as a JSON object>}</tool_call>, one block per call."
    }

    /// Reads a finished reply (the whole text) for calls.
    pub fn read(&self, text: &str) -> Reply {
        let calls = match self.choice {
            Choice::Auto => return self.read_auto(text),
            Choice::Required => serde_json::from_str::<Vec<Value>>(text).ok().and_then(|list| self.calls(&list)),
            Choice::Named(i) => serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_object)
                .map(|args| vec![Call { name: self.names[i].clone(), arguments: args.to_string() }]),
        };
        match calls {
            Some(calls) => Reply { content: None, calls },
            None => Reply { content: Some(text.to_string()), calls: Vec::new() },
        }
    }

    fn read_auto(&self, text: &str) -> Reply {
        let mut reply = self.read_calls(text);
        if !self.parallel {
            reply.calls.truncate(1);
        }
        reply
    }

    /// The text outside call blocks is content: the part before the first
    /// as written (but its trailing whitespace), then each later part
    /// trimmed, on a line of its own (streams send the same). One block
    /// that does not read (cut short, say) makes the whole reply content, as
    /// in vLLM.
    fn read_calls(&self, text: &str) -> Reply {
        let plain = || Reply { content: Some(text.to_string()), calls: Vec::new() };
        if let Some(first) = text.find(OPEN) {
            let mut content = text[..first].trim_end().to_string();
            let mut calls = Vec::new();
            let mut rest = &text[first..];
            while let Some(at) = rest.find(OPEN) {
                let (between, block) = (&rest[..at], &rest[at + OPEN.len()..]);
                push_text(&mut content, between);
                let (inner, after) = block.split_once(CLOSE).unwrap_or((block, ""));
                let Some(call) = serde_json::from_str(inner.trim()).ok().and_then(|v| self.call(&v)) else {
                    return plain();
                };
                calls.push(call);
                rest = after;
            }
            push_text(&mut content, rest);
            return Reply { content: Some(content).filter(|c| !c.is_empty()), calls };
        }
        let mut body = text.trim_start();
        for m in MARKERS {
            body = body.strip_prefix(m).unwrap_or(body).trim_start();
        }
        let whole = match serde_json::from_str::<Value>(body.trim_end()) {
            Ok(Value::Array(list)) => self.calls(&list),
            Ok(v @ Value::Object(_)) => self.call(&v).map(|c| vec![c]),
            // Llama 3.2 writes several calls separated by semicolons.
            _ if body.starts_with('{') => (body.split(';').map(str::trim).filter(|p| !p.is_empty()))
                .map(|part| serde_json::from_str::<Value>(part).ok().and_then(|v| self.call(&v)))
                .collect(),
            _ => None,
        };
        match whole {
            Some(calls) if !calls.is_empty() => Reply { content: None, calls },
            _ => plain(),
        }
    }

    fn calls(&self, list: &[Value]) -> Option<Vec<Call>> {
        let calls: Option<Vec<Call>> = list.iter().map(|v| self.call(v)).collect();
        calls.filter(|c| !c.is_empty())
    }

    /// `{"name": <a declared function>, "arguments" | "parameters": {...}}`;
    /// arguments given as JSON text are taken when they read as an object.
    fn call(&self, v: &Value) -> Option<Call> {
        let name = v.get("name")?.as_str()?;
        if !self.names.iter().any(|n| n == name) {
            return None;
        }
        let args = v.get("arguments").or_else(|| v.get("parameters"));
        let arguments = match args {
            None => "{}".to_string(),
            Some(a @ Value::Object(_)) => a.to_string(),
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?.to_string(),
            Some(_) => return None,
        };
        Some(Call { name: name.to_string(), arguments })
    }
}

fn has_ref(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| k == "$ref" || has_ref(v)),
        Value::Array(l) => l.iter().any(has_ref),
        _ => false,
    }
}

/// Every `"$ref": "#..."` in `v` made to point under `base` instead of the root.
fn rebase_refs(v: &mut Value, base: &str) {
    match v {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    Value::String(r) if k == "$ref" && r.starts_with('#') => *r = format!("{base}{}", &r[1..]),
                    v => rebase_refs(v, base),
                }
            }
        }
        Value::Array(l) => l.iter_mut().for_each(|v| rebase_refs(v, base)),
        _ => {}
    }
}

fn push_text(content: &mut String, text: &str) {
    let text = text.trim();
    if !text.is_empty() {
        if !content.is_empty() {
            content.push('\n');
        }
        content.push_str(text);
    }
}

/// What a chat template does with tools, found once per template.
#[derive(Clone, Copy, Debug, Default)]
pub struct TemplateTools {
    /// It writes the tools it is given (else `ToolUse::prepare` lists them).
    pub shown: bool,
    /// It wants Mistral's call ids (`call_id`).
    pub short_ids: bool,
}

impl TemplateTools {
    pub fn of(template: &ChatTemplate) -> TemplateTools {
        TemplateTools { shown: shows_tools(template), short_ids: wants_short_ids(template) }
    }
}

/// Whether the template writes the tools it is given (a probe function's
/// name appears in its output).
fn shows_tools(template: &ChatTemplate) -> bool {
    const PROBE: &str = "ferrite_probe_function_7f3a";
    let tools = [json!({"type": "function", "function": {"name": PROBE, "description": "",
        "parameters": {"type": "object", "properties": {}}}})];
    let messages = [Message::new("user", "ping")];
    let extras = Extras { tools: Some(&tools), vars: None };
    template.render_with(&messages, extras, true).is_ok_and(|text| text.contains(PROBE))
}

/// An assistant message's calls written into its text as `<tool_call>`
/// blocks, for templates that ignore `tool_calls`.
fn written_calls(m: &Message) -> Message {
    let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) else { return m.clone() };
    let mut text = m.content.clone();
    for c in calls {
        let f = &c["function"];
        let block = json!({"name": f["name"], "arguments": f["arguments"]});
        push_text(&mut text, &format!("{OPEN}{block}{CLOSE}"));
    }
    Message { content: text, tool_calls: None, ..m.clone() }
}

/// One streamed choice's text, read for calls as it comes: text goes out as
/// content as soon as it cannot be the start of a call; from a call's start
/// on, the rest is held until the end. A reply constrained to calls is
/// held whole.
#[derive(Default)]
pub struct Held {
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// A call block has begun: nothing more goes out as content.
    in_call: bool,
}

impl Held {
    /// Takes the next piece; returns what may go out now as content.
    pub fn push(&mut self, tools: &ToolUse, piece: &str) -> String {
        self.text.push_str(piece);
        if tools.constrained() || self.in_call {
            return String::new();
        }
        // A reply that may be wholly a call in JSON: nothing goes until it ends.
        let start = self.text.trim_start();
        let may_be_json =
            start.starts_with(['{', '[']) || MARKERS.iter().any(|m| start.starts_with(m) || m.starts_with(start));
        if self.sent == 0 && may_be_json {
            return String::new();
        }
        let unsent = &self.text[self.sent..];
        let end = match unsent.find(OPEN) {
            Some(at) => {
                self.in_call = true;
                at
            }
            // (ASCII: any cut before a prefix of it is a character boundary.)
            None => unsent.len() - (1..OPEN.len()).rev().find(|&n| unsent.ends_with(&OPEN[..n])).unwrap_or(0),
        };
        // Whitespace before a call is no content: it waits for what follows.
        let end = unsent[..end].trim_end().len();
        let out = unsent[..end].to_string();
        self.sent += end;
        out
    }

    /// At the end: the content still to send and the calls.
    pub fn finish(&mut self, tools: &ToolUse) -> Reply {
        if tools.constrained() {
            return tools.read(&self.text);
        }
        let rest = &self.text[self.sent..];
        let mut reply = tools.read_auto(rest);
        if reply.calls.is_empty() {
            return Reply { content: Some(rest.to_string()).filter(|r| !r.is_empty()), calls: Vec::new() };
        }
        // Text after the calls goes on a line of its own, as `read` puts it.
        let sent = !self.text[..self.sent].trim().is_empty();
        reply.content = reply.content.map(|c| if sent { format!("\n{c}") } else { c });
        reply
    }
}

/// Tool results as user messages of `<tool_response>` blocks (the
/// results of one turn's calls in one message), for templates that know
/// no tool role.
fn results_as_user(messages: Vec<Message>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    let mut after_result = false;
    for m in messages {
        let result = m.role == "tool";
        if result {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                Some(last) if after_result => last.content = format!("{}\n{block}", last.content),
                _ => out.push(Message::new("user", block)),
            }
        } else {
            out.push(m);
        }
        after_result = result;
    }
    out
}

/// Whether a template checks for Mistral's call ids of 9 letters and digits.
fn wants_short_ids(template: &ChatTemplate) -> bool {
    let s = template.source();
    s.contains("length == 9") || s.contains("length != 9")
}

/// A call's id: as OpenAI's look, or (`short`) 9 letters and digits, as
/// Mistral's templates require.
pub fn call_id(short: bool) -> String {
    if !short {
        return crate::convert::random_id("call_");
    }
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut x = crate::convert::random_u64();
    (0..9)
        .map(|_| {
            let c = DIGITS[(x % 62) as usize] as char;
            x /= 62;
            c
        })
        .collect()
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
