//! `ferrite bench`: prefill (pp) and decode (tg) throughput, like llama-bench:
//! prefill of --prompt-tokens random tokens from an empty cache, and decode of
//! --gen-tokens tokens one at a time. With --batch B, B sequences run
//! together (prefill of B prompts; decode of B streams, each after
//! --decode-context tokens of context). On a GPU the hardware ceilings are
//! measured first and each result is also reported against them.

use std::time::Instant;

use clap::Args;
use ferrite_backend::cuda::profile::{self, Profile};
use ferrite_backend::cuda::trace;
use ferrite_backend::picks::{fed, Picks};
use ferrite_core::Result;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{Logits, Runner, Sequence};
use ferrite_models::LmConfig;
use serde_json::json;

use crate::draws::Draws;
use crate::load::{load_with_pool, KvPool};
use crate::ModelArgs;

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens per sequence for the prefill test (0: none).
    #[arg(short = 'p', long, visible_alias = "n-prompt", default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens decoded per sequence for the decode test (0: none).
    #[arg(short = 'n', long, visible_alias = "n-gen", default_value_t = 128)]
    pub gen_tokens: usize,
    /// Sequences run together, in prefill and in decode.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Tokens of context each stream holds before the timed decode.
    #[arg(long, default_value_t = 0)]
    pub decode_context: usize,
    /// Prompt tokens per sequence per forward pass.
    #[arg(long, default_value_t = ferrite_engine::generate::PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    // The decode test draws greedily after these penalties.
    #[command(flatten)]
    pub penalties: crate::PenaltyArgs,
    /// Runs of each test; the mean is reported.
    #[arg(short = 'r', long, default_value_t = 3)]
    pub repetitions: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Deterministic pseudo-random token ids (no special meaning needed).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    // Past the first 100 ids (often special tokens) where the vocabulary has them.
    let skip: u64 = if vocab > 200 { 100 } else { 0 };
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (skip + x % (vocab as u64 - skip).max(1)) as u32
        })
        .collect()
}

fn seqs(r: &Runner, batch: usize, n: usize, seed: u64) -> Vec<Sequence> {
    (0..batch).map(|b| Sequence::new(tokens(n.max(1), r.config().vocab_size, seed * 1000 + b as u64))).collect()
}

/// Runs every sequence to its end, `chunk` tokens per step.
fn run_all(r: &mut Runner, s: &mut [Sequence], chunk: usize) -> Result<()> {
    while s[0].n_cached < s[0].tokens.len() {
        let mut refs: Vec<&mut Sequence> = s.iter_mut().collect();
        r.step(&mut refs, chunk, Logits::Last)?;
    }
    Ok(())
}

fn release(r: &mut Runner, s: &mut [Sequence]) {
    s.iter_mut().for_each(|q| r.release(q));
}

/// Prompt tokens per second over all sequences.
fn prefill(r: &mut Runner, a: &BenchArgs, seed: u64) -> Result<f64> {
    let mut s = seqs(r, a.batch, a.prompt_tokens, seed);
    let t = Instant::now();
    let res =
        run_all(r, &mut s, a.prefill_chunk).map(|_| (a.batch * a.prompt_tokens) as f64 / t.elapsed().as_secs_f64());
    release(r, &mut s);
    res
}

