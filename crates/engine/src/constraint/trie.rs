//! The vocabulary as a byte trie, walked once per step under a byte-level
//! grammar to find every token that can come next.

use std::fmt;
use std::sync::{Arc, Mutex};

use super::free_run::{run_step, CharSet, FreeRun};
use super::lex::{utf8_class, UTF8_CLASSES};

/// A byte-level grammar whose states are small `Copy` values, so that
/// trying a byte never needs undoing (a grammar that keeps states of its
/// own, GBNF's, numbers them).
pub(crate) trait Grammar {
    type State: Copy + fmt::Debug;
    /// The state after byte `b`, or `None` if no valid output has this prefix.
    fn step(&self, s: Self::State, b: u8) -> Option<Self::State>;
    /// Where `s` is inside a run of free text (characters of a set, each
    /// of which leaves the grammar where it is, at least `longest` more of
    /// them: the longest token's bytes), the run: the walk then accepts whole
    /// subtrees of the run's characters.
    fn free_run(&self, s: &Self::State, longest: usize) -> Option<FreeRun>;
    /// Whether the output may end at `s` (the end of generation is allowed).
    fn may_end(&self, s: &Self::State) -> bool;
    /// Whether nothing but the end of generation can follow `s`.
    fn is_complete(&self, s: &Self::State) -> bool;
    /// The tokens `s` takes whole, whatever their bytes: `(id, negated)`,
    /// that token or (negated) any one but it (GBNF's `<[id]>`, `!<[id]>`).
    fn whole_tokens(&self, _s: &Self::State) -> Vec<(u32, bool)> {
        Vec::new()
    }
    /// The state after token `id` of `bytes` (`None`: it has no text), or
    /// `None` if the grammar refuses it: by default, its bytes stepped.
    fn feed_token(&self, s: Self::State, _id: u32, bytes: Option<&[u8]>) -> Option<Self::State> {
        bytes?.iter().try_fold(s, |s, &b| self.step(s, b))
    }
    /// `s` again, after a token, where the grammar keeps states of its own
    /// and may drop all others.
    fn renew(&self, s: Self::State) -> Self::State {
        s
    }
    /// The grammar and state a copy of a constraint at `s` goes on with:
    /// shared, but where the grammar keeps states of its own, a copy.
    fn fork(this: &Arc<Self>, s: Self::State) -> (Arc<Self>, Self::State)
    where
        Self: Sized,
    {
        (this.clone(), s)
    }
}

/// All token byte strings as a byte trie in preorder: node `i`'s children
/// start at `i + 1` and its subtree ends before `end[i]`. The roots are the
/// nodes for tokens' first bytes.
pub(crate) struct Trie {
    /// The byte on the edge into each node.
    byte: Vec<u8>,
    /// One past the last node of each node's subtree.
    end: Vec<u32>,
    /// Tokens ending at node `i` are `ids[first[i]..first[i + 1]]` (several
    /// ids may share the same bytes); `first` has one extra entry.
    first: Vec<u32>,
    ids: Vec<u32>,
    /// For each set of characters a run of free text has had (JSON strings'
    /// first, a few at most, the oldest dropped): bit `c` of `bits[i]` is
    /// set when, starting in UTF-8 class `c` (see [`UTF8_CLASSES`]), every
    /// path through node `i`'s subtree stays within the set. Most of a
    /// vocabulary is like that for a string's content, and its tokens are
    /// allowed there regardless of the rest of the state, so the walk accepts
    /// such subtrees whole instead of visiting every node.
    runs: Mutex<Vec<(CharSet, Arc<[u8]>)>>,
    /// The longest token, to size the walk's stack.
    max_len: usize,
}

