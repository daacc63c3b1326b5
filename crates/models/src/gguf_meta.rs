//! Typed access to `{arch}.*` GGUF metadata with clear errors for missing keys.

use ferrite_core::{Error, Result};
use ferrite_loader::gguf::GgufFile;

pub struct Meta<'a> {
    g: &'a GgufFile,
    arch: &'a str,
}

impl<'a> Meta<'a> {
    pub fn new(g: &'a GgufFile, arch: &'a str) -> Self {
        Meta { g, arch }
    }
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub fn opt(&self, k: &str) -> Option<usize> {
        let v = self.g.get_u64(&self.key(k))?;
        usize::try_from(v).ok().filter(|&v| v < (1 << 40))
    }
    pub fn req(&self, k: &str) -> Result<usize> {
        self.opt(k).ok_or_else(|| {
            Error::format(format!("{}: metadata key {} is missing or invalid", self.g.path.display(), self.key(k)))
        })
    }
    pub fn f32(&self, k: &str) -> Option<f32> {
        self.g.get_f64(&self.key(k)).map(|v| v as f32)
    }
    /// `{arch}.vocab_size`, else the length of the tokenizer's token list.
    pub fn vocab_size(&self) -> Result<usize> {
        if let Some(v) = self.opt("vocab_size") {
            return Ok(v);
        }
        if let Some(a) = self.g.get_array("tokenizer.ggml.tokens") {
            return Ok(a.len());
        }
        match self.g.tensor("token_embd.weight") {
            Some(t) if t.dims.len() == 2 => Ok(t.dims[1] as usize),
            _ => Err(Error::format("cannot tell the vocabulary size")),
        }
    }
}
