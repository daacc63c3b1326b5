//! OpenAI wire types: what clients send (`request`) and what we answer (`response`).

pub mod request;
pub mod response;
