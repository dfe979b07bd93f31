#!/usr/bin/env bash
# Installs what the test command needs on a fresh Debian machine, as root, and nothing
# that is already there: the kernel tools of the namespace tests, the traffic tools, etcd
# and openssl for the real control plane of ../shared/k8s, the Helm engine of the chart
# test, and the Rust components of the lint step. Idempotent; tests/run-all.sh runs it
# first, so README's test command alone works on a new machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

if ! command -v cargo >/dev/null; then
    echo "setup: cargo is not installed: this project needs a Rust toolchain (rustup) on PATH" >&2
    exit 1
fi
if command -v rustup >/dev/null; then
    for component in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$component" ||
            rustup component add "$component" >/dev/null
    done
fi

# command:package. iptables brings iptables-nft and iptables-legacy; faketime brings the
# library the fault suite steps one agent's wall clock with; etcd, openssl and
# xz are the control plane's (control-plane.sh would install them too, but one apt run
# is faster than two).
wanted=(iptables:iptables ipset:ipset conntrack:conntrack ip:iproute2 ss:iproute2
    curl:curl socat:socat etcd:etcd-server openssl:openssl xz:xz-utils python3:python3
    nft:nftables faketime:faketime)
missing=()
for pair in "${wanted[@]}"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing ${missing[*]}: run as root, or install them (apt-get install ${missing[*]})" >&2
        exit 1
    fi
    echo "== setup: installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# kubectl for the cluster tests (the upstream conformance specs run `kubectl exec`). This
# machine's image carries a current one; Debian's own is old (1.20) but does what the
# tests ask of it, so it is the fallback on a machine without one.
if ! command -v kubectl >/dev/null; then
    echo "== setup: no kubectl on PATH; installing Debian's kubernetes-client"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null
fi

# The Helm engine (offline render and lint, no helm binary) for the chart test.
if ! python3 -c 'import helm_python, yaml' 2>/dev/null; then
    echo "== setup: installing helm-python-sdk and pyyaml"
    python3 -m pip install --quiet helm-python-sdk pyyaml
fi
