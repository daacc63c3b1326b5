#!/usr/bin/env bash
# The window decode kernel (FERRITE_CUDA_PERSISTENT_WINDOW=1: a layer's
# attention half in one launch, its MLP as the chain runs it) on a machine
# with an NVIDIA GPU, in one go:
#   check   against the chain of kernels, teacher-forced (Llama-3.2-1B and
#           3.1-8B shapes, random Q4_K_M weights, prompts of 5 and 300
#           tokens: one part of attention and a merge of several); a
#           failure runs again with the first layer alone in the kernel
#   ab      against the chain, alternating (tg128, 3 rounds), with the two
#           sides' greedy digests
#   trace   the decode timeline with block 0's stage marks (dw.*)
# Usage: scripts/gpu-window.sh [check|ab|trace|all]   (default: all; each
# case after a failed check is skipped)
# FERRITE_BIN: the binary (default target/release/ferrite).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FERRITE_BIN:-target/release/ferrite}
what=${1:-all}
export FERRITE_CUDA_PERSISTENT_WINDOW=1
models=(--persistent random:llama-3.2-1b:q4_k_m --persistent random:llama-3.1-8b:q4_k_m)
bench=(random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 128)

if [[ $what == check || $what == all ]]; then
    echo "== check: the window kernel against the chain"
    if ! "$BIN" gpu-check --persistent-only "${models[@]}"; then
        echo "== check failed: again with the first layer alone in the window kernel"
        FERRITE_CUDA_PERSISTENT_LAYERS=1 "$BIN" gpu-check --persistent-only "${models[@]}" || true
        exit 1
    fi
fi

if [[ $what == ab || $what == all ]]; then
    echo "== ab: the chain (A) against the window kernel (B)"
    FERRITE_BIN=$BIN scripts/gpu-ab.sh '' 'FERRITE_CUDA_PERSISTENT=require' 3 "${bench[@]}"
fi

if [[ $what == trace || $what == all ]]; then
    echo "== trace: the decode timeline with the window kernel's marks"
    FERRITE_CUDA_TRACE=2 FERRITE_CUDA_PERSISTENT=require "$BIN" bench "${bench[@]}" --device cuda --repetitions 1
fi
