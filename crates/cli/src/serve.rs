//! `ferrite serve`: load a model, start the engine and the HTTP server. A text
//! generator gets the generation engine; an embedding model the embedding
//! engine (/v1/embeddings).

use std::sync::Arc;

use clap::Args;
use ferrite_core::{Error, Result};
use ferrite_engine::embed::{EmbedEngine, EmbedEngineConfig};
use ferrite_engine::{Engine, EngineConfig};
use ferrite_server::{AllowedOrigins, ServeConfig};

use crate::load::{init_threads, load_embedder_from, load_with_pool, open_checkpoint, KvPool, Precision};
use crate::ModelArgs;
use ferrite_loader::source::ModelSource;
use ferrite_models::encoder::encoder_arch;
use ferrite_models::Checkpoint;

const GENERATION: &str = "Generation options (ignored for an embedding model)";

#[derive(Args, Debug)]
#[command(after_help = "An embedding model (BERT, ModernBERT) is served on /v1/embeddings (OpenAI's API) and \
    /embed (text-embeddings-inference's, also on POST /, with its GET /info), and chat and \
    completions answer 400. For it --max-embed-tokens and --max-waiting apply; --ctx-size, --kv-cache and \
    the generation options are ignored.")]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on the API routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Origins whose browser pages may call the API (CORS): * for any,
    /// none for none, or a comma-separated list like http://localhost:3000.
    #[arg(long, default_value = "*")]
    pub allowed_origins: String,
    /// Most sequences decoded together in one batch.
    #[arg(long, default_value_t = 64, help_heading = GENERATION)]
    pub max_num_seqs: usize,
    /// Most tokens (prompt chunks + decodes) in one forward pass; smaller keeps
    /// decodes flowing while a long prompt is prefilled.
    #[arg(long, default_value_t = 256, help_heading = GENERATION)]
    pub max_batched_tokens: usize,
    /// KV-cache size in blocks of 16 tokens, shared by all requests (default:
    /// on a GPU, the share of --gpu-memory-utilization the weights leave; on
    /// the CPU, 4 contexts' worth, at most 2 GiB, at least one context).
    #[arg(long, conflicts_with = "kv_memory", help_heading = GENERATION)]
    pub kv_blocks: Option<usize>,
    /// KV-cache size in GB (alternative to --kv-blocks).
    #[arg(long, help_heading = GENERATION)]
    pub kv_memory: Option<f64>,
    /// Model id in the API (default: the MODEL argument's file or directory name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Turn off sharing of KV blocks between requests with a common prefix.
    #[arg(long, help_heading = GENERATION)]
    pub no_prefix_caching: bool,
    /// Most requests queued for admission before new ones get HTTP 429.
    #[arg(long, default_value_t = 4096)]
    pub max_waiting: usize,
    /// Embedding model: most tokens in one forward pass; the inputs of all
    /// waiting requests are batched up to it (a longer input runs alone).
    #[arg(long, default_value_t = 16384)]
    pub max_embed_tokens: usize,
    /// Matmul arithmetic (embedding models): auto (bf16 where the hardware
    /// multiplies bf16 natively: NVIDIA GPUs, CPUs with AVX-512 BF16; else
    /// f32), f32 (exact), or bf16. bf16 is about 1.5x as fast on such CPUs,
    /// cosine 0.99996 or more to f32 on all-MiniLM-L6-v2.
    #[arg(long, value_enum, default_value_t = Precision::Auto)]
    pub precision: Precision,
    /// Chat replies' `<think>` blocks: auto (apart, as `reasoning_content`,
    /// where the chat template has them) or none (left in the content).
    #[arg(long, value_enum, default_value_t = ReasoningFormat::Auto, help_heading = GENERATION)]
    pub reasoning_format: ReasoningFormat,
}

/// `--reasoning-format` (llama.cpp's server's name for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningFormat {
    Auto,
    None,
}

