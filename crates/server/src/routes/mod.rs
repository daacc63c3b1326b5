//! HTTP handlers, one file per group of endpoints.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod messages;
pub mod misc;
pub mod models;
pub mod responses;
pub mod tei;
pub mod tokenize;
