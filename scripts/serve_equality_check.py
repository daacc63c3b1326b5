"""End to end over HTTP: greedy completions of N concurrent requests to
`ferrite serve` equal the same requests sent one at a time, or differ only
after a near-tie (the one-at-a-time run's top two logprobs within 0.5 where
their tokens part; outputs of different lengths fail). The one-at-a-time
requests ask for top logprobs, so they are sampled on the host; the
concurrent ones ask for none (logprobs 0: their tokens only), so on a GPU
they take the device sampler: the check covers both paths and the
batching. Outputs are compared token by token.

With --penalties, every request has repetition, presence and frequency
penalties and a length of its own (so rows leave the running batch at
different steps): on a GPU the concurrent ones are fed ahead with their
last pick counted in on the device. With --deterministic (`serve
--deterministic`), every request must equal its lone run exactly, and a
third pass sends the concurrent requests again with top logprobs (sampled
on the host, as the lone ones): their logprobs must equal the lone ones'
bit for bit, which finds a batch-dependent rounding before it flips a
token (and says at which token it starts).

With --exact (a fixture of scripts/golden_exact.py for the same model),
the prompt logprobs of `echo` requests (the engine's scored prompt rows) are
checked against its float64 reference too: a position off by one, or rows
mixed up between requests, would be off by nats; quantized arithmetic is
off by a few hundredths.

Standard library only (runs on the GPU machine as it is).

Usage: python3 scripts/serve_equality_check.py --ferrite BIN --model FILE
           [--device cuda] [--n 64] [--tokens 24] [--port 8093] [--exact FILE]
           [--penalties] [--deterministic] [--serve-arg=ARG ...]
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


def check_echo(base, exact_file):
    """Echoed prompt logprobs of each reference sequence, all at once,
    against the reference's; returns the number of failures."""
    with open(exact_file) as f:
        seqs = json.load(f)["sequences"]
    got = [None] * len(seqs)

    def one(i):
        body = {"prompt": seqs[i]["ids"], "echo": True, "logprobs": 1, "max_tokens": 0}
        got[i] = post(base, body)["logprobs"]["token_logprobs"]

    concurrently(len(seqs), one)
    bad = 0
    for seq, lps in zip(seqs, got):
        ids, diffs = seq["ids"], []
        for p in range(1, len(ids)):
            at = seq["positions"][p - 1]
            logit = dict((t, x) for t, x in at["top10"]).get(ids[p])
            if logit is not None and lps is not None:
                diffs.append(abs(lps[p] - (logit - at["logsumexp"])))
        ok = lps is not None and lps[0] is None and len(diffs) > 0 and max(diffs) < 0.5
        ok = ok and sum(diffs) / len(diffs) < 0.1
        bad += 0 if ok else 1
        worst = max(diffs) if diffs else float("nan")
        print(f"echo {seq['name']}: {len(diffs)} prompt logprobs against the exact reference, "
              f"worst {worst:.4f} ({'ok' if ok else 'FAIL'})")
    return bad


def first_difference(alone, together):
    """Index of the first token where `together`'s tokens leave `alone`'s, or None.
    (By tokens, not text: one text may be two tokenizations, whose penalties differ.)"""
    a = alone["logprobs"]["tokens"]
    if a == together:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, together)) if x != y), min(len(a), len(together)))


def concurrently(n, fn):
    """fn(i) for i < n, all at once."""
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def logprob_differences(alone, together):
    """The batch-invariant mode's bit-for-bit check: for each request whose
    host-sampled concurrent run's tokens or logprobs are not exactly its lone
    run's, one line naming the first token that differs; returns the count."""
    bad = 0
    for i, (al, tg) in enumerate(zip(alone, together)):
        if tg is None:
            bad += 1
            print(f"exact {i}: no answer")
            continue
        a, t = al.get("logprobs") or {}, tg.get("logprobs") or {}
        rows = list(zip(*(a.get(f) or [] for f in ("tokens", "token_logprobs", "top_logprobs"))))
        rows_t = list(zip(*(t.get(f) or [] for f in ("tokens", "token_logprobs", "top_logprobs"))))
        at = next((p for p, (x, y) in enumerate(zip(rows, rows_t)) if x != y), None)
        if at is None and len(rows) == len(rows_t):
            continue
        bad += 1
        if at is None:
            print(f"exact {i}: {len(rows_t)} tokens against {len(rows)}")
            continue
        (tok, lp, _), (tok_t, lp_t, _) = rows[at], rows_t[at]
        numbers = isinstance(lp, float) and isinstance(lp_t, float)
        delta = f"{abs(lp - lp_t):.3g}" if tok == tok_t and numbers else "-"
        print(f"exact {i}: logprobs differ first at token {at} of {len(rows)} (chosen token's by {delta}; "
              f"tokens {'equal' if tok == tok_t else 'differ'})")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferrite", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--exact", help="scripts/golden_exact.py's fixture for this model: check echo's logprobs")
    ap.add_argument("--penalties", action="store_true", help="penalized requests of lengths that differ")
    ap.add_argument("--deterministic", action="store_true", help="serve --deterministic: no difference allowed")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more argument for `ferrite serve`")
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    cmd = [a.ferrite, "serve", a.model, "--device", a.device, "--port", str(a.port), "--max-num-seqs", str(a.n)]
    cmd += (["--deterministic"] if a.deterministic else []) + a.serve_arg
    penalties = {"repetition_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.3} if a.penalties else {}

    def body(i):
        # With penalties, lengths from a.tokens down to a.tokens - 12.
        tokens = a.tokens - (i % 7) * 2 if a.penalties else a.tokens
        return {"prompt": prompt(i), "max_tokens": max(tokens, 1), "temperature": 0, "ignore_eos": True, **penalties}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(base, proc)
        alone = [post(base, {**body(i), "logprobs": 2}) for i in range(a.n)]
        together, exact = [None] * a.n, [None] * a.n

        def one(i):
            # logprobs 0: the tokens, drawn on the device all the same.
            together[i] = post(base, {**body(i), "logprobs": 0})["logprobs"]["tokens"]

        def one_exact(i):
            exact[i] = post(base, {**body(i), "logprobs": 2})

        concurrently(a.n, one)
        if a.deterministic:
            concurrently(a.n, one_exact)
        echo_bad = check_echo(base, a.exact) if a.exact else 0
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
        # (A short answer is a failure, whatever the gap where it stops.)
        ok = gap <= NEAR_TIE and not a.deterministic and len(tg) == len(al["logprobs"]["tokens"])
        bad += 0 if ok else 1
        print(f"request {i}: differs at token {at}, top-two gap there {gap:.3f} ({'near-tie' if ok else 'FAIL'})")
        if not ok:
            print(f"  alone:    {al['logprobs']['tokens']}\n  together: {tg}")
            print(f"  alone's top logprobs there and before: {tops[max(at - 1, 0):at + 1]}")
    exact_bad = logprob_differences(alone, exact) if a.deterministic else 0
    what = ", penalized" if a.penalties else ""
    what += ", --deterministic" if a.deterministic else ""
    what += "".join(f" {x}" for x in a.serve_arg)
    exact = f"; host-sampled, {exact_bad} not equal bit for bit" if a.deterministic else ""
    print(f"{a.n} concurrent requests{what} against one at a time: {differ} differ, {bad} not after a near-tie"
          f"{exact}")
    sys.exit(1 if bad or echo_bad or exact_bad else 0)


if __name__ == "__main__":
    main()
