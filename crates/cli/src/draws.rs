//! How `bench`'s and `gpu-check`'s decode loops draw each stream's next
//! token: greedy, or greedy after repetition, presence and frequency
//! penalties over the stream's own history. On the device where the model
//! samples there (a stream's last token may be a fed id, its pick counted in
//! there as pending, as `serve` does), else on the host from the logits.

use ferrite_backend::picks::fed_row;
use ferrite_core::{Error, Result};
use ferrite_engine::sampling::{Sampler, SamplingParams};
use ferrite_engine::Sequence;
use ferrite_models::RowSampling;

use crate::gpu_check::argmax;

pub(crate) struct Draws {
    /// One per stream with its prompt's length (what the penalties' history
    /// starts after); empty for plain greedy draws.
    penalized: Vec<(Sampler, usize)>,
}

impl Draws {
    pub(crate) fn greedy() -> Draws {
        Draws { penalized: Vec::new() }
    }

    /// Greedy draws with `params`' penalties, a sampler per stream; the
    /// streams' prompts are their first `prompt_lens` tokens.
    pub(crate) fn penalized(params: &SamplingParams, prompt_lens: impl IntoIterator<Item = usize>) -> Draws {
        let greedy = SamplingParams { temperature: 0.0, ..params.clone() };
        Draws { penalized: prompt_lens.into_iter().map(|n| (Sampler::new(greedy.clone()), n)).collect() }
    }

    /// Whether a draw reads the stream's history: a step fed ahead must then
    /// count the unread pick in on the device (`Runner::feeds_pending`).
    pub(crate) fn reads_history(&self) -> bool {
        self.penalized.first().is_some_and(|(s, _)| s.reads_history())
    }

    /// Each stream's draw, described for the device that holds the logits.
    pub(crate) fn device_rows(&mut self, s: &[Sequence]) -> Result<Vec<RowSampling>> {
        if self.penalized.is_empty() {
            return Ok(vec![RowSampling::greedy(); s.len()]);
        }
        debug_assert_eq!(s.len(), self.penalized.len(), "a sampler per stream");
        let rows = s.iter().zip(&mut self.penalized).enumerate().map(|(i, (q, (sampler, prompt_len)))| {
            // A last token that is a fed id is the pending pick: the device
            // reads it from the last launch's row of the same index.
            let fed = q.tokens.last().and_then(|&t| fed_row(t));
            debug_assert!(fed.is_none_or(|j| j == i), "stream {i} fed another row's pick");
            let pending = fed.is_some();
            let (prompt, generated) = q.tokens[..q.tokens.len() - usize::from(pending)].split_at(*prompt_len);
            sampler.device_request(prompt, generated, &[], pending)
        });
        rows.map(|r| r.ok_or_else(|| Error::Unsupported("a greedy draw needing the host".into()))).collect()
    }

    /// Stream `i`'s pick from its logits, on the host.
    pub(crate) fn host_pick(&mut self, i: usize, logits: &[f32], q: &Sequence) -> u32 {
        debug_assert!(self.penalized.is_empty() || i < self.penalized.len(), "a sampler per stream");
        match self.penalized.get_mut(i) {
            None => argmax(logits) as u32,
            Some((sampler, prompt_len)) => {
                let (prompt, generated) = q.tokens.split_at(*prompt_len);
                sampler.sample(logits, prompt, generated).token
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_backend::picks::fed;

    fn params() -> SamplingParams {
        SamplingParams { repetition_penalty: 2.0, presence_penalty: 0.5, ..SamplingParams::greedy() }
    }

    #[test]
    fn greedy_draws_read_no_history() {
        let mut d = Draws::greedy();
        assert!(!d.reads_history());
        let q = Sequence::new(vec![1, 2, 3]);
        assert_eq!(d.host_pick(0, &[0.0, 1.0, 3.0, 2.0], &q), 2);
        let rows = d.device_rows(&[q.clone(), q]).unwrap();
        assert!(rows.iter().all(|r| r.edits.is_empty() && r.pending.is_none() && r.temperature <= 0.0), "{rows:?}");
    }

    /// The penalties read the tokens after the prompt (presence) and the
    /// window over both (repetition): token 2, the top logit, repeated in the
    /// prompt, loses to token 3.
    #[test]
    fn penalized_draws_split_prompt_and_generated() {
        let mut d = Draws::penalized(&params(), [2]);
        assert!(d.reads_history());
        let q = Sequence::new(vec![2, 0, 1]);
        let logits = [0.0, 0.0, 3.0, 2.0];
        assert_eq!(d.host_pick(0, &logits, &q), 3);
        let row = &d.device_rows(std::slice::from_ref(&q)).unwrap()[0];
        // The device's edits give the host's pick.
        let edited = ferrite_backend::sampling::edited(&logits, row);
        assert_eq!(argmax(&edited), 3, "{edited:?}");
        let edit = |t: u32| row.edits.iter().find(|e| e.token == t).copied();
        // Token 2 only in the prompt: repetition, no presence; token 1 generated: both.
        assert!(edit(2).is_some_and(|e| e.rep == 2.0 && e.sub == 0.0), "{row:?}");
        assert!(edit(1).is_some_and(|e| e.rep == 2.0 && e.sub == 0.5), "{row:?}");
        assert!(row.pending.is_none());
    }

    /// A stream whose last token is a fed id draws with that pick pending,
    /// left out of the edits.
    #[test]
    fn a_fed_last_token_is_pending() {
        let mut d = Draws::penalized(&params(), [1]);
        let q = Sequence::new(vec![4, 1, fed(0)]);
        let row = &d.device_rows(std::slice::from_ref(&q)).unwrap()[0];
        assert!(row.pending.is_some(), "{row:?}");
        assert!(row.edits.iter().all(|e| e.token != fed(0)), "{row:?}");
        assert!(row.edits.iter().any(|e| e.token == 1 && e.sub == 0.5), "{row:?}");
    }
}