pub fn main(args: ServeArgs) -> Result<()> {
    let (source, ck) = open_checkpoint(&args.model.model)?;
    if encoder_arch(&ck).is_some() {
        return serve_embeddings(args, &source, &ck);
    }
    drop(ck); // A generator: `load_with_pool` opens it for itself.
    let pool = match (args.kv_blocks, args.kv_memory) {
        (Some(n), _) => KvPool::Blocks(n),
        (None, Some(gb)) if gb.is_finite() && gb > 0.0 => KvPool::Bytes(gb * 1e9),
        (None, Some(gb)) => {
            return Err(Error::InvalidInput(format!("--kv-memory must be a positive number, got {gb}")))
        }
        (None, None) => KvPool::ServingDefault,
    };
    let config = EngineConfig {
        max_num_seqs: args.max_num_seqs,
        max_batched_tokens: args.max_batched_tokens,
        max_waiting: args.max_waiting,
        prefix_caching: !args.no_prefix_caching,
    };
    if config.max_num_seqs == 0 || config.max_batched_tokens == 0 {
        return Err(Error::InvalidInput("--max-num-seqs and --max-batched-tokens must be at least 1".into()));
    }
    let loaded = load_with_pool(&args.model, true, &pool)?;
    let tokenizer = loaded.tokenizer.ok_or_else(|| Error::InvalidInput("the model has no tokenizer".into()))?;
    let name = args.served_model_name.unwrap_or_else(|| default_model_name(&loaded.name));
    let blocks = loaded.runner.n_blocks();
    let engine = Engine::start(loaded.runner, Arc::new(tokenizer), config)?;
    eprintln!(
        "serving {name}: context {} tokens, KV cache {} blocks of {} tokens",
        engine.max_context(),
        blocks,
        ferrite_engine::runner::DEFAULT_BLOCK_SIZE
    );
    let serve_config = ServeConfig {
        host: args.host,
        port: args.port,
        api_key: args.api_key,
        served_model_name: name,
        template: loaded.template,
        allowed_origins: AllowedOrigins::parse(&args.allowed_origins),
        reasoning: args.reasoning_format == ReasoningFormat::Auto,
    };
    ferrite_server::serve(engine, serve_config)
}

/// An embedding model on /v1/embeddings, its requests batched by an `EmbedEngine`.
fn serve_embeddings(args: ServeArgs, source: &ModelSource, ck: &Checkpoint) -> Result<()> {
    if args.max_embed_tokens == 0 {
        return Err(Error::InvalidInput("--max-embed-tokens must be at least 1".into()));
    }
    let m = &args.model;
    let ignored = [
        ("--ctx-size", m.ctx_size.is_some()),
        ("--kv-cache", m.kv_cache.is_some()),
        ("--kv-blocks", args.kv_blocks.is_some()),
        ("--kv-memory", args.kv_memory.is_some()),
        ("--no-prefix-caching", args.no_prefix_caching),
    ];
    let ignored: Vec<&str> = ignored.iter().filter(|(_, set)| *set).map(|(flag, _)| *flag).collect();
    if !ignored.is_empty() {
        eprintln!("warning: ignored for an embedding model: {}", ignored.join(", "));
    }
    init_threads(m.threads)?;
    let embedder = load_embedder_from(&m.model, source, ck, None, args.precision, &m.device)?;
    let name = args.served_model_name.unwrap_or_else(|| default_model_name(&m.model));
    let (dim, max_length) = (embedder.dim(), embedder.max_length);
    let config = EmbedEngineConfig { max_batch_tokens: args.max_embed_tokens, max_waiting: args.max_waiting };
    let engine = EmbedEngine::start(embedder, config);
    eprintln!(
        "serving {name} on /v1/embeddings and /embed: {dim} dimensions, inputs up to {max_length} tokens, \
         at most {} tokens per forward pass",
        args.max_embed_tokens
    );
    let serve_config = ServeConfig {
        host: args.host,
        port: args.port,
        api_key: args.api_key,
        served_model_name: name,
        template: None,
        allowed_origins: AllowedOrigins::parse(&args.allowed_origins),
        reasoning: false,
    };
    ferrite_server::serve_embeddings(engine, serve_config)
}

/// `~/models/smollm2.gguf` -> `smollm2`; `org/name` -> `org/name`.
fn default_model_name(arg: &str) -> String {
    let path = std::path::Path::new(arg);
    if path.exists() {
        let stem = if path.is_dir() { path.file_name() } else { path.file_stem() };
        if let Some(s) = stem.and_then(|s| s.to_str()) {
            return s.to_string();
        }
    }
    arg.to_string()
}
