//! Shared helpers for the integration tests: fixture and model locations, and a
//! runner that returns logits for every position.
#![allow(dead_code)]

use std::path::PathBuf;

use ferrite_backend::cpu::CpuBackend;
use ferrite_engine::{Logits, Runner, Sequence};
use ferrite_loader::source::{models_dir, resolve, ModelSource};
use ferrite_models::{load_causal_lm, Checkpoint, KvDtype};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(rel: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(rel)
}

pub fn read_json(rel: &str) -> serde_json::Value {
    let p = fixture(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// A demo model from ferrite's model directory; fails (never skips) when absent.
pub fn model_path(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh first", p.display());
    p
}

pub fn runner_for(model: &str, ctx: usize) -> Runner {
    let source = resolve(model).unwrap();
    let ck = Checkpoint::open(&source).unwrap();
    let lm = load_causal_lm(CpuBackend::F32, &ck, &mut |_, _| {}).unwrap();
    let kv = match source {
        ModelSource::Gguf(_) => KvDtype::F16,
        _ => KvDtype::F32,
    };
    Runner::new(lm, ctx, 16, kv).unwrap()
}

/// Logits at every position of `ids`, one Vec per position.
pub fn score(runner: &mut Runner, ids: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let vocab = runner.config().vocab_size;
    let mut seq = Sequence::new(ids.to_vec());
    let mut rows = Vec::new();
    while seq.n_cached < seq.tokens.len() {
        let l = runner.step(&mut [&mut seq], chunk, Logits::All).unwrap();
        rows.extend(l.chunks(vocab).map(|r| r.to_vec()));
    }
    runner.release(&mut seq);
    rows
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}
pub mod cli;
pub mod server;
