#!/usr/bin/env python3
"""Convert ferrite's smollm2.gguf (SmolLM2-135M-Instruct, Q4_1) into a Hugging Face
Llama checkpoint directory, so that the HF-loading code path can be tested on a real
model without downloading one.

    python scripts/convert_smollm2_hf.py OUT_DIR [--gguf PATH] [--dtype f32|bf16] [--no-verify]

Needs only numpy, gguf, safetensors and tokenizers (scripts/requirements-ref-ci.txt).

Writes into OUT_DIR:
  config.json             LlamaForCausalLM; every number from the GGUF metadata
  generation_config.json  bos/eos/pad ids
  model.safetensors       weights dequantized by gguf-py, stored as F32 (default:
                          lossless w.r.t. the GGUF) or BF16 (round to nearest even);
                          tied embeddings: no lm_head.weight
  tokenizer.json          byte-level BPE built with `tokenizers` from the GGUF vocab and
                          merges, with SmolLM2's pre-tokenizer
                          Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=false,
                          use_regex=true)] (= llama.cpp's "smollm" pre-tokenizer: \\p{N}
                          split, then the GPT-2 regex)
  tokenizer_config.json   bos/eos/pad/unk tokens and the GGUF's chat template
  special_tokens_map.json

llama.cpp's HF->GGUF converter permutes the rows of q_proj and k_proj, per head, so
that RoPE can rotate adjacent pairs (2i, 2i+1) ("normal" GGML rope) instead of HF's
halves (i, i + head_dim/2) ("neox" / rotate_half):
    gguf = hf.reshape(n_head, 2, head_dim//2, n_in).swapaxes(1, 2).reshape(hf.shape)
(n_head = n_head_kv for k_proj). The exact inverse, used here, is
    hf = gguf.reshape(n_head, head_dim//2, 2, n_in).swapaxes(1, 2).reshape(gguf.shape)
i.e. HF row h*hd + j*(hd/2) + i  =  GGUF row h*hd + 2*i + j  (j in {0,1}).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import gguf


def default_gguf():
    home = os.environ.get("FERRITE_HOME", os.path.expanduser("~/.ferrite"))
    return os.path.join(home, "models", "smollm2.gguf")


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def f32_nice(x):
    """A float32 metadata value as the shortest decimal that round-trips in f32 (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


def unpermute(w, n_head):
    rows, n_in = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, n_in).swapaxes(1, 2).reshape(rows, n_in)


def permute(w, n_head):  # llama.cpp's, for the self-check
    rows, n_in = w.shape
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, n_in).swapaxes(1, 2).reshape(rows, n_in)


def f32_to_bf16_bits(a):
    """Round-to-nearest-even float32 -> bfloat16, as uint16 bit patterns (no NaNs expected)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, dtype):
    """tensors: dict name -> float32 array. Writes F32 or BF16 safetensors (sorted names)."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "bf16":
            raw = f32_to_bf16_bits(a).astype("<u2").tobytes()
            st = "BF16"
        else:
            raw = a.astype("<f4").tobytes()
            st = "F32"
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def load_safetensors_f32(path):
    """Read back with the safetensors package (framework-free deserialize), as float32."""
    import safetensors
    with open(path, "rb") as f:
        data = f.read()
    out = {}
    for name, info in safetensors.deserialize(data):
        dt = info["dtype"].upper()
        buf = bytes(info["data"])
        if dt in ("BF16", "BFLOAT16"):
            a = bf16_bits_to_f32(np.frombuffer(buf, dtype="<u2"))
        elif dt in ("F32", "FLOAT32"):
            a = np.frombuffer(buf, dtype="<f4").copy()
        else:
            raise ValueError(dt)
        out[name] = a.reshape(info["shape"])
    return out


NAME_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gname):
    if gname == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gname == "output_norm.weight":
        return "model.norm.weight"
    if gname == "output.weight":
        return "lm_head.weight"
    parts = gname.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in NAME_MAP:
        return f"model.layers.{parts[1]}.{NAME_MAP[parts[2]]}.{parts[3]}"
    raise KeyError(f"no HF name for GGUF tensor {gname}")


def convert_weights(reader, n_head, n_head_kv):
    out = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))  # numpy order: [ne1, ne0] = [out, in]
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        w = np.asarray(w, dtype=np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_head_kv)
        out[hf_name(t.name)] = w
    return out


