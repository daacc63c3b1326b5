//! SentencePiece-style BPE as llama.cpp runs it for `tokenizer.ggml.model =
//! "llama"`: start from single characters, repeatedly merge the adjacent pair
//! whose concatenation is the highest-scoring vocabulary entry (ties: the
//! leftmost), and spell characters that never became a token as `<0xNN>` bytes.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ferrite_core::{Error, Result};

use super::vocab::Vocab;

/// Scores and byte-fallback ids; the vocabulary itself is shared with the caller.
pub(crate) struct Spm {
    pub scores: Vec<f32>,
    /// The token for each byte: `<0xNN>`, or else the one-byte string itself.
    pub byte_tokens: [Option<u32>; 256],
}

#[derive(Clone, Copy)]
struct Symbol {
    prev: i32,
    next: i32,
    start: usize,
    len: usize,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

// Max-heap order: higher score first, then the smaller left index.
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then(other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

impl Spm {
    pub fn new(scores: Vec<f32>, vocab: &Vocab) -> Spm {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            // Only ASCII bytes can be a one-byte UTF-8 token.
            *slot = vocab
                .get(&format!("<0x{b:02X}>"))
                .or_else(|| (b < 0x80).then(|| vocab.get(&(b as u8 as char).to_string())).flatten());
        }
        Spm { scores, byte_tokens }
    }

    /// Tokenizes `text` (spaces already escaped to "▁") onto `out`.
    pub fn tokenize(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let n_chars = text.chars().count();
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                prev: i as i32 - 1,
                next: if i + 1 == n_chars { -1 } else { i as i32 + 1 },
                start,
                len: c.len_utf8(),
            });
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.try_add(vocab, text, &symbols, &mut queue, i as i32 - 1, i as i32);
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            // Skip pairs made stale by an earlier merge.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += right.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = right.next;
            if right.next >= 0 {
                symbols[right.next as usize].prev = bigram.left as i32;
            }
            self.try_add(vocab, text, &symbols, &mut queue, left.prev, bigram.left as i32);
            self.try_add(vocab, text, &symbols, &mut queue, bigram.left as i32, right.next);
        }
        let mut i = if symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let sym = symbols[i as usize];
            let piece = &text[sym.start..sym.start + sym.len];
            match vocab.get(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        let id = self.byte_tokens[b as usize].ok_or_else(|| {
                            Error::Tokenizer(format!("vocabulary has no byte token <0x{b:02X}> for {piece:?}"))
                        })?;
                        out.push(id);
                    }
                }
            }
            i = sym.next;
        }
        Ok(())
    }

    fn try_add(
        &self,
        vocab: &Vocab,
        text: &str,
        symbols: &[Symbol],
        queue: &mut BinaryHeap<Bigram>,
        left: i32,
        right: i32,
    ) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (symbols[left as usize], symbols[right as usize]);
        let size = l.len + r.len;
        if let Some(id) = vocab.get(&text[l.start..l.start + size]) {
            queue.push(Bigram { score: self.scores[id as usize], left: left as usize, right: right as usize, size });
        }
    }
}
