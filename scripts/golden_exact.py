#!/usr/bin/env python3
"""Exact-arithmetic reference logits for ferrite's two demo GGUF models: a plain numpy
float64 forward pass over the weights as dequantized by gguf-py (no activation
quantization, no f16 KV cache), written directly from the GGUF (independent of
convert_smollm2_hf.py and of llama.cpp's kernels).

llama.cpp (tests/fixtures/llamacpp/*_greedy.json) quantizes activations to 8 bits for
its quantized matmuls and stores K/V in f16, so its logits sit ~0.1-0.5 away from exact
arithmetic (max ~1). An engine that multiplies f32 activations by dequantized weights
should match THESE logits far more closely (~1e-3..1e-2).

Model details implemented (as llama.cpp's graphs do):
  llama (smollm2): x = embd[ids]; per layer: h = rms(x)*attn_norm; q,k,v = W h;
    rope "normal" mode = rotate adjacent pairs (2i, 2i+1) on the GGUF (permuted) q/k rows,
    theta = llama.rope.freq_base; causal softmax(q k^T / sqrt(hd)) v (GQA); x += Wo a;
    h = rms(x)*ffn_norm; x += down(silu(gate h) * up h); logits = rms(x)*output_norm @ embd^T.
  gemma3: x = embd[ids] * sqrt(n_embd); per layer: h = rms(x)*attn_norm (GGUF norm weights
    already hold 1+w); q,k = per-head rms(.)*q_norm / k_norm, rope NEOX (halves), theta 1e4
    on sliding layers and gemma3.rope.freq_base on global layers (layer l is global iff
    (l+1) % 6 == 0), sliding window n_swa (query i sees keys j with i-j < n_swa);
    scores * 1/sqrt(head_dim); a = post_attention_norm(Wo attn); x += a;
    h = rms(x)*ffn_norm; f = down(gelu_tanh(gate h) * up h); x += rms(f)*post_ffw_norm;
    logits = rms(x)*output_norm @ embd^T (no final softcapping, as llama.cpp for the iSWA graph).

Writes tests/fixtures/llamacpp/<stem>_exact.json:
  {"model", "method", "dtype": "float64 activations, gguf-py dequantized weights",
   "sequences": [{"name", "ids": [int], "n_prompt": int,
                  "positions": [{"top10": [[id, logit]...], "logsumexp": float}, ...]}],
   "vs_llamacpp": {"max_abs_diff_top5": float, "mean_abs_diff_top5": float,
                   "argmax_agreement": "a/b"}}
  ids = prompt_ids + continuation_ids of the same-named prompt in <stem>_greedy.json;
  positions[i] is the distribution after ids[0..=i].

Usage: python scripts/golden_exact.py [--models DIR] [--fixtures DIR]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import gguf

SEQS = ["prose", "code", "russian_japanese"]


def load(path):
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items()
            if not k.startswith("tokenizer.ggml.") and k != "tokenizer.chat_template"}
    W = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        w = np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
        W[t.name] = w.reshape(shape)
    return meta, W


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_adjacent(x, pos, theta):  # x [T, n, hd]
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None] * inv[None]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def rope_neox(x, pos, theta):
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None] * inv[None]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)


def attention(q, k, v, scale, window=None):
    T, nh, hd = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    out = np.empty((T, nh, v.shape[-1]))
    for h in range(nh):
        s = (q[:, h] @ k[:, h // g].T) * scale
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        out[:, h] = s @ v[:, h // g]
    return out.reshape(T, -1)


def mm(x, w):
    return x @ w.T.astype(np.float64)


def output_logits(x, emb):
    out = np.empty((x.shape[0], emb.shape[0]))
    for a in range(0, emb.shape[0], 16384):
        out[:, a:a + 16384] = x @ emb[a:a + 16384].astype(np.float64).T
    return out


def forward_llama(meta, W, ids):
    nh = int(meta["llama.attention.head_count"])
    nkv = int(meta["llama.attention.head_count_kv"])
    d = int(meta["llama.embedding_length"])
    hd = d // nh
    eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
    theta = float(meta["llama.rope.freq_base"])
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][ids].astype(np.float64)
    for l in range(int(meta["llama.block_count"])):
        p = f"blk.{l}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = rope_adjacent(mm(h, W[p + "attn_q.weight"]).reshape(T, nh, hd), pos, theta)
        k = rope_adjacent(mm(h, W[p + "attn_k.weight"]).reshape(T, nkv, hd), pos, theta)
        v = mm(h, W[p + "attn_v.weight"]).reshape(T, nkv, hd)
        x = x + mm(attention(q, k, v, 1 / math.sqrt(hd)), W[p + "attn_output.weight"])
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        g = mm(h, W[p + "ffn_gate.weight"])
        x = x + mm(g / (1 + np.exp(-g)) * mm(h, W[p + "ffn_up.weight"]), W[p + "ffn_down.weight"])
    x = rms(x, W["output_norm.weight"], eps)
    return output_logits(x, W.get("output.weight", W["token_embd.weight"]))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def forward_gemma3(meta, W, ids):
    nh = int(meta["gemma3.attention.head_count"])
    nkv = int(meta["gemma3.attention.head_count_kv"])
    d = int(meta["gemma3.embedding_length"])
    hd = int(meta["gemma3.attention.key_length"])
    eps = float(meta["gemma3.attention.layer_norm_rms_epsilon"])
    theta_g = float(meta["gemma3.rope.freq_base"])
    theta_l = 10000.0
    n_swa = int(meta["gemma3.attention.sliding_window"])
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][ids].astype(np.float64) * math.sqrt(d)
    for l in range(int(meta["gemma3.block_count"])):
        p = f"blk.{l}."
        is_global = (l + 1) % 6 == 0
        theta = theta_g if is_global else theta_l
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = rms(mm(h, W[p + "attn_q.weight"]).reshape(T, nh, hd), W[p + "attn_q_norm.weight"], eps)
        k = rms(mm(h, W[p + "attn_k.weight"]).reshape(T, nkv, hd), W[p + "attn_k_norm.weight"], eps)
        v = mm(h, W[p + "attn_v.weight"]).reshape(T, nkv, hd)
        q, k = rope_neox(q, pos, theta), rope_neox(k, pos, theta)
        a = mm(attention(q, k, v, 1 / math.sqrt(hd), None if is_global else n_swa), W[p + "attn_output.weight"])
        x = x + rms(a, W[p + "post_attention_norm.weight"], eps)
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        f = mm(gelu_tanh(mm(h, W[p + "ffn_gate.weight"])) * mm(h, W[p + "ffn_up.weight"]), W[p + "ffn_down.weight"])
        x = x + rms(f, W[p + "post_ffw_norm.weight"], eps)
    x = rms(x, W["output_norm.weight"], eps)
    return output_logits(x, W.get("output.weight", W["token_embd.weight"]))


def main():
    ap = argparse.ArgumentParser()
    home = os.environ.get("FERRITE_HOME", os.path.expanduser("~/.ferrite"))
    ap.add_argument("--models", default=os.path.join(home, "models"))
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--fixtures", default=os.path.join(root, "tests", "fixtures", "llamacpp"))
    args = ap.parse_args()
    for model, fwd in (("smollm2.gguf", forward_llama), ("gemma3-270m.gguf", forward_gemma3)):
        stem = model[:-5]
        greedy = json.load(open(os.path.join(args.fixtures, f"{stem}_greedy.json")))
        meta, W = load(os.path.join(args.models, model))
        seqs, diffs, agree, total = [], [], 0, 0
        for pr in greedy["prompts"]:
            if pr["name"] not in SEQS:
                continue
            ids = pr["prompt_ids"] + pr["continuation_ids"]
            n = len(pr["prompt_ids"])
            L = fwd(meta, W, ids)
            positions = []
            for i in range(len(ids)):
                row = L[i]
                top = np.argsort(-row, kind="stable")[:10]
                m = row.max()
                positions.append({"top10": [[int(t), float(row[t])] for t in top],
                                  "logsumexp": float(m + math.log(np.exp(row - m).sum()))})
            for k, t5 in enumerate(pr["top5"]):
                row = L[n - 1 + k]
                diffs += [abs(row[t] - v) for t, v in t5]
                agree += int(np.argmax(row) == pr["continuation_ids"][k])
                total += 1
            seqs.append({"name": pr["name"], "ids": ids, "n_prompt": n, "positions": positions})
            print(f"{model} {pr['name']}: {len(ids)} positions")
        stats = {"max_abs_diff_top5": float(max(diffs)), "mean_abs_diff_top5": float(np.mean(diffs)),
                 "argmax_agreement": f"{agree}/{total}"}
        print(model, stats)
        assert stats["max_abs_diff_top5"] < 2.0 and agree >= 0.85 * total, "numpy forward disagrees with llama.cpp"
        doc = {"model": model, "dtype": "float64 activations, gguf-py dequantized weights",
               "method": __doc__.split("Writes")[0].strip(), "sequences": seqs,
               "vs_llamacpp": dict(stats, note="llama.cpp batched top5 logits (from *_greedy.json) vs these, "
                                              "over the continuation positions")}
        with open(os.path.join(args.fixtures, f"{stem}_exact.json"), "w") as f:
            json.dump(doc, f)
            f.write("\n")
        del W


if __name__ == "__main__":
    sys.exit(main())
