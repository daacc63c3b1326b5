//! The engine's device-sampling path (taken by `serve` and `run` on a GPU),
//! driven on the CPU: a model wrapper that says it samples where its logits
//! are and draws from `ferrite_backend::sampling`'s reference distribution.
//! Greedy requests give the host path's tokens, batched or alone; logit bias
//! and min_tokens reach the device as edits; requests that want top logprobs,
//! prompt scores or a JSON value keep the host path.

mod common;
use common::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferrite_backend::picks::{fed, fed_row};
use ferrite_backend::sampling;
use ferrite_core::Result;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{generate, Engine, EngineConfig, Event, GenerateRequest, Request, Runner};
use ferrite_loader::source::resolve;
use ferrite_loader::tokenizer::Tokenizer;
use ferrite_models::{CausalLm, Checkpoint, ForwardBatch, KvDtype, LmConfig, RowSampling};

const CTX: usize = 256;
const NEW: usize = 10;

/// The real CPU model, sampling "on the device" by the reference rules;
/// with `feeds`, a batch's token ids may name its last picks (fed ids), as
/// a GPU's may.
struct DeviceLike {
    inner: Box<dyn CausalLm>,
    draws: Arc<AtomicUsize>,
    /// Rows drawn with a pending token (their last pick, unread), and steps
    /// whose logits went to the host.
    pending: Arc<AtomicUsize>,
    host_steps: Arc<AtomicUsize>,
    feeds: bool,
    last: Vec<u32>,
}

impl CausalLm for DeviceLike {
    fn config(&self) -> &LmConfig {
        self.inner.config()
    }
    fn backend_name(&self) -> String {
        self.inner.backend_name()
    }
    fn alloc_kv(&mut self, n_blocks: usize, block_size: usize, dtype: KvDtype) -> Result<()> {
        self.inner.alloc_kv(n_blocks, block_size, dtype)
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>> {
        self.host_steps.fetch_add(1, Ordering::SeqCst);
        let batch = self.resolve(batch);
        self.inner.forward(&batch)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn forward_sample(&mut self, batch: &ForwardBatch, rows: &[RowSampling]) -> Result<Vec<(u32, f32)>> {
        assert_eq!(rows.len(), batch.logit_rows.len());
        let vocab = self.config().vocab_size;
        // A pending token is the row's own pick of the last launch, its fed input.
        let mut resolved = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            if r.pending.is_some() {
                assert_eq!(batch_input(batch, i), fed(i), "row {i}'s pending token is another row's pick");
                self.pending.fetch_add(1, Ordering::SeqCst);
            }
            resolved.push(sampling::with_pending(r, self.last.get(i).copied().unwrap_or(u32::MAX)));
        }
        let batch = self.resolve(batch);
        let logits = self.inner.forward(&batch)?;
        self.draws.fetch_add(rows.len(), Ordering::SeqCst);
        let picks: Vec<(u32, f32)> = logits.chunks(vocab).zip(&resolved).map(|(row, r)| draw(row, r)).collect();
        self.last = picks.iter().map(|p| p.0).collect();
        Ok(picks)
    }
    fn feeds_tokens(&self) -> bool {
        self.feeds
    }
}

impl DeviceLike {
    /// The batch with its fed ids replaced by the last picks they name.
    fn resolve(&self, batch: &ForwardBatch) -> ForwardBatch {
        let mut batch = batch.clone();
        for t in &mut batch.tokens {
            if let Some(j) = fed_row(*t) {
                assert!(self.feeds, "a fed id given to a model that does not feed");
                *t = self.last[j];
            }
        }
        batch
    }
}

/// The input token of the row whose logits row `i` is.
fn batch_input(batch: &ForwardBatch, i: usize) -> u32 {
    batch.tokens[batch.logit_rows[i]]
}

/// One draw from the reference distribution, by the row's seed.
fn draw(row: &[f32], r: &RowSampling) -> (u32, f32) {
    let probs = sampling::probabilities(row, r);
    let u = (r.seed >> 11) as f64 / (1u64 << 53) as f64;
    let mut acc = 0.0;
    let last = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
    let token = probs.iter().position(|&p| {
        acc += p;
        p > 0.0 && acc > u
    });
    let token = token.unwrap_or(last) as u32;
    (token, sampling::logprob(row, r, token))
}

fn model() -> Box<dyn CausalLm> {
    model_path("smollm2.gguf");
    let ck = Checkpoint::open(&resolve("smollm2").unwrap()).unwrap();
    ferrite_models::load_causal_lm(ferrite_backend::cpu::CpuBackend::F32, &ck, &mut |_, _| {}).unwrap()
}

fn device_runner(draws: &Arc<AtomicUsize>, n_blocks: Option<usize>) -> Runner {
    feeding_runner(draws, n_blocks, true)
}

fn feeding_runner(draws: &Arc<AtomicUsize>, n_blocks: Option<usize>, feeds: bool) -> Runner {
    pending_runner(draws, [&Arc::default(), &Arc::default()], n_blocks, feeds)
}

/// A runner whose model counts the rows drawn with a pending token and the
/// steps whose logits go to the host in `counts`.
fn pending_runner(
    draws: &Arc<AtomicUsize>,
    counts: [&Arc<AtomicUsize>; 2],
    n_blocks: Option<usize>,
    feeds: bool,
) -> Runner {
    let (draws, pending, host_steps) = (draws.clone(), counts[0].clone(), counts[1].clone());
    let lm = Box::new(DeviceLike { inner: model(), draws, pending, host_steps, feeds, last: Vec::new() });
    match n_blocks {
        Some(n) => Runner::with_pool(lm, CTX, n, 16, KvDtype::F16).unwrap(),
        None => Runner::new(lm, CTX, 16, KvDtype::F16).unwrap(),
    }
}

fn tokenizer() -> Arc<Tokenizer> {
    let ck = Checkpoint::open(&resolve("smollm2").unwrap()).unwrap();
    let Checkpoint::Gguf(g) = &ck else { panic!("smollm2 is a GGUF") };
    Arc::new(Tokenizer::from_gguf(g).unwrap())
}

fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    ["The river", "Bread is made of", "Comets are", "Tell me about bees and their hives."]
        .iter()
        .map(|t| tok.encode(t, true).unwrap())
        .collect()
}

