//! The byte-level grammar of a compiled [`Schema`]: a stack of open
//! containers (each its node and how far it has got) and what the next bytes
//! may be. Every accepted prefix can still be completed: a container opens
//! only when the frames left can hold the deepest value it needs, an
//! object's `}` waits for its required keys, and an array's `]` for its
//! `minItems`.

use super::free_run::{CharSet, FreeRun};
use super::lex::{is_ws, str_step, StrMode, StrStep, ESCAPES, MAX_WS_RUN};
use super::number::{NumPos, DECIMALS};
use super::pattern::starts_char;
use super::schema::{Node, Prop, Schema, MAX_FRAMES};
use super::trie::Grammar;

/// An open container: its node and, for an object, the index of the next
/// property that may come; for an array, the items so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Frame {
    node: u16,
    pos: u32,
}

/// What the next bytes may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lex {
    /// A value of `node` (whitespace first allowed).
    Value { node: u16 },
    /// After `{`: a key or `}`.
    ObjOpen,
    /// After `,` in an object: a key.
    ObjNext,
    /// In a listed property's name: the keys (bit `j` for property `j`) that
    /// still match, `pos` bytes of them (quotes included) read.
    Key { cands: u64, pos: u16 },
    /// In a free key (of an object with `additionalProperties`).
    MapKey(StrMode),
    /// After a key: `:`, then a value of `node`.
    Colon { node: u16 },
    /// After `[`: a value or `]`.
    ArrOpen,
    /// After a value: `,` or the innermost container's close.
    AfterValue,
    /// After the first key of a union of objects that several of them
    /// begin with (bit `i` for alternative `i`): `:`, then their tags.
    TagColon { cands: u64 },
    /// In that key's value: the candidates' tags that still match.
    Tag { cands: u64, pos: u16 },
    /// In a string value of `node`, `len` characters long so far (with a
    /// pattern: begun, counted at their first byte), `re` its pattern's
    /// state.
    Str { sub: StrMode, node: u16, len: u32, re: u32 },
    /// In a number of `node`, how far (for its bounds).
    Num { node: u16, at: NumPos },
    /// In a literal of `node`: the candidates that still match, `pos` bytes read.
    Lit { node: u16, cands: u64, pos: u16 },
    /// The value is complete; only the end of generation may follow.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SchemaState {
    stack: [Frame; MAX_FRAMES],
    depth: u8,
    lex: Lex,
    /// Length of the current whitespace run.
    ws: u8,
}

impl SchemaState {
    pub(crate) fn start(s: &Schema) -> SchemaState {
        SchemaState { stack: [Frame::default(); MAX_FRAMES], depth: 0, lex: Lex::Value { node: s.root }, ws: 0 }
    }

    /// True once the output is a whole value: the end of generation may come
    /// (a top-level number or literal may also go on).
    pub(crate) fn complete(&self, s: &Schema) -> bool {
        match self.lex {
            Lex::Done => true,
            Lex::Num { node, at } => {
                let &Node::Number { integer, bounds } = s.node(node) else { return false };
                self.depth == 0 && at.ends_within(scale(integer), bounds)
            }
            Lex::Lit { node, cands, pos } => self.depth == 0 && lit_complete(s, node, cands, pos),
            _ => false,
        }
    }

    /// True once the value is whole and nothing but the end may follow.
    pub(crate) fn is_done(&self) -> bool {
        self.lex == Lex::Done
    }

    fn top(&self) -> Frame {
        self.stack[self.depth as usize - 1]
    }

    fn top_mut(&mut self) -> &mut Frame {
        &mut self.stack[self.depth as usize - 1]
    }

    /// Whether a value of `node` fits in the frames left.
    fn fits(&self, s: &Schema, node: u16) -> bool {
        s.min_depth[node as usize].saturating_add(self.depth as usize) <= MAX_FRAMES
    }

