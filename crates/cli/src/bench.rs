//! `ferrite bench`: prefill (pp) and decode (tg) throughput, like llama-bench:
//! prefill of --prompt-tokens random tokens from an empty cache, and decode of
//! --gen-tokens tokens one at a time from an empty cache.

use std::time::Instant;

use clap::Args;
use ferrite_core::Result;
use ferrite_engine::{Logits, Runner, Sequence};
use serde_json::json;

use crate::load::load;
use crate::ModelArgs;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Runs of each test; the mean is reported.
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Deterministic pseudo-random token ids (no special meaning needed).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (100 + x % (vocab as u64 - 100).max(1)) as u32
        })
        .collect()
}

fn prefill(r: &mut Runner, n: usize, seed: u64) -> Result<f64> {
    let mut seq = Sequence::new(tokens(n, r.config().vocab_size, seed));
    let t = Instant::now();
    let res = (|| {
        while seq.n_cached < seq.tokens.len() {
            r.step(&mut [&mut seq], ferrite_engine::generate::PREFILL_CHUNK, Logits::Last)?;
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    })();
    r.release(&mut seq);
    res
}

fn decode(r: &mut Runner, n: usize, seed: u64) -> Result<f64> {
    let toks = tokens(n, r.config().vocab_size, seed);
    let mut seq = Sequence::new(vec![toks[0]]);
    let t = Instant::now();
    let res = (|| {
        for (i, &t) in toks.iter().enumerate() {
            if i > 0 {
                seq.tokens.push(t);
            }
            r.step(&mut [&mut seq], 1, Logits::Last)?;
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    })();
    r.release(&mut seq);
    res
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub fn main(mut a: BenchArgs) -> Result<()> {
    // At least the warm-up's 4 tokens.
    a.model.ctx_size = Some(a.model.ctx_size.unwrap_or(0).max(a.prompt_tokens.max(a.gen_tokens).max(4) + 1));
    let mut l = load(&a.model, false)?;
    let reps = a.repetitions.max(1);
    // One untimed warm-up touches the weights (page cache) and the thread pool.
    decode(&mut l.runner, 4, 0)?;
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for rep in 0..reps {
        if a.prompt_tokens > 0 {
            pp.push(prefill(&mut l.runner, a.prompt_tokens, rep as u64 + 1)?);
        }
        if a.gen_tokens > 0 {
            tg.push(decode(&mut l.runner, a.gen_tokens, rep as u64 + 101)?);
        }
    }
    let threads = rayon::current_num_threads();
    if a.json {
        println!(
            "{}",
            json!({
                "model": a.model.model,
                "backend": l.runner.backend_name(),
                "threads": threads,
                "prompt_tokens": a.prompt_tokens,
                "gen_tokens": a.gen_tokens,
                "repetitions": reps,
                "prefill_tokens_per_s": mean(&pp),
                "decode_tokens_per_s": mean(&tg),
                "prefill_runs": pp,
                "decode_runs": tg,
            })
        );
    } else {
        println!("| model | threads | test | tokens/s |");
        println!("|---|---|---|---|");
        if !pp.is_empty() {
            println!("| {} | {threads} | pp{} | {:.2} |", a.model.model, a.prompt_tokens, mean(&pp));
        }
        if !tg.is_empty() {
            println!("| {} | {threads} | tg{} | {:.2} |", a.model.model, a.gen_tokens, mean(&tg));
        }
    }
    Ok(())
}
