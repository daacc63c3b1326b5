//! `ferrite gpu-check`: on a machine with a GPU, every CUDA op against the CPU
//! (random inputs), the hardware ceilings, and optionally models teacher-forced
//! on the GPU against the CPU and against a reference's continuations.

use std::path::PathBuf;

use clap::Args;
use ferrite_backend::cuda::{CudaBackend, CudaOptions};
use ferrite_backend::harness::{check_backend, TOL_BF16, TOL_F32};
use ferrite_core::{Error, Result};
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{Logits, Runner, Sequence};
use ferrite_models::KvDtype;

use crate::bench::{decode_steps, greedy_steps};
use crate::device::{DeviceArgs, DeviceChoice};
use crate::draws::Draws;
use crate::load::{load, load_with_pool, KvPool};
use crate::ModelArgs;

#[derive(Args, Debug)]
pub struct GpuCheckArgs {
    /// The GPU to check.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// A model to compare, teacher-forced, on the GPU and the CPU (repeatable;
    /// each with the --golden at the same position).
    #[arg(long)]
    pub model: Vec<String>,
    /// A reference fixture (`prompt_ids` + `continuation_ids` per prompt, as
    /// tests/fixtures/llamacpp/*_greedy.json) for the --model at the same position.
    #[arg(long)]
    pub golden: Vec<PathBuf>,
    /// A tiny HF checkpoint directory with the transformers logits of its
    /// `input_ids` in logits.json (tests/fixtures/hf/*): run on the GPU with
    /// bf16 weights, every row's cosine to the reference must be >= 0.999.
    #[arg(long)]
    pub hf_golden: Vec<PathBuf>,
    /// Skip measuring copy bandwidth and GEMM rate.
    #[arg(long)]
    pub no_ceilings: bool,
    /// Random-weight Q4_K_M models (`random:<preset>:q4_k_m`) to decode one
    /// stream at a time with the persistent decode kernel (the window kernel
    /// where `FERRITE_CUDA_PERSISTENT_WINDOW=1`) against the chain of
    /// kernels, teacher-forced (repeatable; default: random:llama-3.2-1b:q4_k_m).
    #[arg(long)]
    pub persistent: Vec<String>,
    /// Run only the persistent-kernel check.
    #[arg(long)]
    pub persistent_only: bool,
    /// Run only the checks of batched streams against one at a time (e.g.
    /// again under a switch such as `FERRITE_CUDA_B32_TILES=0`).
    #[arg(long)]
    pub invariance_only: bool,
    /// In the persistent-kernel check, the chain with the fused MLP
    /// (`FERRITE_CUDA_MLP_FUSED=1`) against the chain instead.
    #[arg(long)]
    pub mlp_fused: bool,
}

/// Our top logit may beat the reference's token by at most this (a near-tie).
const NEAR_TIE: f32 = 0.5;

pub fn main(a: GpuCheckArgs) -> Result<()> {
    crate::load::init_threads(None)?;
    let mut failed = 0;
    if a.invariance_only {
        failed += invariance_checks(a.gpu)?;
    } else if !a.persistent_only {
        failed += main_checks(&a)?;
    }
    // Last: a kernel that traps leaves the process no GPU.
    let persistent = if a.invariance_only {
        vec![]
    } else if a.persistent.is_empty() {
        vec![PERSISTENT.to_string()]
    } else {
        a.persistent.clone()
    };
    for model in &persistent {
        let (worst, flips) = persistent_vs_chain(a.gpu, model, a.mlp_fused)?;
        let ok = flips == 0 && worst < 1e-2;
        let kind = match ferrite_core::env::cuda_persistent_window() {
            _ if a.mlp_fused => "fused MLP",
            0 => "persistent",
            1 => "window",
            _ => "window (with the MLP's input)",
        };
        outln!(
            "  {:4} {model}: decode steps by the {kind} kernel vs the chain of kernels: largest logit difference {worst:.2e} of the largest logit, {flips} top tokens differ beyond a near-tie",
            if ok { "ok" } else { "FAIL" }
        )?;
        failed += usize::from(!ok);
    }
    if failed > 0 {
        return Err(Error::Device(format!("{failed} check(s) failed")));
    }
    outln!("\nall checks passed")?;
    Ok(())
}

