//! Pre-tokenizer regexes for GGUF byte-level BPE, keyed by `tokenizer.ggml.pre`.
//!
//! The patterns and per-type flags are the ones llama.cpp uses (`llama-vocab.cpp`).
//! Each pattern of a list splits every piece the previous one produced; text
//! between matches is kept as its own piece, as llama.cpp and HF `Split`
//! (behaviour `Isolated`) both do.

use fancy_regex::Regex;
use ferrite_core::{Error, Result};

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one family of pre-tokenizer types behaves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreConfig {
    pub regexes: &'static [&'static str],
    /// A whole pre-token that is already in the vocabulary skips the merges.
    pub ignore_merges: bool,
    /// Default for `add_bos` when the GGUF has no `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// llama.cpp's `clean_spaces` in detokenization (" ." → ".", " 's" → "'s", ...).
    pub clean_spaces: bool,
    /// The type has no BOS token unless the GGUF names one.
    pub no_default_bos: bool,
}

const fn cfg(regexes: &'static [&'static str], clean_spaces: bool) -> PreConfig {
    PreConfig { regexes, ignore_merges: false, add_bos: false, clean_spaces, no_default_bos: false }
}

const DEFAULT: PreConfig = cfg(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], true);
const LLAMA3_CFG: PreConfig = PreConfig { ignore_merges: true, add_bos: true, ..cfg(&[LLAMA3], true) };

/// Looks up a pre-tokenizer type by name; the names are llama.cpp's.
pub(crate) fn lookup(pre: &str) -> Option<PreConfig> {
    Some(match pre {
        "default" => DEFAULT,
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => LLAMA3_CFG,
        "dbrx" | "smaug-bpe" => cfg(&[LLAMA3], true),
        "chatglm-bpe" | "glm4" => PreConfig { no_default_bos: true, ..cfg(&[LLAMA3], true) },
        // "gpt2" is not a llama.cpp name, but it is the obvious spelling of "gpt-2".
        "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "mellum"
        | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" => cfg(&[GPT2], true),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => cfg(&[r"\p{N}", GPT2], true),
        "smollm" | "command-r" => cfg(&[r"\p{N}", GPT2], false),
        "qwen2" | "deepseek-r1-qwen" | "hunyuan" => cfg(&[QWEN2], false),
        "stablelm2" | "megrez" => cfg(&[QWEN2], true),
        "falcon" => cfg(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"], true),
        _ => return None,
    })
}

/// The names `lookup` accepts, for error messages.
pub(crate) const SUPPORTED: &str = "default, llama3/llama-bpe, dbrx, smaug-bpe, chatglm-bpe, gpt2/gpt-2, mpt, olmo, \
     starcoder, refact, smollm, command-r, codeshell, exaone, qwen2, deepseek-r1-qwen, stablelm2, falcon, ...";

/// A compiled list of splitting regexes.
pub(crate) struct PreTokenizer {
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    pub fn new(config: &PreConfig) -> Result<PreTokenizer> {
        let regexes = config
            .regexes
            .iter()
            .map(|p| Regex::new(p).map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex {p:?}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer { regexes })
    }

    /// Splits `text` into pre-tokens (matches and the gaps between them).
    pub fn split<'t>(&self, text: &'t str) -> Result<Vec<&'t str>> {
        let mut pieces = vec![text];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece) {
                    // Only a backtracking limit can fail here, on adversarial input.
                    let m = m.map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex failed: {e}")))?;
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        Ok(pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(&lookup(pre).unwrap()).unwrap();
        p.split(text).unwrap().into_iter().map(String::from).collect()
    }

    #[test]
    fn gpt2_splits_words_and_spaces() {
        assert_eq!(split("gpt2", "Hello  world's 123"), ["Hello", " ", " world", "'s", " 123"]);
        assert_eq!(split("gpt2", "a\t\tb"), ["a", "\t", "\t", "b"]);
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(split("smollm", "x 1234"), ["x", " ", "1", "2", "3", "4"]);
    }

    #[test]
    fn llama3_groups_three_digits_and_newlines() {
        assert_eq!(split("llama-bpe", "1234567 ab\n\n cd"), ["123", "456", "7", " ab", "\n\n", " cd"]);
    }

    #[test]
    fn all_patterns_compile() {
        for name in
            ["default", "llama3", "dbrx", "glm4", "gpt-2", "starcoder", "smollm", "qwen2", "stablelm2", "falcon"]
        {
            PreTokenizer::new(&lookup(name).unwrap()).unwrap();
        }
        assert!(lookup("no-such-pre").is_none());
    }
}
