//! Choosing the next token and deciding when to stop.
//!
//! - `params`: the per-request `SamplingParams`.
//! - `sampler`: logits -> token (+ logprobs), deterministic under a seed.
//! - `score`: the log-probabilities of given tokens (prompt logprobs).
//! - `stop`: stop strings over streamed text.
//! - `rng`, `select`, `math`: the seeded PRNG, partial selection and
//!   vectorizable exp/reductions behind them.

mod math;
mod params;
mod rng;
mod sampler;
mod score;
mod select;
mod stop;

pub use params::SamplingParams;
pub use sampler::{Sampled, Sampler, TokenLogprob};
pub use score::{Scorer, TokenScore};
pub use stop::StopChecker;
