#!/usr/bin/env bash
# The fused MLP (kernels/mlp_fused.cu) against the chain's GEMVs under
# `ncu`, each kernel alone (caches flushed, clocks left alone): time, DRAM
# bytes, instructions, and why warps stalled (per issued instruction), from
# the stripped build carried in target-gpu. Output: $OUT/ncu-*.txt and a
# summary on stdout.
# Usage: scripts/gpu-mlp-ncu.sh [DEFINE ...]   (each: the fused MLP built with it too)
#        scripts/gpu-mlp-ncu.sh --layer        (instead: every kernel of a
#        decode step's layer and a half, the chain's, each alone)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
# shellcheck source=scripts/gpu-bin.sh
source scripts/gpu-bin.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
bench=(bench random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 6 --device cuda --repetitions 1)
metrics=gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,sm__warps_active.avg.per_cycle_active
metrics+=,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio
profile() {  # name, kernel regex, skip, count, env...
    local name=$1 regex=$2 skip=$3 count=$4
    shift 4
    env "$@" timeout 200 "$NCU" --clock-control none -k "regex:$regex" -s "$skip" -c "$count" --metrics "$metrics" \
        "$BIN" "${bench[@]}" >"$out/ncu-$name.txt" 2>&1
    echo "== $name: rc=$?"
    # Each kernel: its launch line, then the metrics that matter (stalls of 0.5 or more a issue).
    awk '/^  [a-z_0-9]+ \(/ {print substr($0, 1, 60)} /duration|bytes_read|inst_executed|warps_active/ {print "    " $1, $(NF-1), $NF}
         /issue_stalled/ && $NF + 0 >= 0.5 {sub("smsp__average_warps_issue_stalled_", "", $1); print "    stall", $1, $NF}' \
        "$out/ncu-$name.txt"
}
if [[ ${1:-} == --layer ]]; then
    profile layer '.' 400 14
    exit
fi
profile chain '^gemv_q' 300 5
profile fused '^mlp_fused' 40 2 FERRITE_CUDA_MLP_FUSED=1
for def in "$@"; do
    profile "fused-${def//=/-}" '^mlp_fused' 40 2 FERRITE_CUDA_MLP_FUSED=1 "FERRITE_CUDA_DEFINES=$def"
done
