#!/usr/bin/env bash
# The no-cluster demo: example cluster state -> proxyplan-controller plan -> the node's
# plan -> proxyplan-agent apply (the agent's default, --mode auto: nftables mode wherever
# the kernel takes it, iptables mode otherwise) inside a throwaway "node" network
# namespace -> real TCP traffic from "pods" and an off-cluster client to real backends.
#
# Run as root on Linux: bash examples/demo.sh
# Everything it creates (namespaces pp-demo-*, their interfaces, rules and servers) is
# removed on exit, also when interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "demo: run as root (it creates network namespaces)" >&2
    exit 1
fi
if ! command -v cargo >/dev/null; then
    echo "demo: needs a Rust toolchain (cargo) on PATH" >&2
    exit 1
fi
missing=()
for pair in ip:iproute2 iptables:iptables socat:socat conntrack:conntrack nft:nftables; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "== building proxyplan-controller and proxyplan-agent"
cargo build --quiet --locked -p proxyplan-controller -p proxyplan-agent
controller=$PWD/target/debug/proxyplan-controller
agent=$PWD/target/debug/proxyplan-agent
state=examples/cluster.yaml
# The agent's own default: --mode auto (nftables mode where the kernel takes it, else
# iptables mode), as a newcomer will run it. MODE=nftables, MODE=iptables or MODE=ipvs
# (needs IPVS and the dummy interface in the kernel) chooses.
MODE=${MODE:-auto}

tag="pp-demo-$$"
NODE="$tag-node" EXT="$tag-ext" POD1="$tag-a1" POD2="$tag-b1"
work=$(mktemp -d)
cleanup() {
    set +e
    for ns in "$POD1" "$POD2" "$EXT" "$NODE"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

echo "== network: node-a ($NODE, 10.10.0.1), an off-cluster client (10.10.0.100),"
echo "   pod web-1 on node-a (10.244.1.10) and pod web-2 'on node-b' (10.244.2.10)"
for ns in "$NODE" "$EXT" "$POD1" "$POD2"; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
nsx "$NODE" sysctl -qw net.ipv4.ip_forward=1
ip link add "${tag}e" netns "$NODE" type veth peer name eth0 netns "$EXT"
nsx "$NODE" ip addr add 10.10.0.1/24 dev "${tag}e"
nsx "$NODE" ip link set "${tag}e" up
nsx "$EXT" ip addr add 10.10.0.100/24 dev eth0
nsx "$EXT" ip link set eth0 up
nsx "$EXT" ip route add 10.96.0.0/12 via 10.10.0.1
nsx "$NODE" ip route add default via 10.10.0.100
add_pod() { # netns, address, veth name on the node
    ip link add "$3" netns "$NODE" type veth peer name eth0 netns "$1"
    nsx "$1" ip addr add "$2/32" dev eth0
    nsx "$1" ip link set eth0 up
    nsx "$1" ip route add 169.254.1.1 dev eth0
    nsx "$1" ip route add default via 169.254.1.1 dev eth0
    nsx "$NODE" ip link set "$3" up
    nsx "$NODE" ip route add "$2/32" dev "$3"
    # The pod's gateway 169.254.1.1 is the node's end of the veth (as Calico does it).
    nsx "$1" ip neigh add 169.254.1.1 lladdr "$(nsx "$NODE" cat "/sys/class/net/$3/address")" dev eth0 nud permanent
}
add_pod "$POD1" 10.244.1.10 "${tag}p1"
add_pod "$POD2" 10.244.2.10 "${tag}p2"
for pair in "$POD1:web-1" "$POD2:web-2"; do
    nsx "${pair%%:*}" socat TCP-LISTEN:8080,fork,reuseaddr \
        SYSTEM:"echo ${pair#*:} saw client \$SOCAT_PEERADDR" >/dev/null 2>&1 &
done

echo
echo "== proxyplan-controller plan --state $state --node node-a"
"$controller" plan --state "$state" --node node-a --cluster-cidr 10.244.0.0/16 > "$work/node-a.yaml"
"$agent" check --plan "$work/node-a.yaml"

echo
echo "== proxyplan-agent apply --mode $MODE --plan node-a.yaml   (inside $NODE)"
nsx "$NODE" "$agent" apply --mode "$MODE" --plan "$work/node-a.yaml" 2>&1 | tee "$work/apply.log"
# The mode the agent ran in (auto says which it chose).
ran=$(sed -n 's/.*(\([a-z]*\) mode).*/\1/p' "$work/apply.log" | tail -1)
case "$ran" in
    nftables)
        echo "   nftables mode: table ip proxyplan, $(nsx "$NODE" nft list table ip proxyplan | grep -c .) lines as nft lists it; its service map:"
        nsx "$NODE" nft list map ip proxyplan service-ips | sed -n '/elements/,/}/p' | sed 's/^/     /'
        ;;
    ipvs)
        echo "   IPVS virtual servers (ipvsadm -Ln):"
        command -v ipvsadm >/dev/null && nsx "$NODE" ipvsadm -Ln | sed -n '4,$p' | sed 's/^/     /'
        ;;
    *)
        echo "   $(nsx "$NODE" iptables-save | grep -c -- '-A PP-\|-A PROXYPLAN-') rules in chains PROXYPLAN-*/PP-*"
        ;;
esac

ask() { # netns, address, port -> the backend's answer, or what went wrong
    local out rc
    out=$(nsx "$1" timeout 3 socat -T2 - "TCP:$2:$3,connect-timeout=2" </dev/null 2>&1) && rc=0 || rc=$?
    if [ $rc -eq 0 ] && [ -n "$out" ]; then echo "$out"
    elif grep -qi refused <<<"$out"; then echo "REJECTED (connection refused)"
    else echo "no answer (dropped)"; fi
}
show() { # title, netns, address, port, count
    echo
    echo "-- $1"
    for _ in $(seq "$5"); do echo "   $(ask "$2" "$3" "$4")"; done | sort | uniq -c
}
show "pod web-1 -> demo/web ClusterIP 10.96.0.10:80 (balanced; pod source kept, except web-1 reaching itself: hairpin, masqueraded)" "$POD1" 10.96.0.10 80 8
show "off-cluster client -> demo/web ClusterIP (masqueraded: off-cluster source)" "$EXT" 10.96.0.10 80 4
show "off-cluster client -> demo/web-nodeport NodePort 10.10.0.1:30080 (Cluster policy: masqueraded)" "$EXT" 10.10.0.1 30080 4
show "off-cluster client -> demo/local-lb NodePort 30081 on node-a (ETP Local, no local endpoint: dropped)" "$EXT" 10.10.0.1 30081 1
show "pod web-1 -> demo/sticky 10.96.0.13:80 (ClientIP affinity: one backend)" "$POD1" 10.96.0.13 80 6
show "pod web-1 -> demo/empty 10.96.0.14:80 (no endpoints: REJECT)" "$POD1" 10.96.0.14 80 1

echo
echo "== the NodeProxyPlan node-a's agent applied"
awk '/^---/ {n++} n==1' "$work/node-a.yaml"
echo
echo "== proxyplan-agent cleanup   (inside $NODE: whatever every mode left)"
nsx "$NODE" "$agent" cleanup
echo "   left: $(nsx "$NODE" iptables-save | grep -c -- '-A PP-\|-A PROXYPLAN-' || true) rules in chains PROXYPLAN-*/PP-*, $(nsx "$NODE" nft list tables | grep -c proxyplan || true) proxyplan nf_tables tables"