/// The op harness, the ceilings, the models, batching and graphs: the
/// checks that failed.
fn main_checks(a: &GpuCheckArgs) -> Result<usize> {
    let mut failed = 0;
    for (exact, dense_tol, label) in [(true, TOL_F32, "f32 weights in f32"), (false, TOL_BF16, "f32 weights in bf16")] {
        let opts = CudaOptions { ordinal: a.gpu, exact_f32: exact, ..Default::default() };
        let b = CudaBackend::open(&opts)?;
        if exact {
            outln!("device: {}", ferrite_backend::Backend::name(&b))?;
        }
        outln!("\nop harness ({label}): relative error against the CPU")?;
        let mut print = |c: &ferrite_backend::harness::Check| {
            let mark = if c.passed() { "ok" } else { "FAIL" };
            let _ = outln!("  {mark:4} {:<62} {:>10.2e}  (limit {:.0e})", c.op, c.rel_err, c.tol);
            let _ = std::io::Write::flush(&mut std::io::stdout());
        };
        failed += check_backend(&b, dense_tol, &mut print)?.iter().filter(|c| !c.passed()).count();
        if exact && !a.no_ceilings {
            let c = b.measure_ceilings()?;
            outln!(
                "\nceilings: device copy {:.0} GB/s (read + write){}, bf16 GEMM {:.0} TFLOP/s on random values \
                 ({:.0} with f32 output; {:.0} on zeros)",
                c.copy_bytes_per_s / 1e9,
                crate::bench::read_note(c.read_bytes_per_s),
                c.bf16_flops / 1e12,
                c.bf16_f32_out_flops / 1e12,
                c.bf16_zeros_flops / 1e12
            )?;
        }
    }
    if a.model.len() != a.golden.len() {
        return Err(Error::InvalidInput("give one --golden per --model".into()));
    }
    for (m, g) in a.model.iter().zip(&a.golden) {
        failed += compare_model(m, g, a.gpu)?;
    }
    failed += invariance_checks(a.gpu)?;
    // Quantized weights: the graphs take their memory from a pool of their
    // own, so their kernels start early (cuda/capture_alloc.rs).
    for (model, deterministic) in [(SMALL, false), (SMALL, true), (SMALL_Q8, false)] {
        let (worst, flips) = graphs_vs_eager(a.gpu, model, deterministic)?;
        let mode = match (deterministic, model == SMALL_Q8) {
            (true, _) => "--deterministic",
            (false, true) => "default, Q8_0 weights",
            (false, false) => "default",
        };
        // Deterministic: the same kernels, so bit-identical; default: the
        // graph's attention splits differ from eager's, so nearly equal.
        let ok = flips == 0 && if deterministic { worst == 0.0 } else { worst < 1e-3 };
        outln!(
            "  {:4} decode steps replayed as CUDA graphs vs eager ({mode}): largest logit difference {worst:.2e} of the largest logit, {flips} top tokens differ beyond a near-tie",
            if ok { "ok" } else { "FAIL" }
        )?;
        failed += usize::from(!ok);
    }
    for dir in &a.hf_golden {
        failed += compare_hf(dir, a.gpu)?;
    }
    Ok(failed)
}

