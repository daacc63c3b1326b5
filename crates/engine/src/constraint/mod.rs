//! Constrained decoding: masks that keep sampled output inside a grammar.

pub mod format;
mod free_run;
pub mod gbnf;
pub mod gbnf_run;
pub mod json;
mod lex;
mod number;
pub mod pattern;
mod pattern_syntax;
pub mod schema;
mod schema_grammar;
mod trie;

/// A seeded xorshift for the grammars' randomized tests: each call picks
/// one of `0..n`.
#[cfg(test)]
fn picker(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}
