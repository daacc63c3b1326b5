#!/usr/bin/env python3
"""A decode step's timeline (`FERRITE_CUDA_TRACE=1` or `=2` output of
`ferrite bench`) averaged over its layers: the step's kernels (and marks)
after the first repeat with some period, and each position of that period
gets its mean span (us from its release to the next) over the layers.

Usage: scripts/trace_layers.py LOG [LOG...]
"""
import sys


def step_rows(text):
    """(name, span us) of the one step the log prints, in order."""
    rows = []
    for line in text.split("one step", 1)[-1].splitlines()[1:]:
        parts = line.split()
        if len(parts) != 3:
            if rows:
                break
            continue
        try:
            rows.append((parts[0], float(parts[1])))
        except ValueError:
            break
    return rows


def period(names):
    """The period of the layers' kernels: the shortest that most names repeat at."""
    best, best_score = 0, 0.0
    for p in range(3, min(64, len(names) // 3)):
        same = sum(names[i] == names[i + p] for i in range(len(names) - p))
        score = same / (len(names) - p)
        if score > best_score + 1e-9:
            best, best_score = p, score
    return best


def report(path):
    rows = step_rows(open(path).read())
    if not rows:
        print(f"{path}: no step timeline")
        return
    names = [n for n, _ in rows]
    body = rows[1:]
    p = period([n for n, _ in body])
    layers = 0
    while (layers + 2) * p <= len(body) and all(
        body[layers * p + i][0] == body[(layers + 1) * p + i][0] for i in range(p)
    ):
        layers += 1
    layers += 1
    print(f"{path}: {len(rows)} spans, {layers} layers of {p}, first {names[0]} {rows[0][1]:.2f} us")
    total = 0.0
    for i in range(p):
        spans = [body[j * p + i][1] for j in range(layers)]
        mean = sum(spans) / layers
        total += mean
        print(f"  {i:2d} {body[i][0]:<18} {mean:7.2f}  ({min(spans):.2f}-{max(spans):.2f})")
    tail = body[layers * p:]
    print(f"  a layer {total:.2f} us; after the layers {sum(t for _, t in tail):.1f} us"
          f" ({', '.join(f'{n} {t:.1f}' for n, t in tail)}); the step {sum(t for _, t in rows):.0f} us")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    for arg in sys.argv[1:]:
        report(arg)
