//! Grammars in GBNF, llama.cpp's notation (and what vLLM's `guided_grammar`
//! takes): `name ::= alternatives` rules over string literals, character
//! classes, `.`, rule references, groups and the repetitions `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`; token references, by id, `<[id]>` (that one
//! token) and `!<[id]>` (any one token but it), or by the token's text,
//! `<think>` and `!<think>` (named in the vocabulary, `Rules::in_vocabulary`);
//! `#` comments; the output is a `root`.
//!
//! Parsing gives rules of alternatives of sequences of elements (a set of
//! characters, a token, or a reference), repetitions rewritten as rules; the
//! automaton that runs them is [`super::gbnf_run`].

use std::collections::HashMap;

/// Longest grammar source accepted.
const MAX_SOURCE: usize = 65_536;
/// Most rules, repetitions' included.
const MAX_RULES: usize = 4096;
/// Largest count in `{m,n}`.
const MAX_REPEAT: u32 = 1000;
/// Most elements in all rules (repetitions copy their item).
const MAX_ELEMS: usize = 200_000;
/// Deepest nesting of parentheses.
const MAX_NESTING: usize = 100;

/// One element of a sequence.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Elem {
    /// One character within `ranges` (inclusive code points), or outside
    /// them if `negated`.
    Chars { ranges: Vec<(u32, u32)>, negated: bool },
    /// Token `id` as a whole, or any one token but it if `negated` (never
    /// an end of generation).
    Token { id: u32, negated: bool },
    /// A token by its text (`<think>`), as `Token` once the vocabulary
    /// names it (`Rules::in_vocabulary`); until then it takes no token.
    Named { text: String, negated: bool },
    /// The output's end, whatever the rules around it would take next (a
    /// reference to an end-of-generation token, `Rules::ending_at`).
    End,
    /// A match of rule `n`.
    Rule(u32),
}

impl Elem {
    pub(crate) fn matches(&self, cp: u32) -> bool {
        match self {
            Elem::Chars { ranges, negated } => ranges.iter().any(|&(a, b)| (a..=b).contains(&cp)) != *negated,
            Elem::Token { .. } | Elem::Named { .. } | Elem::End | Elem::Rule(_) => false,
        }
    }

    /// Whether some character in `lo..=hi` matches.
    pub(crate) fn meets(&self, lo: u32, hi: u32) -> bool {
        match self {
            Elem::Chars { ranges, negated: false } => ranges.iter().any(|&(a, b)| a <= hi && b >= lo),
            Elem::Chars { ranges, negated: true } => !ranges_cover(ranges, lo, hi),
            Elem::Token { .. } | Elem::Named { .. } | Elem::End | Elem::Rule(_) => false,
        }
    }

    /// Whether every character in `lo..=hi` matches.
    pub(crate) fn covers(&self, lo: u32, hi: u32) -> bool {
        match self {
            Elem::Chars { ranges, negated: false } => ranges_cover(ranges, lo, hi),
            Elem::Chars { ranges, negated: true } => !ranges.iter().any(|&(a, b)| a <= hi && b >= lo),
            Elem::Token { .. } | Elem::Named { .. } | Elem::End | Elem::Rule(_) => false,
        }
    }
}

/// Whether `ranges` together hold every point of `lo..=hi`.
fn ranges_cover(ranges: &[(u32, u32)], lo: u32, hi: u32) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut next = lo; // the first point not yet held
    for (a, b) in sorted {
        if a > next {
            break;
        }
        next = next.max(b.saturating_add(1));
        if next > hi {
            return true;
        }
    }
    false
}

/// A parsed grammar: `rules[r]` its alternatives, each a sequence (those
/// that can never end dropped).
#[derive(Clone, Debug)]
pub struct Rules {
    pub(crate) rules: Vec<Vec<Vec<Elem>>>,
    pub(crate) root: u32,
}

impl Rules {
    /// The rules with their tokens named by text (`<think>`) as ids, by
    /// `id_of` (the vocabulary's lookup of a token's text), or why they
    /// cannot be: a name the vocabulary lacks, an id past its `size`.
    pub fn in_vocabulary(&self, size: usize, id_of: impl Fn(&str) -> Option<u32>) -> Result<Rules, String> {
        let mut out = self.clone();
        for e in out.rules.iter_mut().flatten().flatten() {
            if let Elem::Named { text, negated } = e {
                let id = id_of(text).ok_or_else(|| format!("token {text} is not in the model's vocabulary"))?;
                *e = Elem::Token { id, negated: *negated };
            }
            if let Elem::Token { id, .. } = e {
                if *id as usize >= size {
                    return Err(format!("token <[{id}]> is outside the vocabulary ({size} tokens)"));
                }
            }
        }
        Ok(out)
    }

