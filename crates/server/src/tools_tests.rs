use std::sync::Arc;

use ferrite_engine::constraint::format::Constraint;
use ferrite_engine::constraint::json::JsonVocab;

use super::*;

fn weather_and_add() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "now"}}
    ])
}

fn tool_use(choice: Value, parallel: Option<bool>) -> ToolUse {
    from_request(Some(&weather_and_add()), Some(&choice), parallel).unwrap().unwrap()
}

fn call(name: &str, arguments: &str) -> Call {
    Call { name: name.into(), arguments: arguments.into() }
}

fn calls(reply: &Reply) -> Vec<(&str, Value)> {
    reply.calls.iter().map(|c| (c.name.as_str(), serde_json::from_str(&c.arguments).unwrap())).collect()
}

/// Whether the constraint takes `text` whole, fed a byte a token.
fn accepts(format: &OutputFormat, text: &str) -> bool {
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    bytes.push(Vec::new());
    let mut c = Constraint::new(Arc::new(JsonVocab::new(bytes, &[256])), format);
    text.bytes().all(|b| c.advance(b as u32)) && c.is_complete()
}

#[test]
fn requests_are_checked() {
    let err = |tools: Value, choice: Value| {
        let e = from_request(Some(&tools), Some(&choice), None).unwrap_err();
        serde_json::to_value(e.body()).unwrap()["error"]["message"].as_str().unwrap().to_string()
    };
    let f = |name: &str| json!({"type": "function", "function": {"name": name}});
    assert!(err(json!({"a": 1}), Value::Null).contains("must be a list"));
    assert!(err(json!([{"type": "code_interpreter"}]), Value::Null).contains("tools[0].type"));
    assert!(err(json!([{"type": "function"}]), Value::Null).contains("tools[0].function"));
    assert!(err(json!([f("a b")]), Value::Null).contains("letters, digits"));
    assert!(err(json!([f(&"x".repeat(65))]), Value::Null).contains("1 to 64"));
    assert!(err(json!([f("a"), f("a")]), Value::Null).contains("two tools"));
    for p in [json!("x"), json!({"type": "string"})] {
        let bad = json!([{"type": "function", "function": {"name": "f", "parameters": p}}]);
        assert!(err(bad, Value::Null).contains("parameters must be the JSON Schema of an object"));
    }
    assert!(err(json!([f("a")]), json!("sometimes")).contains("tool_choice must be"));
    assert!(err(json!([f("a")]), json!({"type": "function", "function": {"name": "b"}})).contains("no tool"));
    assert!(err(json!([]), json!("required")).contains("non-empty tools"));
    // No tools, or "none": nothing to do.
    for (tools, choice) in [(json!([]), json!("auto")), (json!([f("a")]), json!("none")), (json!(null), json!(null))] {
        assert!(from_request(Some(&tools), Some(&choice), None).unwrap().is_none(), "{tools} {choice}");
    }
    assert_eq!(tool_use(Value::Null, None).choice, Choice::Auto);
    assert_eq!(tool_use(json!("required"), None).choice, Choice::Required);
    assert_eq!(tool_use(json!({"type": "function", "function": {"name": "add"}}), None).choice, Choice::Named(1));
}

