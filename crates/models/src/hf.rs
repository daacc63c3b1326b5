//! Typed access to an HF `config.json`.

use crate::config::RopeScaling;
use ferrite_backend::Activation;
use ferrite_core::{Error, Result};
use serde_json::Value;

pub struct HfConfig<'a> {
    v: &'a Value,
}

impl<'a> HfConfig<'a> {
    pub fn new(v: &'a Value) -> Self {
        HfConfig { v }
    }
    /// Multimodal checkpoints nest the language model's settings in `text_config`.
    pub fn text_config(&self) -> HfConfig<'a> {
        match self.v.get("text_config") {
            Some(t) if t.is_object() => HfConfig { v: t },
            _ => HfConfig { v: self.v },
        }
    }
    pub fn str(&self, k: &str) -> Option<&'a str> {
        self.v.get(k)?.as_str()
    }
    pub fn opt(&self, k: &str) -> Option<usize> {
        self.v.get(k)?.as_u64().and_then(|v| usize::try_from(v).ok())
    }
    pub fn req(&self, k: &str) -> Result<usize> {
        self.opt(k).ok_or_else(|| Error::format(format!("config.json: {k} is missing or not a whole number")))
    }
    pub fn f32(&self, k: &str) -> Option<f32> {
        self.v.get(k)?.as_f64().map(|v| v as f32)
    }
    pub fn bool(&self, k: &str) -> Option<bool> {
        self.v.get(k)?.as_bool()
    }
    pub fn str_list(&self, k: &str) -> Option<Vec<String>> {
        let a = self.v.get(k)?.as_array()?;
        Some(a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
    }
    pub fn activation(&self, k: &str) -> Result<Option<Activation>> {
        Ok(match self.str(k) {
            None => None,
            Some("silu") | Some("swish") => Some(Activation::Silu),
            Some("gelu_pytorch_tanh") | Some("gelu_tanh") | Some("gelu_new") => Some(Activation::GeluTanh),
            Some("gelu") => Some(Activation::Gelu),
            Some(other) => return Err(Error::Unsupported(format!("activation {other:?}"))),
        })
    }
    pub fn rope_scaling(&self) -> Result<RopeScaling> {
        let Some(rs) = self.v.get("rope_scaling").filter(|v| v.is_object()) else {
            return Ok(RopeScaling::None);
        };
        let ty = rs.get("rope_type").or_else(|| rs.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
        let f = |k: &str| rs.get(k).and_then(|v| v.as_f64()).map(|v| v as f32);
        Ok(match ty {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: f("factor").unwrap_or(1.0) },
            "llama3" => RopeScaling::Llama3 {
                factor: f("factor").unwrap_or(8.0),
                low_freq_factor: f("low_freq_factor").unwrap_or(1.0),
                high_freq_factor: f("high_freq_factor").unwrap_or(4.0),
                original_max_position: f("original_max_position_embeddings").unwrap_or(8192.0),
            },
            other => return Err(Error::Unsupported(format!("RoPE scaling type {other:?}"))),
        })
    }
}
