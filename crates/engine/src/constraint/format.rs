//! What a sequence's output must be (one JSON object, a value of a JSON
//! Schema, a match of a regular expression, or a sentence of a grammar),
//! and the constraint that keeps it so, step by step.

use std::sync::Arc;

use super::gbnf::Rules;
use super::gbnf_run::Gbnf;
use super::json::{AnyObject, JsonVocab, State};
use super::pattern::{Pattern, PatternUse};
use super::schema::Schema;
use super::schema_grammar::SchemaState;
use super::trie::{apply, Grammar};

/// A request's output format.
#[derive(Clone, Debug)]
pub enum OutputFormat {
    /// Any one JSON object (`response_format: {"type": "json_object"}`).
    Object,
    /// A value of this schema (`{"type": "json_schema", ...}`).
    Schema(Arc<Schema>),
    /// A whole match of this pattern (vLLM's `guided_regex`).
    Regex(Arc<Pattern>),
    /// A sentence of this GBNF grammar (vLLM's `guided_grammar`).
    Grammar(Arc<Rules>),
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

    /// A sentence of the GBNF grammar `source`, or why it cannot be.
    pub fn grammar(source: &str) -> Result<OutputFormat, String> {
        Gbnf::compile(source).map(OutputFormat::Grammar)
    }

    /// The format for a model whose vocabulary has `size` tokens and names
    /// token texts by `id_of`: a grammar's tokens by text (`<think>`) as
    /// ids; refused where one is not in the vocabulary.
    pub fn in_vocabulary(self, size: usize, id_of: impl Fn(&str) -> Option<u32>) -> Result<OutputFormat, String> {
        match self {
            OutputFormat::Grammar(rules) if rules.has_tokens() => {
                Ok(OutputFormat::Grammar(Arc::new(rules.in_vocabulary(size, id_of)?)))
            }
            format => Ok(format),
        }
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
            (OutputFormat::Grammar(a), OutputFormat::Grammar(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// One sequence's constraint: its mask before each pick, its state after.
#[derive(Clone, Debug)]
pub struct Constraint(Inner);

#[derive(Clone, Debug)]
enum Inner {
    Object(GrammarConstraint<AnyObject>),
    // (Boxed: a schema's state holds its stack of frames.)
    Schema(Box<GrammarConstraint<Schema>>),
    Regex(GrammarConstraint<Pattern>),
    Grammar(GrammarConstraint<Gbnf>),
}

impl Constraint {
    pub fn new(vocab: Arc<JsonVocab>, format: &OutputFormat) -> Constraint {
        Constraint(match format {
            OutputFormat::Object => Inner::Object(GrammarConstraint::new(vocab, Arc::new(AnyObject), State::START)),
            OutputFormat::Schema(schema) => {
                Inner::Schema(Box::new(GrammarConstraint::new(vocab, schema.clone(), SchemaState::start(schema))))
            }
            OutputFormat::Regex(p) => Inner::Regex(GrammarConstraint::new(vocab, p.clone(), p.start())),
            OutputFormat::Grammar(rules) => {
                // (Each sequence its own run: it drops states of its own. A
                // reference to an end of generation is the output's end.)
                let rules = rules.ending_at(&vocab.eos_ids).map_or_else(|| rules.clone(), Arc::new);
                let run = Arc::new(Gbnf::run(rules));
                let start = run.start();
                Inner::Grammar(GrammarConstraint::new(vocab, run, start))
            }
        })
    }

    /// Sets to f32::NEG_INFINITY the logit of every token that cannot extend
    /// the output (ids outside `logits` are ignored).
    pub fn mask(&self, logits: &mut [f32]) {
        match &self.0 {
            Inner::Object(c) => c.mask(logits),
            Inner::Schema(c) => c.mask(logits),
            Inner::Regex(c) => c.mask(logits),
            Inner::Grammar(c) => c.mask(logits),
        }
    }

    /// Feeds the sampled token; false (and no change) for a token the mask
    /// would have rejected.
    pub fn advance(&mut self, token: u32) -> bool {
        match &mut self.0 {
            Inner::Object(c) => c.advance(token),
            Inner::Schema(c) => c.advance(token),
            Inner::Regex(c) => c.advance(token),
            Inner::Grammar(c) => c.advance(token),
        }
    }

    /// True once nothing but the end of generation can follow.
    pub fn is_complete(&self) -> bool {
        match &self.0 {
            Inner::Object(c) => c.is_complete(),
            Inner::Schema(c) => c.is_complete(),
            Inner::Regex(c) => c.is_complete(),
            Inner::Grammar(c) => c.is_complete(),
        }
    }
}

#[cfg(test)]
impl Constraint {
    /// JSON mode's parser state.
    pub(crate) fn object_state(&self) -> State {
        match &self.0 {
            Inner::Object(c) => c.state,
            _ => panic!("not JSON mode"),
        }
    }

    pub(crate) fn set_object_state(&mut self, s: State) {
        match &mut self.0 {
            Inner::Object(c) => c.state = s,
            _ => panic!("not JSON mode"),
        }
    }
}

/// A sequence's output under grammar `G`: its state, stepped token by token
/// through the vocabulary's bytes.
struct GrammarConstraint<G: Grammar> {
    vocab: Arc<JsonVocab>,
    grammar: Arc<G>,
    state: G::State,
}

impl<G: Grammar> GrammarConstraint<G> {
    fn new(vocab: Arc<JsonVocab>, grammar: Arc<G>, state: G::State) -> Self {
        GrammarConstraint { vocab, grammar, state }
    }

    /// The tokens that keep the output a prefix of the grammar's, and the
    /// end of generation where the output may end.
    fn mask(&self, logits: &mut [f32]) {
        let mut allowed = vec![0u64; logits.len().div_ceil(64)];
        if !self.grammar.is_complete(&self.state) {
            self.vocab.trie.walk(self.grammar.as_ref(), self.state, &mut allowed);
            for (id, negated) in self.grammar.whole_tokens(&self.state) {
                self.vocab.allow_whole(id, negated, &mut allowed);
            }
        }
        if self.grammar.may_end(&self.state) {
            self.vocab.allow_eos(&mut allowed);
        }
        apply(&allowed, logits);
    }

    fn advance(&mut self, token: u32) -> bool {
        if self.vocab.is_eos(token) {
            return self.grammar.may_end(&self.state);
        }
        // Renewed before as well as after: a walk may have spent a
        // grammar's budget of states, and a token it allowed whole (a run
        // of free text) must still step.
        self.state = self.grammar.renew(self.state);
        match self.vocab.feed(self.grammar.as_ref(), self.state, token) {
            Some(s) => self.state = self.grammar.renew(s),
            None => return false,
        }
        true
    }

    fn is_complete(&self) -> bool {
        self.grammar.is_complete(&self.state)
    }
}

// (By hand: derived ones would ask G itself to be Clone and Debug.)
impl<G: Grammar> Clone for GrammarConstraint<G> {
    fn clone(&self) -> Self {
        let (grammar, state) = G::fork(&self.grammar, self.state);
        GrammarConstraint { vocab: self.vocab.clone(), grammar, state }
    }
}

impl<G: Grammar> std::fmt::Debug for GrammarConstraint<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarConstraint").field("state", &self.state).finish()
    }
}
