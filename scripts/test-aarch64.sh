#!/usr/bin/env bash
# The CPU backend's aarch64 paths (NEON), cross-built and run under qemu: the
# backend's unit and op tests for aarch64-unknown-linux-gnu, after the whole
# workspace's lints for that target. Needs the Rust target's standard library
# (rustup's aarch64-unknown-linux-gnu), and Debian's aarch64 linker and
# qemu-user, installed here with apt-get when missing (as the chat-page test's
# Chromium is). Adds the Rust target with rustup when missing; skips, saying
# so, where rustup cannot fetch it (no route to its download server).
set -euo pipefail
cd "$(dirname "$0")/.."
installed() { rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; }
if ! installed; then
    timeout 120 rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 || true
fi
if ! installed; then
    echo "aarch64 tests skipped: the Rust target aarch64-unknown-linux-gnu is not installed and rustup could not add it" >&2
    exit 0
fi
# Lints as on x86_64: code behind x86-only paths must not leave warnings here.
cargo clippy --release --target aarch64-unknown-linux-gnu --workspace --all-targets -- -D warnings
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    apt-get install -y -q qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo test --release --target aarch64-unknown-linux-gnu -p ferrite-backend --lib --test ops
