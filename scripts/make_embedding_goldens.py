#!/usr/bin/env python3
"""Reference data for ferrite's sentence-embedding support (BERT and ModernBERT encoders).

Writes, under tests/fixtures/embed/ (or --out):

  minilm.json
      all-MiniLM-L6-v2 (~/.ferrite/models/all-minilm-l6-v2, or --minilm DIR) run through
      sentence-transformers on CPU: for 17 varied inputs, the token ids it used (after
      truncation) and the normalized sentence embedding (384 floats), twice:
      cases.default (max_seq_length 256, as sentence_bert_config.json says) and
      cases.max512 (model.max_seq_length = 512). Items of cases.default listed in
      MEAN_POOLED_ITEMS also carry "mean_pooled": the un-normalized mean pooling.

  modernbert-tiny-a/, modernbert-tiny-b/, bert-tiny-cls/
      Tiny random checkpoints in Hugging Face + sentence-transformers layout:
      config.json (as save_pretrained wrote it), model.safetensors (float32),
      tokenizer.json (+ tokenizer_config.json), modules.json, 1_Pooling/config.json,
      sentence_bert_config.json. The ModernBERT dirs also hold config.v4.json: the same
      model described the older way (global_rope_theta, local_rope_theta, no layer_types)
      that most ModernBERT checkpoints use; the script checks that it builds the same
      model.

  modernbert.json, bert-tiny.json
      For each tiny checkpoint: ~8 inputs with their ids (specials included), the
      last_hidden_state of every token and the pooled embedding (raw and L2-normalized),
      each input run alone (no padding). Also one padded batch of all inputs with an
      attention mask, asserted equal to the single runs, and an independent numpy
      forward pass (the one MODERNBERT_NOTES.md describes) asserted equal to
      transformers.

Floats are rounded to 7 significant digits. Everything runs on CPU in float32 with
attn_implementation="eager" (float64 for the numpy cross-check). The tiny tokenizers are
built from tests/fixtures/prose/english.txt plus the sentences in EXTRA_CORPUS (byte-level
BPE trained with the `tokenizers` package; WordPiece vocabulary from word counts, see
wordpiece_vocab); seeds are fixed, so a rerun reproduces the files.

The notes the Rust implementation follows are tests/fixtures/embed/MODERNBERT_NOTES.md
(written by hand from the installed transformers source; this script checks the facts it
states).

Rerun (about a minute on 2 cores; --skip-minilm: only the tiny checkpoints, 10 s):
    python3 -m venv /work/embref
    /work/embref/bin/pip install -r scripts/requirements-bench-embed.txt
    /work/embref/bin/python scripts/make_embedding_goldens.py [--skip-minilm]
Made with torch 2.15.0, transformers 5.24.0, sentence-transformers 6.2.0,
tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import safetensors
import scipy.special
import sentence_transformers
import tokenizers
import torch
import transformers
from safetensors.numpy import load_file
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoModel, BertConfig, BertModel, ModernBertConfig, ModernBertModel

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PROSE = os.path.join(ROOT, "tests", "fixtures", "prose", "english.txt")

SEED = 20240611
PERTURB_STD = 0.1  # added to every weight matrix / embedding after transformers' init

# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


def prose_words(n_words):
    """The first n_words words of the project's prose essay (title line skipped)."""
    with open(PROSE, encoding="utf-8") as f:
        body = f.read().split("\n", 1)[1]
    return " ".join(body.split()[:n_words])


MINILM_INPUTS = [
    "hi",
    "Embeddings",
    "",
    "The quick brown fox jumps over the lazy dog.",
    "A lighthouse keeper writes the weather into a logbook every evening before supper.",
    "Wait... what?! No -- really?? (Yes: really.) #wow @home $5.99 & 100% [done] {ok} ~/x_y",
    "Café crème, naïve façade, jalapeño, Ångström and the Øresund bridge.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "I love pizza 🍕🍕 and rockets 🚀! Family: 👩\u200d👩\u200d👧 ok 👍🏽",
    "Привет, как дела? Всё хорошо, спасибо.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n  and   multiple    spaces\u00a0nbsp\u3000ideographic",
    "ALL CAPS SHOUTING and MiXeD cAsE WoRdS",
    "x = f(a, b) + g[3]; // C-like code: a <= b && c != d -> e",
    prose_words(260),  # > 256 tokens (truncated in `default`, not in `max512`)
    prose_words(560),  # > 512 tokens (truncated in both)
]
MEAN_POOLED_ITEMS = [0, 3, 6, 15]  # items of cases.default that also get "mean_pooled"