    /// A value has ended: what follows it.
    fn value_done(mut self, s: &Schema) -> SchemaState {
        if self.depth == 0 {
            self.lex = Lex::Done;
            return self;
        }
        if let Node::Array { .. } = s.node(self.top().node) {
            self.top_mut().pos += 1;
        }
        self.lex = Lex::AfterValue;
        self
    }

    /// The keys (as a bit mask of property indices) that may come next in the
    /// innermost object: the next listed ones up to and including the first
    /// required one, those whose values fit.
    fn key_cands(&self, s: &Schema) -> u64 {
        if self.at_union_tag(s) {
            let Node::Tagged { alts, .. } = s.node(self.top().node) else { return 0 };
            // Any alternative whose value fits where the union's frame opened.
            let outer = self.depth as usize - 1;
            let fit = |&a: &u16| s.min_depth[a as usize].saturating_add(outer) <= MAX_FRAMES;
            return narrow(ALL, alts.len(), |i| fit(&alts[i]));
        }
        let Some(props) = self.object_props(s) else { return 0 };
        let mut cands = 0u64;
        for (j, p) in props.iter().enumerate().skip(self.top().pos as usize) {
            if self.fits(s, p.node) {
                cands |= 1 << j;
            }
            if p.required {
                break;
            }
        }
        cands
    }

    /// Whether the innermost object may close: no required key is left.
    fn may_close_object(&self, s: &Schema) -> bool {
        match s.node(self.top().node) {
            Node::Object { props } => !props.iter().skip(self.top().pos as usize).any(|p| p.required),
            Node::Map { .. } => true,
            _ => false,
        }
    }

    /// The first byte of a value of `node`.
    fn start_value(mut self, s: &Schema, node: u16, b: u8) -> Option<SchemaState> {
        if !self.fits(s, node) || !s.starts_with(node, b) {
            return None;
        }
        self.lex = match s.node(node) {
            Node::Union(alts) => {
                let alt = alts.iter().copied().find(|&a| self.fits(s, a) && s.starts_with(a, b))?;
                return self.start_value(s, alt, b);
            }
            Node::Object { .. } | Node::Map { .. } | Node::Array { .. } | Node::Tagged { .. } => {
                self.stack[self.depth as usize] = Frame { node, pos: 0 };
                self.depth += 1;
                if b == b'[' {
                    Lex::ArrOpen
                } else {
                    Lex::ObjOpen
                }
            }
            Node::String { pattern, .. } => {
                let re = pattern.map_or(0, |p| s.patterns[p as usize].start());
                Lex::Str { sub: StrMode::Plain, node, len: 0, re }
            }
            &Node::Number { integer, bounds } => Lex::Num { node, at: NumPos::start(b, scale(integer), bounds)? },
            Node::Literals(lits) => {
                let cands = narrow(ALL, lits.len(), |i| lits[i][0] == b);
                return Some(self.in_literal(s, node, cands, 1));
            }
        };
        Some(self)
    }

    /// In a literal after `pos` bytes: it ends here when no candidate is
    /// longer, so that a whole top-level value needs nothing more.
    fn in_literal(mut self, s: &Schema, node: u16, cands: u64, pos: u16) -> SchemaState {
        let Node::Literals(lits) = s.node(node) else { return self };
        if narrow(cands, lits.len(), |i| lits[i].len() > pos as usize) == 0 {
            return self.value_done(s);
        }
        self.lex = Lex::Lit { node, cands, pos };
        self
    }

    /// The union of objects in the innermost frame becomes its alternative
    /// `i`, the property that told it read up to the value.
    fn choose(mut self, s: &Schema, i: usize) -> SchemaState {
        if let &Node::Tagged { ref alts, shared, .. } = s.node(self.top().node) {
            *self.top_mut() = Frame { node: alts[i], pos: shared + 1 };
        }
        self
    }

    /// Whether the innermost frame is a union of objects past the
    /// properties its objects share: the next key tells them apart.
    fn at_union_tag(&self, s: &Schema) -> bool {
        matches!(s.node(self.top().node), &Node::Tagged { shared, .. } if self.top().pos == shared)
    }

