#!/usr/bin/env python3
"""Side-by-side CPU benchmark of sentence embeddings on all-MiniLM-L6-v2: `ferrite embed`
against ONNX Runtime and sentence-transformers, same corpus, batch size and thread count.

Corpus: make_corpus() builds N sentences (default 1,024) of 4-120 words from a fixed word
list with a fixed seed, and writes them one per line (default
~/.ferrite/cache/embed-bench/corpus-1024.txt) for ferrite to read. Every peer embeds the
same lines.

Peers (all on CPU, --threads threads each, batch --batch-size):
  ferrite      `target/release/ferrite embed MODEL_DIR --file CORPUS --batch-size B
               --threads N`, whose stdout is JSON lines {"index": i, "embedding": [...]}.
               Timed as the whole subprocess wall-clock (model load included); the output
               count is checked. A one-sentence run first measures its start-up cost,
               reported separately.
  onnxruntime  The model exported once with torch.onnx.export (dynamic batch and sequence
               axes; inputs input_ids, attention_mask, token_type_ids; output
               last_hidden_state) into ~/.ferrite/cache/onnx/all-minilm-l6-v2/. Session with
               intra_op_num_threads = N, inter_op_num_threads = 1. Timed per corpus: sort
               by length (as sentence-transformers does), per batch tokenize with the
               `tokenizers` package (pad to the longest in the batch, truncate at 256), run,
               mean-pool with the mask, L2-normalize.
  sentence-transformers  model.encode(batch_size=B) with torch.set_num_threads(N).

Runs alternate the peer order (--runs R). Prints a markdown table of the median
sentences/s per peer and the ratios ferrite/onnxruntime and ferrite/sentence-transformers,
plus the minimum cosine between ferrite's and ONNX Runtime's embeddings over the first 64
sentences. --json-out FILE writes all numbers.

    python scripts/bench_embed_vs_onnx.py [--threads 2] [--runs 3] [--batch-size 32]
        [--n-sentences 1024] [--model DIR] [--skip-ferrite] [--json-out FILE]

Needs the packages in scripts/requirements-bench-embed.txt (in a separate virtualenv) and,
unless --skip-ferrite, a release build of ferrite (`cargo build --release`).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FERRITE = os.path.join(ROOT, "target", "release", "ferrite")
HOME = os.environ.get("FERRITE_HOME", os.path.expanduser("~/.ferrite"))
MAX_LENGTH = 256  # all-MiniLM-L6-v2's sentence_bert_config.json max_seq_length
CORPUS_SEED = 1024

WORDS = """
the a an of to in on at by for with from about over under between through after before
during while and or but because although if when where which who that this these those
river harbor lighthouse keeper lamp ship sail sailor captain crew cargo grain timber wool
salt coal iron glass rope map chart compass tide current channel bank bridge quay dock
warehouse market merchant trader ledger price coin tax toll road canal lock barge engine
steam signal lens tower coast island cape bay storm fog wind rain winter summer night
morning evening light dark bright narrow wide deep shallow old new early late slow fast
careful expensive cheap reliable dangerous safe quiet busy small large long short high low
north south east west upstream downstream town city village family school church library
engineer pilot clerk fisherman builder farmer miller teacher doctor writer painter student
build carry move sell buy pay keep burn mark measure record repair travel arrive depart
return wait watch learn teach write read remember forget follow lead open close cross
reach load unload trade grow change protect warn guide count weigh store send receive
is was were are has had have will would could should might must can may does did
very often rarely always never sometimes nearly almost quite still already soon once
twice again together alone everywhere somewhere nowhere perhaps therefore however
one two three four five ten twelve twenty hundred thousand first second third last
""".split()


def make_corpus(n=1024, seed=CORPUS_SEED, min_words=4, max_words=120):
    """n deterministic sentences of mixed length: about half short (4-20 words), a third
    medium (21-60), the rest long (61-max_words); commas now and then, a full stop or a
    question mark at the end."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            k = rng.randint(min_words, 20)
        elif r < 0.83:
            k = rng.randint(21, 60)
        else:
            k = rng.randint(61, max_words)
        words = [rng.choice(WORDS) for _ in range(k)]
        for i in range(3, k - 1):
            if rng.random() < 0.06:
                words[i] += ","
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + ("?" if rng.random() < 0.15 else "."))
    return out


def write_corpus(sentences, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(sentences) + "\n")


# --------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------


