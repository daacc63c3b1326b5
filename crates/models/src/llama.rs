//! The Llama family: Llama 2/3 (llama3 RoPE scaling), Mistral (sliding window),
//! SmolLM, Qwen2/2.5 (QKV bias), Qwen3 (QK-norm). One forward (`decoder.rs`);
//! this file maps each checkpoint format's configuration into `LmConfig`.

use crate::config::{Family, LayerKind, LmConfig, RopeScaling};
use crate::hf::HfConfig;
use ferrite_backend::Activation;
use ferrite_core::{Error, Result};
use ferrite_loader::gguf::GgufFile;

pub const GGUF_ARCHES: &[&str] = &["llama", "mistral", "qwen2", "qwen3"];
pub const HF_MODEL_TYPES: &[&str] = &["llama", "mistral", "qwen2", "qwen3"];

fn family_of(name: &str) -> Family {
    match name {
        "mistral" => Family::Mistral,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        _ => Family::Llama,
    }
}

/// Reads `{arch}.*` metadata the way llama.cpp does.
pub fn config_from_gguf(g: &GgufFile, arch: &str) -> Result<LmConfig> {
    let m = crate::gguf_meta::Meta::new(g, arch);
    let hidden = m.req("embedding_length")?;
    let n_heads = m.req("attention.head_count")?;
    let head_dim = m.opt("attention.key_length").unwrap_or(hidden / n_heads.max(1));
    let n_layers = crate::config::check_layers(m.req("block_count")?)?;
    let theta = m.f32("rope.freq_base").unwrap_or(10_000.0);
    let scaling = if let Some(t) = g.tensor("rope_freqs.weight") {
        let mut ff = vec![0f32; t.n_elements() as usize];
        ferrite_backend::quant::dequantize_row(t.dtype, g.tensor_data(t), &mut ff)?;
        RopeScaling::Factors(ff)
    } else {
        match (g.get_str(&format!("{arch}.rope.scaling.type")), m.f32("rope.scaling.factor")) {
            (Some("linear"), Some(f)) if f > 0.0 => RopeScaling::Linear { factor: f },
            (Some(t), _) if t != "none" && t != "linear" => {
                return Err(Error::Unsupported(format!("RoPE scaling type {t:?}")));
            }
            _ => RopeScaling::None,
        }
    };
    let window = m.opt("attention.sliding_window");
    let kind = LayerKind { window, rope_theta: theta, rope_scaling: scaling };
    let family = family_of(arch);
    let cfg = LmConfig {
        family,
        arch_name: arch.to_string(),
        vocab_size: m.vocab_size()?,
        hidden,
        n_layers,
        n_heads,
        n_kv_heads: m.opt("attention.head_count_kv").unwrap_or(n_heads),
        head_dim,
        ffn: m.req("feed_forward_length")?,
        norm_eps: m.f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        max_context: m.opt("context_length").unwrap_or(4096),
        layers: vec![kind; n_layers],
        // llama.cpp's converter permutes Q/K of `llama` models for interleaved RoPE;
        // qwen2/qwen3 keep the NeoX (half-split) layout.
        rope_interleaved: matches!(family, Family::Llama | Family::Mistral),
        activation: Activation::Silu,
        qkv_bias: g.tensor("blk.0.attn_q.bias").is_some(),
        qk_norm: g.tensor("blk.0.attn_q_norm.weight").is_some(),
        sandwich_norms: false,
        embed_scale: None,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_softcap: None,
        final_softcap: None,
        tied_embeddings: g.tensor("output.weight").is_none(),
    };
    Ok(cfg)
}

pub fn config_from_hf(c: &HfConfig) -> Result<LmConfig> {
    let model_type = c.str("model_type").unwrap_or("llama");
    let family = family_of(model_type);
    let hidden = c.req("hidden_size")?;
    let n_heads = c.req("num_attention_heads")?;
    let head_dim = c.opt("head_dim").unwrap_or(hidden / n_heads.max(1));
    let n_layers = crate::config::check_layers(c.req("num_hidden_layers")?)?;
    let window = match family {
        Family::Mistral => c.opt("sliding_window"),
        Family::Qwen2 | Family::Qwen3 if c.bool("use_sliding_window").unwrap_or(false) => {
            return Err(Error::Unsupported(format!("{model_type} with use_sliding_window")));
        }
        _ => None,
    };
    let kind = LayerKind {
        window,
        rope_theta: c.rope_theta("full_attention").unwrap_or(10_000.0),
        rope_scaling: c.rope_scaling("full_attention")?,
    };
    Ok(LmConfig {
        family,
        arch_name: model_type.to_string(),
        vocab_size: c.req("vocab_size")?,
        hidden,
        n_layers,
        n_heads,
        n_kv_heads: c.opt("num_key_value_heads").unwrap_or(n_heads),
        head_dim,
        ffn: c.req("intermediate_size")?,
        norm_eps: c.f32("rms_norm_eps").unwrap_or(1e-6),
        max_context: c.opt("max_position_embeddings").unwrap_or(4096),
        layers: vec![kind; n_layers],
        rope_interleaved: false,
        activation: c.activation("hidden_act")?.unwrap_or(Activation::Silu),
        qkv_bias: family == Family::Qwen2 || c.bool("attention_bias").unwrap_or(false),
        qk_norm: family == Family::Qwen3,
        sandwich_norms: false,
        embed_scale: None,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_softcap: None,
        final_softcap: None,
        tied_embeddings: c.bool("tie_word_embeddings").unwrap_or(false),
    })
}
