//! JSON mode (`response_format: {"type": "json_object"}`): logit masking that
//! keeps a sequence's output a prefix of exactly one valid JSON object
//! (RFC 8259), followed only by an end-of-generation token.
//!
//! The grammar is checked by a byte-level pushdown automaton ([`State`]).
//! Its container stack is a bit set, so a whole parser state is a small
//! `Copy` value: trying a byte never allocates and never needs undoing.
//!
//! [`JsonVocab`] stores every token's bytes in a byte trie laid out in
//! preorder. [`Constraint::mask`](super::format::Constraint::mask) walks that trie once, depth first,
//! carrying the parser state down each edge, and skips a whole subtree at its
//! first invalid byte. Tokens sharing a prefix share its work, and subtrees
//! that cannot follow the current state (most of the vocabulary outside
//! strings) are never visited. Inside strings, where nearly every token is
//! allowed, subtrees precomputed to be plain string content are accepted
//! whole without visiting their nodes.
//!
//! Beyond the RFC grammar, a few limits keep generation bounded and the output
//! acceptable to strict parsers:
//! - at most [`MAX_WS_RUN`] consecutive whitespace bytes anywhere outside
//!   strings (also before the opening `{`), so the model cannot stall on
//!   whitespace forever;
//! - no bytes after the closing `}` (not even whitespace): only EOS;
//! - nesting at most [`MAX_DEPTH`] deep;
//! - `\uXXXX` escapes must form valid UTF-16: a high surrogate must be
//!   followed by a low one, and a low one cannot stand alone (strict parsers
//!   such as serde_json reject lone surrogates);
//! - raw string bytes must be well-formed UTF-8 (no overlong forms, no
//!   surrogates, nothing above U+10FFFF), even when a character is split
//!   across tokens.
//!
//! Every state the automaton accepts can still be completed, so the mask never
//! leads a sequence into a dead end (as long as the vocabulary can spell the
//! needed bytes, as byte-level and byte-fallback vocabularies can).

use super::free_run::{CharSet, FreeRun};
pub use super::lex::MAX_WS_RUN;
use super::lex::{is_ws, str_step, Num, StrMode, StrStep};
use super::trie::Grammar;
pub use super::trie::JsonVocab;

/// Deepest allowed nesting of objects and arrays; the top-level object is
/// depth 1. It lets the container stack live in a `u64`, and keeps output well
/// inside common parser limits (serde_json's default is 128).
pub const MAX_DEPTH: u8 = 64;

/// The literals `true`, `false`, `null`, indexed by [`Mode::Lit`]'s `word`.
const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// What the automaton expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Before the top-level `{`.
    Start,
    /// Just after `{`: a key or `}`.
    ObjOpen,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `:`, or after `,` in an array: a value.
    Value,
    /// Just after `[`: a value or `]`.
    ArrOpen,
    /// After a value: `,` or the innermost container's closing bracket.
    AfterValue,
    /// Inside a string; `key` says whether `:` or [`Mode::AfterValue`] follows it.
    Str { key: bool, sub: StrMode },
    /// Inside a number.
    Num(Num),
    /// Inside a literal: `word` indexes [`LITERALS`], `pos` bytes are matched.
    Lit { word: u8, pos: u8 },
    /// The top-level object has closed; only EOS may follow.
    Done,
}

/// One step of a string: the mode after byte `b`, or `None` if `b` is invalid here.
fn string_step(key: bool, sub: StrMode, b: u8) -> Option<Mode> {
    Some(match str_step(sub, b)? {
        StrStep::In(sub) => Mode::Str { key, sub },
        StrStep::End if key => Mode::Colon,
        StrStep::End => Mode::AfterValue,
    })
}

/// The whole parser state: small and `Copy`, so exploring a byte is free to
/// abandon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State {
    mode: Mode,
    /// The open containers: bit `i` set when level `i` (0 = top-level) is an
    /// object, clear when it is an array.
    objs: u64,
    /// Number of open containers.
    depth: u8,
    /// Length of the current whitespace run.
    ws: u8,
}

impl State {
    pub(crate) const START: State = State { mode: Mode::Start, objs: 0, depth: 0, ws: 0 };

