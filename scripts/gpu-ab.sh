#!/usr/bin/env bash
# Two settings of the same binary, alternating in one run on the GPU, so
# that a change behind a switch is measured against what it replaces on
# the same machine at the same time (clocks and heat drift between runs).
# Usage: scripts/gpu-ab.sh 'A settings' 'B settings' ROUNDS BENCH-ARGS...
#   e.g. scripts/gpu-ab.sh '' 'FERRITE_CUDA_GRAPH_POOL=1' 3 \
#            random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 128
# Settings are space-separated NAME=value pairs ('' for the defaults);
# FERRITE_BIN=path among them runs that binary on that side (two builds). Each
# round runs A then B with `--device cuda --repetitions 1` added, and prints
# the table rows (tokens/s, % of the roofline) labelled with the setting
# (and the first round's ceilings),
# then per test the mean tokens/s of each side and their ratio, and whether
# the two sides' greedy decode picks were the same.
# FERRITE_BIN: the binary (default target/release/ferrite).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FERRITE_BIN:-target/release/ferrite}
if [[ $# -lt 4 ]]; then
    sed -n 5,15p "$0" >&2
    exit 2
fi
a=$1 b=$2 rounds=$3
shift 3
log=$(mktemp) picks=$(mktemp)
trap 'rm -f "$log" "$picks"' EXIT
for ((r = 1; r <= rounds; r++)); do
    for side in A B; do
        setting=$a
        [[ $side == B ]] && setting=$b
        bin=$BIN
        for word in $setting; do
            if [[ $word == FERRITE_BIN=* ]]; then
                bin=${word#FERRITE_BIN=}
            fi
        done
        # Word splitting of the setting into NAME=value pairs is intended.
        # shellcheck disable=SC2086
        out=$(env $setting "$bin" bench "$@" --device cuda --repetitions 1)
        rows=$(grep '^| ' <<<"$out" | grep -v '^| model' || true)
        # The ceilings measured in the first round (copy, reading alone, GEMM).
        if [[ $r == 1 ]]; then
            ceil=$(grep -m1 '^ceilings' <<<"$out" || true)
            if [[ -n $ceil ]]; then echo "round 1 $side [${setting:-defaults}] $ceil"; fi
        fi
        digest=$(sed -n 's/^decode picks digest.*: //p' <<<"$out")
        [[ -n $digest ]] && echo "$side $digest" >>"$picks"
        while IFS= read -r row; do
            [[ -n $row ]] || continue
            echo "round $r $side [${setting:-defaults}] $row"
            echo "$side $row" >>"$log"
        done <<<"$rows"
    done
done
# Per test (pp/tg column), the mean tokens/s of each side and B over A.
awk -F'|' '{ side = substr($1, 1, 1); test = $5; gsub(/ /, "", test); split($6, v, " ");
             sum[test, side] += v[1]; n[test, side]++; tests[test] = 1 }
     END { for (t in tests) if (n[t, "A"] && n[t, "B"]) {
               a = sum[t, "A"] / n[t, "A"]; b = sum[t, "B"] / n[t, "B"];
               printf "%s: A %.2f, B %.2f tokens/s (B/A %.4f)\n", t, a, b, b / a } }' "$log"
# The digests of the greedy picks (each stream fed its own): one per side
# when each side's arithmetic is repeatable, equal when B picks as A does.
for side in A B; do
    echo "$side picks: $(sed -n "s/^$side //p" "$picks" | sort -u | tr '\n' ' ')"
done
