#!/usr/bin/env python3
"""Golden token ids for crates/loader/tests/tokenizer_golden.rs.

References, independent of ferrite:
  * GGUF tokenizers: llama.cpp through llama-cpp-python (vocab_only), i.e.
    llama_tokenize(add_special, parse_special=True), llama_detokenize and
    llama_token_to_piece, plus the vocab's BOS/EOS/EOG/control facts.
  * HF tokenizer.json: the `tokenizers` package, padding and truncation off.

Besides the GGUFs as shipped, a few variants (same vocabulary, other
`tokenizer.ggml.pre` / flags) are written as tensor-free GGUFs so that the
qwen2, llama-bpe, gpt-2 and default pre-tokenizers and SPM's space prefix are
checked against llama.cpp too. The fixture records each variant's edits; the
Rust test applies the same edits to the shipped file.

Usage: scripts/golden_tokenizer.py   (models from $FERRITE_HOME/models or
~/.ferrite/models; run scripts/fetch-models.sh first). Writes
tests/fixtures/tokenizer/*.json.

A larger one-off check: scripts/golden_tokenizer.py --random 3000 --seed 7 --out /tmp/tokfx
then FERRITE_TOKENIZER_FIXTURES=/tmp/tokfx cargo test -p ferrite-loader --test tokenizer_golden
"""

import argparse
import ctypes
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp
import tokenizers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
MODELS = Path(os.environ.get("FERRITE_HOME", Path.home() / ".ferrite")) / "models"

CORPUS = [
    "",
    " ",
    "  ",
    "Hello world",
    " Hello world",
    "   leading three spaces",
    "Hello, world! How are you?",
    "It's, we're, I'll, they've, don't, she'd, I'm. IT'S WE'RE I'LL",
    "Café naïve façade résumé Über straße ÀÉÎÕÜ",
    "日本語のテキストです。中文测试，标点！",
    "한국어 텍스트와 Ελληνικά και русский текст",
    "Emoji: 😀👍🏽🇩🇪 ❤️ 🤷‍♂️",
    "def foo(x):\n    return x * 2\n\n\nclass Bar:\n\tpass\n",
    "a    b\t\tc\n\n\nd   \n  e",
    "trailing spaces   ",
    "\n\nleading newlines",
    "numbers 1234567 3.14159 -42 1,000,000 0.5e-10",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<bos>hi<eos>",
    "<|im_start|><|im_start|>",
    "<|im_start unfinished",
    "x\r\ny\r\n",
    "tab\tseparated\tvalues",
    "Ω≈ç√∫˜µ≤≥÷",
    "\u00a0nbsp and\u3000ideographic space",
    "zero\u200bwidth joiner",
    "mixed 中文 and English123",
    "URL: https://example.com/path?q=1&r=2#frag email@example.com",
    "<html><body><p>Hi</p></body></html>",
    "   \n   ",
    "\t",
    "\n",
    "a\n",
    "e\u0301 combining accent",
    "Ġ▁ literal markers",
    "<0x0A> literal byte token text",
    "<unused5> and [multimodal]",
    "'s'''t",
    "100%!!!???...",
    "ｆｕｌｌｗｉｄｔｈ",
    "\ufeffBOM start",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    "null\x00byte and \x07bell",
    "The quick brown fox jumps over the lazy dog. " * 3
    + "In 1492, Columbus sailed the ocean blue; it's said he'd never've guessed "
    "what we'd build.\n\n    Indented   paragraph\twith\ttabs, and   runs   of   spaces.\n",
]

# Pieces for a deterministic random corpus that mixes the hard cases.
PIECES = [
    "a", "b", "Z", "word", " the", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n",
    "é", "ü", "ñ", "ß", "Ω", "日", "本", "語", "😀", "👍🏽", "1", "2", "9", "0",
    "'s", "'", "\"", ".", ",", "!", "?", "-", "_", "<", ">", "|", "/",
    "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<bos>",
    "\u00a0", "\u3000", "\u200b", "Ġ", "▁", "<0x0A>", "<unused12>", "[multimodal]",
]


# Code point ranges for random text: scripts, marks, odd spaces, digits of
# other scripts, symbols, private use, unassigned and non-characters.
RANGES = [
    (0x20, 0x7E), (0x00, 0x1F), (0x80, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
    (0x400, 0x4FF), (0x600, 0x6FF), (0x660, 0x669), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
    (0x2000, 0x206F), (0x2070, 0x218F), (0x2460, 0x24FF), (0x3000, 0x30FF), (0x4E00, 0x4E80),
    (0xAC00, 0xAC80), (0xE000, 0xE010), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF),
    (0x1F900, 0x1F9FF), (0x1D400, 0x1D7FF), (0x10000, 0x1007F), (0x85, 0x85), (0x1680, 0x1680),
    (0x2028, 0x2029), (0x378, 0x379), (0x10FFF0, 0x10FFFD),
]


