//! Generation for one sequence: chunked prefill, then sample / decode until a stop
//! condition, streaming each token's text through a callback.

use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::constraint::format::{Constraint, OutputFormat};
use crate::constraint::json::JsonVocab;
use crate::detokenizer::IncrementalDetokenizer;
use crate::runner::{check_token_ids, Logits, Runner, Sequence};
use crate::sampling::{Sampled, Sampler, SamplingParams, StopChecker};
use ferrite_backend::picks::{fed, Picks};
use ferrite_core::{Error, Result};
use ferrite_loader::tokenizer::Tokenizer;

/// Prompt tokens per forward pass during prefill.
pub const PREFILL_CHUNK: usize = 512;

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Extra stop ids besides the tokenizer's end-of-generation ids.
    pub stop_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// The output as one JSON object, a value of a schema or a match of a
    /// pattern (sampled on the host, each step's logits masked).
    pub format: Option<OutputFormat>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
    /// The engine failed while running the request (see the summary's message).
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

/// One generated token, with the text it completed (possibly empty while a
/// UTF-8 character or a possible stop string is incomplete).
pub struct TokenEvent<'a> {
    pub token: u32,
    pub text: &'a str,
    pub sampled: &'a Sampled,
}

#[derive(Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

/// Runs `req`; `on_token` returns false to cancel. The sequence's KV blocks are
/// released before returning, whatever happens.
pub fn generate(
    runner: &mut Runner,
    tok: &Tokenizer,
    req: &GenerateRequest,
    on_token: &mut dyn FnMut(&TokenEvent) -> bool,
) -> Result<Generation> {
    if req.prompt.is_empty() {
        return Err(Error::InvalidInput("the prompt is empty".into()));
    }
    let ctx = runner.max_context();
    if req.prompt.len() >= ctx {
        return Err(Error::InvalidInput(format!("prompt is {} tokens, the context holds {ctx}", req.prompt.len())));
    }
    req.sampling.validate().map_err(Error::InvalidInput)?;
    check_token_ids(&req.prompt, runner.config().vocab_size)?;
    let mut seq = Sequence::new(req.prompt.clone());
    let result = run(runner, tok, req, &mut seq, on_token);
    runner.release(&mut seq);
    result
}

/// One forward step of up to `chunk` tokens, and the next token: drawn on the
/// device where the model samples there (and the request needs no top
/// logprobs), else from the logits on the host.
fn step_and_pick(
    runner: &mut Runner,
    seq: &mut Sequence,
    chunk: usize,
    sampler: &mut Sampler,
    constraint: Option<&Constraint>,
    prompt: &[u32],
    generated: &[u32],
) -> Result<Sampled> {
    if let Some(c) = constraint {
        let vocab = runner.config().vocab_size;
        let mut logits = runner.step(&mut [seq], chunk, Logits::Last)?[..vocab].to_vec();
        c.mask(&mut logits);
        return Ok(sampler.sample(&logits, prompt, generated));
    }
    if runner.samples_on_device() {
        if let Some(row) = sampler.device_request(prompt, generated, &[], false) {
            let picked = runner.step_sampled(&mut [seq], chunk, &[row])?;
            let (token, logprob) = picked.first().copied().unwrap_or((0, f32::NEG_INFINITY));
            return Ok(Sampled { token, logprob, top: Vec::new() });
        }
    }
    let vocab = runner.config().vocab_size;
    let logits = runner.step(&mut [seq], chunk, Logits::Last)?;
    Ok(sampler.sample(&logits[..vocab], prompt, generated))
}

/// Whether decode steps go out one ahead of the host (`Runner::step_sampled_begin`):
/// where the device samples and feeds its picks to the next step, and the
/// draw does not depend on earlier picks or the device counts them in.
fn feeds_ahead(runner: &Runner, sampler: &Sampler) -> bool {
    runner.feeds_ahead(1) && (!sampler.reads_history() || runner.feeds_pending()) && !sampler.wants_host()
}

/// Launches the next decode step of `seq`, its token drawn on the device;
/// `pending`: its input is the last step's pick, not yet in `generated`,
/// and the draw's penalties count it in.
fn begin(
    runner: &mut Runner,
    seq: &mut Sequence,
    sampler: &mut Sampler,
    (prompt, generated): (&[u32], &[u32]),
    pending: bool,
) -> Result<Picks> {
    let Some(row) = sampler.device_request(prompt, generated, &[], pending) else {
        return Err(Error::Unsupported("this request samples on the host (checked by feeds_ahead)".into()));
    };
    runner.step_sampled_begin(&mut [seq], 1, &[row])
}

