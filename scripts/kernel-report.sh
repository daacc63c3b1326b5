#!/usr/bin/env bash
# Registers, spills and instruction counts of a kernel module's kernels, on a
# machine without a GPU: NVRTC (scripts/nvrtc.sh's venv) and nvdisasm from
# their pip wheels (nvdisasm 13.2 reads the cubins of NVRTC 13.0).
#   scripts/kernel-report.sh quant 'gemv_q4_k_\d' --loop
#   (-D NAME=VALUE compiles with a definition, as FERRITE_CUDA_DEFINES does)
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$(scripts/nvrtc.sh)
venv=target/nvrtc-venv
nvdisasm=$(ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvdisasm 2>/dev/null || true)
if [[ -z $nvdisasm ]]; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check nvidia-cuda-nvdisasm==13.2.51 >&2
    nvdisasm=$(ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvdisasm)
fi
LD_LIBRARY_PATH="$lib" exec python3 scripts/kernel_report.py "$lib" "$nvdisasm" "$@"