fn request(prompt: &[u32], sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        sampling,
        max_tokens: NEW,
        stop: Vec::new(),
        stop_ids: Vec::new(),
        ignore_eos: true,
        format: None,
    }
}

fn drain(mut s: ferrite_engine::RequestStream) -> (Vec<u32>, Vec<usize>) {
    let (mut tokens, mut tops) = (Vec::new(), Vec::new());
    loop {
        match s.next_blocking().expect("stream ended without Done") {
            Event::Token { token, top_logprobs, .. } => {
                tokens.push(token);
                tops.push(top_logprobs.len());
            }
            Event::Done(_) => return (tokens, tops),
            Event::PromptLogprobs(_) => panic!("prompt scores nobody asked for"),
        }
    }
}

#[test]
fn greedy_picks_on_the_device_equal_the_host_path() {
    let tok = tokenizer();
    let prompts = prompts(&tok);
    let mut host = runner_for("smollm2", CTX);
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(&mut host, &tok, &request(p, SamplingParams::greedy()), &mut |_| true).unwrap().tokens)
        .collect();

    // `run`: one request at a time.
    let draws = Arc::new(AtomicUsize::new(0));
    let mut dev = device_runner(&draws, None);
    for (p, want) in prompts.iter().zip(&want) {
        let got = generate(&mut dev, &tok, &request(p, SamplingParams::greedy()), &mut |_| true).unwrap();
        assert_eq!(&got.tokens, want);
    }
    assert_eq!(draws.load(Ordering::SeqCst), prompts.len() * NEW, "every token drawn on the device");

    // `serve`: all at once.
    let draws = Arc::new(AtomicUsize::new(0));
    let engine = Engine::start(device_runner(&draws, Some(64)), tok.clone(), EngineConfig::default()).unwrap();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut r = Request::new(p.clone(), SamplingParams::greedy(), NEW);
            r.ignore_eos = true;
            engine.submit(r).unwrap()
        })
        .collect();
    for (s, want) in streams.into_iter().zip(&want) {
        assert_eq!(&drain(s).0, want, "batched, picked on the device");
    }
    assert_eq!(draws.load(Ordering::SeqCst), prompts.len() * NEW);
    engine.shutdown();
}

