#!/usr/bin/env bash
# The fused MLP (FERRITE_CUDA_MLP_FUSED=1: a one-row decode step's Q4_K
# gate/up and down in one launch, cuda/mlp_fused.rs) on a machine with an
# NVIDIA GPU, in one go, from the stripped build carried in target-gpu
# (or FERRITE_BIN), each part logged to $OUT/mlp-<part>.log:
#   check  against the chain of kernels, teacher-forced (Llama-3.2-1B and
#          3.1-8B shapes, random Q4_K_M weights, prompts of 5 and 300 tokens)
#   ab     against the chain, alternating (tg128, 3 rounds), with the two
#          sides' greedy digests
#   trace  the decode timeline of one step (the first warp's units marked)
#   variants  the kernel as built by default against each variant
#          (FERRITE_CUDA_DEFINES: MF_STATIC, each warp a fixed share of the
#          units; MF_A_STEPS=8 and 16, longer gate/up units), each checked
#          first (`variants DEFINE...`: those alone; not in the default)
#   ops    the op harness with it on (its one-row Q4_K MLP of 1,024 x 768
#          against the CPU; not in the default: a whole `gpu-check`)
# Usage: scripts/gpu-mlp.sh [check|ab|trace|variants [DEFINE...]|ops ...]   (default: the first three; a
# failed check stops it)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
# shellcheck source=scripts/gpu-bin.sh
source scripts/gpu-bin.sh
parts=() defs=()
for arg in "$@"; do
    if [[ $arg == MF_* ]]; then defs+=("$arg"); else parts+=("$arg"); fi
done
[[ ${#parts[@]} -gt 0 ]] || parts=(check ab trace)
[[ ${#defs[@]} -gt 0 ]] || defs=(MF_STATIC MF_A_STEPS=8 MF_A_STEPS=16)
bench=(random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 128)
for p in "${parts[@]}"; do
    start=$SECONDS
    log=$out/mlp-$p.log
    case $p in
        check)
            "$BIN" gpu-check --persistent-only --mlp-fused \
                --persistent random:llama-3.2-1b:q4_k_m --persistent random:llama-3.1-8b:q4_k_m >"$log" 2>&1 ;;
        ab)
            echo "== ab: the chain (A) against the fused MLP (B)" >"$log"
            FERRITE_BIN=$BIN scripts/gpu-ab.sh '' 'FERRITE_CUDA_MLP_FUSED=1' 3 "${bench[@]}" >>"$log" 2>&1 ;;
        variants)
            {
                for def in "${defs[@]}"; do
                    echo "== check: FERRITE_CUDA_DEFINES=$def"
                    FERRITE_CUDA_DEFINES=$def "$BIN" gpu-check --persistent-only --mlp-fused \
                        --persistent random:llama-3.1-8b:q4_k_m | grep -E '^ *(ok|FAIL) ' || continue
                    echo "== ab: the fused MLP (A) against it with FERRITE_CUDA_DEFINES=$def (B)"
                    FERRITE_BIN=$BIN scripts/gpu-ab.sh 'FERRITE_CUDA_MLP_FUSED=1' \
                        "FERRITE_CUDA_MLP_FUSED=1 FERRITE_CUDA_DEFINES=$def" 2 "${bench[@]}"
                done
            } >"$log" 2>&1 ;;
        trace)
            FERRITE_CUDA_TRACE=2 FERRITE_CUDA_MLP_FUSED=1 "$BIN" bench "${bench[@]}" --device cuda \
                --repetitions 1 >"$log" 2>&1 ;;
        ops)
            FERRITE_CUDA_MLP_FUSED=1 "$BIN" gpu-check --no-ceilings >"$log" 2>&1 ;;
        *) echo "unknown part $p" >&2; exit 2 ;;
    esac
    rc=$?
    echo "== $p: rc=$rc in $((SECONDS - start)) s"
    grep -E '^ *(ok|FAIL) |^==|tokens/s \(B/A|picks:|error|panicked' "$log" | grep -E "$([[ $p == ops ]] && echo 'FAIL|mlp_add|fused' || echo .)" | head -40
    [[ $p == trace ]] && sed -n '/one step/,+60p' "$log"
    [[ $rc -eq 0 ]] || break
done