impl Trie {
    /// Builds the trie from the tokens `ids`, inserting them in byte order so
    /// that the preorder layout falls out of a single pass.
    pub(crate) fn new(token_bytes: &[Vec<u8>], mut ids: Vec<u32>) -> Trie {
        ids.sort_unstable_by(|&a, &b| token_bytes[a as usize].cmp(&token_bytes[b as usize]));
        let mut t = Trie {
            byte: Vec::new(),
            end: Vec::new(),
            first: Vec::new(),
            ids: Vec::new(),
            runs: Mutex::new(Vec::new()),
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
        t.run_bits(CharSet::JSON_STRING, true);
        t
    }

    /// The bits of [`Trie::runs`] for `chars`, computed at first use if
    /// `compute` (else only if kept: each computation is a pass over the
    /// whole trie, so a walk computes at most its start's set, however
    /// many sets its grammar switches between). A set used moves to the
    /// back, the front's (after JSON strings') dropped first.
    fn run_bits(&self, chars: CharSet, compute: bool) -> Option<Arc<[u8]>> {
        /// Sets kept (a grammar has a few).
        const KEPT: usize = 16;
        let lock = || self.runs.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut runs = lock();
            if let Some(k) = runs.iter().position(|(c, _)| *c == chars) {
                let bits = runs[k].1.clone();
                if k > 0 {
                    let used = runs.remove(k);
                    runs.push(used);
                }
                return Some(bits);
            }
        }
        if !compute {
            return None;
        }
        let bits: Arc<[u8]> = self.compute_run_bits(chars).into();
        let mut runs = lock();
        if runs.len() >= KEPT {
            runs.remove(1); // (JSON strings' stay first)
        }
        runs.push((chars, bits.clone()));
        Some(bits)
    }

    /// Computes a set's bits of [`Trie::runs`] bottom-up: children come
    /// after their parent in preorder, so a reverse pass sees every child
    /// first.
    fn compute_run_bits(&self, chars: CharSet) -> Vec<u8> {
        let mut bits = vec![0u8; self.byte.len()];
        for i in (0..self.byte.len()).rev() {
            let mut children = u8::MAX;
            let mut c = i + 1;
            while c < self.end[i] as usize {
                children &= bits[c];
                c = self.end[c] as usize;
            }
            for (class, &sub) in UTF8_CLASSES.iter().enumerate() {
                let next = run_step(chars, sub, self.byte[i]).and_then(utf8_class);
                if next.is_some_and(|n| children >> n & 1 == 1) {
                    bits[i] |= 1 << class;
                }
            }
        }
        bits
    }

    /// Sets bit `id` in `allowed` for every token `id` whose bytes `g`
    /// accepts from `start`.
    pub(crate) fn walk<G: Grammar>(&self, g: &G, start: G::State, allowed: &mut [u64]) {
        // The nodes on the current path with the state after each of their
        // bytes and its run of free text (asked for once a node has children).
        let mut path: Vec<(u32, G::State, Option<FreeRun>)> = Vec::with_capacity(self.max_len);
        let start_run = g.free_run(&start, self.max_len);
        // The bits of each set this walk has met (`None`: not kept).
        let mut sets: Vec<(CharSet, Option<Arc<[u8]>>)> = Vec::new();
        if let Some(run) = start_run {
            sets.push((run.chars, self.run_bits(run.chars, true)));
        }
        let mut i = 0;
        while i < self.byte.len() {
            while path.last().is_some_and(|&(end, ..)| end as usize <= i) {
                path.pop();
            }
            let (parent, run) = path.last().map_or((start, start_run), |&(_, s, run)| (s, run));
            let end = self.end[i] as usize;
            if let Some(run) = run {
                // (A few dozen sets looked for at most, each once.)
                let bits = match sets.iter().position(|(c, _)| *c == run.chars) {
                    Some(k) => sets[k].1.as_ref(),
                    None if sets.len() < 32 => {
                        sets.push((run.chars, self.run_bits(run.chars, false)));
                        sets[sets.len() - 1].1.as_ref()
                    }
                    None => None,
                };
                let set = bits.map_or(0, |b| b[i]);
                if utf8_class(run.sub).is_some_and(|c| set >> c & 1 == 1) {
                    // The whole subtree stays in the run: all allowed.
                    self.mark(i, end, allowed);
                    i = end;
                    continue;
                }
            }
            match g.step(parent, self.byte[i]) {
                Some(s) => {
                    self.mark(i, i + 1, allowed);
                    let run = if end > i + 1 { g.free_run(&s, self.max_len) } else { None };
                    path.push((end as u32, s, run));
                    i += 1;
                }
                None => i = end,
            }
        }
    }

