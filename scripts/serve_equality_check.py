"""End to end over HTTP: greedy completions of N concurrent requests to
`ferrite serve` equal the same requests sent one at a time, or differ only
after a near-tie (the one-at-a-time run's top two logprobs within 0.5 where
the texts part). The one-at-a-time requests ask for top logprobs, so they are
sampled on the host; the concurrent ones are not, so on a GPU they take the
device sampler: the check covers both paths and the batching.

Standard library only (runs on the GPU machine as it is).

Usage: python3 scripts/serve_equality_check.py --ferrite BIN --model FILE
           [--device cuda] [--n 64] [--tokens 24] [--port 8093]
Exit status 0 when every request passes.
"""

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.request

NEAR_TIE = 0.5
TOPICS = ["rivers", "bread", "comets", "violins", "glaciers", "bees", "ships", "copper"]


def prompt(i):
    topic = TOPICS[i % len(TOPICS)]
    forms = [
        f"Tell me about {topic}.",
        f"The history of {topic} begins",
        "You are a careful assistant. " * (1 + i % 4) + f"Explain {topic} in one paragraph.",
        f"Q{i}: why do {topic} matter? A:",
    ]
    return forms[i % len(forms)]


def post(base, body, timeout=600):
    req = urllib.request.Request(
        base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())["choices"][0]


def wait_ready(base, proc, seconds=300):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"ferrite serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    sys.exit("ferrite serve did not become ready")


def first_difference(alone, together):
    """Index of the token of `alone` where `together`'s text leaves it, or None."""
    if alone["text"] == together:
        return None
    at = 0
    for i, tok in enumerate(alone["logprobs"]["tokens"]):
        if not together.startswith(tok, at):
            return i
        at += len(tok)
    return len(alone["logprobs"]["tokens"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferrite", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--port", type=int, default=8093)
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    cmd = [a.ferrite, "serve", a.model, "--device", a.device, "--port", str(a.port), "--max-num-seqs", str(a.n)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(base, proc)
        common = {"max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}
        alone = [post(base, {"prompt": prompt(i), "logprobs": 2, **common}) for i in range(a.n)]
        together = [None] * a.n

        def one(i):
            together[i] = post(base, {"prompt": prompt(i), **common})["text"]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(a.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    differ, bad = 0, 0
    for i, (al, tg) in enumerate(zip(alone, together)):
        if tg is None:
            bad += 1
            print(f"request {i}: no answer")
            continue
        at = first_difference(al, tg)
        if at is None:
            continue
        differ += 1
        tops = al["logprobs"]["top_logprobs"]
        lps = sorted(tops[at].values(), reverse=True) if at < len(tops) else []
        gap = lps[0] - lps[1] if len(lps) > 1 else float("inf")
        ok = gap <= NEAR_TIE
        bad += 0 if ok else 1
        print(f"request {i}: differs at token {at}, top-two gap there {gap:.3f} ({'near-tie' if ok else 'FAIL'})")
    print(f"{a.n} concurrent requests against one at a time: {differ} differ, {bad} not after a near-tie")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
