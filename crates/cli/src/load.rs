//! Resolving a MODEL argument and loading everything a command needs.

use std::time::{Duration, Instant};

use ferrite_backend::cpu::CpuBackend;
use ferrite_core::{Error, Result};
use ferrite_engine::embed::{Embedder, PoolingConfig};
use ferrite_engine::runner::DEFAULT_BLOCK_SIZE;
use ferrite_engine::Runner;
use ferrite_loader::chat_template::{template_from_hf_dir, ChatTemplate};
use ferrite_loader::source::{resolve, ModelSource};
use ferrite_loader::tokenizer::Tokenizer;
use ferrite_models::encoder::{encoder_arch, load_encoder};
use ferrite_models::{load_causal_lm, Checkpoint, KvDtype};
use indicatif::{ProgressBar, ProgressStyle};

use crate::device::{Backend, DeviceArgs};
use crate::ModelArgs;
use ferrite_backend::cuda::CudaBackend;

/// The KV cache is capped here unless --ctx-size asks for more.
const DEFAULT_MAX_CTX: usize = 8192;

pub struct Loaded {
    pub runner: Runner,
    /// Absent when the command asked for none (`score` needs no tokenizer).
    pub tokenizer: Option<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub name: String,
}

/// Sizes the global thread pool; later calls (a command loading two models)
/// keep the first size.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    static STARTED: std::sync::Once = std::sync::Once::new();
    let n = threads.unwrap_or_else(crate::cores::physical_cores);
    if n == 0 {
        return Err(Error::InvalidInput("--threads must be at least 1".into()));
    }
    let cpus = std::thread::available_parallelism().map_or(n, |c| c.get());
    if n > cpus {
        eprintln!(
            "warning: --threads {n} is more than the {cpus} CPUs here; threads beyond them only wait on each other"
        );
    }
    let mut result = Ok(());
    STARTED.call_once(|| {
        result = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .map_err(|e| Error::InvalidInput(format!("thread pool: {e}")));
    });
    result
}

pub fn open_checkpoint(model: &str) -> Result<(ModelSource, Checkpoint)> {
    let source = resolve(model)?;
    let ck = Checkpoint::open(&source)?;
    Ok((source, ck))
}

pub fn tokenizer_of(source: &ModelSource, ck: &Checkpoint) -> Result<Tokenizer> {
    match (source, ck) {
        (_, Checkpoint::Gguf(g)) => Tokenizer::from_gguf(g),
        (ModelSource::HfDir(d), _) => Tokenizer::from_hf_dir(d),
        (ModelSource::Random(p), _) => Err(Error::InvalidInput(format!(
            "random:{p} has random weights and no tokenizer: use it with `ferrite bench`"
        ))),
        _ => Err(Error::format("no tokenizer found")),
    }
}

pub fn template_of(source: &ModelSource, ck: &Checkpoint, tok: &Tokenizer) -> Result<Option<ChatTemplate>> {
    let text = match (source, ck) {
        (_, Checkpoint::Gguf(g)) => g.get_str("tokenizer.chat_template").map(String::from),
        (ModelSource::HfDir(d), _) => template_from_hf_dir(d)?,
        _ => None,
    };
    text.map(|t| ChatTemplate::new(&t, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))).transpose()
}

pub fn load(args: &ModelArgs, with_tokenizer: bool) -> Result<Loaded> {
    load_with_pool(args, with_tokenizer, &KvPool::OneSequence)
}

/// How big the KV cache is.
pub enum KvPool {
    /// One sequence of the context size (run, bench, perplexity).
    OneSequence,
    /// A pool of this many blocks shared by all sequences (serve).
    Blocks(usize),
    /// A pool of about this many bytes.
    Bytes(f64),
    /// Serving default: room for several full contexts, within a memory cap.
    ServingDefault,
}

/// The serving default's memory cap.
const DEFAULT_POOL_BYTES: f64 = 2.0 * (1u64 << 30) as f64;

