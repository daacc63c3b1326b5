//! Regular expressions as byte automata for the grammars: a JSON Schema
//! string's `pattern` (and the `format`s written as patterns), whose
//! content must contain a match, and vLLM's `guided_regex`, which the
//! whole output must match.
//!
//! A pattern is compiled to a DFA over bytes (`regex-automata`), copied
//! into a plain transition table, and then annotated with which states can
//! still end in a match, so that the grammars never accept a prefix that is
//! a dead end. In a JSON string the check also counts characters against
//! `minLength`/`maxLength`, and only the bytes a JSON string can carry
//! (raw, or behind a one-letter escape) are walked.

use std::collections::HashMap;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::{start, syntax};
use regex_automata::Anchored;

/// Most DFA states a pattern may have (its table is 1 KiB a state).
const MAX_STATES: usize = 4096;
/// Most steps the length analysis may take (states' edges times lengths).
const MAX_WORK: usize = 1 << 25;
/// No state: the byte cannot come.
const DEAD: u32 = u32::MAX;

/// The bytes a JSON string's content may hold once its escapes are
/// decoded, where only one-letter escapes are written (`\u` is not:
/// control characters other than these five cannot appear).
fn json_content_byte(b: u8) -> bool {
    b >= 0x20 || matches!(b, 0x08 | b'\t' | b'\n' | 0x0c | b'\r')
}

/// Whether a byte starts a character (so counts one toward a length).
fn starts_char(b: u8) -> bool {
    !(0x80..=0xbf).contains(&b)
}

/// What a [`Pattern`] constrains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternUse {
    /// The whole output matches (vLLM's `guided_regex`, Python's syntax).
    Whole,
    /// A JSON string's content contains a match (JSON Schema's `pattern`,
    /// ECMA-262's syntax), `min..=max` characters long.
    Json { min: u32, max: u32 },
}

/// A compiled pattern: a byte DFA and, per state and length so far,
/// whether a match can still be completed.
pub struct Pattern {
    /// The next state, `next[256 * state + byte]`, or [`DEAD`].
    next: Vec<u32>,
    /// Whether the input may end in each state (a match).
    accept: Vec<bool>,
    /// The lengths tracked: `0..=cap` (past `cap`, all alike).
    cap: u32,
    min: u32,
    max: u32,
    json: bool,
    /// Bit `len` of state `s`'s row: a match can be completed from `s`
    /// after `len` characters. Rows of `words` u64s.
    live: Vec<u64>,
    words: usize,
    /// The source, for messages.
    pub source: String,
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pattern({:?}, {} states)", self.source, self.accept.len())
    }
}

impl Pattern {
    /// Compiles `source` for `how`; the error says why it cannot be used.
    pub fn new(source: &str, how: PatternUse) -> Result<Pattern, String> {
        let (regex, min, max, json) = match how {
            PatternUse::Whole => (translate(source, false)?, 0, u32::MAX, false),
            // A match anywhere in the content, as JSON Schema's validators search.
            PatternUse::Json { min, max } => {
                (format!("(?s:.)*(?:{})(?s:.)*", translate(source, true)?), min, max, true)
            }
        };
        let (next, accept) = table(&regex).map_err(|e| format!("pattern {source:?}: {e}"))?;
        let cap = if max == u32::MAX { min } else { max };
        let mut p = Pattern { next, accept, cap, min, max, json, live: Vec::new(), words: 0, source: source.into() };
        p.analyse()?;
        if !p.ok(0, 0) {
            return Err(format!("pattern {source:?} has no match that fits here"));
        }
        Ok(p)
    }

    /// The automaton's states.
    pub fn states(&self) -> usize {
        self.accept.len()
    }

    /// The state before any byte.
    pub fn start(&self) -> u32 {
        0
    }

    /// The state after byte `b` (a string's content: decoded), if a match
    /// can still be completed after it, `len` characters then read.
    pub fn step(&self, s: u32, b: u8, len: u32) -> Option<u32> {
        if self.json && !json_content_byte(b) {
            return None;
        }
        let n = self.next[256 * s as usize + b as usize];
        let len = if starts_char(b) { len.checked_add(1)? } else { len };
        (n != DEAD && self.ok(n, len)).then_some(n)
    }

