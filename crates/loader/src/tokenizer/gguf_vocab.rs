//! The tokenizer embedded in a GGUF file, built to behave exactly like
//! llama.cpp's `llama_vocab` (the reference for GGUF models): which ids are
//! special, BOS/EOS defaults, end-of-generation ids, tokenization and
//! detokenization. `tests/tokenizer_golden.rs` checks it against llama.cpp.

use ferrite_core::{Error, Result};

use super::bpe::Bpe;
use super::eog::end_of_generation;
use super::pretok::{self, PreConfig, PreTokenizer};
use super::special::{Fragment, SpecialMatcher};
use super::spm::Spm;
use super::vocab::Vocab;
use super::{byte_level, detok, Fim};
use crate::gguf::{GgufFile, MetaArray, MetaValue};

/// Token attributes, as llama.cpp derives them from `tokenizer.ggml.token_type`.
pub(crate) mod attr {
    pub const NORMAL: u8 = 1;
    pub const UNKNOWN: u8 = 2;
    pub const CONTROL: u8 = 4;
    pub const USER_DEFINED: u8 = 8;
    pub const UNUSED: u8 = 16;
    pub const BYTE: u8 = 32;
}

const KEY_TOKENS: &str = "tokenizer.ggml.tokens";

pub(crate) enum Model {
    Spm(Box<Spm>),
    Bpe(Box<Bpe>),
}

pub(crate) struct GgufVocab {
    pub vocab: Vocab,
    pub attrs: Vec<u8>,
    pub model: Model,
    specials: SpecialMatcher,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// eos first, then the other end-of-generation ids in ascending order.
    pub eog: Vec<u32>,
    pub fim: Option<Fim>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    pub kind: String,
}

fn str_array<'a>(gguf: &'a GgufFile, key: &str) -> Result<Option<&'a [String]>> {
    match gguf.get_array(key) {
        None => Ok(None),
        Some(MetaArray::Str(v)) => Ok(Some(v)),
        Some(_) => Err(Error::Tokenizer(format!("GGUF key {key} is not an array of strings"))),
    }
}

/// A token id from metadata, if present and inside the vocabulary.
pub(crate) fn token_id(gguf: &GgufFile, key: &str, n_tokens: usize) -> Option<u32> {
    let id = gguf.get_u64(key)?;
    if id as usize >= n_tokens {
        eprintln!("warning: GGUF {key} = {id} is outside the {n_tokens}-token vocabulary; ignored");
        return None;
    }
    Some(id as u32)
}

/// Token attributes from `tokenizer.ggml.token_type` (all normal without it).
fn token_attrs(gguf: &GgufFile, n: usize) -> Result<Vec<u8>> {
    match gguf.get_array("tokenizer.ggml.token_type") {
        None => Ok(vec![attr::NORMAL; n]),
        Some(MetaArray::Int(types)) if types.len() >= n => Ok(types[..n]
            .iter()
            .map(|&t| match t {
                1 => attr::NORMAL,
                2 => attr::UNKNOWN,
                3 => attr::CONTROL,
                4 => attr::USER_DEFINED,
                5 => attr::UNUSED,
                6 => attr::BYTE,
                _ => 0,
            })
            .collect()),
        Some(a) => Err(Error::Tokenizer(format!(
            "GGUF tokenizer.ggml.token_type must be {n} integers, found {} entries",
            a.len()
        ))),
    }
}

/// SentencePiece scores (all zero without them, as in llama.cpp).
fn spm_scores(gguf: &GgufFile, n: usize) -> Result<Vec<f32>> {
    match gguf.get_array("tokenizer.ggml.scores") {
        None => Ok(vec![0.0; n]),
        Some(MetaArray::Float(s)) if s.len() >= n => Ok(s[..n].iter().map(|&x| x as f32).collect()),
        Some(MetaArray::Int(s)) if s.len() >= n => Ok(s[..n].iter().map(|&x| x as f32).collect()),
        Some(a) => {
            Err(Error::Tokenizer(format!("GGUF tokenizer.ggml.scores must be {n} numbers, found {} entries", a.len())))
        }
    }
}

