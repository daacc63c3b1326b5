//! Random-weight checkpoints of published model shapes, so the engine can be
//! benchmarked at realistic sizes with no weights on disk. Each preset carries the
//! HF `config.json` fields its model publishes and maps through the same HF mapper
//! as the real checkpoint; weights are generated on demand under canonical names.
//!
//! Values are deterministic (seeded by the tensor name and the element's chunk, so
//! the thread count does not matter) and scaled by 1/sqrt(fan-in), which keeps
//! activations finite through deep stacks. Norm weights are 1.

use std::path::{Path, PathBuf};

use ferrite_backend::RawWeight;
use ferrite_core::{DType, Error, HostBytes, Result};
use rayon::prelude::*;
use serde_json::{json, Value};

use crate::config::{Family, LmConfig};

/// Preset names accepted by [`RandomCheckpoint::preset`].
pub const PRESETS: &[&str] =
    &["llama-3.1-8b", "llama-3.2-1b", "llama-70b", "qwen2.5-7b", "qwen3-8b", "smollm2-135m", "gemma3-270m"];

/// Elements per independently seeded chunk (1 MiB of bf16): the unit of parallelism.
const CHUNK: usize = 1 << 19;
/// Bias values are uniform in ±BIAS_SCALE.
const BIAS_SCALE: f32 = 0.02;

pub struct RandomCheckpoint {
    preset: &'static str,
    path: PathBuf,
    config: Value,
    dtype: DType,
    /// GGUF block types of the matrices, when quantized.
    quant: Option<QuantMix>,
    /// The mapped config, for tensor shapes.
    lm: LmConfig,
}

/// Block types of random quantized matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QuantMix {
    /// Every matrix in one type.
    All(DType),
    /// llama.cpp's Q4_K_M (Q4_K) or Q5_K_M (Q5_K) mix: that type, with Q6_K
    /// for the output matrix (the embedding when tied) and for attn_v and
    /// ffn_down in the layers it gives more bits.
    KMedium(DType),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Matrix,
    Norm,
    Bias,
}

impl RandomCheckpoint {
    /// A preset by name (see [`PRESETS`]), with bf16 matrices, or
    /// `PRESET:TYPE` with matrices of TYPE: f32, f16, bf16, a GGUF block type
    /// (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k) or the q4_k_m or
    /// q5_k_m mix.
    pub fn preset(spec: &str) -> Result<RandomCheckpoint> {
        let (name, ty) = spec.split_once(':').map_or((spec, None), |(n, t)| (n, Some(t)));
        let (preset, config) =
            PRESETS.iter().find(|p| **p == name).map(|p| (*p, preset_config(p))).ok_or_else(|| {
                Error::InvalidInput(format!("unknown random preset {name:?} (presets: {})", PRESETS.join(", ")))
            })?;
        let lm = crate::registry::config_from_hf_json(&config)?;
        let path = PathBuf::from(format!("random:{spec}"));
        let ck = RandomCheckpoint { preset, path, config, dtype: DType::BF16, quant: None, lm };
        let mut ck = match ty.map(|t| t.to_ascii_lowercase()) {
            None => Ok(ck),
            Some(t) if t == "q4_k_m" => Ok(RandomCheckpoint { quant: Some(QuantMix::KMedium(DType::Q4K)), ..ck }),
            Some(t) if t == "q5_k_m" => Ok(RandomCheckpoint { quant: Some(QuantMix::KMedium(DType::Q5K)), ..ck }),
            Some(t) => match DType::from_name(&t) {
                Some(d) if d.is_quantized() => Ok(RandomCheckpoint { quant: Some(QuantMix::All(d)), ..ck }),
                Some(d) => ck.with_dtype(d),
                None => Err(Error::InvalidInput(format!(
                    "unknown weight type {t:?} in random:{spec} (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m)"
                ))),
            },
        }?;
        // A quantized preset stands for a GGUF conversion, whose `llama` Q/K
        // rows llama.cpp permutes for interleaved RoPE (as the GGUF mapper
        // reads them); the values are random, so only the kernels differ.
        if ck.quant.is_some() {
            ck.lm.rope_interleaved = matches!(ck.lm.family, Family::Llama | Family::Mistral);
        }
        Ok(ck)
    }

