#!/usr/bin/env python3
"""Side-by-side CPU benchmark: `ferrite bench` against llama.cpp (through the
llama-cpp-python package) on the same GGUF files, threads and token counts, with
runs alternating between the two. Prints a markdown table of tokens/s, the
ferrite / llama.cpp ratio, and each decode rate as a fraction of the memory
roofline (weight bytes per token over the measured DRAM read bandwidth).

    python scripts/bench_vs_llamacpp.py [--threads 2] [--pp 512] [--tg 128] [--runs 3]
        [--models smollm2 gemma3-270m] [--bandwidth-gbs 29]

Needs llama-cpp-python (scripts/requirements-ref.txt) and a release build
(`cargo build --release`).
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import llama_cpp

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FERRITE = os.path.join(ROOT, "target", "release", "ferrite")


def models_dir():
    home = os.environ.get("FERRITE_HOME", os.path.expanduser("~/.ferrite"))
    return os.path.join(home, "models")


def ferrite_run(model, threads, pp, tg):
    out = subprocess.run(
        [FERRITE, "bench", model, "--threads", str(threads), "--prompt-tokens", str(pp),
         "--gen-tokens", str(tg), "--repetitions", "1", "--json"],
        check=True, capture_output=True, text=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    return j["prefill_tokens_per_s"], j["decode_tokens_per_s"]


class LlamaCpp:
    def __init__(self, path, threads, pp, tg):
        self.llm = llama_cpp.Llama(model_path=path, n_ctx=max(pp, tg) + 16, n_batch=max(pp, 1),
                                   n_ubatch=max(pp, 1), n_threads=threads, n_threads_batch=threads,
                                   verbose=False)
        self.pp, self.tg = pp, tg
        self.n_vocab = self.llm.n_vocab()

    def tokens(self, n, seed):
        x = seed * 2654435761 % (2**32) or 1
        out = []
        for _ in range(n):
            x = (x * 1103515245 + 12345) % (2**31)
            out.append(100 + x % (self.n_vocab - 100))
        return out

    def run(self, seed):
        llm = self.llm
        llm.reset()
        llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
        toks = self.tokens(self.pp, seed)
        t = time.perf_counter()
        llm.eval(toks)
        pp = self.pp / (time.perf_counter() - t)
        llm.reset()
        llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
        toks = self.tokens(self.tg, seed + 1)
        t = time.perf_counter()
        for tok in toks:
            llm.eval([tok])
        tg = self.tg / (time.perf_counter() - t)
        return pp, tg


def weight_bytes(path):
    import gguf
    r = gguf.GGUFReader(path)
    return sum(int(t.n_bytes) for t in r.tensors)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"])
    ap.add_argument("--bandwidth-gbs", type=float, default=29.0,
                    help="DRAM read bandwidth with these threads, for the roofline column")
    a = ap.parse_args()
    rows = []
    for m in a.models:
        path = os.path.join(models_dir(), m + ".gguf")
        ref = LlamaCpp(path, a.threads, a.pp, a.tg)
        ref.run(0)  # warm-up
        ferrite_run(m, a.threads, 16, 4)  # warm-up
        f_pp, f_tg, l_pp, l_tg = [], [], [], []
        for r in range(a.runs):
            p, t = ferrite_run(m, a.threads, a.pp, a.tg)
            f_pp.append(p)
            f_tg.append(t)
            p, t = ref.run(r + 1)
            l_pp.append(p)
            l_tg.append(t)
        roof = a.bandwidth_gbs * 1e9 / weight_bytes(path)
        rows.append((m, statistics.median(f_pp), statistics.median(l_pp),
                     statistics.median(f_tg), statistics.median(l_tg), roof))
    print(f"threads={a.threads}, pp{a.pp}, tg{a.tg}, median of {a.runs} alternating runs\n")
    print(f"| model | test | ferrite tok/s | llama.cpp tok/s | ratio | ferrite / roofline |")
    print("|---|---|---|---|---|---|")
    for m, fp, lp, ft, lt, roof in rows:
        print(f"| {m} | pp{a.pp} | {fp:.1f} | {lp:.1f} | {fp / lp:.2f}x | |")
        print(f"| {m} | tg{a.tg} | {ft:.1f} | {lt:.1f} | {ft / lt:.2f}x | {ft / roof:.0%} of {roof:.0f} |")


if __name__ == "__main__":
    main()