/// The BPE model and its pre-tokenizer family; no `tokenizer.ggml.pre` means
/// "default", as in llama.cpp, and an unknown one is an error.
fn bpe_model(gguf: &GgufFile, vocab: &Vocab, pre_name: &str) -> Result<(Bpe, PreConfig)> {
    let merges = str_array(gguf, "tokenizer.ggml.merges")?
        .ok_or_else(|| Error::Tokenizer("GGUF gpt2 tokenizer has no tokenizer.ggml.merges array".into()))?;
    let cfg = if pre_name.is_empty() {
        eprintln!("warning: GGUF has no tokenizer.ggml.pre; using 'default' (as llama.cpp does)");
        pretok::lookup("default")
    } else {
        pretok::lookup(pre_name)
    }
    .ok_or_else(|| {
        Error::Tokenizer(format!(
            "unknown GGUF pre-tokenizer type '{pre_name}' (tokenizer.ggml.pre); supported: {}",
            pretok::SUPPORTED
        ))
    })?;
    let bpe = Bpe::new(PreTokenizer::new(&cfg)?, cfg.ignore_merges, vocab, merges);
    Ok((bpe, cfg))
}

impl GgufVocab {
    pub fn from_gguf(gguf: &GgufFile) -> Result<GgufVocab> {
        let model_name = match gguf.get("tokenizer.ggml.model") {
            Some(MetaValue::Str(s)) => s.as_str(),
            Some(_) => return Err(Error::Tokenizer("GGUF tokenizer.ggml.model is not a string".into())),
            None => return Err(Error::Tokenizer("GGUF has no tokenizer (tokenizer.ggml.model is missing)".into())),
        };
        let is_spm = match model_name {
            "llama" => true,
            "gpt2" => false,
            other => {
                return Err(Error::Tokenizer(format!(
                    "unsupported GGUF tokenizer model '{other}' (supported: llama, gpt2)"
                )))
            }
        };
        let tokens_in =
            str_array(gguf, KEY_TOKENS)?.ok_or_else(|| Error::Tokenizer(format!("GGUF has no {KEY_TOKENS} array")))?;
        let n = tokens_in.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(Error::Tokenizer(format!("GGUF {KEY_TOKENS} has {n} entries")));
        }