#[test]
fn auto_replies_are_read_in_the_shapes_models_write() {
    let t = tool_use(json!("auto"), None);
    // Hermes / Qwen blocks, with text around them; the last block may be unclosed.
    let r = t.read("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}");
    assert_eq!(r.content.as_deref(), Some("Let me check."));
    assert_eq!(calls(&r), [("get_weather", json!({"city": "Paris"})), ("add", json!({"a": 2, "b": 3}))]);
    // Llama 3: the whole reply one object with "parameters", maybe after <|python_tag|>.
    for text in [
        "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
        "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
    ] {
        let r = t.read(text);
        assert_eq!((r.content.as_deref(), calls(&r)), (None, vec![("add", json!({"a": 1, "b": 2}))]), "{text}");
    }
    // Several separated by semicolons (Llama 3.2); Mistral's list after [TOOL_CALLS].
    let r =
        t.read("{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}");
    assert_eq!(calls(&r), [("now", json!({})), ("add", json!({"a": 1, "b": 2}))]);
    let r = t.read(" [TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}]");
    assert_eq!(calls(&r), [("now", json!({})), ("get_weather", json!({"city": "Oslo"}))]);
    // A call without arguments gets an empty object; a trailing semicolon is no call.
    assert_eq!(t.read("{\"name\": \"now\"}").calls, [call("now", "{}")]);
    assert_eq!(t.read("{\"name\": \"now\"};").calls, [call("now", "{}")]);
    // Without parallel calls, the first only.
    let two = "<tool_call>{\"name\": \"now\"}</tool_call><tool_call>{\"name\": \"now\"}</tool_call>";
    assert_eq!(t.read(two).calls.len(), 2);
    assert_eq!(tool_use(json!("auto"), Some(false)).read(two).calls.len(), 1);
    // Anything else is content, as written: plain text, JSON that is no call,
    // an undeclared function, a broken block.
    for text in [
        "The weather is fine.",
        "{\"answer\": 42}",
        "[1, 2]",
        "{\"name\": \"delete_all\", \"arguments\": {}}",
        "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1</tool_call>",
        "{\"name\": \"add\", \"arguments\": 5}",
    ] {
        assert_eq!(t.read(text), Reply { content: Some(text.into()), calls: Vec::new() }, "{text}");
    }
}

