#!/usr/bin/env python3
"""Reference outputs from llama.cpp itself (through llama-cpp-python) for ferrite's two
demo GGUF models.

Writes into tests/fixtures/llamacpp/:

  <model>_greedy.json   (model = smollm2 | gemma3-270m)
    {"model": "smollm2.gguf",
     "llama_cpp_python_version": "0.3.36", "settings": {...},
     "add_bos": bool,            # the GGUF's tokenizer.ggml.add_bos_token as llama.cpp applied it
     "bos_id": int, "eos_id": int,
     "prompts": [{"name", "text",
                  "prompt_ids": [int],      # llm.tokenize(text.encode(), add_bos=True, special=False)
                  "continuation_ids": [int],# greedy, exactly 32 tokens, NOT stopped at end-of-generation
                  "continuation_text": str, # llama.cpp's detokenization (for reading)
                  "first_eog_index": int|null, # index in continuation_ids of the first EOG token
                                               # (llama-cli would stop after it)
                  "top5": [[[id, logit] x5] per continuation position],
                  "top5_incremental": same shape,
                  "min_margin": float,      # smallest top1-top2 gap in top5_incremental
                  "batched_argmax_mismatch_positions": [int],
                  "max_abs_logit_diff_batched_vs_incremental": float}]}
    Generation is llama.cpp's own: prompt decoded in one batch, then one token per
    decode, sampler temp=0 (greedy). top5_incremental[k] are the 5 largest logits
    (descending) of the distribution that chose continuation_ids[k] in that run
    (its top-1 always equals continuation_ids[k]). top5[k] are the same position
    (sequence index len(prompt_ids)-1+k) from ONE batched evaluation of
    prompt+continuation (logits_all=True) in a fresh context: llama.cpp's batched and
    single-token paths use different kernels, so logits differ by ~0.1 (up to ~1.4) and near-ties
    can flip (listed in batched_argmax_mismatch_positions).

  perplexity.json
    {"ctx": 256, "text_file": "tests/fixtures/prose/english.txt",
     "n_tokens": {model: tokens in the text incl. BOS if added},
     "n_chunks": {model: int}, "n_scored": {model: int},
     "add_bos": {model: bool},
     "ppl": {model: float},                       # f16 KV cache, flash attention off
     "ppl_variants": {"kv_f16_fa_off": {...}, "kv_f32_fa_off": {...}, "kv_f16_fa_on": {...}},
     "chunk_nll": {model: [mean nll of each chunk]},   # kv_f16_fa_off
     "method": "..."}

Usage: python scripts/golden_llamacpp.py [--models DIR] [--out DIR] [--skip-greedy] [--skip-ppl]
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import llama_cpp
from llama_cpp import Llama

MODELS = ["smollm2.gguf", "gemma3-270m.gguf"]
N_THREADS = 2
SEED = 42
N_GEN = 32
GREEDY_CTX = 512
PPL_CTX = 256

PROMPTS = [
    ("prose", "The old lighthouse keeper climbed the spiral stairs every evening, and"),
    ("question", "Question: What is the capital of France?\nAnswer:"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("list", "Shopping list:\n1. eggs\n2. milk\n3."),
    ("french", "La ville de Lyon est connue pour"),
    ("russian_japanese", "Москва — столица России. 東京は日本の首都です。 Both cities are"),
    ("numbers", "The sum 1234 + 5678 equals 6912, and 250 * 4 ="),
    ("dialogue", "Alice: Did you finish the report? 🙂\nBob: Almost, I just need to"),
    ("json", '{"name": "Ada Lovelace", "born": 1815, "field": "'),
    ("whitespace", "Roses are red,\n  violets are blue,\n\tsugar is sweet,   and"),
]

PPL_METHOD = (
    "llama.cpp tools/perplexity/perplexity.cpp (perplexity(), ppl_stride=0), reproduced with "
    "llama-cpp-python: tokens = tokenize(whole text, add_special=true, parse_special=false), so BOS "
    "is prepended iff the GGUF says add_bos_token; n_chunk = floor(n_tokens / n_ctx) non-overlapping "
    "chunks of n_ctx tokens (the tail is dropped); for each chunk the KV cache is cleared, the "
    "chunk's first token is REPLACED by BOS when add_bos (not inserted), the chunk is decoded at "
    "positions 0..n_ctx-1 in one batch (n_batch = n_ctx), and with first = n_ctx/2 every position j "
    "in [first, n_ctx-2] contributes nll_j = log(sum_v exp(l_j[v] - max l_j)) + max l_j - l_j[tok[j+1]] "
    "(float32 logits, float64 sums; the next token is the chunk's original token j+1). "
    "ppl = exp(sum nll / count), count = n_chunk * (n_ctx - 1 - first)."
)


def settings(flash_attn, kv):
    return {
        "n_threads": N_THREADS, "n_threads_batch": N_THREADS, "seed": SEED,
        "flash_attn": flash_attn, "kv_cache_type": kv,
        "n_gpu_layers": 0, "offload": "none (CPU build)",
    }


def make_llm(path, n_ctx, flash_attn=False, kv="f16"):
    kw = {}
    if kv == "f32":
        kw = dict(type_k=0, type_v=0)  # GGML_TYPE_F32
    return Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                 n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=SEED,
                 logits_all=True, flash_attn=flash_attn, n_gpu_layers=0, verbose=False, **kw)


def top5(row):
    idx = np.argsort(-row, kind="stable")[:5]
    return [[int(i), float(np.float32(row[i]))] for i in idx]


def greedy(path, name, out):
    llm = make_llm(path, GREEDY_CTX)
    vocab = llm._model.vocab if hasattr(llm._model, "vocab") else None
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab)) if vocab is not None else None
    bos, eos = llm.token_bos(), llm.token_eos()
    res = []
    for pname, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        cont = []
        llm.reset()
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0,
                                repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                                reset=True):
            cont.append(int(tok))
            if len(cont) >= N_GEN:
                break
        # logits of the incremental (token-by-token) decode that chose the tokens
        inc = np.array(llm.scores[len(ids) - 1: len(ids) - 1 + len(cont)], dtype=np.float32)
        eog = [k for k, t in enumerate(cont) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)]
        # batched re-evaluation of prompt + continuation in a fresh context
        llm.reset()
        seq = ids + cont
        llm.eval(seq)
        scores = np.array(llm.scores[: len(seq)], dtype=np.float32)
        t5, t5i, margins, mism = [], [], [], []
        for k in range(len(cont)):
            row = scores[len(ids) - 1 + k]
            t = top5(row)
            ti = top5(inc[k])
            assert ti[0][0] == cont[k], (name, pname, k)
            t5.append(t)
            t5i.append(ti)
            margins.append(ti[0][1] - ti[1][1])
            if t[0][0] != cont[k]:
                mism.append(k)
        diff = float(np.abs(scores[len(ids) - 1: len(ids) - 1 + len(cont)] - inc).max())
        text_out = llm.detokenize(cont).decode("utf-8", errors="replace")
        res.append({
            "name": pname, "text": text, "prompt_ids": [int(x) for x in ids],
            "continuation_ids": cont, "continuation_text": text_out,
            "first_eog_index": eog[0] if eog else None,
            "top5": t5, "top5_incremental": t5i,
            "min_margin": float(min(margins)),
            "batched_argmax_mismatch_positions": mism,
            "max_abs_logit_diff_batched_vs_incremental": diff,
        })
        print(f"{name} [{pname}] prompt={len(ids)} bos_first={ids[:1] == [bos]} eog={eog[:1]} "
              f"margin={min(margins):.4f} batch/inc diff={diff:.4f} mism={mism} -> {text_out[:50]!r}")
    doc = {
        "model": name,
        "llama_cpp_python_version": llama_cpp.__version__,
        "settings": dict(settings(False, "f16"), n_ctx=GREEDY_CTX, n_batch=GREEDY_CTX,
                         sampler="temp=0 (greedy), top_k=1, top_p=1, min_p=0, repeat_penalty=1; no stop at EOG",
                         max_new_tokens=N_GEN, tokenize="llm.tokenize(text.encode(), add_bos=True, special=False)"),
        "add_bos": add_bos, "bos_id": int(bos), "eos_id": int(eos),
        "prompts": res,
    }
    stem = name[:-5] if name.endswith(".gguf") else name
    with open(os.path.join(out, f"{stem}_greedy.json"), "w") as f:
        json.dump(doc, f, ensure_ascii=False)
        f.write("\n")
    del llm


def perplexity(path, text, flash_attn, kv):
    llm = make_llm(path, PPL_CTX, flash_attn=flash_attn, kv=kv)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
    bos = llm.token_bos()
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    n_ctx = PPL_CTX
    n_chunk = len(tokens) // n_ctx
    assert len(tokens) >= 2 * n_ctx
    first = n_ctx // 2
    nll, count, chunk_nll = 0.0, 0, []
    for i in range(n_chunk):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        orig = list(chunk)
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:n_ctx], dtype=np.float32)
        c = 0.0
        for j in range(first, n_ctx - 1):
            row = logits[j].astype(np.float64)
            m = row.max()
            v = math.log(np.exp(row - m).sum()) + m - row[orig[j + 1]]
            c += v
        nll += c
        count += n_ctx - 1 - first
        chunk_nll.append(c / (n_ctx - 1 - first))
    del llm
    return {"n_tokens": len(tokens), "n_chunks": n_chunk, "n_scored": count, "add_bos": add_bos,
            "ppl": math.exp(nll / count), "chunk_nll": chunk_nll, "first_ids": [int(x) for x in tokens[:8]]}


def main():
    ap = argparse.ArgumentParser()
    home = os.environ.get("FERRITE_HOME", os.path.expanduser("~/.ferrite"))
    ap.add_argument("--models", default=os.path.join(home, "models"))
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "llamacpp"))
    ap.add_argument("--text", default=os.path.join(root, "tests", "fixtures", "prose", "english.txt"))
    ap.add_argument("--skip-greedy", action="store_true")
    ap.add_argument("--skip-ppl", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print("llama.cpp system info:", llama_cpp.llama_print_system_info().decode())
    if not args.skip_greedy:
        for m in MODELS:
            t0 = time.time()
            greedy(os.path.join(args.models, m), m, args.out)
            print(f"{m}: greedy done in {time.time() - t0:.0f}s")
    if not args.skip_ppl:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        variants = {"kv_f16_fa_off": (False, "f16"), "kv_f32_fa_off": (False, "f32"),
                    "kv_f16_fa_on": (True, "f16")}
        results = {v: {} for v in variants}
        for m in MODELS:
            for v, (fa, kv) in variants.items():
                t0 = time.time()
                results[v][m] = perplexity(os.path.join(args.models, m), text, fa, kv)
                print(f"{m} {v}: ppl={results[v][m]['ppl']:.4f} tokens={results[v][m]['n_tokens']} "
                      f"chunks={results[v][m]['n_chunks']} ({time.time() - t0:.0f}s)")
        base = results["kv_f16_fa_off"]
        doc = {
            "ctx": PPL_CTX,
            "text_file": "tests/fixtures/prose/english.txt",
            "n_tokens": {m: base[m]["n_tokens"] for m in MODELS},
            "n_chunks": {m: base[m]["n_chunks"] for m in MODELS},
            "n_scored": {m: base[m]["n_scored"] for m in MODELS},
            "add_bos": {m: base[m]["add_bos"] for m in MODELS},
            "first_ids": {m: base[m]["first_ids"] for m in MODELS},
            "ppl": {m: base[m]["ppl"] for m in MODELS},
            "ppl_variants": {v: {m: results[v][m]["ppl"] for m in MODELS} for v in variants},
            "chunk_nll": {m: base[m]["chunk_nll"] for m in MODELS},
            "llama_cpp_python_version": llama_cpp.__version__,
            "settings": dict(settings(False, "f16"), n_ctx=PPL_CTX, n_batch=PPL_CTX,
                             note="ppl = kv_f16_fa_off; llama-perplexity's own default is flash attention "
                                  "'auto' (enabled on CPU), see kv_f16_fa_on"),
            "method": PPL_METHOD,
        }
        with open(os.path.join(args.out, "perplexity.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
