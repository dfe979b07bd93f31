#!/usr/bin/env bash
# Runs every check and test of the workspace: formatting, lints, then all tests.
# This is README's test command; .ci/run calls it after installing what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked --no-fail-fast
