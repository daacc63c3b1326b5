#!/usr/bin/env bash
# One device call's worth of scripts/gpu-window.sh: the cases named (default
# check ab trace) in turn from the stripped build carried in target-gpu,
# each logged to $OUT/<case>.log, stopping at the first that fails; then
# the lines that matter from each log.
# Usage (on the GPU machine): scripts/gpu-window-run.sh [CASE...]
#   or scripts/gpu-window-run.sh order [DEFINE...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
# shellcheck source=scripts/gpu-bin.sh
source scripts/gpu-bin.sh
cases=("$@") defines=()
[[ ${#cases[@]} -gt 0 ]] || cases=(check ab trace)
if [[ ${cases[0]} == order ]]; then  # (the rest: its defines)
    defines=("${cases[@]:1}") cases=(order)
fi
for c in "${cases[@]}"; do
    start=$SECONDS
    FERRITE_BIN=$BIN scripts/gpu-window.sh "$c" "${defines[@]}" >"$out/$c.log" 2>&1
    rc=$?
    echo "== $c: rc=$rc in $((SECONDS - start)) s"
    grep -E '^ *(ok|FAIL) |^==|tokens/s \(B/A|picks:|error|panicked|dw\.' "$out/$c.log" | head -60
    [[ $rc -eq 0 ]] || break
done