def export_onnx(model_dir, onnx_path):
    """Export BertModel -> last_hidden_state with dynamic batch and sequence axes, then
    check ONNX Runtime against torch on a batch of another shape."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    class Encoder(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    model = Encoder(AutoModel.from_pretrained(model_dir, attn_implementation="eager")).eval()
    ids = torch.randint(1000, 2000, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    tt = torch.zeros_like(ids)
    batch, seq = torch.export.Dim("batch", max=4096), torch.export.Dim("sequence", max=512)
    dyn = {name: {0: batch, 1: seq} for name in ("input_ids", "attention_mask", "token_type_ids")}
    os.makedirs(os.path.dirname(onnx_path), exist_ok=True)
    tmp = onnx_path + ".tmp"
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask, tt), tmp, input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], dynamic_shapes=dyn, opset_version=18,
                          dynamo=True, external_data=False)
    # Check on a different batch size and length, with padding.
    ids = torch.randint(1000, 2000, (3, 37))
    mask = torch.ones_like(ids)
    mask[0, 20:] = 0
    tt = torch.zeros_like(ids)
    with torch.no_grad():
        want = model(ids, mask, tt).numpy()
    sess = ort.InferenceSession(tmp, providers=["CPUExecutionProvider"])
    got = sess.run(["last_hidden_state"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                                            "token_type_ids": tt.numpy()})[0]
    m = mask.numpy().astype(bool)
    diff = float(np.abs(got - want)[m].max())
    assert diff < 1e-3, f"exported ONNX model differs from torch by {diff}"
    os.replace(tmp, onnx_path)
    print(f"exported {onnx_path} (max abs diff vs torch {diff:.2e})", file=sys.stderr)


class OrtPeer:
    name = "onnxruntime"

    def __init__(self, model_dir, onnx_path, threads, batch_size):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.np = __import__("numpy")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(onnx_path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        # The file fixes padding and truncation at 128; use the model's settings instead.
        self.tok.enable_padding(pad_id=self.tok.token_to_id("[PAD]"), pad_token="[PAD]")
        self.tok.enable_truncation(max_length=MAX_LENGTH)
        self.batch_size = batch_size
        self.version = ort.__version__

    def encode(self, sentences):
        np = self.np
        order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
        out = np.empty((len(sentences), 384), dtype=np.float32)
        for s in range(0, len(order), self.batch_size):
            idx = order[s: s + self.batch_size]
            encs = self.tok.encode_batch([sentences[i] for i in idx])
            ids = np.array([e.ids for e in encs], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
            tt = np.array([e.type_ids for e in encs], dtype=np.int64)
            h = self.sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask,
                                                      "token_type_ids": tt})[0]
            m = mask[:, :, None].astype(np.float32)
            pooled = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[idx] = pooled
        return out


class StPeer:
    name = "sentence-transformers"

    def __init__(self, model_dir, threads, batch_size):
        import sentence_transformers
        import torch

        torch.set_num_threads(threads)
        self.model = sentence_transformers.SentenceTransformer(model_dir, device="cpu")
        assert self.model.max_seq_length == MAX_LENGTH
        self.batch_size = batch_size
        self.version = sentence_transformers.__version__

    def encode(self, sentences):
        return self.model.encode(sentences, batch_size=self.batch_size, convert_to_numpy=True,
                                 show_progress_bar=False)


class FerritePeer:
    def __init__(self, binary, model_dir, corpus_path, threads, batch_size, precision):
        self.name = "ferrite" if precision == "f32" else f"ferrite-{precision}"
        self.cmd = [binary, "embed", model_dir, "--batch-size", str(batch_size), "--threads", str(threads),
                    "--precision", precision]
        self.corpus_path = corpus_path

    def run(self, path, n_expected):
        t0 = time.perf_counter()
        proc = subprocess.run(self.cmd + ["--file", path], capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"ferrite embed failed ({proc.returncode}): {proc.stderr[-2000:]}")
        rows = [json.loads(l) for l in proc.stdout.splitlines() if l.strip()]
        if len(rows) != n_expected:
            sys.exit(f"ferrite embed printed {len(rows)} embeddings, expected {n_expected}")
        by_index = {r["index"]: r["embedding"] for r in rows}
        if sorted(by_index) != list(range(n_expected)):
            sys.exit("ferrite embed: indexes are not 0..n-1")
        return dt, [by_index[i] for i in range(n_expected)]

    def startup_seconds(self, sentence):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            f.write(sentence + "\n")
        try:
            return min(self.run(f.name, 1)[0] for _ in range(2))
        finally:
            os.unlink(f.name)


# --------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(HOME, "models", "all-minilm-l6-v2"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n-sentences", type=int, default=1024)
    ap.add_argument("--corpus-out", default=None,
                    help="where to write the corpus (default ~/.ferrite/cache/embed-bench/corpus-N.txt)")
    ap.add_argument("--onnx", default=os.path.join(HOME, "cache", "onnx", "all-minilm-l6-v2", "model.onnx"),
                    help="exported model (made on first use)")
    ap.add_argument("--reexport", action="store_true", help="export the ONNX model again")
    ap.add_argument("--ferrite", default=FERRITE, help="ferrite binary")
    ap.add_argument("--skip-ferrite", action="store_true")
    ap.add_argument("--ferrite-precision", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"],
                    help="ferrite's matmul arithmetic, one peer each (bf16 needs AVX-512 BF16, else it runs f32)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    # The tokenizers package parallelizes encode_batch with its own pool: same thread count.
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import numpy as np
    import torch

    torch.set_num_interop_threads(1)

    sentences = make_corpus(args.n_sentences)
    corpus_path = args.corpus_out or os.path.join(HOME, "cache", "embed-bench", f"corpus-{args.n_sentences}.txt")
    write_corpus(sentences, corpus_path)
    n = len(sentences)
    print(f"corpus: {n} sentences, {sum(len(s.split()) for s in sentences)} words -> {corpus_path}",
          file=sys.stderr)

    if args.reexport or not os.path.exists(args.onnx):
        export_onnx(args.model, args.onnx)

    ort_peer = OrtPeer(args.model, args.onnx, args.threads, args.batch_size)
    peers = [ort_peer, StPeer(args.model, args.threads, args.batch_size)]
    ferrites = []
    if not args.skip_ferrite:
        if not os.path.exists(args.ferrite):
            sys.exit(f"{args.ferrite} not found: cargo build --release (or pass --skip-ferrite)")
        ferrites = [FerritePeer(args.ferrite, args.model, corpus_path, args.threads, args.batch_size, p)
                    for p in args.ferrite_precision]
        peers = ferrites + peers
    ferrite = ferrites[0] if ferrites else None

    # Warm-up (untimed): one batch each; ferrite's start-up probe warms the page cache.
    for p in peers:
        if not isinstance(p, FerritePeer):
            p.encode(sentences[: args.batch_size])
    startup = ferrite.startup_seconds(sentences[0]) if ferrite else None

    times = {p.name: [] for p in peers}
    outputs = {}
    for r in range(args.runs):
        order = peers if r % 2 == 0 else peers[::-1]
        for p in order:
            if isinstance(p, FerritePeer):
                dt, emb = p.run(corpus_path, n)
            else:
                t0 = time.perf_counter()
                emb = p.encode(sentences)
                dt = time.perf_counter() - t0
            times[p.name].append(dt)
            outputs[p.name] = np.asarray(emb, dtype=np.float64)
            print(f"run {r + 1}/{args.runs} {p.name}: {dt:.2f} s, {n / dt:.1f} sentences/s", file=sys.stderr)

    def min_cos(a, b, k=64):
        a, b = a[:k], b[:k]
        c = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        return float(c.min())

    rate = {name: n / statistics.median(ts) for name, ts in times.items()}
    cos = {"sentence-transformers_vs_onnxruntime": min_cos(outputs["sentence-transformers"], outputs["onnxruntime"])}
    for f in ferrites:
        cos[f"{f.name}_vs_onnxruntime"] = min_cos(outputs[f.name], outputs["onnxruntime"])

    print(f"\nall-MiniLM-L6-v2, {n} sentences, batch {args.batch_size}, {args.threads} threads, "
          f"median of {args.runs} run(s)\n")
    print("| peer | sentences/s | seconds (median) |")
    print("| --- | ---: | ---: |")
    for p in peers:
        print(f"| {p.name} | {rate[p.name]:.1f} | {statistics.median(times[p.name]):.2f} |")
    ratios = {}
    for f in ferrites:
        ratios[f"{f.name}/onnxruntime"] = rate[f.name] / rate["onnxruntime"]
        ratios[f"{f.name}/sentence-transformers"] = rate[f.name] / rate["sentence-transformers"]
    if ferrites:
        print()
        print("| ratio | value |")
        print("| --- | ---: |")
        for k, v in ratios.items():
            print(f"| {k} | {v:.2f} |")
        print(f"\nferrite times are whole-process wall-clock; its start-up (one-sentence run) is "
              f"{startup:.2f} s. Without it: {n / max(statistics.median(times[ferrite.name]) - startup, 1e-9):.1f} "
              f"sentences/s.")
    print()
    for k, v in cos.items():
        print(f"min cosine over the first 64 sentences, {k}: {v:.6f}")

    if args.json_out:
        import sentence_transformers
        import tokenizers
        import transformers
        doc = {"model": args.model, "n_sentences": n, "batch_size": args.batch_size,
               "threads": args.threads, "runs": args.runs, "corpus": corpus_path,
               "corpus_seed": CORPUS_SEED, "seconds": times, "sentences_per_s_median": rate,
               "ratios": ratios, "min_cosine_first_64": cos,
               "ferrite_startup_s": startup,
               "versions": {"onnxruntime": ort_peer.version, "sentence_transformers": sentence_transformers.__version__,
                            "torch": torch.__version__, "transformers": transformers.__version__,
                            "tokenizers": tokenizers.__version__, "numpy": np.__version__,
                            "python": sys.version.split()[0]}}
        with open(args.json_out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
