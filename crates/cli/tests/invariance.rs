//! Engine invariants through the library API, on a GGUF model (smollm2, quantized
//! weights, f16 KV) and on an HF checkpoint (the tiny Qwen3 fixture, f32):
//! - a sequence's logits do not depend on what else is in its flat batch (other
//!   sequences in prefill or decode, their order, where its KV blocks lie);
//! - chunked prefill gives the logits of whole prefill;
//! - generation is deterministic under a seed, and every KV block comes back
//!   after success, errors and cancellation.
//!
//! The CPU kernels are designed to be batch-invariant, so the comparisons are
//! bit for bit.

mod common;
use common::*;

use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{generate, FinishReason, GenerateRequest, Generation, Logits, Runner, Sequence};
use ferrite_loader::source::resolve;
use ferrite_loader::tokenizer::Tokenizer;
use ferrite_models::Checkpoint;

/// More than any prompt here: a step takes every uncached token.
const WHOLE: usize = 4096;
const CTX: usize = 256;

struct Model {
    name: &'static str,
    runner: Runner,
    vocab: usize,
}

fn smollm2() -> Model {
    model_path("smollm2.gguf");
    let runner = runner_for("smollm2", CTX);
    Model { name: "smollm2", vocab: runner.config().vocab_size, runner }
}

fn qwen3() -> Model {
    let runner = runner_for(fixture("hf/qwen3_untied").to_str().unwrap(), CTX);
    Model { name: "qwen3 fixture", vocab: runner.config().vocab_size, runner }
}

/// smollm2's tokenizer. The HF fixtures ship none; generation only needs one to
/// detokenize and to know the end-of-text ids, so the fixture borrows it.
fn tokenizer() -> Tokenizer {
    let ck = Checkpoint::open(&resolve("smollm2").unwrap()).unwrap();
    let Checkpoint::Gguf(g) = &ck else { panic!("smollm2 is a GGUF") };
    Tokenizer::from_gguf(g).unwrap()
}

/// Deterministic token ids in `[10, vocab)`.
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (10 + x % (vocab as u64 - 10)) as u32
        })
        .collect()
}

/// Largest |a - b| over two sets of rows (which must have the same shape), and
/// whether they are equal bit for bit.
fn compare(a: &[Vec<f32>], b: &[Vec<f32>]) -> (f32, bool) {
    assert_eq!(a.len(), b.len(), "row counts differ");
    let mut worst = 0f32;
    let mut exact = true;
    for (ra, rb) in a.iter().zip(b) {
        assert_eq!(ra.len(), rb.len());
        for (x, y) in ra.iter().zip(rb) {
            assert!(x.is_finite() && y.is_finite(), "non-finite logit");
            exact &= x.to_bits() == y.to_bits();
            worst = worst.max((x - y).abs());
        }
    }
    (worst, exact)
}

fn assert_bit_identical(what: &str, a: &[Vec<f32>], b: &[Vec<f32>]) {
    let (worst, exact) = compare(a, b);
    assert!(exact, "{what}: not bit-identical (max |diff| {worst:e})");
}

// ---------------------------------------------------------------------------
// (a) batched == alone

/// A sequence's prompt, then teacher-forced continuation tokens.
struct Plan {
    prompt: Vec<u32>,
    cont: Vec<u32>,
}

/// Logits at every position of `p.prompt` + `p.cont[..n_cont]`, run alone:
/// whole prefill, then one token per step.
fn alone(m: &mut Model, p: &Plan, n_cont: usize) -> Vec<Vec<f32>> {
    let mut seq = Sequence::new(p.prompt.clone());
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let out = m.runner.step(&mut [&mut seq], WHOLE, Logits::All).unwrap();
    rows.extend(out.chunks(m.vocab).map(<[f32]>::to_vec));
    for &t in &p.cont[..n_cont] {
        seq.tokens.push(t);
        let out = m.runner.step(&mut [&mut seq], 1, Logits::All).unwrap();
        rows.extend(out.chunks(m.vocab).map(<[f32]>::to_vec));
    }
    m.runner.release(&mut seq);
    rows
}