/// Rows of the GPU's logits whose cosine to transformers' is under 0.999.
fn compare_hf(dir: &std::path::Path, gpu: usize) -> Result<usize> {
    let path = dir.join("logits.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let fx: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::format(e.to_string()))?;
    let want: Vec<Vec<f32>> = fx["logits"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r.as_array().into_iter().flatten().filter_map(|v| v.as_f64()).map(|v| v as f32).collect())
        .collect();
    let mut r = runner(&dir.to_string_lossy(), DeviceChoice::Cuda(gpu))?;
    let got = score(&mut r, &ids(&fx["input_ids"]))?;
    if got.len() != want.len() {
        return Err(Error::format(format!("{}: {} rows, reference has {}", dir.display(), got.len(), want.len())));
    }
    let cos: Vec<f64> = got.iter().zip(&want).map(|(g, w)| cosine(g, w)).collect();
    let worst = cos.iter().copied().fold(1f64, f64::min);
    let bad = cos.iter().filter(|&&c| c < 0.999).count();
    let mark = if bad == 0 { "ok" } else { "FAIL" };
    outln!("  {mark:4} {}: {} rows, lowest cosine to transformers {worst:.6}", dir.display(), cos.len())?;
    Ok(bad)
}

/// A model on `device` with an f16 KV cache of `ctx` tokens and `util` of
/// the GPU's memory, in the batch-invariant mode and eagerly as asked.
fn model_args(
    model: &str,
    device: DeviceChoice,
    ctx: usize,
    util: f64,
    (deterministic, enforce_eager): (bool, bool),
) -> ModelArgs {
    ModelArgs {
        model: model.into(),
        threads: None,
        ctx_size: Some(ctx),
        kv_cache: Some(KvDtype::F16),
        device: DeviceArgs { device: Some(device), gpu_memory_utilization: util, deterministic, enforce_eager },
    }
}

fn runner(model: &str, device: DeviceChoice) -> Result<Runner> {
    let args = model_args(model, device, 512, 0.9, (false, false));
    Ok(load(&args, false)?.runner)
}

/// Concurrent streams in the batched-against-alone check.
const SEQS: usize = 64;

/// Batched against one-at-a-time greedy decoding.
struct Invariance {
    differ: usize,
    total: usize,
    /// Largest logit difference, batched against alone.
    worst: f32,
    /// Streams whose first differing token did not follow a near-tie (top two
    /// logits of the one-at-a-time run within NEAR_TIE).
    not_after_tie: usize,
    /// The same for the batched run with greedy picks made on the device.
    device_differ: usize,
    device_not_after_tie: usize,
    /// Streams whose tokens differ between device picks read after each
    /// step and device picks fed to the next step before they are read.
    fed_differ: usize,
    /// The same with penalties, the unread picks counted in on the device
    /// (`RowSampling::pending`), and the streams the penalties changed.
    pending_differ: usize,
    penalized: usize,
}

/// Every invariance run (`invariance`), printed: the checks that failed.
fn invariance_checks(gpu: usize) -> Result<usize> {
    let mut failed = 0;
    let mut report = |ok: bool, what: String| -> Result<()> {
        outln!("  {:4} {what}", if ok { "ok" } else { "FAIL" })?;
        failed += usize::from(!ok);
        Ok(())
    };
    // (Also Q4_K_M, Q5_K_M, Q8_0, Q4_1, Q5_1 and Gemma's weights in the
    // batch-invariant mode: a lone row's GEMV on tiles is not a batch's in
    // the default mode, and the mode's own (`_whole_1`) must round as a
    // batch's. Q4_1's d x + m s is the sum whose fused multiply-add the
    // compiler once chose differently for one row and for a batch.)
    let runs = [
        (SMALL, false, "default"),
        (SMALL, true, "--deterministic"),
        (PERSISTENT, true, "--deterministic, Q4_K_M"),
        (Q5_K_M, true, "--deterministic, Q5_K_M"),
        (SMALL_Q8, true, "--deterministic, Q8_0"),
        (SMALL_Q4_1, true, "--deterministic, Q4_1"),
        (SMALL_Q5_1, true, "--deterministic, Q5_1"),
        (GEMMA_Q4_K_M, true, "--deterministic, Gemma-3-270M Q4_K_M"),
    ];
    for (model, deterministic, mode) in runs {
        let inv = invariance(gpu, model, deterministic)?;
        // Default: a stream may differ only after a near-tie; deterministic: never.
        let ok = inv.not_after_tie == 0 && (!deterministic || (inv.differ == 0 && inv.worst == 0.0));
        report(ok, format!(
            "{SEQS} streams batched vs one at a time ({mode}): {} of {} greedy tokens differ ({} streams not after a near-tie), largest logit difference {:e}",
            inv.differ, inv.total, inv.not_after_tie, inv.worst
        ))?;
        report(inv.device_not_after_tie == 0, format!(
            "{SEQS} streams batched, greedy picks on the device vs one at a time on the host ({mode}): {} of {} tokens differ ({} streams not after a near-tie)",
            inv.device_differ, inv.total, inv.device_not_after_tie
        ))?;
        report(inv.fed_differ == 0, format!(
            "{SEQS} streams batched, each step fed its greedy picks on the device before they are read vs after ({mode}): {} streams differ",
            inv.fed_differ
        ))?;
        report(inv.pending_differ == 0 && inv.penalized > 0, format!(
            "{SEQS} streams batched with penalties, each step fed its picks and counting them in on the device before they are read vs after ({mode}): {} streams differ ({} streams' tokens changed by the penalties)",
            inv.pending_differ, inv.penalized
        ))?;
    }
    Ok(failed)
}

/// The random-weight model of the invariance and graph checks, and its
/// Q8_0, Q4_1 and Q5_1 blocks (the down projection's rows, of whole
/// super-blocks, in tiles).
const SMALL: &str = "random:smollm2-135m";
const SMALL_Q8: &str = "random:smollm2-135m:q8_0";
const SMALL_Q4_1: &str = "random:smollm2-135m:q4_1";
const SMALL_Q5_1: &str = "random:smollm2-135m:q5_1";
/// Gemma-3-270M's shape and types: Q5_0 and Q8_0 rows of k = 640 (not
/// whole super-blocks), GeGLU, sliding-window layers.
const GEMMA_Q4_K_M: &str = "random:gemma3-270m:q4_k_m";
/// A model of Q5_K tiles with Q6_K v and down projections in some layers.
const Q5_K_M: &str = "random:llama-3.2-1b:q5_k_m";

/// Greedy decoding of random prompts, batched (host picks, then device
/// picks) against one at a time, on a random-weight model.
fn invariance(gpu: usize, model: &str, deterministic: bool) -> Result<Invariance> {
    const STEPS: usize = 12;
    let args = model_args(model, DeviceChoice::Cuda(gpu), 128, 0.9, (deterministic, false));
    let mut r = load_with_pool(&args, false, &KvPool::Blocks(SEQS * 8 + 8))?.runner;
    let vocab = r.config().vocab_size;
    let prompts: Vec<Vec<u32>> = (0..SEQS)
        .map(|i| (0..3 + 5 * (i % 16) + i / 16).map(|j| ((i * 7919 + j * 104_729) % (vocab - 10) + 5) as u32).collect())
        .collect();
    // One sequence at a time.
    let mut alone = Vec::new();
    for p in &prompts {
        let mut seq = Sequence::new(p.clone());
        let mut rows = Vec::new();
        for _ in 0..STEPS {
            let l = r.step(&mut [&mut seq], 512, Logits::Last)?;
            seq.tokens.push(argmax(&l) as u32);
            rows.push(l);
        }
        r.release(&mut seq);
        alone.push((seq.tokens, rows));
    }
    // All together, host picks.
    let mut seqs: Vec<Sequence> = prompts.iter().map(|p| Sequence::new(p.clone())).collect();
    let mut worst = 0f32;
    for step in 0..STEPS {
        let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
        let l = r.step(&mut refs, 512, Logits::Last)?;
        for (i, row) in l.chunks(vocab).enumerate() {
            let d = row.iter().zip(&alone[i].1[step]).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(d);
            seqs[i].tokens.push(argmax(row) as u32);
        }
    }
    let (differ, not_after_tie) = compare_streams(&seqs, &alone, &prompts);
    seqs.iter_mut().for_each(|s| r.release(s));
    // All together, greedy picks on the device: read after each step, then
    // fed to the next step before they are read (as `run` does).
    let mut device = Vec::new();
    for ahead in [false, true] {
        let mut seqs: Vec<Sequence> = prompts.iter().map(|p| Sequence::new(p.clone())).collect();
        greedy_steps(&mut r, &mut seqs, STEPS, 512, ahead, |_| {})?;
        seqs.iter_mut().for_each(|s| r.release(s));
        device.push(seqs);
    }
    let (device_differ, device_not_after_tie) = compare_streams(&device[0], &alone, &prompts);
    let fed_differ = device[1].iter().zip(&device[0]).filter(|(f, s)| f.tokens != s.tokens).count();
    let [waited, fed] = [false, true].map(|ahead| penalized_steps(&mut r, &prompts, STEPS, ahead));
    let (waited, fed) = (waited?, fed?);
    let pending_differ = fed.iter().zip(&waited).filter(|(f, w)| f != w).count();
    let penalized = waited.iter().zip(&device[0]).filter(|(w, g)| **w != g.tokens).count();
    Ok(Invariance {
        differ,
        total: SEQS * STEPS,
        worst,
        not_after_tie,
        device_differ,
        device_not_after_tie,
        fed_differ,
        pending_differ,
        penalized,
    })
}

/// Greedy decoding with repetition, presence and frequency penalties, drawn
/// on the device: each step's picks read before the next step goes out, or
/// (`ahead`) fed to it unread, counted in its penalties there. The streams' tokens.
fn penalized_steps(r: &mut Runner, prompts: &[Vec<u32>], steps: usize, ahead: bool) -> Result<Vec<Vec<u32>>> {
    let params = SamplingParams {
        repetition_penalty: 1.3,
        penalty_last_n: 8,
        presence_penalty: 0.6,
        frequency_penalty: 0.4,
        ..SamplingParams::greedy()
    };
    let mut seqs: Vec<Sequence> = prompts.iter().map(|p| Sequence::new(p.clone())).collect();
    let mut draws = Draws::penalized(&params, prompts.iter().map(|p| p.len()));
    decode_steps(r, &mut seqs, steps, 512, ahead, &mut draws, |_| {})?;
    seqs.iter_mut().for_each(|s| r.release(s));
    Ok(seqs.into_iter().map(|s| s.tokens).collect())
}

/// Greedy decoding of batches of 1, 3 and 5 streams with CUDA graphs (captured at
/// the second step, replayed after) against `--enforce-eager`, teacher-forced
/// on the eager picks: (largest logit difference relative to the largest
/// logit, top tokens that differ beyond a near-tie).
fn graphs_vs_eager(gpu: usize, model: &str, deterministic: bool) -> Result<(f32, usize)> {
    const STEPS: usize = 16;
    let open = |enforce_eager| -> Result<Runner> {
        let args = model_args(model, DeviceChoice::Cuda(gpu), 256, 0.45, (deterministic, enforce_eager));
        Ok(load_with_pool(&args, false, &KvPool::Blocks(64))?.runner)
    };
    let (mut eager, mut graphs) = (open(true)?, open(false)?);
    let vocab = eager.config().vocab_size;
    let (mut worst, mut flips) = (0f32, 0);
    for batch in [1usize, 3, 5] {
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|i| (0..7 + 3 * i).map(|j| ((i * 31 + j * 977) % (vocab - 10) + 5) as u32).collect())
            .collect();
        let mut a: Vec<Sequence> = prompts.iter().map(|p| Sequence::new(p.clone())).collect();
        let mut b = a.clone();
        for _ in 0..STEPS {
            let la = eager.step(&mut a.iter_mut().collect::<Vec<_>>(), 512, Logits::Last)?;
            let lb = graphs.step(&mut b.iter_mut().collect::<Vec<_>>(), 512, Logits::Last)?;
            for (i, (ra, rb)) in la.chunks(vocab).zip(lb.chunks(vocab)).enumerate() {
                let top = ra.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
                worst = worst.max(ra.iter().zip(rb).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / top);
                let (ta, tb) = (argmax(ra), argmax(rb));
                flips += usize::from(ra[ta] - ra[tb] > NEAR_TIE);
                a[i].tokens.push(ta as u32);
                b[i].tokens.push(ta as u32);
            }
        }
        a.iter_mut().for_each(|s| eager.release(s));
        b.iter_mut().for_each(|s| graphs.release(s));
    }
    Ok((worst, flips))
}