    /// Whether the grammar refers to tokens (by id or text).
    pub fn has_tokens(&self) -> bool {
        self.rules.iter().flatten().flatten().any(|e| matches!(e, Elem::Token { .. } | Elem::Named { .. }))
    }

    /// The rules with each reference to a token of `ends` (the ends of
    /// generation, `<[id]>`) read as the output's end, or `None` where
    /// there is none.
    pub(crate) fn ending_at(&self, ends: &[u32]) -> Option<Rules> {
        let is_end = |e: &Elem| matches!(e, Elem::Token { id, negated: false } if ends.contains(id));
        if !self.rules.iter().flatten().flatten().any(is_end) {
            return None;
        }
        let mut out = self.clone();
        for e in out.rules.iter_mut().flatten().flatten() {
            if is_end(e) {
                *e = Elem::End;
            }
        }
        Some(out)
    }
}

/// Parses GBNF `source`, or says where and why it cannot.
pub(crate) fn parse(source: &str) -> Result<Rules, String> {
    if source.len() > MAX_SOURCE {
        return Err(format!("the grammar is longer than {MAX_SOURCE} bytes"));
    }
    let mut p = Parser {
        src: source.as_bytes(),
        at: 0,
        names: HashMap::new(),
        rules: Vec::new(),
        defined: Vec::new(),
        nesting: 0,
        elems: 0,
    };
    p.space(true);
    while p.at < p.src.len() {
        let name = p.name().ok_or_else(|| p.error("a rule name"))?;
        p.space(false);
        if !p.eat("::=") {
            return Err(p.error("`::=`"));
        }
        let r = p.rule_id(&name)?;
        if p.defined[r as usize] {
            return Err(format!("rule `{name}` is defined twice"));
        }
        p.defined[r as usize] = true;
        p.space(true);
        let alts = p.alternatives(false)?;
        p.rules[r as usize] = alts;
        p.space(true);
    }
    let Some(&root) = p.names.get("root") else { return Err("the grammar has no `root` rule".into()) };
    if let Some((name, _)) = p.names.iter().find(|(_, &r)| !p.defined[r as usize]) {
        return Err(format!("rule `{name}` is used but not defined"));
    }
    let mut rules = Rules { rules: p.rules, root };
    check_left_recursion(&rules, &p.names)?;
    keep_productive(&mut rules)?;
    Ok(rules)
}

/// Drops the alternatives that can never end (a class of no character, a
/// rule that only recurs); refuses a root left with none.
fn keep_productive(g: &mut Rules) -> Result<(), String> {
    let elem_ok = |e: &Elem, productive: &[bool]| match e {
        Elem::Chars { .. } => e.meets(0, 0xd7ff) || e.meets(0xe000, 0x10ffff),
        Elem::Token { .. } | Elem::Named { .. } | Elem::End => true,
        Elem::Rule(t) => productive[*t as usize],
    };
    let productive = rules_where(g, elem_ok);
    if !productive[g.root as usize] {
        return Err("the grammar's root matches no finite text".into());
    }
    for r in 0..g.rules.len() {
        let alts = std::mem::take(&mut g.rules[r]);
        g.rules[r] = alts.into_iter().filter(|alt| alt.iter().all(|e| elem_ok(e, &productive))).collect();
    }
    Ok(())
}

/// The rules with some alternative whose every element is `ok` (given the
/// rules found so far), as a fixed point.
fn rules_where(g: &Rules, ok: impl Fn(&Elem, &[bool]) -> bool) -> Vec<bool> {
    let mut found = vec![false; g.rules.len()];
    loop {
        let mut changed = false;
        for r in 0..g.rules.len() {
            if !found[r] && g.rules[r].iter().any(|alt| alt.iter().all(|e| ok(e, &found))) {
                found[r] = true;
                changed = true;
            }
        }
        if !changed {
            return found;
        }
    }
}

/// Whether `b` may be in a rule's name.
fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

struct Parser<'a> {
    src: &'a [u8],
    at: usize,
    names: HashMap<String, u32>,
    rules: Vec<Vec<Vec<Elem>>>,
    /// Whether each named rule has its `::=` (helper rules count as defined).
    defined: Vec<bool>,
    /// Parentheses open.
    nesting: usize,
    /// Elements in all rules so far.
    elems: usize,
}

