//! A GBNF grammar ([`super::gbnf`]) as a byte-level [`Grammar`]: the set
//! of parser stacks that the output so far leaves (llama.cpp's way of
//! running its grammars), each stack's top at a character element, plus the
//! bytes of a character begun. Sets are interned as numbered states and
//! their steps memoized, so the vocabulary walk's steps become lookups
//! after the first; the state the walk carries is the number.

use std::collections::HashMap;
use std::sync::Mutex;

use super::gbnf::{parse, Elem, Rules};
use super::lex::StrMode;
use super::trie::Grammar;

/// Most states one grammar may reach (each a set of stacks).
const MAX_STATES: usize = 100_000;
/// Deepest a parser stack may grow (nested rules not yet ended).
const MAX_DEPTH: usize = 256;
/// A refused step, in the memo.
const DEAD: u32 = u32::MAX;

/// Where a parser is: rule, alternative, element.
type Pos = (u32, u32, u32);

/// A compiled GBNF grammar and the states reached so far.
#[derive(Debug)]
pub struct Gbnf {
    rules: Rules,
    run: Mutex<Run>,
}

#[derive(Debug, Default)]
struct Run {
    states: Vec<State>,
    ids: HashMap<State, u32>,
    steps: HashMap<(u32, u8), u32>,
}

/// The stacks (sorted, distinct; an empty one: the output may end) and the
/// bytes of a character begun.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    stacks: Vec<Vec<Pos>>,
    partial: Vec<u8>,
}

impl Gbnf {
    /// Compiles GBNF `source`, or says why it cannot.
    pub fn new(source: &str) -> Result<Gbnf, String> {
        let rules = parse(source)?;
        let g = Gbnf { rules, run: Mutex::new(Run::default()) };
        let mut stacks = Vec::new();
        for a in 0..g.rules.rules[g.rules.root as usize].len() {
            g.expand(vec![(g.rules.root, a as u32, 0)], &mut stacks);
        }
        let start = State { stacks: tidy(stacks), partial: Vec::new() };
        if start.stacks.is_empty() {
            return Err("the grammar's root matches nothing".into());
        }
        g.intern(start);
        Ok(g)
    }

    /// The first state (0).
    pub fn start(&self) -> u32 {
        0
    }

    /// Adds to `out` the stacks `stack` leads to with each top at a
    /// character element (or empty: the root has ended). A rule's end
    /// returns to the position after its reference; a reference in last
    /// place is not kept (so that repetitions do not grow the stack).
    fn expand(&self, mut stack: Vec<Pos>, out: &mut Vec<Vec<Pos>>) {
        loop {
            let Some(&(r, a, i)) = stack.last() else {
                out.push(stack);
                return;
            };
            let alt = &self.rules.rules[r as usize][a as usize];
            match alt.get(i as usize) {
                None => {
                    stack.pop();
                }
                Some(Elem::Chars { .. }) => {
                    out.push(stack);
                    return;
                }
                Some(&Elem::Rule(t)) => {
                    if i as usize + 1 == alt.len() {
                        stack.pop();
                    } else {
                        if let Some(top) = stack.last_mut() {
                            *top = (r, a, i + 1);
                        }
                    }
                    if stack.len() >= MAX_DEPTH {
                        return;
                    }
                    for b in 0..self.rules.rules[t as usize].len() {
                        let mut s = stack.clone();
                        s.push((t, b as u32, 0));
                        self.expand(s, out);
                    }
                    return;
                }
            }
        }
    }

    fn elem(&self, (r, a, i): Pos) -> &Elem {
        &self.rules.rules[r as usize][a as usize][i as usize]
    }

    fn intern(&self, s: State) -> Option<u32> {
        let mut run = self.run.lock().ok()?;
        if let Some(&id) = run.ids.get(&s) {
            return Some(id);
        }
        if run.states.len() >= MAX_STATES {
            return None;
        }
        let id = run.states.len() as u32;
        run.states.push(s.clone());
        run.ids.insert(s, id);
        Some(id)
    }

    fn state(&self, id: u32) -> Option<State> {
        self.run.lock().ok()?.states.get(id as usize).cloned()
    }

    /// The state after byte `b`, computed (its step not yet memoized).
    fn next(&self, s: &State, b: u8) -> Option<State> {
        let mut partial = s.partial.clone();
        partial.push(b);
        match utf8_prefix(&partial)? {
            Prefix::Whole(cp) => {
                let mut out = Vec::new();
                for st in &s.stacks {
                    if let Some(&top) = st.last() {
                        if self.elem(top).matches(cp) {
                            let mut moved = st.clone();
                            *moved.last_mut()? = (top.0, top.1, top.2 + 1);
                            self.expand(moved, &mut out);
                        }
                    }
                }
                let stacks = tidy(out);
                (!stacks.is_empty()).then_some(State { stacks, partial: Vec::new() })
            }
            Prefix::Begun(lo, hi) => {
                let live = s.stacks.iter().any(|st| st.last().is_some_and(|&top| self.elem(top).meets(lo, hi)));
                live.then(|| State { stacks: s.stacks.clone(), partial })
            }
        }
    }
}

impl Grammar for Gbnf {
    type State = u32;
    fn step(&self, s: u32, b: u8) -> Option<u32> {
        if let Some(&next) = self.run.lock().ok()?.steps.get(&(s, b)) {
            return (next != DEAD).then_some(next);
        }
        let next = self.next(&self.state(s)?, b).and_then(|n| self.intern(n));
        self.run.lock().ok()?.steps.insert((s, b), next.unwrap_or(DEAD));
        next
    }
    fn free_string(&self, _: &u32, _: usize) -> Option<StrMode> {
        None
    }
    fn may_end(&self, s: &u32) -> bool {
        self.state(*s).is_some_and(|st| st.partial.is_empty() && st.stacks.iter().any(Vec::is_empty))
    }
    fn is_complete(&self, s: &u32) -> bool {
        self.state(*s).is_some_and(|st| st.partial.is_empty() && st.stacks.iter().all(Vec::is_empty))
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
