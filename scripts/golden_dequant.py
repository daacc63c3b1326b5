#!/usr/bin/env python3
"""Golden dequantization fixtures, produced with gguf-py (the reference
implementation maintained in llama.cpp's tree).

Writes into tests/fixtures/dequant/:

  <TYPE>.json  for TYPE in F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K:
      {"type": "Q4_K", "ggml_type_id": 12, "block_size": 256, "type_size": 144,
       "n_blocks": 4, "n_values": 1024, "seed": ...,
       "raw_hex": "<n_blocks*type_size bytes as lowercase hex>",
       "values": [float, ...]}          # n_values floats
    The raw bytes are random, except that every fp16 scale field (d, and dmin/m
    where the type has one) is overwritten with a finite moderate value, and for
    F16/BF16 every element is forced finite (subnormals and signed zeros are
    allowed). Each value is the float32 result of gguf.quants.dequantize, written
    with Python's repr of the float32 widened to float64 (so it is exact: parse it
    as f64 and cast to f32, or compare as f64).

  real.json: for each distinct tensor type in each real model, one real tensor
    (the one with the shortest rows, 2-D preferred) and the dequantized values of
    its first two rows (only row 0 for a 1-D tensor):
      {"models_dir": "~/.ferrite/models",
       "entries": [{"model": "smollm2.gguf", "tensor": "blk.0.attn_k.weight",
                    "type": "Q4_1", "shape": [576, 192], "row_len": 576,
                    "n_rows": 2, "rows": [[...576 floats...], [...]]}, ...]}
    "shape" is in GGUF order (ne0 first); a row is ne0 contiguous elements.

Usage: python scripts/golden_dequant.py [--models DIR] [--out DIR]
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240611
N_BLOCKS = 4

# Byte offsets of fp16 scale fields inside one block.
F16_FIELDS = {
    "Q4_0": [0],          # d, qs[16]
    "Q4_1": [0, 2],       # d, m, qs[16]
    "Q5_0": [0],          # d, qh[4], qs[16]
    "Q5_1": [0, 2],       # d, m, qh[4], qs[16]
    "Q8_0": [0],          # d, qs[32] (int8)
    "Q4_K": [0, 2],       # d, dmin, scales[12], qs[128]
    "Q5_K": [0, 2],       # d, dmin, scales[12], qh[32], qs[128]
    "Q6_K": [208],        # ql[128], qh[64], scales[16] (int8), d
}

TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def moderate_f16(rng, allow_negative=True):
    """A finite fp16 of magnitude in [1e-3, 0.25], random sign."""
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(0.25)))
    sign = -1.0 if (allow_negative and rng.random() < 0.3) else 1.0
    return np.float16(sign * mag)


def make_raw(rng, tname):
    qt = T[tname]
    block_size, type_size = GGML_QUANT_SIZES[qt]
    if tname in ("F16", "BF16"):
        n = 64  # elements
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
        exp_mask = np.uint16(0x7C00) if tname == "F16" else np.uint16(0x7F80)
        # if the exponent is all ones (Inf/NaN), clear its top bit
        top = np.uint16(0x4000)
        allones = (bits & exp_mask) == exp_mask
        bits[allones] &= ~top
        # a few special-but-finite values up front: +0, -0, 1.0, -2.0, smallest subnormal
        if tname == "F16":
            bits[:5] = [0x0000, 0x8000, 0x3C00, 0xC000, 0x0001]
        else:
            bits[:5] = [0x0000, 0x8000, 0x3F80, 0xC000, 0x0001]
        return bits.view(np.uint8).copy(), n
    raw = rng.integers(0, 256, size=N_BLOCKS * type_size, dtype=np.uint32).astype(np.uint8)
    for b in range(N_BLOCKS):
        base = b * type_size
        for i, off in enumerate(F16_FIELDS[tname]):
            # d may be negative; dmin/m also random sign (both legal in the format)
            v = moderate_f16(rng)
            raw[base + off: base + off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    return raw, N_BLOCKS * block_size


def floats(arr):
    arr = np.asarray(arr, dtype=np.float32).reshape(-1)
    assert np.all(np.isfinite(arr)), "non-finite value"
    return [float(x) for x in arr]


def synthetic(out):
    rng = np.random.default_rng(SEED)
    for tname in TYPES:
        qt = T[tname]
        block_size, type_size = GGML_QUANT_SIZES[qt]
        raw, n_values = make_raw(rng, tname)
        vals = gguf.quants.dequantize(raw, qt)
        vals = np.asarray(vals, dtype=np.float32).reshape(-1)
        assert vals.size == n_values, (tname, vals.size, n_values)
        doc = {
            "type": tname,
            "ggml_type_id": int(qt),
            "block_size": block_size,
            "type_size": type_size,
            "n_blocks": n_values // block_size,
            "n_values": n_values,
            "seed": SEED,
            "raw_hex": raw.tobytes().hex(),
            "values": floats(vals),
        }
        path = os.path.join(out, f"{tname}.json")
        with open(path, "w") as f:
            json.dump(doc, f)
            f.write("\n")
        print(f"wrote {path} ({n_values} values)")


def real(models_dir, out):
    entries = []
    for model in ["smollm2.gguf", "gemma3-270m.gguf"]:
        r = gguf.GGUFReader(os.path.join(models_dir, model))
        by_type = {}
        for t in r.tensors:
            by_type.setdefault(t.tensor_type.name, []).append(t)
        for tname in sorted(by_type):
            ts = by_type[tname]
            # prefer 2-D tensors, then shortest rows, then first in file order
            ts2 = [t for t in ts if len(t.shape) >= 2] or ts
            t = min(ts2, key=lambda t: int(t.shape[0]))
            shape = [int(x) for x in t.shape]
            row_len = shape[0]
            n_rows = 2 if len(shape) >= 2 else 1
            # t.data: for quantized types, uint8 [rows, bytes_per_row]; for F32 float32
            data = np.asarray(t.data)
            if len(shape) >= 2:
                data = data.reshape(-1, data.shape[-1])[:n_rows]  # only the rows we need
            deq = gguf.quants.dequantize(np.ascontiguousarray(data), t.tensor_type)
            deq = np.asarray(deq, dtype=np.float32).reshape(-1, row_len)
            rows = [floats(deq[i]) for i in range(n_rows)]
            entries.append({
                "model": model,
                "tensor": t.name,
                "type": tname,
                "shape": shape,
                "row_len": row_len,
                "n_rows": n_rows,
                "rows": rows,
            })
            print(f"real: {model} {t.name} {tname} {shape}")
    path = os.path.join(out, "real.json")
    with open(path, "w") as f:
        json.dump({"models_dir": "~/.ferrite/models", "entries": entries}, f)
        f.write("\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=os.path.expanduser(
        os.path.join(os.environ.get("FERRITE_HOME", "~/.ferrite"), "models")))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "dequant"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    synthetic(args.out)
    real(args.models, args.out)


if __name__ == "__main__":
    sys.exit(main())
