//! Regular expressions as byte automata for the grammars: a JSON Schema
//! string's `pattern` (and the `format`s written as patterns), whose
//! content must contain a match, and vLLM's `guided_regex`, which the
//! whole output must match.
//!
//! A pattern (translated into Rust's syntax, `pattern_syntax`) is compiled
//! to a DFA over bytes (`regex-automata`), copied into a plain transition
//! table, and then annotated with which states can still end in a match,
//! so that the grammars never accept a prefix that is a dead end. In a
//! JSON string the check also counts characters against
//! `minLength`/`maxLength`, and only the bytes a JSON string can carry
//! (raw, or behind a one-letter escape) are walked.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::{start, syntax};
use regex_automata::{Anchored, MatchKind};

use super::free_run::{run_step, CharSet, FreeRun};
use super::lex::{StrMode, ESCAPES};
pub use super::pattern_syntax::{format_max_len, format_pattern};
use super::pattern_syntax::{translate, Dialect};
use super::trie::Grammar;

/// Longest pattern source, in bytes.
const MAX_SOURCE: usize = 4096;
/// Most DFA states a pattern may have (its table is 1 KiB a state).
const MAX_STATES: usize = 4096;
/// Most steps the length analyses of one request may take together
/// (states' edges times lengths; also bounds their tables' bits).
pub const MAX_WORK: usize = 1 << 24;
/// No state: the byte cannot come.
const DEAD: u32 = u32::MAX;

/// The bytes a JSON string's content may hold once its escapes are
/// decoded, where only one-letter escapes are written (`\u` is not:
/// no other control character can appear).
fn json_content_byte(b: u8) -> bool {
    b >= 0x20 || ESCAPES.iter().any(|&(_, d)| d == b)
}

/// Whether a byte starts a character (so counts one toward a length).
pub(crate) fn starts_char(b: u8) -> bool {
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
#[derive(PartialEq)]
pub struct Pattern {
    /// The next state, `next[256 * state + byte]`, or [`DEAD`].
    next: Vec<u32>,
    /// Whether the input may end in each state (a match).
    accept: Vec<bool>,
    /// The lengths tracked: `0..=cap` (past `cap`: all alike without a
    /// maximum; with one, no match is that long).
    cap: u32,
    min: u32,
    max: u32,
    /// Whether each state ends a whole output (`PatternUse::Whole`): a
    /// match that no byte extends.
    ends: Vec<bool>,
    /// Each state's run of free text (`PatternUse::Whole`), found when the
    /// walk first asks.
    runs: Runs,
    /// Bit `len` of state `s`'s row: a match can be completed from `s`
    /// after `len` characters. Rows of `words` u64s.
    live: Vec<u64>,
    words: usize,
    /// The sources, quoted, for messages.
    source: String,
}

/// Each state's run of free text, where found: derived from the automaton,
/// so no part of a pattern's equality.
struct Runs(Vec<OnceLock<Option<CharSet>>>);

impl PartialEq for Runs {
    fn eq(&self, _: &Runs) -> bool {
        true
    }
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pattern({}, {} states)", self.source, self.accept.len())
    }
}

impl Pattern {
    /// Compiles `source` for `how`; the error says why it cannot be used.
    pub fn new(source: &str, how: PatternUse) -> Result<Pattern, String> {
        let mut work = MAX_WORK;
        Pattern::within(&[source], how, &mut work)
    }