MODERNBERT_INPUTS = [
    "a",  # [CLS] a [SEP]: 3 tokens
    "The river keeper lit the lamp.",
    "Wait... what?! (Yes: really.) #tag @home 100%",
    "Café naïve 東京 🚀 Привет",
    "  spaces   and\ttabs\nnewline  ",
    prose_words(15),   # 36 tokens: longer than both local windows (16 and 8)
    prose_words(30),   # 64 tokens
    prose_words(58),   # 116 tokens (max_position_embeddings is 128)
]

BERT_INPUTS = [
    "a",
    "The river keeper lit the lamp.",
    "Wait... what?! (Yes: really.) #tag @home 100%",
    "Café NAÏVE façade 東京 🚀",
    "  spaces   and\ttabs\nnewline  ",
    "Unseen words: zygomorphic quixotry",
    prose_words(12),  # 31 tokens
    prose_words(25),  # 48 tokens (max_position_embeddings is 64)
]

EXTRA_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A keeper lit the lamp at dusk and wrote the weather in the log.",
    "Numbers like 1, 2, 3, 10, 42, 100 and 2024 appear in ledgers and tables.",
    "Questions? Answers! Lists: one; two; three. Quotes: \"yes\" and 'no'.",
    "Email me at keeper@example.org or see https://example.org/lights for more.",
    "Spaces, tabs\tand newlines\nare whitespace; CAPITALS and lowercase are both here.",
]