    /// The stored type of a matrix: as asked, or, where its rows do not fit
    /// the type's blocks, llama.cpp's fallback (k-quants to 32-blocks, then
    /// bf16).
    fn matrix_dtype(&self, name: &str) -> DType {
        let want = self.wanted_dtype(name);
        let cols = self.layout(name).map_or(0, |l| l.1);
        let fallback = match want {
            DType::Q4K => DType::Q5_0,
            DType::Q5K => DType::Q5_1,
            DType::Q6K => DType::Q8_0,
            _ => DType::BF16,
        };
        [want, fallback, DType::BF16].into_iter().find(|d| cols.is_multiple_of(d.block_size())).unwrap_or(DType::BF16)
    }

    fn wanted_dtype(&self, name: &str) -> DType {
        match self.quant {
            None => self.dtype,
            Some(QuantMix::All(d)) => d,
            Some(QuantMix::KMedium(base)) => {
                let n = self.lm.n_layers;
                let layer = name.strip_prefix("blk.").and_then(|r| r.split_once('.')).and_then(|(l, _)| l.parse().ok());
                // llama.cpp's use_more_bits: the first and last eighth, and every third between.
                let more_bits = |i: usize| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
                let output = if self.lm.tied_embeddings { "token_embd.weight" } else { "output.weight" };
                let wide = name == output
                    || (name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight"))
                        && layer.is_some_and(more_bits);
                if wide {
                    DType::Q6K
                } else {
                    base
                }
            }
        }
    }

    /// The element type of 2-D weights: F32, F16 or BF16 (vectors are always F32).
    pub fn with_dtype(mut self, dtype: DType) -> Result<RandomCheckpoint> {
        let torch = match dtype {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            d => return Err(Error::InvalidInput(format!("random weights are f32, f16 or bf16, not {d}"))),
        };
        self.config["torch_dtype"] = json!(torch);
        self.dtype = dtype;
        Ok(self)
    }

    pub fn preset_name(&self) -> &'static str {
        self.preset
    }

