#!/usr/bin/env bash
# Build ferrite, fetch the demo models and complete one prompt with SmolLM2.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ferrite-cli
scripts/fetch-models.sh
target/release/ferrite run smollm2 --prompt "${1:-Write a haiku about the sea.}" --max-tokens 64
