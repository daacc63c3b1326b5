//! `ferrite inspect` and `ferrite list`.

use clap::Args;
use ferrite_core::Result;
use ferrite_loader::source::{list_models, models_dir};
use ferrite_models::registry::config_of;

use crate::load::{load_embedder_from, open_checkpoint, template_of, tokenizer_of, Precision};
use ferrite_loader::source::ModelSource;
use ferrite_models::encoder::encoder_arch;
use ferrite_models::Checkpoint;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The model to describe (same forms as `ferrite run`).
    pub model: String,
}

pub fn main(a: InspectArgs) -> Result<()> {
    let (source, ck) = open_checkpoint(&a.model)?;
    if encoder_arch(&ck).is_some() {
        return inspect_embedder(&a.model, &source, &ck);
    }
    // Before any output, so an unsupported model prints only the error.
    let cfg = config_of(&ck)?;
    outln!("path:          {}", ck.path().display())?;
    outln!("architecture:  {} ({:?} family)", cfg.arch_name, cfg.family)?;
    outln!("layers:        {}", cfg.n_layers)?;
    outln!("hidden:        {}", cfg.hidden)?;
    outln!("heads:         {} query / {} KV, head dim {}", cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)?;
    outln!("ffn:           {}", cfg.ffn)?;
    outln!("vocab:         {}", cfg.vocab_size)?;
    outln!("context:       {}", cfg.max_context)?;
    let windows: Vec<String> = cfg.layers.iter().map(|k| k.window.map_or("global".into(), |w| w.to_string())).collect();
    if cfg.layers.iter().any(|k| k.window.is_some()) {
        outln!("attention:     {}", windows.join(" "))?;
    }
    if let Some(first) = cfg.layers.first() {
        outln!("rope theta:    {}", first.rope_theta)?;
    }
    outln!("tied output:   {}", cfg.tied_embeddings)?;
    let types: Vec<String> = ck.type_summary().iter().map(|(d, n)| format!("{d} x{n}")).collect();
    outln!("tensor types:  {}", types.join(", "))?;
    match tokenizer_of(&source, &ck) {
        Ok(tok) => {
            outln!("tokenizer:     {}", tok.kind())?;
            match template_of(&source, &ck, &tok) {
                Ok(Some(_)) => outln!("chat template: yes")?,
                Ok(None) => outln!("chat template: none (raw completion only)")?,
                Err(e) => outln!("chat template: unusable ({e})")?,
            }
        }
        Err(e) => outln!("tokenizer:     unusable ({e})")?,
    }
    Ok(())
}

/// An embedding model: what `embed` and `/v1/embeddings` will do with it.
fn inspect_embedder(model: &str, source: &ModelSource, ck: &Checkpoint) -> Result<()> {
    let e = load_embedder_from(model, source, ck, None, Precision::F32, &crate::device::DeviceArgs::cpu())?;
    let c = e.model().config();
    outln!("path:          {}", ck.path().display())?;
    outln!("architecture:  {:?} encoder (embeddings)", c.arch)?;
    outln!("layers:        {}", c.n_layers)?;
    outln!("dimension:     {}", c.hidden)?;
    outln!("vocab:         {}", c.vocab_size)?;
    outln!("max input:     {} tokens (model limit {})", e.max_length, c.max_positions)?;
    outln!("pooling:       {:?}{}", e.pooling, if e.normalize { ", L2-normalized" } else { "" })?;
    outln!("tokenizer:     {}", e.tokenizer().kind())?;
    Ok(())
}

pub fn list() -> Result<()> {
    let models = list_models()?;
    if models.is_empty() {
        eprintln!("no models in {} (scripts/fetch-models.sh fetches the demo models)", models_dir().display());
        return Ok(());
    }
    for m in models {
        outln!("{:<24} {:>10.1} MB  {:<12} {}", m.name, m.bytes as f64 / 1e6, m.format, m.path.display())?;
    }
    Ok(())
}
