//! `ferrite score`: logits at every position of a given token sequence, as JSON
//! lines, for token-by-token comparison with other implementations.

use clap::Args;
use ferrite_core::{Error, Result};
use ferrite_engine::runner::check_token_ids;
use ferrite_engine::{Logits, Sequence};
use serde_json::json;

use crate::load::load;
use crate::ModelArgs;

#[derive(Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long)]
    pub tokens: String,
    /// Alternatives per position.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// JSON lines output (the only format).
    #[arg(long)]
    pub json: bool,
}

pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    if s.split(',').all(|t| t.trim().is_empty()) {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(str::trim)
        .map(|t| t.parse::<u32>().map_err(|_| Error::InvalidInput(format!("--tokens: {t:?} is not a token id"))))
        .collect()
}

pub fn top_n(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(row.len());
    if n == 0 {
        return Vec::new();
    }
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(n - 1, cmp);
    idx.truncate(n);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, row[i as usize])).collect()
}

pub fn main(mut a: ScoreArgs) -> Result<()> {
    let ids = parse_ids(&a.tokens)?;
    if ids.is_empty() {
        return Err(Error::InvalidInput("--tokens is empty".into()));
    }
    if let Some(given) = a.model.ctx_size.filter(|&c| c < ids.len()) {
        eprintln!("note: --ctx-size {given} raised to {}, the tokens given", ids.len());
    }
    a.model.ctx_size = Some(a.model.ctx_size.unwrap_or(ids.len()).max(ids.len()));
    let mut l = load(&a.model, false)?;
    let vocab = l.runner.config().vocab_size;
    check_token_ids(&ids, vocab)?;
    let mut seq = Sequence::new(ids.clone());
    let mut pos = 0;
    while seq.n_cached < seq.tokens.len() {
        let logits = l.runner.step(&mut [&mut seq], ferrite_engine::generate::PREFILL_CHUNK, Logits::All)?;
        for row in logits.chunks(vocab) {
            let top: Vec<_> = top_n(row, a.top).into_iter().map(|(i, x)| json!([i, x])).collect();
            let mut o = json!({"pos": pos, "top": top});
            if let Some(&next) = ids.get(pos + 1) {
                o["next"] = json!(next);
                o["next_logit"] = json!(row[next as usize]);
            }
            outln!("{o}")?;
            pos += 1;
        }
    }
    l.runner.release(&mut seq);
    Ok(())
}
