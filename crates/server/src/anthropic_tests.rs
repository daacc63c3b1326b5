use super::*;
use crate::tools::Call;
use ferrite_engine::FinishReason::{Length, Stop};

fn message(err: ApiError) -> String {
    let body = err.body();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    format!("{} {}", text(&body["error"]["param"]), text(&body["error"]["message"]))
}

#[test]
fn requests_become_chat_requests() {
    let chat = to_chat(&json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "hi"}], "stop_sequences": ["\n"], "temperature": 0.5,
        "thinking": {"type": "enabled", "budget_tokens": 100}, "metadata": {"user_id": "u"}}))
    .unwrap();
    assert_eq!(
        chat,
        json!({"temperature": 0.5, "max_completion_tokens": 9, "stop": ["\n"],
            "chat_template_kwargs": {"enable_thinking": true},
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]})
    );
    // A tool loop: the assistant's thinking, text and tool uses; the user's results, then text.
    let messages = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Need the tool.", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "18C"}]},
            {"type": "tool_result", "tool_use_id": "t2", "content": "down", "is_error": true},
            {"type": "text", "text": "Thanks."}]}
    ]);
    let chat = to_chat(&json!({"max_tokens": 5, "messages": messages, "tools": [{"name": "weather",
        "description": "d", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "weather",
        "disable_parallel_tool_use": true}}))
    .unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "Need the tool.", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "18C"},
            {"role": "tool", "tool_call_id": "t2", "content": "Error: down"},
            {"role": "user", "content": "Thanks."}
        ])
    );
    assert_eq!(
        chat["tools"],
        json!([{"type": "function", "function": {"name": "weather", "description": "d",
        "parameters": {"type": "object"}}}])
    );
    assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "weather"}}));
    assert_eq!(chat["parallel_tool_calls"], json!(false));
    // The client tools the API defines get its schemas, by version.
    let tools = json!([{"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250124", "name": "str_replace_editor"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 1000}]);
    let chat = to_chat(&json!({"max_tokens": 5, "messages": [], "tools": tools})).unwrap();
    let f = |i: usize| chat["tools"][i]["function"].clone();
    assert_eq!(f(0)["name"], "bash");
    assert_eq!(f(0)["parameters"]["properties"]["command"]["type"], "string");
    assert_eq!(f(1)["name"], "str_replace_editor");
    assert_eq!(f(1)["parameters"]["properties"]["command"]["enum"][4], "undo_edit");
    assert_eq!(f(2)["parameters"]["properties"]["command"]["enum"].as_array().unwrap().len(), 4);
    assert_eq!(f(2)["parameters"]["required"], json!(["command", "path"]));
    assert!(f(2).get("max_characters").is_none());
    for (choice, want) in [("auto", json!("auto")), ("any", json!("required")), ("none", json!("none"))] {
        let chat = to_chat(&json!({"max_tokens": 5, "messages": [], "tool_choice": {"type": choice}})).unwrap();
        assert_eq!(chat["tool_choice"], want);
    }
    // Structured outputs and effort.
    let chat = to_chat(&json!({"max_tokens": 5, "messages": [], "output_config": {"effort": "low",
        "format": {"type": "json_schema", "schema": {"type": "object"}}}}))
    .unwrap();
    assert_eq!(chat["response_format"]["json_schema"]["schema"], json!({"type": "object"}));
    assert_eq!(chat["chat_template_kwargs"], json!({"enable_thinking": false, "reasoning_effort": "low"}));
    // A final assistant message is continued (a prefill); consecutive turns
    // of one role are one; a tool result's image is a placeholder, a text
    // document its text.
    let chat = to_chat(&json!({"max_tokens": 5, "messages": [
        {"role": "user", "content": "a"},
        {"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "text", "text": "see"}, {"type": "image", "source": {}}]}, {"type": "tool_result", "tool_use_id": "u"}]},
        {"role": "assistant", "content": "The answer is"}]}))
    .unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "user", "content": "a\ndoc"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "t", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t", "content": "see\n[an image, not shown]"},
            {"role": "tool", "tool_call_id": "u", "content": ""},
            {"role": "assistant", "content": "The answer is"}
        ])
    );
    assert_eq!(
        (chat["continue_final_message"].clone(), chat["add_generation_prompt"].clone()),
        (json!(true), json!(false))
    );
}

#[test]
fn what_is_not_supported_is_a_400() {
    let user = |content: Value| json!({"max_tokens": 5, "messages": [{"role": "user", "content": content}]});
    for (body, needle) in [
        (json!({"messages": []}), "max_tokens is required"),
        (json!({"max_tokens": 5}), "messages must be a list"),
        (user(json!([{"type": "image", "source": {}}])), "`image` are not supported"),
        (user(json!(5)), "content must be"),
        (json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}), "user or assistant"),
        (
            json!({"max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "s"}]}),
            "tools of type \"web_search_20250305\" are not supported",
        ),
        (json!({"max_tokens": 5, "messages": [], "tools": [{"type": "bash_2025", "name": "s"}]}), "not supported"),
        (json!({"max_tokens": 5, "messages": [], "tool_choice": {"type": "tool"}}), "needs a name"),
        (json!({"max_tokens": 5, "messages": [], "thinking": {"type": "sometimes"}}), "thinking.type"),
        (json!({"max_tokens": 5, "messages": [], "system": 3}), "system must be"),
        (user(json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])), "user blocks of type `tool_use`"),
        (user(json!([{"type": "text", "text": 5}])), "text must be a string"),
        (
            user(
                json!([{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}]),
            ),
            "only text documents",
        ),
    ] {
        let m = message(to_chat(&body).unwrap_err());
        assert!(m.contains(needle), "{body}: {m}");
    }
}

#[test]
fn replies_become_content_blocks() {
    let parts = Parts {
        reasoning: Some("hmm".into()),
        content: Some("Paris.".into()),
        calls: vec![Call { name: "f".into(), arguments: "{\"a\":1}".into() }],
    };
    let blocks = blocks(parts);
    assert_eq!(blocks[0], json!({"type": "thinking", "thinking": "hmm", "signature": ""}));
    assert_eq!(blocks[1], json!({"type": "text", "text": "Paris."}));
    assert_eq!((blocks[2]["type"].clone(), blocks[2]["input"].clone()), (json!("tool_use"), json!({"a": 1})));
    assert!(blocks[2]["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(
        [(Length, true, None), (Stop, true, None), (Stop, false, None), (Stop, false, Some("\n"))].map(|(f, c, s)| {
            let summary = Summary {
                finish: f,
                prompt_tokens: 1,
                completion_tokens: 1,
                cached_tokens: 0,
                error: None,
                stop: s.map(str::to_string),
            };
            stop_reason(&summary, c)
        }),
        [("max_tokens", None), ("tool_use", None), ("end_turn", None), ("stop_sequence", Some("\n".to_string()))]
    );
    // Input tokens are those not read from the cache.
    assert_eq!(
        usage(10, 4, 2),
        json!({"input_tokens": 6, "output_tokens": 2, "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0})
    );
}

#[test]
fn errors_in_anthropics_shape() {
    let (status, body) = error(&ApiError::invalid("this model's context holds 64 tokens"));
    assert_eq!(status.as_u16(), 400);
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("prompt is too long: "));
    assert_eq!(error(&ApiError::unauthorized()).1["error"]["type"], "authentication_error");
    assert_eq!(error(&ApiError::internal("x")).1["error"]["type"], "api_error");
}