#[test]
fn required_and_named_replies_are_constrained_and_read() {
    let t = tool_use(json!("required"), None);
    let f = t.format().unwrap().unwrap();
    let two = r#"[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, {"name": "add", "arguments": {"a": 1, "b": -2}}]"#;
    assert!(accepts(&f, two));
    assert_eq!(
        calls(&t.read(two)),
        [("get_weather", json!({"city": "Paris", "unit": "c"})), ("add", json!({"a": 1, "b": -2}))]
    );
    for bad in [
        "[]",
        r#"[{"name": "delete_all", "arguments": {}}]"#,
        r#"[{"name": "add", "arguments": {"a": 1}}]"#,
        r#"[{"name": "add", "arguments": {"a": 1, "b": 2.5}}]"#,
        r#"[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "k"}}]"#,
        r#"{"name": "now", "arguments": {}}"#,
    ] {
        assert!(!accepts(&f, bad), "{bad}");
    }
    assert!(accepts(&f, r#"[{"name": "now", "arguments": {}}]"#));
    assert!(!accepts(&f, r#"[{"name": "now", "arguments": 5}]"#));
    // One call only without parallel calls.
    let single = tool_use(json!("required"), Some(false)).format().unwrap().unwrap();
    assert!(!accepts(&single, two) && accepts(&single, r#"[{"name": "now", "arguments": {}}]"#));
    // A named function: its arguments alone.
    let t = tool_use(json!({"type": "function", "function": {"name": "add"}}), None);
    let f = t.format().unwrap().unwrap();
    assert!(accepts(&f, r#"{"a": 1, "b": 2}"#) && !accepts(&f, r#"{"a": 1}"#));
    assert_eq!(t.read(r#"{"a": 1, "b": 2}"#).calls, [call("add", r#"{"a":1,"b":2}"#)]);
    // A reply cut short (max_tokens) stays content.
    assert_eq!(t.read(r#"{"a": 1,"#).content.as_deref(), Some(r#"{"a": 1,"#));
    assert!(tool_use(json!("auto"), None).format().unwrap().is_none());
    // Schemas with references (pydantic's `$defs`, a recursive `#`) keep them.
    let tools = json!([
        {"type": "function", "function": {"name": "put", "parameters": {"type": "object",
            "properties": {"item": {"$ref": "#/$defs/Item"}}, "required": ["item"], "additionalProperties": false,
            "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                "additionalProperties": false}}}}},
        {"type": "function", "function": {"name": "tree", "parameters": {"type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["kids"],
            "additionalProperties": false}}}
    ]);
    let t = from_request(Some(&tools), Some(&json!("required")), None).unwrap().unwrap();
    let f = t.format().unwrap().unwrap();
    assert!(accepts(&f, r#"[{"name": "put", "arguments": {"item": {"n": 3}}}]"#));
    assert!(accepts(&f, r#"[{"name": "tree", "arguments": {"kids": [{"kids": []}, {"kids": [{"kids": []}]}]}}]"#));
    assert!(!accepts(&f, r#"[{"name": "put", "arguments": {"item": {"n": "x"}}}]"#));
    assert!(!accepts(&f, r#"[{"name": "tree", "arguments": {"kids": [{"kids": [1]}]}}]"#));
    // Parameters the constraint cannot take are a 400 naming the tool.
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"s": {"type": "string", "pattern": "(?=a)"}}}}}]);
    let t = from_request(Some(&tools), Some(&json!("required")), None).unwrap().unwrap();
    let e = serde_json::to_value(t.format().unwrap_err().body()).unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("tools[0].function.parameters"), "{e}");
}

/// The content a stream sends as the pieces come, then what `finish` gives;
/// checked to add up to what `read` makes of the whole text.
fn stream(t: &ToolUse, pieces: &[&str]) -> (String, Reply) {
    let mut held = Held::default();
    let sent: String = pieces.iter().map(|p| held.push(t, p)).collect();
    let end = held.finish(t);
    let whole = t.read(&pieces.concat());
    let streamed = sent.clone() + end.content.as_deref().unwrap_or_default();
    assert_eq!(Some(streamed).filter(|s| !s.is_empty()), whole.content, "{pieces:?}");
    assert_eq!(end.calls, whole.calls, "{pieces:?}");
    (sent, end)
}

#[test]
fn streams_send_content_until_a_call_begins() {
    let t = tool_use(json!("auto"), None);
    // Plain text goes out as it comes, but for a possible "<tool_call>" start.
    let (sent, end) = stream(&t, &["Hello", " <to", "ol> is", " a tag"]);
    assert_eq!((sent.as_str(), end.content, end.calls.len()), ("Hello <tool> is a tag", None, 0));
    let (sent, end) = stream(&t, &["It is", " <tool_c"]);
    assert_eq!((sent.as_str(), end.content.as_deref()), ("It is", Some(" <tool_c")));
    // Text before a block goes (but the whitespace before it); the block
    // comes at the end, with the text after it on a line of its own.
    let pieces = ["Checking", ".\n<tool_", "call>{\"name\": \"now\", ", "\"arguments\": {}}</tool_call>", " Done."];
    let (sent, end) = stream(&t, &pieces);
    assert_eq!((sent.as_str(), end.content.as_deref()), ("Checking.", Some("\nDone.")));
    assert_eq!(end.calls, [call("now", "{}")]);
    let (sent, end) = stream(&t, &["Köln é<to", "ol_call>{\"name\": \"now\"}</tool_call>"]);
    assert_eq!((sent.as_str(), end.content, end.calls.len()), ("Köln é", None, 1));
    let (sent, end) = stream(&t, &["  Hi", " \n", "there"]);
    assert_eq!((sent.as_str(), end.content), ("  Hi \nthere", None));
    // A block cut short: the whole reply is content.
    let (sent, end) = stream(&t, &["Hm.", " <tool_call>{\"name\": \"now\""]);
    assert_eq!((sent.as_str(), end.content.as_deref()), ("Hm.", Some(" <tool_call>{\"name\": \"now\"")));
    // A reply that may be one call in JSON is held whole; if it is none, it is content.
    let (sent, end) = stream(&t, &["  {\"name\"", ": \"now\"}"]);
    assert_eq!((sent.as_str(), end.content, end.calls), ("", None, vec![call("now", "{}")]));
    let (sent, end) = stream(&t, &["[1, ", "2]"]);
    assert_eq!((sent.as_str(), end.content.as_deref(), end.calls.len()), ("", Some("[1, 2]"), 0));
    let (sent, end) = stream(&t, &["<|python", "_tag|>{\"name\": \"now\"}"]);
    assert_eq!((sent.as_str(), end.calls.len()), ("", 1));
    // Constrained replies are held whole.
    let t = tool_use(json!("required"), None);
    let (sent, end) = stream(&t, &["[{\"name\": \"now\", ", "\"arguments\": {}}]"]);
    assert_eq!((sent.as_str(), end.calls), ("", vec![call("now", "{}")]));
}

#[test]
fn mistral_templates_get_ids_of_nine_letters_and_digits() {
    let mistral = "{% for m in messages %}{% for c in m.tool_calls %}{% if c.id|length != 9 %}\
                   {{ raise_exception('ids of 9') }}{% endif %}{% endfor %}{% endfor %}";
    assert!(TemplateTools::of(&ChatTemplate::new(mistral, "", "").unwrap()).short_ids);
    assert!(!TemplateTools::of(&ChatTemplate::new("{{ messages }}", "", "").unwrap()).short_ids);
    let id = call_id(true);
    assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
    assert!(call_id(false).starts_with("call_"));
}

#[test]
fn templates_that_show_no_tools_get_them_in_a_system_message() {
    let chatml = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}";
    let with_tools = "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}";
    let t = tool_use(json!("auto"), None);
    let call_args =
        json!([{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]);
    let messages = vec![
        Message::new("user", "1+2?"),
        Message { tool_calls: Some(call_args.as_array().unwrap().clone()), ..Message::new("assistant", "") },
        Message { tool_call_id: Some("c1".into()), ..Message::new("tool", "3") },
    ];
    // Shown: as given.
    let shown = ChatTemplate::new(with_tools, "", "").unwrap();
    assert_eq!(t.prepare(&shown, TemplateTools::of(&shown).shown, &messages), messages);
    // Not shown: a system message with the functions and the syntax; the
    // earlier call written into its message's text.
    let plain = ChatTemplate::new(chatml, "", "").unwrap();
    let out = t.prepare(&plain, TemplateTools::of(&plain).shown, &messages);
    assert_eq!(out.len(), 4);
    assert_eq!(out[0].role, "system");
    for needle in ["get_weather", "\"description\":\"Weather in a city.\"", "\"name\":\"now\"", "<tool_call>{\"name\""]
    {
        assert!(out[0].content.contains(needle), "{needle}: {}", out[0].content);
    }
    assert_eq!(out[2].content, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>");
    assert!(out[2].tool_calls.is_none());
    // Results as a user's `<tool_response>` blocks, one turn's in one message.
    assert_eq!(out[3], Message::new("user", "<tool_response>\n3\n</tool_response>"));
    let mut more = messages.clone();
    more.push(Message::new("tool", "4"));
    more.push(Message::new("user", "ok"));
    let out = t.prepare(&plain, false, &more);
    assert_eq!(out.len(), 5);
    assert_eq!(out[3].content, "<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response>");
    assert_eq!(out[4], Message::new("user", "ok"));
    // A system message of the request's own gets the note after its text.
    let out = t.prepare(&plain, false, &[Message::new("system", "Be brief."), Message::new("user", "hi")]);
    assert_eq!(out.len(), 2);
    assert!(out[0].content.starts_with("Be brief.\n\nYou can call these functions"), "{}", out[0].content);
    // A template that refuses system messages: the note leads the first user message.
    let no_system = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}\
                     [{{ m.role }}] {{ m.content }}{% endfor %}";
    let out = t.prepare(&ChatTemplate::new(no_system, "", "").unwrap(), false, &[Message::new("user", "hi")]);
    assert_eq!(out.len(), 1);
    assert!(out[0].content.starts_with("You can call these functions") && out[0].content.ends_with("\n\nhi"));
}
