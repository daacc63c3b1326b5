//! Tokenizers: the one embedded in a GGUF file (SentencePiece or byte-level
//! BPE, matching llama.cpp token for token) or a Hugging Face `tokenizer.json`
//! directory (run by the `tokenizers` crate).
//!
//! Special tokens written literally in the input (`<|im_start|>`,
//! `<start_of_turn>`) always become their single token: prompts are built by
//! chat templates that print them as text.

mod bpe;
mod byte_level;
mod detok;
mod eog;
mod gguf_vocab;
mod hf;
mod pretok;
mod special;
mod spm;
mod vocab;

use std::path::Path;

use ferrite_core::Result;

use crate::gguf::GgufFile;
use gguf_vocab::GgufVocab;
use hf::HfTokenizer;

enum Inner {
    Gguf(Box<GgufVocab>),
    Hf(Box<HfTokenizer>),
}

/// A vocabulary's fill-in-the-middle tokens: the prefix, suffix and middle
/// markers, and the ids besides EOS that end an infill (padding, file and
/// repository separators, end of turn).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fim {
    pub prefix: u32,
    pub suffix: u32,
    pub middle: u32,
    pub ends: Vec<u32>,
}

/// A model's tokenizer. Cheap to share: `Send + Sync`, all methods take `&self`.
pub struct Tokenizer {
    inner: Inner,
}

const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
};

impl Tokenizer {
    /// The tokenizer in a GGUF's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer> {
        Ok(Tokenizer { inner: Inner::Gguf(Box::new(GgufVocab::from_gguf(gguf)?)) })
    }

    /// An HF layout directory: `tokenizer.json` (padding and truncation turned
    /// off), with BOS/EOS from `tokenizer_config.json` and extra EOS ids from
    /// `generation_config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        Ok(Tokenizer { inner: Inner::Hf(Box::new(HfTokenizer::from_dir(dir)?)) })
    }

    /// Token ids for `text`. `add_special` adds BOS/EOS as the model's
    /// metadata asks (GGUF `add_bos_token`/`add_eos_token` with llama.cpp's
    /// defaults; HF: the post-processor, then `tokenizer_config.json`).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Gguf(v) => v.encode(text, add_special),
            Inner::Hf(h) => h.encode(text, add_special),
        }
    }

    /// The bytes `id` contributes to decoded text, for incremental UTF-8-safe
    /// detokenization; a special token gives its literal text, an unknown id
    /// nothing. (HF WordPiece: a word-initial piece starts with a space.)
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match &self.inner {
            Inner::Gguf(v) => v.token_bytes(id),
            Inner::Hf(h) => h.token_bytes(id),
        }
    }

    /// Text for `ids`; bytes that are not valid UTF-8 become U+FFFD. GGUF:
    /// llama.cpp's detokenize (`skip_special` drops control tokens and the
    /// BOS/EOS that `add_special` would add). HF: `tokenizers`' decode.
    /// Unknown ids contribute nothing.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        match &self.inner {
            Inner::Gguf(v) => String::from_utf8_lossy(&v.decode(ids, skip_special)).into_owned(),
            Inner::Hf(h) => h.decode(ids, skip_special),
        }
    }

    /// The bytes at the end of `ids` that begin a character the ids do not
    /// finish (a prompt of token ids may stop inside one), for generation's
    /// text to start with, so that the character comes out whole. Empty
    /// when the ids end on a whole character.
    pub fn unfinished_tail(&self, ids: &[u32]) -> Vec<u8> {
        let bytes: Vec<u8> = ids[ids.len().saturating_sub(4)..].iter().flat_map(|&id| self.token_bytes(id)).collect();
        bytes[bytes.len() - unfinished_len(&bytes)..].to_vec()
    }

    /// `decode(ids, false)` without the unfinished character at its end
    /// (`unfinished_tail`), which `decode` would show as U+FFFD.
    pub fn decode_finished(&self, ids: &[u32]) -> String {
        match &self.inner {
            Inner::Gguf(v) => {
                let bytes = v.decode(ids, false);
                String::from_utf8_lossy(&bytes[..bytes.len() - unfinished_len(&bytes)]).into_owned()
            }
            Inner::Hf(h) => h.decode_finished(ids, self.unfinished_tail(ids).len()),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Gguf(v) => v.vocab.len(),
            Inner::Hf(h) => h.vocab_size(),
        }
    }

    pub fn bos_id(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(v) => v.bos,
            Inner::Hf(h) => h.bos,
        }
    }

    /// Every id that ends generation, EOS first. GGUF: llama.cpp's set (eos,
    /// eot, eom, FIM pad/repo/sep and known end-of-turn names such as
    /// `<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`); HF: EOS plus
    /// `generation_config.json`'s `eos_token_id` list.
    pub fn eos_ids(&self) -> &[u32] {
        match &self.inner {
            Inner::Gguf(v) => &v.eog,
            Inner::Hf(h) => &h.eos_ids,
        }
    }

    /// The fill-in-the-middle tokens: GGUF's `tokenizer.ggml.fim_*_token_id`,
    /// else (and for HF tokenizers) the names llama.cpp knows them by
    /// (`<|fim_prefix|>`, `<fim_prefix>`, `<｜fim▁begin｜>`, `<PRE>` ...).
    pub fn fim(&self) -> Option<&Fim> {
        match &self.inner {
            Inner::Gguf(v) => v.fim.as_ref(),
            Inner::Hf(h) => h.fim.as_ref(),
        }
    }

    /// Whether `id` is a control/special token (GGUF type control, HF special added token).
    pub fn is_special(&self, id: u32) -> bool {
        match &self.inner {
            Inner::Gguf(v) => v.is_control(id),
            Inner::Hf(h) => h.is_special(id),
        }
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(v) => v.vocab.get(s),
            Inner::Hf(h) => h.token_to_id(s),
        }
    }

    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        match &self.inner {
            Inner::Gguf(v) => v.vocab.text(id),
            Inner::Hf(h) => h.id_to_token(id),
        }
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_id().and_then(|id| self.id_to_token(id))
    }

    pub fn eos_token(&self) -> Option<&str> {
        let eos = match &self.inner {
            Inner::Gguf(v) => v.eos,
            Inner::Hf(h) => h.eos,
        };
        eos.and_then(|id| self.id_to_token(id))
    }

    /// A short description for `ferrite inspect`, e.g.
    /// "gguf gpt2 BPE (pre: smollm), 49152 tokens".
    pub fn kind(&self) -> &str {
        match &self.inner {
            Inner::Gguf(v) => &v.kind,
            Inner::Hf(h) => &h.kind,
        }
    }
}

/// How many bytes at the end of `bytes` (0 to 3) begin a character that is
/// valid so far but not finished.
fn unfinished_len(bytes: &[u8]) -> usize {
    let tail = &bytes[bytes.len().saturating_sub(3)..];
    (0..tail.len())
        .find(|&start| matches!(std::str::from_utf8(&tail[start..]), Err(e) if e.valid_up_to() == 0 && e.error_len().is_none()))
        .map_or(0, |start| tail.len() - start)
}
