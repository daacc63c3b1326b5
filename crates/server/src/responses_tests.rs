use super::*;
use crate::tools::Call;

fn message(err: ApiError) -> String {
    let body = err.body();
    format!("{} {}", body["error"]["param"], body["error"]["message"])
}

#[test]
fn requests_become_chat_requests() {
    let chat = to_chat(&json!({"model": "m", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 9,
        "temperature": 0.5, "stream": true, "store": true, "metadata": {"k": "v"}, "reasoning": {"effort": "low"}}))
    .unwrap();
    assert_eq!(
        chat,
        json!({"model": "m", "temperature": 0.5, "stream": true, "max_completion_tokens": 9,
            "chat_template_kwargs": {"reasoning_effort": "low"}, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]})
    );
    // Items: messages with text parts, calls onto the assistant message before them, outputs as tool messages.
    let input = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"}
    ]);
    let chat = to_chat(&json!({"input": input})).unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
        ])
    );
    // Flat function tools, a named choice, text formats.
    let chat = to_chat(&json!({"input": "x", "tools": [{"type": "function", "name": "f", "description": "d",
        "parameters": {"type": "object"}, "strict": true}], "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}}}))
    .unwrap();
    assert_eq!(
        chat["tools"],
        json!([{"type": "function", "function": {"name": "f", "description": "d",
        "parameters": {"type": "object"}}}])
    );
    assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "f"}}));
    assert_eq!(
        chat["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "out",
        "schema": {"type": "object"}}})
    );
    let chat = to_chat(&json!({"input": "x", "text": {"format": {"type": "text"}}})).unwrap();
    assert!(chat.get("response_format").is_none());
    // Chat extensions pass; reasoning effort becomes a template variable.
    let chat = to_chat(&json!({"input": "x", "stop": ["\n"], "min_tokens": 2, "reasoning": {"effort": "high"},
        "chat_template_kwargs": {"enable_thinking": true}}))
    .unwrap();
    assert_eq!((chat["stop"].clone(), chat["min_tokens"].clone()), (json!(["\n"]), json!(2)));
    assert_eq!(chat["chat_template_kwargs"], json!({"enable_thinking": true, "reasoning_effort": "high"}));
    // A reasoning item's text goes with the assistant turn after it.
    let input = json!([
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "so"}]},
        {"role": "assistant", "content": "One."}
    ]);
    let m = to_chat(&json!({"input": input})).unwrap()["messages"].clone();
    assert_eq!((m[1]["reasoning_content"].clone(), m[1]["tool_calls"][0]["id"].clone()), (json!("hmm"), json!("c1")));
    assert_eq!((m[3]["reasoning_content"].clone(), m[3]["content"].clone()), (json!("so"), json!("One.")));
}

#[test]
fn what_is_not_supported_is_a_400() {
    for (body, needle) in [
        (json!({"input": "x", "previous_response_id": "resp_1"}), "not stored"),
        (json!({"input": "x", "background": true}), "background"),
        (json!({"input": 5}), "input must be"),
        (json!({}), "input must be"),
        (json!({"input": [{"type": "input_image", "image_url": "u"}]}), "input[0]"),
        (json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}), "text parts"),
        (json!({"input": [{"type": "function_call", "name": "f"}]}), "call_id"),
        (json!({"input": "x", "tools": [{"type": "web_search"}]}), "only function tools"),
        (json!({"input": "x", "text": {"format": {"type": "xml"}}}), "text.format"),
        (json!({"input": "x", "instructions": 3}), "instructions"),
        (json!({"input": [{"role": "tool", "content": "x"}]}), "input[0].role"),
        (json!({"input": "x", "truncation": "middle"}), "truncation"),
        (json!({"input": "x", "include": "message.output_text.logprobs"}), "include must be a list"),
        (json!({"input": "x", "tool_choice": {"type": "function"}}), "needs a name"),
        (json!([1]), "JSON object"),
    ] {
        let m = message(to_chat(&body).unwrap_err());
        assert!(m.contains(needle), "{body}: {m}");
    }
}

