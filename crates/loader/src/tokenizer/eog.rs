//! Which ids end generation, following llama.cpp: eos, eot, eom, the FIM
//! pad/repo/separator tokens, and every token with a known end-of-turn name
//! (llama.cpp decides much of this by token text; issue ggml-org/llama.cpp#9606).
//! Tokens recognised by name are marked control, as llama.cpp does. Also the
//! fill-in-the-middle tokens, found the same way.

use std::collections::BTreeSet;

use super::gguf_vocab::{attr, token_id};
use super::vocab::Vocab;
use super::Fim;
use crate::gguf::GgufFile;

/// Names llama.cpp treats as end of generation whatever the metadata says.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
];
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_NAMES: &[&str] =
    &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"];
const FIM_SUF_NAMES: &[&str] =
    &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"];
const FIM_MID_NAMES: &[&str] =
    &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
/// What else ends an infill of an HF tokenizer (which has no end-of-turn
/// metadata): StarCoder's file separator (not in llama.cpp's separator
/// names, so not for GGUF files), end-of-turn names (Code Llama's HF
/// tokenizer spells its with "▁").
const FIM_END_NAMES: &[&str] = &["<file_sep>", "<EOT>", "▁<EOT>", "<|endoftext|>"];

/// A vocabulary's fill-in-the-middle tokens by their names (HF tokenizers,
/// which have no metadata ids): `id` looks a name up.
pub(crate) fn fim_by_name(id: impl Fn(&str) -> Option<u32>) -> Option<Fim> {
    let first = |names: &[&str]| names.iter().find_map(|n| id(n));
    let mut ends: Vec<u32> = [FIM_PAD_NAMES, FIM_REP_NAMES, FIM_SEP_NAMES].iter().filter_map(|n| first(n)).collect();
    ends.extend(FIM_END_NAMES.iter().filter_map(|n| id(n)));
    Some(Fim { prefix: first(FIM_PRE_NAMES)?, suffix: first(FIM_SUF_NAMES)?, middle: first(FIM_MID_NAMES)?, ends })
}

/// The end-of-generation ids, eos first and the rest ascending, and the
/// fill-in-the-middle tokens (metadata ids, else names); updates `attrs`
/// where llama.cpp re-flags tokens.
pub(crate) fn end_of_generation(
    gguf: &GgufFile,
    vocab: &Vocab,
    attrs: &mut [u8],
    eos: Option<u32>,
) -> (Vec<u32>, Option<Fim>) {
    let n = attrs.len();
    let by_name = |names: &[&str], attrs: &mut [u8]| -> Option<u32> {
        let id = names.iter().find_map(|name| vocab.get(name))?;
        attrs[id as usize] |= attr::CONTROL;
        Some(id)
    };
    let special = |key: &str, names: &[&str], attrs: &mut [u8]| -> Option<u32> {
        token_id(gguf, key, n).or_else(|| by_name(names, attrs))
    };
    let eot = special("tokenizer.ggml.eot_token_id", EOT_NAMES, attrs);
    let eom = special("tokenizer.ggml.eom_token_id", &["<|eom_id|>"], attrs);
    let fim_pre = special("tokenizer.ggml.fim_pre_token_id", FIM_PRE_NAMES, attrs);
    let fim_suf = special("tokenizer.ggml.fim_suf_token_id", FIM_SUF_NAMES, attrs);
    let fim_mid = special("tokenizer.ggml.fim_mid_token_id", FIM_MID_NAMES, attrs);
    let fim_pad = special("tokenizer.ggml.fim_pad_token_id", FIM_PAD_NAMES, attrs);
    let fim_rep = special("tokenizer.ggml.fim_rep_token_id", FIM_REP_NAMES, attrs);
    let fim_sep = special("tokenizer.ggml.fim_sep_token_id", FIM_SEP_NAMES, attrs);
    let fim = match (fim_pre, fim_suf, fim_mid) {
        (Some(prefix), Some(suffix), Some(middle)) => {
            let ends = [fim_pad, fim_rep, fim_sep, eot].into_iter().flatten().collect();
            Some(Fim { prefix, suffix, middle, ends })
        }
        _ => None,
    };

    let mut eog: BTreeSet<u32> = [fim_pad, fim_rep, fim_sep, eos, eot, eom].into_iter().flatten().collect();
    for name in EOG_NAMES {
        if let Some(id) = vocab.get(name) {
            eog.insert(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    // gpt-oss style vocabularies: "<|end|>" ends a message, not the generation.
    let has = |eog: &BTreeSet<u32>, name: &str| vocab.get(name).is_some_and(|id| eog.contains(&id));
    if let Some(end) = vocab.get("<|end|>") {
        let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
        if eog.contains(&end) && call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    // Gemma 4 style: "</s>" is ordinary text when "<|tool_response>" exists.
    if let Some(s) = vocab.get("</s>") {
        if eog.contains(&s) && has(&eog, "<|tool_response>") {
            eog.remove(&s);
            attrs[s as usize] = attr::NORMAL;
        }
    }
    let mut out: Vec<u32> = eos.into_iter().collect();
    out.extend(eog.into_iter().filter(|&id| Some(id) != eos));
    (out, fim)
}
