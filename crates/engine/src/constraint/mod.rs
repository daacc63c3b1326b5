//! Constrained decoding: masks that keep sampled output inside a grammar.

pub mod format;
mod free_run;
pub mod gbnf;
pub mod gbnf_run;
pub mod json;
mod lex;
mod number;
pub mod pattern;
mod pattern_syntax;
pub mod schema;
mod schema_grammar;
mod trie;

/// A seeded xorshift for the grammars' randomized tests: each call picks
/// one of `0..n`.
#[cfg(test)]
fn picker(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}

/// The tokens `c` allows next (of `n`), checked against stepping each one
/// on a copy: the mask allows exactly those `advance` takes. `after` says
/// where, should they differ.
#[cfg(test)]
fn checked_mask(c: &format::Constraint, n: usize, after: &dyn std::fmt::Debug) -> Vec<usize> {
    let mut logits = vec![1.0f32; n];
    c.mask(&mut logits);
    for (id, &l) in logits.iter().enumerate() {
        assert_eq!(l == 1.0, c.clone().advance(id as u32), "token {id} after {after:?}");
    }
    (0..n).filter(|&i| logits[i] == 1.0).collect()
}

/// The median time of `c.mask` over `runs` calls, in milliseconds;
/// `logits` ends masked (the allowed left at 0.0).
#[cfg(test)]
fn median_mask_ms(c: &format::Constraint, logits: &mut [f32], runs: usize) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            logits.fill(0.0);
            let t = std::time::Instant::now();
            c.mask(logits);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

/// SmolLM2's tokenizer, where its model file is present (the tests of a
/// real vocabulary say they skip otherwise).
#[cfg(test)]
fn smollm2_tokenizer() -> Option<ferrite_loader::tokenizer::Tokenizer> {
    let path = ferrite_loader::source::models_dir().join("smollm2.gguf");
    if !path.exists() {
        println!("skipping: {} not found", path.display());
        return None;
    }
    let gguf = ferrite_loader::gguf::GgufFile::open(&path).unwrap();
    Some(ferrite_loader::tokenizer::Tokenizer::from_gguf(&gguf).unwrap())
}
