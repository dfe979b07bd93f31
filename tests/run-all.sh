#!/usr/bin/env bash
# Runs every check and test of the workspace: formatting, lints, then all tests, among
# them the end-to-end and fault suites against a real kube-apiserver (each starts its own
# from ../shared/k8s), the traffic suite again in nftables mode, in a throwaway VM the
# ipvs mode, and last the project's images and chart in a real three-node cluster. This is README's test
# command: it installs what it needs first (tests/setup.sh), so it alone works on a fresh
# Debian machine, as root.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== setup"
df -h . | awk 'NR == 2 { print "disk: " $4 " free where this runs (a clean run writes about 2.5 GB into target/)" }'
bash tests/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== helm chart, and the image builder's reading of the Dockerfiles"
python3 tests/chart/test_chart.py
python3 tests/cluster/test_images.py
# The end-to-end and fault suites run the real binaries, which `cargo test` does not build.
echo "== cargo build --bins"
cargo build --workspace --bins --locked
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log" || status=$?
# The traffic suite runs in iptables mode above; nftables mode runs natively too.
echo "== cargo test: the traffic suite in nftables mode"
# (--workspace, not -p: the same feature set as above, so nothing is built twice.)
PROXYPLAN_TEST_MODE=nftables cargo test --locked --workspace --test traffic \
    -- --skip legacy_backend 2>&1 | tee -a "$log" || status=$?
# The ipvs mode needs a kernel with IPVS: the traffic suite (in ipvs mode), the ipvs
# kernel tests and `explain` in ipvs mode run inside the throwaway VM of ../shared/vm (one
# boot per test binary; the checkout is shared, for the binaries and examples they run).
echo "== cargo test in the VM (ipvs mode)"
vm=${PROXYPLAN_VM:-../shared/vm/run-in-vm.sh}
if [ ! -x "$vm" ]; then
    echo "FAILED: the VM harness $vm is missing (set PROXYPLAN_VM to run-in-vm.sh)" | tee -a "$log"
    status=1
else
    vm=$(cd "$(dirname "$vm")" && pwd)/$(basename "$vm")
    # The raw SCTP and TCP senders are python3 scripts: the guest gets Debian's python3
    # (the binary as python3, its libraries, and its standard library shared read-write).
    py=$(readlink -f /usr/bin/python3)
    python_in_vm="--bin $py --file $py:/opt/vm/bin/python3 --share /usr/lib/$(basename "$py")"
    VM_EXTRA_TOOLS="$(command -v socat) $(command -v ss)" \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$vm --env PROXYPLAN_TEST_MODE=ipvs $python_in_vm --share $PWD --timeout 1200 --runner" \
        cargo test --locked --workspace --test traffic --test ipvs_kernel --test explain_cli \
        -- --include-ignored --skip legacy_backend --test-threads 2 2>&1 | tee -a "$log" || status=$?
fi
# A real three-node cluster (../shared/k8s/cluster.sh): the images built from the
# Dockerfiles, the chart installed as helm does it, the upstream Services conformance specs
# in nftables and iptables mode, and upgrades, mode switches, failover, migration from
# kube-proxy and back, and uninstall, each under traffic (tests/cluster/cluster_test.py).
echo "== the cluster tests (3 nodes, chart-installed, conformance, operations under traffic)"
python3 tests/cluster/cluster_test.py 2>&1 | tee -a "$log" || status=$?
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