#[test]
fn replies_become_output_items() {
    let parts = Parts {
        reasoning: Some("think".into()),
        content: Some("Paris.".into()),
        calls: vec![Call { name: "f".into(), arguments: "{}".into() }],
    };
    let lp = json!([{"token": "Paris", "logprob": -0.5, "bytes": [80], "top_logprobs": []}]);
    let items = items(parts, true, false, lp.clone());
    let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"]);
    assert_eq!(items[0]["content"], json!([{"type": "reasoning_text", "text": "think"}]));
    assert_eq!(items[1]["content"][0]["text"], "Paris.");
    assert_eq!(items[1]["content"][0]["logprobs"], lp);
    assert_eq!((items[1]["role"].clone(), items[1]["status"].clone()), (json!("assistant"), json!("completed")));
    assert!(
        items[2]["id"].as_str().unwrap().starts_with("fc_")
            && items[2]["call_id"].as_str().unwrap().starts_with("call_")
    );
    let cut = items_of_cut();
    assert_eq!(cut[0]["status"], "incomplete");
    // The response echoes the request's settings.
    let r = response(
        "resp_1",
        7,
        "m",
        &json!({"temperature": 0.2, "metadata": {"a": "b"}}),
        "incomplete",
        cut,
        usage(5, 1, 3),
    );
    assert_eq!((r["temperature"].clone(), r["metadata"]["a"].clone()), (json!(0.2), json!("b")));
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(
        (r["usage"]["total_tokens"].clone(), r["usage"]["input_tokens_details"]["cached_tokens"].clone()),
        (json!(8), json!(1))
    );
}

fn items_of_cut() -> Vec<Value> {
    items(Parts { reasoning: None, content: Some("Par".into()), calls: Vec::new() }, false, false, json!([]))
}

#[test]
fn logprobs_are_asked_for_by_include_or_top_logprobs() {
    let include = json!(["reasoning.encrypted_content", "message.output_text.logprobs"]);
    let chat = to_chat(&json!({"input": "x", "include": include})).unwrap();
    assert_eq!((chat["logprobs"].clone(), chat["top_logprobs"].clone()), (json!(true), json!(0)));
    let chat = to_chat(&json!({"input": "x", "include": include, "top_logprobs": 3})).unwrap();
    assert_eq!((chat["logprobs"].clone(), chat["top_logprobs"].clone()), (json!(true), json!(3)));
    let chat = to_chat(&json!({"input": "x", "top_logprobs": 2})).unwrap();
    assert_eq!((chat["logprobs"].clone(), chat["top_logprobs"].clone()), (json!(true), json!(2)));
    for body in [json!({"input": "x", "top_logprobs": 0}), json!({"input": "x", "include": ["x"]})] {
        assert!(to_chat(&body).unwrap().get("logprobs").is_none(), "{body}");
    }
    // The response says what was asked.
    let r =
        response("r", 1, "m", &json!({"top_logprobs": 3, "truncation": "auto"}), "completed", vec![], usage(1, 0, 1));
    assert_eq!((r["top_logprobs"].clone(), r["truncation"].clone()), (json!(3), json!("auto")));
}

#[test]
fn truncation_drops_the_oldest_turns_first() {
    let input = json!([
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "one"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c1", "output": "again"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"}
    ]);
    let mut chat = to_chat(&json!({"input": input, "instructions": "Be brief.", "truncation": "auto"})).unwrap();
    let contents = |chat: &Value| -> Vec<String> {
        chat["messages"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap_or("-").to_string()).collect()
    };
    assert_eq!(contents(&chat), ["Be brief.", "Rules.", "one", "-", "1", "again", "two", "three"]);
    // A whole turn goes: the user's message, the call, its results and the answer.
    assert!(drop_oldest(&mut chat));
    assert_eq!(contents(&chat), ["Be brief.", "Rules.", "three"]);
    // The last turn stays, its calls with their results.
    assert!(!drop_oldest(&mut chat));
    assert_eq!(contents(&chat), ["Be brief.", "Rules.", "three"]);
    let input = json!([
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"}
    ]);
    let mut chat = to_chat(&json!({"input": input})).unwrap();
    assert!(drop_oldest(&mut chat));
    assert_eq!(contents(&chat), ["q", "-", "1"]);
    assert!(!drop_oldest(&mut chat));
}
