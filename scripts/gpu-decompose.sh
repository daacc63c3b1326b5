#!/usr/bin/env bash
# What each stage of a batch-1 Q4_K_M decode layer holds the step to: the
# default build against builds that leave stages out (timing only, their
# outputs wrong), each alternating with the defaults in one run
# (scripts/gpu-variants.sh), on random Llama-3.1-8B Q4_K_M, tg128:
#   SKIP_ATTN               decode attention returns after its wait
#   SKIP_QUANT              the three input quantizations do
#   SKIP_ADD_GEMV_K=4096    the output projection (an adding GEMV of k 4096)
#   GEMV_NO_MATH            the tile GEMVs load their weights but skip the products
# and the combinations below. If the build with attention, the
# quantizations and the output projection all left out stays under the
# target's rate, the chain of GEMV kernels alone cannot reach it
# (docs/cuda-journal.md, forty-fifth session). Each A/B's first round also
# prints the ceilings (copy, reading alone, GEMM).
# Usage: scripts/gpu-decompose.sh [--rounds N]   (default 1; about 25 s a variant on an H200)
set -uo pipefail
cd "$(dirname "$0")/.."
exec scripts/gpu-variants.sh --rounds 1 "$@" \
    SKIP_ATTN SKIP_QUANT SKIP_ADD_GEMV_K=4096 SKIP_ATTN,SKIP_QUANT \
    SKIP_ATTN,SKIP_QUANT,SKIP_ADD_GEMV_K=4096 GEMV_NO_MATH