impl Parser<'_> {
    fn error(&self, wanted: &str) -> String {
        let line = self.src[..self.at.min(self.src.len())].iter().filter(|&&b| b == b'\n').count() + 1;
        let near: String = String::from_utf8_lossy(&self.src[self.at.min(self.src.len())..]).chars().take(20).collect();
        format!("grammar line {line}: expected {wanted} at {near:?}")
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.at).copied()
    }

    fn eat(&mut self, s: &str) -> bool {
        let ok = self.src[self.at..].starts_with(s.as_bytes());
        if ok {
            self.at += s.len();
        }
        ok
    }

    /// Skips spaces and comments; newlines too where `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | b'\r' => self.at += 1,
                b'\n' if newlines => self.at += 1,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(name_byte) {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.src[start..self.at]).into_owned())
    }

    fn rule_id(&mut self, name: &str) -> Result<u32, String> {
        if let Some(&r) = self.names.get(name) {
            return Ok(r);
        }
        let r = self.new_rule(Vec::new(), false)?;
        self.names.insert(name.to_string(), r);
        Ok(r)
    }

    fn new_rule(&mut self, alts: Vec<Vec<Elem>>, defined: bool) -> Result<u32, String> {
        if self.rules.len() >= MAX_RULES {
            return Err(format!("the grammar needs more than {MAX_RULES} rules"));
        }
        self.rules.push(alts);
        self.defined.push(defined);
        Ok(self.rules.len() as u32 - 1)
    }

    /// Whether a new rule starts here (`name ::=`), which ends the one before.
    fn at_rule_start(&self) -> bool {
        let mut i = self.at;
        while self.src.get(i).is_some_and(|&b| name_byte(b)) {
            i += 1;
        }
        while self.src.get(i).is_some_and(|b| *b == b' ' || *b == b'\t') {
            i += 1;
        }
        i > self.at && self.src[i..].starts_with(b"::=")
    }

    /// Alternatives up to the end of the rule (or, `nested`, a `)`).
    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Elem>>, String> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            self.space(true);
            if !self.eat("|") {
                return Ok(alts);
            }
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Elem>, String> {
        let mut seq = Vec::new();
        loop {
            self.space(nested);
            // Outside parentheses a line break may end the rule: go on only
            // if what follows is no new rule and no `|` (which `alternatives` takes).
            if !nested && self.peek() == Some(b'\n') {
                let save = self.at;
                self.space(true);
                if self.at >= self.src.len() || self.at_rule_start() || self.peek() == Some(b'|') {
                    self.at = save;
                    return Ok(seq);
                }
            }
            match self.peek() {
                None | Some(b'|') | Some(b')') => return Ok(seq),
                _ => {}
            }
            let mut item = self.primary()?;
            // Repetitions, stacked, spaces before them allowed.
            loop {
                let save = self.at;
                self.space(false);
                if !matches!(self.peek(), Some(b'*' | b'+' | b'?' | b'{')) {
                    self.at = save;
                    break;
                }
                item = self.repeat(item)?;
            }
            self.elems += item.len();
            if self.elems > MAX_ELEMS {
                return Err(format!("the grammar needs more than {MAX_ELEMS} elements"));
            }
            seq.extend(item);
        }
    }

    /// One element (a group becomes a rule of its own), as a sequence.
    fn primary(&mut self) -> Result<Vec<Elem>, String> {
        match self.peek() {
            Some(b'"') => {
                self.at += 1;
                let mut seq = Vec::new();
                loop {
                    match self.peek() {
                        None | Some(b'\n') => return Err(self.error("a closing `\"`")),
                        Some(b'"') => {
                            self.at += 1;
                            return Ok(seq);
                        }
                        _ => {
                            let c = self.char()?;
                            seq.push(Elem::Chars { ranges: vec![(c, c)], negated: false });
                        }
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let negated = self.eat("^");
                let mut ranges = Vec::new();
                loop {
                    match self.peek() {
                        None => return Err(self.error("a closing `]`")),
                        Some(b']') => {
                            self.at += 1;
                            return Ok(vec![Elem::Chars { ranges, negated }]);
                        }
                        _ => {
                            let a = self.char()?;
                            let b = if self.peek() == Some(b'-') && self.src.get(self.at + 1) != Some(&b']') {
                                self.at += 1;
                                self.char()?
                            } else {
                                a
                            };
                            if b < a {
                                return Err(self.error("a range in order"));
                            }
                            ranges.push((a, b));
                        }
                    }
                }
            }
            Some(b'.') => {
                self.at += 1;
                Ok(vec![Elem::Chars { ranges: Vec::new(), negated: true }])
            }
            Some(b'(') => {
                self.at += 1;
                self.nesting += 1;
                if self.nesting > MAX_NESTING {
                    return Err(format!("parentheses nest deeper than {MAX_NESTING}"));
                }
                self.space(true);
                let alts = self.alternatives(true)?;
                if !self.eat(")") {
                    return Err(self.error("`)`"));
                }
                self.nesting -= 1;
                Ok(vec![Elem::Rule(self.new_rule(alts, true)?)])
            }
            Some(b'<') => self.token(false),
            Some(b'!') => {
                self.at += 1;
                self.token(true)
            }
            _ => match self.name() {
                Some(name) => Ok(vec![Elem::Rule(self.rule_id(&name)?)]),
                None => Err(self.error("a literal, a class, a group or a rule name")),
            },
        }
    }

    /// A token reference, `<[id]>` or `<text>` (after `!` if `negated`).
    fn token(&mut self, negated: bool) -> Result<Vec<Elem>, String> {
        if self.peek() != Some(b'<') {
            return Err(self.error("a token reference, `<[id]>` or `<text>`, after `!`"));
        }
        if self.eat("<[") {
            let start = self.at;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.at += 1;
            }
            let id = std::str::from_utf8(&self.src[start..self.at]).ok().and_then(|d| d.parse::<u32>().ok());
            return match id {
                Some(id) if self.eat("]>") => Ok(vec![Elem::Token { id, negated }]),
                _ => Err(self.error("a token id and `]>`")),
            };
        }
        // The token's text, brackets and all, on one line.
        let start = self.at;
        let len = self.src[start..].iter().take_while(|&&b| b != b'>' && b != b'\n').count();
        if self.src.get(start + len) != Some(&b'>') || len < 2 {
            return Err(self.error("a token's text and its closing `>`"));
        }
        self.at = start + len + 1;
        let text = String::from_utf8_lossy(&self.src[start..self.at]).into_owned();
        Ok(vec![Elem::Named { text, negated }])
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<u32, String> {
        // (The source is a `str`: its next character is whole.)
        let len = match self.peek().ok_or_else(|| self.error("a character"))? {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        let bytes = self.src.get(self.at..self.at + len).ok_or_else(|| self.error("a character"))?;
        let c =
            std::str::from_utf8(bytes).ok().and_then(|t| t.chars().next()).ok_or_else(|| self.error("a character"))?;
        self.at += c.len_utf8();
        if c != '\\' {
            return Ok(c as u32);
        }
        let e = self.peek().ok_or_else(|| self.error("an escape"))?;
        self.at += 1;
        let hex = |p: &mut Self, n: usize| -> Result<u32, String> {
            let digits = p.src.get(p.at..p.at + n).filter(|d| d.iter().all(u8::is_ascii_hexdigit));
            let digits = digits.and_then(|d| std::str::from_utf8(d).ok());
            let v = digits.and_then(|d| u32::from_str_radix(d, 16).ok()).ok_or_else(|| p.error("hex digits"))?;
            p.at += n;
            char::from_u32(v).map(|c| c as u32).ok_or_else(|| p.error("a valid code point"))
        };
        Ok(match e {
            b'n' => '\n' as u32,
            b'r' => '\r' as u32,
            b't' => '\t' as u32,
            b'x' => hex(self, 2)?,
            b'u' => hex(self, 4)?,
            b'U' => hex(self, 8)?,
            b'\\' | b'"' | b'[' | b']' | b'-' | b'^' => e as u32,
            _ => return Err(self.error("a known escape")),
        })
    }

    /// The repetition after an item, if any, as rules.
    fn repeat(&mut self, item: Vec<Elem>) -> Result<Vec<Elem>, String> {
        let (min, max) = match self.peek() {
            Some(b'*') => (0, None),
            Some(b'+') => (1, None),
            Some(b'?') => (0, Some(1)),
            Some(b'{') => {
                self.at += 1;
                self.space(false);
                let min = self.count()?;
                self.space(false);
                let max = if self.eat(",") {
                    self.space(false);
                    if self.peek() == Some(b'}') {
                        None
                    } else {
                        Some(self.count()?)
                    }
                } else {
                    Some(min)
                };
                self.space(false);
                if self.peek() != Some(b'}') || max.is_some_and(|m| m < min) {
                    return Err(self.error("a repetition `{m}`, `{m,}` or `{m,n}`"));
                }
                (min, max)
            }
            _ => return Ok(item),
        };
        self.at += 1;
        // (An item of several elements repeats as one rule of them.)
        let item = if item.len() > 1 { vec![Elem::Rule(self.new_rule(vec![item], true)?)] } else { item };
        let mut seq: Vec<Elem> = Vec::new();
        for _ in 0..min {
            seq.extend(item.iter().cloned());
        }
        match max {
            // x*: R ::= x R | (nothing)
            None => {
                let r = self.new_rule(Vec::new(), true)?;
                let mut again = item.clone();
                again.push(Elem::Rule(r));
                self.rules[r as usize] = vec![again, Vec::new()];
                seq.push(Elem::Rule(r));
            }
            // Up to k more: R_k ::= x R_(k-1) | (nothing), nested.
            Some(max) => {
                let mut tail: Option<u32> = None;
                for _ in min..max {
                    let mut again = item.clone();
                    again.extend(tail.map(Elem::Rule));
                    tail = Some(self.new_rule(vec![again, Vec::new()], true)?);
                }
                seq.extend(tail.map(Elem::Rule));
            }
        }
        Ok(seq)
    }

    fn count(&mut self) -> Result<u32, String> {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        let n: u32 = std::str::from_utf8(&self.src[start..self.at])
            .ok()
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| self.error("a count"))?;
        if n > MAX_REPEAT {
            return Err(format!("repetition counts are limited to {MAX_REPEAT}"));
        }
        Ok(n)
    }
}

/// Refuses a rule that can reach itself before reading a character where
/// that leaves something after the reference (the parser's stack would
/// grow forever). Reaching itself as the last element of an alternative
/// is harmless (such references are not kept on the stack): `("a"?)*`.
fn check_left_recursion(g: &Rules, names: &HashMap<String, u32>) -> Result<(), String> {
    // Which rules can match nothing.
    let nullable = rules_where(g, |e, nullable| matches!(e, Elem::Rule(t) if nullable[*t as usize]));
    // The rules each reaches at its left edge, and whether something in
    // its alternative follows the reference.
    let left: Vec<Vec<(u32, bool)>> = g
        .rules
        .iter()
        .map(|alts| {
            let mut out = Vec::new();
            for alt in alts {
                for (i, e) in alt.iter().enumerate() {
                    match e {
                        Elem::Rule(t) => {
                            out.push((*t, i + 1 < alt.len()));
                            if !nullable[*t as usize] {
                                break;
                            }
                        }
                        Elem::Chars { .. } | Elem::Token { .. } | Elem::Named { .. } | Elem::End => break,
                    }
                }
            }
            out
        })
        .collect();
    let edges: Vec<Vec<u32>> = left.iter().map(|l| l.iter().map(|&(t, _)| t).collect()).collect();
    let comp = components(&edges);
    for (r, l) in left.iter().enumerate() {
        if let Some(&(t, _)) = l.iter().find(|&&(t, grows)| grows && comp[t as usize] == comp[r]) {
            // (Named by a rule of the cycle, its own before a group's.)
            let named = |x: u32| names.iter().find(|(_, &v)| v == x).map(|(name, _)| name.clone());
            let any = || names.iter().filter(|(_, &v)| comp[v as usize] == comp[r]).map(|(n, _)| n.clone()).min();
            return Err(match named(t).or_else(|| named(r as u32)).or_else(any) {
                Some(name) => format!("rule `{name}` is left-recursive (it can reach itself before any character)"),
                None => "a group is left-recursive (it can reach itself before any character)".into(),
            });
        }
    }
    Ok(())
}

/// The strongly connected components of the graph `edges` (a number per
/// node; Kosaraju's two passes, iterative).
fn components(edges: &[Vec<u32>]) -> Vec<u32> {
    let n = edges.len();
    // First pass: nodes in the order their depth-first searches finish.
    let mut order = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for root in 0..n {
        if seen[root] {
            continue;
        }
        seen[root] = true;
        let mut stack = vec![(root, 0usize)];
        while let Some((v, k)) = stack.last_mut() {
            if let Some(&t) = edges[*v].get(*k) {
                *k += 1;
                if !seen[t as usize] {
                    seen[t as usize] = true;
                    stack.push((t as usize, 0));
                }
            } else {
                order.push(*v);
                stack.pop();
            }
        }
    }
    // Second pass, on the reversed graph, latest finished first.
    let mut back: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (v, out) in edges.iter().enumerate() {
        for &t in out {
            back[t as usize].push(v);
        }
    }
    let mut comp = vec![u32::MAX; n];
    let mut next = 0;
    for &root in order.iter().rev() {
        if comp[root] != u32::MAX {
            continue;
        }
        comp[root] = next;
        let mut stack = vec![root];
        while let Some(v) = stack.pop() {
            for &u in &back[v] {
                if comp[u] == u32::MAX {
                    comp[u] = next;
                    stack.push(u);
                }
            }
        }
        next += 1;
    }
    comp
}
