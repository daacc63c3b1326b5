//! Gemma 3 (text): GELU-tanh GeGLU, sandwich norms (before and after attention and
//! MLP), embeddings scaled by sqrt(hidden), QK-norm, and local sliding-window layers
//! (RoPE base 10k) interleaved with global layers (their own base and scaling).

use crate::config::{Family, LayerKind, LmConfig, RopeScaling};
use crate::hf::HfConfig;
use ferrite_backend::Activation;
use ferrite_core::Result;
use ferrite_loader::gguf::GgufFile;

/// Gemma 3 makes every sixth layer global unless the checkpoint says otherwise.
const DEFAULT_PATTERN: usize = 6;
/// Base of local layers; GGUF metadata does not store it.
const LOCAL_ROPE_THETA: f32 = 10_000.0;

fn layer_kinds(
    n_layers: usize,
    is_global: impl Fn(usize) -> bool,
    window: usize,
    global_theta: f32,
    local_theta: f32,
    global_scaling: RopeScaling,
) -> Vec<LayerKind> {
    (0..n_layers)
        .map(|l| {
            if is_global(l) {
                LayerKind { window: None, rope_theta: global_theta, rope_scaling: global_scaling.clone() }
            } else {
                LayerKind { window: Some(window), rope_theta: local_theta, rope_scaling: RopeScaling::None }
            }
        })
        .collect()
}

fn base(family_name: &str, hidden: usize, n_layers: usize, n_heads: usize, head_dim: usize) -> LmConfig {
    LmConfig {
        family: Family::Gemma3,
        arch_name: family_name.into(),
        vocab_size: 0,
        hidden,
        n_layers,
        n_heads,
        n_kv_heads: n_heads,
        head_dim,
        ffn: 0,
        norm_eps: 1e-6,
        max_context: 32_768,
        layers: Vec::new(),
        rope_interleaved: false,
        activation: Activation::GeluTanh,
        qkv_bias: false,
        qk_norm: true,
        sandwich_norms: true,
        embed_scale: Some((hidden as f32).sqrt()),
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_softcap: None,
        final_softcap: None,
        tied_embeddings: true,
    }
}

pub fn config_from_gguf(g: &GgufFile) -> Result<LmConfig> {
    let m = crate::gguf_meta::Meta::new(g, "gemma3");
    let hidden = m.req("embedding_length")?;
    let n_heads = m.req("attention.head_count")?;
    let n_layers = crate::config::check_layers(m.req("block_count")?)?;
    let head_dim = m.opt("attention.key_length").unwrap_or(256);
    let mut c = base("gemma3", hidden, n_layers, n_heads, head_dim);
    c.vocab_size = m.vocab_size()?;
    c.n_kv_heads = m.opt("attention.head_count_kv").unwrap_or(n_heads);
    c.ffn = m.req("feed_forward_length")?;
    c.norm_eps = m.f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-6);
    c.max_context = m.opt("context_length").unwrap_or(32_768);
    c.final_softcap = m.f32("final_logit_softcapping");
    c.attn_softcap = m.f32("attn_logit_softcapping");
    // Gemma 3 27B scales queries by 1/sqrt(hidden / heads) (query_pre_attn_scalar
    // 168); the other sizes by 1/sqrt(head_dim). GGUF does not store the scalar.
    if hidden == 5376 && n_heads == 32 {
        c.attn_scale = 1.0 / ((hidden / n_heads) as f32).sqrt();
    }
    let scaling = match m.f32("rope.scaling.factor") {
        Some(f) if f > 0.0 && f != 1.0 => RopeScaling::Linear { factor: f },
        _ => RopeScaling::None,
    };
    let window = m.opt("attention.sliding_window").unwrap_or(512);
    let theta = m.f32("rope.freq_base").unwrap_or(1_000_000.0);
    c.layers =
        layer_kinds(n_layers, |l| (l + 1).is_multiple_of(DEFAULT_PATTERN), window, theta, LOCAL_ROPE_THETA, scaling);
    c.tied_embeddings = g.tensor("output.weight").is_none();
    Ok(c)
}

pub fn config_from_hf(hf: &HfConfig) -> Result<LmConfig> {
    let c = hf.text_config();
    let hidden = c.req("hidden_size")?;
    let n_heads = c.req("num_attention_heads")?;
    let n_layers = crate::config::check_layers(c.req("num_hidden_layers")?)?;
    let head_dim = c.opt("head_dim").unwrap_or(256);
    let mut cfg = base("gemma3", hidden, n_layers, n_heads, head_dim);
    cfg.vocab_size = c.req("vocab_size")?;
    cfg.n_kv_heads = c.opt("num_key_value_heads").unwrap_or(n_heads);
    cfg.ffn = c.req("intermediate_size")?;
    cfg.norm_eps = c.f32("rms_norm_eps").unwrap_or(1e-6);
    cfg.max_context = c.opt("max_position_embeddings").unwrap_or(32_768);
    cfg.final_softcap = c.f32("final_logit_softcapping");
    cfg.attn_softcap = c.f32("attn_logit_softcapping");
    cfg.attn_scale = 1.0 / c.f32("query_pre_attn_scalar").unwrap_or(head_dim as f32).sqrt();
    cfg.activation = c.activation("hidden_activation")?.unwrap_or(Activation::GeluTanh);
    cfg.tied_embeddings = c.bool("tie_word_embeddings").or(hf.bool("tie_word_embeddings")).unwrap_or(true);
    let window = c.opt("sliding_window").unwrap_or(512);
    let pattern = c.opt("sliding_window_pattern").unwrap_or(DEFAULT_PATTERN);
    let types = c.str_list("layer_types");
    let is_global = |l: usize| match &types {
        Some(t) => t.get(l).map(|s| s == "full_attention").unwrap_or(false),
        None => (l + 1).is_multiple_of(pattern),
    };
    cfg.layers = layer_kinds(
        n_layers,
        is_global,
        window,
        c.rope_theta("full_attention").unwrap_or(1_000_000.0),
        c.f32("rope_local_base_freq").or(c.rope_object_theta("sliding_attention")).unwrap_or(LOCAL_ROPE_THETA),
        c.rope_scaling("full_attention")?,
    );
    Ok(cfg)
}
