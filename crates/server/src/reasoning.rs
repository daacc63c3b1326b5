//! Reasoning apart from the answer. Models such as Qwen3 and DeepSeek-R1
//! think first, in a `<think> ... </think>` block; where the chat template
//! has such blocks, a reply's `reasoning_content` is the block's text and
//! its `content` what follows (as vLLM's reasoning parsers and llama.cpp's
//! server give them). A template may open the block itself (DeepSeek-R1's
//! generation prompt ends in `<think>`): the reply then starts inside it.
//! A reply that does not begin with a block is all content; one cut short
//! inside the block is all reasoning.

use ferrite_loader::chat_template::ChatTemplate;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a template's model thinks in `<think>` blocks.
pub fn thinks(template: &ChatTemplate) -> bool {
    template.source().contains(CLOSE)
}

/// Whether a rendered prompt leaves a think block open for the reply.
pub fn opened_by(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// Whether a message's text ends inside a think block (a final message
/// the reply goes on with).
pub fn left_open(text: &str) -> bool {
    text.rfind(OPEN) > text.rfind(CLOSE)
}

/// The prompt closed where it leaves a block open, for a constrained
/// reply (the constrained value is the answer), as Qwen3's templates close
/// it when thinking is off.
pub fn closed(mut prompt: String) -> String {
    if opened_by(&prompt) {
        prompt.push_str("\n</think>\n\n");
    }
    prompt
}

/// A reply's reasoning (trimmed) and answer (from its first non-space).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Split {
    pub reasoning: Option<String>,
    pub content: String,
}

/// A finished reply split; `open`: the prompt opened the block (the reply
/// may still begin with its own opening tag, which is dropped).
pub fn split(text: &str, open: bool) -> Split {
    let body = match text.trim_start().strip_prefix(OPEN) {
        Some(body) => Some(body),
        None => open.then_some(text),
    };
    let Some(body) = body else { return Split { reasoning: None, content: text.to_string() } };
    let (reasoning, content) = body.split_once(CLOSE).unwrap_or((body, ""));
    Split { reasoning: Some(reasoning.trim().to_string()), content: content.trim_start().to_string() }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    /// Not yet known whether the reply begins with an opening tag (`open`:
    /// the prompt opened the block).
    Start {
        open: bool,
    },
    Reasoning,
    /// Past the block, before the answer's first non-space.
    Between,
    Content,
}

/// One streamed reply split as it comes, into what `split` makes of the
/// whole: text that may still be a tag, or space at the reasoning's ends,
/// waits for what follows.
pub struct Thinking {
    part: Part,
    /// Text not yet sent.
    held: String,
    /// Whether any reasoning has gone out.
    reasoned: bool,
}

impl Thinking {
    pub fn new(open: bool) -> Thinking {
        Thinking { part: Part::Start { open }, held: String::new(), reasoned: false }
    }

