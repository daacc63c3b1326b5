#!/usr/bin/env bash
# The forty-second session's change (batch-1 tile GEMVs keep their early
# weight loads off decode attention's SMs, kernels/common.cuh `sm_busy`) in
# one call on a machine with an NVIDIA GPU, from the stripped build carried
# in target-gpu (or FERRITE_BIN); random Llama-3.1-8B Q4_K_M, tg128, logs in
# $OUT (default /tmp) as sm-busy-*.log:
#   ab         FERRITE_CUDA_SM_BUSY=0 against the defaults (3 rounds)
#   marks      attention's stages on the timeline (FERRITE_CUDA_TRACE=2),
#              averaged over the layers (scripts/trace_layers.py)
#   marks-off  the same with FERRITE_CUDA_SM_BUSY=0
# Usage: scripts/gpu-sm-busy.sh [ab] [marks] [marks-off]   (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
# shellcheck source=scripts/gpu-bin.sh
source scripts/gpu-bin.sh
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(ab marks marks-off)
bench=(random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 128)
for p in "${parts[@]}"; do
    log=$out/sm-busy-$p.log
    start=$SECONDS
    case $p in
        ab) FERRITE_BIN=$BIN scripts/gpu-ab.sh 'FERRITE_CUDA_SM_BUSY=0' '' 3 "${bench[@]}" >"$log" 2>&1 ;;
        marks | marks-off)
            sw=1
            [[ $p == marks-off ]] && sw=0
            FERRITE_CUDA_SM_BUSY=$sw FERRITE_CUDA_TRACE=2 "$BIN" bench "${bench[@]}" --device cuda \
                --repetitions 1 >"$log" 2>&1 ;;
        *) echo "unknown part $p" >&2; exit 2 ;;
    esac
    echo "== $p: rc=$? in $((SECONDS - start)) s"
    if [[ $p == marks* ]]; then
        python3 scripts/trace_layers.py "$log"
    else
        grep -E '^round|tokens/s|picks|error|panicked' "$log" | tail -12
    fi
done