pub fn load_with_pool(args: &ModelArgs, with_tokenizer: bool, pool: &KvPool) -> Result<Loaded> {
    init_threads(args.threads)?;
    let t0 = Instant::now();
    let (source, ck) = open_checkpoint(&args.model)?;
    if let Some(arch) = encoder_arch(&ck) {
        return Err(Error::Unsupported(format!(
            "{} is an embedding model ({arch:?}), not a text generator: use `ferrite embed`, or `ferrite serve` for /v1/embeddings",
            args.model
        )));
    }
    // An unsupported architecture is the clearer message than a missing tokenizer.
    ferrite_models::registry::config_of(&ck)?;
    let (tokenizer, template) = if with_tokenizer {
        let tok = tokenizer_of(&source, &ck)?;
        let template = template_of(&source, &ck, &tok)?;
        (Some(tok), template)
    } else {
        (None, None)
    };
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers").unwrap().progress_chars("=> "),
    );
    bar.set_message(args.model.clone());
    let mut progress = |i: usize, n: usize| {
        // Only draw when loading takes more than a moment.
        if t0.elapsed() > Duration::from_millis(300) {
            bar.set_length(n as u64);
            bar.set_position(i as u64);
        }
    };
    let backend = args.device.open(CpuBackend::F32, false)?;
    let on_gpu = matches!(backend, Backend::Cuda(_));
    if let Backend::Cuda(b) = &backend {
        check_weights_fit(b, ck.device_bytes(), args.device.gpu_memory_utilization)?;
    }
    let model = match &backend {
        Backend::Cpu(b, _) => load_causal_lm(*b, &ck, &mut progress)?,
        Backend::Cuda(b) => load_causal_lm(b.clone(), &ck, &mut progress)?,
    };
    bar.finish_and_clear();
    let cfg = model.config();
    let ctx = match args.ctx_size {
        Some(0) => return Err(Error::InvalidInput("--ctx-size must be at least 1 token of context".into())),
        Some(ctx) => ctx,
        None if cfg.max_context == 0 => {
            return Err(Error::InvalidInput(
                "the model's context length is 0 (corrupt metadata?); give one with --ctx-size".into(),
            ))
        }
        None => cfg.max_context.min(DEFAULT_MAX_CTX),
    };
    if ctx > cfg.max_context {
        eprintln!("warning: a context of {ctx} tokens is beyond the model's trained context of {}", cfg.max_context);
    }
    let name = args.model.clone();
    eprintln!(
        "loaded {name}: {} ({} layers, hidden {}) on {}{} in {:.2}s",
        cfg.arch_name,
        cfg.n_layers,
        cfg.hidden,
        model.backend_name(),
        backend.fallback_note(),
        t0.elapsed().as_secs_f64()
    );
    // f16 like llama.cpp for GGUF files and on GPUs; f32 for safetensors on the CPU.
    let kv = args.kv_cache.unwrap_or(match source {
        ModelSource::HfDir(_) | ModelSource::Random(_) if !on_gpu => KvDtype::F32,
        _ => KvDtype::F16,
    });
    let bs = DEFAULT_BLOCK_SIZE;
    let elem = if kv == KvDtype::F16 { 2 } else { 4 };
    let block_bytes = (bs * cfg.n_layers * cfg.kv_dim() * 2 * elem) as f64;
    let n_blocks = match (pool, &backend) {
        (KvPool::OneSequence, _) => ctx.div_ceil(bs),
        (KvPool::Blocks(n), _) => *n,
        (KvPool::Bytes(b), _) => (*b / block_bytes) as usize,
        (KvPool::ServingDefault, Backend::Cuda(b)) => {
            gpu_kv_blocks(b, args.device.gpu_memory_utilization, block_bytes)?
        }
        (KvPool::ServingDefault, Backend::Cpu(..)) => {
            (4 * ctx.div_ceil(bs)).min((DEFAULT_POOL_BYTES / block_bytes) as usize).max(ctx.div_ceil(bs))
        }
    };
    if n_blocks == 0 {
        return Err(Error::InvalidInput(format!(
            "the KV cache must hold at least one block of {bs} tokens ({:.1} MB)",
            block_bytes / 1e6
        )));
    }
    if !on_gpu {
        check_kv_fits(n_blocks.saturating_mul(bs), cfg.n_layers, cfg.kv_dim())?;
    }
    let runner = Runner::with_pool(model, ctx, n_blocks, bs, kv)?;
    Ok(Loaded { runner, tokenizer, template, name })
}

/// Refuses, before anything is uploaded, weights that cannot fit the GPU's
/// budget: GGUF blocks as they are, dense weights in 16 bits (f32 checkpoints
/// included).
fn check_weights_fit(b: &CudaBackend, bytes: u64, utilization: f64) -> Result<()> {
    let need = bytes as f64;
    let (free, total) = b.memory()?;
    let usable = free as f64 - total as f64 * (1.0 - utilization);
    if need > usable {
        return Err(Error::InvalidInput(format!(
            "the model's weights need {:.2} GB on the GPU; {:.2} GB of its {:.2} GB are free, {:.2} GB usable at --gpu-memory-utilization {utilization} (use --device cpu, or a smaller or more quantized model)",
            need / 1e9,
            free as f64 / 1e9,
            total as f64 / 1e9,
            usable.max(0.0) / 1e9
        )));
    }
    Ok(())
}

/// KV blocks that fit the GPU's memory budget once the weights are loaded:
/// `utilization` of the total, less what is already in use, less a margin for
/// the step's work buffers.
fn gpu_kv_blocks(b: &CudaBackend, utilization: f64, block_bytes: f64) -> Result<usize> {
    const WORK_MARGIN: f64 = 1.5e9;
    let (free, total) = b.memory()?;
    let budget = free as f64 - total as f64 * (1.0 - utilization) - WORK_MARGIN;
    let n = (budget / block_bytes).floor();
    if n < 1.0 {
        return Err(Error::InvalidInput(format!(
            "no GPU memory left for the KV cache: {:.2} GB free of {:.2} GB after loading the weights, {:.0}% usable (--gpu-memory-utilization)",
            free as f64 / 1e9,
            total as f64 / 1e9,
            utilization * 100.0
        )));
    }
    Ok(n as usize)
}

