//! `ferrite serve`: load a model, start the engine and the HTTP server.

use std::sync::Arc;

use clap::Args;
use ferrite_core::{Error, Result};
use ferrite_engine::{Engine, EngineConfig};
use ferrite_server::ServeConfig;

use crate::load::{load_with_pool, KvPool};
use crate::ModelArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on the API routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Most sequences decoded together in one batch.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Most tokens (prompt chunks + decodes) in one forward pass; smaller keeps
    /// decodes flowing while a long prompt is prefilled.
    #[arg(long, default_value_t = 256)]
    pub max_batched_tokens: usize,
    /// KV-cache size in blocks of 16 tokens, shared by all requests
    /// (default: 4 contexts' worth, at most 2 GiB).
    #[arg(long, conflicts_with = "kv_memory")]
    pub kv_blocks: Option<usize>,
    /// KV-cache size in GB (alternative to --kv-blocks).
    #[arg(long)]
    pub kv_memory: Option<f64>,
    /// Model id in the API (default: the MODEL argument's file or directory name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Turn off sharing of KV blocks between requests with a common prefix.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Most requests queued for admission before new ones get HTTP 429.
    #[arg(long, default_value_t = 4096)]
    pub max_waiting: usize,
}

pub fn main(args: ServeArgs) -> Result<()> {
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
    };
    ferrite_server::serve(engine, serve_config)
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
