//! `ferrite perplexity`: llama.cpp's method. The text is cut into non-overlapping
//! windows of --ctx tokens (the tail dropped); each window starts with BOS when the
//! model adds one and is evaluated from an empty cache; positions ctx/2 .. ctx-2
//! predict the next token and are scored.

use clap::Args;
use ferrite_core::{Error, Result};
use ferrite_engine::{Logits, Sequence};

use crate::load::load;
use crate::ModelArgs;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score.
    #[arg(short = 'f', long)]
    pub file: std::path::PathBuf,
    /// Window size in tokens.
    #[arg(short = 'c', long, default_value_t = 512)]
    pub ctx: usize,
}

/// -log p(target) from one row of logits, computed in f64.
pub fn nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    -(row[target as usize] as f64 - max - sum.ln())
}

pub fn main(mut a: PerplexityArgs) -> Result<()> {
    let bytes = std::fs::read(&a.file).map_err(|e| Error::io(&a.file, e))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()].iter().filter(|&&b| b == b'\n').count();
        Error::InvalidInput(format!("{}: line {line} is not valid UTF-8", a.file.display()))
    })?;
    if a.ctx < 4 {
        return Err(Error::InvalidInput("--ctx must be at least 4".into()));
    }
    if a.model.ctx_size.is_some_and(|c| c != a.ctx) {
        eprintln!("note: perplexity's context is its window, --ctx {}; --ctx-size is not used", a.ctx);
    }
    a.model.ctx_size = Some(a.ctx);
    let mut l = load(&a.model, true)?;
    let tok = l.tokenizer()?;
    let bos = tok.bos_id().filter(|_| tok.encode("", true).map(|v| !v.is_empty()).unwrap_or(false));
    let tokens = tok.encode(&text, true)?;
    let n_chunks = tokens.len() / a.ctx;
    if n_chunks == 0 {
        return Err(Error::InvalidInput(format!(
            "{} has {} tokens, fewer than one window of {}",
            a.file.display(),
            tokens.len(),
            a.ctx
        )));
    }
    let vocab = l.runner.config().vocab_size;
    let first = a.ctx / 2;
    let (mut total, mut count) = (0f64, 0usize);
    for c in 0..n_chunks {
        let mut window = tokens[c * a.ctx..(c + 1) * a.ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        let mut seq = Sequence::new(window.clone());
        let mut logits = Vec::with_capacity(a.ctx * vocab);
        while seq.n_cached < seq.tokens.len() {
            let out = l.runner.step(&mut [&mut seq], ferrite_engine::generate::PREFILL_CHUNK, Logits::All);
            match out {
                Ok(o) => logits.extend_from_slice(&o),
                Err(e) => {
                    l.runner.release(&mut seq);
                    return Err(e);
                }
            }
        }
        l.runner.release(&mut seq);
        for j in first..a.ctx - 1 {
            total += nll(&logits[j * vocab..(j + 1) * vocab], window[j + 1]);
            count += 1;
        }
        eprintln!("[{}/{n_chunks}] running perplexity {:.4}", c + 1, (total / count as f64).exp());
    }
    outln!("perplexity: {:.4}", (total / count as f64).exp())?;
    Ok(())
}