    /// As [`Pattern::new`] for text that matches every one of `sources`
    /// (a `pattern` beside a `format`; a format written as two), its
    /// analysis taking at most `work` steps (less what it took), so that
    /// one request's patterns share one budget.
    pub fn within(sources: &[&str], how: PatternUse, work: &mut usize) -> Result<Pattern, String> {
        let (min, max, json) = match how {
            PatternUse::Whole => (0, u32::MAX, false),
            PatternUse::Json { min, max } => (min, max, true),
        };
        let mut tables = sources.iter().map(|source| source_table(source, how));
        // (At least one source: the callers' patterns, or a format's.)
        let first = tables.next().ok_or("no pattern")??;
        let (mut next, accept) = tables.try_fold(first, |a, b| intersect(&prune(a), &prune(b?)))?;
        if json {
            // Only the bytes a JSON string can carry are ever walked.
            for (i, t) in next.iter_mut().enumerate() {
                if !json_content_byte(i as u8) {
                    *t = DEAD;
                }
            }
        }
        let cap = if max == u32::MAX { min } else { max };
        let source = sources.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" and ");
        let (live, words, ends, runs) = (Vec::new(), 0, Vec::new(), Runs(Vec::new()));
        let mut p = Pattern { next, accept, cap, min, max, ends, runs, live, words, source };
        p.analyse(work)?;
        if !p.ok(0, 0) {
            return Err(format!("pattern {} has no match that fits here", p.source));
        }
        if !json {
            p.ends = (0..p.states() as u32)
                .map(|s| p.accepts(s, 0) && !(0..=255).any(|b| p.step(s, b, 0).is_some()))
                .collect();
            p.runs = Runs((0..p.states()).map(|_| OnceLock::new()).collect());
        }
        Ok(p)
    }

    /// The characters of a run of free text at `s`, if any: the ASCII
    /// bytes whose step leaves `s` as it is and, where every string of
    /// those and multi-byte characters from `s` can still match (checked
    /// through a few states), the multi-byte characters too. (A DFA may
    /// reach an equivalent state after a multi-byte character: `.*` after
    /// `é` is not the state after `a`.)
    fn run_chars(&self, s: u32) -> Option<CharSet> {
        /// Most states followed.
        const MOST: usize = 16;
        let ascii = (0..0x80u8).filter(|&b| self.step(s, b, 0) == Some(s)).fold(0u128, |m, b| m | 1 << b);
        let mut reach = vec![s];
        let mut i = 0;
        let non_ascii = loop {
            let Some(&r) = reach.get(i) else { break true };
            i += 1;
            let ascii_next = (0..0x80u8).filter(|&b| ascii >> b & 1 == 1).map(|b| self.step(r, b, 0));
            let next: Option<Vec<u32>> = ascii_next
                .chain(self.non_ascii_ends(r).map_or(vec![None], |e| e.into_iter().map(Some).collect()))
                .collect();
            let Some(next) = next else { break false };
            for n in next {
                if !reach.contains(&n) {
                    reach.push(n);
                }
            }
            if reach.len() > MOST {
                break false;
            }
        };
        let chars = CharSet { ascii, non_ascii };
        (!chars.is_empty()).then_some(chars)
    }

    /// The states every well-formed multi-byte character leads `s` to, or
    /// `None` where one cannot match (or it is past a few states to follow
    /// inside a character).
    fn non_ascii_ends(&self, s: u32) -> Option<Vec<u32>> {
        const MOST: usize = 32;
        let any = CharSet { ascii: 0, non_ascii: true };
        let (mut seen, mut ends): (Vec<(u32, StrMode)>, Vec<u32>) = (Vec::new(), Vec::new());
        let mut work = vec![(s, StrMode::Plain)];
        while let Some((t, sub)) = work.pop() {
            for b in 0x80..=0xffu8 {
                let Some(after) = run_step(any, sub, b) else { continue };
                let n = self.step(t, b, 0)?;
                if after == StrMode::Plain {
                    if !ends.contains(&n) {
                        ends.push(n);
                    }
                } else if !seen.contains(&(n, after)) {
                    if seen.len() == MOST {
                        return None;
                    }
                    seen.push((n, after));
                    work.push((n, after));
                }
            }
        }
        Some(ends)
    }

    /// The automaton's states.
    pub fn states(&self) -> usize {
        self.accept.len()
    }

    /// The state before any byte.
    pub fn start(&self) -> u32 {
        0
    }

    /// The state after byte `b` (a string's content: decoded) where `len`
    /// characters came before it, if a match can still be completed.
    pub fn step(&self, s: u32, b: u8, len: u32) -> Option<u32> {
        let n = self.next[256 * s as usize + b as usize];
        let len = if starts_char(b) { len.checked_add(1)? } else { len };
        (n != DEAD && self.ok(n, len)).then_some(n)
    }

    /// Whether the input may end in `s` after `len` characters.
    pub fn accepts(&self, s: u32, len: u32) -> bool {
        self.accept[s as usize] && len >= self.min && len <= self.max
    }

    /// Whether a whole output (`PatternUse::Whole`) has ended in `s`: it
    /// is a match and no byte may follow.
    pub fn ends(&self, s: u32) -> bool {
        self.ends[s as usize]
    }

    /// Whether a match can be completed from `s` after `len` characters.
    fn ok(&self, s: u32, len: u32) -> bool {
        // (Past a bounded cap, which is at most the maximum, no match is that long.)
        if self.max != u32::MAX && len > self.cap {
            return false;
        }
        let l = len.min(self.cap) as usize;
        self.live[s as usize * self.words + l / 64] >> (l % 64) & 1 == 1
    }

    /// The edges into each state, once per (from, counts a character) pair.
    fn edges_into(&self) -> (Vec<Vec<(u32, bool)>>, usize) {
        let n = self.accept.len();
        let mut into: Vec<Vec<(u32, bool)>> = vec![Vec::new(); n];
        // The last source (plus one) seen per target, per kind of edge.
        let mut seen = [vec![0u32; n], vec![0u32; n]];
        let mut edges = 0;
        for s in 0..n {
            for b in 0..=255u8 {
                let t = self.next[256 * s + b as usize];
                if t == DEAD {
                    continue;
                }
                let counts = starts_char(b);
                if seen[counts as usize][t as usize] != s as u32 + 1 {
                    seen[counts as usize][t as usize] = s as u32 + 1;
                    into[t as usize].push((s as u32, counts));
                    edges += 1;
                }
            }
        }
        (into, edges)
    }

    /// The most characters a match can have, where the states that can
    /// reach one form no cycle (an anchored pattern): no row past it is
    /// needed, however large `maxLength` is.
    fn longest_match(&self, into: &[Vec<(u32, bool)>]) -> Option<u32> {
        let n = self.accept.len();
        // Whether a match is reachable at all (lengths aside).
        let mut live = self.accept.clone();
        let mut work: Vec<usize> = (0..n).filter(|&s| live[s]).collect();
        while let Some(t) = work.pop() {
            for &(s, _) in &into[t] {
                if !live[s as usize] {
                    live[s as usize] = true;
                    work.push(s as usize);
                }
            }
        }
        // The longest path from each live state to a match, children
        // first (depth-first, in a stack of (state, next byte)); a state
        // met again while on the stack is a cycle.
        const OPEN: u32 = u32::MAX - 1;
        let mut longest = vec![u32::MAX; n]; // MAX: not visited
        let mut stack = vec![(0usize, 0usize)];
        longest[0] = OPEN;
        while let Some(&mut (s, ref mut b)) = stack.last_mut() {
            if *b == 256 {
                let mut best = 0;
                for c in 0..=255u8 {
                    let t = self.next[256 * s + c as usize];
                    if t != DEAD && live[t as usize] {
                        best = best.max(longest[t as usize] + starts_char(c) as u32);
                    }
                }
                longest[s] = best;
                stack.pop();
                continue;
            }
            let c = *b as u8;
            *b += 1;
            let t = self.next[256 * s + c as usize];
            if t == DEAD || !live[t as usize] {
                continue;
            }
            match longest[t as usize] {
                OPEN => return None,
                u32::MAX => {
                    longest[t as usize] = OPEN;
                    stack.push((t as usize, 0));
                }
                _ => {}
            }
        }
        Some(longest[0])
    }

    /// Fills `live`, from the longest length down: at a length, a state is
    /// live if it accepts there, or a byte that starts a character leads to
    /// a live state one longer, or another byte (a continuation byte; at
    /// `cap` with no maximum, any) to a live state of the same length.
    fn analyse(&mut self, work_left: &mut usize) -> Result<(), String> {
        let n = self.accept.len();
        let (into, edges) = self.edges_into();
        if self.max != u32::MAX {
            if let Some(longest) = self.longest_match(&into) {
                self.cap = self.cap.min(longest.max(self.min));
            }
        }
        let lengths = self.cap as usize + 1;
        let work = edges.max(n).saturating_mul(lengths);
        if work > *work_left {
            return Err(format!(
                "pattern {} with a length of up to {} is too large to enforce (with the request's other patterns)",
                self.source, self.cap
            ));
        }
        *work_left -= work;
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

/// The whole output as a match of a pattern: the pattern's automaton is
/// the grammar (no lengths: the state is the automaton's).
impl Grammar for Pattern {
    type State = u32;
    fn step(&self, s: u32, b: u8) -> Option<u32> {
        Pattern::step(self, s, b, 0)
    }
    fn free_run(&self, s: &u32, _: usize) -> Option<FreeRun> {
        let chars = (*self.runs.0.get(*s as usize)?.get_or_init(|| self.run_chars(*s)))?;
        Some(FreeRun { chars, sub: StrMode::Plain })
    }
    fn may_end(&self, s: &u32) -> bool {
        self.accepts(*s, 0)
    }
    /// A match that no byte can extend.
    fn is_complete(&self, s: &u32) -> bool {
        self.ends(*s)
    }
}

/// The pattern's DFA as a table over states numbered from the start (0),
/// and which of them may end the input. Every match counts (not only the
/// leftmost-first one a search would report): the output may be any of them.
fn table(regex: &str) -> Result<(Vec<u32>, Vec<bool>), String> {
    let limit = Some(MAX_STATES * 1024);
    let dfa = dense::Builder::new()
        .configure(
            dense::Config::new()
                .match_kind(MatchKind::All)
                .start_kind(StartKind::Anchored)
                .dfa_size_limit(limit)
                .determinize_size_limit(limit),
        )
        .syntax(syntax::Config::new().unicode(true).utf8(true))
        .thompson(thompson::Config::new().nfa_size_limit(Some(2 << 20)))
        .build(regex)
        .map_err(|e| innermost(&e))?;
    let start = dfa.start_state(&start::Config::new().anchored(Anchored::Yes)).map_err(|e| innermost(&e))?;
    let step = |sid, b| {
        let t = dfa.next_state(sid, b);
        if dfa.is_quit_state(t) {
            return Err("it needs look-around the automaton cannot follow".to_string());
        }
        Ok((!dfa.is_dead_state(t)).then_some(t))
    };
    let accepts = |sid| dfa.is_match_state(dfa.next_eoi_state(sid));
    explore(start, accepts, step)
        .map_err(|e| e.unwrap_or_else(|| format!("it needs over {MAX_STATES} automaton states")))
}

/// The table of the states reachable from `start`, numbered as found:
/// whether each `accepts`, and each byte's `step` (`None`: dead). The
/// error: the step's, or `None` past [`MAX_STATES`].
fn explore<K: Copy + Eq + std::hash::Hash>(
    start: K,
    accepts: impl Fn(K) -> bool,
    step: impl Fn(K, u8) -> Result<Option<K>, String>,
) -> Result<(Vec<u32>, Vec<bool>), Option<String>> {
    let mut ids = HashMap::from([(start, 0u32)]);
    let mut order = vec![start];
    let (mut next, mut accept) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < order.len() {
        let k = order[i];
        accept.push(accepts(k));
        for b in 0..=255u8 {
            let Some(t) = step(k, b)? else {
                next.push(DEAD);
                continue;
            };
            let id = *ids.entry(t).or_insert_with(|| {
                order.push(t);
                (order.len() - 1) as u32
            });
            if order.len() > MAX_STATES {
                return Err(None);
            }
            next.push(id);
        }
        i += 1;
    }
    Ok((next, accept))
}

/// One pattern's automaton for `how` (in a JSON string, a match anywhere
/// in the content, as JSON Schema's validators search).
fn source_table(source: &str, how: PatternUse) -> Result<(Vec<u32>, Vec<bool>), String> {
    if source.len() > MAX_SOURCE {
        return Err(format!("a pattern over {MAX_SOURCE} bytes is not supported"));
    }
    let dialect = if how == PatternUse::Whole { Dialect::Python } else { Dialect::Ecma };
    let body = translate(source, dialect)?;
    // Whole on its own first, so that the wrapper below cannot change how
    // it parses (`a)|(b`).
    syntax::parse(&body).map_err(|e| format!("pattern {source:?}: {}", innermost(&e)))?;
    let regex = match how {
        PatternUse::Whole => body,
        PatternUse::Json { .. } => format!("(?s:.)*(?:{body})(?s:.)*"),
    };
    table(&regex).map_err(|e| format!("pattern {source:?}: {e}"))
}

/// `t` with each step into a state that no match can be reached from made
/// dead, so that an intersection pairs no such state (a pattern searched
/// for in a JSON string keeps one once its `^` can no longer hold).
fn prune(mut t: (Vec<u32>, Vec<bool>)) -> (Vec<u32>, Vec<bool>) {
    let n = t.1.len();
    let mut into: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, &to) in t.0.iter().enumerate() {
        if to != DEAD {
            into[to as usize].push((i / 256) as u32);
        }
    }
    let mut live = t.1.clone();
    let mut work: Vec<usize> = (0..n).filter(|&s| live[s]).collect();
    while let Some(s) = work.pop() {
        for &from in &into[s] {
            if !live[from as usize] {
                live[from as usize] = true;
                work.push(from as usize);
            }
        }
    }
    for to in t.0.iter_mut() {
        if *to != DEAD && !live[*to as usize] {
            *to = DEAD;
        }
    }
    t
}

/// The automaton of the text both tables accept: a state per pair of
/// theirs reachable from the two starts.
fn intersect(a: &(Vec<u32>, Vec<bool>), b: &(Vec<u32>, Vec<bool>)) -> Result<(Vec<u32>, Vec<bool>), String> {
    let step = |(s, t): (u32, u32), byte: u8| {
        let pair = (a.0[256 * s as usize + byte as usize], b.0[256 * t as usize + byte as usize]);
        Ok((pair.0 != DEAD && pair.1 != DEAD).then_some(pair))
    };
    explore((0u32, 0u32), |(s, t)| a.1[s as usize] && b.1[t as usize], step)
        .map_err(|e| e.unwrap_or_else(|| format!("the patterns together need over {MAX_STATES} automaton states")))
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

#[cfg(test)]
#[path = "pattern_tests.rs"]
mod tests;