        // llama.cpp renames empty tokens and rejects duplicates.
        let texts = tokens_in
            .iter()
            .enumerate()
            .map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t.clone() })
            .collect();
        let vocab = Vocab::new(texts).map_err(|(a, b)| {
            let t = &tokens_in[a as usize];
            Error::Tokenizer(format!("duplicate token {t:?} in vocabulary (ids {a} and {b})"))
        })?;

        let mut attrs = token_attrs(gguf, n)?;

        let pre_name = gguf.get_str("tokenizer.ggml.pre").unwrap_or("").to_string();
        let (model, pre_cfg, kind) = if is_spm {
            let scores = spm_scores(gguf, n)?;
            (Model::Spm(Box::new(Spm::new(scores, &vocab))), None, format!("gguf llama SPM, {n} tokens"))
        } else {
            let (bpe, cfg) = bpe_model(gguf, &vocab, &pre_name)?;
            let shown = if pre_name.is_empty() { "default" } else { &pre_name };
            (Model::Bpe(Box::new(bpe)), Some(cfg), format!("gguf gpt2 BPE (pre: {shown}), {n} tokens"))
        };

        // llama.cpp's defaults per model type, then the metadata.
        let (default_bos, default_eos) = match &pre_cfg {
            None => (Some(1), Some(2)),
            Some(c) if c.no_default_bos => (None, Some(11)),
            Some(_) => (Some(11), Some(11)),
        };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let bos = token_id(gguf, "tokenizer.ggml.bos_token_id", n).or(in_range(default_bos));
        let eos = token_id(gguf, "tokenizer.ggml.eos_token_id", n).or(in_range(default_eos));
        let add_bos = gguf.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(pre_cfg.is_none_or(|c| c.add_bos));
        let add_eos = gguf.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);
        let add_space_prefix = gguf.get_bool("tokenizer.ggml.add_space_prefix").unwrap_or(is_spm);
        let clean_spaces = pre_cfg.is_some_and(|c| c.clean_spaces);
        if add_bos && bos.is_none() {
            return Err(Error::Tokenizer("GGUF sets add_bos_token but has no BOS token id".into()));
        }
        if add_eos && eos.is_none() {
            return Err(Error::Tokenizer("GGUF sets add_eos_token but has no EOS token id".into()));
        }

        let (eog, fim) = end_of_generation(gguf, &vocab, &mut attrs, eos);
        // llama.cpp always renders these gpt-oss tokens, so they are user-defined.
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = vocab.get(name) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }

        let specials = SpecialMatcher::new(
            vocab
                .texts()
                .iter()
                .enumerate()
                .filter(|(i, _)| attrs[*i] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
                .map(|(i, t)| (i as u32, t.as_str())),
        );

        Ok(GgufVocab {
            vocab,
            attrs,
            model,
            specials,
            bos,
            eos,
            eog,
            fim,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            kind,
        })
    }

    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        // SPM: text right after a special token (or at the start) gets the space prefix.
        let mut after_special = true;
        for fragment in self.specials.partition(text) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => match &self.model {
                    Model::Spm(spm) => {
                        let prefix = if self.add_space_prefix && after_special { " " } else { "" };
                        let escaped = format!("{prefix}{t}").replace(' ', "\u{2581}");
                        spm.tokenize(&self.vocab, &escaped, &mut out)?;
                        after_special = false;
                    }
                    Model::Bpe(bpe) => bpe.tokenize(&self.vocab, t, &mut out)?,
                },
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// llama.cpp's `token_to_piece(special = true)`.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(text) = self.vocab.text(id) else {
            return Vec::new();
        };
        let a = self.attrs[id as usize];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.model {
                Model::Spm(_) => text.replace('\u{2581}', " ").into_bytes(),
                Model::Bpe(_) => byte_level_decode(text),
            };
        }
        if a & attr::BYTE != 0 {
            // "<0xNN>" -> NN; llama.cpp reads the two hex digits at offset 3.
            let hex = text.get(3..5).unwrap_or("");
            return vec![u8::from_str_radix(hex, 16).unwrap_or(0)];
        }
        Vec::new()
    }

    /// llama.cpp's `llama_detokenize(remove_special = skip_special, unparse_special = !skip_special)`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if skip_special && self.add_bos && !ids.is_empty() && Some(ids[0]) == self.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if skip_special && self.add_eos && !ids.is_empty() && Some(ids[ids.len() - 1]) == self.eos {
            ids = &ids[..ids.len() - 1];
        }
        let mut out = Vec::new();
        for &id in ids {
            let hidden = self.attrs.get(id as usize).is_some_and(|a| a & (attr::UNKNOWN | attr::CONTROL) != 0);
            if !(skip_special && hidden) {
                let piece = self.token_bytes(id);
                let strip = usize::from(remove_space && piece.first() == Some(&b' '));
                out.extend_from_slice(&piece[strip..]);
            }
            remove_space = false;
        }
        if self.clean_spaces {
            detok::clean_spaces(&mut out);
        }
        out
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|a| a & attr::CONTROL != 0)
    }
}

/// Maps each alphabet character back to its byte; llama.cpp writes an
/// `[UNK_BYTE_0x..]` marker for characters outside the alphabet.
fn byte_level_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match byte_level::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}