    /// The listed properties of the innermost frame: an object's, or, while
    /// in the properties a union's objects share, its first object's.
    fn object_props<'s>(&self, s: &'s Schema) -> Option<&'s [Prop]> {
        match s.node(self.top().node) {
            Node::Object { props } => Some(props),
            &Node::Tagged { ref alts, shared, .. } if self.top().pos < shared => match s.node(alts[0]) {
                Node::Object { props } => Some(&props[..shared as usize]),
                _ => None,
            },
            _ => None,
        }
    }

    /// In a union's tag after `pos` bytes: chosen once no candidate's tag is longer.
    fn in_tag(mut self, s: &Schema, cands: u64, pos: u16) -> SchemaState {
        let Node::Tagged { tags, .. } = s.node(self.top().node) else { return self };
        let len = |i: usize| tags[i].as_ref().map_or(0, Vec::len);
        if narrow(cands, tags.len(), |i| len(i) > pos as usize) == 0 {
            if let Some(i) = first(narrow(cands, tags.len(), |i| len(i) == pos as usize)) {
                let mut st = self.choose(s, i);
                st.lex = Lex::AfterValue;
                return st;
            }
        }
        self.lex = Lex::Tag { cands, pos };
        self
    }

    fn close(mut self, s: &Schema) -> SchemaState {
        self.depth -= 1;
        self.value_done(s)
    }

    /// A byte of a string with pattern `p`: its content, decoded, steps the
    /// pattern (whose state also bounds the length); an escape is taken
    /// only where one of its characters may come, `\u` never (so the
    /// content holds no other control characters).
    fn pattern_step(mut self, s: &Schema, p: u16, b: u8) -> Option<SchemaState> {
        let Lex::Str { sub, node, len, re } = self.lex else { return None };
        let pat = &s.patterns[p as usize];
        let (sub, decoded) = match (sub, b) {
            (StrMode::Plain, b'"') => return pat.accepts(re, len).then(|| self.value_done(s)),
            (StrMode::Plain, b'\\') => {
                ESCAPES.iter().find(|&&(_, d)| pat.step(re, d, len).is_some())?;
                self.lex = Lex::Str { sub: StrMode::Escape, node, len, re };
                return Some(self);
            }
            (StrMode::Escape, _) => (StrMode::Plain, ESCAPES.iter().find(|&&(e, _)| e == b)?.1),
            _ => match str_step(sub, b)? {
                StrStep::In(next) => (next, b),
                StrStep::End => return None,
            },
        };
        let re = pat.step(re, decoded, len)?;
        let len = len + u32::from(starts_char(decoded));
        self.lex = Lex::Str { sub, node, len, re };
        Some(self)
    }

    pub(crate) fn step(mut self, s: &Schema, b: u8) -> Option<SchemaState> {
        match self.lex {
            Lex::Str { sub, node, len, re } => {
                if let &Node::String { pattern: Some(p), .. } = s.node(node) {
                    return self.pattern_step(s, p, b);
                }
                // Between characters: a new one only below maxLength, the
                // end only from minLength on.
                if let (StrMode::Plain, &Node::String { min, max, .. }) = (sub, s.node(node)) {
                    if (b == b'"' && len < min) || (b != b'"' && len >= max) {
                        return None;
                    }
                }
                return Some(match str_step(sub, b)? {
                    StrStep::In(next) => {
                        // Every character ends back in Plain (a surrogate pair once).
                        let len = if next == StrMode::Plain { len + 1 } else { len };
                        SchemaState { lex: Lex::Str { sub: next, node, len, re }, ..self }
                    }
                    StrStep::End => self.value_done(s),
                });
            }
            Lex::MapKey(sub) => {
                self.lex = match str_step(sub, b)? {
                    StrStep::In(sub) => Lex::MapKey(sub),
                    StrStep::End => match s.node(self.top().node) {
                        &Node::Map { values } => Lex::Colon { node: values },
                        _ => return None,
                    },
                };
                return Some(self);
            }
            Lex::Key { cands, pos } if self.at_union_tag(s) => {
                let &Node::Tagged { ref alts, shared, .. } = s.node(self.top().node) else { return None };
                let tag_prop = |i: usize| match s.node(alts[i]) {
                    Node::Object { props } => props.get(shared as usize),
                    _ => None,
                };
                let first_key = |i: usize| tag_prop(i).map_or(&[][..], |p| &p.key[..]);
                let pos = pos as usize;
                let matched = narrow(cands, alts.len(), |i| first_key(i).get(pos) == Some(&b));
                let done = narrow(matched, alts.len(), |i| first_key(i).len() == pos + 1);
                let next = matched & !done;
                self.lex = if done.count_ones() == 1 {
                    // The name alone tells: that object, the property's value next.
                    let i = done.trailing_zeros() as usize;
                    let node = tag_prop(i)?.node;
                    self = self.choose(s, i);
                    Lex::Colon { node }
                } else if done != 0 {
                    Lex::TagColon { cands: done }
                } else if next != 0 {
                    Lex::Key { cands: next, pos: pos as u16 + 1 }
                } else {
                    return None;
                };
                return Some(self);
            }
            Lex::Tag { cands, pos } if pos > 0 || !is_ws(b) => {
                self.ws = 0;
                let Node::Tagged { tags, .. } = s.node(self.top().node) else { return None };
                let at = |i: usize| tags[i].as_ref().and_then(|t| t.get(pos as usize));
                let next = narrow(cands, tags.len(), |i| at(i) == Some(&b));
                if next != 0 {
                    return Some(self.in_tag(s, next, pos + 1));
                }
                // A byte past a whole tag (a number's) ends it.
                let whole =
                    first(narrow(cands, tags.len(), |i| tags[i].as_ref().is_some_and(|t| t.len() == pos as usize)));
                let i = whole.filter(|_| pos > 0)?;
                self = self.choose(s, i);
                self.lex = Lex::AfterValue;
            }
            Lex::Key { cands, pos } => {
                let props = self.object_props(s)?;
                let pos = pos as usize;
                let next = narrow(cands, props.len(), |j| props[j].key.get(pos) == Some(&b));
                // The closing quote: keys differ, so this one alone.
                if let Some(j) = first(narrow(next, props.len(), |j| props[j].key.len() == pos + 1)) {
                    self.top_mut().pos = j as u32 + 1;
                    self.lex = Lex::Colon { node: props[j].node };
                    return Some(self);
                }
                if next == 0 {
                    return None;
                }
                self.lex = Lex::Key { cands: next, pos: pos as u16 + 1 };
                return Some(self);
            }
            Lex::Num { node, at } => {
                let &Node::Number { integer, bounds } = s.node(node) else { return None };
                if let Some(at) = at.step(b, integer, bounds) {
                    self.lex = Lex::Num { node, at };
                    return Some(self);
                }
                if !at.ends_within(scale(integer), bounds) {
                    return None;
                }
                // A byte that cannot continue the number ends it.
                self = self.value_done(s);
            }
            Lex::Lit { node, cands, pos } => {
                let Node::Literals(lits) = s.node(node) else { return None };
                let next = narrow(cands, lits.len(), |i| lits[i].get(pos as usize) == Some(&b));
                if next != 0 {
                    return Some(self.in_literal(s, node, next, pos + 1));
                }
                if !lit_complete(s, node, cands, pos) {
                    return None;
                }
                self = self.value_done(s);
            }
            _ => {}
        }
        if let (true, Lex::Value { node }) = (s.raw, self.lex) {
            return self.start_value(s, node, b);
        }
        if is_ws(b) {
            let between = !matches!(self.lex, Lex::Done);
            if !between || self.ws >= MAX_WS_RUN {
                return None;
            }
            self.ws += 1;
            return Some(self);
        }
        self.ws = 0;
        match (self.lex, b) {
            (Lex::Value { node }, _) => return self.start_value(s, node, b),
            (Lex::ObjOpen | Lex::AfterValue, b'}') if self.depth > 0 && self.may_close_object(s) => {
                return Some(self.close(s));
            }
            (Lex::ObjOpen | Lex::ObjNext, b'"') => {
                self.lex = match s.node(self.top().node) {
                    &Node::Map { values } if self.fits(s, values) => Lex::MapKey(StrMode::Plain),
                    Node::Map { .. } => return None,
                    _ => {
                        let cands = self.key_cands(s);
                        if cands == 0 {
                            return None;
                        }
                        Lex::Key { cands, pos: 1 }
                    }
                };
            }
            (Lex::Colon { node }, b':') => self.lex = Lex::Value { node },
            (Lex::TagColon { cands }, b':') => self.lex = Lex::Tag { cands, pos: 0 },
            (Lex::ArrOpen | Lex::AfterValue, b']') => {
                let &Node::Array { min, .. } = s.node(self.top().node) else { return None };
                if self.top().pos < min {
                    return None;
                }
                return Some(self.close(s));
            }
            (Lex::ArrOpen, _) => {
                let &Node::Array { items, max, .. } = s.node(self.top().node) else { return None };
                if max == 0 {
                    return None;
                }
                return self.start_value(s, items, b);
            }
            (Lex::AfterValue, b',') if self.depth > 0 => {
                self.lex = match s.node(self.top().node) {
                    Node::Object { .. } | Node::Tagged { .. } if self.key_cands(s) != 0 => Lex::ObjNext,
                    &Node::Map { values } if self.fits(s, values) => Lex::ObjNext,
                    &Node::Array { items, max, .. } if self.top().pos < max && self.fits(s, items) => {
                        Lex::Value { node: items }
                    }
                    _ => return None,
                };
            }
            _ => return None,
        }
        Some(self)
    }
}