#[test]
fn bias_and_min_tokens_reach_the_device_and_logprobs_keep_the_host_path() {
    let tok = tokenizer();
    let prompt = tok.encode("Once upon a time", true).unwrap();
    let draws = Arc::new(AtomicUsize::new(0));
    let engine = Engine::start(device_runner(&draws, Some(64)), tok.clone(), EngineConfig::default()).unwrap();

    // A huge bias on one token: every pick is that token.
    let forced = 1234u32;
    let biased = SamplingParams { logit_bias: vec![(forced, 100.0)], ..SamplingParams::greedy() };
    let mut r = Request::new(prompt.clone(), biased, NEW);
    r.ignore_eos = true;
    let (tokens, _) = drain(engine.submit(r).unwrap());
    assert_eq!(tokens, vec![forced; NEW]);

    // End of generation pushed to the top but banned until min_tokens.
    let eos = tok.eos_ids()[0];
    let ending = SamplingParams { logit_bias: vec![(eos, 100.0)], ..SamplingParams::greedy() };
    let mut r = Request::new(prompt.clone(), ending, NEW);
    r.min_tokens = 4;
    let (tokens, _) = drain(engine.submit(r).unwrap());
    assert_eq!(tokens.len(), 5, "four tokens, then end of generation: {tokens:?}");
    assert!(tokens[..4].iter().all(|&t| t != eos) && tokens[4] == eos, "{tokens:?}");
    let before = draws.load(Ordering::SeqCst);
    // Each step goes out before the last pick is read (the ban counts the
    // picks on their way back): one step past the end, discarded.
    assert_eq!(before, NEW + 5 + 1);

    // Top logprobs need the logits on the host.
    let wants_top = SamplingParams { logprobs: Some(2), ..SamplingParams::greedy() };
    let mut r = Request::new(prompt, wants_top, NEW);
    r.ignore_eos = true;
    let (tokens, tops) = drain(engine.submit(r).unwrap());
    assert_eq!(tokens.len(), NEW);
    assert!(tops.iter().all(|&n| n == 2));
    assert_eq!(draws.load(Ordering::SeqCst), before, "no device draw for a top-logprobs request");
    engine.shutdown();
}

