//! What a sequence's output must be (one JSON object, a value of a JSON
//! Schema, or a match of a regular expression), and the constraint that
//! keeps it so, step by step.

use std::sync::Arc;

use super::json::{JsonConstraint, JsonVocab};
use super::pattern::{Pattern, PatternUse};
use super::schema::Schema;
use super::schema_grammar::SchemaState;
use super::trie::apply;

/// A request's output format.
#[derive(Clone, Debug)]
pub enum OutputFormat {
    /// Any one JSON object (`response_format: {"type": "json_object"}`).
    Object,
    /// A value of this schema (`{"type": "json_schema", ...}`).
    Schema(Arc<Schema>),
    /// A whole match of this pattern (vLLM's `guided_regex`).
    Regex(Arc<Pattern>),
}

impl OutputFormat {
    /// A value of the JSON Schema `doc`, or why it cannot be enforced.
    pub fn schema(doc: &serde_json::Value) -> Result<OutputFormat, String> {
        Schema::compile(doc).map(|s| OutputFormat::Schema(Arc::new(s)))
    }

    /// A whole match of `source` (Python's syntax), or why it cannot be.
    pub fn regex(source: &str) -> Result<OutputFormat, String> {
        Pattern::new(source, PatternUse::Whole).map(|p| OutputFormat::Regex(Arc::new(p)))
    }
}

/// Formats are equal when they are the same format (a schema: the same
/// compiled one).
impl PartialEq for OutputFormat {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (OutputFormat::Object, OutputFormat::Object) => true,
            (OutputFormat::Schema(a), OutputFormat::Schema(b)) => Arc::ptr_eq(a, b),
            (OutputFormat::Regex(a), OutputFormat::Regex(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// One sequence's constraint: its mask before each pick, its state after.
#[derive(Clone, Debug)]
pub enum Constraint {
    Object(JsonConstraint),
    Schema(SchemaConstraint),
    Regex(RegexConstraint),
}

impl Constraint {
    pub fn new(vocab: Arc<JsonVocab>, format: &OutputFormat) -> Constraint {
        match format {
            OutputFormat::Object => Constraint::Object(JsonConstraint::new(vocab)),
            OutputFormat::Schema(schema) => Constraint::Schema(SchemaConstraint::new(vocab, schema.clone())),
            OutputFormat::Regex(p) => {
                Constraint::Regex(RegexConstraint { vocab, state: p.start(), pattern: p.clone() })
            }
        }
    }

    /// Sets to f32::NEG_INFINITY the logit of every token that cannot extend
    /// the output (ids outside `logits` are ignored).
    pub fn mask(&self, logits: &mut [f32]) {
        match self {
            Constraint::Object(c) => c.mask(logits),
            Constraint::Schema(c) => c.mask(logits),
            Constraint::Regex(c) => c.mask(logits),
        }
    }

    /// Feeds the sampled token; false (and no change) for a token the mask
    /// would have rejected.
    pub fn advance(&mut self, token: u32) -> bool {
        match self {
            Constraint::Object(c) => c.advance(token),
            Constraint::Schema(c) => c.advance(token),
            Constraint::Regex(c) => c.advance(token),
        }
    }

    /// True once nothing but the end of generation can follow.
    pub fn is_complete(&self) -> bool {
        match self {
            Constraint::Object(c) => c.is_complete(),
            Constraint::Schema(c) => c.is_complete(),
            Constraint::Regex(c) => c.is_complete(),
        }
    }
}

/// The output as a value of a schema.
#[derive(Clone, Debug)]
pub struct SchemaConstraint {
    vocab: Arc<JsonVocab>,
    schema: Arc<Schema>,
    state: SchemaState,
}

impl SchemaConstraint {
    pub fn new(vocab: Arc<JsonVocab>, schema: Arc<Schema>) -> SchemaConstraint {
        let state = SchemaState::start(&schema);
        SchemaConstraint { vocab, schema, state }
    }

    /// The tokens that extend the output, and the end of generation once it
    /// is a whole value.
    pub fn mask(&self, logits: &mut [f32]) {
        let mut allowed = vec![0u64; logits.len().div_ceil(64)];
        self.vocab.trie.walk(self.schema.as_ref(), self.state, &mut allowed);
        if self.state.complete(&self.schema) {
            self.vocab.allow_eos(&mut allowed);
        }
        apply(&allowed, logits);
    }

    pub fn advance(&mut self, token: u32) -> bool {
        if self.vocab.is_eos(token) {
            return self.state.complete(&self.schema);
        }
        match self.vocab.feed(self.schema.as_ref(), self.state, token) {
            Some(s) => self.state = s,
            None => return false,
        }
        true
    }

    /// True once the value is whole and cannot go on (a top-level number
    /// may: it ends with the end of generation).
    pub fn is_complete(&self) -> bool {
        self.state.is_done()
    }
}

#[derive(Clone, Debug)]
pub struct RegexConstraint {
    vocab: Arc<JsonVocab>,
    pattern: Arc<Pattern>,
    state: u32,
}

impl RegexConstraint {
    /// The tokens that keep a match reachable, and the end of generation
    /// once the output is one.
    pub fn mask(&self, logits: &mut [f32]) {
        let mut allowed = vec![0u64; logits.len().div_ceil(64)];
        self.vocab.trie.walk(self.pattern.as_ref(), self.state, &mut allowed);
        if self.pattern.accepts(self.state, 0) {
            self.vocab.allow_eos(&mut allowed);
        }
        apply(&allowed, logits);
    }

    pub fn advance(&mut self, token: u32) -> bool {
        if self.vocab.is_eos(token) {
            return self.pattern.accepts(self.state, 0);
        }
        match self.vocab.feed(self.pattern.as_ref(), self.state, token) {
            Some(s) => self.state = s,
            None => return false,
        }
        true
    }

    /// True once the output is a match that no byte can extend.
    pub fn is_complete(&self) -> bool {
        self.pattern.ends(self.state)
    }
}