def random_corpus(n, seed):
    rng = random.Random(seed)

    def one():
        parts = []
        for _ in range(rng.randint(1, 24)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(PIECES))
            elif r < 0.55:
                parts.append(" " * rng.randint(1, 6))
            elif r < 0.6:
                parts.append(rng.choice(["'s", "'T", "'Re", "'ll", "'D", "'m", "'ve"]))
            else:
                lo, hi = rng.choice(RANGES)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4))))
        return "".join(parts)

    return [one() for _ in range(n)]


def write_variant(base, path, set_keys, remove_keys):
    """Copies `base`'s metadata (no tensors) with the given edits."""
    r = gguf.GGUFReader(str(base))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(path), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in remove_keys:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if key in set_keys:
            w.add_key_value(key, set_keys[key], vtype, sub)
        else:
            w.add_key_value(key, field.contents(), vtype, sub)
    for key, value in set_keys.items():
        if key not in r.fields:
            vt = gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.STRING
            w.add_key_value(key, value, vt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def detokenize(vocab, ids, remove_special, unparse_special):
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n >= 0:
            return buf.raw[:n]
        size = -n + 16


def piece(vocab, token):
    buf = ctypes.create_string_buffer(1024)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, 1024, 0, True)
    assert n >= 0
    return buf.raw[:n]


def ranges(ids):
    out = []
    for i in ids:
        if out and out[-1][1] + 1 == i:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def gguf_golden(name, path, corpus, set_keys=None, remove_keys=()):
    set_keys = set_keys or {}
    with tempfile.TemporaryDirectory() as tmp:
        model_path = path
        if set_keys or remove_keys:
            model_path = Path(tmp) / "variant.gguf"
            write_variant(path, model_path, set_keys, set(remove_keys))
        llm = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
        vocab = llm._model.vocab
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        cases = []
        for text in corpus:
            data = text.encode()
            ids = llm.tokenize(data, add_bos=True, special=True)
            plain = llm.tokenize(data, add_bos=False, special=True)
            cases.append({
                "text": text,
                "ids": ids,
                "ids_plain": plain,
                "decoded_hex": detokenize(vocab, ids, False, True).hex(),
                "decoded_skip_hex": detokenize(vocab, ids, True, False).hex(),
            })
        sample = sorted(set(range(min(n_vocab, 512))) | set(range(0, n_vocab, 997)) | {n_vocab - 1})
        golden = {
            "model": path.name,
            "set": set_keys,
            "remove": list(remove_keys),
            "n_vocab": n_vocab,
            "bos": llama_cpp.llama_vocab_bos(vocab),
            "eos": llama_cpp.llama_vocab_eos(vocab),
            "eog": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
            "control_ranges": ranges([i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)]),
            "pieces_hex": {str(i): piece(vocab, i).hex() for i in sample},
            "cases": cases,
        }
        del llm
    dump(name, golden)


def dump(name, golden):
    """One case per line: small diffs when the goldens change."""
    cases = golden.pop("cases")
    compact = dict(ensure_ascii=False, separators=(",", ":"))
    head = json.dumps(golden, **compact)
    body = ",\n".join(json.dumps(c, **compact) for c in cases)
    out = OUT / f"{name}.json"
    out.write_text(head[:-1] + ',\n"cases":[\n' + body + "\n]}\n")
    print(f"wrote {out} ({len(cases)} cases)")


def hf_golden(name, dir_path, corpus):
    tok = tokenizers.Tokenizer.from_file(str(dir_path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    cases = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=True).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_plain": tok.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        })
    dump(name, {"model": dir_path.name, "n_vocab": tok.get_vocab_size(with_added_tokens=True), "cases": cases})


def main():
    global OUT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random", type=int, default=60, help="random strings added to the corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", type=Path, default=OUT, help="fixture directory")
    args = ap.parse_args()
    OUT = args.out
    smollm = MODELS / "smollm2.gguf"
    gemma = MODELS / "gemma3-270m.gguf"
    minilm = MODELS / "all-minilm-l6-v2"
    for p in (smollm, gemma, minilm):
        if not p.exists():
            sys.exit(f"missing {p}: run scripts/fetch-models.sh first")
    OUT.mkdir(parents=True, exist_ok=True)
    corpus = CORPUS + random_corpus(args.random, args.seed)

    gguf_golden("smollm2", smollm, corpus)
    gguf_golden("smollm2-qwen2", smollm, corpus, {"tokenizer.ggml.pre": "qwen2"})
    # No add_bos_token key: llama3-style pre types add BOS by default.
    gguf_golden("smollm2-llama-bpe", smollm, corpus, {"tokenizer.ggml.pre": "llama-bpe"},
                ["tokenizer.ggml.add_bos_token"])
    gguf_golden("smollm2-gpt2", smollm, corpus, {"tokenizer.ggml.pre": "gpt-2"})
    gguf_golden("smollm2-default", smollm, corpus, {"tokenizer.ggml.pre": "default"})
    gguf_golden("gemma3", gemma, corpus)
    # Llama-2-style SentencePiece: a space prefix at the start and after each special token.
    gguf_golden("gemma3-space-prefix", gemma, corpus, {"tokenizer.ggml.add_space_prefix": True})
    hf_golden("minilm", minilm, corpus)


if __name__ == "__main__":
    main()
