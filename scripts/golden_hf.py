#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints and their reference logits.

Needs torch + transformers (written against transformers 5.17 / torch 2.11; run on
CPU in float32 with attn_implementation="eager", so no TF32 or fused kernels).

For each variant below, writes tests/fixtures/hf/<name>/:
  config.json         as transformers' save_pretrained wrote it (v5 format: RoPE
                      settings live in "rope_parameters")
  config.v4.json      the same model described the pre-v5 way most checkpoints on
                      the hub are (top-level rope_theta, rope_scaling,
                      rope_local_base_freq, sliding_window_pattern, torch_dtype).
                      The script checks that transformers, loading this file as
                      config.json, builds the same model (identical logits).
  generation_config.json  as save_pretrained wrote it
  model.safetensors   float32, save_pretrained(safe_serialization=True); tied
                      checkpoints hold no lm_head.weight
  logits.json         {"name", "architecture", "tied_word_embeddings", "notes",
                       "input_ids": [int]*L, "vocab_size", "dtype": "float32",
                       "attn_implementation": "eager", "device": "cpu",
                       "transformers_version", "torch_version", "seed",
                       "tensors": {name: shape},
                       "logits": [[float]*vocab]*L}   # row i = logits after ids[0..=i]
                      One forward pass over the whole sequence (no KV cache).

Weights are not transformers' init (std 0.02 gives near-uniform logits): every
linear weight ~ N(0, 1/in_features), embeddings/lm_head ~ N(0, 0.5^2), biases
~ N(0, 0.2^2), RMSNorm weights ~ 1 + N(0, 0.1^2) (Gemma: N(0, 0.1^2), as Gemma
applies 1 + w), so that every parameter matters for the logits.

Usage: python scripts/golden_hf.py [--out tests/fixtures/hf]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoConfig

SEED = 1234
SEQ_LEN = 20
VOCAB = 128

