//! Constrained decoding: masks that keep sampled output inside a grammar.

pub mod json;