/// Runs `schedule`: each step is one forward pass over the listed sequences, in
/// that order. A sequence's first step is its whole prompt (prefill); each later
/// one feeds its next continuation token (decode). Returns each sequence's rows.
fn batched(m: &mut Model, plans: &[Plan], schedule: &[&[usize]]) -> Vec<Vec<Vec<f32>>> {
    let mut seqs: Vec<Sequence> = plans.iter().map(|p| Sequence::new(p.prompt.clone())).collect();
    let mut started = vec![false; plans.len()];
    let mut fed = vec![0usize; plans.len()];
    let mut rows: Vec<Vec<Vec<f32>>> = vec![Vec::new(); plans.len()];
    for step in schedule {
        let mut n_new = Vec::new();
        for &i in *step {
            if started[i] {
                seqs[i].tokens.push(plans[i].cont[fed[i]]);
                fed[i] += 1;
            }
            started[i] = true;
            n_new.push(seqs[i].tokens.len() - seqs[i].n_cached);
        }
        // Disjoint &mut borrows, in the schedule's order.
        let mut slots: Vec<Option<&mut Sequence>> = seqs.iter_mut().map(Some).collect();
        let mut batch: Vec<&mut Sequence> = step.iter().map(|&i| slots[i].take().unwrap()).collect();
        let out = m.runner.step(&mut batch, WHOLE, Logits::All).unwrap();
        assert_eq!(out.len(), n_new.iter().sum::<usize>() * m.vocab);
        let mut chunks = out.chunks(m.vocab);
        for (&i, &n) in step.iter().zip(&n_new) {
            rows[i].extend(chunks.by_ref().take(n).map(<[f32]>::to_vec));
        }
    }
    for seq in &mut seqs {
        m.runner.release(seq);
    }
    rows
}

fn check_batch_invariance(mut m: Model) {
    let initial = m.runner.free_blocks();
    let v = m.vocab;
    // Lengths on both sides of the 16-token block size.
    let plans: Vec<Plan> = [(21, 1), (13, 2), (34, 3), (5, 4)]
        .iter()
        .map(|&(n, seed)| Plan { prompt: ids(n, v, seed), cont: ids(6, v, seed + 100) })
        .collect();
    let schedule: &[&[usize]] = &[
        &[0, 3],       // two prefills
        &[0, 1],       // decode + prefill
        &[1, 0, 2, 3], // decode, decode, prefill, decode
        &[2, 1, 0],    // three decodes, order changed
        &[3, 2],
        &[0],
    ];
    let got = batched(&mut m, &plans, schedule);
    assert_eq!(m.runner.free_blocks(), initial);
    // The comparison can tell sequences apart.
    assert!(!compare(&got[0][..1], &got[1][..1]).1, "{}: different tokens, same logits", m.name);
    for (i, p) in plans.iter().enumerate() {
        let n_cont = schedule.iter().filter(|s| s.contains(&i)).count() - 1;
        let want = alone(&mut m, p, n_cont);
        assert_eq!(got[i].len(), p.prompt.len() + n_cont);
        assert_bit_identical(&format!("{}: sequence {i} batched vs alone", m.name), &got[i], &want);
    }
    // The same sequence twice in one batch gives the same rows twice.
    let p = &plans[0];
    let twins = [
        Plan { prompt: p.prompt.clone(), cont: p.cont.clone() },
        Plan { prompt: p.prompt.clone(), cont: p.cont.clone() },
    ];
    let got = batched(&mut m, &twins, &[&[0, 1], &[1, 0]]);
    assert_bit_identical(&format!("{}: twins", m.name), &got[0], &got[1]);
    assert_eq!(m.runner.free_blocks(), initial);
}

#[test]
fn batched_equals_alone_gguf() {
    check_batch_invariance(smollm2());
}

