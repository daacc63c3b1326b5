//! The serving engine on a real model (smollm2, quantized weights, f16 KV):
//! continuous batching, chunked prefill mixed with decodes, prefix-cache hits
//! and preemption change nothing. Greedy outputs of concurrent requests equal
//! the same requests run one at a time through `generate` (a separate path
//! with whole-prompt prefill and no sharing), token for token; and every KV
//! block is free afterwards.

mod common;
use common::*;

use std::sync::Arc;

use ferrite_core::Error;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{generate, Engine, EngineConfig, Event, FinishReason, GenerateRequest, Request, RequestStream};
use ferrite_loader::source::resolve;
use ferrite_loader::tokenizer::Tokenizer;
use ferrite_models::Checkpoint;

const CTX: usize = 512;
const NEW: usize = 12;

fn tokenizer() -> Arc<Tokenizer> {
    let ck = Checkpoint::open(&resolve("smollm2").unwrap()).unwrap();
    let Checkpoint::Gguf(g) = &ck else { panic!("smollm2 is a GGUF") };
    Arc::new(Tokenizer::from_gguf(g).unwrap())
}

/// 32 prompts: some share a long opening (prefix-cache hits), lengths vary
/// from a few tokens to a few hundred (chunked prefill).
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    let shared = "You are a careful assistant. Answer briefly and precisely. ".repeat(6);
    let topics = ["rivers", "bread", "comets", "violins", "glaciers", "bees", "ships", "copper"];
    (0..32)
        .map(|i| {
            let topic = topics[i % topics.len()];
            let text = match i % 4 {
                0 => format!("{shared}Tell me about {topic}."),
                1 => format!("The history of {topic}"),
                2 => format!("{shared}{}", format!("Facts about {topic} number {i}: ").repeat(1 + i % 5)),
                _ => format!("Q{i}: why {topic}?"),
            };
            tok.encode(&text, true).unwrap()
        })
        .collect()
}

fn reference(tok: &Tokenizer, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let mut runner = runner_for("smollm2", CTX);
    prompts
        .iter()
        .map(|p| {
            let req = GenerateRequest {
                prompt: p.clone(),
                sampling: SamplingParams::greedy(),
                max_tokens: NEW,
                stop: Vec::new(),
                stop_ids: Vec::new(),
                ignore_eos: true,
                format: None,
            };
            generate(&mut runner, tok, &req, &mut |_| true).unwrap().tokens
        })
        .collect()
}

fn engine(tok: &Arc<Tokenizer>, n_blocks: usize, config: EngineConfig) -> Engine {
    model_path("smollm2.gguf");
    let source = resolve("smollm2").unwrap();
    let ck = Checkpoint::open(&source).unwrap();
    let lm = ferrite_models::load_causal_lm(ferrite_backend::cpu::CpuBackend::F32, &ck, &mut |_, _| {}).unwrap();
    let runner = ferrite_engine::Runner::with_pool(lm, CTX, n_blocks, 16, ferrite_models::KvDtype::F16).unwrap();
    Engine::start(runner, tok.clone(), config).unwrap()
}

fn greedy(prompt: &[u32], max_tokens: usize) -> Request {
    let mut r = Request::new(prompt.to_vec(), SamplingParams::greedy(), max_tokens);
    r.ignore_eos = true;
    r
}

/// Collects a stream's tokens and its summary.
fn drain(mut s: RequestStream) -> (Vec<u32>, ferrite_engine::Summary) {
    let mut tokens = Vec::new();
    loop {
        match s.next_blocking().expect("stream ended without Done") {
            Event::Token { token, .. } => tokens.push(token),
            Event::Done(sum) => return (tokens, sum),
            Event::PromptLogprobs(_) => panic!("prompt scores nobody asked for"),
        }
    }
}

fn run_concurrently(engine: &Engine, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, ferrite_engine::Summary)> {
    let streams: Vec<RequestStream> = prompts.iter().map(|p| engine.submit(greedy(p, NEW)).unwrap()).collect();
    streams.into_iter().map(drain).collect()
}

