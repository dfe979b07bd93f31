#!/usr/bin/env bash
# Runs every check and test of the workspace: formatting, lints, then all tests.
# This is README's test command; .ci/run calls it after installing what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== helm chart"
python3 tests/chart/test_chart.py
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log" || status=$?
# One closing line for the whole run: the sum of every test binary's result line.
awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/) p += $i
            if ($(i+1) ~ /^failed/) f += $i
            if ($(i+1) ~ /^ignored/) s += $i
        }
     }
     END { printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