def training_corpus():
    with open(PROSE, encoding="utf-8") as f:
        lines = [l.strip() for l in f if l.strip()]
    return lines + EXTRA_CORPUS


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def r7(x):
    """Round floats (nested lists / arrays) to 7 significant digits for JSON."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        return float(f"{float(a):.7g}")
    return [r7(v) for v in a] if a.ndim > 1 else [float(f"{v:.7g}") for v in a.tolist()]


def l2n(v):
    v = np.asarray(v, dtype=np.float64)
    return v / max(np.linalg.norm(v), 1e-12)


def write_json(path, obj, indent=None):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")


def versions():
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


def perturb(model, seed):
    """transformers' init gives std-0.02 weights and all-one norms, so every layer is
    nearly an identity. Make each parameter matter: norm weights ~ 1 + N(0, 0.1^2),
    biases ~ N(0, 0.1^2), other weights += N(0, PERTURB_STD^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            is_norm = "norm" in name.lower()
            if is_norm and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            else:
                p.add_(PERTURB_STD * noise)


def dir_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# --------------------------------------------------------------------------------------
# 1. all-MiniLM-L6-v2 through sentence-transformers
# --------------------------------------------------------------------------------------


def make_minilm(model_dir, out_dir):
    st = SentenceTransformer(model_dir, device="cpu")
    st.eval()
    assert st.max_seq_length == 256, st.max_seq_length
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling", "Normalize"], list(st)
    # Same Transformer + Pooling without Normalize: un-normalized mean pooling.
    st_raw = SentenceTransformer(modules=[st[0], st[1]], device="cpu")
    hf = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    # The raw tokenizers package, with the tokenizer.json's built-in padding/truncation
    # (both fixed at 128) switched off: the reference must not depend on them.
    raw_tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    assert raw_tok.padding is not None and raw_tok.truncation is not None  # the file has them
    raw_tok.no_padding()
    raw_tok.no_truncation()
    cls_id, sep_id = raw_tok.token_to_id("[CLS]"), raw_tok.token_to_id("[SEP]")

    cases = {}
    for case, max_len in (("default", 256), ("max512", 512)):
        st.max_seq_length = max_len
        items = []
        for i, text in enumerate(MINILM_INPUTS):
            feats = st.preprocess([text])
            ids = feats["input_ids"][0].tolist()
            assert feats["attention_mask"].sum().item() == len(ids)  # no padding
            # Independent check of truncation: tokenize untruncated, keep the first
            # max_len - 2 content tokens, then [CLS] ... [SEP].
            full = raw_tok.encode(text).ids
            assert full[0] == cls_id and full[-1] == sep_id
            expect = full if len(full) <= max_len else full[: max_len - 1] + [sep_id]
            assert ids == expect, (case, i, len(ids), len(expect))
            emb = st.encode([text], batch_size=1, convert_to_numpy=True)[0].astype(np.float64)
            raw = st_raw.encode([text], batch_size=1, convert_to_numpy=True)[0].astype(np.float64)
            # Manual mean pooling on transformers' BertModel must agree.
            with torch.no_grad():
                t = torch.tensor([ids])
                hs = hf(input_ids=t, attention_mask=torch.ones_like(t),
                        token_type_ids=torch.zeros_like(t)).last_hidden_state[0].double().numpy()
            manual = hs.mean(axis=0)
            assert np.abs(manual - raw).max() < 1e-5, np.abs(manual - raw).max()
            assert np.abs(l2n(raw) - emb).max() < 1e-6
            assert abs(np.linalg.norm(emb) - 1.0) < 1e-5
            item = {"text": text, "n_tokens": len(ids), "truncated": len(full) > max_len,
                    "ids": ids, "embedding": r7(emb)}
            if case == "default" and i in MEAN_POOLED_ITEMS:
                item["mean_pooled"] = r7(raw)
            items.append(item)
        cases[case] = {"max_length": max_len, "items": items}
        print(f"minilm {case}: token counts {[it['n_tokens'] for it in items]}")
    st.max_seq_length = 256

    assert cases["default"]["items"][15]["truncated"] and not cases["max512"]["items"][15]["truncated"]
    assert cases["max512"]["items"][16]["truncated"]
    doc = {
        "model": "all-MiniLM-L6-v2",
        "model_dir": "~/.ferrite/models/all-minilm-l6-v2",
        "reference": "sentence-transformers SentenceTransformer(dir, device='cpu'), encode one "
                     "text at a time (batch_size=1, no padding); modules Transformer -> Pooling "
                     "(mean) -> Normalize",
        "tokenization": "tokenizer.json with its built-in padding/truncation (Fixed 128) NOT "
                        "applied: ids = [CLS] + content + [SEP], content truncated to "
                        "max_length - 2 tokens",
        "pooling": "mean over all tokens (attention mask all ones), then L2 normalize",
        "mean_pooled": f"items {MEAN_POOLED_ITEMS} of cases.default carry 'mean_pooled', the "
                       "un-normalized mean pooling (Transformer -> Pooling only)",
        "rounding": "7 significant digits",
        "versions": versions(),
        "cases": cases,
    }
    write_json(os.path.join(out_dir, "minilm.json"), doc)


# --------------------------------------------------------------------------------------
# 2. Tiny tokenizers
# --------------------------------------------------------------------------------------

SPECIALS_MB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
SPECIALS_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_bytelevel_bpe(vocab_size):
    """A byte-level BPE tokenizer shaped like ModernBERT's (no normalizer, ByteLevel
    pre-tokenizer without prefix space, [CLS] $A [SEP] template)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS_MB,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.no_padding()
    tok.no_truncation()
    return tok


def wordpiece_vocab(vocab_size, normalizer, pre_tokenizer):
    """A deterministic WordPiece vocabulary from corpus counts (the tokenizers package's
    WordPieceTrainer numbers the '##' pieces in hash order, so its output changes from run
    to run): the specials, every character seen and its '##' form, the 40 most frequent
    word endings of 2-4 characters as '##' pieces, then whole words by frequency."""
    counts = {}
    for line in training_corpus():
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
            counts[word] = counts.get(word, 0) + 1
    chars = sorted({c for w in counts for c in w})
    vocab = SPECIALS_BERT + chars + ["##" + c for c in chars]
    endings = {}
    for w, n in counts.items():
        for k in (2, 3, 4):
            if len(w) > k + 1:
                endings["##" + w[-k:]] = endings.get("##" + w[-k:], 0) + n
    vocab += [e for e, _ in sorted(endings.items(), key=lambda kv: (-kv[1], kv[0]))[:40]]
    seen = set(vocab)
    for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    return {t: i for i, t in enumerate(vocab)}


def train_wordpiece(vocab_size):
    """A lowercasing WordPiece tokenizer shaped like bert-base-uncased's."""
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                            strip_accents=None, lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    vocab = wordpiece_vocab(vocab_size, normalizer, pre_tokenizer)
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.no_padding()
    tok.no_truncation()
    return tok


def special_ids(tok):
    return {name: tok.token_to_id(f"[{name.upper()}]") for name in ("pad", "unk", "cls", "sep", "mask")}


def save_tokenizer(tok, d, max_len):
    tok.save(os.path.join(d, "tokenizer.json"))
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "unk_token": "[UNK]", "mask_token": "[MASK]", "clean_up_tokenization_spaces": False,
    }, indent=2)