/// FNV-1a over greedy picks: two runs of one test (two settings of a switch)
/// that print the same digest picked the same tokens.
fn fold_pick(digest: u64, pick: u32) -> u64 {
    pick.to_le_bytes().iter().fold(digest, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Generated tokens per second over all streams (untimed context first), and
/// the digest of every stream's picks: greedy, after the penalties where
/// any is set. Each stream's first input is a fixed token and every later
/// one its own last pick, as in generation; where the device feeds its
/// picks to the next step, that step is launched before the picks are read,
/// as `run` does (`FERRITE_FEED_AHEAD=0`, or with penalties
/// `FERRITE_FEED_PENDING=0`: after). Both orders compute the same tokens, so
/// their digests match.
fn decode(r: &mut Runner, a: &BenchArgs, n: usize, seed: u64) -> Result<(f64, u64)> {
    let mut s = seqs(r, a.batch, a.decode_context.max(1), seed);
    let res = (|| {
        run_all(r, &mut s, a.prefill_chunk)?;
        // The context's prefill is not part of the decode profile.
        let _ = profile::take();
        let _ = trace::take();
        // The first input stands for the prompt's pick: generated, as in `run`.
        let mut draws = a.draws(&s);
        let first = tokens(1, r.config().vocab_size, seed + 7)[0];
        s.iter_mut().for_each(|q| q.tokens.push(first));
        let ahead = r.feeds_ahead(s.len()) && (!draws.reads_history() || r.feeds_pending());
        let mut digest = 0xcbf2_9ce4_8422_2325u64;
        let t = Instant::now();
        decode_steps(r, &mut s, n, 1, ahead, &mut draws, |picks| {
            digest = picks.iter().fold(digest, |d, &(p, _)| fold_pick(d, p));
        })?;
        Ok(((a.batch * n) as f64 / t.elapsed().as_secs_f64(), digest))
    })();
    release(r, &mut s);
    res
}

impl BenchArgs {
    fn penalties(&self) -> SamplingParams {
        self.penalties.apply(SamplingParams::greedy())
    }

    fn penalized(&self) -> bool {
        self.penalties().reads_history()
    }

    /// The decode test's draws for streams `s`, their tokens so far their prompts.
    fn draws(&self, s: &[Sequence]) -> Draws {
        match self.penalized() {
            true => Draws::penalized(&self.penalties(), s.iter().map(|q| q.tokens.len())),
            false => Draws::greedy(),
        }
    }
}

/// `steps` greedy steps of every stream (up to `chunk` new tokens each),
/// each step's picks appended to the streams and handed to `each`, in order.
/// With `ahead` (where the runner `feeds_ahead`), each step is launched
/// before the last one's picks are read, its inputs fed on the device, as
/// `run` does; the picks are the same either way.
pub(crate) fn greedy_steps(
    r: &mut Runner,
    s: &mut [Sequence],
    steps: usize,
    chunk: usize,
    ahead: bool,
    each: impl FnMut(&[(u32, f32)]),
) -> Result<()> {
    decode_steps(r, s, steps, chunk, ahead, &mut Draws::greedy(), each)
}

/// `greedy_steps` with each step's picks drawn by `draws` from the streams
/// as they are at its launch (with `ahead`, a stream's last token may be a
/// fed id, its pick not yet read, which a draw reading history counts in on
/// the device: as `run` feeds only where the runner `feeds_pending`;
/// gpu-check feeds regardless, to check that mechanism).
pub(crate) fn decode_steps(
    r: &mut Runner,
    s: &mut [Sequence],
    steps: usize,
    chunk: usize,
    ahead: bool,
    draws: &mut Draws,
    mut each: impl FnMut(&[(u32, f32)]),
) -> Result<()> {
    // The last step launched, when its picks are not read yet (ahead).
    let mut pending: Option<Picks> = None;
    for i in 0..steps {
        let launched = decode_step(r, s, chunk, ahead, draws)?;
        if let Some(prev) = pending.take() {
            // Fed to the step just launched: its input, each stream's last token.
            let picks = prev.wait()?;
            s.iter_mut().zip(&picks).for_each(|(q, &(p, _))| *q.tokens.last_mut().expect("fed") = p);
            each(&picks);
        }
        if ahead && i + 1 < steps {
            s.iter_mut().enumerate().for_each(|(j, q)| q.tokens.push(fed(j)));
            pending = Some(launched);
        } else {
            let picks = launched.wait()?;
            s.iter_mut().zip(&picks).for_each(|(q, &(p, _))| q.tokens.push(p));
            each(&picks);
        }
    }
    Ok(())
}

/// One step of every stream and its picks: drawn on the device where the
/// model samples there (as serving does; `ahead`: not waited for), else on
/// the host from the logits.
fn decode_step(r: &mut Runner, s: &mut [Sequence], chunk: usize, ahead: bool, draws: &mut Draws) -> Result<Picks> {
    if r.samples_on_device() {
        let rows = draws.device_rows(s)?;
        let mut refs: Vec<&mut Sequence> = s.iter_mut().collect();
        return match ahead {
            true => r.step_sampled_begin(&mut refs, chunk, &rows),
            false => r.step_sampled(&mut refs, chunk, &rows).map(Picks::ready),
        };
    }
    let mut refs: Vec<&mut Sequence> = s.iter_mut().collect();
    let vocab = r.config().vocab_size;
    let logits = r.step(&mut refs, chunk, Logits::Last)?;
    let picks = logits.chunks(vocab).enumerate().map(|(i, row)| (draws.host_pick(i, row, &s[i]), 0.0));
    Ok(Picks::ready(picks.collect()))
}

/// An f32 setting as JSON shows it: its shortest decimal (1.1, not
/// 1.100000023841858 as the widened f64 would print).
fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Parameters every token multiplies (matmul weights, output head included).
fn matmul_params(c: &LmConfig) -> f64 {
    let (h, qd, kvd) = (c.hidden as f64, (c.n_heads * c.head_dim) as f64, c.kv_dim() as f64);
    let layer = h * (qd + 2.0 * kvd) + qd * h + 3.0 * h * c.ffn as f64;
    c.n_layers as f64 * layer + c.vocab_size as f64 * h
}

/// Bytes of weights a decode step reads on the device: every 2-D weight but
/// the embedding table, unless it is also the output head.
fn step_weight_bytes(model: &str, c: &LmConfig) -> Result<f64> {
    let ck = ferrite_models::Checkpoint::open(&ferrite_loader::source::resolve(model)?)?;
    let is_table = |n: &str| n.contains("token_embd") || n.contains("embed_tokens");
    let read = ck.device_tensor_bytes().into_iter().filter(|(n, _)| c.tied_embeddings || !is_table(n));
    Ok(read.map(|(_, b)| b as f64).sum())
}

/// What the GPU's ceilings allow, printed next to the measured rates.
struct Roofline {
    copy: f64,
    /// Bytes read alone per second (shown, not used: the roofline is the copy rate's).
    read: Option<f64>,
    /// The bf16 GEMM rate on random values (the MFU's denominator).
    flops: f64,
    /// The same GEMM on zeros, shown for comparison.
    zeros_flops: f64,
}

impl Roofline {
    /// Fraction of the memory roofline reached by a decode rate: each step
    /// reads the matmul weights once (`weight_bytes`, as stored on the
    /// device) and every stream's K and V.
    fn decode(&self, c: &LmConfig, a: &BenchArgs, rate: f64, weight_bytes: f64, kv_bytes: f64) -> f64 {
        let ctx = a.decode_context.max(1) as f64 + a.gen_tokens as f64 / 2.0;
        let kv = a.batch as f64 * ctx * (c.n_layers * c.kv_dim() * 2) as f64 * kv_bytes;
        let step_bytes = weight_bytes + kv;
        let steps_per_s = rate / a.batch as f64;
        steps_per_s * step_bytes / self.copy
    }

    /// Model FLOP utilization of a prefill rate (matmuls plus causal attention).
    fn prefill(&self, c: &LmConfig, a: &BenchArgs, rate: f64) -> f64 {
        let attn = 2.0 * 2.0 * (c.n_layers * c.n_heads * c.head_dim) as f64 * (a.prompt_tokens as f64 + 1.0) / 2.0;
        rate * (2.0 * matmul_params(c) + attn) / self.flops
    }
}

/// " (reading alone N)" in GB/s, where that rate was measured.
pub(crate) fn read_note(read: Option<f64>) -> String {
    read.map_or(String::new(), |r| format!(" (reading alone {:.0})", r / 1e9))
}

fn ceilings(a: &BenchArgs) -> Result<Option<Roofline>> {
    let Some(crate::device::DeviceChoice::Cuda(n)) = a.model.device.device else { return Ok(None) };
    let opts = ferrite_backend::cuda::CudaOptions { ordinal: n, ..Default::default() };
    let c = ferrite_backend::cuda::CudaBackend::open(&opts)?.measure_ceilings()?;
    Ok(Some(Roofline {
        copy: c.copy_bytes_per_s,
        read: c.read_bytes_per_s,
        flops: c.bf16_flops,
        zeros_flops: c.bf16_zeros_flops,
    }))
}

pub fn main(mut a: BenchArgs) -> Result<()> {
    if a.batch == 0 || a.prefill_chunk == 0 || a.repetitions == 0 {
        return Err(ferrite_core::Error::InvalidInput(
            "--batch, --prefill-chunk and --repetitions must be at least 1".into(),
        ));
    }
    if a.prompt_tokens == 0 && a.gen_tokens == 0 {
        return Err(ferrite_core::Error::InvalidInput(
            "nothing to measure: --prompt-tokens and --gen-tokens are both 0".into(),
        ));
    }
    a.penalties().validate().map_err(crate::flag_error)?;
    // At least the warm-up's 4 tokens.
    let longest = a.prompt_tokens.max(a.decode_context + a.gen_tokens).max(4) + 1;
    if let Some(given) = a.model.ctx_size.filter(|&c| c < longest) {
        eprintln!("note: --ctx-size {given} raised to {longest}, what these tests need");
    }
    a.model.ctx_size = Some(a.model.ctx_size.unwrap_or(0).max(longest));
    let roof = ceilings(&a)?;
    let blocks = a.batch * a.model.ctx_size.unwrap_or(longest).div_ceil(ferrite_engine::runner::DEFAULT_BLOCK_SIZE);
    let mut l = load_with_pool(&a.model, false, &KvPool::Blocks(blocks))?;
    let reps = a.repetitions;
    // Untimed warm-ups touch the weights and the thread pool (or the GPU),
    // and make what a backend does once per shape (a GPU's GEMM algorithm
    // choice) before the timed prompts.
    let warm = BenchArgs { decode_context: 1, ..a.clone() };
    decode(&mut l.runner, &warm, 4, 0)?;
    if a.prompt_tokens > 0 {
        prefill(&mut l.runner, &a, 0)?;
    }
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    // FERRITE_PROFILE=1 on a GPU: GPU time per op, prefill and decode apart.
    let (mut pp_prof, mut tg_prof) = (Profile::default(), Profile::default());
    let _ = profile::take();
    // FERRITE_CUDA_TRACE=1: the last repetition's decode timeline.
    let mut tg_trace = None;
    let mut picks = None;
    for rep in 0..reps {
        if a.prompt_tokens > 0 {
            pp.push(prefill(&mut l.runner, &a, rep as u64 + 1)?);
            profile::take().inspect(|p| pp_prof.merge(p));
        }
        if a.gen_tokens > 0 {
            let (rate, digest) = decode(&mut l.runner, &a, a.gen_tokens, rep as u64 + 101)?;
            tg.push(rate);
            picks = Some(digest);
            profile::take().inspect(|p| tg_prof.merge(p));
            tg_trace = trace::take().or(tg_trace);
        }
    }
    if profile::enabled() {
        eprintln!("prefill, all repetitions:\n{}\ndecode, all repetitions:\n{}", pp_prof.table(), tg_prof.table());
    }
    if let Some(t) = tg_trace {
        eprintln!("decode, last repetition: {t}");
    }
    let threads = rayon::current_num_threads();
    let cfg = l.runner.config().clone();
    let kv_bytes = if a.model.kv_cache == Some(ferrite_models::KvDtype::F32) { 4.0 } else { 2.0 };
    let (pp_frac, tg_frac) = match &roof {
        Some(r) => {
            let w = step_weight_bytes(&a.model.model, &cfg)?;
            let pp_frac = (!pp.is_empty()).then(|| r.prefill(&cfg, &a, mean(&pp)));
            (pp_frac, (!tg.is_empty()).then(|| r.decode(&cfg, &a, mean(&tg), w, kv_bytes)))
        }
        None => (None, None),
    };
    if a.json {
        outln!(
            "{}",
            json!({
                "model": a.model.model,
                "backend": l.runner.backend_name(),
                "threads": threads,
                "batch": a.batch,
                "prompt_tokens": a.prompt_tokens,
                "gen_tokens": a.gen_tokens,
                "decode_context": a.decode_context,
                "repetitions": reps,
                "repeat_penalty": shortest(a.penalties.repeat_penalty),
                "presence_penalty": shortest(a.penalties.presence_penalty),
                "frequency_penalty": shortest(a.penalties.frequency_penalty),
                "prefill_tokens_per_s": (!pp.is_empty()).then(|| mean(&pp)),
                "decode_tokens_per_s": (!tg.is_empty()).then(|| mean(&tg)),
                "prefill_runs": pp,
                "decode_runs": tg,
                "decode_picks_digest": picks.map(|d| format!("{d:016x}")),
                "copy_bytes_per_s": roof.as_ref().map(|r| r.copy),
                "read_bytes_per_s": roof.as_ref().map(|r| r.read),
                "bf16_flops": roof.as_ref().map(|r| r.flops),
                "bf16_zeros_flops": roof.as_ref().map(|r| r.zeros_flops),
                "prefill_mfu": pp_frac,
                "decode_roofline_fraction": tg_frac,
            })
        )?;
        return Ok(());
    }
    if let Some(r) = &roof {
        outln!(
            "ceilings: copy {:.0} GB/s{}, bf16 GEMM {:.0} TFLOP/s on random values ({:.0} on zeros)",
            r.copy / 1e9,
            read_note(r.read),
            r.flops / 1e12,
            r.zeros_flops / 1e12
        )?;
    }
    let pct = |f: Option<f64>| f.map_or(String::new(), |f| format!(" ({:.1}%)", 100.0 * f));
    outln!("| model | threads | batch | test | tokens/s |")?;
    outln!("|---|---|---|---|---|")?;
    if !pp.is_empty() {
        let m = &a.model.model;
        outln!("| {m} | {threads} | {} | pp{} | {:.2}{} |", a.batch, a.prompt_tokens, mean(&pp), pct(pp_frac))?;
    }
    if !tg.is_empty() {
        let m = &a.model.model;
        let ctx = if a.decode_context > 0 { format!(" @ {}", a.decode_context) } else { String::new() };
        outln!("| {m} | {threads} | {} | tg{}{ctx} | {:.2}{} |", a.batch, a.gen_tokens, mean(&tg), pct(tg_frac))?;
    }
    if roof.is_some() {
        outln!("(pp: % of the bf16 GEMM rate (MFU); tg: % of the memory roofline, weights + KV per step)")?;
    }
    if a.penalized() {
        let p = a.penalties();
        let (r, n) = (p.repetition_penalty, p.penalty_last_n);
        let (pr, f) = (p.presence_penalty, p.frequency_penalty);
        outln!("(tg: greedy after penalties: repetition {r} over the last {n} tokens, presence {pr}, frequency {f})")?;
    }
    if let Some(d) = picks {
        outln!("decode picks digest (last repetition): {d:016x}")?;
    }
    Ok(())
}