/// `run` launches each decode step before the last one's pick is read, fed
/// from the device: the same tokens as waiting for each pick, for greedy and
/// seeded draws, whether generation ends by length (1, 2 and NEW tokens) or
/// at a stop id mid-way, and no more than one draw past the end.
#[test]
fn steps_fed_from_the_device_give_the_tokens_of_steps_that_wait() {
    let tok = tokenizer();
    let prompt = tok.encode("The river", true).unwrap();
    let seeded = SamplingParams { temperature: 0.9, seed: Some(7), ..SamplingParams::greedy() };
    let (waits, fed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut waiting = feeding_runner(&waits, None, false);
    let mut feeding = feeding_runner(&fed, None, true);
    for sampling in [SamplingParams::greedy(), seeded] {
        for (max_tokens, stop_at) in [(1, None), (2, None), (NEW, None), (NEW, Some(3))] {
            let mut req = GenerateRequest { max_tokens, ..request(&prompt, sampling.clone()) };
            if let Some(k) = stop_at {
                let free = generate(&mut waiting, &tok, &req, &mut |_| true).unwrap().tokens;
                req.stop_ids = vec![free[k]];
            }
            let (w0, f0) = (waits.load(Ordering::SeqCst), fed.load(Ordering::SeqCst));
            let want = generate(&mut waiting, &tok, &req, &mut |_| true).unwrap();
            let got = generate(&mut feeding, &tok, &req, &mut |_| true).unwrap();
            assert_eq!(got.tokens, want.tokens, "max_tokens {max_tokens}, stop at {stop_at:?}");
            assert_eq!(got.finish, want.finish);
            let (w, f) = (waits.load(Ordering::SeqCst) - w0, fed.load(Ordering::SeqCst) - f0);
            assert_eq!(w, want.tokens.len());
            assert!(f == w || (f == w + 1 && stop_at.is_some()), "{f} draws fed against {w} waiting");
        }
    }
}

/// Requests with repetition, presence and frequency penalties fed ahead, the
/// device counting each row's unread pick in (`Runner::feeds_pending`): the
/// same tokens as steps that wait, greedy and seeded, in `run` and in
/// `serve`, where the first request ends first, so the others' rows move
/// and the step after waits for their picks instead.
#[test]
fn penalized_steps_fed_ahead_give_the_tokens_of_steps_that_wait() {
    let tok = tokenizer();
    let prompts = prompts(&tok);
    let penalized = |i: usize| SamplingParams {
        repetition_penalty: 1.3,
        penalty_last_n: 3 + i,
        presence_penalty: 0.5,
        frequency_penalty: 0.3,
        temperature: if i.is_multiple_of(2) { 0.0 } else { 0.8 },
        seed: Some(i as u64),
        ..SamplingParams::greedy()
    };
    let pending = Arc::new(AtomicUsize::new(0));
    let mut waiting = feeding_runner(&Arc::default(), None, false);
    let mut feeding = pending_runner(&Arc::default(), [&pending, &Arc::default()], None, true);
    feeding.set_feeds_pending(true);
    for (i, p) in prompts.iter().enumerate() {
        let req = request(p, penalized(i));
        let want = generate(&mut waiting, &tok, &req, &mut |_| true).unwrap();
        let got = generate(&mut feeding, &tok, &req, &mut |_| true).unwrap();
        assert_eq!(got.tokens, want.tokens, "run, request {i}");
    }
    // Each request's first two tokens come from steps whose inputs were known.
    assert_eq!(pending.load(Ordering::SeqCst), prompts.len() * (NEW - 2));

    let requests: Vec<Request> = (0..prompts.len())
        .map(|i| {
            let mut r = Request::new(prompts[i].clone(), penalized(i), NEW - 2 * (prompts.len() - 1 - i));
            r.ignore_eos = true;
            r
        })
        .collect();
    let engine = Engine::start(feeding_runner(&Arc::default(), Some(64), false), tok.clone(), EngineConfig::default());
    let engine = engine.unwrap();
    let mut want: Vec<Vec<u32>> = requests.iter().map(|r| drain(engine.submit(r.clone()).unwrap()).0).collect();
    engine.shutdown();
    // The second request stops at a stop id drawn in the first one's last
    // step (where they start together): the step after, whose rows moved,
    // reads that pick first and ends the request it holds.
    let mut requests = requests;
    let at = requests[0].max_tokens - 1;
    requests[1].stop_ids = vec![want[1][at]];
    let cut = want[1].iter().position(|&t| t == want[1][at]).unwrap();
    want[1].truncate(cut + 1);
    let (pending, host_steps) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut runner = pending_runner(&Arc::default(), [&pending, &host_steps], Some(64), true);
    runner.set_feeds_pending(true);
    let engine = Engine::start(runner, tok.clone(), EngineConfig::default()).unwrap();
    let streams: Vec<_> = requests.iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
    for (i, s) in streams.into_iter().enumerate() {
        assert_eq!(drain(s).0, want[i], "serve, request {i}");
    }
    assert!(pending.load(Ordering::SeqCst) > 0, "no step was fed ahead");
    assert_eq!(host_steps.load(Ordering::SeqCst), 0, "a step's logits went to the host");
    engine.shutdown();
}

/// `serve` launches each step before the last one's picks are read where the
/// device feeds them: the same tokens as steps that wait, for requests that
/// arrive together or while others decode, greedy or seeded, ending by
/// length or at a stop id; a client gone mid-stream does not stop the rest.
#[test]
fn serving_fed_from_the_device_gives_the_tokens_of_steps_that_wait() {
    let tok = tokenizer();
    let prompts = prompts(&tok);
    let seeded = |i: usize| SamplingParams { temperature: 0.8, seed: Some(i as u64), ..SamplingParams::greedy() };
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let sampling = if i % 2 == 0 { SamplingParams::greedy() } else { seeded(i) };
            let mut r = Request::new(p.clone(), sampling, NEW - i);
            r.ignore_eos = true;
            r
        })
        .collect();
    // Each request alone, every step waiting for its pick: the reference.
    let draws = Arc::new(AtomicUsize::new(0));
    let engine = Engine::start(feeding_runner(&draws, Some(64), false), tok.clone(), EngineConfig::default()).unwrap();
    let mut want: Vec<Vec<u32>> = requests.iter().map(|r| drain(engine.submit(r.clone()).unwrap()).0).collect();
    // A stop id mid-way for the first request.
    let mut requests = requests;
    requests[0].stop_ids = vec![want[0][3]];
    let cut = want[0].iter().position(|&t| t == want[0][3]).unwrap();
    want[0].truncate(cut + 1);
    engine.shutdown();

    let draws = Arc::new(AtomicUsize::new(0));
    let engine = Engine::start(feeding_runner(&draws, Some(64), true), tok.clone(), EngineConfig::default()).unwrap();
    // Two together, the rest while they decode.
    let mut streams: Vec<_> = requests[..2].iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
    let first = streams.remove(0);
    let (got0, _) = drain(first);
    streams.extend(requests[2..].iter().map(|r| engine.submit(r.clone()).unwrap()));
    assert_eq!(got0, want[0], "stopped at a stop id");
    for (i, s) in streams.into_iter().enumerate() {
        assert_eq!(drain(s).0, want[i + 1], "request {}", i + 1);
    }
    let sum: usize = want.iter().map(Vec::len).sum();
    let n = draws.load(Ordering::SeqCst);
    assert!(n == sum || n == sum + 1, "{n} draws for {sum} tokens (one more at most, after the stop id)");
    // A request whose logits go to the host (top logprobs) joins steps that
    // are fed ahead: the fed ids of the others are read on the device then.
    let mut streams: Vec<_> = requests[1..3].iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
    // (Their first two tokens out: the steps are being fed ahead.)
    let mut early = Vec::new();
    for _ in 0..2 {
        match streams[0].next_blocking() {
            Some(Event::Token { token, .. }) => early.push(token),
            _ => panic!("a token expected"),
        }
    }
    let mut tops =
        Request::new(prompts[2].clone(), SamplingParams { logprobs: Some(2), ..SamplingParams::greedy() }, 5);
    // (It scores its prompt too: those rows' logits go to the host as well.)
    (tops.ignore_eos, tops.prompt_logprobs) = (true, Some(1));
    let mut scored = engine.submit(tops).unwrap();
    match scored.next_blocking() {
        Some(Event::PromptLogprobs(s)) => assert_eq!(s.len(), prompts[2].len() - 1),
        _ => panic!("prompt scores expected first"),
    }
    streams.push(scored);
    let mut got: Vec<Vec<u32>> = streams.into_iter().map(|s| drain(s).0).collect();
    early.append(&mut got[0]);
    got[0] = early;
    assert_eq!((&got[0], &got[1]), (&want[1], &want[2]), "beside a request sampled on the host");
    assert_eq!(got[2], want[2][..5], "sampled on the host beside requests fed ahead");
    // A client that goes away mid-stream, then another request.
    let mut r = requests[1].clone();
    r.max_tokens = 64;
    drop(engine.submit(r).unwrap());
    let mut again = Request::new(prompts[2].clone(), SamplingParams::greedy(), 3);
    again.ignore_eos = true;
    // Beside it, requests for the prompt alone (max_tokens 0): their draws
    // on the device go unused, and nothing is fed ahead for them.
    let alone: Vec<_> = [prompts[1].clone(), prompts[3][..1].to_vec()]
        .into_iter()
        .map(|p| engine.submit(Request::new(p, SamplingParams::greedy(), 0)).unwrap())
        .collect();
    assert_eq!(drain(engine.submit(again).unwrap()).0, want[2][..3]);
    for s in alone {
        assert_eq!(drain(s).0, Vec::<u32>::new());
    }
    engine.shutdown();
}

