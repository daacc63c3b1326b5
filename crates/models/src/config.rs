//! The typed configuration of a decoder-only LM, whatever file it came from.
//! GGUF metadata and HF config.json are mapped into it by each family's module.

use ferrite_backend::Activation;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma3,
}

/// How rotary frequencies are scaled beyond the trained context.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.x frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: f32,
    },
    /// Explicit per-frequency divisors (GGUF `rope_freqs.weight`).
    Factors(Vec<f32>),
}

/// What differs between layers (Gemma 3 alternates local and global layers).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerKind {
    pub window: Option<usize>,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
}

#[derive(Clone, Debug)]
pub struct LmConfig {
    pub family: Family,
    /// Architecture name as the checkpoint spells it (for messages).
    pub arch_name: String,
    pub vocab_size: usize,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub norm_eps: f32,
    pub max_context: usize,
    pub layers: Vec<LayerKind>,
    /// GGUF `llama` stores Q/K rows permuted for interleaved RoPE.
    pub rope_interleaved: bool,
    pub activation: Activation,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// Gemma: norms after attention and after the MLP too.
    pub sandwich_norms: bool,
    /// Gemma multiplies embeddings by sqrt(hidden).
    pub embed_scale: Option<f32>,
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    pub tied_embeddings: bool,
}

impl LmConfig {
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Checks that would otherwise surface as shape errors deep in a forward pass.
    pub fn validate(&self) -> ferrite_core::Result<()> {
        let bad = |m: String| Err(ferrite_core::Error::format(format!("{}: {m}", self.arch_name)));
        if self.hidden == 0 || self.n_layers == 0 || self.n_heads == 0 || self.head_dim == 0 || self.vocab_size == 0 {
            return bad("config has a zero dimension".into());
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!("{} heads cannot share {} KV heads", self.n_heads, self.n_kv_heads));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dim {} is odd", self.head_dim));
        }
        // The CPU attention's limit (the CUDA kernels' is lower: 256, checked there).
        let max = ferrite_backend::cpu::MAX_HEAD_DIM;
        if self.head_dim > max {
            return bad(format!("head dim {} is over {max}, the most attention supports", self.head_dim));
        }
        if self.layers.len() != self.n_layers {
            return bad("per-layer settings do not cover every layer".into());
        }
        if self.layers.iter().any(|l| l.window == Some(0)) {
            return bad("a sliding window of 0 tokens".into());
        }
        if let Err(e) = check_eps(self.norm_eps) {
            return bad(e.to_string());
        }
        // Values that would turn every logit into NaN or noise without a word.
        let positive = |what: &str, v: f32| check_positive(what, v).or_else(|e| bad(e.to_string()));
        for l in &self.layers {
            positive("the RoPE base", l.rope_theta)?;
            match &l.rope_scaling {
                RopeScaling::None => {}
                RopeScaling::Linear { factor } => positive("the RoPE scaling factor", *factor)?,
                RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                    for v in [factor, low_freq_factor, high_freq_factor, original_max_position] {
                        positive("a Llama 3 RoPE scaling value", *v)?;
                    }
                }
                RopeScaling::Factors(f) => f.iter().try_for_each(|v| positive("a RoPE frequency factor", *v))?,
            }
        }
        positive("the attention scale", self.attn_scale)?;
        for cap in [self.attn_softcap, self.final_softcap].into_iter().flatten() {
            positive("a logit soft-capping value", cap)?;
        }
        if let Some(s) = self.embed_scale {
            positive("the embedding scale", s)?;
        }
        Ok(())
    }
}

/// A norm's epsilon, checked: finite and not negative (a negative one turns
/// rows of small variance into NaN).
pub fn check_eps(eps: f32) -> ferrite_core::Result<f32> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(eps)
    } else {
        Err(ferrite_core::Error::format(format!("the norm epsilon is {eps}; corrupt config?")))
    }
}

/// A setting that must be finite and above zero (a RoPE base, a scale).
pub fn check_positive(what: &str, v: f32) -> ferrite_core::Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ferrite_core::Error::format(format!("{what} is {v}; corrupt config?")))
    }
}

/// A layer count beyond any real model's is a corrupt config: refused before the
/// per-layer settings are allocated (a huge count would abort in the allocator).
pub fn check_layers(n_layers: usize) -> ferrite_core::Result<usize> {
    const MAX_LAYERS: usize = 4096;
    if n_layers > MAX_LAYERS {
        return Err(ferrite_core::Error::format(format!(
            "layer count {n_layers} is implausible (at most {MAX_LAYERS}; corrupt config?)"
        )));
    }
    Ok(n_layers)
}

/// Inverse RoPE frequencies for one layer.
pub fn inv_freq(head_dim: usize, kind: &LayerKind) -> Vec<f32> {
    let half = head_dim / 2;
    (0..half)
        .map(|i| {
            let base = (kind.rope_theta as f64).powf(-(2.0 * i as f64) / head_dim as f64);
            let f = match &kind.rope_scaling {
                RopeScaling::None => base,
                RopeScaling::Linear { factor } => base / *factor as f64,
                RopeScaling::Factors(ff) => base / ff.get(i).copied().unwrap_or(1.0) as f64,
                RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                    let (factor, lo, hi, orig) = (
                        *factor as f64,
                        *low_freq_factor as f64,
                        *high_freq_factor as f64,
                        *original_max_position as f64,
                    );
                    let wavelen = 2.0 * std::f64::consts::PI / base;
                    let (low_wl, high_wl) = (orig / lo, orig / hi);
                    if wavelen < high_wl {
                        base
                    } else if wavelen > low_wl {
                        base / factor
                    } else {
                        let smooth = (orig / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * base / factor + smooth * base
                    }
                }
            };
            f as f32
        })
        .collect()
}