    /// Whether the input may end in `s` after `len` characters.
    pub fn accepts(&self, s: u32, len: u32) -> bool {
        self.accept[s as usize] && len >= self.min && len <= self.max
    }

    /// Whether any byte may follow `s` (else a whole output has ended).
    pub fn can_go_on(&self, s: u32, len: u32) -> bool {
        (0..=255u8).any(|b| self.step(s, b, len).is_some())
    }

    /// Whether a match can be completed from `s` after `len` characters.
    fn ok(&self, s: u32, len: u32) -> bool {
        if len > self.max {
            return false;
        }
        let l = len.min(self.cap) as usize;
        self.live[s as usize * self.words + l / 64] >> (l % 64) & 1 == 1
    }

    /// Fills `live`, from the longest length down: at a length, a state is
    /// live if it accepts there, or a byte that starts a character leads to
    /// a live state one longer, or another byte (a continuation byte; at
    /// `cap` with no maximum, any) to a live state of the same length.
    fn analyse(&mut self) -> Result<(), String> {
        let n = self.accept.len();
        // Edges into each state, once per (from, counts) pair.
        let mut into: Vec<Vec<(u32, bool)>> = vec![Vec::new(); n];
        let mut edges = 0usize;
        for s in 0..n {
            for b in 0..=255u8 {
                let t = self.next[256 * s + b as usize];
                if t == DEAD || (self.json && !json_content_byte(b)) {
                    continue;
                }
                let e = (s as u32, starts_char(b));
                if !into[t as usize].contains(&e) {
                    into[t as usize].push(e);
                    edges += 1;
                }
            }
        }
        let lengths = self.cap as usize + 1;
        if edges.saturating_mul(lengths) > MAX_WORK {
            return Err(format!(
                "pattern {:?} with a length of up to {} is too large to enforce",
                self.source, self.cap
            ));
        }
        self.words = lengths.div_ceil(64);
        self.live = vec![0; n * self.words];
        let unbounded = self.max == u32::MAX;
        let mut this = vec![false; n];
        let mut longer = vec![false; n];
        for l in (0..lengths).rev() {
            let at_cap = l + 1 == lengths;
            let mut work: Vec<u32> = Vec::new();
            for (s, live) in this.iter_mut().enumerate() {
                *live = self.accept[s] && l as u32 >= self.min;
                if *live {
                    work.push(s as u32);
                }
            }
            // One character more: from the longer row (at the cap, this row).
            if !at_cap {
                for t in (0..n).filter(|&t| longer[t]) {
                    for &(s, counts) in &into[t] {
                        if counts && !this[s as usize] {
                            this[s as usize] = true;
                            work.push(s);
                        }
                    }
                }
            }
            while let Some(t) = work.pop() {
                for &(s, counts) in &into[t as usize] {
                    let same_row = !counts || (at_cap && unbounded);
                    if same_row && !this[s as usize] {
                        this[s as usize] = true;
                        work.push(s);
                    }
                }
            }
            for s in (0..n).filter(|&s| this[s]) {
                self.live[s * self.words + l / 64] |= 1 << (l % 64);
            }
            std::mem::swap(&mut this, &mut longer);
        }
        Ok(())
    }
}

/// The pattern's DFA as a table over states numbered from the start (0),
/// and which of them may end the input.
fn table(regex: &str) -> Result<(Vec<u32>, Vec<bool>), String> {
    let limit = Some(MAX_STATES * 1024);
    let dfa = dense::Builder::new()
        .configure(
            dense::Config::new().start_kind(StartKind::Anchored).dfa_size_limit(limit).determinize_size_limit(limit),
        )
        .syntax(syntax::Config::new().unicode(true).utf8(true))
        .build(regex)
        .map_err(|e| innermost(&e))?;
    let start = dfa.start_state(&start::Config::new().anchored(Anchored::Yes)).map_err(|e| innermost(&e))?;
    let mut ids = HashMap::from([(start, 0u32)]);
    let mut order = vec![start];
    let (mut next, mut accept) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < order.len() {
        let sid = order[i];
        accept.push(dfa.is_match_state(dfa.next_eoi_state(sid)));
        for b in 0..=255u8 {
            let t = dfa.next_state(sid, b);
            if dfa.is_dead_state(t) {
                next.push(DEAD);
                continue;
            }
            if dfa.is_quit_state(t) {
                return Err("it needs look-around the automaton cannot follow".into());
            }
            let id = *ids.entry(t).or_insert_with(|| {
                order.push(t);
                (order.len() - 1) as u32
            });
            if order.len() > MAX_STATES {
                return Err(format!("it needs over {MAX_STATES} automaton states"));
            }
            next.push(id);
        }
        i += 1;
    }
    Ok((next, accept))
}