fn wait_all_free(engine: &Engine) {
    for _ in 0..200 {
        let m = engine.metrics();
        if m.kv_blocks_used == 0 && m.running == 0 && m.waiting == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("blocks still held: {:?}", engine.metrics());
}

#[test]
fn concurrent_requests_equal_one_at_a_time_with_prefix_hits_chunks_and_preemption() {
    let tok = tokenizer();
    let prompts = prompts(&tok);
    let want = reference(&tok, &prompts);

    // Plenty of blocks, a small token budget: prefills are chunked and mixed
    // with decodes, and the shared opening is served from the prefix cache.
    let config = EngineConfig { max_num_seqs: 32, max_batched_tokens: 96, ..EngineConfig::default() };
    let e = engine(&tok, 4 * CTX / 16 * 8, config);
    let got = run_concurrently(&e, &prompts);
    for (i, ((tokens, sum), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "request {i} differs when batched");
        assert_eq!(
            (sum.finish, sum.completion_tokens, sum.prompt_tokens),
            (FinishReason::Length, NEW, prompts[i].len())
        );
    }
    let m = e.metrics();
    assert!(m.prefix_hit_tokens > 0, "no prefix-cache hits: {m:?}");
    assert!(got.iter().any(|(_, s)| s.cached_tokens > 0));
    // The same prompts again: now mostly cache hits, same tokens.
    let again = run_concurrently(&e, &prompts);
    for (i, ((tokens, _), want)) in again.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "request {i} differs on a prefix-cache hit");
    }
    wait_all_free(&e);
    e.shutdown();

    // Too few blocks for everyone: sequences are preempted and recomputed.
    let config = EngineConfig { max_num_seqs: 32, max_batched_tokens: 256, ..EngineConfig::default() };
    let e = engine(&tok, 48, config);
    let got = run_concurrently(&e, &prompts);
    for (i, ((tokens, _), want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "request {i} differs after preemption");
    }
    assert!(e.metrics().preemptions > 0, "the small pool caused no preemption");
    wait_all_free(&e);
    e.shutdown();
}