POOLING_KEYS = ["cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                "weightedmean_tokens", "lasttoken"]


def save_st_files(d, hidden, pooling, normalize, max_seq_length, legacy_pooling_config):
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        mods.append({"idx": 2, "name": "2", "path": "2_Normalize",
                     "type": "sentence_transformers.models.Normalize"})
    write_json(os.path.join(d, "modules.json"), mods, indent=2)
    os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
    if legacy_pooling_config:  # the form most published checkpoints have
        key = {"mean": "mean_tokens", "cls": "cls_token"}[pooling]
        cfg = {"word_embedding_dimension": hidden}
        cfg.update({f"pooling_mode_{k}": k == key for k in POOLING_KEYS})
        cfg["include_prompt"] = True
    else:  # the form sentence-transformers 6 writes
        cfg = {"embedding_dimension": hidden, "pooling_mode": pooling, "include_prompt": True}
    write_json(os.path.join(d, "1_Pooling", "config.json"), cfg, indent=2)
    write_json(os.path.join(d, "sentence_bert_config.json"),
               {"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2)


# --------------------------------------------------------------------------------------
# 3. Independent numpy forward passes (float64), following MODERNBERT_NOTES.md
# --------------------------------------------------------------------------------------


def np_layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * w
    return y + b if b is not None else y


def np_gelu(x):  # exact (erf) GELU
    return 0.5 * x * (1.0 + scipy.special.erf(x / math.sqrt(2.0)))


def np_softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def np_rope(x, theta):
    """x: [heads, L, d]; half-split (rotate_half) layout, positions 0..L-1."""
    d, L = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(L, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def np_modernbert(w, cfg, ids, window_rule="le"):
    """ModernBERT forward for one unpadded sequence. window_rule 'le': a local-layer query
    i sees key j iff |i - j| <= local_attention // 2 (what transformers does); 'lt' is the
    strict variant, used only to show the rule matters."""
    g = lambda n: w.get(n)
    eps, H, nh = cfg["norm_eps"], cfg["hidden_size"], cfg["num_attention_heads"]
    d, inter, half = H // nh, cfg["intermediate_size"], cfg["local_attention"] // 2
    n_every = cfg["global_attn_every_n_layers"]
    L = len(ids)
    x = np_layernorm(w["embeddings.tok_embeddings.weight"][ids], w["embeddings.norm.weight"],
                     g("embeddings.norm.bias"), eps)
    dist = np.abs(np.arange(L)[:, None] - np.arange(L)[None, :])
    for l in range(cfg["num_hidden_layers"]):
        p = f"layers.{l}."
        a = x if l == 0 else np_layernorm(x, w[p + "attn_norm.weight"], g(p + "attn_norm.bias"), eps)
        qkv = a @ w[p + "attn.Wqkv.weight"].T
        if g(p + "attn.Wqkv.bias") is not None:
            qkv = qkv + w[p + "attn.Wqkv.bias"]
        q, k, v = (qkv[:, i * H:(i + 1) * H].reshape(L, nh, d).transpose(1, 0, 2) for i in range(3))
        is_global = l % n_every == 0
        theta = cfg["global_rope_theta"] if is_global else cfg["local_rope_theta"]
        q, k = np_rope(q, theta), np_rope(k, theta)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        if not is_global:
            allowed = dist <= half if window_rule == "le" else dist < half
            s = np.where(allowed[None], s, -np.inf)
        o = (np_softmax(s) @ v).transpose(1, 0, 2).reshape(L, H)
        o = o @ w[p + "attn.Wo.weight"].T
        if g(p + "attn.Wo.bias") is not None:
            o = o + w[p + "attn.Wo.bias"]
        x = x + o
        m = np_layernorm(x, w[p + "mlp_norm.weight"], g(p + "mlp_norm.bias"), eps)
        u = m @ w[p + "mlp.Wi.weight"].T
        if g(p + "mlp.Wi.bias") is not None:
            u = u + w[p + "mlp.Wi.bias"]
        inp, gate = u[:, :inter], u[:, inter:]
        y = (np_gelu(inp) * gate) @ w[p + "mlp.Wo.weight"].T
        if g(p + "mlp.Wo.bias") is not None:
            y = y + w[p + "mlp.Wo.bias"]
        x = x + y
    return np_layernorm(x, w["final_norm.weight"], g("final_norm.bias"), eps)


def np_bert(w, cfg, ids):
    """BERT (post-LayerNorm) forward for one unpadded sequence, token_type_ids all 0."""
    eps, H, nh = cfg["layer_norm_eps"], cfg["hidden_size"], cfg["num_attention_heads"]
    d, L = H // nh, len(ids)
    lin = lambda x, n: x @ w[n + ".weight"].T + w[n + ".bias"]
    e = "embeddings."
    x = (w[e + "word_embeddings.weight"][ids] + w[e + "token_type_embeddings.weight"][0]
         + w[e + "position_embeddings.weight"][:L])
    x = np_layernorm(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"], eps)
    for l in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{l}."
        q, k, v = (lin(x, p + "attention.self." + n).reshape(L, nh, d).transpose(1, 0, 2)
                   for n in ("query", "key", "value"))
        o = (np_softmax(q @ k.transpose(0, 2, 1) / math.sqrt(d)) @ v).transpose(1, 0, 2).reshape(L, H)
        x = np_layernorm(lin(o, p + "attention.output.dense") + x,
                         w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"], eps)
        h = np_gelu(lin(x, p + "intermediate.dense"))
        x = np_layernorm(lin(h, p + "output.dense") + x, w[p + "output.LayerNorm.weight"],
                         w[p + "output.LayerNorm.bias"], eps)
    return x


# --------------------------------------------------------------------------------------
# 4. Tiny checkpoints and their references
# --------------------------------------------------------------------------------------

MODERNBERT_VARIANTS = {
    # name: (config kwargs, pooling, legacy pooling config?, notes)
    "modernbert-tiny-a": (dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
        local_attention=16, global_attn_every_n_layers=3, global_rope_theta=160000.0,
        local_rope_theta=10000.0, norm_eps=1e-5, norm_bias=False, attention_bias=False,
        mlp_bias=False), "mean", True,
        "like the published ModernBERT checkpoints: no biases anywhere; layers 0 global, 1-2 "
        "local (window 16: |i-j| <= 8)"),
    "modernbert-tiny-b": (dict(
        hidden_size=96, num_hidden_layers=4, num_attention_heads=6, intermediate_size=128,
        local_attention=8, global_attn_every_n_layers=2, global_rope_theta=50000.0,
        local_rope_theta=500.0, norm_eps=1e-6, norm_bias=True, attention_bias=True,
        mlp_bias=True), "cls", False,
        "every bias flag on (norm_bias, attention_bias, mlp_bias) and norm_eps 1e-6 so a "
        "loader that ignores them fails; layers 0, 2 global, 1, 3 local (window 8: |i-j| <= 4); "
        "1_Pooling/config.json in the sentence-transformers 6 form"),
}
MB_VOCAB = 600
MB_MAX_POS = 128


def legacy_modernbert_config(cfg_json, kw):
    """The pre-layer_types description of the same model (what most hub configs hold)."""
    c = {k: v for k, v in cfg_json.items()
         if k not in ("layer_types", "rope_parameters", "dtype", "transformers_version")}
    c["global_rope_theta"] = kw["global_rope_theta"]
    c["local_rope_theta"] = kw["local_rope_theta"]
    c["global_attn_every_n_layers"] = kw["global_attn_every_n_layers"]
    c["torch_dtype"] = "float32"
    return c


def run_single(model, ids, kind):
    t = torch.tensor([ids])
    kw = {"token_type_ids": torch.zeros_like(t)} if kind == "bert" else {}
    with torch.no_grad():
        return model(input_ids=t, attention_mask=torch.ones_like(t), **kw).last_hidden_state[0].double().numpy()


def pool(hs, mode):
    return hs.mean(axis=0) if mode == "mean" else hs[0]


def check_batched(model, all_ids, pad_id, singles, mode, kind):
    """One right-padded batch with an attention mask must reproduce the single runs."""
    n = max(len(x) for x in all_ids)
    ids = torch.tensor([x + [pad_id] * (n - len(x)) for x in all_ids])
    mask = torch.tensor([[1] * len(x) + [0] * (n - len(x)) for x in all_ids])
    kw = {"token_type_ids": torch.zeros_like(ids)} if kind == "bert" else {}
    with torch.no_grad():
        hs = model(input_ids=ids, attention_mask=mask, **kw).last_hidden_state.double().numpy()
    dh = dp = 0.0
    for b, x in enumerate(all_ids):
        real = hs[b, : len(x)]
        dh = max(dh, np.abs(real - singles[b]).max())
        m = mask[b].double().numpy()[:, None]
        pooled = (hs[b] * m).sum(0) / m.sum() if mode == "mean" else hs[b, 0]
        dp = max(dp, np.abs(pooled - pool(singles[b], mode)).max())
    assert dh < 2e-5 and dp < 2e-5, (dh, dp)
    return {"padded_length": n, "pad_id": pad_id, "padding_side": "right",
            "n_sequences": len(all_ids), "max_abs_diff_hidden": float(f"{dh:.3g}"),
            "max_abs_diff_pooled": float(f"{dp:.3g}")}


def check_sentence_transformers(d, texts, items, mode):
    """Load the written dir with sentence-transformers: same ids, same pooled vectors."""
    st = SentenceTransformer(d, device="cpu")
    for text, it in zip(texts, items):
        ids = st.preprocess([text])["input_ids"][0].tolist()
        assert ids == it["ids"], (text, ids, it["ids"])
    emb = st.encode(texts, batch_size=1, convert_to_numpy=True).astype(np.float64)
    want = np.array([it["pooled_normalized" if len(st) == 3 else "pooled"] for it in items])
    diff = np.abs(emb - want).max()
    assert diff < 1e-4, diff
    return float(f"{diff:.3g}")


def references(model, tok, texts, mode, kind, numpy_fn):
    items, singles, np_diff = [], [], 0.0
    for text in texts:
        ids = tok.encode(text).ids
        hs = run_single(model, ids, kind)
        ref = numpy_fn(ids)
        np_diff = max(np_diff, np.abs(ref - hs).max())
        singles.append(hs)
        p = pool(hs, mode)
        items.append({"text": text, "n_tokens": len(ids), "ids": ids,
                      "last_hidden_state": r7(hs), "pooled": r7(p), "pooled_normalized": r7(l2n(p))})
    assert np_diff < 1e-4, np_diff
    return items, singles, float(f"{np_diff:.3g}")


def tensor_shapes(path):
    return {k: list(v.shape) for k, v in sorted(load_file(path).items())}


def make_modernbert(out_dir):
    doc = {"generator": "scripts/make_embedding_goldens.py", "versions": versions(),
           "dtype": "float32", "attn_implementation": "eager", "device": "cpu",
           "rounding": "7 significant digits", "seed": SEED, "checkpoints": {}}
    tok = train_bytelevel_bpe(MB_VOCAB)
    vocab = tok.get_vocab_size()
    sp = special_ids(tok)
    for vi, (name, (kw, mode, legacy_pool, notes)) in enumerate(MODERNBERT_VARIANTS.items()):
        d = os.path.join(out_dir, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        torch.manual_seed(SEED + vi)
        cfg = ModernBertConfig(vocab_size=vocab, max_position_embeddings=MB_MAX_POS,
                               hidden_activation="gelu", pad_token_id=sp["pad"],
                               bos_token_id=sp["cls"], eos_token_id=sp["sep"],
                               cls_token_id=sp["cls"], sep_token_id=sp["sep"],
                               attn_implementation="eager", **kw)
        n_every = kw["global_attn_every_n_layers"]
        assert cfg.layer_types == ["full_attention" if i % n_every == 0 else "sliding_attention"
                                   for i in range(cfg.num_hidden_layers)]
        assert cfg.sliding_window == kw["local_attention"] // 2
        model = ModernBertModel(cfg)
        perturb(model, SEED + 100 + vi)
        model.eval()
        model.save_pretrained(d, safe_serialization=True)
        save_tokenizer(tok, d, MB_MAX_POS)
        save_st_files(d, kw["hidden_size"], mode, False, MB_MAX_POS, legacy_pool)
        with open(os.path.join(d, "config.json")) as f:
            cfg_json = json.load(f)
        write_json(os.path.join(d, "config.v4.json"), legacy_modernbert_config(cfg_json, kw), indent=2)

        model = ModernBertModel.from_pretrained(d, attn_implementation="eager").eval()
        w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
        np_cfg = dict(kw, num_hidden_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size)
        items, singles, np_diff = references(model, tok, MODERNBERT_INPUTS, mode, "modernbert",
                                             lambda ids: np_modernbert(w, np_cfg, ids))
        # The window rule matters: the strict variant must differ on long inputs.
        long_ids = items[-1]["ids"]
        strict = np_modernbert(w, np_cfg, long_ids, window_rule="lt")
        assert np.abs(strict - singles[-1]).max() > 1e-3
        assert any(len(it["ids"]) <= 3 for it in items)
        assert max(len(it["ids"]) for it in items) > 2 * kw["local_attention"]
        batched = check_batched(model, [it["ids"] for it in items], sp["pad"], singles, mode, "modernbert")

        # config.v4.json (legacy keys) must build the same model.
        with tempfile.TemporaryDirectory() as td:
            shutil.copy(os.path.join(d, "model.safetensors"), td)
            shutil.copy(os.path.join(d, "config.v4.json"), os.path.join(td, "config.json"))
            m4 = ModernBertModel.from_pretrained(td, attn_implementation="eager").eval()
            assert m4.config.layer_types == cfg.layer_types
            assert m4.config.rope_parameters == model.config.rope_parameters, m4.config.rope_parameters
            assert np.abs(run_single(m4, long_ids, "modernbert") - singles[-1]).max() == 0.0

        st_diff = check_sentence_transformers(d, MODERNBERT_INPUTS, items, mode)
        doc["checkpoints"][name] = {
            "dir": name, "notes": notes, "pooling": mode, "normalize_module": False,
            "config": {k: cfg_json[k] for k in (
                "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "hidden_activation", "max_position_embeddings",
                "local_attention", "global_attn_every_n_layers", "layer_types",
                "rope_parameters", "norm_eps", "norm_bias", "attention_bias", "mlp_bias",
                "pad_token_id", "cls_token_id", "sep_token_id")},
            "tensors": tensor_shapes(os.path.join(d, "model.safetensors")),
            "numpy_reference_max_abs_diff": np_diff,
            "sentence_transformers_max_abs_diff": st_diff,
            "batched": batched,
            "items": items,
        }
        print(f"{name}: tokens {[it['n_tokens'] for it in items]}, numpy diff {np_diff}, "
              f"batched {batched['max_abs_diff_hidden']}, dir {dir_size(d)} bytes")
    write_json(os.path.join(out_dir, "modernbert.json"), doc)


BERT_NAME = "bert-tiny-cls"
BERT_MAX_POS = 64


def make_bert(out_dir):
    tok = train_wordpiece(400)
    vocab = tok.get_vocab_size()
    sp = special_ids(tok)
    assert sp["pad"] == 0
    d = os.path.join(out_dir, BERT_NAME)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    torch.manual_seed(SEED + 7)
    cfg = BertConfig(vocab_size=vocab, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=80, max_position_embeddings=BERT_MAX_POS, type_vocab_size=2,
                     hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=sp["pad"],
                     attn_implementation="eager")
    model = BertModel(cfg, add_pooling_layer=True)  # pooler.* kept, as published checkpoints have it
    perturb(model, SEED + 107)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    save_tokenizer(tok, d, BERT_MAX_POS)
    save_st_files(d, cfg.hidden_size, "cls", True, BERT_MAX_POS, True)
    with open(os.path.join(d, "config.json")) as f:
        cfg_json = json.load(f)

    model = BertModel.from_pretrained(d, attn_implementation="eager").eval()
    w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    np_cfg = {k: cfg_json[k] for k in ("layer_norm_eps", "hidden_size", "num_attention_heads",
                                       "num_hidden_layers")}
    items, singles, np_diff = references(model, tok, BERT_INPUTS, "cls", "bert",
                                         lambda ids: np_bert(w, np_cfg, ids))
    assert any(sp["unk"] in it["ids"] for it in items)  # emoji / unseen characters -> [UNK]
    batched = check_batched(model, [it["ids"] for it in items], sp["pad"], singles, "cls", "bert")
    st_diff = check_sentence_transformers(d, BERT_INPUTS, items, "cls")
    doc = {"generator": "scripts/make_embedding_goldens.py", "versions": versions(),
           "dtype": "float32", "attn_implementation": "eager", "device": "cpu",
           "rounding": "7 significant digits", "seed": SEED, "checkpoints": {BERT_NAME: {
               "dir": BERT_NAME,
               "notes": "BertModel with pooler (unused by sentence-transformers); CLS pooling "
                        "then Normalize; token_type_ids all 0; lowercasing WordPiece",
               "pooling": "cls", "normalize_module": True,
               "config": {k: cfg_json[k] for k in (
                   "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size", "hidden_act", "max_position_embeddings",
                   "type_vocab_size", "layer_norm_eps", "pad_token_id")},
               "tensors": tensor_shapes(os.path.join(d, "model.safetensors")),
               "numpy_reference_max_abs_diff": np_diff,
               "sentence_transformers_max_abs_diff": st_diff,
               "batched": batched,
               "items": items}}}
    write_json(os.path.join(out_dir, "bert-tiny.json"), doc)
    print(f"{BERT_NAME}: vocab {vocab}, tokens {[it['n_tokens'] for it in items]}, "
          f"numpy diff {np_diff}, batched {batched['max_abs_diff_hidden']}, dir {dir_size(d)} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "embed"))
    ap.add_argument("--minilm", default=os.path.join(
        os.environ.get("FERRITE_HOME", os.path.expanduser("~/.ferrite")), "models", "all-minilm-l6-v2"))
    ap.add_argument("--skip-minilm", action="store_true", help="only the tiny checkpoints")
    args = ap.parse_args()
    torch.set_num_threads(2)
    os.makedirs(args.out, exist_ok=True)
    make_modernbert(args.out)
    make_bert(args.out)
    if not args.skip_minilm:
        make_minilm(args.minilm, args.out)
    total = dir_size(args.out)
    print(f"fixtures in {args.out}: {total} bytes")


if __name__ == "__main__":
    main()