#[test]
fn batched_equals_alone_hf() {
    check_batch_invariance(qwen3());
}

// ---------------------------------------------------------------------------
// (b) chunked prefill == whole prefill

fn check_chunked_prefill(mut m: Model) {
    let initial = m.runner.free_blocks();
    let prompt = ids(45, m.vocab, 7);
    let whole = score(&mut m.runner, &prompt, WHOLE);
    assert_eq!(whole.len(), prompt.len());
    for chunk in [5, 1, 16, 17] {
        let chunked = score(&mut m.runner, &prompt, chunk);
        let (worst, exact) = compare(&whole, &chunked);
        eprintln!("{}: chunk {chunk}: max |diff| {worst:e}, bit-identical: {exact}", m.name);
        assert!(exact, "{}: chunked prefill ({chunk}) differs from whole prefill: max |diff| {worst:e}", m.name);
    }
    // Prefill of a prefix, then the rest in one chunk, in a batch with another sequence.
    let other = ids(9, m.vocab, 8);
    let mut a = Sequence::new(prompt.clone());
    let mut b = Sequence::new(other.clone());
    let mut rows_a: Vec<Vec<f32>> = Vec::new();
    let first = m.runner.step(&mut [&mut a], 20, Logits::All).unwrap();
    rows_a.extend(first.chunks(m.vocab).map(<[f32]>::to_vec));
    let out = m.runner.step(&mut [&mut b, &mut a], WHOLE, Logits::All).unwrap();
    let rows: Vec<Vec<f32>> = out.chunks(m.vocab).map(<[f32]>::to_vec).collect();
    rows_a.extend(rows[other.len()..].iter().cloned());
    assert_bit_identical(&format!("{}: split prefill in a mixed batch", m.name), &whole, &rows_a);
    let b_alone = score(&mut m.runner, &other, WHOLE);
    m.runner.release(&mut a);
    m.runner.release(&mut b);
    assert_bit_identical(&format!("{}: the other sequence", m.name), &b_alone, &rows[..other.len()]);
    assert_eq!(m.runner.free_blocks(), initial);
}

#[test]
fn chunked_prefill_equals_whole_gguf() {
    check_chunked_prefill(smollm2());
}

#[test]
fn chunked_prefill_equals_whole_hf() {
    check_chunked_prefill(qwen3());
}

// ---------------------------------------------------------------------------
// (c) generation: determinism and KV accounting

fn request(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize, ignore_eos: bool) -> GenerateRequest {
    GenerateRequest { prompt, sampling, max_tokens, stop: Vec::new(), stop_ids: Vec::new(), ignore_eos, format: None }
}

fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, seed: Some(1), ..SamplingParams::default() }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.9, seed: Some(seed), ..SamplingParams::default() }
}

fn gen(m: &mut Model, tok: &Tokenizer, req: &GenerateRequest) -> Generation {
    let before = m.runner.free_blocks();
    let g = generate(&mut m.runner, tok, req, &mut |_| true).unwrap();
    assert_eq!(m.runner.free_blocks(), before, "{}: KV blocks leaked by a finished generation", m.name);
    g
}