def build_tokenizer(reader):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, AddedToken
    model_kind = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre")
    if model_kind != "gpt2" or pre != "smollm":
        raise SystemExit(f"expected a gpt2/smollm tokenizer, got {model_kind}/{pre}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens"
    merge_pairs = [tuple(m.split(" ")) for m in merges]
    assert all(len(p) == 2 for p in merge_pairs)
    bpe = models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False)
    tk = Tokenizer(bpe)
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tk.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tk.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    # GGUF token_type 3 = CONTROL (4 = USER_DEFINED): both are HF added tokens; control ones are special.
    specials = [(i, tokens[i], int(types[i]) == 3) for i in range(len(tokens)) if int(types[i]) in (3, 4)]
    tk.add_tokens([AddedToken(c, special=s, normalized=False, lstrip=False, rstrip=False, single_word=False)
                   for _, c, s in specials])
    for i, c, _ in specials:
        assert tk.token_to_id(c) == i, (c, i, tk.token_to_id(c))
    return tk, tokens, specials


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--gguf", default=default_gguf())
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--no-verify", action="store_true", help="skip the self-checks")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.gguf)
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"expected a llama GGUF, got {arch}")
    n_layer = int(field(reader, "llama.block_count"))
    d_model = int(field(reader, "llama.embedding_length"))
    n_ff = int(field(reader, "llama.feed_forward_length"))
    n_head = int(field(reader, "llama.attention.head_count"))
    n_head_kv = int(field(reader, "llama.attention.head_count_kv", n_head))
    n_ctx = int(field(reader, "llama.context_length"))
    theta = f32_nice(field(reader, "llama.rope.freq_base", 10000.0))
    eps = f32_nice(field(reader, "llama.attention.layer_norm_rms_epsilon"))
    rope_dim = int(field(reader, "llama.rope.dimension_count", d_model // n_head))
    head_dim = int(field(reader, "llama.attention.key_length", d_model // n_head))
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab_size = int(field(reader, "llama.vocab_size", len(tokens)))
    bos = int(field(reader, "tokenizer.ggml.bos_token_id"))
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    unk = field(reader, "tokenizer.ggml.unknown_token_id")
    pad = field(reader, "tokenizer.ggml.padding_token_id")
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
    chat_template = field(reader, "tokenizer.chat_template")
    if rope_dim != head_dim:
        raise SystemExit("partial rotary not supported")
    if field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise SystemExit("rope scaling in GGUF not handled")

    os.makedirs(args.out_dir, exist_ok=True)
    weights = convert_weights(reader, n_head, n_head_kv)
    tied = "lm_head.weight" not in weights
    assert weights["model.embed_tokens.weight"].shape == (vocab_size, d_model)

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": None if pad is None else int(pad),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": d_model,
        "initializer_range": 0.02,
        "intermediate_size": n_ff,
        "max_position_embeddings": n_ctx,
        "mlp_bias": False,
        "num_attention_heads": n_head,
        "num_hidden_layers": n_layer,
        "num_key_value_heads": n_head_kv,
        "pretraining_tp": 1,
        "rms_norm_eps": eps,
        "rope_scaling": None,
        "rope_theta": theta,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32" if args.dtype == "f32" else "bfloat16",
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    gen = {"_from_model_config": True, "bos_token_id": bos, "eos_token_id": eos}
    if pad is not None:
        gen["pad_token_id"] = int(pad)
    with open(os.path.join(args.out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")

    st_path = os.path.join(args.out_dir, "model.safetensors")
    write_safetensors(st_path, weights, args.dtype)

    tk, tokens, specials = build_tokenizer(reader)
    tk.save(os.path.join(args.out_dir, "tokenizer.json"))
    tok_name = lambda i: None if i is None else tokens[int(i)]
    tcfg = {
        "add_bos_token": add_bos,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": s} for i, c, s in specials},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"] if "<|im_start|>" in tokens else [],
        "bos_token": tok_name(bos),
        "eos_token": tok_name(eos),
        "pad_token": tok_name(pad),
        "unk_token": tok_name(unk),
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": n_ctx,
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": vocab_size,
    }
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    stm = {k: tcfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if tcfg[k] is not None}
    stm["additional_special_tokens"] = tcfg["additional_special_tokens"]
    with open(os.path.join(args.out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(stm, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out_dir}: {len(weights)} tensors ({args.dtype}), tied={tied}, "
          f"theta={theta}, eps={eps}, vocab={vocab_size}")

    if not args.no_verify:
        verify(reader, st_path, args.dtype, n_head, n_head_kv, head_dim, theta, tk)
        fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                               "llamacpp", "smollm2_exact.json")
        if os.path.exists(fixture):
            check_logits(st_path, args.out_dir, args.dtype, fixture)


def rope_pairs_adjacent(x, pos, theta):
    """GGML 'normal' rope on [n, hd]: rotate pairs (2i, 2i+1)."""
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def rope_halves(x, pos, theta):
    """HF rotate_half rope on [n, hd]: rotate pairs (i, i + hd/2)."""
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def verify(reader, st_path, dtype, n_head, n_head_kv, hd, theta, tk):
    got = load_safetensors_f32(st_path)
    ggufw = {t.name: t for t in reader.tensors}

    def gguf_f32(name):
        t = ggufw[name]
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        w = np.asarray(w, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))
        return bf16_bits_to_f32(f32_to_bf16_bits(w)).reshape(w.shape) if dtype == "bf16" else w

    # 1. rows of q_proj / k_proj are GGUF rows at the permuted index
    for layer in (0, 17):
        for kind, nh in (("q", n_head), ("k", n_head_kv)):
            g = gguf_f32(f"blk.{layer}.attn_{kind}.weight")
            h = got[f"model.layers.{layer}.self_attn.{kind}_proj.weight"]
            for hh in (0, nh - 1):
                for j in (0, 1):
                    for i in (0, 1, hd // 2 - 1):
                        assert np.array_equal(h[hh * hd + j * (hd // 2) + i], g[hh * hd + 2 * i + j])
            assert np.array_equal(permute(h, nh), g)
    # 2. other tensors are the GGUF values, untouched
    for gname, hname in (("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
                         ("blk.29.attn_v.weight", "model.layers.29.self_attn.v_proj.weight"),
                         ("token_embd.weight", "model.embed_tokens.weight"),
                         ("output_norm.weight", "model.norm.weight")):
        assert np.array_equal(got[hname], gguf_f32(gname)), hname
    # 3. attention scores agree: GGUF weights with adjacent-pair rope == HF weights with rotate_half rope
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(576), rng.standard_normal(576)
    gq, gk = gguf_f32("blk.5.attn_q.weight"), gguf_f32("blk.5.attn_k.weight")
    hq, hk = got["model.layers.5.self_attn.q_proj.weight"], got["model.layers.5.self_attn.k_proj.weight"]
    for pq, pk in ((7, 3), (100, 0), (4000, 3999)):
        qa = rope_pairs_adjacent((gq @ x).reshape(n_head, hd), pq, theta)
        ka = rope_pairs_adjacent((gk @ y).reshape(n_head_kv, hd), pk, theta)
        qb = rope_halves((hq @ x).reshape(n_head, hd), pq, theta)
        kb = rope_halves((hk @ y).reshape(n_head_kv, hd), pk, theta)
        g = n_head // n_head_kv
        sa = np.array([qa[h] @ ka[h // g] for h in range(n_head)])
        sb = np.array([qb[h] @ kb[h // g] for h in range(n_head)])
        assert np.allclose(sa, sb, rtol=1e-9, atol=1e-9 * np.abs(sa).max()), (sa, sb)
    # 4. tokenizer: a few strings with known llama.cpp ids (llama_cpp 0.3.x, tokenize(special=False))
    for text, want in KNOWN_TOKENS:
        ids = tk.encode(text, add_special_tokens=False).ids
        assert ids == want, (text, ids, want)
        assert tk.decode(ids, skip_special_tokens=False) == text
    print(f"verify: ok ({len(got)} tensors read back with safetensors; q/k permutation, rope "
          f"equivalence, {len(KNOWN_TOKENS)} tokenizer strings)")


# (text, ids) from llama.cpp's own tokenizer for smollm2.gguf (llama-cpp-python 0.3.36,
# tokenize(add_bos=False, special=False)); HF tokenizers gives the same ids for all of them.
# (Not included: text containing special-token strings such as "<|im_start|>": HF tokenizers
# always matches added tokens, llama.cpp with parse_special=false tokenizes them as text.)
KNOWN_TOKENS = [
    ("Hello world", [19556, 905]),
    ("The year 2024 was 12345.", [504, 713, 216, 34, 32, 34, 36, 436, 216, 33, 34, 35, 36, 37, 30]),
    ("  leading spaces\n\nnew", [216, 2899, 5600, 198, 198, 2241]),
    ("Москва — столица", [155, 246, 6485, 39511, 16464, 6511, 1841, 21986, 8355, 31730, 7872, 32233, 6511]),
    ("emoji 🙂 ok", [391, 33777, 47526, 10907]),
    ("I'm don't", [57, 5248, 1326, 982]),
    ("def f(x):\n    return x**2  # sq\n", [1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 15375, 198]),
    ("tabs\tand\r\nCRLF", [100, 7366, 197, 397, 201, 198, 9088, 60, 54]),
    ("Ünïcödé naïve café", [142, 246, 94, 25972, 83, 7466, 84, 2756, 15486, 46494, 37366]),
    ("你好，世界！", [18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219]),
    ("x  \n  y", [104, 256, 3805, 329]),
    ("3.14159 and 1,000,000", [35, 30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32]),
    ("I'M SHOUTING'S", [57, 23, 61, 334, 21953, 4728, 23, 67]),
    ("trailing space ", [4861, 4966, 1898, 216]),
    ("\n\n\n", [16506]),
    ("😀👍🏽🇺🇸", [10813, 242, 218, 10813, 235, 231, 10813, 233, 138, 10813, 225, 135, 10813, 225, 133]),
]


def hf_forward(W, cfg, ids):
    """numpy float64 forward of the written HF checkpoint (HF conventions: rotate_half RoPE)."""
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def lin(x, name):
        return x @ W[name].astype(np.float64).T

    def rope(x):
        return np.stack([rope_halves(x[t], pos[t], theta) for t in range(T)])

    x = W["model.embed_tokens.weight"][ids].astype(np.float64)
    causal = np.tril(np.ones((T, T), dtype=bool))
    g = nh // nkv
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = rope(lin(h, p + "self_attn.q_proj.weight").reshape(T, nh, hd))
        k = rope(lin(h, p + "self_attn.k_proj.weight").reshape(T, nkv, hd))
        v = lin(h, p + "self_attn.v_proj.weight").reshape(T, nkv, hd)
        a = np.empty((T, nh, hd))
        for hh in range(nh):
            s = np.where(causal, q[:, hh] @ k[:, hh // g].T / np.sqrt(hd), -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            a[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // g]
        x = x + lin(a.reshape(T, -1), p + "self_attn.o_proj.weight")
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        gt = lin(h, p + "mlp.gate_proj.weight")
        x = x + lin(gt / (1 + np.exp(-gt)) * lin(h, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
    x = rms(x, W["model.norm.weight"])
    return x @ W.get("lm_head.weight", W["model.embed_tokens.weight"]).astype(np.float64).T


def check_logits(st_path, out_dir, dtype, fixture):
    """End-to-end: the HF checkpoint, run with HF conventions in numpy, reproduces
    tests/fixtures/llamacpp/smollm2_exact.json (a float64 forward over the GGUF itself, with
    llama.cpp's rope convention): ~1e-9 for f32, argmax-level for bf16."""
    W = load_safetensors_f32(st_path)
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(fixture) as f:
        ref = json.load(f)
    seq = ref["sequences"][0]
    ids = seq["ids"][:24]
    L = hf_forward(W, cfg, ids)
    worst, agree = 0.0, 0
    for i, p in enumerate(seq["positions"][: len(ids)]):
        worst = max(worst, max(abs(L[i][t] - v) for t, v in p["top10"]))
        agree += int(int(np.argmax(L[i])) == p["top10"][0][0])
    tol = 1e-6 if dtype == "f32" else 1.5
    print(f"check-logits: {len(ids)} positions, max |diff| on reference top-10 = {worst:.3g}, "
          f"argmax agreement {agree}/{len(ids)}")
    assert worst < tol, worst
    if dtype == "f32":
        assert agree == len(ids)


if __name__ == "__main__":
    sys.exit(main())
