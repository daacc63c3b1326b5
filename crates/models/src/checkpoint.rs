//! A loaded checkpoint (GGUF file, HF directory, or generated random weights) as a
//! source of weights under canonical names. Canonical names follow GGUF
//! (`blk.3.attn_q.weight`); HF names are mapped to them in one place,
//! `canonical_hf_name`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ferrite_backend::RawWeight;
use ferrite_core::{DType, Error, HostBytes, Result};
use ferrite_loader::gguf::GgufFile;
use ferrite_loader::safetensors::SafeTensors;
use ferrite_loader::source::ModelSource;

use crate::random::RandomCheckpoint;

pub enum Checkpoint {
    Gguf(GgufFile),
    Hf(HfCheckpoint),
    /// Generated weights of a published shape, for benchmarks without files.
    Random(RandomCheckpoint),
}

pub struct HfCheckpoint {
    pub dir: PathBuf,
    pub config: serde_json::Value,
    pub tensors: SafeTensors,
    /// canonical name -> HF name
    names: HashMap<String, String>,
}

impl Checkpoint {
    pub fn open(source: &ModelSource) -> Result<Checkpoint> {
        match source {
            ModelSource::Gguf(p) => Ok(Checkpoint::Gguf(GgufFile::open(p)?)),
            ModelSource::HfDir(d) => Ok(Checkpoint::Hf(HfCheckpoint::open(d)?)),
            ModelSource::Random(p) => Ok(Checkpoint::Random(crate::random::RandomCheckpoint::preset(p)?)),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Checkpoint::Gguf(g) => &g.path,
            Checkpoint::Hf(h) => &h.dir,
            Checkpoint::Random(r) => r.path(),
        }
    }

    /// A weight by canonical name, as [rows, cols] (1-D tensors are one row).
    pub fn get(&self, name: &str) -> Result<Option<RawWeight>> {
        match self {
            Checkpoint::Gguf(g) => {
                let Some(t) = g.tensor(name) else { return Ok(None) };
                let cols = t.dims[0] as usize;
                let rows = (t.n_elements() / t.dims[0].max(1)) as usize;
                let bytes = HostBytes::new(g.mmap(), t.offset as usize..(t.offset + t.n_bytes) as usize);
                Ok(Some(RawWeight { name: name.into(), dtype: t.dtype, rows, cols, bytes }))
            }
            Checkpoint::Hf(h) => match h.names.get(name) {
                Some(hf) => h.raw(hf),
                None => Ok(None),
            },
            Checkpoint::Random(r) => r.get(name),
        }
    }

    /// A weight that must exist, with the expected shape.
    pub fn require(&self, name: &str, rows: usize, cols: usize) -> Result<RawWeight> {
        let w = self
            .get(name)?
            .ok_or_else(|| Error::format(format!("{}: missing weight {name}", self.path().display())))?;
        if w.rows != rows || w.cols != cols {
            return Err(Error::Shape(format!(
                "weight {} is [{}, {}], expected [{rows}, {cols}]",
                w.name, w.rows, w.cols
            )));
        }
        Ok(w)
    }

    /// A 1-D weight as f32 values.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let w = self.require(name, 1, len)?;
        let mut out = vec![0f32; len];
        ferrite_backend::quant::dequantize_row(w.dtype, w.bytes.as_slice(), &mut out)?;
        Ok(out)
    }

    pub fn has(&self, name: &str) -> bool {
        match self {
            Checkpoint::Gguf(g) => g.tensor(name).is_some(),
            Checkpoint::Hf(h) => h.names.contains_key(name),
            Checkpoint::Random(r) => r.has(name),
        }
    }

    /// Bytes of all tensors on a backend that keeps GGUF blocks as they are
    /// and dense weights in 16 bits (checked against GPU memory before loading).
    pub fn device_bytes(&self) -> u64 {
        self.device_tensor_bytes().iter().map(|t| t.1).sum()
    }

    /// Each tensor's name (as stored) and its bytes on such a backend.
    pub fn device_tensor_bytes(&self) -> Vec<(String, u64)> {
        let bytes = |d: DType, n: u64| if d.is_quantized() { d.bytes_for(n).unwrap_or(u64::MAX) } else { 2 * n };
        match self {
            Checkpoint::Gguf(g) => g.tensors.iter().map(|t| (t.name.clone(), bytes(t.dtype, t.n_elements()))).collect(),
            Checkpoint::Hf(h) => h
                .tensors
                .names()
                .filter_map(|n| h.tensors.tensor(n).map(|t| (n.to_string(), t)))
                .map(|(n, t)| (n, bytes(t.dtype, t.shape.iter().product::<usize>() as u64)))
                .collect(),
            Checkpoint::Random(r) => r.tensor_sizes().into_iter().map(|(n, d, e)| (n, bytes(d, e))).collect(),
        }
    }

    /// Refuses a checkpoint holding weights of a layer past the `n_layers` its
    /// config counts (`blk.N.*` by canonical name): such a config is corrupt,
    /// and running only its layers would be a different model without a word.
    pub fn check_layer_count(&self, n_layers: usize) -> Result<()> {
        let extra = match self {
            // (Anchored: a multimodal GGUF's vision tower is `v.blk.N`.)
            Checkpoint::Gguf(g) => past_layers(g.tensors.iter().map(|t| t.name.as_str()), n_layers, &["blk"], true),
            Checkpoint::Hf(h) => past_layers(h.names.keys().map(String::as_str), n_layers, &["blk"], true),
            // Generated from the config itself.
            Checkpoint::Random(_) => None,
        };
        extra.map_or(Ok(()), |name| Err(more_layers(self.path(), n_layers, name)))
    }

    /// Tensor types and counts, for `ferrite inspect`.
    pub fn type_summary(&self) -> Vec<(DType, usize)> {
        let mut counts: HashMap<DType, usize> = HashMap::new();
        match self {
            Checkpoint::Gguf(g) => g.tensors.iter().for_each(|t| *counts.entry(t.dtype).or_default() += 1),
            Checkpoint::Hf(h) => h
                .tensors
                .names()
                .filter_map(|n| h.tensors.tensor(n))
                .for_each(|t| *counts.entry(t.dtype).or_default() += 1),
            Checkpoint::Random(r) => {
                r.names().iter().filter_map(|n| r.dtype_of(n)).for_each(|d| *counts.entry(d).or_default() += 1)
            }
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_by_key(|(d, _)| d.name());
        v
    }
}