    /// Sets the bits of the tokens ending at nodes `from..to`.
    pub(crate) fn mark(&self, from: usize, to: usize, allowed: &mut [u64]) {
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
    pub(crate) trie: Trie,
    pub(crate) token_bytes: Vec<Vec<u8>>,
    pub(crate) eos_ids: Vec<u32>,
}

impl JsonVocab {
    /// `token_bytes[id]`: the bytes token `id` decodes to (empty for special/control tokens, which only a
    /// grammar's token references allow); `eos_ids`: end-of-generation ids, allowed only where the output may end.
    pub fn new(token_bytes: Vec<Vec<u8>>, eos_ids: &[u32]) -> JsonVocab {
        // An EOS id ends generation whatever its bytes, so it is never a text token.
        let ids = (0..token_bytes.len() as u32)
            .filter(|&id| !token_bytes[id as usize].is_empty() && !eos_ids.contains(&id))
            .collect();
        let trie = Trie::new(&token_bytes, ids);
        JsonVocab { trie, token_bytes, eos_ids: eos_ids.to_vec() }
    }

    /// The vocabulary of `tok`'s first `vocab` ids (special tokens never
    /// allowed; its end-of-generation ids only once the output is whole).
    pub fn for_tokenizer(tok: &ferrite_loader::tokenizer::Tokenizer, vocab: usize) -> JsonVocab {
        let bytes =
            (0..vocab as u32).map(|id| if tok.is_special(id) { Vec::new() } else { tok.token_bytes(id) }).collect();
        JsonVocab::new(bytes, tok.eos_ids())
    }

    pub(crate) fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// The state after token `token` under grammar `g`, or `None` if `g`
    /// refuses it or it is the end of generation or outside the
    /// vocabulary. (A token with no text, a special one, steps only where
    /// the grammar takes it whole.)
    pub(crate) fn feed<G: Grammar>(&self, g: &G, start: G::State, token: u32) -> Option<G::State> {
        let bytes = self.token_bytes.get(token as usize).filter(|_| !self.is_eos(token))?;
        g.feed_token(start, token, Some(&bytes[..]).filter(|b| !b.is_empty()))
    }

    /// Sets the bits of token `id`, or (`negated`) of every token but it,
    /// within the vocabulary and `allowed`; never an end of generation
    /// (which [`JsonVocab::allow_eos`] allows where the output may end).
    pub(crate) fn allow_whole(&self, id: u32, negated: bool, allowed: &mut [u64]) {
        let n = self.token_bytes.len().min(allowed.len() * 64) as u32;
        let mut set = |t: u32| {
            if !self.is_eos(t) {
                allowed[t as usize / 64] |= 1 << (t % 64);
            }
        };
        match negated {
            false if id < n => set(id),
            false => {}
            true => (0..n).filter(|&t| t != id).for_each(set),
        }
    }

    /// Sets the end-of-generation ids' bits (those inside `allowed`).
    pub(crate) fn allow_eos(&self, allowed: &mut [u64]) {
        for &id in &self.eos_ids {
            if (id as usize) < allowed.len() * 64 {
                allowed[id as usize / 64] |= 1 << (id % 64);
            }
        }
    }
}

/// Sets to f32::NEG_INFINITY every logit whose bit in `allowed` is clear.
pub(crate) fn apply(allowed: &[u64], logits: &mut [f32]) {
    for (i, l) in logits.iter_mut().enumerate() {
        if allowed[i / 64] >> (i % 64) & 1 == 0 {
            *l = f32::NEG_INFINITY;
        }
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