    /// `random:<preset>`, standing in for a file path in messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The HF `config.json` of the preset's model.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The mapped config (the HF mapper's, with a GGUF conversion's RoPE
    /// layout when quantized).
    pub fn lm(&self) -> &LmConfig {
        &self.lm
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Every tensor's canonical name, in load order.
    pub fn names(&self) -> Vec<String> {
        let c = &self.lm;
        let mut layer = vec!["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight"];
        if c.qkv_bias {
            layer.extend(["attn_q.bias", "attn_k.bias", "attn_v.bias"]);
        }
        if c.qk_norm {
            layer.extend(["attn_q_norm.weight", "attn_k_norm.weight"]);
        }
        layer.push("attn_output.weight");
        if c.sandwich_norms {
            layer.push("post_attention_norm.weight");
        }
        layer.extend(["ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]);
        if c.sandwich_norms {
            layer.push("post_ffw_norm.weight");
        }
        let mut names = vec!["token_embd.weight".to_string()];
        names.extend((0..c.n_layers).flat_map(|l| layer.iter().map(move |s| format!("blk.{l}.{s}"))));
        names.push("output_norm.weight".into());
        if !c.tied_embeddings {
            names.push("output.weight".into());
        }
        names
    }

    pub fn has(&self, name: &str) -> bool {
        self.layout(name).is_some()
    }

    /// Elements of every tensor (without generating any).
    pub fn total_elements(&self) -> u64 {
        self.tensor_sizes().iter().map(|t| t.2).sum()
    }

    /// Every tensor's name, stored type and element count (without generating any).
    pub fn tensor_sizes(&self) -> Vec<(String, DType, u64)> {
        let size = |n: &str| Some((self.dtype_of(n)?, self.layout(n).map(|(r, c, _)| (r * c) as u64)?));
        self.names().into_iter().filter_map(|n| size(&n).map(|(d, e)| (n, d, e))).collect()
    }

    /// The stored element type of `name`, if it exists.
    pub fn dtype_of(&self, name: &str) -> Option<DType> {
        self.layout(name).map(|(_, _, k)| if k == Kind::Matrix { self.matrix_dtype(name) } else { DType::F32 })
    }

    /// Generates the weight `name` as [rows, cols] (vectors are one row).
    pub fn get(&self, name: &str) -> Result<Option<RawWeight>> {
        let Some((rows, cols, kind)) = self.layout(name) else { return Ok(None) };
        let n = rows * cols;
        let (dtype, bytes) = match kind {
            Kind::Norm => (DType::F32, 1f32.to_le_bytes().repeat(n)),
            Kind::Bias => (DType::F32, fill(DType::F32, n, fnv1a(name), BIAS_SCALE)),
            Kind::Matrix => {
                let d = self.matrix_dtype(name);
                (d, fill(d, n, fnv1a(name), 1.0 / (cols as f32).sqrt()))
            }
        };
        Ok(Some(RawWeight { name: name.into(), dtype, rows, cols, bytes: HostBytes::from_vec(bytes) }))
    }

    /// Shape and kind of a canonical name, or `None` when this model has no such
    /// tensor (so `has` and `get` always agree).
    fn layout(&self, name: &str) -> Option<(usize, usize, Kind)> {
        let c = &self.lm;
        let (h, hd, qd, kvd) = (c.hidden, c.head_dim, c.n_heads * c.head_dim, c.kv_dim());
        match name {
            "token_embd.weight" => return Some((c.vocab_size, h, Kind::Matrix)),
            "output_norm.weight" => return Some((1, h, Kind::Norm)),
            "output.weight" if !c.tied_embeddings => return Some((c.vocab_size, h, Kind::Matrix)),
            _ => {}
        }
        let (idx, part) = name.strip_prefix("blk.")?.split_once('.')?;
        let l: usize = idx.parse().ok()?;
        if l >= c.n_layers || l.to_string() != idx {
            return None;
        }
        Some(match part {
            "attn_norm.weight" | "ffn_norm.weight" => (1, h, Kind::Norm),
            "attn_q.weight" => (qd, h, Kind::Matrix),
            "attn_k.weight" | "attn_v.weight" => (kvd, h, Kind::Matrix),
            "attn_output.weight" => (h, qd, Kind::Matrix),
            "ffn_gate.weight" | "ffn_up.weight" => (c.ffn, h, Kind::Matrix),
            "ffn_down.weight" => (h, c.ffn, Kind::Matrix),
            "attn_q_norm.weight" | "attn_k_norm.weight" if c.qk_norm => (1, hd, Kind::Norm),
            "post_attention_norm.weight" | "post_ffw_norm.weight" if c.sandwich_norms => (1, h, Kind::Norm),
            "attn_q.bias" if c.qkv_bias => (1, qd, Kind::Bias),
            "attn_k.bias" | "attn_v.bias" if c.qkv_bias => (1, kvd, Kind::Bias),
            _ => return None,
        })
    }
}

/// The published `config.json` fields that the HF mappers read.
fn preset_config(name: &str) -> Value {
    let llama3 = |factor: f64| {
        json!({"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    };
    let llama = |hidden: usize, layers: usize, heads: usize, ffn: usize, tied: bool, factor: f64| {
        json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
               "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 8,
               "head_dim": hidden / heads, "intermediate_size": ffn, "vocab_size": 128256,
               "hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "rope_scaling": llama3(factor), "max_position_embeddings": 131072,
               "tie_word_embeddings": tied, "torch_dtype": "bfloat16"})
    };
    match name {
        "llama-3.1-8b" => llama(4096, 32, 32, 14336, false, 8.0),
        "llama-3.2-1b" => llama(2048, 16, 32, 8192, true, 32.0),
        "llama-70b" => llama(8192, 80, 64, 28672, false, 8.0),
        "qwen2.5-7b" => json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "intermediate_size": 18944, "vocab_size": 152064, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "max_position_embeddings": 131072, "sliding_window": 131072,
            "use_sliding_window": false, "max_window_layers": 28, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16"}),
        "qwen3-8b" => json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "hidden_act": "silu",
            "attention_bias": false, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": null,
            "max_position_embeddings": 40960, "sliding_window": null, "use_sliding_window": false,
            "max_window_layers": 36, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}),
        "smollm2-135m" => json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "hidden_act": "silu",
            "attention_bias": false, "mlp_bias": false, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "rope_scaling": null, "max_position_embeddings": 8192, "tie_word_embeddings": true,
            "torch_dtype": "bfloat16"}),
        // Five local (sliding-window) layers to one global.
        "gemma3-270m" => json!({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144,
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "sliding_window": 512, "query_pre_attn_scalar": 256,
            "layer_types": (0..18).map(|l| if l % 6 == 5 { "full_attention" } else { "sliding_attention" })
                .collect::<Vec<_>>(),
            "max_position_embeddings": 32768, "attn_logit_softcapping": null, "final_logit_softcapping": null,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16"}),
        _ => unreachable!("preset_config is called with names from PRESETS"),
    }
}

/// `n` values uniform in ±scale as little-endian `dtype` bytes, filled in parallel.
fn fill(dtype: DType, n: usize, seed: u64, scale: f32) -> Vec<u8> {
    match dtype {
        DType::F32 => fill_as(n, seed, scale, f32::to_le_bytes),
        DType::F16 => fill_as(n, seed, scale, |x| half::f16::from_f32(x).to_le_bytes()),
        DType::BF16 => fill_as(n, seed, scale, |x| half::bf16::from_f32(x).to_le_bytes()),
        d => fill_blocks(d, n, seed, scale),
    }
}

/// Random blocks of a GGUF type: random quants, with every f16 scale set so
/// the values come out about `scale` in size.
fn fill_blocks(dtype: DType, n: usize, seed: u64, scale: f32) -> Vec<u8> {
    let bb = dtype.block_bytes();
    // (offsets of the f16 scales, typical |quant x sub-scale|)
    let (fields, unit): (&[usize], f32) = match dtype {
        DType::Q4_0 => (&[0], 4.0),
        DType::Q5_0 => (&[0], 8.0),
        DType::Q8_0 => (&[0], 64.0),
        DType::Q4_1 | DType::Q5_1 => (&[0, 2], 16.0),
        DType::Q4K | DType::Q5K => (&[0, 2], 300.0),
        DType::Q6K => (&[208], 2000.0),
        d => unreachable!("{d} is not a block type"),
    };
    let d = half::f16::from_f32(scale / unit).to_le_bytes();
    let mut out = vec![0u8; n / dtype.block_size() * bb];
    let blocks_per_chunk = (CHUNK / dtype.block_size()).max(1);
    out.par_chunks_mut(blocks_per_chunk * bb).enumerate().for_each(|(i, chunk)| {
        let mut state = seed ^ splitmix64(&mut (i as u64));
        for word in chunk.chunks_mut(8) {
            let r = splitmix64(&mut state).to_le_bytes();
            word.copy_from_slice(&r[..word.len()]);
        }
        for block in chunk.chunks_exact_mut(bb) {
            for &o in fields {
                block[o..o + 2].copy_from_slice(&d);
            }
        }
    });
    out
}

fn fill_as<const N: usize>(n: usize, seed: u64, scale: f32, enc: impl Fn(f32) -> [u8; N] + Sync) -> Vec<u8> {
    let mut out = vec![0u8; n * N];
    out.par_chunks_mut(CHUNK * N).enumerate().for_each(|(i, chunk)| {
        let mut state = seed ^ splitmix64(&mut (i as u64));
        // Two values per draw; 24-bit integers are exact in f32.
        let unit = |bits: u64| (bits & 0xFF_FFFF) as f32 * (2.0 / (1u32 << 24) as f32) - 1.0;
        let mut pairs = chunk.chunks_exact_mut(2 * N);
        for pair in &mut pairs {
            let r = splitmix64(&mut state);
            let (a, b) = pair.split_at_mut(N);
            a.copy_from_slice(&enc(unit(r >> 40) * scale));
            b.copy_from_slice(&enc(unit(r >> 16) * scale));
        }
        let last = pairs.into_remainder();
        if !last.is_empty() {
            last.copy_from_slice(&enc(unit(splitmix64(&mut state) >> 40) * scale));
        }
    });
    out
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::registry::config_of;
    use crate::ForwardBatch;
    use ferrite_backend::{AttnBatch, KvDtype, SeqSlice};

    /// Element counts come from the shapes alone (no weight is generated):
    /// Llama-3.1-8B has its published 8.03 B parameters.
    #[test]
    fn total_elements_match_published_sizes() {
        let n = RandomCheckpoint::preset("llama-3.1-8b").unwrap().total_elements();
        assert!((8_020_000_000..8_040_000_000).contains(&n), "{n}");
        let ck = Checkpoint::Random(RandomCheckpoint::preset("smollm2-135m").unwrap());
        // bf16: two bytes each.
        let bytes = ck.device_bytes();
        assert!((268_000_000..272_000_000).contains(&bytes), "{bytes}");
    }

    #[test]
    fn k_quant_mixes_follow_llama_cpp() {
        let ck = RandomCheckpoint::preset("llama-3.1-8b:q4_k_m").unwrap();
        let ty = |n: &str| ck.dtype_of(n).unwrap();
        assert_eq!(ty("blk.0.attn_v.weight"), DType::Q6K);
        assert_eq!(ty("blk.4.attn_v.weight"), DType::Q4K);
        assert_eq!(ty("blk.6.ffn_down.weight"), DType::Q6K);
        assert_eq!(ty("blk.6.ffn_up.weight"), DType::Q4K);
        assert_eq!(ty("output.weight"), DType::Q6K);
        assert_eq!(ty("blk.0.attn_norm.weight"), DType::F32);
        // Published Llama-3.1-8B Q4_K_M files are 4.92 GB.
        let bytes = Checkpoint::Random(ck).device_bytes();
        assert!((4_700_000_000..5_100_000_000).contains(&bytes), "{bytes}");
        let q5 = RandomCheckpoint::preset("llama-3.1-8b:q5_k_m").unwrap();
        let ty = |n: &str| q5.dtype_of(n).unwrap();
        assert_eq!(ty("blk.0.attn_v.weight"), DType::Q6K);
        assert_eq!(ty("blk.4.attn_v.weight"), DType::Q5K);
        assert_eq!(ty("output.weight"), DType::Q6K);
        // Published Llama-3.1-8B Q5_K_M files are 5.73 GB.
        let bytes = Checkpoint::Random(q5).device_bytes();
        assert!((5_500_000_000..5_900_000_000).contains(&bytes), "{bytes}");
        // SmolLM2's 576-wide rows do not fit 256-blocks: llama.cpp's fallbacks.
        let small = RandomCheckpoint::preset("smollm2-135m:Q4_K").unwrap();
        assert_eq!(small.dtype_of("blk.0.attn_q.weight").unwrap(), DType::Q5_0);
        assert_eq!(small.dtype_of("blk.0.ffn_down.weight").unwrap(), DType::Q4K);
        let w = small.get("blk.0.ffn_down.weight").unwrap().unwrap();
        let v = values(&w);
        let rms = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        assert!(v.iter().all(|x| x.is_finite()) && rms > 0.002 && rms < 0.2, "rms {rms}");
        assert!(RandomCheckpoint::preset("smollm2-135m:q9").is_err());
    }

    /// Gemma-3-270M's Q4_K_M file holds Q4_K x27, Q5_0 x81, Q6_K x9 and
    /// Q8_0 x10 matrices (its tied embedding in Q8_0), 253 MB in all.
    #[test]
    fn a_tied_k_quant_mix_matches_a_published_file() {
        let ck = RandomCheckpoint::preset("gemma3-270m:q4_k_m").unwrap();
        let mut counts = std::collections::BTreeMap::new();
        for (_, d, _) in ck.tensor_sizes().into_iter().filter(|t| t.1 != DType::F32) {
            *counts.entry(d.to_string()).or_insert(0) += 1;
        }
        let want = [("Q4_K", 27), ("Q5_0", 81), ("Q6_K", 9), ("Q8_0", 10)];
        assert_eq!(counts, want.iter().map(|(d, n)| (d.to_string(), *n)).collect(), "{counts:?}");
        assert_eq!(ck.dtype_of("token_embd.weight").unwrap(), DType::Q8_0);
        let bytes = Checkpoint::Random(ck).device_bytes();
        assert!((245_000_000..260_000_000).contains(&bytes), "{bytes}");
    }

    fn values(w: &RawWeight) -> Vec<f32> {
        let mut out = vec![0f32; w.rows * w.cols];
        ferrite_backend::quant::dequantize_row(w.dtype, w.bytes.as_slice(), &mut out).unwrap();
        out
    }

    #[test]
    fn presets_map_to_published_shapes() {
        // (preset, hidden, layers, heads, kv heads, head dim, ffn, vocab, tied)
        let want = [
            ("llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256, false),
            ("llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, true),
            ("llama-70b", 8192, 80, 64, 8, 128, 28672, 128256, false),
            ("qwen2.5-7b", 3584, 28, 28, 4, 128, 18944, 152064, false),
            ("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, false),
            ("smollm2-135m", 576, 30, 9, 3, 64, 1536, 49152, true),
            ("gemma3-270m", 640, 18, 4, 1, 256, 2048, 262144, true),
        ];
        assert_eq!(want.len(), PRESETS.len());
        for (p, hidden, layers, heads, kv, hd, ffn, vocab, tied) in want {
            let c = config_of(&Checkpoint::Random(RandomCheckpoint::preset(p).unwrap())).unwrap();
            let got = (c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab_size);
            assert_eq!(got, (hidden, layers, heads, kv, hd, ffn, vocab), "{p}");
            assert_eq!(c.tied_embeddings, tied, "{p}");
            assert_eq!(c.qkv_bias, p == "qwen2.5-7b", "{p}");
            assert_eq!(c.qk_norm, p == "qwen3-8b" || p == "gemma3-270m", "{p}");
            assert_eq!(c.sandwich_norms, p == "gemma3-270m", "{p}");
        }
        let c = config_of(&Checkpoint::Random(RandomCheckpoint::preset("llama-3.2-1b").unwrap())).unwrap();
        assert!(matches!(c.layers[0].rope_scaling, crate::config::RopeScaling::Llama3 { factor: 32.0, .. }));
        assert_eq!(c.layers[0].rope_theta, 500000.0);
    }

    #[test]
    fn quantized_presets_take_the_gguf_rope_layout() {
        // As the GGUF mapper reads a conversion: llama's pairs interleaved,
        // qwen's halves; 16-bit presets keep the HF layout.
        for (spec, interleaved) in [
            ("llama-3.1-8b", false),
            ("llama-3.1-8b:f16", false),
            ("llama-3.1-8b:q4_k_m", true),
            ("smollm2-135m:q8_0", true),
            ("qwen3-8b:q4_k_m", false),
        ] {
            let c = config_of(&Checkpoint::Random(RandomCheckpoint::preset(spec).unwrap())).unwrap();
            assert_eq!(c.rope_interleaved, interleaved, "{spec}");
        }
    }

    #[test]
    fn unknown_preset_lists_the_presets() {
        let Err(Error::InvalidInput(msg)) = RandomCheckpoint::preset("llama-9") else { panic!("expected an error") };
        assert!(msg.contains("qwen3-8b"), "{msg}");
        assert!(RandomCheckpoint::preset("smollm2-135m").unwrap().with_dtype(DType::Q8_0).is_err());
    }

    #[test]
    fn weights_have_shapes_dtypes_and_stable_values() {
        let ck = RandomCheckpoint::preset("qwen2.5-7b").unwrap().with_dtype(DType::F16).unwrap();
        let (q, qd) = (ck.get("blk.3.attn_q.weight").unwrap().unwrap(), 3584);
        assert_eq!((q.rows, q.cols, q.dtype), (qd, 3584, DType::F16));
        let k = ck.get("blk.3.attn_k.weight").unwrap().unwrap();
        assert_eq!((k.rows, k.cols), (512, 3584));
        let b = ck.get("blk.0.attn_v.bias").unwrap().unwrap();
        assert_eq!((b.rows, b.cols, b.dtype), (1, 512, DType::F32));
        assert!(values(&b).iter().all(|v| v.abs() <= BIAS_SCALE));
        let n = ck.get("blk.27.ffn_norm.weight").unwrap().unwrap();
        assert!(values(&n).iter().all(|&v| v == 1.0));
        for missing in ["blk.28.attn_q.weight", "blk.3.attn_q_norm.weight", "blk.03.attn_q.weight", "x"] {
            assert!(!ck.has(missing) && ck.get(missing).unwrap().is_none(), "{missing}");
        }
        let v = values(&q);
        let bound = 1.01 / (3584f32).sqrt();
        assert!(v.iter().all(|x| x.is_finite() && x.abs() <= bound));
        let mean_abs = v.iter().map(|x| x.abs()).sum::<f32>() / v.len() as f32;
        assert!((mean_abs / bound - 0.5).abs() < 0.01, "not uniform: {mean_abs}");
        assert_eq!(ck.get("blk.3.attn_q.weight").unwrap().unwrap().bytes.as_slice(), q.bytes.as_slice());
        let other = ck.get("blk.4.attn_q.weight").unwrap().unwrap();
        assert_ne!(other.bytes.as_slice(), q.bytes.as_slice());

        let tied = RandomCheckpoint::preset("llama-3.2-1b").unwrap();
        assert!(!tied.has("output.weight") && tied.get("output.weight").unwrap().is_none());
        let e = tied.get("token_embd.weight").unwrap().unwrap();
        assert_eq!((e.rows, e.cols, e.dtype), (128256, 2048, DType::BF16));
        let qwen3 = RandomCheckpoint::preset("qwen3-8b").unwrap();
        assert_eq!(qwen3.get("blk.0.attn_k_norm.weight").unwrap().unwrap().cols, 128);
        assert!(!qwen3.has("blk.0.attn_q.bias") && qwen3.has("output.weight"));
    }

    #[test]
    fn fill_is_the_same_model_in_every_dtype() {
        // Odd length: the last value has no pair; two chunks: chunk seeding.
        let n = CHUNK + 5;
        let f32s = fill(DType::F32, n, 7, 0.5);
        let want: Vec<f32> = f32s.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(fill(DType::F32, n, 7, 0.5), f32s);
        assert!(want.iter().all(|x| x.abs() <= 0.5) && want[n - 1] != want[n - 2] && want[0] != want[CHUNK]);
        for dt in [DType::F16, DType::BF16] {
            let w = RawWeight {
                name: "t".into(),
                dtype: dt,
                rows: 1,
                cols: n,
                bytes: HostBytes::from_vec(fill(dt, n, 7, 0.5)),
            };
            let got = values(&w);
            assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 0.5 / 128.0), "{dt}");
        }
    }

    #[test]
    fn names_agree_with_has() {
        let ck = RandomCheckpoint::preset("qwen3-8b").unwrap();
        let names = ck.names();
        assert_eq!(names.len(), 1 + 36 * 11 + 2);
        assert!(names.iter().all(|n| ck.has(n)));
        let summary = Checkpoint::Random(ck).type_summary();
        assert_eq!(summary, vec![(DType::BF16, 1 + 36 * 7 + 1), (DType::F32, 36 * 4 + 1)]);
    }

    #[test]
    fn smollm2_preset_runs_a_forward() {
        let ck = Checkpoint::Random(RandomCheckpoint::preset("smollm2-135m").unwrap());
        let mut lm = crate::load_causal_lm(ferrite_backend::cpu::CpuBackend::F32, &ck, &mut |_, _| {}).unwrap();
        lm.alloc_kv(1, 16, KvDtype::F32).unwrap();
        let batch = ForwardBatch {
            tokens: vec![1, 2, 3],
            positions: vec![0, 1, 2],
            attn: AttnBatch {
                seqs: vec![SeqSlice { q_start: 0, q_len: 3, ctx_len: 3, block_table: vec![0] }],
                block_size: 16,
                slots: vec![0, 1, 2],
            },
            logit_rows: vec![2],
        };
        let logits = lm.forward(&batch).unwrap();
        assert_eq!(logits.len(), 49152);
        assert!(logits.iter().all(|x| x.is_finite()));
        assert!(logits.iter().any(|&x| x != logits[0]), "logits are constant");
    }
}
