//! How token states become one vector: the sentence-transformers settings of a
//! checkpoint (`modules.json`, the Pooling module's `config.json`, a Normalize
//! module, `sentence_bert_config.json`'s `max_seq_length`).

use std::path::Path;

use ferrite_core::{Error, Result};
use serde_json::Value;

pub use ferrite_models::encoder::Pooling;

/// A checkpoint's pooling settings, or the defaults (mean, not normalized, the
/// model's own length limit) where it has none.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolingConfig {
    pub pooling: Pooling,
    pub normalize: bool,
    /// `max_seq_length` from `sentence_bert_config.json`.
    pub max_length: Option<usize>,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s).map(Some).map_err(|e| Error::format(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

impl PoolingConfig {
    pub fn from_dir(dir: &Path) -> Result<PoolingConfig> {
        let mut cfg = PoolingConfig { pooling: Pooling::Mean, normalize: false, max_length: None };
        if let Some(st) = read_json(&dir.join("sentence_bert_config.json"))? {
            cfg.max_length = st.get("max_seq_length").and_then(|v| v.as_u64()).map(|v| v as usize);
        }
        let Some(modules) = read_json(&dir.join("modules.json"))? else { return Ok(cfg) };
        let modules = modules.as_array().ok_or_else(|| Error::format("modules.json: not a list"))?;
        for m in modules {
            let kind = m.get("type").and_then(|v| v.as_str()).unwrap_or("");
            let path = m.get("path").and_then(|v| v.as_str()).unwrap_or("");
            if kind.ends_with(".Normalize") {
                cfg.normalize = true;
            } else if kind.ends_with(".Pooling") {
                let file = dir.join(path).join("config.json");
                let p = read_json(&file)?.ok_or_else(|| Error::format(format!("{}: missing", file.display())))?;
                cfg.pooling = pooling_mode(&p).map_err(|m| Error::Unsupported(format!("{}: {m}", file.display())))?;
            } else if !kind.ends_with(".Transformer") {
                // A Dense or other layer after pooling changes the vectors:
                // refuse rather than return different ones.
                return Err(Error::Unsupported(format!(
                    "{}: sentence-transformers module {kind:?} is not supported (Transformer, Pooling and Normalize are)",
                    dir.join("modules.json").display()
                )));
            }
        }
        Ok(cfg)
    }
}

fn pooling_mode(p: &Value) -> std::result::Result<Pooling, String> {
    // The newer form names the mode: {"pooling_mode": "cls", ...}.
    if let Some(mode) = p.get("pooling_mode").and_then(|v| v.as_str()) {
        return match mode {
            "cls" => Ok(Pooling::Cls),
            "mean" => Ok(Pooling::Mean),
            "max" => Ok(Pooling::Max),
            "lasttoken" => Ok(Pooling::LastToken),
            other => Err(format!("pooling_mode {other:?} is not supported")),
        };
    }
    let on = |k: &str| p.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
    let modes = [
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_max_tokens", Some(Pooling::Max)),
        ("pooling_mode_lasttoken", Some(Pooling::LastToken)),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let set: Vec<_> = modes.iter().filter(|(k, _)| on(k)).collect();
    match set.as_slice() {
        [(_, Some(mode))] => Ok(*mode),
        [(k, None)] => Err(format!("{k} is not supported")),
        [] => Err("no pooling mode is set".into()),
        _ => Err("several pooling modes at once (concatenated) are not supported".into()),
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}
