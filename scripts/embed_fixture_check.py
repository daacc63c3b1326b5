#!/usr/bin/env python3
"""`ferrite embed` on the tiny random encoder checkpoints of tests/fixtures/embed
(BERT with CLS pooling; ModernBERT with global and sliding-window layers),
against the pooled vectors HF transformers gave (the fixtures' references):
in f32 every value within 1e-4, in bf16 a cosine of at least 0.999 per
vector. Made for `--device cuda` (scripts/gpu-check.sh embed); the CPU path
is tested the same way by crates/cli/tests/embeddings.rs.

    python3 scripts/embed_fixture_check.py --ferrite BIN [--device cuda]
Needs only the Python standard library."""
import argparse
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "embed")


def embed(binary, model_dir, texts, device, precision):
    cmd = [binary, "embed", model_dir, *texts, "--device", device, "--precision", precision, "--batch-size", "3"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line)["embedding"] for line in out.splitlines()]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferrite", default=os.path.join(ROOT, "target", "release", "ferrite"))
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    failed = False
    for fixture in ("bert-tiny.json", "modernbert.json"):
        with open(os.path.join(FIXTURES, fixture)) as f:
            checkpoints = json.load(f)["checkpoints"]
        for name, ck in checkpoints.items():
            items = ck["items"]
            # Four rounds of the inputs: batches of the same shape repeat, so
            # the CUDA backend captures and replays its graphs of the pass.
            want = [i["pooled_normalized" if ck["normalize_module"] else "pooled"] for i in items] * 4
            texts = [i["text"] for i in items] * 4
            for precision in ("f32", "bf16"):
                got = embed(a.ferrite, os.path.join(FIXTURES, name), texts, a.device, precision)
                if len(got) != len(want):
                    print(f"FAIL {name} {precision}: {len(got)} vectors for {len(want)} inputs")
                    failed = True
                    continue
                diff = max(abs(x - y) for g, w in zip(got, want) for x, y in zip(g, w))
                low = min(cosine(g, w) for g, w in zip(got, want))
                ok = diff < 1e-4 if precision == "f32" else low >= 0.999
                failed |= not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name} on {a.device}, {precision}: {len(got)} inputs, "
                      f"max abs diff {diff:.2e}, lowest cosine {low:.6f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