/// The innermost cause's message (the parser's, say) without its
/// multi-line pointer art.
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut e = e;
    while let Some(inner) = e.source() {
        e = inner;
    }
    let text = e.to_string();
    let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    last.strip_prefix("error: ").unwrap_or(last).to_string()
}

/// A pattern in the syntax the automaton reads. The classes whose meaning
/// differs between ECMA-262, Python and Rust are narrowed to what all of
/// them accept, so that an output matches under any of them: `\d` and `\w`
/// are their ASCII sets, `\s` the whitespace they share, `\b` the ASCII
/// word boundary. For ECMA-262 (`ecma`), `.` excludes every line
/// terminator and a `[` inside a class is a literal; look-around and
/// backreferences are refused (the automaton cannot follow them).
fn translate(p: &str, ecma: bool) -> Result<String, String> {
    const SPACE: &str = r"\t\n\x0B\x0C\r \xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}";
    let unsupported = |what: &str| Err(format!("pattern {p:?}: {what} is not supported"));
    let mut out = String::with_capacity(p.len() + 16);
    let mut class = false; // inside [...]
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(e) = chars.next() else { return unsupported("a trailing backslash") };
                match (e, class) {
                    ('d', false) => out.push_str("[0-9]"),
                    ('d', true) => out.push_str("0-9"),
                    ('w', false) => out.push_str("[0-9A-Za-z_]"),
                    ('w', true) => out.push_str("0-9A-Za-z_"),
                    ('s', false) => out.push_str(&format!("[{SPACE}]")),
                    ('s', true) => out.push_str(SPACE),
                    ('b', false) => out.push_str(r"(?-u:\b)"),
                    ('B', false) => out.push_str(r"(?-u:\B)"),
                    ('b', true) => out.push_str(r"\x08"),
                    ('1'..='9', _) => return unsupported("a backreference"),
                    ('k', false) if chars.peek() == Some(&'<') => return unsupported("a backreference"),
                    // \D, \W, \S: Rust's (Unicode) sets, the narrowest.
                    _ => {
                        out.push('\\');
                        out.push(e);
                    }
                }
            }
            '[' if class => out.push_str(r"\["),
            '[' => {
                class = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().unwrap_or('^'));
                }
                // `[]` matches nothing and `[^]` anything in ECMA-262.
                if chars.peek() == Some(&']') {
                    if out.ends_with('^') {
                        out.truncate(out.len() - 2);
                        out.push_str("(?s:.)");
                        chars.next();
                        class = false;
                    } else {
                        return unsupported("an empty class `[]`");
                    }
                }
            }
            ']' if class => {
                class = false;
                out.push(']');
            }
            // Rust's class set operators are literals elsewhere.
            '&' | '~' if class => {
                out.push('\\');
                out.push(c);
            }
            '.' if !class && ecma => out.push_str(r"[^\n\r\x{2028}\x{2029}]"),
            '(' if !class && chars.peek() == Some(&'?') => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("?=")
                    || rest.starts_with("?!")
                    || rest.starts_with("?<=")
                    || rest.starts_with("?<!")
                {
                    return unsupported("look-around");
                }
                out.push('(');
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// The pattern a JSON Schema `format` stands for, for the formats whose
/// shape a pattern fixes (RFC 3339 dates and times, UUIDs, IPv4).
pub fn format_pattern(format: &str) -> Option<String> {
    const DATE: &str = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
    const TIME: &str = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    const OCTET: &str = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    Some(match format {
        "date-time" => format!("^{DATE}T{TIME}$"),
        "date" => format!("^{DATE}$"),
        "time" => format!("^{TIME}$"),
        "uuid" => "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$".into(),
        "ipv4" => format!(r"^{OCTET}(\.{OCTET}){{3}}$"),
        _ => return None,
    })
}

#[cfg(test)]
#[path = "pattern_tests.rs"]
mod tests;
