#!/usr/bin/env bash
# The CUDA 13.0 compiler driver for machines without a CUDA toolkit: nvcc,
# its front ends and headers from their pip wheels, in a venv under
# target/, so that the standalone GPU probes (scripts/*.cu) can be
# compile-checked before a GPU call. Runs nvcc with the wheels' include
# and library folders and the arguments given, e.g.
#   scripts/nvcc.sh -O3 -arch=sm_90a -Xptxas -v -o /tmp/gpu-attn-half scripts/gpu-attn-half.cu
# Pinned to 13.0.x, as scripts/nvrtc.sh: later front ends emit PTX the
# 13.0 assembler refuses.
set -euo pipefail
# (No cd: the arguments' paths are the caller's.)
venv=$(cd "$(dirname "$0")/.." && pwd)/target/nvcc-venv
find_root() { ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 2>/dev/null; }
root=$(find_root || true)
# (nvvm: the front end; include/nv: the C++ library's headers, cccl)
if [[ -z $root || ! -x $root/bin/nvcc || ! -d $root/nvvm || ! -d $root/include/nv ]]; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps nvidia-cuda-nvcc==13.0.88 \
        nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 >&2
    root=$(find_root)
fi
exec "$root/bin/nvcc" -I"$root/include" -L"$root/lib" "$@"
