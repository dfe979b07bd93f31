#!/usr/bin/env bash
# The no-cluster demo: example cluster state -> plans, exactly as each node's agent
# would receive them. (The agent half, kernel rules and real packets in throwaway
# network namespaces, joins this demo when the agent lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
    echo "demo: needs a Rust toolchain (cargo) on PATH" >&2
    exit 1
fi
echo "== building proxyplan-controller and proxyplan-agent"
cargo build --quiet --locked -p proxyplan-controller -p proxyplan-agent
controller=target/debug/proxyplan-controller
agent=target/debug/proxyplan-agent
state=examples/cluster.yaml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== cluster state: $state (2 nodes in 2 zones, 5 Services)"
for node in node-a node-b; do
    "$controller" plan --state "$state" --node "$node" --cluster-cidr 10.244.0.0/16 \
        --cluster-shards 1 --zone-shards 1 > "$work/$node.yaml"
    echo
    echo "== $node: what its agent programs (plan + shards merged, validated)"
    "$agent" check --plan "$work/$node.yaml"
done
echo
echo "== node-b's NodeProxyPlan itself (the shards are shared by every node)"
awk '/^---/ {n++} n==1' "$work/node-b.yaml"
echo
echo "Only node-b hosts an endpoint of demo/local-lb (externalTrafficPolicy: Local), so only"
echo "node-b's plan carries an overlay for it; node-a drops that external traffic (Drop)."
