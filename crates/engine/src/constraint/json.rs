//! JSON mode (`response_format: {"type": "json_object"}`): logit masking that
//! keeps a sequence's output a prefix of exactly one valid JSON object
//! (RFC 8259), followed only by an end-of-generation token.
//!
//! The grammar is checked by a byte-level pushdown automaton ([`State`]).
//! Its container stack is a bit set, so a whole parser state is a small
//! `Copy` value: trying a byte never allocates and never needs undoing.
//!
//! [`JsonVocab`] stores every token's bytes in a byte trie laid out in
//! preorder. [`JsonConstraint::mask`] walks that trie once, depth first,
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

use std::fmt;
use std::sync::Arc;

/// Longest run of consecutive whitespace bytes allowed between JSON tokens
/// (and before the opening `{`). Small enough that whitespace cannot loop
/// forever, large enough for pretty-printed output: a newline plus 15 bytes
/// of indentation covers 2-space indentation seven levels deep, or 4-space
/// indentation three levels deep.
pub const MAX_WS_RUN: u8 = 16;

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

/// Position inside a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StrMode {
    /// Between characters.
    Plain,
    /// After `\`.
    Escape,
    /// In `\uXXXX`: `pos` hex digits read, worth `val`; `low` when this escape
    /// must be the low surrogate completing a pair.
    Hex { low: bool, pos: u8, val: u16 },
    /// After a high-surrogate escape: the `\` of its low half.
    LowBackslash,
    /// After a high-surrogate escape and `\`: the `u`.
    LowU,
    /// Inside a multi-byte UTF-8 character: `need` continuation bytes remain and
    /// the next must lie in `lo..=hi` (narrower than `0x80..=0xBF` right after
    /// some lead bytes, which is how overlong forms and surrogates are excluded).
    Utf8 { need: u8, lo: u8, hi: u8 },
}

/// Position inside a number, per `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    /// After `-`.
    Minus,
    /// After a leading `0` (no more integer digits may follow).
    Zero,
    /// In the integer part after `[1-9]`.
    Int,
    /// After `.`.
    Dot,
    /// In the fraction digits.
    Frac,
    /// After `e`/`E`.
    Exp,
    /// After the exponent's sign.
    ExpSign,
    /// In the exponent digits.
    ExpInt,
}

impl Num {
    /// Whether the number may end here.
    fn terminal(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpInt)
    }

    fn step(self, b: u8) -> Option<Num> {
        use Num::*;
        Some(match (self, b) {
            (Minus, b'0') => Zero,
            (Minus, b'1'..=b'9') | (Int, b'0'..=b'9') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => Exp,
            (Exp, b'+' | b'-') => ExpSign,
            (Exp | ExpSign | ExpInt, b'0'..=b'9') => ExpInt,
            _ => return None,
        })
    }
}

/// One step of a string: the mode after byte `b`, or `None` if `b` is invalid here.
fn string_step(key: bool, sub: StrMode, b: u8) -> Option<Mode> {
    use StrMode::*;
    let sub = match sub {
        Plain => match b {
            b'"' => return Some(if key { Mode::Colon } else { Mode::AfterValue }),
            b'\\' => Escape,
            0x20..=0x7f => Plain,
            // Lead bytes, with the range of the first continuation byte (RFC 3629 table).
            0xc2..=0xdf => Utf8 { need: 1, lo: 0x80, hi: 0xbf },
            0xe0 => Utf8 { need: 2, lo: 0xa0, hi: 0xbf },
            0xed => Utf8 { need: 2, lo: 0x80, hi: 0x9f },
            0xe1..=0xef => Utf8 { need: 2, lo: 0x80, hi: 0xbf },
            0xf0 => Utf8 { need: 3, lo: 0x90, hi: 0xbf },
            0xf1..=0xf3 => Utf8 { need: 3, lo: 0x80, hi: 0xbf },
            0xf4 => Utf8 { need: 3, lo: 0x80, hi: 0x8f },
            // Control characters, stray continuation bytes, overlong leads, > U+10FFFF.
            _ => return None,
        },
        Utf8 { need, lo, hi } => {
            if !(lo..=hi).contains(&b) {
                return None;
            }
            if need == 1 {
                Plain
            } else {
                Utf8 { need: need - 1, lo: 0x80, hi: 0xbf }
            }
        }
        Escape => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Plain,
            b'u' => Hex { low: false, pos: 0, val: 0 },
            _ => return None,
        },
        LowBackslash if b == b'\\' => LowU,
        LowU if b == b'u' => Hex { low: true, pos: 0, val: 0 },
        LowBackslash | LowU => return None,
        Hex { low, pos, val } => {
            let val = val << 4 | (b as char).to_digit(16)? as u16;
            let pos = pos + 1;
            // Reject at the first digit that rules out valid UTF-16, so that no
            // accepted prefix is a dead end.
            let ok = match (low, pos) {
                (false, 2) => !(0xdc..=0xdf).contains(&val), // a lone low surrogate
                (true, 1) => val == 0xd,
                (true, 2) => (0xdc..=0xdf).contains(&val),
                _ => true,
            };
            if !ok {
                return None;
            }
            if pos < 4 {
                Hex { low, pos, val }
            } else if !low && (0xd800..=0xdbff).contains(&val) {
                LowBackslash
            } else {
                Plain
            }
        }
    };
    Some(Mode::Str { key, sub })
}