#[test]
fn cancellation_errors_and_shutdown_free_everything() {
    let tok = tokenizer();
    let config = EngineConfig { max_num_seqs: 4, max_batched_tokens: 64, max_waiting: 3, prefix_caching: true };
    let e = engine(&tok, 4 * CTX / 16, config);
    let p = tok.encode("Once upon a time", true).unwrap();

    // Over the context, empty, out-of-vocabulary, bad sampling: refused up front.
    let err = e.submit(greedy(&p, CTX)).err().unwrap();
    assert!(matches!(err, Error::InvalidInput(_)) && err.to_string().contains("context"), "{err}");
    assert!(matches!(e.submit(greedy(&[], 4)), Err(Error::InvalidInput(_))));
    assert!(matches!(e.submit(greedy(&[u32::MAX], 4)), Err(Error::InvalidInput(_))));
    let mut bad = greedy(&p, 4);
    bad.sampling.top_p = 2.0;
    assert!(matches!(e.submit(bad), Err(Error::InvalidInput(_))));

    // min_tokens masks the stop ids until enough tokens exist: make the greedy
    // first token a stop id, and it must not come first.
    let first = drain(e.submit(greedy(&p, 1)).unwrap()).0[0];
    let mut r = greedy(&p, 4);
    (r.stop_ids, r.ignore_eos) = (vec![first], false);
    let (tokens, sum) = drain(e.submit(r.clone()).unwrap());
    assert_eq!((tokens.as_slice(), sum.finish), (&[first][..], FinishReason::Stop));
    r.min_tokens = 2;
    let (tokens, _) = drain(e.submit(r).unwrap());
    assert!(tokens.len() >= 2 && tokens[0] != first, "{tokens:?}");

    // A dropped stream frees its blocks at once, mid-generation.
    let mut s = e.submit(greedy(&p, 400)).unwrap();
    assert!(matches!(s.next_blocking(), Some(Event::Token { .. })));
    drop(s);
    wait_all_free(&e);

    // A full queue answers Busy instead of growing without bound: 4 running
    // (max_num_seqs), 3 waiting (max_waiting), the 8th is refused.
    let mut running = Vec::new();
    for n in 1..=4 {
        running.push(e.submit(greedy(&p, 200)).unwrap());
        while e.metrics().running < n {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    let waiting: Vec<_> = (0..3).map(|_| e.submit(greedy(&p, 200)).unwrap()).collect();
    assert!(matches!(e.submit(greedy(&p, 200)), Err(Error::Busy(_))));
    drop(running);
    drop(waiting);
    wait_all_free(&e);

    // Shutdown ends in-flight streams with Cancelled.
    let s = e.submit(greedy(&p, 400)).unwrap();
    let e2 = e.clone();
    let t = std::thread::spawn(move || drain(s));
    std::thread::sleep(std::time::Duration::from_millis(200));
    e2.shutdown();
    let (_, sum) = t.join().unwrap();
    assert_eq!(sum.finish, FinishReason::Cancelled);
    assert!(e.submit(greedy(&p, 4)).is_err(), "a stopped engine takes no work");
}

/// A generation that ends on an end-of-generation id releases the text held
/// back for a stop string that never came, in `generate` and in the engine.
#[test]
fn text_held_for_a_stop_string_is_released_at_the_end() {
    let tok = tokenizer();
    let prompt = tok.encode("The history of rivers", true).unwrap();
    let full = reference(&tok, std::slice::from_ref(&prompt)).remove(0);
    // End on the first token (from the fourth on) not seen before it.
    let at = (3..full.len()).find(|&i| !full[..i].contains(&full[i])).expect("a new token");
    let want = tok.decode(&full[..at], false);
    // A stop string starting with the text's last character: that character
    // is held back until generation ends.
    let stop = vec![format!("{}\u{7}", want.chars().last().unwrap())];

    let mut runner = runner_for("smollm2", CTX);
    let req = GenerateRequest {
        prompt: prompt.clone(),
        sampling: SamplingParams::greedy(),
        max_tokens: NEW,
        stop: stop.clone(),
        stop_ids: vec![full[at]],
        ignore_eos: true,
        format: None,
    };
    let g = generate(&mut runner, &tok, &req, &mut |_| true).unwrap();
    assert_eq!((g.text.as_str(), g.finish), (want.as_str(), FinishReason::Stop));

    let e = engine(&tok, 4 * CTX / 16, EngineConfig::default());
    let mut r = greedy(&prompt, NEW);
    (r.stop, r.stop_ids) = (stop, vec![full[at]]);
    let mut s = e.submit(r).unwrap();
    let mut text = String::new();
    let finish = loop {
        match s.next_blocking().expect("stream ended without Done") {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done(sum) => break sum.finish,
            Event::PromptLogprobs(_) => unreachable!(),
        }
    };
    assert_eq!((text.as_str(), finish), (want.as_str(), FinishReason::Stop));
}

/// min_tokens: more than a request may generate is refused, and stop strings
/// are not looked for before it (as vLLM does).
#[test]
fn min_tokens_bounds_and_delays_stop_strings() {
    let tok = tokenizer();
    let prompt = tok.encode("The history of bread", true).unwrap();
    let full = reference(&tok, std::slice::from_ref(&prompt)).remove(0);
    let e = engine(&tok, 4 * CTX / 16, EngineConfig::default());
    let mut r = greedy(&prompt, 4);
    r.min_tokens = 5;
    assert!(matches!(e.submit(r), Err(Error::InvalidInput(m)) if m.contains("min_tokens")));

    // A stop string that the second token's text completes.
    let second = tok.decode(&full[1..2], false);
    let stop = second.trim().to_string();
    assert!(!stop.is_empty(), "{second:?}");
    let run = |min_tokens: usize| {
        let mut r = greedy(&prompt, NEW);
        (r.stop, r.min_tokens) = (vec![stop.clone()], min_tokens);
        let mut s = e.submit(r).unwrap();
        let (mut n, mut text) = (0, String::new());
        loop {
            match s.next_blocking().expect("stream ended without Done") {
                Event::Token { text: t, .. } => (n, text) = (n + 1, text + &t),
                Event::Done(sum) => return (n, text, sum.finish),
                Event::PromptLogprobs(_) => unreachable!(),
            }
        }
    };
    let (n, text, finish) = run(0);
    assert_eq!((n, finish), (2, FinishReason::Stop));
    assert!(!text.contains(&stop), "{text:?}");
    // Not before min_tokens: the stop string goes out in the text, and
    // generation goes on to min_tokens at least.
    let (n, text, _) = run(4);
    assert!(n >= 4 && text.contains(&stop), "{n} tokens: {text:?}");
}

/// Prompt logprobs (`Request::prompt_logprobs`) come first, once, one per
/// prompt token after the first, and equal the log-softmax of the whole
/// prompt's logits run alone, whether prefills are chunked, sequences
/// preempted or their openings already in the prefix cache; with
/// `max_tokens` 0 nothing else comes.
#[test]
fn prompt_scores_survive_chunks_preemption_and_cached_prefixes() {
    let tok = tokenizer();
    let prompts = prompts(&tok);
    let mut runner = runner_for("smollm2", CTX);
    let scored: Vec<usize> = (0..prompts.len()).step_by(3).collect();
    let want: Vec<Vec<f32>> = scored
        .iter()
        .map(|&i| {
            let p = &prompts[i];
            let rows = score(&mut runner, p, CTX);
            (1..p.len()).map(|j| log_softmax_at(&rows[j - 1], p[j] as usize)).collect()
        })
        .collect();
    // Twice: the second round finds the shared openings cached (scored
    // prompts must not take them), and small pools preempt.
    for (n_blocks, budget) in [(4 * CTX / 16 * 8, 40), (48, 256)] {
        let config = EngineConfig { max_num_seqs: 32, max_batched_tokens: budget, ..EngineConfig::default() };
        let e = engine(&tok, n_blocks, config);
        for round in 0..2 {
            let streams: Vec<RequestStream> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut r = greedy(p, NEW);
                    r.prompt_logprobs = scored.contains(&i).then_some(2);
                    e.submit(r).unwrap()
                })
                .collect();
            for (i, mut s) in streams.into_iter().enumerate() {
                let Some(k) = scored.iter().position(|&x| x == i) else {
                    drain(s);
                    continue;
                };
                let Some(Event::PromptLogprobs(got)) = s.next_blocking() else { panic!("no prompt scores first") };
                assert_eq!(got.len(), prompts[i].len() - 1);
                for (j, (g, &w)) in got.iter().zip(&want[k]).enumerate() {
                    assert_eq!(g.token, prompts[i][j + 1]);
                    assert!((g.logprob - w).abs() < 1e-3, "prompt {i} token {j}: {} against {w}", g.logprob);
                    assert!(g.top.len() == 2 && g.top[0].logprob >= g.top[1].logprob && g.top[0].logprob >= g.logprob);
                }
                let (tokens, sum) = drain(s);
                assert_eq!((tokens.len(), sum.cached_tokens), (NEW, 0), "round {round}, prompt {i}");
            }
        }
        // max_tokens 0: the scores, then the end, nothing drawn; a one-token
        // prompt has nothing to score but says so first all the same.
        for (prompt, scores) in [(&prompts[0], prompts[0].len() - 1), (&prompts[0][..1].to_vec(), 0)] {
            let mut r = greedy(prompt, 0);
            r.prompt_logprobs = Some(0);
            let mut s = e.submit(r).unwrap();
            assert!(matches!(s.next_blocking(), Some(Event::PromptLogprobs(v)) if v.len() == scores));
            let (tokens, sum) = drain(s);
            assert_eq!((tokens.len(), sum.finish, sum.completion_tokens), (0, FinishReason::Length, 0));
        }
        wait_all_free(&e);
        if n_blocks == 48 {
            assert!(e.metrics().preemptions > 0, "the small pool caused no preemption");
        } else {
            assert!(e.metrics().prefix_hit_tokens > 0, "no prefix-cache hits");
        }
        e.shutdown();
    }
}

fn log_softmax_at(row: &[f32], i: usize) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
    row[i] - max - z.ln() as f32
}
