#!/usr/bin/env bash
# Kernel variants behind compile-time definitions, each against the default
# build of the same binary, alternating in one run (scripts/gpu-ab.sh), on a
# machine with an NVIDIA GPU, from the stripped build carried in target-gpu
# (or FERRITE_BIN); then, with --trace, each side's decode timeline
# (FERRITE_CUDA_TRACE=1). Logs in $OUT (default /tmp) as variants-*.log.
# Usage: scripts/gpu-variants.sh [--rounds N] [--trace] [--batch B] DEFINE...
#   e.g. scripts/gpu-variants.sh --trace WEIGHT_LOAD_NC   (kernels/common.cuh)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
# shellcheck source=scripts/gpu-bin.sh
source scripts/gpu-bin.sh
rounds=3 trace=0 batch=1 defs=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --trace) trace=1; shift ;;
        --batch) batch=$2; shift 2 ;;
        *) defs+=("$1"); shift ;;
    esac
done
[[ ${#defs[@]} -gt 0 ]] || { sed -n 2,8p "$0" >&2; exit 2; }
bench=(random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 128 --batch "$batch")
summary() { sed -n '/one step/q;p' "$1" | grep -E '^\|' | head -12; }
if [[ $trace == 1 ]]; then
    FERRITE_CUDA_TRACE=1 "$BIN" bench "${bench[@]}" --device cuda --repetitions 1 >"$out/variants-trace-default.log" 2>&1
    echo "== trace: defaults"; summary "$out/variants-trace-default.log"
fi
for def in "${defs[@]}"; do
    log=$out/variants-${def//[^A-Za-z0-9_]/_}.log
    echo "== ab: defaults (A) against FERRITE_CUDA_DEFINES=$def (B), batch $batch"
    FERRITE_BIN=$BIN scripts/gpu-ab.sh '' "FERRITE_CUDA_DEFINES=$def" "$rounds" "${bench[@]}" >"$log" 2>&1
    grep -E '^round|tokens/s|picks|error|panicked' "$log" | tail -12
    if [[ $trace == 1 ]]; then
        FERRITE_CUDA_DEFINES=$def FERRITE_CUDA_TRACE=1 "$BIN" bench "${bench[@]}" --device cuda --repetitions 1 \
            >"${log%.log}-trace.log" 2>&1
        echo "== trace: $def"; summary "${log%.log}-trace.log"
    fi
done
