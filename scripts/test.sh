#!/usr/bin/env bash
# The whole test suite: models and converted checkpoints, then every Rust test,
# formatting and lints. Used by CI (.ci/run) and by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite needs about 4 GB of disk (models, venvs, two targets' builds);
# the free space, for a run that fails short of it.
df -h . | awk 'NR == 2 { print "disk: " $4 " free of " $2 > "/dev/stderr" }'
# (pip's wheel cache would only double what the venvs hold.)
export PIP_NO_CACHE_DIR=1
scripts/setup-test-models.sh
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
# Every CUDA kernel must compile (NVRTC from its wheel; no GPU needed).
nvrtc_lib=$(scripts/nvrtc.sh)
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FERRITE_REQUIRE_NVRTC=1 \
    cargo test --release -p ferrite-backend cuda::compile
# The standalone GPU probes compile too (nvcc from its wheels; no GPU needed).
probes=$(mktemp -d)
trap 'rm -rf "$probes"' EXIT  # (also when a probe fails to compile)
for probe in scripts/gpu-*.cu; do
    scripts/nvcc.sh -O2 -arch=sm_90a -c -o "$probes/$(basename "$probe" .cu).o" "$probe"
done
# The aarch64 (NEON) kernels under qemu, where the Rust target is installed.
scripts/test-aarch64.sh