/// The whole parser state: small and `Copy`, so exploring a byte is free to
/// abandon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
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
    const START: State = State { mode: Mode::Start, objs: 0, depth: 0, ws: 0 };

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
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
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

/// All token byte strings as a byte trie in preorder: node `i`'s children
/// start at `i + 1` and its subtree ends before `end[i]`. The roots are the
/// nodes for tokens' first bytes.
struct Trie {
    /// The byte on the edge into each node.
    byte: Vec<u8>,
    /// One past the last node of each node's subtree.
    end: Vec<u32>,
    /// Tokens ending at node `i` are `ids[first[i]..first[i + 1]]` (several
    /// ids may share the same bytes); `first` has one extra entry.
    first: Vec<u32>,
    ids: Vec<u32>,
    /// Bit `c` of `in_string[i]` is set when, starting inside a string in
    /// UTF-8 class `c` (see [`UTF8_CLASSES`]), every path through node `i`'s
    /// subtree is valid string content that neither ends the string nor
    /// starts an escape. Most of a vocabulary is like that, and its tokens are
    /// allowed inside strings regardless of the rest of the state, so the walk
    /// accepts such subtrees whole instead of visiting every node.
    in_string: Vec<u8>,
    /// The longest token, to size the walk's stack.
    max_len: usize,
}

/// The string positions that the content of a string cycles through between
/// escapes: [`StrMode::Plain`] and every [`StrMode::Utf8`] reachable from it.
const UTF8_CLASSES: [StrMode; 8] = [
    StrMode::Plain,
    StrMode::Utf8 { need: 1, lo: 0x80, hi: 0xbf },
    StrMode::Utf8 { need: 2, lo: 0xa0, hi: 0xbf },
    StrMode::Utf8 { need: 2, lo: 0x80, hi: 0x9f },
    StrMode::Utf8 { need: 2, lo: 0x80, hi: 0xbf },
    StrMode::Utf8 { need: 3, lo: 0x90, hi: 0xbf },
    StrMode::Utf8 { need: 3, lo: 0x80, hi: 0xbf },
    StrMode::Utf8 { need: 3, lo: 0x80, hi: 0x8f },
];

/// The index of `sub` in [`UTF8_CLASSES`], if it is there.
fn utf8_class(sub: StrMode) -> Option<usize> {
    match sub {
        StrMode::Plain | StrMode::Utf8 { .. } => UTF8_CLASSES.iter().position(|&c| c == sub),
        _ => None,
    }
}

impl Trie {
    /// Builds the trie from the tokens `ids`, inserting them in byte order so
    /// that the preorder layout falls out of a single pass.
    fn new(token_bytes: &[Vec<u8>], mut ids: Vec<u32>) -> Trie {
        ids.sort_unstable_by(|&a, &b| token_bytes[a as usize].cmp(&token_bytes[b as usize]));
        let mut t = Trie {
            byte: Vec::new(),
            end: Vec::new(),
            first: Vec::new(),
            ids: Vec::new(),
            in_string: Vec::new(),
            max_len: 0,
        };
        let mut path: Vec<usize> = Vec::new(); // node at each depth of the previous token
        let mut prev: &[u8] = &[];
        for &id in &ids {
            let s = &token_bytes[id as usize][..];
            let shared = prev.iter().zip(s).take_while(|(a, b)| a == b).count();
            while path.len() > shared {
                let node = path.pop().expect("path is longer than shared");
                t.end[node] = t.byte.len() as u32;
            }
            for &b in &s[shared..] {
                path.push(t.byte.len());
                t.byte.push(b);
                t.end.push(0);
                t.first.push(t.ids.len() as u32);
            }
            // Sorted order puts a token right after its own node (or after an
            // identical token), so the last node created is the one it ends at.
            t.ids.push(id);
            t.max_len = t.max_len.max(s.len());
            prev = s;
        }
        for node in path {
            t.end[node] = t.byte.len() as u32;
        }
        t.first.push(t.ids.len() as u32);
        t.in_string = t.in_string_bits();
        t
    }

