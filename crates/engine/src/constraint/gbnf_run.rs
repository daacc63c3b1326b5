//! A GBNF grammar ([`super::gbnf`]) as a byte-level [`Grammar`]: the set
//! of parser stacks that the output so far leaves (llama.cpp's way of
//! running its grammars), each stack's top at a character class or a token
//! reference, plus the bytes of a character begun. Sets are interned as
//! numbered states and their steps memoized in a row per state, so the
//! vocabulary walk's steps become lookups after the first; the state the
//! walk carries is the number. Each sequence runs its own copy, which drops
//! its states past a budget. A state that some character leaves as it is
//! (inside a string's `[^"\\]*`, say) is a run of free text for the walk
//! once its set of such characters is known (`free_run`), so that the
//! tokens made of them are allowed without stepping their bytes. A token
//! reference takes a token whole, beside the stacks that take its bytes
//! (`feed_token`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::free_run::{CharSet, FreeRun};
use super::gbnf::{parse, Elem, Rules};
use super::lex::StrMode;
use super::trie::Grammar;

/// Deepest a parser stack may grow (rules begun and not ended); deeper
/// expansions are dropped (a documented limit).
const MAX_DEPTH: usize = 1024;
/// Most stacks one expansion may visit: a grammar whose rule alone needs
/// more is refused; a step past it is refused.
const MAX_EXPANSION: usize = 20_000;
/// Most stacks the expansions of all rules may visit at compile time.
const MAX_COMPILE_WORK: usize = 1_000_000;
/// Most stack positions the states of one sequence keep; past half of it
/// the states are dropped after a token (all but the current one).
const MAX_POSITIONS: usize = 4_000_000;
/// A refused step, in the memo.
const DEAD: u32 = u32::MAX;
/// A step not yet taken, in the memo.
const UNKNOWN: u32 = u32::MAX - 1;
/// What a row of the memo counts for against `MAX_POSITIONS` (its bytes
/// over a position's).
const ROW_POSITIONS: usize = 1024 / 12;

/// Where a parser is: rule, alternative, element.
type Pos = (u32, u32, u32);

/// One sequence's run of a compiled GBNF grammar: the states reached so far.
#[derive(Debug)]
pub struct Gbnf {
    rules: Arc<Rules>,
    run: Mutex<Run>,
}

#[derive(Debug, Default)]
struct Run {
    states: Vec<Arc<State>>,
    ids: HashMap<Arc<State>, u32>,
    /// Each state's steps by byte (a row once it is first stepped from):
    /// the next state, [`DEAD`], or [`UNKNOWN`].
    steps: Vec<Option<Box<[u32; 256]>>>,
    /// Each state's characters that leave it as it is, where known.
    loops: Vec<Loop>,
    /// Stack positions held by `states`.
    positions: usize,
}

/// What is known of the characters that leave a state as it is.
#[derive(Clone, Copy, Debug, Default)]
enum Loop {
    /// Not asked, and no step found one yet.
    #[default]
    Unknown,
    /// Some byte's step left it as it was: worth finding them all.
    Some,
    /// All of them (none, where the set is empty).
    Known(Option<CharSet>),
}

/// The stacks (sorted, distinct; an empty one: the output may end) and the
/// bytes of a character begun. Beside a character begun, `fresh` holds
/// the stacks at a character's start that a token taken whole left, where
/// its bytes, taken one by one, end inside a character (`feed_token`):
/// the next byte continues the one group or starts a character for the
/// other, never both.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    stacks: Vec<Vec<Pos>>,
    partial: Vec<u8>,
    fresh: Vec<Vec<Pos>>,
}

impl State {
    fn new(stacks: Vec<Vec<Pos>>) -> State {
        State { stacks, partial: Vec::new(), fresh: Vec::new() }
    }

    fn positions(&self) -> usize {
        self.stacks.iter().chain(&self.fresh).map(Vec::len).sum::<usize>() + 1
    }

    /// The stacks at a character's start.
    fn starting(&self) -> &[Vec<Pos>] {
        if self.partial.is_empty() {
            &self.stacks
        } else {
            &self.fresh
        }
    }
}

impl Gbnf {
    /// Compiles GBNF `source`, or says why it cannot: its rules, for
    /// [`Gbnf::run`] per sequence.
    pub fn compile(source: &str) -> Result<Arc<Rules>, String> {
        let rules = Arc::new(parse(source)?);
        let g = Gbnf { rules: rules.clone(), run: Mutex::new(Run::default()) };
        // Every rule's expansion stays within the budget, and all of them
        // within a total one.
        let mut spent = 0;
        for (r, alts) in g.rules.rules.iter().enumerate() {
            for a in 0..alts.len() {
                let mut budget = MAX_EXPANSION;
                let whole = g.expand(vec![(r as u32, a as u32, 0)], &mut Vec::new(), &mut budget);
                spent += MAX_EXPANSION - budget;
                if !whole || spent > MAX_COMPILE_WORK {
                    return Err(format!(
                        "the grammar is too ambiguous: its rules expand to over {MAX_EXPANSION} parser stacks \
                         (one rule) or {MAX_COMPILE_WORK} (all)"
                    ));
                }
            }
        }
        g.start_state().ok_or_else(|| "the grammar's root matches nothing".to_string())?;
        Ok(rules)
    }

