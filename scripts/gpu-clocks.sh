#!/usr/bin/env bash
# Batch-1 Q4_K_M decode (random Llama-3.1-8B, 2,048 tokens, so that decode
# holds most of the samples) under kernel
# definitions, each run with the GPU's SM clock, memory clock, power and
# throttle reasons sampled every 50 ms (nvidia-smi), so that a build's speed
# can be read against the clocks it ran at: do the GEMVs' products cost
# time because they are issued at a lower clock under the memory stream's
# power, or because of how they overlap the loads? Timing only: the
# measurement aids' outputs are wrong. '' is the default build.
# Usage: scripts/gpu-clocks.sh DEFINES...
#   e.g. scripts/gpu-clocks.sh '' SKIP_ATTN,SKIP_QUANT,SKIP_ADD_GEMV_K=4096,GEMV_NO_MATH
# Logs in $OUT (default /tmp) as clocks-*.log and clocks-*.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
# shellcheck source=scripts/gpu-bin.sh
source scripts/gpu-bin.sh
[[ $# -gt 0 ]] || { sed -n 2,10p "$0" >&2; exit 2; }
fields=clocks.sm,clocks.mem,power.draw,utilization.gpu,clocks_event_reasons.active
# (Older drivers know the last field by its former name.)
nvidia-smi --query-gpu=$fields --format=csv >/dev/null 2>&1 || fields=${fields/clocks_event/clocks_throttle}
for def in "$@"; do
    name=${def:-defaults}
    name=${name//[^A-Za-z0-9_]/_}
    nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -lms 50 >"$out/clocks-$name.csv" 2>/dev/null &
    smi=$!
    FERRITE_CUDA_DEFINES=$def "$BIN" bench random:llama-3.1-8b:q4_k_m --prompt-tokens 0 --gen-tokens 2048 \
        --batch 1 --device cuda --repetitions 2 >"$out/clocks-$name.log" 2>&1
    kill $smi 2>/dev/null
    wait $smi 2>/dev/null
    echo "== ${def:-defaults}"
    grep -E '^\| ' "$out/clocks-$name.log" | grep -v '^| model' | head -4
    # The samples taken while the GPU was busy: medians and the reasons seen.
    python3 - "$out/clocks-$name.csv" <<'EOF'
import collections, statistics, sys
rows = [[f.strip() for f in l.split(",")] for l in open(sys.argv[1]) if l.count(",") == 4]
busy = [r for r in rows if r[3].isdigit() and int(r[3]) >= 90]
if not busy:
    sys.exit(print("  no busy samples"))
med = lambda i: statistics.median(float(r[i]) for r in busy)
reasons = collections.Counter(r[4] for r in busy)
print(f"  busy samples {len(busy)}: SM {med(0):.0f} MHz (min {min(float(r[0]) for r in busy):.0f}), "
      f"memory {med(1):.0f} MHz, power {med(2):.0f} W; reasons {dict(reasons.most_common(3))}")
EOF
done
