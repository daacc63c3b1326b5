//! A chat reply read into its parts: the model's reasoning (`reasoning`),
//! its function calls (`tools`) and its content, whole or as it streams.
//! Reasoning comes first: calls are read in the answer after it.

use std::sync::Arc;

use crate::reasoning::{self, Thinking};
use crate::tools::{Call, Held, ToolUse};

/// How a request's replies are read.
pub struct Rules {
    pub tools: Option<Arc<ToolUse>>,
    /// Think blocks read apart; `Some(true)`: the prompt opened one.
    pub think: Option<bool>,
    /// The reasoning goes out (vLLM's `include_reasoning`); else it is dropped.
    pub keep_reasoning: bool,
}

/// A reply's parts. Content is `None` when the reply is calls alone, or
/// reasoning alone (cut short).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parts {
    pub reasoning: Option<String>,
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

impl Rules {
    /// A finished reply's parts.
    pub fn read(&self, text: &str) -> Parts {
        let (reasoning, answer) = match self.think {
            Some(open) => {
                let s = reasoning::split(text, open);
                (s.reasoning, s.content)
            }
            None => (None, text.to_string()),
        };
        let (content, calls) = match &self.tools {
            Some(t) => {
                let r = t.read(&answer);
                (r.content, r.calls)
            }
            None => (Some(answer), Vec::new()),
        };
        let content = content.filter(|c| reasoning.is_none() || !c.is_empty());
        // (An empty block is no reasoning: streams send none.)
        let reasoning = reasoning.filter(|r| self.keep_reasoning && !r.is_empty());
        Parts { reasoning, content, calls }
    }
}

/// One streamed reply, read as it comes: what may go out now, then at the
/// end what was held and the calls; they add up to `Rules::read` of the whole.
pub struct Streamed {
    think: Option<Thinking>,
    held: Held,
}

impl Streamed {
    pub fn new(rules: &Rules) -> Streamed {
        Streamed { think: rules.think.map(Thinking::new), held: Held::default() }
    }

    /// The reasoning and the content that may go out now.
    pub fn push(&mut self, rules: &Rules, text: &str) -> (String, String) {
        let (reasoning, content) = match &mut self.think {
            Some(t) => t.push(text),
            None => (String::new(), text.to_string()),
        };
        let reasoning = if rules.keep_reasoning { reasoning } else { String::new() };
        match &rules.tools {
            Some(t) => (reasoning, self.held.push(t, &content)),
            None => (reasoning, content),
        }
    }

    /// What is left at the end (empty parts as `None`).
    pub fn finish(&mut self, rules: &Rules) -> Parts {
        let (reasoning, mut content) = match &mut self.think {
            Some(t) => t.finish(),
            None => (String::new(), String::new()),
        };
        let mut calls = Vec::new();
        if let Some(t) = &rules.tools {
            content = self.held.push(t, &content);
            let rest = self.held.finish(t);
            content += rest.content.as_deref().unwrap_or_default();
            calls = rest.calls;
        }
        let some = |s: String| Some(s).filter(|s| !s.is_empty());
        let reasoning = some(reasoning).filter(|_| rules.keep_reasoning);
        Parts { reasoning, content: some(content), calls }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rules(think: Option<bool>, tools: bool) -> Rules {
        let list = json!([{"type": "function", "function": {"name": "now"}}]);
        let tools = tools.then(|| Arc::new(crate::tools::from_request(Some(&list), None, None).unwrap().unwrap()));
        Rules { tools, think, keep_reasoning: true }
    }

    /// Streams `pieces` and checks the sum against `read` of the whole.
    fn stream(r: &Rules, pieces: &[&str]) -> Parts {
        let mut s = Streamed::new(r);
        let (mut reasoning, mut content) = (String::new(), String::new());
        for p in pieces {
            let (a, b) = s.push(r, p);
            reasoning += &a;
            content += &b;
        }
        let end = s.finish(r);
        reasoning += end.reasoning.as_deref().unwrap_or_default();
        content += end.content.as_deref().unwrap_or_default();
        let whole = r.read(&pieces.concat());
        assert_eq!(whole.reasoning.as_deref().unwrap_or_default(), reasoning, "{pieces:?}");
        assert_eq!(whole.content.as_deref().unwrap_or_default(), content, "{pieces:?}");
        assert_eq!(whole.calls, end.calls, "{pieces:?}");
        whole
    }

    #[test]
    fn reasoning_then_a_call() {
        let r = rules(Some(false), true);
        let pieces = ["<think>I should", " call now.</think>\n\n", "<tool_call>{\"name\": ", "\"now\"}</tool_call>"];
        let parts = stream(&r, &pieces);
        assert_eq!(parts.reasoning.as_deref(), Some("I should call now."));
        assert_eq!((parts.content, parts.calls.len()), (None, 1));
        // Reasoning, then text: no calls.
        let parts = stream(&r, &["<think>x</think>", "It is noon."]);
        assert_eq!((parts.reasoning.as_deref(), parts.content.as_deref()), (Some("x"), Some("It is noon.")));
    }

    #[test]
    fn each_part_alone() {
        let parts = stream(&rules(None, false), &["<think>x</think>y"]);
        assert_eq!((parts.reasoning, parts.content.as_deref()), (None, Some("<think>x</think>y")));
        let parts = stream(&rules(Some(true), false), &["cut sho", "rt"]);
        assert_eq!((parts.reasoning.as_deref(), parts.content), (Some("cut short"), None));
        let parts = stream(&rules(None, true), &["Hi ", "<tool_call>{\"name\": \"now\"}</tool_call>"]);
        assert_eq!((parts.content.as_deref(), parts.calls.len()), (Some("Hi"), 1));
    }
}
