#!/usr/bin/env bash
# NVRTC for machines without a CUDA toolkit (CI): the CUDA 13.0 compiler
# library from its pip wheel, in a venv under target/. Prints the folder to
# put on LD_LIBRARY_PATH. Pinned to 13.0.x: later versions emit code a 13.0
# driver cannot load.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/nvrtc-venv
if [[ ! -d $venv/lib ]] || ! ls "$venv"/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.* >/dev/null 2>&1; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 >&2
fi
echo "$(cd "$venv"/lib/python3*/site-packages/nvidia/cu13/lib && pwd)"