/// Every candidate: sets of candidates are bit masks (bit `i` for candidate `i`).
const ALL: u64 = u64::MAX;

/// The candidates `i < n` of `cands` for which `keep(i)`.
fn narrow(cands: u64, n: usize, keep: impl Fn(usize) -> bool) -> u64 {
    (0..n).filter(|&i| cands >> i & 1 == 1 && keep(i)).fold(0, |m, i| m | 1 << i)
}

/// The lowest candidate of `cands`, if any.
fn first(cands: u64) -> Option<usize> {
    (cands != 0).then(|| cands.trailing_zeros() as usize)
}

/// The units of a number node's bounds: 10^-scale.
fn scale(integer: bool) -> u32 {
    if integer {
        0
    } else {
        DECIMALS
    }
}

/// Whether one of the candidates is exactly `pos` bytes long.
fn lit_complete(s: &Schema, node: u16, cands: u64, pos: u16) -> bool {
    let Node::Literals(lits) = s.node(node) else { return false };
    narrow(cands, lits.len(), |i| lits[i].len() == pos as usize) != 0
}

impl Grammar for Schema {
    type State = SchemaState;
    fn step(&self, st: SchemaState, b: u8) -> Option<SchemaState> {
        st.step(self, b)
    }
    fn free_run(&self, st: &SchemaState, longest: usize) -> Option<FreeRun> {
        let sub = match st.lex {
            // Under a maxLength, only while any token fits in the room left
            // (a byte adds at most one character); then byte by byte.
            Lex::Str { sub, node, len, .. } => match self.node(node) {
                &Node::String { max, pattern: None, .. } if (max - len) as usize >= longest => sub,
                _ => return None,
            },
            Lex::MapKey(sub) => sub,
            _ => return None,
        };
        Some(FreeRun { chars: CharSet::JSON_STRING, sub })
    }
    fn may_end(&self, st: &SchemaState) -> bool {
        st.complete(self)
    }
    /// (A top-level number is whole but may go on: it ends with the end of
    /// generation.)
    fn is_complete(&self, st: &SchemaState) -> bool {
        st.is_done()
    }
}