    /// The state after byte `b`, or `None` if no valid object has this prefix.
    fn step(mut self, b: u8) -> Option<State> {
        match self.mode {
            Mode::Str { key, sub } => {
                self.mode = string_step(key, sub, b)?;
                return Some(self);
            }
            Mode::Lit { word, pos } => {
                let w = LITERALS[word as usize];
                if w[pos as usize] != b {
                    return None;
                }
                let pos = pos + 1;
                self.mode = if pos as usize == w.len() { Mode::AfterValue } else { Mode::Lit { word, pos } };
                return Some(self);
            }
            Mode::Num(n) => {
                if let Some(n) = n.step(b) {
                    self.mode = Mode::Num(n);
                    return Some(self);
                }
                if !n.terminal() {
                    return None;
                }
                // A byte that cannot continue the number ends it, and is then
                // read as whatever follows a value.
                self.mode = Mode::AfterValue;
            }
            _ => {}
        }
        if is_ws(b) {
            if self.ws >= MAX_WS_RUN || self.mode == Mode::Done {
                return None;
            }
            self.ws += 1;
            return Some(self);
        }
        self.ws = 0;
        self.mode = match (self.mode, b) {
            (Mode::Start, b'{') => return self.open(true),
            (Mode::ObjOpen | Mode::AfterValue, b'}') => return self.close(true),
            (Mode::ArrOpen | Mode::AfterValue, b']') => return self.close(false),
            (Mode::ObjOpen | Mode::Key, b'"') => Mode::Str { key: true, sub: StrMode::Plain },
            (Mode::Colon, b':') => Mode::Value,
            (Mode::AfterValue, b',') if self.top_is_obj() => Mode::Key,
            (Mode::AfterValue, b',') => Mode::Value,
            (Mode::Value | Mode::ArrOpen, b'{') => return self.open(true),
            (Mode::Value | Mode::ArrOpen, b'[') => return self.open(false),
            (Mode::Value | Mode::ArrOpen, b'"') => Mode::Str { key: false, sub: StrMode::Plain },
            (Mode::Value | Mode::ArrOpen, b'-') => Mode::Num(Num::Minus),
            (Mode::Value | Mode::ArrOpen, b'0') => Mode::Num(Num::Zero),
            (Mode::Value | Mode::ArrOpen, b'1'..=b'9') => Mode::Num(Num::Int),
            (Mode::Value | Mode::ArrOpen, b't') => Mode::Lit { word: 0, pos: 1 },
            (Mode::Value | Mode::ArrOpen, b'f') => Mode::Lit { word: 1, pos: 1 },
            (Mode::Value | Mode::ArrOpen, b'n') => Mode::Lit { word: 2, pos: 1 },
            _ => return None,
        };
        Some(self)
    }

    fn top_is_obj(&self) -> bool {
        self.depth > 0 && self.objs >> (self.depth - 1) & 1 == 1
    }

    fn open(mut self, obj: bool) -> Option<State> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        self.objs = self.objs & !(1 << self.depth) | u64::from(obj) << self.depth;
        self.depth += 1;
        self.mode = if obj { Mode::ObjOpen } else { Mode::ArrOpen };
        Some(self)
    }

    fn close(mut self, obj: bool) -> Option<State> {
        if self.depth == 0 || self.top_is_obj() != obj {
            return None;
        }
        self.depth -= 1;
        self.mode = if self.depth == 0 { Mode::Done } else { Mode::AfterValue };
        Some(self)
    }
}

/// JSON mode's grammar: one object, any keys and values, and nothing after it.
#[derive(Debug)]
pub(crate) struct AnyObject;

impl Grammar for AnyObject {
    type State = State;
    fn step(&self, s: State, b: u8) -> Option<State> {
        s.step(b)
    }
    fn free_run(&self, s: &State, _longest: usize) -> Option<FreeRun> {
        match s.mode {
            Mode::Str { sub, .. } => Some(FreeRun { chars: CharSet::JSON_STRING, sub }),
            _ => None,
        }
    }
    fn may_end(&self, s: &State) -> bool {
        s.mode == Mode::Done
    }
    fn is_complete(&self, s: &State) -> bool {
        s.mode == Mode::Done
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
