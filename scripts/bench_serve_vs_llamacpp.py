#!/usr/bin/env python3
"""Serving benchmark: `ferrite serve` against llama.cpp's OpenAI-compatible
server (llama-cpp-python's `python -m llama_cpp.server`) on the same GGUF and
threads, measured by `ferrite bench-serve` at several concurrency levels.

    python scripts/bench_serve_vs_llamacpp.py [--model ~/.ferrite/models/smollm2.gguf]
        [--threads 2] [--concurrency 1 8 32] [--requests N] [--input-len 128]
        [--output-len 64] [--skip-ferrite | --skip-llamacpp] [--json-out results.json]

Each server runs alone (they would fight over the cores otherwise): start it,
wait until GET /v1/models answers, run `ferrite bench-serve --json` at every
concurrency (--requests, default max(2*C, 8) requests each, random prompts of
exactly --input-len tokens, exactly --output-len generated tokens; prompt seed
--seed + C, so both servers get the same prompts at a level and no level
reuses another's, which ferrite's prefix cache would serve), stop it, then the
next server.
Prints a markdown table: output tokens/s of each, the ferrite / llama.cpp
ratio, median TTFT of each, and ferrite's throughput relative to its own C=1
(how well continuous batching scales).

ferrite serve is started as `ferrite serve MODEL --port P --threads T
--max-num-seqs max(C)`. llama-cpp-python's server has no parallel slots: it
serves one request at a time and queues the rest, so its throughput stays flat
with concurrency and its TTFT grows. It is started with `--interrupt_requests
False`: by default it cuts a streaming response short as soon as another
request arrives. (llama.cpp's C++ `llama-server --parallel N` would batch,
but it isn't installed here.)

Exits non-zero when a server does not come up, bench-serve fails, or any
request fails. Needs a release build (`cargo build --release`) and
llama-cpp-python with the server extras (scripts/requirements-ref.txt).
Server logs go to a temporary directory, printed on failure.
"""
import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FERRITE = os.path.join(ROOT, "target", "release", "ferrite")


def default_model():
    home = os.environ.get("FERRITE_HOME", os.path.expanduser("~/.ferrite"))
    return os.path.join(home, "models", "smollm2.gguf")


def port_in_use(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Server:
    """A server process, started in its own session, stopped by its pid."""

    def __init__(self, name, cmd, port, logdir):
        self.name, self.cmd, self.port = name, cmd, port
        self.log = os.path.join(logdir, f"{name}.log")
        self.proc = None

    def start(self, timeout):
        if port_in_use(self.port):
            raise RuntimeError(f"{self.name}: port {self.port} is already in use; pick another")
        print(f"# starting {self.name}: {shlex.join(self.cmd)}", file=sys.stderr, flush=True)
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{self.port}/v1/models"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with status {self.proc.returncode}:\n{tail(self.log)}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not healthy after {timeout}s:\n{tail(self.log)}")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()