/// The default model of the persistent-kernel check.
const PERSISTENT: &str = "random:llama-3.2-1b:q4_k_m";

/// One stream at a time (prompts of 5 and 300 tokens, 16 decode steps each:
/// eager, captured, replayed) with the persistent decode kernel required
/// (`FERRITE_CUDA_PERSISTENT=require`) against the chain of kernels,
/// teacher-forced on the chain's picks: (largest logit difference relative
/// to the largest logit, top tokens that differ beyond a near-tie). With
/// `mlp_fused`, the chain with the fused MLP instead of the persistent kernel.
fn persistent_vs_chain(gpu: usize, model: &str, mlp_fused: bool) -> Result<(f32, usize)> {
    use ferrite_core::env::{with_cuda_mlp_fused, with_cuda_persistent};
    const STEPS: usize = 16;
    let open = |fused: bool| -> Result<Runner> {
        let args = model_args(model, DeviceChoice::Cuda(gpu), 512, 0.45, (false, false));
        let load = || load_with_pool(&args, false, &KvPool::Blocks(64));
        let loaded = match (fused, mlp_fused) {
            (false, _) => with_cuda_mlp_fused(None, || with_cuda_persistent(None, load)),
            (true, false) => with_cuda_persistent(Some("require"), load),
            (true, true) => with_cuda_mlp_fused(Some("1"), || with_cuda_persistent(None, load)),
        };
        Ok(loaded?.runner)
    };
    let (mut chain, mut fused) = (open(false)?, open(true)?);
    let vocab = chain.config().vocab_size;
    let (mut worst, mut flips) = (0f32, 0);
    for len in [5usize, 300] {
        let prompt: Vec<u32> = (0..len).map(|j| ((j * 7919 + 13) % (vocab - 10) + 5) as u32).collect();
        let (mut a, mut b) = (Sequence::new(prompt.clone()), Sequence::new(prompt));
        for _ in 0..STEPS {
            let la = chain.step(&mut [&mut a], 512, Logits::Last)?;
            let lb = fused.step(&mut [&mut b], 512, Logits::Last)?;
            let top = la.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
            worst = worst.max(la.iter().zip(&lb).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / top);
            let (ta, tb) = (argmax(&la), argmax(&lb));
            flips += usize::from(la[ta] - la[tb] > NEAR_TIE);
            a.tokens.push(ta as u32);
            b.tokens.push(ta as u32);
        }
        chain.release(&mut a);
        fused.release(&mut b);
    }
    Ok((worst, flips))
}