fn run(
    runner: &mut Runner,
    tok: &Tokenizer,
    req: &GenerateRequest,
    seq: &mut Sequence,
    on_token: &mut dyn FnMut(&TokenEvent) -> bool,
) -> Result<Generation> {
    let max_tokens = req.max_tokens.min(runner.max_context() - req.prompt.len());
    let t0 = Instant::now();
    let mut sampler = Sampler::new(req.sampling.clone());
    let vocab = runner.config().vocab_size;
    let mut constraint =
        req.format.as_ref().map(|f| Constraint::new(Arc::new(JsonVocab::for_tokenizer(tok, vocab)), f));
    // All prompt chunks but the last; the last one yields the first token.
    while seq.tokens.len() - seq.n_cached > PREFILL_CHUNK {
        runner.step(&mut [&mut *seq], PREFILL_CHUNK, Logits::Last)?;
    }
    let first = step_and_pick(runner, seq, PREFILL_CHUNK, &mut sampler, constraint.as_ref(), &req.prompt, &[])?;
    let prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let mut detok = IncrementalDetokenizer::after(tok, &req.prompt, req.format.is_some());
    let mut stops = StopChecker::new(req.stop.clone());
    let mut generated: Vec<u32> = Vec::new();
    let mut text = String::new();
    let mut finish = FinishReason::Length;
    let feed = constraint.is_none() && feeds_ahead(runner, &sampler);
    // The step after the one that drew `s`, launched before `s` was read;
    // its input, the last of `seq.tokens`, is then the fed id of `s`.
    let mut ahead: Option<Picks> = None;
    let mut s = first;
    while generated.len() < max_tokens {
        generated.push(s.token);
        // A whole JSON value ends the output, as the end of generation would.
        let json_done = constraint.as_mut().is_some_and(|c| c.advance(s.token) && c.is_complete());
        let eog = (!req.ignore_eos && tok.eos_ids().contains(&s.token)) || req.stop_ids.contains(&s.token);
        // At the end of generation, the text held back for a possible stop
        // string (and a UTF-8 tail) is the last piece.
        let (mut piece, stopped) =
            if eog { (stops.finish(&detok.flush()), true) } else { stops.push(&detok.push(&tok.token_bytes(s.token))) };
        if json_done && !stopped {
            // Ended, but not by a stop string: the text held back for one too.
            piece += &stops.finish(&detok.flush());
        }
        text.push_str(&piece);
        if !on_token(&TokenEvent { token: s.token, text: &piece, sampled: &s }) {
            finish = FinishReason::Cancelled;
            break;
        }
        if stopped || json_done {
            finish = FinishReason::Stop;
            break;
        }
        if generated.len() == max_tokens {
            break;
        }
        let step = match ahead.take() {
            Some(step) => {
                *seq.tokens.last_mut().expect("a fed step has an input") = s.token;
                step
            }
            None if feed => {
                seq.tokens.push(s.token);
                begin(runner, seq, &mut sampler, (&req.prompt, &generated), false)?
            }
            None => {
                seq.tokens.push(s.token);
                s = step_and_pick(runner, seq, 1, &mut sampler, constraint.as_ref(), &req.prompt, &generated)?;
                continue;
            }
        };
        // While `step` runs, the one after it is launched, fed its pick,
        // unless that pick will be the last token.
        if feed && generated.len() + 1 < max_tokens {
            seq.tokens.push(fed(0));
            let pending = sampler.reads_history();
            ahead = Some(begin(runner, seq, &mut sampler, (&req.prompt, &generated), pending)?);
        }
        let (token, logprob) = step.wait()?.first().copied().unwrap_or((0, f32::NEG_INFINITY));
        s = Sampled { token, logprob, top: Vec::new() };
    }
    if finish == FinishReason::Length {
        let tail = stops.finish(&detok.flush());
        if !tail.is_empty() {
            text.push_str(&tail);
            let s = Sampled { token: *generated.last().unwrap_or(&0), logprob: 0.0, top: Vec::new() };
            on_token(&TokenEvent { token: s.token, text: &tail, sampled: &s });
        }
    }
    Ok(Generation {
        tokens: generated,
        text,
        finish,
        prompt_tokens: req.prompt.len(),
        prefill_time,
        decode_time: t1.elapsed(),
    })
}
