#!/usr/bin/env bash
# The window decode kernel (FERRITE_CUDA_PERSISTENT_WINDOW=1: a layer's
# attention half in one launch, its MLP as the chain runs it) on a machine
# with an NVIDIA GPU, in one go:
#   check   against the chain of kernels, teacher-forced (Llama-3.2-1B and
#           3.1-8B shapes, random Q4_K_M weights, prompts of 5 and 300
#           tokens: one part of attention and a merge of several), without
#           and with the MLP's input (=1, =2), and at 8 warps a block; a
#           failure runs again with the first layer alone in the kernel
#   ab      against the chain, alternating (tg128, 3 rounds), with the two
#           sides' greedy digests; then the kernel (=1) against it writing
#           the MLP's input too (=2, no quantization kernel before gate/up)
#   trace   the decode timeline with block 0's stage marks (dw.*)
#   order   the tiles asked for later or a few at a time (DW_REQUEST_ORDER,
#           DW_REQUEST_AHEAD): against the chain, and a step's first layers
#           traced (`order DEFINE...`: those alone; CHECK=1: checked too)
#   variants  the kernel against its variants: 8 warps a block
#           (FERRITE_CUDA_PERSISTENT_WARPS=8: half an SM's registers), then
#           (FERRITE_CUDA_DEFINES, kernels/decode_window.cu) each q/k/v tile
#           counted done at once, and parts of the context of one or four
#           rounds of keys a warp (not in `all`: each define compiles the
#           kernels anew, ~40 s)
# Usage: scripts/gpu-window.sh [check|ab|trace|order [DEFINE...]|variants|all]   (default:
# all; a failed check stops it)
# FERRITE_BIN: the binary (default target/release/ferrite).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FERRITE_BIN:-target/release/ferrite}
what=${1:-all}
export FERRITE_CUDA_PERSISTENT_WINDOW=1
models=(--persistent random:llama-3.2-1b:q4_k_m --persistent random:llama-3.1-8b:q4_k_m)
bench=(random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 128)

if [[ $what == check || $what == all ]]; then
    # (level, warps a block): the kernel, with the MLP's input, at 8 warps.
    for setting in "1 16" "2 16" "1 8"; do
        read -r level warps <<<"$setting"
        vars=(FERRITE_CUDA_PERSISTENT_WINDOW="$level" FERRITE_CUDA_PERSISTENT_WARPS="$warps")
        echo "== check: the window kernel (${vars[*]}) against the chain"
        if ! env "${vars[@]}" "$BIN" gpu-check --persistent-only "${models[@]}"; then
            echo "== check failed: again with the first layer alone in the window kernel"
            env "${vars[@]}" FERRITE_CUDA_PERSISTENT_LAYERS=1 "$BIN" gpu-check --persistent-only "${models[@]}" || true
            exit 1
        fi
    done
fi

if [[ $what == ab || $what == all ]]; then
    echo "== ab: the chain (A) against the window kernel (B)"
    FERRITE_BIN=$BIN scripts/gpu-ab.sh '' 'FERRITE_CUDA_PERSISTENT=require' 3 "${bench[@]}"
    echo "== ab: the window kernel (A) against it writing the MLP's input (B)"
    FERRITE_BIN=$BIN scripts/gpu-ab.sh 'FERRITE_CUDA_PERSISTENT=require' \
        'FERRITE_CUDA_PERSISTENT=require FERRITE_CUDA_PERSISTENT_WINDOW=2' 3 "${bench[@]}"
fi

if [[ $what == trace || $what == all ]]; then
    echo "== trace: the decode timeline with the window kernel's marks"
    FERRITE_CUDA_TRACE=2 FERRITE_CUDA_PERSISTENT=require "$BIN" bench "${bench[@]}" --device cuda --repetitions 1
fi

if [[ $what == order ]]; then
    # When the tiles are asked for (kernels/decode_window.cu): each define
    # (default all four; or those named after `order`) against the chain, its
    # step's first layers traced; CHECK=1 checks each against the chain too.
    shift
    defs=("$@")
    [[ ${#defs[@]} -gt 0 ]] || defs=(DW_REQUEST_AHEAD=1 DW_REQUEST_AHEAD=2 DW_REQUEST_ORDER=1 DW_REQUEST_ORDER=2)
    for d in "${defs[@]}"; do
        if [[ ${CHECK:-0} == 1 ]]; then
            echo "== order: the window kernel with $d against the chain"
            FERRITE_CUDA_DEFINES=$d "$BIN" gpu-check --persistent-only --persistent random:llama-3.1-8b:q4_k_m
        fi
        echo "== order: the chain (A) against the window kernel with $d (B)"
        FERRITE_BIN=$BIN scripts/gpu-ab.sh '' "FERRITE_CUDA_PERSISTENT=require FERRITE_CUDA_DEFINES=$d" 2 "${bench[@]}"
        echo "== order: trace with $d"
        FERRITE_CUDA_DEFINES=$d FERRITE_CUDA_TRACE=2 FERRITE_CUDA_PERSISTENT=require "$BIN" bench "${bench[@]}" \
            --device cuda --repetitions 1 | sed -n '/one step/,+14p'
    done
fi

if [[ $what == variants ]]; then
    echo "== variants: the window kernel (A) against it at 8 warps a block (B)"
    FERRITE_BIN=$BIN scripts/gpu-ab.sh 'FERRITE_CUDA_PERSISTENT=require' \
        'FERRITE_CUDA_PERSISTENT=require FERRITE_CUDA_PERSISTENT_WARPS=8' 3 "${bench[@]}"
    for d in DW_COUNT_EACH DW_PART_ROUNDS=1 DW_PART_ROUNDS=4; do
        echo "== variants: the window kernel (A) against it with $d (B)"
        FERRITE_BIN=$BIN scripts/gpu-ab.sh 'FERRITE_CUDA_PERSISTENT=require' \
            "FERRITE_CUDA_PERSISTENT=require FERRITE_CUDA_DEFINES=$d" 3 "${bench[@]}"
    done
fi
