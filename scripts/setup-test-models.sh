#!/usr/bin/env bash
# Everything the test suite needs besides the Rust toolchain: the demo models
# (scripts/fetch-models.sh); a private virtualenv (.venv) with the packages
# pinned in scripts/requirements-ref-ci.txt (the server tests' openai and
# Playwright clients, and the conversion's readers); SmolLM2 converted to HF
# safetensors in F32 and BF16 (scripts/convert_smollm2_hf.py); and Chromium for
# the chat-page test (Debian's package, installed with apt-get when missing).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-models.sh
dest="${FERRITE_HOME:-$HOME/.ferrite}/models"
venv=".venv"
stamp="$venv/.requirements"
if ! cmp -s scripts/requirements-ref-ci.txt "$stamp"; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r scripts/requirements-ref-ci.txt
  cp scripts/requirements-ref-ci.txt "$stamp"
fi
if [ ! -x /usr/bin/chromium ]; then
  echo "installing Chromium for the chat-page test..." >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get install -y -q chromium >/dev/null || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium >/dev/null; }
fi
for dtype in f32 bf16; do
  out="$dest/smollm2-hf-$dtype"
  [ -e "$out/model.safetensors" ] && continue
  echo "converting SmolLM2 to HF safetensors ($dtype)..." >&2
  "$venv/bin/python" scripts/convert_smollm2_hf.py "$out.tmp" --gguf "$dest/smollm2.gguf" --dtype "$dtype" --no-verify
  rm -rf "$out"
  mv "$out.tmp" "$out"
done
