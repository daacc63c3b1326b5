//! Scoring given tokens: the log-probability the model gave each prompt
//! token (OpenAI's `echo` with `logprobs`, as evaluation harnesses ask for
//! it). Raw log-softmax of the logits: no penalties, bias or temperature,
//! as vLLM reports prompt logprobs.

use super::sampler::{normalize, TokenLogprob};
use super::select::{top_k_into, Candidate};

/// A given token's score: its log-probability, its rank among the
/// vocabulary (1: the most likely; tokens scoring the same share a rank),
/// and the most likely tokens there, best first.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenScore {
    pub token: u32,
    pub logprob: f32,
    pub rank: usize,
    pub top: Vec<TokenLogprob>,
}

/// Reusable buffers for scoring rows of logits.
#[derive(Default)]
pub struct Scorer {
    work: Vec<f32>,
    cand: Vec<Candidate>,
}

impl Scorer {
    /// `token`'s score under `logits`, with the `top` most likely tokens
    /// (ids outside the row score -inf and rank last).
    pub fn score(&mut self, logits: &[f32], token: u32, top: usize) -> TokenScore {
        self.work.clear();
        self.work.extend_from_slice(logits);
        let lse = if logits.is_empty() { 0.0 } else { normalize(&mut self.work).lse };
        let logit = self.work.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
        let rank = 1 + self.work.iter().filter(|&&x| x > logit).count();
        top_k_into(&self.work, top, &mut self.cand);
        let top = self.cand.iter().map(|c| TokenLogprob { token: c.id, logprob: c.logit - lse }).collect();
        TokenScore { token, logprob: logit - lse, rank, top }
    }
}

#[cfg(test)]
mod tests {
    use super::Scorer;

    #[test]
    fn scores_are_log_softmax_with_the_best_first() {
        let logits = [1.0f32, 3.0, 2.0, f32::NAN];
        let z: f64 = [1.0f64, 3.0, 2.0].iter().map(|x| x.exp()).sum();
        let s = Scorer::default().score(&logits, 2, 2);
        assert_eq!(s.token, 2);
        assert!((f64::from(s.logprob) - (2.0 - z.ln())).abs() < 1e-5);
        assert_eq!(s.top.iter().map(|t| t.token).collect::<Vec<_>>(), [1, 2]);
        assert!((f64::from(s.top[0].logprob) - (3.0 - z.ln())).abs() < 1e-5);
        assert_eq!(s.rank, 2);
        // A NaN logit is impossible, and an id past the row too.
        assert_eq!(Scorer::default().score(&logits, 3, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(Scorer::default().score(&logits, 9, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(Scorer::default().score(&logits, 9, 0).rank, 4);
        assert_eq!(Scorer::default().score(&logits, 1, 0).rank, 1);
    }
}
