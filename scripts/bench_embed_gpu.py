#!/usr/bin/env python3
"""Sentence embeddings on a GPU, side by side: `ferrite embed --device cuda`
against sentence-transformers (torch, CUDA) on all-MiniLM-L6-v2, at batch 32
and 256, on the corpus of scripts/bench_embed_vs_onnx.py (mixed lengths).

ferrite is timed as a whole subprocess writing its JSON lines to a file
(tokenization on all cores, model load included), and also minus its start-up cost (a one-sentence run, after one
run that compiles and caches the kernels), each the median of --runs runs;
sentence-transformers as model.encode() on the loaded model after a warm-up
(median of --runs runs).
Also prints the lowest cosine between the two engines' vectors (over the
whole corpus).

    python3 scripts/bench_embed_gpu.py --model DIR [--ferrite BIN] [--n 8192]
        [--precision bf16] [--profile]
Needs torch and sentence-transformers (present on the GPU machine)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_embed_vs_onnx import make_corpus  # noqa: E402


def run_ferrite(binary, model, path, batch, precision, profile=False):
    """Seconds for one run, and its vectors. The output goes to a file, as in
    `ferrite embed ... > vectors.jsonl` (a pipe into this script would time
    the script's reading too)."""
    cmd = [binary, "embed", model, "--file", path, "--batch-size", str(batch), "--device", "cuda",
           "--precision", precision]
    env = dict(os.environ, FERRITE_PROFILE="1" if profile else "0")
    with tempfile.TemporaryFile("w+") as out:
        t = time.perf_counter()
        done = subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
        took = time.perf_counter() - t
        out.seek(0)
        vectors = [json.loads(line)["embedding"] for line in out]
    if profile:
        print(f"FERRITE_PROFILE=1, batch {batch}:\n{done.stderr}")
    return took, vectors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ferrite", default="target/release/ferrite")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also print ferrite's phases and GPU time per op")
    a = ap.parse_args()
    import torch
    from sentence_transformers import SentenceTransformer

    sentences = make_corpus(a.n)
    tmp = tempfile.mkdtemp()
    corpus = os.path.join(tmp, "corpus.txt")
    one = os.path.join(tmp, "one.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(sentences) + "\n")
    with open(one, "w") as f:
        f.write(sentences[0] + "\n")
    st = SentenceTransformer(a.model, device="cuda")
    st.encode(sentences[:256], batch_size=64)
    rows = []
    # The first start compiles and caches the GPU kernels: not counted.
    run_ferrite(a.ferrite, a.model, one, 32, a.precision)
    for batch in (32, 256):
        starts, fulls = [], []
        for _ in range(a.runs):
            starts.append(run_ferrite(a.ferrite, a.model, one, batch, a.precision)[0])
            took, ours = run_ferrite(a.ferrite, a.model, corpus, batch, a.precision)
            fulls.append(took)
        start, full = statistics.median(starts), statistics.median(fulls)
        assert len(ours) == a.n, len(ours)
        rates = []
        for _ in range(a.runs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            ref = st.encode(sentences, batch_size=batch, convert_to_tensor=True)
            torch.cuda.synchronize()
            rates.append(a.n / (time.perf_counter() - t))
        st_rate = statistics.median(rates)
        ours_t = torch.tensor(ours, device="cuda")
        cos = torch.nn.functional.cosine_similarity(ours_t, ref.float(), dim=1).min().item()
        f_rate = a.n / max(full - start, 1e-9)
        rows.append(dict(batch=batch, ferrite=f_rate, ferrite_whole=a.n / full, startup_s=start,
                         sentence_transformers=st_rate, ratio=f_rate / st_rate, min_cosine=cos))
    if a.profile:
        for batch in (32, 256):
            run_ferrite(a.ferrite, a.model, corpus, batch, a.precision, profile=True)
    print("| batch | ferrite sent/s | (whole run) | sentence-transformers sent/s | ratio | min cosine |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['ferrite']:.0f} | {r['ferrite_whole']:.0f} | "
              f"{r['sentence_transformers']:.0f} | {r['ratio']:.2f}x | {r['min_cosine']:.5f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
