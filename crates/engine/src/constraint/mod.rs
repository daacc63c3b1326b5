//! Constrained decoding: masks that keep sampled output inside a grammar.

pub mod format;
pub mod json;
mod lex;
pub mod pattern;
mod pattern_syntax;
pub mod schema;
mod schema_grammar;
mod trie;