/// An absurd --ctx-size would abort the process inside the allocator; probe the
/// KV cache's size (f32 K and V per layer, as the CPU backend stores them) first.
fn check_kv_fits(ctx: usize, n_layers: usize, kv_dim: usize) -> Result<()> {
    let blocks = ctx.div_ceil(DEFAULT_BLOCK_SIZE);
    let bytes = [DEFAULT_BLOCK_SIZE, n_layers, kv_dim, 2, 4].iter().try_fold(blocks, |a, &b| a.checked_mul(b));
    if bytes.is_some_and(|b| Vec::<u8>::new().try_reserve_exact(b).is_ok()) {
        return Ok(());
    }
    Err(Error::InvalidInput(format!(
        "a KV cache of {ctx} tokens would need {:.1} GB, more than can be allocated (lower --ctx-size, or --kv-blocks / --kv-memory when serving)",
        ctx as f64 * n_layers as f64 * kv_dim as f64 * 8.0 / 1e9
    )))
}

impl Loaded {
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| Error::InvalidInput("no tokenizer loaded".into()))
    }
}

/// Arithmetic for the dense matmuls of embedding models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    /// bf16 where the hardware multiplies bf16 natively (NVIDIA GPUs, CPUs
    /// with AVX-512 BF16), else f32.
    Auto,
    /// Exact f32 products.
    F32,
    /// bf16 products with f32 sums: about 1.5x as fast on CPUs with
    /// AVX-512 BF16, cosine 0.99996 or more to f32 on all-MiniLM-L6-v2; f32 on
    /// CPUs without it.
    Bf16,
}

/// An embedding model with its tokenizer and pooling; `pooling` overrides the
/// checkpoint's.
pub fn load_embedder(
    model: &str,
    pooling: Option<ferrite_engine::embed::Pooling>,
    precision: Precision,
    device: &DeviceArgs,
) -> Result<Embedder> {
    let (source, ck) = open_checkpoint(model)?;
    load_embedder_from(model, &source, &ck, pooling, precision, device)
}

/// `load_embedder` for a checkpoint already opened (to tell its kind).
pub fn load_embedder_from(
    model: &str,
    source: &ModelSource,
    ck: &Checkpoint,
    pooling: Option<ferrite_engine::embed::Pooling>,
    precision: Precision,
    device: &DeviceArgs,
) -> Result<Embedder> {
    let t0 = Instant::now();
    if encoder_arch(ck).is_none() {
        let arch = ferrite_models::registry::config_of(ck).map(|c| c.arch_name).unwrap_or_else(|_| "unknown".into());
        return Err(Error::Unsupported(format!(
            "{model} is not an embedding model (architecture {arch}); embeddings need an encoder: bert or modernbert"
        )));
    }
    let ModelSource::HfDir(dir) = source else {
        return Err(Error::Unsupported(format!("{model}: embedding models load from HF directories")));
    };
    let mut cfg = PoolingConfig::from_dir(dir)?;
    if let Some(p) = pooling {
        cfg.pooling = p;
    }
    let cpu = match precision {
        Precision::F32 => CpuBackend::F32,
        Precision::Bf16 | Precision::Auto => CpuBackend::with_bf16_dense().0,
    };
    let backend = device.open(cpu, precision == Precision::F32)?;
    let (encoder, bf16) = match &backend {
        Backend::Cpu(b, _) => {
            let b = *b;
            if precision == Precision::Bf16 && !b.bf16_dense {
                eprintln!("note: this CPU has no AVX-512 BF16; computing in f32");
            }
            (load_encoder(b, ck)?, b.bf16_dense)
        }
        Backend::Cuda(b) => (load_encoder(b.clone(), ck)?, precision != Precision::F32),
    };
    let tokenizer = Tokenizer::from_hf_dir(dir)?;
    let mut e = Embedder::new(encoder, tokenizer, &cfg);
    e.bf16 = bf16;
    let c = e.model().config();
    eprintln!(
        "loaded {model}: {:?} ({} layers, dim {}, {:?} pooling{}, max {} tokens{}) on {}{} in {:.2}s",
        c.arch,
        c.n_layers,
        c.hidden,
        e.pooling,
        if e.normalize { ", normalized" } else { "" },
        e.max_length,
        if bf16 { ", bf16 matmuls" } else { "" },
        e.model().backend_name(),
        backend.fallback_note(),
        t0.elapsed().as_secs_f64()
    );
    Ok(e)
}
