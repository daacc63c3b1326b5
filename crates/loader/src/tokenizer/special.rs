//! Splitting special tokens written literally in the input out of the text
//! before the model's tokenizer sees it.
//!
//! llama.cpp's rule: take the special tokens longest first; for each, cut
//! every (non-overlapping, left to right) occurrence out of the text that is
//! still unclaimed. We find all candidate occurrences with one trie walk and
//! then apply that rule to the candidates, which gives the same result without
//! scanning the text once per special token (Gemma has 6,400 of them).

use std::collections::BTreeMap;

/// A piece of input: plain text, or a special token cut out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Default)]
struct Node {
    children: Vec<(u8, u32)>,
    /// (priority, token id) of the token ending here; lower priority wins.
    token: Option<(u32, u32)>,
}

/// A trie over the special tokens' bytes.
pub(crate) struct SpecialMatcher {
    nodes: Vec<Node>,
}

impl SpecialMatcher {
    /// `specials` are (id, text); empty texts are ignored.
    pub fn new<'a>(specials: impl IntoIterator<Item = (u32, &'a str)>) -> SpecialMatcher {
        let mut list: Vec<(u32, &str)> = specials.into_iter().filter(|(_, t)| !t.is_empty()).collect();
        // Longest first, as llama.cpp; ties (whose order llama.cpp leaves unspecified) by id.
        list.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let mut nodes = vec![Node::default()];
        for (priority, (id, text)) in list.into_iter().enumerate() {
            let mut at = 0usize;
            for &b in text.as_bytes() {
                at = match nodes[at].children.iter().find(|c| c.0 == b) {
                    Some(&(_, next)) => next as usize,
                    None => {
                        nodes.push(Node::default());
                        let next = nodes.len() - 1;
                        nodes[at].children.push((b, next as u32));
                        next
                    }
                };
            }
            nodes[at].token = Some((priority as u32, id));
        }
        SpecialMatcher { nodes }
    }

    fn child(&self, node: usize, b: u8) -> Option<usize> {
        self.nodes[node].children.iter().find(|c| c.0 == b).map(|c| c.1 as usize)
    }

    /// Splits `text` into text fragments and special tokens.
    pub fn partition<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let bytes = text.as_bytes();
        // (priority, start, end, id) for every occurrence of every special token.
        let mut candidates = Vec::new();
        for start in 0..bytes.len() {
            let mut node = 0;
            for (end, &b) in bytes.iter().enumerate().skip(start) {
                match self.child(node, b) {
                    Some(next) => node = next,
                    None => break,
                }
                if let Some((priority, id)) = self.nodes[node].token {
                    candidates.push((priority, start, end + 1, id));
                }
            }
        }
        if candidates.is_empty() {
            return if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
        }
        candidates.sort_unstable();
        // Accepted occurrences, start -> (end, id); they never overlap.
        let mut taken: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        for (_, start, end, id) in candidates {
            let clashes = taken.range(..end).next_back().is_some_and(|(_, &(e, _))| e > start);
            if !clashes {
                taken.insert(start, (end, id));
            }
        }
        let mut out = Vec::with_capacity(taken.len() * 2 + 1);
        let mut pos = 0;
        for (start, (end, id)) in taken {
            // A UTF-8 token found in UTF-8 text starts and ends on char boundaries.
            if start > pos {
                out.push(Fragment::Text(&text[pos..start]));
            }
            out.push(Fragment::Token(id));
            pos = end;
        }
        if pos < text.len() {
            out.push(Fragment::Text(&text[pos..]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Fragment::{Text, Token};
    use super::*;

    #[test]
    fn splits_specials_out() {
        let m = SpecialMatcher::new([(1, "<s>"), (2, "<|im_end|>")]);
        assert_eq!(m.partition("a<s>b<|im_end|>"), [Text("a"), Token(1), Text("b"), Token(2)]);
        assert_eq!(m.partition(""), []);
        assert_eq!(m.partition("plain"), [Text("plain")]);
    }

    #[test]
    fn longest_token_claims_text_first() {
        // "XY" occurs earlier, but the longer "YZW" is cut out first, as in llama.cpp.
        let m = SpecialMatcher::new([(1, "XY"), (2, "YZW")]);
        assert_eq!(m.partition("XYZW"), [Text("X"), Token(2)]);
        let nl = SpecialMatcher::new([(1, "\n"), (2, "\n\n")]);
        assert_eq!(nl.partition("\n\n\n"), [Token(2), Token(1)]);
    }
}