/// (tokens that differ from the one-at-a-time run, streams whose first
/// difference did not follow a near-tie there).
fn compare_streams(seqs: &[Sequence], alone: &[(Vec<u32>, Vec<Vec<f32>>)], prompts: &[Vec<u32>]) -> (usize, usize) {
    let mut differ = 0;
    let mut bad = 0;
    for ((s, a), p) in seqs.iter().zip(alone).zip(prompts) {
        let gen = s.tokens[p.len()..].iter().zip(&a.0[p.len()..]);
        differ += gen.clone().filter(|(x, y)| x != y).count();
        if let Some(step) = gen.clone().position(|(x, y)| x != y) {
            bad += usize::from(top_gap(&a.1[step]) > NEAR_TIE);
        }
    }
    (differ, bad)
}

/// The top logit's lead over the second.
fn top_gap(row: &[f32]) -> f32 {
    let (a, b) = row.iter().fold(
        (f32::NEG_INFINITY, f32::NEG_INFINITY),
        |(a, b), &x| {
            if x > a {
                (x, a)
            } else {
                (a, b.max(x))
            }
        },
    );
    a - b
}

/// Logits at every position of `ids`, one row per position.
fn score(r: &mut Runner, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    let vocab = r.config().vocab_size;
    let mut seq = Sequence::new(ids.to_vec());
    let mut rows = Vec::new();
    while seq.n_cached < seq.tokens.len() {
        let l = r.step(&mut [&mut seq], 512, Logits::All)?;
        rows.extend(l.chunks(vocab).map(|r| r.to_vec()));
    }
    r.release(&mut seq);
    Ok(rows)
}