    /// Computes [`Trie::in_string`] bottom-up: children come after their
    /// parent in preorder, so a reverse pass sees every child first.
    fn in_string_bits(&self) -> Vec<u8> {
        let mut bits = vec![0u8; self.byte.len()];
        for i in (0..self.byte.len()).rev() {
            let mut children = u8::MAX;
            let mut c = i + 1;
            while c < self.end[i] as usize {
                children &= bits[c];
                c = self.end[c] as usize;
            }
            for (class, &sub) in UTF8_CLASSES.iter().enumerate() {
                let next = match string_step(false, sub, self.byte[i]) {
                    Some(Mode::Str { sub, .. }) => utf8_class(sub),
                    _ => None,
                };
                if next.is_some_and(|n| children >> n & 1 == 1) {
                    bits[i] |= 1 << class;
                }
            }
        }
        bits
    }

    /// Sets bit `id` in `allowed` for every token `id` whose bytes `start` accepts.
    fn walk(&self, start: State, allowed: &mut [u64]) {
        // The nodes on the current path with the state after each of their bytes.
        let mut path: Vec<(u32, State)> = Vec::with_capacity(self.max_len);
        let mut i = 0;
        while i < self.byte.len() {
            while path.last().is_some_and(|&(end, _)| end as usize <= i) {
                path.pop();
            }
            let parent = path.last().map_or(start, |&(_, s)| s);
            let end = self.end[i] as usize;
            if let Mode::Str { sub, .. } = parent.mode {
                if utf8_class(sub).is_some_and(|c| self.in_string[i] >> c & 1 == 1) {
                    // The whole subtree stays inside the string: all allowed.
                    self.mark(i, end, allowed);
                    i = end;
                    continue;
                }
            }
            match parent.step(self.byte[i]) {
                Some(s) => {
                    self.mark(i, i + 1, allowed);
                    path.push((end as u32, s));
                    i += 1;
                }
                None => i = end,
            }
        }
    }

    /// Sets the bits of the tokens ending at nodes `from..to`.
    fn mark(&self, from: usize, to: usize, allowed: &mut [u64]) {
        let limit = allowed.len() * 64;
        for &id in &self.ids[self.first[from] as usize..self.first[to] as usize] {
            if (id as usize) < limit {
                allowed[id as usize / 64] |= 1 << (id % 64);
            }
        }
    }
}

/// Per-tokenizer precomputed data (built once, shared).
pub struct JsonVocab {
    trie: Trie,
    token_bytes: Vec<Vec<u8>>,
    eos_ids: Vec<u32>,
}

impl JsonVocab {
    /// `token_bytes[id]`: the bytes token `id` decodes to (empty for special/control tokens, which are never allowed);
    /// `eos_ids`: end-of-generation ids, allowed only once the object is complete.
    pub fn new(token_bytes: Vec<Vec<u8>>, eos_ids: &[u32]) -> JsonVocab {
        // An EOS id ends generation whatever its bytes, so it is never a text token.
        let ids = (0..token_bytes.len() as u32)
            .filter(|&id| !token_bytes[id as usize].is_empty() && !eos_ids.contains(&id))
            .collect();
        let trie = Trie::new(&token_bytes, ids);
        JsonVocab { trie, token_bytes, eos_ids: eos_ids.to_vec() }
    }

    fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }
}

impl fmt::Debug for JsonVocab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonVocab")
            .field("tokens", &self.token_bytes.len())
            .field("trie_nodes", &self.trie.byte.len())
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

/// The state of one sequence's output.
#[derive(Clone, Debug)]
pub struct JsonConstraint {
    vocab: Arc<JsonVocab>,
    state: State,
}

impl JsonConstraint {
    pub fn new(vocab: Arc<JsonVocab>) -> JsonConstraint {
        JsonConstraint { vocab, state: State::START }
    }

    /// Sets to f32::NEG_INFINITY the logit of every token (index = id; `logits.len()` may exceed or fall short of the vocab — ignore ids outside) that cannot extend the output so far to a prefix of a valid JSON object. Once the object is complete, only the eos ids stay allowed.
    pub fn mask(&self, logits: &mut [f32]) {
        let mut allowed = vec![0u64; logits.len().div_ceil(64)];
        if self.state.mode == Mode::Done {
            for &id in &self.vocab.eos_ids {
                if (id as usize) < logits.len() {
                    allowed[id as usize / 64] |= 1 << (id % 64);
                }
            }
        } else {
            self.vocab.trie.walk(self.state, &mut allowed);
        }
        for (i, l) in logits.iter_mut().enumerate() {
            if allowed[i / 64] >> (i % 64) & 1 == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Feeds the sampled token's bytes. A token the mask would have rejected leaves the state unchanged and returns false.
    pub fn advance(&mut self, token: u32) -> bool {
        if self.vocab.is_eos(token) {
            return self.is_complete();
        }
        let bytes = match self.vocab.token_bytes.get(token as usize) {
            Some(b) if !b.is_empty() => b,
            _ => return false,
        };
        let mut s = self.state;
        for &b in bytes {
            match s.step(b) {
                Some(next) => s = next,
                None => return false,
            }
        }
        self.state = s;
        true
    }

    /// True once a complete top-level object has been produced.
    pub fn is_complete(&self) -> bool {
        self.state.mode == Mode::Done
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