    /// A run of `rules` (compiled by [`Gbnf::compile`]) from its start.
    pub fn run(rules: Arc<Rules>) -> Gbnf {
        let g = Gbnf { rules, run: Mutex::new(Run::default()) };
        if let Some(start) = g.start_state() {
            g.intern(start);
        }
        g
    }

    /// Compiles `source` and starts a run of it.
    pub fn new(source: &str) -> Result<Gbnf, String> {
        Gbnf::compile(source).map(Gbnf::run)
    }

    fn start_state(&self) -> Option<State> {
        let root = self.rules.root;
        let mut stacks = Vec::new();
        let mut budget = MAX_EXPANSION;
        for a in 0..self.rules.rules[root as usize].len() {
            if !self.expand(vec![(root, a as u32, 0)], &mut stacks, &mut budget) {
                return None;
            }
        }
        let stacks = tidy(stacks);
        (!stacks.is_empty()).then_some(State::new(stacks))
    }

    /// The first state interned (0): the start, or the one state a copy
    /// or a renewed run begins with.
    pub fn start(&self) -> u32 {
        0
    }

    fn alt(&self, r: u32, a: u32) -> &[Elem] {
        &self.rules.rules[r as usize][a as usize]
    }

    /// Adds to `out` the stacks `stack` leads to with each top at a
    /// character class or a token reference (or empty: the root has ended,
    /// or an end of generation was reached, `Elem::End`). A rule's end
    /// returns to the position after its reference; a reference in last
    /// place is not kept (so that repetitions do not grow the stack). Each
    /// stack is visited once (so loops through rules that match nothing
    /// end), `budget` of them at most: false once it runs out.
    fn expand(&self, stack: Vec<Pos>, out: &mut Vec<Vec<Pos>>, budget: &mut usize) -> bool {
        let mut work = vec![stack];
        let mut seen: HashSet<Vec<Pos>> = HashSet::new();
        while let Some(mut stack) = work.pop() {
            while let Some(&(r, a, i)) = stack.last() {
                if (i as usize) < self.alt(r, a).len() {
                    break;
                }
                stack.pop();
            }
            if !seen.insert(stack.clone()) {
                continue;
            }
            let Some(left) = budget.checked_sub(1) else { return false };
            *budget = left;
            let Some(&(r, a, i)) = stack.last() else {
                out.push(stack);
                continue;
            };
            let alt = self.alt(r, a);
            match alt[i as usize] {
                Elem::Chars { .. } | Elem::Token { .. } | Elem::Named { .. } => out.push(stack),
                Elem::End => out.push(Vec::new()),
                Elem::Rule(t) => {
                    if i as usize + 1 == alt.len() {
                        stack.pop();
                    } else if let Some(top) = stack.last_mut() {
                        *top = (r, a, i + 1);
                    }
                    if stack.len() >= MAX_DEPTH {
                        continue;
                    }
                    for b in 0..self.rules.rules[t as usize].len() {
                        let mut s = stack.clone();
                        s.push((t, b as u32, 0));
                        work.push(s);
                    }
                }
            }
        }
        true
    }

    fn elem(&self, (r, a, i): Pos) -> &Elem {
        &self.alt(r, a)[i as usize]
    }

    fn intern(&self, s: State) -> Option<u32> {
        let mut run = self.run.lock().ok()?;
        if let Some(&id) = run.ids.get(&s) {
            return Some(id);
        }
        let size = s.positions();
        if run.positions + size > MAX_POSITIONS {
            return None;
        }
        let id = run.states.len() as u32;
        let s = Arc::new(s);
        run.states.push(s.clone());
        run.ids.insert(s, id);
        run.positions += size;
        Some(id)
    }

    fn state(&self, id: u32) -> Option<Arc<State>> {
        self.run.lock().ok()?.states.get(id as usize).cloned()
    }