COMMON = dict(
    vocab_size=VOCAB,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

# name -> (architecture, model_type, legacy (v4-style) config dict, notes)
VARIANTS = {
    "qwen2": ("Qwen2ForCausalLM", "qwen2", dict(
        {k: v for k, v in COMMON.items() if k != "head_dim"}, hidden_size=64, hidden_act="silu", rope_theta=1000000.0,
        tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
        max_window_layers=2, bos_token_id=1, eos_token_id=2),
        "q/k/v projections have bias (o_proj none); untied lm_head; no sliding window"),
    "qwen3_tied": ("Qwen3ForCausalLM", "qwen3", dict(
        COMMON, hidden_size=48, hidden_act="silu", rope_theta=1000000.0,
        tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        sliding_window=None, max_window_layers=2, bos_token_id=1, eos_token_id=2),
        "per-head RMSNorm on q and k (q_norm/k_norm, before RoPE); heads*head_dim=64 != hidden 48; tied"),
    "qwen3_untied": ("Qwen3ForCausalLM", "qwen3", dict(
        COMMON, hidden_size=48, hidden_act="silu", rope_theta=1000000.0,
        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
        sliding_window=None, max_window_layers=2, bos_token_id=1, eos_token_id=2),
        "as qwen3_tied but with a separate lm_head.weight"),
    "llama3": ("LlamaForCausalLM", "llama", dict(
        COMMON, hidden_size=64, hidden_act="silu", rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        bos_token_id=1, eos_token_id=2),
        "llama3 RoPE scaling with original_max_position_embeddings=64 so that, with head_dim 16 and "
        "theta 1e4, low-, mid- (smoothed) and high-frequency bands all occur; tied (like Llama-3.2-1B)"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text", dict(
        COMMON, hidden_size=48, hidden_activation="gelu_pytorch_tanh",
        rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
        sliding_window=8, sliding_window_pattern=2,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=32, final_logit_softcapping=30.0, attn_logit_softcapping=None,
        tie_word_embeddings=True, attention_bias=False,
        bos_token_id=2, eos_token_id=1, pad_token_id=0),
        "layer 0 sliding (window 8: query i sees keys j with i-j<8, local rope theta 1e4), layer 1 global "
        "(theta 1e6); query_pre_attn_scalar=32 (scores scaled by 32**-0.5, not head_dim**-0.5); "
        "final_logit_softcapping=30; embeddings scaled by sqrt(48); RMSNorm uses (1+w); q/k norm; "
        "pre/post attention and feed-forward norms; gelu_tanh; heads*head_dim=64 != hidden 48; tied"),
    "mistral": ("MistralForCausalLM", "mistral", dict(
        COMMON, hidden_size=64, hidden_act="silu", rope_theta=10000.0,
        sliding_window=8, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
        "every layer sliding window 8 (query i sees keys j with i-j<8); untied"),
}


def randomize(model, gemma):
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied params appear once
            if name.endswith("bias"):
                v = torch.randn(p.shape, generator=g) * 0.2
            elif "norm" in name:
                v = torch.randn(p.shape, generator=g) * 0.1
                if not gemma:
                    v = v + 1.0
            elif "embed_tokens" in name or "lm_head" in name:
                v = torch.randn(p.shape, generator=g) * 0.5
            elif p.dim() == 2:
                v = torch.randn(p.shape, generator=g) / np.sqrt(p.shape[1])
            else:
                raise RuntimeError(f"unhandled parameter {name} {tuple(p.shape)}")
            p.copy_(v.to(p.dtype))


def f32list(row):
    # shortest repr that round-trips as float32
    return [float(np.format_float_scientific(np.float32(x), unique=True)) for x in row]


def forward(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf"))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    ids = [int(x) for x in rng.integers(3, VOCAB, size=SEQ_LEN)]
    os.makedirs(args.out, exist_ok=True)
    index = {}
    for name, (arch, model_type, legacy, notes) in VARIANTS.items():
        cfg = AutoConfig.for_model(model_type, **legacy)
        cfg.architectures = [arch]
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        model.eval()
        randomize(model, gemma=(model_type == "gemma3_text"))
        tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert tied == legacy["tie_word_embeddings"], (name, tied)
        logits = forward(model, ids)
        d = os.path.join(args.out, name)
        if os.path.exists(d):
            shutil.rmtree(d)
        model.save_pretrained(d, safe_serialization=True)
        legacy_doc = dict(architectures=[arch], model_type=model_type, torch_dtype="float32", **legacy)
        with open(os.path.join(d, "config.v4.json"), "w") as f:
            json.dump(legacy_doc, f, indent=2, sort_keys=True)
            f.write("\n")

        # reload both ways and check the logits are the same
        re1 = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        l1 = forward(re1, ids)
        with tempfile.TemporaryDirectory() as td:
            shutil.copy(os.path.join(d, "model.safetensors"), td)
            shutil.copy(os.path.join(d, "config.v4.json"), os.path.join(td, "config.json"))
            re2 = AutoModelForCausalLM.from_pretrained(td, attn_implementation="eager", dtype=torch.float32).eval()
            l2 = forward(re2, ids)
        assert np.array_equal(l1, logits), (name, np.abs(l1 - logits).max())
        assert np.array_equal(l2, logits), (name, "legacy config differs", np.abs(l2 - logits).max())
        # the sliding window really matters: without it, logits agree up to the window and differ after
        sw = legacy.get("sliding_window")
        if sw:
            re3 = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32,
                                                       sliding_window=10000).eval()
            l3 = forward(re3, ids)
            assert np.allclose(l3[:sw], logits[:sw], atol=1e-5), name
            assert not np.allclose(l3[sw:], logits[sw:], atol=1e-3), name
            print(f"{name}: sliding window {sw} checked")
        from safetensors.numpy import load_file
        tensors = {k: list(v.shape) for k, v in sorted(load_file(os.path.join(d, "model.safetensors")).items())}
        assert ("lm_head.weight" in tensors) == (not tied), (name, list(tensors))

        doc = {
            "name": name,
            "architecture": arch,
            "model_type": model_type,
            "tied_word_embeddings": bool(tied),
            "notes": notes,
            "input_ids": ids,
            "vocab_size": VOCAB,
            "dtype": "float32",
            "attn_implementation": "eager",
            "device": "cpu",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "seed": SEED,
            "tensors": tensors,
            "logits": [f32list(r) for r in logits],
        }
        with open(os.path.join(d, "logits.json"), "w") as f:
            json.dump(doc, f)
            f.write("\n")
        index[name] = {"architecture": arch, "tied_word_embeddings": bool(tied), "notes": notes,
                       "argmax": [int(x) for x in logits.argmax(-1)]}
        print(f"{name}: {arch} tied={tied} logits std={logits.std():.3f} argmax={index[name]['argmax']}")
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump({"input_ids": ids, "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__, "checkpoints": index}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
