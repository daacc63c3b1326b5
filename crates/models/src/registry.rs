//! One table from architecture name to configuration mapper; every family runs
//! on the shared decoder.

use crate::checkpoint::Checkpoint;
use crate::config::LmConfig;
use crate::decoder::Decoder;
use crate::hf::HfConfig;
use crate::{gemma3, llama, CausalLm};
use ferrite_backend::Backend;
use ferrite_core::{Error, Result};
use ferrite_loader::gguf::GgufFile;

type GgufMapper = fn(&GgufFile, &str) -> Result<LmConfig>;
type HfMapper = fn(&HfConfig) -> Result<LmConfig>;

/// (GGUF `general.architecture` or HF `model_type`, mappers)
const REGISTRY: &[(&str, GgufMapper, HfMapper)] = &[
    ("llama", llama::config_from_gguf, llama::config_from_hf),
    ("mistral", llama::config_from_gguf, llama::config_from_hf),
    ("qwen2", llama::config_from_gguf, llama::config_from_hf),
    ("qwen3", llama::config_from_gguf, llama::config_from_hf),
    ("gemma3", |g, _| gemma3::config_from_gguf(g), gemma3::config_from_hf),
    ("gemma3_text", |g, _| gemma3::config_from_gguf(g), gemma3::config_from_hf),
];

pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|r| r.0).collect()
}

/// The architecture's typed configuration, from whichever format the checkpoint uses.
pub fn config_of(ck: &Checkpoint) -> Result<LmConfig> {
    match ck {
        Checkpoint::Gguf(g) => {
            let arch = g.architecture().ok_or_else(|| Error::format("GGUF has no general.architecture"))?;
            (entry(arch)?.1)(g, arch)
        }
        Checkpoint::Hf(h) => config_from_hf_json(&h.config),
        // Random presets carry a real HF config.json, so they map exactly as the
        // published checkpoint would (a quantized one as its GGUF conversion).
        Checkpoint::Random(r) => Ok(r.lm().clone()),
    }
}

/// Maps an HF `config.json` by its `model_type`.
pub(crate) fn config_from_hf_json(config: &serde_json::Value) -> Result<LmConfig> {
    let arch = config.get("model_type").and_then(|v| v.as_str()).ok_or_else(|| {
        Error::format("config.json: model_type is missing (it names the architecture, e.g. \"llama\")")
    })?;
    let c = HfConfig::new(config);
    c.checked((entry(arch)?.2)(&c))
}

fn entry(arch: &str) -> Result<&'static (&'static str, GgufMapper, HfMapper)> {
    REGISTRY
        .iter()
        .find(|r| r.0 == arch)
        .ok_or_else(|| Error::Unsupported(format!("architecture {arch:?} (supported: {})", supported().join(", "))))
}

pub fn load_causal_lm<B: Backend + 'static>(
    backend: B,
    ck: &Checkpoint,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn CausalLm>>
where
    B::Tensor: 'static,
    B::Weight: 'static,
    B::KvPool: 'static,
{
    let cfg = config_of(ck)?;
    Ok(Box::new(Decoder::load(backend, cfg, ck, progress)?))
}