    /// The characters that leave state `s` as it is, if any: the ASCII ones
    /// tried one by one; the others, where every stack's top takes all of
    /// them or none (so that they all step alike), as one of them does.
    fn loop_chars(&self, s: u32) -> Option<CharSet> {
        let ascii = (0..0x80u8).filter(|&b| self.step(s, b) == Some(s)).fold(0u128, |m, b| m | 1 << b);
        let state = self.state(s)?;
        let alike = |top: &Pos| {
            let e = self.elem(*top);
            e.covers(0x80, 0x10ffff) || !e.meets(0x80, 0x10ffff)
        };
        let uniform = state.partial.is_empty() && state.stacks.iter().all(|st| st.last().is_none_or(alike));
        // (U+0080 stands for them all.)
        let non_ascii = uniform && self.step(s, 0xc2).and_then(|t| self.step(t, 0x80)) == Some(s);
        let chars = CharSet { ascii, non_ascii };
        (!chars.is_empty()).then_some(chars)
    }

    /// The state after a token taken whole, from the stacks at a
    /// character's start whose top is a token reference `takes` says it
    /// matches.
    fn whole_step(&self, s: u32, takes: impl Fn(u32, bool) -> bool) -> Option<State> {
        let st = self.state(s)?;
        let mut out = Vec::new();
        let mut budget = MAX_EXPANSION;
        for stack in st.starting() {
            let Some(&top) = stack.last() else { continue };
            if let &Elem::Token { id, negated } = self.elem(top) {
                if takes(id, negated) {
                    let mut moved = stack.clone();
                    *moved.last_mut()? = (top.0, top.1, top.2 + 1);
                    if !self.expand(moved, &mut out, &mut budget) {
                        return None;
                    }
                }
            }
        }
        let stacks = tidy(out);
        (!stacks.is_empty()).then_some(State::new(stacks))
    }

    /// The state after byte `b`, computed (its step not yet memoized).
    fn next(&self, s: &State, b: u8) -> Option<State> {
        if !s.partial.is_empty() && !(0x80..=0xbf).contains(&b) {
            // A character starts: only the stacks at a start can take it.
            return if s.fresh.is_empty() { None } else { self.next(&State::new(s.fresh.clone()), b) };
        }
        let mut partial = s.partial.clone();
        partial.push(b);
        match utf8_prefix(&partial)? {
            Prefix::Whole(cp) => {
                let mut out = Vec::new();
                let mut budget = MAX_EXPANSION;
                for st in &s.stacks {
                    if let Some(&top) = st.last() {
                        if self.elem(top).matches(cp) {
                            let mut moved = st.clone();
                            *moved.last_mut()? = (top.0, top.1, top.2 + 1);
                            if !self.expand(moved, &mut out, &mut budget) {
                                return None;
                            }
                        }
                    }
                }
                let stacks = tidy(out);
                (!stacks.is_empty()).then_some(State::new(stacks))
            }
            Prefix::Begun(lo, hi) => {
                let live = s.stacks.iter().any(|st| st.last().is_some_and(|&top| self.elem(top).meets(lo, hi)));
                live.then(|| State { stacks: s.stacks.clone(), partial, fresh: Vec::new() })
            }
        }
    }
}

