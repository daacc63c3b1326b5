//! The engine: paged KV block accounting, the runner that executes flat batches,
//! sampling, incremental detokenization and generation.

pub mod blocks;
pub mod detokenizer;
pub mod generate;
pub mod runner;
pub mod sampling;

pub use generate::{generate, FinishReason, GenerateRequest, Generation, TokenEvent};
pub use runner::{Logits, Runner, Sequence};
