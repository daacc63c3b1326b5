//! Byte-level BPE as llama.cpp runs it for `tokenizer.ggml.model = "gpt2"`:
//! split the text with the pre-tokenizer regexes, map each piece's bytes to the
//! GPT-2 alphabet, then apply merges lowest rank first (ties: the leftmost).
//!
//! Merges are keyed by interned ids instead of strings so the hot loop does no
//! allocation. Strings that appear in merges but not in the vocabulary get ids
//! past the vocabulary; a symbol left with such an id falls back to its bytes,
//! as llama.cpp does for a merged string it cannot find.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ferrite_core::Result;

use super::byte_level;
use super::pretok::PreTokenizer;
use super::vocab::Vocab;

pub(crate) struct Bpe {
    pub pre: PreTokenizer,
    pub ignore_merges: bool,
    n_vocab: u32,
    /// (left, right) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// The interned id of each byte's alphabet character.
    byte_ids: [Option<u32>; 256],
    /// The token whose text is the one-byte string, for ASCII bytes.
    ascii_tokens: [Option<u32>; 128],
}

/// A queued merge; the derived order (rank, then left) is the merge priority.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    /// The ids the two sides had when queued, to spot stale entries.
    l: u32,
    r: u32,
    merged: u32,
}

#[derive(Clone, Copy)]
struct Symbol {
    prev: i32,
    next: i32,
    start: usize,
    len: usize,
    id: Option<u32>,
}

impl Bpe {
    /// `merges` are "left right" strings in rank order.
    pub fn new(pre: PreTokenizer, ignore_merges: bool, vocab: &Vocab, merges: &[String]) -> Bpe {
        let n_vocab = vocab.len() as u32;
        let mut extra: HashMap<String, u32> = HashMap::new();
        let mut intern = |s: &str| -> u32 {
            if let Some(id) = vocab.get(s) {
                return id;
            }
            let next = n_vocab + extra.len() as u32;
            *extra.entry(s.to_string()).or_insert(next)
        };
        let mut table = HashMap::with_capacity(merges.len());
        for (rank, merge) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte, so a
            // merge may start with a space; a line without one never matches.
            let Some(pos) = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&merge[..pos], &merge[pos + 1..]);
            let key = (intern(left), intern(right));
            let merged = intern(&format!("{left}{right}"));
            table.entry(key).or_insert((rank as u32, merged));
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let s = byte_level::byte_to_char(b as u8).to_string();
            *slot = vocab.get(&s).or_else(|| extra.get(&s).copied());
        }
        let mut ascii_tokens = [None; 128];
        for (b, slot) in ascii_tokens.iter_mut().enumerate() {
            *slot = vocab.get(&(b as u8 as char).to_string());
        }
        Bpe { pre, ignore_merges, n_vocab, merges: table, byte_ids, ascii_tokens }
    }

    /// Tokenizes one text fragment (no special tokens in it) onto `out`.
    pub fn tokenize(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
        for word in self.pre.split(text)? {
            self.tokenize_word(vocab, word.as_bytes(), out);
        }
        Ok(())
    }

    fn tokenize_word(&self, vocab: &Vocab, word: &[u8], out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = vocab.get(&byte_level::encode(word)) {
                out.push(id);
                return;
            }
        }
        let n = word.len();
        let mut symbols: Vec<Symbol> = (0..n)
            .map(|i| Symbol {
                prev: i as i32 - 1,
                next: if i + 1 == n { -1 } else { i as i32 + 1 },
                start: i,
                len: 1,
                id: self.byte_ids[word[i] as usize],
            })
            .collect();
        // Min-heap on (rank, left).
        let mut queue = BinaryHeap::new();
        let pair = |symbols: &[Symbol], left: i32, right: i32| -> Option<Reverse<Pair>> {
            if left < 0 || right < 0 {
                return None;
            }
            let (l, r) = (symbols[left as usize].id?, symbols[right as usize].id?);
            let &(rank, merged) = self.merges.get(&(l, r))?;
            Some(Reverse(Pair { rank, left: left as usize, right: right as usize, l, r, merged }))
        };
        for i in 1..n {
            queue.extend(pair(&symbols, i as i32 - 1, i as i32));
        }
        while let Some(Reverse(Pair { left, right, l, r, merged, .. })) = queue.pop() {
            let (ls, rs) = (symbols[left], symbols[right]);
            // Stale if either side has changed since the pair was queued.
            if ls.len == 0 || rs.len == 0 || ls.id != Some(l) || rs.id != Some(r) {
                continue;
            }
            symbols[left].len += rs.len;
            symbols[left].id = Some(merged);
            symbols[right].len = 0;
            symbols[left].next = rs.next;
            if rs.next >= 0 {
                symbols[rs.next as usize].prev = left as i32;
            }
            queue.extend(pair(&symbols, ls.prev, left as i32));
            queue.extend(pair(&symbols, left as i32, rs.next));
        }
        let mut i = if n == 0 { -1 } else { 0 };
        while i >= 0 {
            let sym = symbols[i as usize];
            match sym.id {
                Some(id) if id < self.n_vocab => out.push(id),
                _ => {
                    // llama.cpp looks each byte of the alphabet-encoded string up
                    // as a one-byte token; only ASCII bytes can ever be found.
                    let encoded = byte_level::encode(&word[sym.start..sym.start + sym.len]);
                    out.extend(encoded.bytes().filter(|b| b.is_ascii()).filter_map(|b| self.ascii_tokens[b as usize]));
                }
            }
            i = sym.next;
        }
    }
}