impl Grammar for Gbnf {
    type State = u32;
    fn step(&self, s: u32, b: u8) -> Option<u32> {
        {
            let run = self.run.lock().ok()?;
            match run.steps.get(s as usize).and_then(Option::as_ref).map(|row| row[b as usize]) {
                Some(DEAD) => return None,
                Some(UNKNOWN) | None => {}
                Some(next) => return Some(next),
            }
        }
        let next = self.next(&*self.state(s)?, b).and_then(|n| self.intern(n));
        let mut run = self.run.lock().ok()?;
        let s = s as usize;
        if run.steps.len() <= s {
            run.steps.resize_with(s + 1, || None);
        }
        if run.steps[s].is_none() {
            run.positions += ROW_POSITIONS;
            run.steps[s] = Some(Box::new([UNKNOWN; 256]));
        }
        if let Some(row) = run.steps[s].as_mut() {
            row[b as usize] = next.unwrap_or(DEAD);
        }
        if next == Some(s as u32) {
            if run.loops.len() <= s {
                run.loops.resize(s + 1, Loop::Unknown);
            }
            if let Loop::Unknown = run.loops[s] {
                run.loops[s] = Loop::Some;
            }
        }
        next
    }
    /// (Those whose stacks go on: none cut at the depth limit.)
    fn whole_tokens(&self, s: &u32) -> Vec<(u32, bool)> {
        let Some(st) = self.state(*s) else { return Vec::new() };
        let tops = st.starting().iter().filter_map(|stack| match self.elem(*stack.last()?) {
            &Elem::Token { id, negated } => Some((id, negated)),
            _ => None,
        });
        let mut out: Vec<(u32, bool)> = tops.collect();
        out.sort_unstable();
        out.dedup();
        out.retain(|&e| self.whole_step(*s, |id, negated| (id, negated) == e).is_some());
        out
    }
    /// Stacks that take the token whole and stacks that take its bytes go
    /// on together (where its bytes end inside a character, apart: the
    /// whole token's as `fresh`).
    fn feed_token(&self, s: u32, id: u32, bytes: Option<&[u8]>) -> Option<u32> {
        let by_bytes = bytes.and_then(|b| b.iter().try_fold(s, |s, &b| self.step(s, b)));
        let Some(mut whole) = self.whole_step(s, |t, negated| (t == id) != negated) else { return by_bytes };
        if let Some(b) = by_bytes.and_then(|b| self.state(b)) {
            let mut starting = whole.stacks;
            starting.extend(b.starting().iter().cloned());
            let starting = tidy(starting);
            whole = if b.partial.is_empty() {
                State::new(starting)
            } else {
                State { stacks: b.stacks.clone(), partial: b.partial.clone(), fresh: starting }
            };
        }
        self.intern(whole)
    }
    /// Found once some byte's step has left `s` as it was.
    fn free_run(&self, s: &u32, _: usize) -> Option<FreeRun> {
        let known = self.run.lock().ok()?.loops.get(*s as usize).copied().unwrap_or_default();
        let chars = match known {
            Loop::Unknown => None,
            Loop::Known(chars) => chars,
            Loop::Some => {
                let chars = self.loop_chars(*s);
                if let Some(l) = self.run.lock().ok()?.loops.get_mut(*s as usize) {
                    *l = Loop::Known(chars);
                }
                chars
            }
        };
        Some(FreeRun { chars: chars?, sub: StrMode::Plain })
    }
    fn may_end(&self, s: &u32) -> bool {
        self.state(*s).is_some_and(|st| st.starting().iter().any(Vec::is_empty))
    }
    fn is_complete(&self, s: &u32) -> bool {
        self.state(*s).is_some_and(|st| st.partial.is_empty() && st.stacks.iter().all(Vec::is_empty))
    }
    /// A run of its own, from `s`.
    fn fork(this: &Arc<Self>, s: u32) -> (Arc<Self>, u32) {
        let copy = Gbnf { rules: this.rules.clone(), run: Mutex::new(Run::default()) };
        if let Some(state) = this.state(s) {
            copy.intern(State::clone(&state));
        }
        let start = copy.start();
        (Arc::new(copy), start)
    }
    /// Past half the positions' budget, all states but `s` are dropped.
    fn renew(&self, s: u32) -> u32 {
        let Some(keep) = self.state(s) else { return s };
        match self.run.lock() {
            Ok(mut run) if run.positions > MAX_POSITIONS / 2 => *run = Run::default(),
            _ => return s,
        }
        self.intern(State::clone(&keep));
        self.start()
    }
}

fn tidy(mut stacks: Vec<Vec<Pos>>) -> Vec<Vec<Pos>> {
    stacks.sort_unstable();
    stacks.dedup();
    stacks
}

/// Bytes of UTF-8 so far: a whole character, or the code points a begun
/// one may still become.
enum Prefix {
    Whole(u32),
    Begun(u32, u32),
}

/// `None` where the bytes begin no valid character (overlong forms,
/// surrogates and code points past U+10FFFF excluded).
fn utf8_prefix(bytes: &[u8]) -> Option<Prefix> {
    let lead = bytes[0];
    let (len, bits) = match lead {
        0x00..=0x7f => return Some(Prefix::Whole(lead as u32)),
        0xc2..=0xdf => (2, lead as u32 & 0x1f),
        0xe0..=0xef => (3, lead as u32 & 0x0f),
        0xf0..=0xf4 => (4, lead as u32 & 0x07),
        _ => return None,
    };
    // The second byte's range, narrower after some leads.
    let (lo2, hi2) = match lead {
        0xe0 => (0xa0, 0xbf),
        0xed => (0x80, 0x9f),
        0xf0 => (0x90, 0xbf),
        0xf4 => (0x80, 0x8f),
        _ => (0x80, 0xbf),
    };
    let mut cp = bits;
    for (k, &b) in bytes[1..].iter().enumerate() {
        let ok = if k == 0 { (lo2..=hi2).contains(&b) } else { (0x80..=0xbf).contains(&b) };
        if !ok {
            return None;
        }
        cp = cp << 6 | (b as u32 & 0x3f);
    }
    let left = len - bytes.len();
    if left == 0 {
        return Some(Prefix::Whole(cp));
    }
    // Still to come: the lowest and highest continuations.
    let (mut lo, mut hi) = (cp, cp);
    for k in 0..left {
        let first = bytes.len() == 1 && k == 0;
        let (l, h) = if first { (lo2, hi2) } else { (0x80, 0xbf) };
        lo = lo << 6 | (l as u32 & 0x3f);
        hi = hi << 6 | (h as u32 & 0x3f);
    }
    Some(Prefix::Begun(lo, hi))
}

#[cfg(test)]
#[path = "gbnf_tests.rs"]
mod tests;