fn check_generation(mut m: Model, tok: &Tokenizer, prompt: Vec<u32>, ignore_eos: bool) {
    let initial = m.runner.free_blocks();
    assert_eq!(initial, CTX.div_ceil(16));
    let n = 12;

    // Same request, same result: greedy, and sampled under a seed.
    let g1 = gen(&mut m, tok, &request(prompt.clone(), greedy(), n, ignore_eos));
    let g2 = gen(&mut m, tok, &request(prompt.clone(), greedy(), n, ignore_eos));
    assert!(!g1.tokens.is_empty());
    assert_eq!(g1.tokens, g2.tokens, "{}: greedy is not deterministic", m.name);
    assert_eq!(g1.text, g2.text);
    assert_eq!(g1.finish, g2.finish);
    let s1 = gen(&mut m, tok, &request(prompt.clone(), sampled(7), n, ignore_eos));
    let s2 = gen(&mut m, tok, &request(prompt.clone(), sampled(7), n, ignore_eos));
    assert_eq!(s1.tokens, s2.tokens, "{}: seeded sampling is not deterministic", m.name);
    assert_eq!(s1.text, s2.text);

    // Greedy decode picks the argmax of the teacher-forced (whole prefill) logits.
    let mut full = prompt.clone();
    full.extend(&g1.tokens);
    let rows = score(&mut m.runner, &full, WHOLE);
    for (i, &t) in g1.tokens.iter().enumerate() {
        assert_eq!(argmax(&rows[prompt.len() - 1 + i]) as u32, t, "{}: greedy token {i}", m.name);
    }

    // Errors leave every block free, and the runner keeps working.
    let ctx = m.runner.max_context();
    let too_long = ids(ctx, m.vocab, 3);
    assert!(generate(&mut m.runner, tok, &request(too_long, greedy(), n, ignore_eos), &mut |_| true).is_err());
    let bad_sampling = SamplingParams { temperature: f32::NAN, ..greedy() };
    assert!(generate(&mut m.runner, tok, &request(prompt.clone(), bad_sampling, n, ignore_eos), &mut |_| true).is_err());
    assert!(generate(&mut m.runner, tok, &request(Vec::new(), greedy(), n, ignore_eos), &mut |_| true).is_err());
    // Fails inside the forward pass, after the prompt's blocks were reserved.
    let mut bad_token = prompt.clone();
    bad_token.push(m.vocab as u32 + 5);
    let e = generate(&mut m.runner, tok, &request(bad_token, greedy(), n, ignore_eos), &mut |_| true);
    assert!(e.is_err(), "{}: an out-of-vocabulary prompt token was accepted", m.name);
    assert_eq!(m.runner.free_blocks(), initial, "{}: KV blocks leaked by failed generations", m.name);
    let g3 = gen(&mut m, tok, &request(prompt.clone(), greedy(), n, ignore_eos));
    assert_eq!(g3.tokens, g1.tokens, "{}: a failed request changed later results", m.name);

    // Cancellation after three tokens: a prefix of the full run, blocks freed.
    let mut seen = 0;
    let c = generate(&mut m.runner, tok, &request(prompt.clone(), greedy(), n, ignore_eos), &mut |_| {
        seen += 1;
        seen < 3
    })
    .unwrap();
    assert_eq!(c.finish, FinishReason::Cancelled);
    assert_eq!(c.tokens.len(), 3.min(g1.tokens.len()));
    assert_eq!(c.tokens[..], g1.tokens[..c.tokens.len()]);
    assert_eq!(m.runner.free_blocks(), initial, "{}: KV blocks leaked by a cancelled generation", m.name);

    // Cancelled at the first token, and a prompt that nearly fills the context.
    let c = generate(&mut m.runner, tok, &request(prompt.clone(), greedy(), n, ignore_eos), &mut |_| false).unwrap();
    assert_eq!((c.finish, c.tokens.len()), (FinishReason::Cancelled, 1));
    let near_full = ids(ctx - 2, m.vocab, 4);
    let g = gen(&mut m, tok, &request(near_full, greedy(), n, true));
    assert_eq!(g.tokens.len(), 2, "{}: generation must stop at the context's end", m.name);
    assert_eq!(m.runner.free_blocks(), initial);
}

#[test]
fn generation_deterministic_and_frees_blocks_gguf() {
    let tok = tokenizer();
    let m = smollm2();
    let prompt = tok
        .encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n", false)
        .unwrap();
    check_generation(m, &tok, prompt, false);
}

#[test]
fn generation_deterministic_and_frees_blocks_hf() {
    let tok = tokenizer();
    let m = qwen3();
    let prompt = ids(10, m.vocab, 9);
    // The borrowed tokenizer's end-of-text ids mean nothing to this model.
    check_generation(m, &tok, prompt, true);
}
