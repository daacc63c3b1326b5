//! Per-request sampling settings, with llama.cpp-like defaults.

use serde::{Deserialize, Serialize};

/// How the next token is chosen from a logits vector.
///
/// Missing fields deserialize to their `Default` values, so a request may name
/// only the settings it changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 (or less) means greedy argmax.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 turns it off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p;
    /// 1.0 turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 turns it off.
    pub min_p: f32,
    /// llama.cpp/HF repetition penalty over the last `penalty_last_n` tokens of
    /// prompt + generated: positive logits are divided by it, negative ones
    /// multiplied. 1.0 turns it off.
    pub repetition_penalty: f32,
    /// How many trailing tokens (prompt + generated) the repetition penalty
    /// looks at; 0 means all of them.
    pub penalty_last_n: usize,
    /// OpenAI presence penalty: subtracted once from every token already generated.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted once per earlier occurrence of a
    /// token among the generated ones.
    pub frequency_penalty: f32,
    /// RNG seed; `None` seeds from the clock.
    pub seed: Option<u64>,
    /// Added to the logits of the given token ids before anything else;
    /// `-inf` bans a token.
    pub logit_bias: Vec<(u32, f32)>,
    /// `Some(n)`: also report the n most likely alternatives with their logprobs.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            penalty_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Plain argmax decoding, every filter and penalty off.
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() }
    }

    /// Whether a draw depends on the tokens generated so far (penalties).
    pub fn reads_history(&self) -> bool {
        let rep = self.repetition_penalty;
        (rep != 1.0 && !rep.is_nan() && rep > 0.0) || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// Rejects settings that have no sensible meaning, with a message naming
    /// the field. The sampler never panics on invalid settings either; this is
    /// for turning bad requests into clear errors.
    pub fn validate(&self) -> Result<(), String> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(format!("temperature must be a finite number >= 0, got {t}"));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        let rp = self.repetition_penalty;
        if !(rp.is_finite() && rp > 0.0) {
            return Err(format!("repetition_penalty must be a finite number > 0, got {rp}"));
        }
        if !self.presence_penalty.is_finite() {
            return Err(format!("presence_penalty must be finite, got {}", self.presence_penalty));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(format!("frequency_penalty must be finite, got {}", self.frequency_penalty));
        }
        if let Some(&(token, bias)) = self.logit_bias.iter().find(|(_, b)| b.is_nan() || *b == f32::INFINITY) {
            return Err(format!("logit_bias for token {token} must be a number below +inf, got {bias}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_llama_cpp_like() {
        let p = SamplingParams::default();
        assert!(p.validate().is_ok());
        assert_eq!((p.top_k, p.top_p, p.min_p, p.penalty_last_n), (40, 0.95, 0.05, 64));
        assert!(SamplingParams::greedy().validate().is_ok());
        assert_eq!(SamplingParams::greedy().temperature, 0.0);
    }

    #[test]
    fn validate_rejects_bad_values() {
        let bad = [
            SamplingParams { temperature: -1.0, ..Default::default() },
            SamplingParams { temperature: f32::NAN, ..Default::default() },
            SamplingParams { top_p: 1.5, ..Default::default() },
            SamplingParams { min_p: f32::NAN, ..Default::default() },
            SamplingParams { repetition_penalty: 0.0, ..Default::default() },
            SamplingParams { presence_penalty: f32::INFINITY, ..Default::default() },
            SamplingParams { frequency_penalty: f32::NAN, ..Default::default() },
            SamplingParams { logit_bias: vec![(3, f32::NAN)], ..Default::default() },
        ];
        for p in bad {
            assert!(p.validate().is_err(), "{p:?} should be rejected");
        }
        let ban = SamplingParams { logit_bias: vec![(3, f32::NEG_INFINITY)], ..Default::default() };
        assert!(ban.validate().is_ok());
    }

    #[test]
    fn partial_json_fills_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature":0.2,"seed":7}"#).unwrap();
        assert_eq!(p.temperature, 0.2);
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.top_k, 40);
        let back: SamplingParams = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