    /// Takes the next piece; returns the reasoning and the content that may go out now.
    pub fn push(&mut self, piece: &str) -> (String, String) {
        self.held.push_str(piece);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.part {
                Part::Start { open } => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.part = Part::Reasoning;
                    } else if OPEN.starts_with(t) {
                        return (reasoning, content);
                    } else {
                        self.part = if open { Part::Reasoning } else { Part::Content };
                    }
                }
                Part::Reasoning => {
                    if !self.reasoned {
                        self.held = self.held.trim_start().to_string();
                    }
                    if let Some((before, after)) = self.held.split_once(CLOSE) {
                        reasoning += before.trim_end();
                        self.held = after.to_string();
                        self.part = Part::Between;
                        continue;
                    }
                    // (ASCII: any cut before a prefix of the tag is a character boundary.)
                    let partial = (1..CLOSE.len()).rev().find(|&n| self.held.ends_with(&CLOSE[..n])).unwrap_or(0);
                    let end = self.held[..self.held.len() - partial].trim_end().len();
                    reasoning += &self.held[..end];
                    self.reasoned |= end > 0;
                    self.held.drain(..end);
                    return (reasoning, content);
                }
                Part::Between => {
                    self.held = self.held.trim_start().to_string();
                    if self.held.is_empty() {
                        return (reasoning, content);
                    }
                    self.part = Part::Content;
                }
                Part::Content => {
                    content += &std::mem::take(&mut self.held);
                    return (reasoning, content);
                }
            }
        }
    }

    /// At the end: the reasoning and the content still held.
    pub fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        match self.part {
            Part::Start { open: true } => (held.trim().to_string(), String::new()),
            Part::Start { open: false } | Part::Content => (String::new(), held),
            Part::Reasoning if self.reasoned => (held.trim_end().to_string(), String::new()),
            Part::Reasoning => (held.trim().to_string(), String::new()),
            Part::Between => (String::new(), String::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `pieces`; checks the sum against `split` of the whole.
    fn stream(pieces: &[&str], open: bool) -> Split {
        let mut t = Thinking::new(open);
        let (mut reasoning, mut content) = (String::new(), String::new());
        for p in pieces {
            let (r, c) = t.push(p);
            reasoning += &r;
            content += &c;
        }
        let (r, c) = t.finish();
        reasoning += &r;
        content += &c;
        let whole = split(&pieces.concat(), open);
        let streamed = Split { reasoning: whole.reasoning.as_ref().map(|_| reasoning), content };
        assert_eq!(streamed, whole, "{pieces:?}");
        whole
    }

    fn split_of(reasoning: Option<&str>, content: &str) -> Split {
        Split { reasoning: reasoning.map(str::to_string), content: content.to_string() }
    }

    #[test]
    fn a_block_then_the_answer() {
        let pieces = ["<th", "ink>\nLet me", " think.\n", "</thi", "nk>\n\n", "Paris", "."];
        assert_eq!(stream(&pieces, false), split_of(Some("Let me think."), "Paris."));
        // Opened by the prompt: no opening tag in the reply, or one that is dropped.
        assert_eq!(stream(&["Hmm,", " sure.</think>", "\n\nYes."], true), split_of(Some("Hmm, sure."), "Yes."));
        assert_eq!(stream(&["\n<th", "ink>Hmm.</think>Yes."], true), split_of(Some("Hmm."), "Yes."));
        assert_eq!(stream(&["<thi"], true), split_of(Some("<thi"), ""));
        // An empty block (Qwen3 with thinking off writes it into the prompt; a model may too).
        assert_eq!(stream(&["<think>\n\n</think>\n\n", "Hi"], false), split_of(Some(""), "Hi"));
        // Space inside the reasoning stays; Köln's bytes are no tag.
        assert_eq!(stream(&["<think>a \n", " b </", "think>Köln"], false), split_of(Some("a \n b"), "Köln"));
    }

    #[test]
    fn replies_without_a_block_are_content() {
        assert_eq!(stream(&["  Paris", " is nice."], false), split_of(None, "  Paris is nice."));
        assert_eq!(stream(&["<thi", "s is no tag>"], false), split_of(None, "<this is no tag>"));
        assert_eq!(stream(&["<th"], false), split_of(None, "<th"));
        assert_eq!(stream(&["Who </think>s?"], false), split_of(None, "Who </think>s?"));
    }

    #[test]
    fn a_reply_cut_short_while_thinking_is_all_reasoning() {
        assert_eq!(stream(&["<think>", "Step one", " </thi"], false), split_of(Some("Step one </thi"), ""));
        assert_eq!(stream(&["Step"], true), split_of(Some("Step"), ""));
    }

    #[test]
    fn templates_and_prompts() {
        let qwen3 = "{% for m in messages %}{{ m.content }}{% endfor %}{% if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}";
        assert!(thinks(&ChatTemplate::new(qwen3, "", "").unwrap()));
        assert!(!thinks(&ChatTemplate::new("{{ messages }}", "", "").unwrap()));
        assert!(opened_by("<|Assistant|><think>\n") && !opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(left_open("<think>\nLet me") && !left_open("<think>a</think>b") && !left_open("plain"));
        assert_eq!(closed("<|Assistant|><think>\n".into()), "<|Assistant|><think>\n\n</think>\n\n");
        assert_eq!(closed("<|im_start|>assistant\n".into()), "<|im_start|>assistant\n");
    }
}