/// The first index of the largest value (greedy decoding's pick).
pub(crate) fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect()).unwrap_or_default()
}

/// Teacher-forced on the golden's prompts and continuations: the GPU's top
/// token against the CPU's and against the reference's, near-ties allowed.
/// Returns the number of failed positions.
fn compare_model(model: &str, golden: &PathBuf, gpu: usize) -> Result<usize> {
    let text = std::fs::read_to_string(golden).map_err(|e| Error::io(golden, e))?;
    let fx: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::format(e.to_string()))?;
    let mut cpu = runner(model, DeviceChoice::Cpu)?;
    let mut cuda = runner(model, DeviceChoice::Cuda(gpu))?;
    let (mut n, mut bad, mut ties_cpu, mut ties_ref, mut worst_cos) = (0, 0, 0, 0, 1f64);
    for p in fx["prompts"].as_array().into_iter().flatten() {
        let (prompt, cont) = (ids(&p["prompt_ids"]), ids(&p["continuation_ids"]));
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let (lc, lg) = (score(&mut cpu, &all)?, score(&mut cuda, &all)?);
        for (i, &want) in cont.iter().enumerate() {
            let pos = prompt.len() - 1 + i;
            let (rc, rg) = (&lc[pos], &lg[pos]);
            let (tc, tg) = (argmax(rc), argmax(rg));
            let gap_cpu = rg[tg] - rg[tc];
            let gap_ref = rg[tg] - rg[want as usize];
            worst_cos = worst_cos.min(cosine(rc, rg));
            n += 1;
            ties_cpu += usize::from(tg != tc);
            ties_ref += usize::from(tg != want as usize);
            if gap_cpu > NEAR_TIE {
                bad += 1;
                outln!("  FAIL {model} position {pos}: GPU top {tg} beats the CPU's {tc} by {gap_cpu:.3}")?;
            }
            if gap_ref > NEAR_TIE {
                outln!("  note {model} position {pos}: GPU top {tg} beats the reference's {want} by {gap_ref:.3}")?;
            }
        }
    }
    outln!(
        "\n{model}: {n} positions teacher-forced; top token differs from the CPU's at {ties_cpu} (all near-ties unless FAIL above), \
         from the reference's at {ties_ref}; lowest logits cosine GPU vs CPU {worst_cos:.6}"
    )?;
    Ok(bad)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-30)
}
