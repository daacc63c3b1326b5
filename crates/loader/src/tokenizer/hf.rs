//! Tokenizers from a Hugging Face model directory: `tokenizer.json` run by the
//! `tokenizers` crate (the reference implementation), plus the BOS/EOS facts
//! that live in `tokenizer_config.json` and `generation_config.json`.

use std::fs;
use std::path::Path;

use ferrite_core::quiet_panic::catch_panic;
use ferrite_core::{Error, Result};
use serde_json::Value;
use tokenizers::{DecoderWrapper, ModelWrapper};

use super::byte_level;
use super::eog::fim_by_name;
use super::Fim;

/// How far past the vocabulary's entry count a token id may lie before the
/// file counts as corrupt (a huge id would make the id-to-text table huge).
const MAX_ID_GAP: usize = 1 << 16;

/// How one token's text maps to the bytes it contributes.
#[derive(Clone, Debug, PartialEq)]
enum PieceStyle {
    /// GPT-2 byte-level alphabet.
    ByteLevel,
    /// SentencePiece: the replacement char is a space, `<0xNN>` is a byte.
    SentencePiece(char),
    /// WordPiece: continuation pieces carry the prefix; other pieces start a word.
    WordPiece(String),
    /// The token text as is.
    Plain,
}

pub(crate) struct HfTokenizer {
    tok: tokenizers::Tokenizer,
    /// id -> token text; ids the vocabulary skips hold "".
    vocab: Vec<String>,
    special: Vec<bool>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// eos first, then generation_config's other ids.
    pub eos_ids: Vec<u32>,
    pub fim: Option<Fim>,
    /// tokenizer_config's add_bos_token / add_eos_token, applied when the
    /// post-processor has not already added the token.
    add_bos: bool,
    add_eos: bool,
    style: PieceStyle,
    pub kind: String,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s)
            .map(Some)
            .map_err(|e| Error::Tokenizer(format!("{}: invalid JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// A token in tokenizer_config.json: a string or an AddedToken object.
fn token_text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

fn piece_style(decoder: Option<&DecoderWrapper>) -> PieceStyle {
    let mut flat = Vec::new();
    let mut stack: Vec<&DecoderWrapper> = decoder.into_iter().collect();
    while let Some(d) = stack.pop() {
        match d {
            DecoderWrapper::Sequence(s) => stack.extend(s.get_decoders()),
            other => flat.push(other),
        }
    }
    if flat.iter().any(|d| matches!(d, DecoderWrapper::ByteLevel(_))) {
        return PieceStyle::ByteLevel;
    }
    if let Some(w) = flat.iter().find_map(|d| match d {
        DecoderWrapper::WordPiece(w) => Some(w.prefix.clone()),
        _ => None,
    }) {
        return PieceStyle::WordPiece(w);
    }
    if let Some(c) = flat.iter().find_map(|d| match d {
        DecoderWrapper::Metaspace(m) => Some(m.get_replacement()),
        _ => None,
    }) {
        return PieceStyle::SentencePiece(c);
    }
    if flat.iter().any(|d| matches!(d, DecoderWrapper::ByteFallback(_) | DecoderWrapper::Replace(_))) {
        return PieceStyle::SentencePiece('\u{2581}');
    }
    PieceStyle::Plain
}

impl HfTokenizer {
    pub fn from_dir(dir: &Path) -> Result<HfTokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::Tokenizer(format!("{}: no tokenizer.json", dir.display())));
        }
        let mut tok = catch_panic(|| tokenizers::Tokenizer::from_file(&path))
            .map_err(|e| Error::Tokenizer(format!("{}: {e} (corrupt file?)", path.display())))?
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        // Some files ship fixed padding/truncation (MiniLM: 128); callers want the plain ids.
        tok.with_padding(None);
        tok.with_truncation(None).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;

        let n = tok.get_vocab_size(true);
        let mut vocab = vec![String::new(); n];
        for (text, id) in tok.get_vocab(true) {
            let id = id as usize;
            // Ids may leave small gaps, never millions of missing entries.
            if id >= n + MAX_ID_GAP {
                return Err(Error::Tokenizer(format!(
                    "{}: token {text:?} has id {id}, far past the {n} entries (corrupt file?)",
                    path.display()
                )));
            }
            if id >= vocab.len() {
                vocab.resize(id + 1, String::new());
            }
            vocab[id] = text;
        }
        let mut special = vec![false; vocab.len()];
        for (id, added) in tok.get_added_tokens_decoder() {
            if let Some(s) = special.get_mut(id as usize) {
                *s = added.special;
            }
        }

        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        let id_of = |v: Option<&Value>| token_text(v).and_then(|t| tok.token_to_id(t));
        let as_id = |v: &Value| v.as_u64().filter(|&i| (i as usize) < vocab.len()).map(|i| i as u32);

        let bos = id_of(config.get("bos_token")).or_else(|| generation.get("bos_token_id").and_then(as_id));
        let gen_eos: Vec<u32> = match generation.get("eos_token_id") {
            Some(Value::Array(a)) => a.iter().filter_map(as_id).collect(),
            Some(v) => as_id(v).into_iter().collect(),
            None => Vec::new(),
        };
        let eos = id_of(config.get("eos_token")).or_else(|| gen_eos.first().copied());
        let mut eos_ids: Vec<u32> = eos.into_iter().collect();
        for id in gen_eos {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }

        let model = match tok.get_model() {
            ModelWrapper::BPE(_) => "BPE",
            ModelWrapper::WordPiece(_) => "WordPiece",
            ModelWrapper::WordLevel(_) => "WordLevel",
            ModelWrapper::Unigram(_) => "Unigram",
        };
        let style = piece_style(tok.get_decoder());
        let fim = fim_by_name(|name| tok.token_to_id(name));
        Ok(HfTokenizer {
            add_bos: config.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false),
            add_eos: config.get("add_eos_token").and_then(Value::as_bool).unwrap_or(false),
            kind: format!("hf {model}, {} tokens", vocab.len()),
            tok,
            vocab,
            special,
            bos,
            eos,
            eos_ids,
            fim,
            style,
        })
    }

    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = catch_panic(|| self.tok.encode_fast(text, add_special))
            .map_err(|e| Error::Tokenizer(format!("encode: the tokenizer failed ({e}); is tokenizer.json corrupt?")))?
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if add_special {
            if let Some(bos) = self.bos.filter(|_| self.add_bos) {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
            if let Some(eos) = self.eos.filter(|_| self.add_eos) {
                if ids.last() != Some(&eos) {
                    ids.push(eos);
                }
            }
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        // Out-of-range ids decode to nothing, and so does everything where a
        // corrupt file's decoder panics.
        let known: Vec<u32> = ids.iter().copied().filter(|&id| (id as usize) < self.vocab.len()).collect();
        catch_panic(|| self.tok.decode(&known, skip_special)).ok().and_then(std::result::Result::ok).unwrap_or_default()
    }

    /// `decode` without the `unfinished` bytes at the end. SentencePiece's
    /// byte fallback writes a run of byte tokens that is not UTF-8 as one
    /// U+FFFD a byte, whole characters of the run included, so its
    /// unfinished byte tokens are left out before decoding; the byte-level
    /// decoder writes one U+FFFD for them, which is dropped.
    pub fn decode_finished(&self, ids: &[u32], unfinished: usize) -> String {
        if unfinished == 0 {
            return self.decode(ids, false);
        }
        let byte_tokens = ids.iter().rev().take(unfinished).all(|&id| self.token_bytes(id).len() == 1);
        if matches!(self.style, PieceStyle::SentencePiece(_)) && byte_tokens && ids.len() >= unfinished {
            return self.decode(&ids[..ids.len() - unfinished], false);
        }
        let mut text = self.decode(ids, false);
        if text.ends_with(char::REPLACEMENT_CHARACTER) {
            text.pop();
        }
        text
    }

    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(text) = self.vocab.get(id as usize) else {
            return Vec::new();
        };
        if self.special[id as usize] {
            return text.as_bytes().to_vec();
        }
        match &self.style {
            PieceStyle::ByteLevel => text.chars().filter_map(byte_level::char_to_byte).collect(),
            PieceStyle::SentencePiece(space) => {
                let hex = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'));
                match hex.filter(|h| h.len() == 2).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => vec![b],
                    None => text.replace(*space, " ").into_bytes(),
                }
            }
            PieceStyle::WordPiece(prefix) => match text.strip_prefix(prefix.as_str()) {
                Some(rest) => rest.as_bytes().to_vec(),
                None => format!(" {text}").into_bytes(),
            },
            PieceStyle::Plain => text.as_bytes().to_vec(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.tok.token_to_id(s)
    }

    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.vocab.get(id as usize).map(String::as_str).filter(|s| !s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::HfTokenizer;
    use crate::test_dir::TempDir;
    use serde_json::{json, Value};

    /// A word-level tokenizer.json with `edit` applied.
    fn tokenizer_dir(tag: &str, edit: impl FnOnce(&mut Value)) -> TempDir {
        let mut tok = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hi": 1}, "unk_token": "[UNK]"}
        });
        edit(&mut tok);
        let dir = TempDir::new(tag);
        dir.file("tokenizer.json", tok.to_string().as_bytes());
        dir
    }

    #[test]
    fn corrupt_files_are_errors_not_panics_or_huge_allocations() {
        let good = tokenizer_dir("good", |_| {});
        assert_eq!(HfTokenizer::from_dir(&good.0).unwrap().encode("hi", false).unwrap(), vec![1]);

        let huge_id = tokenizer_dir("huge-id", |t| t["model"]["vocab"]["far"] = json!(u32::MAX));
        let err = HfTokenizer::from_dir(&huge_id.0).err().unwrap().to_string();
        assert!(err.contains("far past"), "{err}");

        // The tokenizers crate panics on these two; each must be one error.
        let charsmap = tokenizer_dir("charsmap", |t| {
            t["normalizer"] = json!({"type": "Precompiled", "precompiled_charsmap": "AAAA"})
        });
        let err = HfTokenizer::from_dir(&charsmap.0).err().unwrap().to_string();
        assert!(err.contains("corrupt file?"), "{err}");
        let undeclared = tokenizer_dir("undeclared", |t| {
            t["post_processor"] = json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<nope>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {}})
        });
        let tok = HfTokenizer::from_dir(&undeclared.0).unwrap();
        let err = tok.encode("hi", true).unwrap_err().to_string();
        assert!(err.contains("tokenizer failed"), "{err}");
        assert_eq!(tok.encode("hi", false).unwrap(), vec![1]);
    }
}
