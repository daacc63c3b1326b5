//! Typed access to an HF `config.json`.

use std::cell::RefCell;
use std::rc::Rc;

use crate::config::RopeScaling;
use ferrite_backend::Activation;
use ferrite_core::{Error, Result};
use serde_json::Value;

/// The accessors read a key that is absent or null as None (the caller's
/// default applies); a key of the wrong type is noted too, and [`checked`]
/// turns the notes into the load's error, so that `"rms_norm_eps": "x"`
/// never quietly becomes the default.
///
/// [`checked`]: HfConfig::checked
pub struct HfConfig<'a> {
    v: &'a Value,
    /// "key is value, not type" for each key of the wrong type read so far.
    wrong: Rc<RefCell<Vec<String>>>,
}

impl<'a> HfConfig<'a> {
    pub fn new(v: &'a Value) -> Self {
        HfConfig { v, wrong: Rc::default() }
    }
    /// Multimodal checkpoints nest the language model's settings in `text_config`.
    pub fn text_config(&self) -> HfConfig<'a> {
        let v = self.v.get("text_config").filter(|t| t.is_object()).unwrap_or(self.v);
        HfConfig { v, wrong: self.wrong.clone() }
    }
    /// `result`, unless a key read on the way had the wrong type.
    pub fn checked<T>(&self, result: Result<T>) -> Result<T> {
        let wrong = self.wrong.borrow();
        match result {
            Ok(_) if !wrong.is_empty() => Err(Error::format(format!("config.json: {}", wrong.join("; ")))),
            r => r,
        }
    }
    fn typed<T>(&self, k: &str, what: &str, read: impl Fn(&'a Value) -> Option<T>) -> Option<T> {
        self.typed_in(self.v, k, what, read)
    }
    /// `typed` for key `k` of `obj`, a part of this config.
    fn typed_in<T>(&self, obj: &'a Value, k: &str, what: &str, read: impl Fn(&'a Value) -> Option<T>) -> Option<T> {
        let v = obj.get(k).filter(|v| !v.is_null())?;
        let r = read(v);
        if r.is_none() {
            self.wrong.borrow_mut().push(format!("{k} is {v}, not {what}"));
        }
        r
    }
    fn number_in(&self, obj: &'a Value, k: &str) -> Option<f32> {
        self.typed_in(obj, k, "a number", |v| v.as_f64().map(|v| v as f32))
    }
    pub fn str(&self, k: &str) -> Option<&'a str> {
        self.typed(k, "a string", Value::as_str)
    }
    pub fn opt(&self, k: &str) -> Option<usize> {
        self.typed(k, "a whole number", |v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
    }
    pub fn req(&self, k: &str) -> Result<usize> {
        self.opt(k).ok_or_else(|| Error::format(format!("config.json: {k} is missing or not a whole number")))
    }
    pub fn f32(&self, k: &str) -> Option<f32> {
        self.typed(k, "a number", |v| v.as_f64().map(|v| v as f32))
    }
    pub fn bool(&self, k: &str) -> Option<bool> {
        self.typed(k, "true or false", Value::as_bool)
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
    /// The RoPE settings object: transformers 5 writes `rope_parameters` (flat, or
    /// keyed by layer type as in Gemma 3); older configs `rope_scaling` plus a
    /// top-level `rope_theta`.
    fn rope_object(&self, layer_type: &str) -> Option<&'a Value> {
        let rp = self.v.get("rope_parameters").filter(|v| v.is_object())?;
        match rp.get(layer_type) {
            Some(per_type) if per_type.is_object() => Some(per_type),
            _ => Some(rp),
        }
    }

    /// RoPE base for layers of `layer_type` ("full_attention" / "sliding_attention").
    pub fn rope_theta(&self, layer_type: &str) -> Option<f32> {
        self.rope_object(layer_type).and_then(|o| self.number_in(o, "rope_theta")).or_else(|| self.f32("rope_theta"))
    }

    /// RoPE base stored for `layer_type` in `rope_parameters` only (no fallback).
    pub fn rope_object_theta(&self, layer_type: &str) -> Option<f32> {
        let o = self.v.get("rope_parameters")?.get(layer_type)?;
        self.number_in(o, "rope_theta")
    }

    pub fn rope_scaling(&self, layer_type: &str) -> Result<RopeScaling> {
        let rs = match self.rope_object(layer_type) {
            Some(o) => Some(o),
            None => self.v.get("rope_scaling").filter(|v| v.is_object()),
        };
        let Some(rs) = rs else {
            return Ok(RopeScaling::None);
        };
        let ty = rs.get("rope_type").or_else(|| rs.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
        let f = |k: &str| self.number_in(rs, k);
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