/// Penalized requests that join while others decode (so rows are added and
/// leave in the middle of steps fed ahead), of several lengths: each gives
/// the tokens it gives alone with every step waiting.
#[test]
fn penalized_requests_joining_mid_decode_give_the_tokens_they_give_alone() {
    let tok = tokenizer();
    let prompts = prompts(&tok);
    let requests: Vec<Request> = (0..12)
        .map(|i| {
            let sampling = SamplingParams {
                repetition_penalty: 1.3,
                presence_penalty: 0.4,
                frequency_penalty: 0.3,
                temperature: if i % 3 == 2 { 0.8 } else { 0.0 },
                seed: Some(i as u64),
                ..SamplingParams::greedy()
            };
            let mut r = Request::new(prompts[i % prompts.len()].clone(), sampling, NEW + 4 - (i % 5) * 2);
            r.ignore_eos = true;
            r
        })
        .collect();
    let engine = Engine::start(feeding_runner(&Arc::default(), Some(128), false), tok.clone(), EngineConfig::default());
    let engine = engine.unwrap();
    let want: Vec<Vec<u32>> = requests.iter().map(|r| drain(engine.submit(r.clone()).unwrap()).0).collect();
    engine.shutdown();

    let (pending, host_steps) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut runner = pending_runner(&Arc::default(), [&pending, &host_steps], Some(128), true);
    runner.set_feeds_pending(true);
    let engine = Engine::start(runner, tok.clone(), EngineConfig::default()).unwrap();
    let mut streams = Vec::new();
    let mut early: Vec<Vec<u32>> = Vec::new();
    for group in requests.chunks(4) {
        streams.extend(group.iter().map(|r| engine.submit(r.clone()).unwrap()));
        // Two tokens of the group's first stream before the next group joins.
        let first = streams.len() - group.len();
        let mut got = Vec::new();
        for _ in 0..2 {
            match streams[first].next_blocking() {
                Some(Event::Token { token, .. }) => got.push(token),
                _ => panic!("a token expected"),
            }
        }
        early.push(got);
    }
    for (i, s) in streams.into_iter().enumerate() {
        let mut got = if i % 4 == 0 { early[i / 4].clone() } else { Vec::new() };
        got.extend(drain(s).0);
        assert_eq!(got, want[i], "request {i}");
    }
    assert!(pending.load(Ordering::SeqCst) > 0, "no step was fed ahead");
    assert_eq!(host_steps.load(Ordering::SeqCst), 0, "a step's logits went to the host");
    engine.shutdown();
}
