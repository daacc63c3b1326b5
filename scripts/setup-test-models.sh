#!/usr/bin/env bash
# Everything the test suite needs besides the Rust toolchain: the demo models
# (scripts/fetch-models.sh) and SmolLM2 converted to HF safetensors in F32 and
# BF16 (scripts/convert_smollm2_hf.py, run in a private virtualenv with the
# packages pinned in scripts/requirements-ref-ci.txt). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-models.sh
dest="${FERRITE_HOME:-$HOME/.ferrite}/models"
venv=".venv"
for dtype in f32 bf16; do
  out="$dest/smollm2-hf-$dtype"
  [ -e "$out/model.safetensors" ] && continue
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r scripts/requirements-ref-ci.txt
  fi
  echo "converting SmolLM2 to HF safetensors ($dtype)..." >&2
  "$venv/bin/python" scripts/convert_smollm2_hf.py "$out.tmp" --gguf "$dest/smollm2.gguf" --dtype "$dtype" --no-verify
  rm -rf "$out"
  mv "$out.tmp" "$out"
done
