#!/usr/bin/env bash
# The GPU checks in one go, on a machine with an NVIDIA GPU (no Rust needed):
#   1. the op harness (every CUDA op against the CPU, random inputs), the
#      hardware ceilings (device copy bandwidth, bf16 GEMM rate), and batched
#      against one-at-a-time greedy decoding (default and --deterministic);
#   2. the model goldens: SmolLM2 and Gemma-3-270M teacher-forced on the GPU
#      against the CPU and llama.cpp's continuations (again, with the op
#      harness and the invariance runs, under FERRITE_CUDA_PAD_TILES=1),
#      perplexity on both, the
#      tiny HF checkpoints (bf16 on the GPU) against transformers' logits, and
#      `serve` with 64 concurrent greedy requests against one at a time (also
#      with penalties, and exactly under --deterministic: tokens, and
#      logprobs bit for bit), and
#      its echoed prompt logprobs against an exact float64 reference, and
#      structured outputs (scripts/gpu-structured.sh);
#   3. the benchmarks with random bf16 (and Q4_K_M) weights of Llama-3.1-8B's
#      shape, and SmolLM2's and Gemma-3-270M's with and without padded tiles.
#      FERRITE_PROFILE=1 adds GPU time per op to each benchmark.
#   4. sentence embeddings: the tiny encoder checkpoints against transformers'
#      vectors, and all-minilm-l6-v2 against sentence-transformers (speed too).
# Usage: scripts/gpu-check.sh [ops|models|bench|embed|all]   (default: all)
# FERRITE_BIN: the binary (default target/release/ferrite);
# MODELS: where smollm2.gguf, gemma3-270m.gguf and the all-minilm-l6-v2
# directory are (default ~/.ferrite/models).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FERRITE_BIN:-target/release/ferrite}
MODELS=${MODELS:-$HOME/.ferrite/models}
what=${1:-all}
fx=tests/fixtures/llamacpp

if [[ $what == ops || $what == all ]]; then
    "$BIN" gpu-check
fi

if [[ $what == models || $what == all ]]; then
    args=()
    for m in smollm2:smollm2 gemma3-270m:gemma3-270m; do
        file=$MODELS/${m%%:*}.gguf
        if [[ -f $file ]]; then
            args+=(--model "$file" --golden "$fx/${m##*:}_greedy.json")
        else
            echo "missing $file: skipped" >&2
        fi
    done
    for d in tests/fixtures/hf/*/; do
        args+=(--hf-golden "${d%/}")
    done
    "$BIN" gpu-check --no-ceilings "${args[@]}"
    # Again (with the op harness and invariance runs) with rows not of whole
    # super-blocks in padded tiles (SmolLM2's k = 576, Gemma-3-270M's 640;
    # off by default).
    FERRITE_CUDA_PAD_TILES=1 "$BIN" gpu-check --no-ceilings "${args[@]}"
    for m in smollm2 gemma3-270m; do
        [[ -f $MODELS/$m.gguf ]] || continue
        for d in cpu cuda; do
            echo "perplexity $m on $d:"
            "$BIN" perplexity "$MODELS/$m.gguf" --device $d --ctx 256 --kv-cache f16 \
                --file tests/fixtures/prose/english.txt 2>/dev/null | tail -1
        done
    done
    # Over HTTP: 64 concurrent greedy requests against one at a time.
    if [[ -f $MODELS/smollm2.gguf ]]; then
        python3 scripts/serve_equality_check.py --ferrite "$BIN" --model "$MODELS/smollm2.gguf" --device cuda --n 64 \
            --exact $fx/smollm2_exact.json
        # Penalized requests of several lengths, fed ahead with their last
        # pick counted in on the device: exact under --deterministic (tokens,
        # and the logprobs bit for bit).
        for mode in "" --deterministic; do
            python3 scripts/serve_equality_check.py --ferrite "$BIN" --model "$MODELS/smollm2.gguf" --device cuda \
                --n 64 --penalties $mode
        done
        # Structured outputs: constrained requests beside plain ones.
        FERRITE_BIN=$BIN scripts/gpu-structured.sh "$MODELS/smollm2.gguf"
    fi
fi

if [[ $what == bench || $what == all ]]; then
    m=random:llama-3.1-8b
    "$BIN" bench $m --device cuda --prompt-tokens 0 --gen-tokens 128 --repetitions 2
    # A few streams: the GEMV kernel with 2-8 input rows.
    for b in 2 4 8; do
        "$BIN" bench $m --device cuda --batch $b --prompt-tokens 0 --gen-tokens 64 --repetitions 1
    done
    # Batch-1 decode over a long context (split-K attention).
    "$BIN" bench $m --device cuda --decode-context 16384 --prompt-tokens 0 --gen-tokens 64 --repetitions 1
    "$BIN" bench $m --device cuda --batch 64 --decode-context 1024 --prompt-tokens 0 --gen-tokens 128 --repetitions 1
    "$BIN" bench $m --device cuda --batch 8 --prompt-tokens 2048 --prefill-chunk 2048 --gen-tokens 0 --repetitions 2
    # GGUF Q4_K_M blocks of the same shape: batch-1 decode against the
    # roofline of the quantized bytes, and prefill through dequantized tiles.
    "$BIN" bench $m:q4_k_m --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2
    # Rows not of whole super-blocks (SmolLM2's k = 576, Gemma-3-270M's 640):
    # the dp4a GEMVs against padded tiles (FERRITE_CUDA_PAD_TILES=1).
    for s in smollm2-135m:q4_1 smollm2-135m:q8_0 gemma3-270m:q4_k_m; do
        for b in 1 8; do
            for pad in 0 1; do
                echo "FERRITE_CUDA_PAD_TILES=$pad"
                FERRITE_CUDA_PAD_TILES=$pad "$BIN" bench random:$s --device cuda --batch $b --prompt-tokens 0 \
                    --gen-tokens 128 --repetitions 2
            done
        done
    done
    # What the batch-invariant mode costs.
    "$BIN" bench $m --device cuda --deterministic --batch 64 --decode-context 1024 --prompt-tokens 0 --gen-tokens 128 --repetitions 1
    "$BIN" bench $m --device cuda --deterministic --batch 8 --prompt-tokens 2048 --prefill-chunk 2048 --gen-tokens 0 --repetitions 1
    # The peer, same shapes, same GPU (needs torch and transformers).
    if python3 -c "import torch, transformers" 2>/dev/null; then
        python3 scripts/bench_hf_gpu.py
    fi
fi

if [[ $what == embed || $what == all ]]; then
    # The tiny BERT and ModernBERT checkpoints against transformers' vectors.
    python3 scripts/embed_fixture_check.py --ferrite "$BIN" --device cuda
    if [[ -d $MODELS/all-minilm-l6-v2 ]] && python3 -c "import sentence_transformers" 2>/dev/null; then
        profile=()
        [[ ${FERRITE_PROFILE:-0} != 0 ]] && profile=(--profile)
        FERRITE_PROFILE=0 python3 scripts/bench_embed_gpu.py --model "$MODELS/all-minilm-l6-v2" --ferrite "$BIN" "${profile[@]}"
    else
        echo "embeddings: needs $MODELS/all-minilm-l6-v2 and sentence-transformers; skipped" >&2
    fi
fi