def bench(args, port, concurrency):
    requests = args.requests or max(2 * concurrency, 8)
    cmd = [args.ferrite, "bench-serve", "--url", f"http://127.0.0.1:{port}", "--concurrency", str(concurrency),
           "--requests", str(requests), "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--seed", str(args.seed + concurrency), "--json"]
    print(f"#   {shlex.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else None
    if p.returncode != 0 or result is None:
        raise RuntimeError(f"bench-serve failed (status {p.returncode}): {p.stderr.strip()}")
    return result


def run_server(name, server, args):
    """{concurrency: bench-serve result} for one server, started and stopped here."""
    results = {}
    try:
        server.start(args.startup_timeout)
        for c in args.concurrency:
            r = bench(args, server.port, c)
            print(f"#   {name} C={c}: {r['output_throughput']:.2f} output tok/s, "
                  f"median TTFT {fmt(r['median_ttft_ms'])} ms, {r['failed']} failed", file=sys.stderr, flush=True)
            results[c] = r
    finally:
        server.stop()
    return results


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model(), help="GGUF file (default: ~/.ferrite/models/smollm2.gguf)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: max(2*C, 8))")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ferrite", default=FERRITE, help="ferrite binary (default: target/release/ferrite)")
    ap.add_argument("--ferrite-port", type=int, default=8091)
    ap.add_argument("--llamacpp-port", type=int, default=8092)
    ap.add_argument("--ferrite-args", default="", help="extra arguments for `ferrite serve`, one shell string")
    ap.add_argument("--python", default=sys.executable, help="Python with llama-cpp-python[server]")
    ap.add_argument("--startup-timeout", type=float, default=180)
    ap.add_argument("--skip-ferrite", action="store_true")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--json-out", help="also write all bench-serve results here")
    args = ap.parse_args()
    if args.skip_ferrite and args.skip_llamacpp:
        ap.error("nothing to run: both --skip-ferrite and --skip-llamacpp")
    if min(args.concurrency) < 1 or args.requests < 0 or args.input_len < 1 or args.output_len < 1:
        ap.error("--concurrency, --input-len and --output-len must be at least 1")
    if not os.path.isfile(args.model):
        ap.error(f"no model file {args.model}")
    if not os.access(args.ferrite, os.X_OK):
        ap.error(f"no ferrite binary at {args.ferrite}: cargo build --release")
    model = os.path.abspath(os.path.expanduser(args.model))
    logdir = tempfile.mkdtemp(prefix="bench_serve_")
    # The llama.cpp context holds one sequence at a time; ferrite's KV cache is
    # its own default (the model's context, at most 8192 tokens).
    n_ctx = max(2048, args.input_len + args.output_len + 64)
    servers = []
    if not args.skip_ferrite:
        servers.append(("ferrite", Server("ferrite", [
            args.ferrite, "serve", model, "--port", str(args.ferrite_port), "--threads", str(args.threads),
            "--max-num-seqs", str(max(args.concurrency))] + shlex.split(args.ferrite_args),
            args.ferrite_port, logdir)))
    if not args.skip_llamacpp:
        servers.append(("llama.cpp", Server("llamacpp", [
            args.python, "-m", "llama_cpp.server", "--model", model, "--port", str(args.llamacpp_port),
            "--host", "127.0.0.1", "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
            "--n_ctx", str(n_ctx), "--interrupt_requests", "False", "--verbose", "False"],
            args.llamacpp_port, logdir)))

    results, errors = {}, []
    for name, server in servers:
        try:
            results[name] = run_server(name, server, args)
        except Exception as e:  # keep going: the other server's numbers are still useful
            errors.append(f"{name}: {e}")
            results.setdefault(name, {})
            print(f"# {name} FAILED: {e}\n# logs: {logdir}", file=sys.stderr, flush=True)

    f, l = results.get("ferrite", {}), results.get("llama.cpp", {})
    base = f.get(1)  # ferrite at C=1, the scaling baseline
    print(f"\nmodel {os.path.basename(model)}, {args.threads} threads, input {args.input_len} tokens, "
          f"output {args.output_len} tokens, prompt seed {args.seed}+C; llama.cpp = llama-cpp-python server "
          f"(one request at a time)\n")
    print("| concurrency | requests | ferrite out tok/s | llama.cpp out tok/s | ferrite / llama.cpp "
          "| ferrite TTFT median (ms) | llama.cpp TTFT median (ms) | ferrite vs its C=1 |")
    print("|---|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        fr, lr = f.get(c), l.get(c)
        fo = fr["output_throughput"] if fr else None
        lo = lr["output_throughput"] if lr else None
        ratio = fo / lo if fo and lo else None
        scale = fo / base["output_throughput"] if fo and base and base["output_throughput"] else None
        n = (fr or lr or {}).get("num_requests", args.requests or max(2 * c, 8))
        print(f"| {c} | {n} | {fmt(fo, 2)} | {fmt(lo, 2)} | {fmt(ratio, 2)}{'x' if ratio else ''} "
              f"| {fmt(fr and fr['median_ttft_ms'])} | {fmt(lr and lr['median_ttft_ms'])} "
              f"| {fmt(scale, 2)}{'x' if scale else ''} |")
    if base and base["output_throughput"]:
        scaling = [f"C={c}: {f[c]['output_throughput'] / base['output_throughput']:.2f}x"
                   for c in args.concurrency if c != 1 and f.get(c)]
        if scaling:
            print(f"\nferrite output throughput relative to its C=1: {', '.join(scaling)}")

    for name, per_c in results.items():
        for c, r in per_c.items():
            if r["failed"]:
                msgs = "; ".join(f"{e['count']} x {e['message']}" for e in r["errors"])
                errors.append(f"{name} C={c}: {r['failed']} of {r['num_requests']} requests failed: {msgs}")
            if r["output_len_mismatch"]:
                print(f"warning: {name} C={c}: {r['output_len_mismatch']} requests did not generate exactly "
                      f"{args.output_len} tokens (finish reasons {r['finish_reasons']})", file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({k: {str(c): r for c, r in v.items()} for k, v in results.items()}, fh, indent=1)
    if errors:
        print("\nFAILED:\n" + "\n".join(errors), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
