#!/usr/bin/env python3
"""The GPU peer: HF transformers (bf16, sdpa, its `generate`) on random weights
of a config's shape, timed with CUDA events, for the same three tests as
`ferrite bench` in scripts/gpu-check.sh:
  decode at batch 1 (128 new tokens), decode at batch 64 after 1,024-token
  prompts (128 new tokens), and prefill of 8 x 2,048 tokens.
Usage: python3 scripts/bench_hf_gpu.py [--preset llama-3.1-8b]
Needs torch and transformers (present on the GPU machine)."""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

PRESETS = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, tie_word_embeddings=False,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3.1-8b")
    a = ap.parse_args()
    cfg = LlamaConfig(**PRESETS[a.preset], torch_dtype="bfloat16")
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    vocab = cfg.vocab_size
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {}

    def gen(batch, prompt, new):
        ids = torch.randint(100, vocab, (batch, prompt), device="cuda", generator=g)
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        t_prefill, _ = timed(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                                                    pad_token_id=0))
        t_all, _ = timed(lambda: model.generate(ids, **kw))
        # Decode rate: the generate call minus its prefill, over the new tokens.
        return batch * (new - 1) / (t_all - t_prefill)

    with torch.inference_mode():
        res["decode_b1_tokens_per_s"] = gen(1, 1, 128)
        res["decode_b64_ctx1024_tokens_per_s"] = gen(64, 1024, 128)
        ids = torch.randint(100, vocab, (8, 2048), device="cuda", generator=g)
        model(ids[:1, :128])
        t, _ = timed(lambda: model(ids, logits_to_keep=1) if "logits_to_keep" in model.forward.__code__.co_varnames
                     else model(ids))
        res["prefill_8x2048_tokens_per_s"] = 8 * 2048 / t
    params = sum(p.numel() for p in model.parameters()) - cfg.vocab_size * cfg.hidden_size  # embedding not multiplied
    res["preset"] = a.preset
    res["matmul_params"] = params
    print(json.dumps(res))


if __name__ == "__main__":
    main()