impl HfCheckpoint {
    /// A tensor by its name in the safetensors files, as [rows, cols] (1-D
    /// tensors are one row).
    pub fn raw(&self, hf: &str) -> Result<Option<RawWeight>> {
        let Some(t) = self.tensors.tensor(hf) else { return Ok(None) };
        let (rows, cols) = match t.shape.as_slice() {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            s => return Err(Error::format(format!("{hf}: unexpected shape {s:?}"))),
        };
        let owner = self.tensors.mmaps()[t.file].clone();
        let bytes = HostBytes::new(owner, t.start..t.end);
        Ok(Some(RawWeight { name: hf.to_string(), dtype: t.dtype, rows, cols, bytes }))
    }

    /// `Checkpoint::check_layer_count` for encoders, by their HF names
    /// (`encoder.layer.N.*`, `layers.N.*`).
    pub fn check_layer_count(&self, n_layers: usize) -> Result<()> {
        past_layers(self.tensors.names(), n_layers, &["layer", "layers"], false)
            .map_or(Ok(()), |name| Err(more_layers(&self.dir, n_layers, name)))
    }

    pub(crate) fn open(dir: &Path) -> Result<HfCheckpoint> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::format(format!("{}: {e}", cfg_path.display())))?;
        let tensors = SafeTensors::open_dir(dir)?;
        let sandwich = config.get("model_type").and_then(|v| v.as_str()).is_some_and(|t| t.starts_with("gemma"));
        let names =
            tensors.names().filter_map(|n| canonical_hf_name(n, sandwich).map(|c| (c, n.to_string()))).collect();
        Ok(HfCheckpoint { dir: dir.to_path_buf(), config, tensors, names })
    }
}

/// The first name with a layer index of `n_layers` or more after one of the
/// `words` (dot-separated: `blk.31.attn_q.weight`), at the name's start only
/// when `anchored`.
fn past_layers<'a>(
    names: impl Iterator<Item = &'a str>,
    n_layers: usize,
    words: &[&str],
    anchored: bool,
) -> Option<&'a str> {
    names.into_iter().find(|name| {
        let parts: Vec<&str> = name.split('.').collect();
        let pairs = parts.windows(2).take(if anchored { 1 } else { usize::MAX });
        pairs.into_iter().any(|w| words.contains(&w[0]) && w[1].parse::<usize>().is_ok_and(|l| l >= n_layers))
    })
}

fn more_layers(path: &Path, n_layers: usize, name: &str) -> Error {
    Error::format(format!(
        "{}: the config's layer count is {n_layers}, but the weights hold more ({name}); corrupt config?",
        path.display()
    ))
}

/// Maps an HF tensor name to its canonical (GGUF-style) name. `sandwich`: Gemma's
/// layer norms, where `post_attention_layernorm` follows attention instead of
/// preceding the MLP.
pub fn canonical_hf_name(hf: &str, sandwich: bool) -> Option<String> {
    let name = hf.strip_prefix("language_model.").unwrap_or(hf);
    let name = name.strip_prefix("model.language_model.").map(|s| format!("model.{s}"));
    let name = name.as_deref().unwrap_or(hf.strip_prefix("language_model.").unwrap_or(hf));
    match name {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (idx, part) = rest.split_once('.')?;
    let idx: usize = idx.parse().ok()?;
    let (module, suffix) = part.rsplit_once('.')?;
    let canon = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" if sandwich => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{idx}.{canon}.{suffix}"))
}
