//! Scoring given tokens: the log-probability the model gave each prompt
//! token (OpenAI's `echo` with `logprobs`, as evaluation harnesses ask for
//! it). Raw log-softmax of the logits: no penalties, bias or temperature,
//! as vLLM reports prompt logprobs.

use super::sampler::{normalize, Sampled, TokenLogprob};
use super::select::{top_k_into, Candidate};

/// Reusable buffers for scoring rows of logits.
#[derive(Default)]
pub struct Scorer {
    work: Vec<f32>,
    cand: Vec<Candidate>,
}

impl Scorer {
    /// `token`'s log-probability under `logits`, with the `top` most likely
    /// tokens best first (ids outside the row score -inf).
    pub fn score(&mut self, logits: &[f32], token: u32, top: usize) -> Sampled {
        if logits.is_empty() {
            return Sampled { token, logprob: f32::NEG_INFINITY, top: Vec::new() };
        }
        self.work.clear();
        self.work.extend_from_slice(logits);
        let lse = normalize(&mut self.work).lse;
        let logprob = self.work.get(token as usize).map_or(f32::NEG_INFINITY, |&x| x - lse);
        top_k_into(&self.work, top, &mut self.cand);
        let top = self.cand.iter().map(|c| TokenLogprob { token: c.id, logprob: c.logit - lse }).collect();
        Sampled { token, logprob, top }
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
        // A NaN logit is impossible, and an id past the row too.
        assert_eq!(Scorer::default().score(&logits, 3, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(Scorer::default().score(&logits, 9, 0).logprob, f32::NEG_INFINITY);
    }
}
