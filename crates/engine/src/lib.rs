//! The engine: paged KV block accounting, the runner that executes flat batches,
//! sampling, incremental detokenization and generation.

pub mod blocks;
pub mod constraint;
pub mod detokenizer;
pub mod embed;
pub mod generate;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod serving;

pub use generate::{generate, FinishReason, GenerateRequest, Generation, TokenEvent};
pub use runner::{Logits, Runner, Sequence};
pub use serving::{Engine, EngineConfig, Event, Metrics, Request, RequestStream, Summary};
