//! Chat templates rendered by ferrite must equal Python jinja2's output, set up
//! as transformers sets it up. Fixtures come from scripts/golden_chat_template.py.

use std::path::PathBuf;

use ferrite_core::Error;
use ferrite_loader::chat_template::{ChatTemplate, Extras, Message};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    name: String,
    template: String,
    bos_token: String,
    eos_token: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<Message>,
    /// The functions offered, where the case offers any.
    #[serde(default)]
    tools: Option<Vec<serde_json::Value>>,
    /// More variables (`apply_chat_template`'s keyword arguments), where given.
    #[serde(default)]
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    add_generation_prompt: bool,
    expected: Option<String>,
    expected_error: Option<String>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat_template")
}

#[test]
fn chat_templates_match_python_jinja2() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .expect("fixture dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 5, "expected the golden fixtures, found {paths:?}");

    let mut failures = Vec::new();
    let mut checked = 0;
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        let fx: Fixture = serde_json::from_str(&text).unwrap();
        let template = ChatTemplate::new(&fx.template, &fx.bos_token, &fx.eos_token)
            .unwrap_or_else(|e| panic!("{}: does not compile: {e}", fx.name));
        for case in &fx.cases {
            checked += 1;
            let extras = Extras { tools: case.tools.as_deref(), vars: case.kwargs.as_ref() };
            let got = template.render_with(&case.messages, extras, case.add_generation_prompt);
            let id = format!("{} / {}", fx.name, case.name);
            match (&case.expected, &case.expected_error, got) {
                (Some(want), _, Ok(got)) if *want == got => {}
                (_, Some(want), Err(Error::Template(msg))) if *want == msg => {}
                (Some(want), _, Ok(got)) => failures.push(format!("{id}: {}", first_difference(want, &got))),
                (want, want_err, got) => {
                    failures.push(format!("{id}:\n  want: {want:?} {want_err:?}\n  got:  {got:?}"))
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {checked} cases differ:\n{}", failures.len(), failures.join("\n"));
}

/// Where two renderings part, with a little context, so a failure stays readable.
fn first_difference(want: &str, got: &str) -> String {
    let at = want
        .char_indices()
        .zip(got.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(want.len().min(got.len()));
    let from = want[..at].char_indices().rev().nth(40).map_or(0, |(i, _)| i);
    let tail = |s: &str| s.get(from..).unwrap_or("").chars().take(120).collect::<String>();
    format!("differs at byte {at}:\n  want: {:?}\n  got:  {:?}", tail(want), tail(got))
}
