#!/usr/bin/env python3
"""proxyplan in a real cluster, installed and operated the way an operator does it.

A three-node Kubernetes v1.36.2 cluster (../shared/k8s/cluster.sh, NODES=3: kubelets,
containerd, a CNI bridge, real pods) runs this, in order, with traffic flowing the whole
time (two clients, one on the pod network and one on the host network of node-1, opening
new TCP and UDP connections and holding long-lived ones, to a ClusterIP, a NodePort and an
externalTrafficPolicy: Local Service):

 1. kube-proxy v1.36.2 (iptables mode, its defaults) runs as a DaemonSet;
 2. migration to proxyplan, node by node, as README's guide says;
 3. the 15 upstream Services conformance specs, nftables mode;
 4. rolling updates of the agent DaemonSet and of the controller Deployment (new tags);
 5. controller failover: the leader's pod deleted while a Deployment rolls;
 6. mode switch nftables -> iptables (helm upgrade), conformance in iptables mode, and back;
 7. the way back to kube-proxy (nftables mode): kube-proxy installed, proxyplan
    uninstalled; the nodes must hold nothing of proxyplan's;
 8. migration from kube-proxy's nftables mode, node by node, then the way back to
    kube-proxy (iptables mode) and a last uninstall.

Every operation must show zero failed new connections and zero broken long-lived
connections. The images are built from the Dockerfiles without docker (images.py), the
chart is rendered by the Helm engine (helm-python-sdk) with its defaults plus the few
values this cluster needs, and applied as `helm install` would (CRDs, then objects;
hooks at uninstall). Prints one table per operation and a libtest-style result line.

Run as root from the repository root after `cargo build --workspace --bins`:
    python3 tests/cluster/cluster_test.py [--keep] [--only-install]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("PROXYPLAN_SHARED", ROOT.parent / "shared")).resolve()
K8S = SHARED / "k8s"
CHART = ROOT / "charts" / "proxyplan"
RELEASE = "proxyplan"
NAMESPACE = "kube-system"
POD_CIDR = "10.88.0.0/16"
REGISTRY = "proxyplan.test"
AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
TRAFFIC_NS = "pp-traffic"
HOST_REPORT_PORT = 18099
WAIT = 180.0
SERVICE_CIDR = "10.96.0.0/16"
NO_SERVICE_EGRESS_TABLE = "cluster-test-nosvc"
NO_SERVICE_EGRESS = f"""table ip {NO_SERVICE_EGRESS_TABLE} {{
    chain postrouting {{
        type filter hook postrouting priority 0; policy accept;
        ip daddr {SERVICE_CIDR} drop
    }}
}}
"""


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(argv: list[str], *, input: str | None = None, check: bool = True,
        timeout: float = 300, env: dict | None = None) -> str:
    result = subprocess.run(argv, input=input, capture_output=True, text=True,
                            timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}:\n"
                           f"{result.stdout[-2000:]}{result.stderr[-4000:]}")
    return result.stdout


def wait_until(what: str, check, timeout: float = WAIT, every: float = 0.5):
    """Calls check() until it returns something true; returns that. check may raise."""
    started = time.monotonic()
    last = None
    while time.monotonic() - started < timeout:
        try:
            value = check()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - reported if the wait times out
            last = err
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                       + (f" (last error: {last})" if last else ""))


# ---------------------------------------------------------------------------------------
# The cluster


@dataclass
class Node:
    name: str
    ip: str
    netns: str | None  # None: the host's namespace (node-1)
    containerd: Path

    def run(self, argv: list[str], check: bool = True) -> str:
        prefix = [] if self.netns is None else ["ip", "netns", "exec", self.netns]
        return run(prefix + argv, check=check)


class Cluster:
    def __init__(self, directory: Path, nodes: int) -> None:
        self.dir = directory
        self.count = nodes
        self.kubeconfig = directory / "kubeconfig"
        self.nodes: list[Node] = []

    def up(self) -> float:
        started = time.monotonic()
        env = dict(os.environ, NODES=str(self.count))
        run(["bash", str(K8S / "cluster.sh"), "up", str(self.dir)], env=env, timeout=600)
        info = dict(line.split("=", 1) for line in (self.dir / "node").read_text().split())
        self.node_ip = info["NODE_IP"]
        ports = dict(line.split("=", 1) for line in (self.dir / "ports").read_text().split())
        self.api_port = ports["apiserver"]
        self.nodes = [Node("node-1", self.node_ip, None,
                           self.dir / "containerd" / "containerd.sock")]
        for k in range(2, self.count + 1):
            self.nodes.append(Node(f"node-{k}", f"10.89.0.{k}", f"ppnode-{k}",
                                   self.dir / f"node-{k}" / "containerd" / "containerd.sock"))
        # Service addresses that no proxy translated go nowhere, as behind a real router
        # (cluster.sh drops them for node-2..N; node-1 is this machine, whose default
        # gateway answers any address): kube-proxy's iptables mode, and ours, route an
        # unused port of a cluster IP on, and the conformance spec "same port and
        # different protocols" expects no answer there.
        run(["nft", "-f", "-"], input=NO_SERVICE_EGRESS)
        return time.monotonic() - started

    def down(self) -> None:
        run(["bash", str(K8S / "cluster.sh"), "down", str(self.dir)], check=False, timeout=300)
        run(["nft", "delete", "table", "ip", NO_SERVICE_EGRESS_TABLE], check=False)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 300) -> str:
        return run(["kubectl", f"--kubeconfig={self.kubeconfig}", *args], input=input,
                   check=check, timeout=timeout)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, objects: list[dict], manager: str = "helm") -> None:
        if objects:
            text = yaml.safe_dump_all(objects)
            self.kubectl("apply", "--server-side", "--force-conflicts",
                         f"--field-manager={manager}", "-f", "-", input=text)

    def import_image(self, tarball: Path) -> None:
        for node in self.nodes:
            run(["ctr", "--address", str(node.containerd), "-n", "k8s.io", "images",
                 "import", str(tarball)], timeout=600)


# ---------------------------------------------------------------------------------------
# Images


def build_images(work: Path) -> dict[str, Path]:
    """The project's images from its Dockerfiles (dev profile: target/debug), two tags of
    each for the rolling updates, plus kube-proxy's and the traffic client's."""
    images = ROOT / "tests" / "cluster" / "images.py"
    binaries = ROOT / "target" / "debug"
    kube_proxy_dir = work / "kube-proxy-bin"
    kube_proxy_dir.mkdir(parents=True, exist_ok=True)
    kube_proxy = kube_proxy_dir / "kube-proxy"
    if not kube_proxy.exists():
        with open(kube_proxy, "wb") as out:
            subprocess.run(["xz", "-dc", str(K8S / "kube-proxy-v1.36.2.xz")], stdout=out,
                           check=True)
        kube_proxy.chmod(0o755)
    plans = {
        "agent": ("Dockerfile.agent", binaries, ["proxyplan-agent:1", "proxyplan-agent:2"]),
        "controller": ("Dockerfile.controller", binaries,
                       ["proxyplan-controller:1", "proxyplan-controller:2"]),
        "traffic": ("tests/cluster/Dockerfile.traffic", binaries, ["proxyplan-traffic:1"]),
        "kube-proxy": ("tests/cluster/Dockerfile.kube-proxy", kube_proxy_dir,
                       ["kube-proxy:v1.36.2"]),
    }
    out = {}
    for name, (dockerfile, bins, tags) in plans.items():
        tarball = work / f"{name}.tar"
        argv = [sys.executable, str(images), "--dockerfile", str(ROOT / dockerfile),
                "--binaries", str(bins), "--out", str(tarball)]
        if name in ("agent", "controller"):
            # the Dockerfiles' build argument for what cargo built here: target/debug
            argv += ["--build-arg", "CARGO_PROFILE=dev"]
        for tag in tags:
            argv += ["--tag", f"{REGISTRY}/{tag}"]
        run(argv, timeout=1200)
        out[name] = tarball
    return out


# ---------------------------------------------------------------------------------------
# The chart, installed as helm does it


HOOK = "helm.sh/hook"
# Helm's install order by kind (pkg/releaseutil/kind_sorter.go), the parts the chart uses.
INSTALL_ORDER = ["Namespace", "ServiceAccount", "ConfigMap", "ClusterRole",
                 "ClusterRoleBinding", "Role", "RoleBinding", "Service", "DaemonSet",
                 "Deployment", "Job", "PodDisruptionBudget", "ValidatingAdmissionPolicy",
                 "ValidatingAdmissionPolicyBinding"]


def kind_rank(obj: dict) -> int:
    kind = obj["kind"]
    return INSTALL_ORDER.index(kind) if kind in INSTALL_ORDER else len(INSTALL_ORDER)


def key(obj: dict) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


class Release:
    """`helm install/upgrade/uninstall` of the chart: the Helm engine renders, kubectl
    applies (server-side), hooks run at uninstall as Helm runs them."""

    def __init__(self, cluster: Cluster, base_values: dict) -> None:
        self.cluster = cluster
        self.base = base_values
        self.objects: list[dict] = []
        self.values: dict = {}

    def render(self, values: dict) -> tuple[list[dict], list[dict]]:
        with helm.Chart.load(CHART) as chart:
            chart.validate_schema(values)
            manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE,
                                     is_install=not self.objects)
        objects, hooks = [], []
        for path, text in sorted(manifests.items()):
            if path.endswith("NOTES.txt"):
                continue
            for doc in yaml.safe_load_all(text):
                if not doc:
                    continue
                doc["metadata"].setdefault("namespace", NAMESPACE) if doc["kind"] not in (
                    "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding") else None
                (hooks if HOOK in doc["metadata"].get("annotations", {}) else objects).append(doc)
        return objects, hooks

    def crds(self) -> list[dict]:
        with helm.Chart.load(CHART) as chart:
            return [yaml.safe_load(c["data"]) for c in chart.crds]

    def install(self, values: dict) -> None:
        values = merge(self.base, values)
        self.cluster.apply(self.crds())
        for crd in self.crds():
            self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                                 f"crd/{crd['metadata']['name']}")
        objects, _ = self.render(values)
        self.cluster.apply(sorted(objects, key=kind_rank))
        self.objects, self.values = objects, values

    def upgrade(self, values: dict) -> None:
        values = merge(self.values, values)
        objects, _ = self.render(values)
        self.cluster.apply(sorted(objects, key=kind_rank))
        gone = {key(o) for o in self.objects} - {key(o) for o in objects}
        for kind, namespace, name in gone:
            self.cluster.kubectl("delete", kind, name, *(["-n", namespace] if namespace else []),
                                 "--ignore-not-found")
        self.objects, self.values = objects, values

    def uninstall(self) -> None:
        _, hooks = self.render(self.values)
        pre_delete = [h for h in hooks if "pre-delete" in h["metadata"]["annotations"][HOOK]]
        pre_delete.sort(key=lambda h: (int(h["metadata"]["annotations"].get(
            "helm.sh/hook-weight", "0")), kind_rank(h)))
        for hook in pre_delete:
            self.cluster.apply([hook])
            if hook["kind"] == "Job":
                name = hook["metadata"]["name"]
                self.cluster.kubectl("wait", "-n", NAMESPACE, "--for=condition=Complete",
                                     "--timeout=180s", f"job/{name}", timeout=200)
        for hook in reversed(pre_delete):  # hook-succeeded
            self.cluster.kubectl("delete", hook["kind"], hook["metadata"]["name"], "-n",
                                 NAMESPACE, "--ignore-not-found", "--wait=false")
        for obj in sorted(self.objects, key=kind_rank, reverse=True):
            kind, namespace, name = key(obj)
            self.cluster.kubectl("delete", kind, name, *(["-n", namespace] if namespace else []),
                                 "--ignore-not-found", "--wait=false")
        self.objects = []


def merge(base: dict, extra: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


# ---------------------------------------------------------------------------------------
# kube-proxy, as a DaemonSet (kubeadm's shape)


class KubeProxy:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.template = (ROOT / "tests" / "cluster" / "kube-proxy.yaml.tmpl").read_text()

    def objects(self, mode: str) -> list[dict]:
        text = self.template
        for name, value in {"MODE": mode, "CLUSTER_CIDR": POD_CIDR,
                            "API_HOST": self.cluster.node_ip,
                            "API_PORT": self.cluster.api_port,
                            "IMAGE": f"{REGISTRY}/kube-proxy:v1.36.2"}.items():
            text = text.replace("${" + name + "}", value)
        return [o for o in yaml.safe_load_all(text) if o]

    def leave_labelled_nodes(self) -> None:
        """README's migration guide, step 1, as written there."""
        patch = {"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "proxyplan.dev/kube-proxy", "operator": "NotIn",
                                       "values": ["removed"]}]}]}}}}}}}
        self.cluster.kubectl("-n", "kube-system", "patch", "daemonset", "kube-proxy",
                             "--type", "merge", "-p", json.dumps(patch))
        self.cluster.kubectl("-n", "kube-system", "rollout", "status", "daemonset/kube-proxy",
                             "--timeout=180s", timeout=200)

    def install(self, mode: str) -> None:
        self.cluster.apply(self.objects(mode), manager="kubectl")

    def delete(self) -> None:
        self.cluster.kubectl("-n", "kube-system", "delete", "daemonset", "kube-proxy",
                             "--ignore-not-found", "--wait=true", timeout=200)

    def pods(self) -> dict[str, str]:
        pods = self.cluster.get("pods", "-n", "kube-system", "-l", "k8s-app=kube-proxy")
        return {p["spec"].get("nodeName", ""): p["metadata"]["name"] for p in pods["items"]}

    def cleanup_pod(self, node: str) -> dict:
        """`kube-proxy --cleanup` on `node`, as a pod with the kube-proxy image."""
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"kube-proxy-cleanup-{node}", "namespace": "kube-system"},
            "spec": {
                "nodeName": node, "hostNetwork": True, "restartPolicy": "Never",
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": "cleanup", "image": f"{REGISTRY}/kube-proxy:v1.36.2",
                    "imagePullPolicy": "Never",
                    "command": ["/usr/local/bin/kube-proxy", "--cleanup"],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
                                     {"name": "lib-modules", "mountPath": "/lib/modules",
                                      "readOnly": True}]}],
                "volumes": [{"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock",
                                                                  "type": "FileOrCreate"}},
                            {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}}]}}

    def cleanup(self, node: str) -> None:
        pod = self.cleanup_pod(node)
        name = pod["metadata"]["name"]
        self.cluster.kubectl("-n", "kube-system", "delete", "pod", name, "--ignore-not-found")
        self.cluster.apply([pod], manager="kubectl")
        wait_until(f"kube-proxy --cleanup on {node}", lambda: self.cluster.get(
            "pod", "-n", "kube-system", name)["status"].get("phase") in ("Succeeded", "Failed"))
        phase = self.cluster.get("pod", "-n", "kube-system", name)["status"]["phase"]
        output = self.cluster.kubectl("-n", "kube-system", "logs", name, check=False)
        self.cluster.kubectl("-n", "kube-system", "delete", "pod", name, "--wait=false")
        if phase != "Succeeded":
            raise RuntimeError(f"kube-proxy --cleanup on {node}: {phase}\n{output[-2000:]}")


# ---------------------------------------------------------------------------------------
# What a node's kernel holds


def kernel(node: Node) -> dict:
    """What `node`'s kernel holds of either proxy. Every read must succeed: an empty
    answer from a tool that failed would pass for a clean node."""
    nft = node.run(["nft", "list", "tables"]).split("\n")
    tables = sorted(" ".join(line.split()[1:]) for line in nft if line.startswith("table"))
    chains = {"PROXYPLAN": 0, "KUBE-proxy": 0}
    for save in ("iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save",
                 "ip6tables-legacy-save"):
        for line in node.run([save]).splitlines():
            if line.startswith(":PROXYPLAN-") or line.startswith(":PP-"):
                chains["PROXYPLAN"] += 1
            elif line.startswith(":KUBE-") and not line.startswith(
                    (":KUBE-FIREWALL", ":KUBE-KUBELET-CANARY", ":KUBE-IPTABLES-HINT")):
                # kubelet's own chains stay; everything else KUBE- is kube-proxy's
                chains["KUBE-proxy"] += 1
    sets = [name for name in node.run(["ipset", "list", "-n"]).split()
            if name.startswith(("PROXYPLAN", "KUBE-"))]
    links = [name for name in ("proxyplan-ipvs0", "kube-ipvs0")
             if node.run(["ip", "link", "show", name], check=False).strip()]
    state = Path("/run/proxyplan") / node.name
    return {"nft tables": [t for t in tables if "proxyplan" in t or "kube-proxy" in t],
            "PROXYPLAN chains": chains["PROXYPLAN"], "KUBE chains": chains["KUBE-proxy"],
            "links": links, "ipsets": sets, "state dir": sorted(os.listdir(state)) if state.exists() else None}


def kernel_text(k: dict) -> str:
    parts = []
    if k["nft tables"]:
        parts.append("nft " + ",".join(k["nft tables"]))
    if k["PROXYPLAN chains"]:
        parts.append(f"{k['PROXYPLAN chains']} PROXYPLAN chains")
    if k["KUBE chains"]:
        parts.append(f"{k['KUBE chains']} KUBE-* chains")
    if k["links"]:
        parts.append("links " + ",".join(k["links"]))
    if k["ipsets"]:
        parts.append(f"{len(k['ipsets'])} ipsets")
    if k["state dir"] is not None:
        parts.append(f"state {len(k['state dir'])} file(s)")
    return "; ".join(parts) or "nothing"


def holds_nothing_of_proxyplan(k: dict) -> bool:
    return (not [t for t in k["nft tables"] if "proxyplan" in t] and k["PROXYPLAN chains"] == 0
            and "proxyplan-ipvs0" not in k["links"] and k["state dir"] is None
            and not [s for s in k["ipsets"] if s.startswith("PROXYPLAN")])


# ---------------------------------------------------------------------------------------
# Traffic


@dataclass
class Counts:
    attempted: int = 0
    failed: int = 0
    retried: int = 0  # UDP answered only when sent again on the same flow
    held: int = 0
    broken: int = 0
    failures: list[str] = field(default_factory=list)


class Traffic:
    """Backends (a DaemonSet `echo` that never churns, a Deployment `web` that does) and
    two clients (pod network and host network of node-1) running proxyplan-traffic."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def deploy(self) -> None:
        c = self.cluster
        c.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAFFIC_NS}}],
                manager="kubectl")
        netexec = {
            "name": "netexec", "image": AGNHOST, "imagePullPolicy": "IfNotPresent",
            "args": ["netexec", "--http-port=8080", "--udp-port=8081",
                     "--delay-shutdown=15"],
            "ports": [{"containerPort": 8080}, {"containerPort": 8081, "protocol": "UDP"}],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        }
        pod_spec = {"containers": [netexec], "terminationGracePeriodSeconds": 30,
                    "tolerations": [{"operator": "Exists"}]}
        objects = [
            {"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": "echo", "namespace": TRAFFIC_NS},
             "spec": {"selector": {"matchLabels": {"app": "echo"}},
                      "template": {"metadata": {"labels": {"app": "echo"}}, "spec": pod_spec}}},
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "web", "namespace": TRAFFIC_NS},
             "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                      "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                      "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}}},
            service("echo", "echo", "ClusterIP", udp=True),
            service("echo-np", "echo", "NodePort"),
            service("echo-local", "echo", "NodePort", local=True),
            service("web", "web", "ClusterIP", udp=True),
        ]
        c.apply(objects, manager="kubectl")
        for kind, name in (("daemonset", "echo"), ("deployment", "web")):
            c.kubectl("-n", TRAFFIC_NS, "rollout", "status", f"{kind}/{name}",
                      "--timeout=180s", timeout=200)
        svc = {s["metadata"]["name"]: s for s in c.get("services", "-n", TRAFFIC_NS)["items"]}
        echo_ip, web_ip = svc["echo"]["spec"]["clusterIP"], svc["web"]["spec"]["clusterIP"]
        np = svc["echo-np"]["spec"]["ports"][0]["nodePort"]
        lp = svc["echo-local"]["spec"]["ports"][0]["nodePort"]
        node2, node3 = c.nodes[1].ip, c.nodes[2].ip
        pod_args = ["--tcp", f"echo={echo_ip}:80", "--udp", f"echo-udp={echo_ip}:81",
                    "--tcp", f"web={web_ip}:80", "--udp", f"web-udp={web_ip}:81",
                    "--tcp", f"nodeport={node2}:{np}", "--tcp", f"local={node2}:{lp}",
                    "--hold", f"echo={echo_ip}:80:3", "--hold", f"nodeport={node3}:{np}:2",
                    "--interval", "50ms"]
        host_args = ["--tcp", f"echo={echo_ip}:80", "--tcp", f"nodeport={node3}:{np}",
                     "--tcp", f"local={node2}:{lp}", "--udp", f"echo-udp={echo_ip}:81",
                     "--hold", f"local={node2}:{lp}:2", "--hold", f"echo={echo_ip}:80:2",
                     "--interval", "50ms", "--report", f"0.0.0.0:{HOST_REPORT_PORT}"]
        clients = [client("client", pod_args, host_network=False),
                   client("client-host", host_args, host_network=True)]
        c.apply(clients, manager="kubectl")
        for name in ("client", "client-host"):
            c.kubectl("-n", TRAFFIC_NS, "wait", "--for=condition=Ready", f"pod/{name}",
                      "--timeout=120s", timeout=150)
        self.client_ip = c.get("pod", "-n", TRAFFIC_NS, "client")["status"]["podIP"]

    def report(self, host: bool) -> dict:
        url = (f"http://127.0.0.1:{HOST_REPORT_PORT}/" if host
               else f"http://{self.client_ip}:8099/")
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())

    def snapshot(self) -> dict:
        return {"pod": self.report(False), "host": self.report(True)}

    @staticmethod
    def idle_targets(before: dict, after: dict) -> list[str]:
        """Targets that saw no attempt (or long-lived connections no request) between two
        snapshots: a client that stopped counting proves nothing."""
        idle = []
        for side in ("pod", "host"):
            a, b = before[side], after[side]
            for kind in ("tcp", "udp"):
                for name, c in b[kind].items():
                    if c["attempts"] == a[kind][name]["attempts"]:
                        idle.append(f"{side} {kind} {name}")
            for name, h in b["hold"].items():
                if h["requests"] == a["hold"][name]["requests"]:
                    idle.append(f"{side} hold {name}")
        return idle

    @staticmethod
    def between(before: dict, after: dict) -> Counts:
        counts = Counts()
        for side in ("pod", "host"):
            a, b = before[side], after[side]
            for kind in ("tcp", "udp"):
                for name, c in b[kind].items():
                    counts.attempted += c["attempts"] - a[kind][name]["attempts"]
                    counts.failed += c["failures"] - a[kind][name]["failures"]
                    counts.retried += c.get("retried", 0) - a[kind][name].get("retried", 0)
            for name, h in b["hold"].items():
                counts.held += h["requests"] - a["hold"][name]["requests"]
                counts.broken += h["broken"] - a["hold"][name]["broken"]
                counts.broken += h["open_failures"] - a["hold"][name]["open_failures"]
            new = [f for f in b["failures"] if f not in a["failures"]
                   and "answered the second time" not in f]
            counts.failures += [f"{side}: {f}" for f in new]
        return counts


def service(name: str, app: str, kind: str, udp: bool = False, local: bool = False) -> dict:
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    if udp:
        ports.append({"name": "udp", "port": 81, "targetPort": 8081, "protocol": "UDP"})
    spec = {"type": kind, "selector": {"app": app}, "ports": ports}
    if local:
        spec["externalTrafficPolicy"] = "Local"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": TRAFFIC_NS}, "spec": spec}


def client(name: str, args: list[str], host_network: bool) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TRAFFIC_NS},
            "spec": {"nodeName": "node-1", "hostNetwork": host_network,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "traffic",
                                     "image": f"{REGISTRY}/proxyplan-traffic:1",
                                     "imagePullPolicy": "Never", "args": args}]}}


# ---------------------------------------------------------------------------------------
# The scenario


@dataclass
class Row:
    operation: str
    counts: Counts
    ready_seconds: float | None
    before: str
    after: str
    took: float
    problems: list[str] = field(default_factory=list)


class Scenario:
    def __init__(self, cluster: Cluster, images: dict[str, Path]) -> None:
        self.cluster = cluster
        self.images = images
        c = cluster
        self.release = Release(c, {
            # the few values this cluster needs: its pod CIDR, the API server's address
            # (no Service VIP works before the proxy does), the images it imported
            # rolloutSlowAfter: a stopped agent is named within the kubelet's liveness
            # budget (3 x 10 s), before it restarts the agent
            "controller": {"clusterCIDRs": [POD_CIDR], "rolloutSlowAfter": "5s",
                           "image": {"repository": f"{REGISTRY}/proxyplan-controller",
                                     "tag": "1", "pullPolicy": "Never"}},
            "agent": {"image": {"repository": f"{REGISTRY}/proxyplan-agent", "tag": "1",
                                "pullPolicy": "Never"}},
            "apiServer": {"host": c.node_ip, "port": c.api_port},
        })
        self.kube_proxy = KubeProxy(c)
        self.traffic = Traffic(c)
        self.rows: list[Row] = []
        self.conformance: list[tuple[str, str]] = []
        self.failures: list[str] = []

    # -- waiting for the proxy ---------------------------------------------------------

    def plans_ready(self, mode: str | None = None, since: float | None = None) -> bool:
        plans = self.cluster.get("nodeproxyplans")["items"]
        names = {p["metadata"]["name"] for p in plans}
        if names != {n.name for n in self.cluster.nodes}:
            return False
        for plan in plans:
            status = plan.get("status") or {}
            ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
            if not ready or ready["status"] != "True":
                return False
            if status.get("appliedRevision") != plan["spec"].get("revision"):
                return False
            if mode and status.get("mode") != mode:
                return False
        return True

    def wait_ready(self, mode: str | None = None) -> float:
        started = time.monotonic()
        wait_until(f"every node plan Ready{f' in {mode} mode' if mode else ''}",
                   lambda: self.plans_ready(mode))
        return time.monotonic() - started

    def rollout(self, kind: str, name: str) -> None:
        self.cluster.kubectl("-n", NAMESPACE, "rollout", "status", f"{kind}/{name}",
                             "--timeout=300s", timeout=320)

    def kernels(self) -> dict[str, dict]:
        return {n.name: kernel(n) for n in self.cluster.nodes}

    @staticmethod
    def kernels_text(k: dict[str, dict]) -> str:
        texts = {kernel_text(v) for v in k.values()}
        if len(texts) == 1:
            return f"every node: {texts.pop()}"
        return "; ".join(f"{n}: {kernel_text(v)}" for n, v in k.items())

    def kube_proxy_programmed(self, node: Node, mode: str) -> bool:
        """Whether kube-proxy's rules on `node` cover every traffic Service."""
        ips = [s["spec"]["clusterIP"] for s in
               self.cluster.get("services", "-n", TRAFFIC_NS)["items"]]
        if mode == "nftables":
            text = node.run(["nft", "list", "map", "ip", "kube-proxy", "service-ips"],
                            check=False)
        else:
            text = node.run(["iptables-save", "-t", "nat"], check=False)
        return all(ip in text for ip in ips)

    # -- one measured operation --------------------------------------------------------

    def operation(self, name: str, action, ready_mode: str | None = "any",
                  settle: float = 5.0, check_after=None) -> Row:
        log(f"== {name}")
        before_kernel = self.kernels()
        before = self.traffic.snapshot()
        started = time.monotonic()
        problems = []
        ready = None
        try:
            action()
            if ready_mode is not None:
                # from the start of the operation to every node plan Ready again
                self.wait_ready(None if ready_mode == "any" else ready_mode)
                ready = time.monotonic() - started
        except Exception as err:  # noqa: BLE001
            problems.append(f"{name}: {err}")
        time.sleep(settle)
        after = self.traffic.snapshot()
        after_kernel = self.kernels()
        took = time.monotonic() - started
        counts = Traffic.between(before, after)
        if counts.failed:
            problems.append(f"{name}: {counts.failed} of {counts.attempted} new connections "
                            f"failed: {counts.failures[:10]}")
        if counts.broken:
            problems.append(f"{name}: {counts.broken} long-lived connection(s) broke: "
                            f"{counts.failures[:10]}")
        idle = Traffic.idle_targets(before, after)
        if idle:
            problems.append(f"{name}: no traffic flowed to {idle}")
        if check_after:
            try:
                check_after(after_kernel)
            except AssertionError as err:
                problems.append(f"{name}: {err}")
        row = Row(name, counts, ready, self.kernels_text(before_kernel),
                  self.kernels_text(after_kernel), took, problems)
        self.rows.append(row)
        self.failures += problems
        log(f"   {counts.attempted} new connections, {counts.failed} failed "
            f"({counts.retried} UDP answered on the retry); "
            f"{counts.held} requests on long-lived connections, {counts.broken} broken; "
            f"ready {'-' if ready is None else f'{ready:.1f} s'}; took {took:.1f} s")
        for p in problems:
            log(f"   PROBLEM {p}")
        return row

    # -- the guide's steps --------------------------------------------------------------

    def migrate_from_kube_proxy(self, kube_proxy_mode: str) -> None:
        """README's migration guide: install proxyplan beside kube-proxy, wait for every
        plan Ready, then node by node: stop kube-proxy there and clean up after it."""
        self.kube_proxy.leave_labelled_nodes()
        self.release.install({})
        self.wait_ready()
        for node in self.cluster.nodes:
            self.cluster.kubectl("label", "node", node.name, "proxyplan.dev/kube-proxy=removed",
                                 "--overwrite")
            wait_until(f"kube-proxy gone from {node.name}",
                       lambda: node.name not in self.kube_proxy.pods())
            self.kube_proxy.cleanup(node.name)
        self.kube_proxy.delete()

    def back_to_kube_proxy(self, kube_proxy_mode: str) -> None:
        """README's way back: kube-proxy installed and programmed on every node, then
        helm uninstall (the agents remove their rules as they go)."""
        for node in self.cluster.nodes:
            self.cluster.kubectl("label", "node", node.name, "proxyplan.dev/kube-proxy-")
        self.kube_proxy.install(kube_proxy_mode)
        for node in self.cluster.nodes:
            wait_until(f"kube-proxy ({kube_proxy_mode}) programming {node.name}",
                       lambda: self.kube_proxy_programmed(node, kube_proxy_mode))
        self.release.uninstall()
        wait_until("the agents gone", lambda: not self.cluster.get(
            "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=proxyplan")["items"])

    def nothing_of_proxyplan_left(self, kernels: dict[str, dict]) -> None:
        left = {n: kernel_text(k) for n, k in kernels.items() if not holds_nothing_of_proxyplan(k)}
        assert not left, f"proxyplan left something behind: {left}"

    def no_kube_proxy_left(self, kernels: dict[str, dict]) -> None:
        left = {n: kernel_text(k) for n, k in kernels.items()
                if k["KUBE chains"] or [t for t in k["nft tables"] if "kube-proxy" in t]}
        assert not left, f"kube-proxy's rules are still there after --cleanup: {left}"

    def leader_pod(self) -> str:
        lease = self.cluster.get("lease", "-n", NAMESPACE, "proxyplan-controller")
        return lease["spec"]["holderIdentity"]

    def failover(self) -> None:
        leader = self.leader_pod()
        self.cluster.kubectl("-n", TRAFFIC_NS, "rollout", "restart", "deployment/web")
        time.sleep(1)
        self.cluster.kubectl("-n", NAMESPACE, "delete", "pod", leader, "--wait=false")
        wait_until("another controller to lead", lambda: self.leader_pod() not in ("", leader))
        self.cluster.kubectl("-n", TRAFFIC_NS, "rollout", "status", "deployment/web",
                             "--timeout=180s", timeout=200)
        # the last endpoint change reaches every node
        time.sleep(3)

    def agent_pid(self, node: str) -> int:
        """The host PID of the agent serving `node` (its command line names the node)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv]
            if (words and words[0].endswith("proxyplan-agent") and "run" in words
                    and f"--node={node}" in words):
                return int(entry.name)
        raise RuntimeError(f"no proxyplan-agent process for node {node}")

    def rollout_with_a_stopped_agent(self) -> None:
        """One agent stopped (SIGSTOP), a Service changes: `kubectl get
        serviceproxyplans` says 2/3 and names that node; 3/3 once it runs again."""
        c = self.cluster
        node = c.nodes[-1].name
        name = "pp-rollout-probe"
        slice_of = lambda addresses: json.dumps({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-1", "namespace": TRAFFIC_NS,
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}}
                          for a in addresses]})
        c.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": TRAFFIC_NS},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
        c.kubectl("apply", "-f", "-", input=slice_of(["10.99.0.1"]))

        def rollout() -> dict:
            plan = c.get("serviceproxyplans", "-n", TRAFFIC_NS, name)
            r = (plan.get("status") or {}).get("rollout") or {}
            return r if r.get("revision") == plan["spec"]["revision"] else {}

        pid = self.agent_pid(node)
        os.kill(pid, signal.SIGSTOP)
        try:
            c.kubectl("apply", "-f", "-", input=slice_of(["10.99.0.1", "10.99.0.2"]))
            stopped = time.monotonic()
            wait_until(f"{name}'s rollout to name {node}",
                       lambda: rollout().get("slowest") == node, timeout=25)
            named = time.monotonic() - stopped
            shown = c.kubectl("get", "serviceproxyplans", "-n", TRAFFIC_NS, name)
            log(f"   kubectl get serviceproxyplans {name}, {named:.1f} s after the change:\n"
                + "\n".join(f"     {line}" for line in shown.splitlines()))
            row = shown.splitlines()[-1].split()
            total = len(c.nodes)
            assert f"{total - 1}/{total}" in row and node in row, \
                f"expected {total - 1}/{total} and {node}: {shown}"
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        wait_until(f"{name}'s rollout complete",
                   lambda: rollout().get("progress") == f"{len(c.nodes)}/{len(c.nodes)}")
        log(f"   {len(c.nodes)}/{len(c.nodes)} {time.monotonic() - resumed:.1f} s after SIGCONT")
        c.kubectl("delete", "service", "-n", TRAFFIC_NS, name)
        c.kubectl("delete", "endpointslice", "-n", TRAFFIC_NS, f"{name}-1")

    def run_conformance(self, mode: str) -> None:
        log(f"== conformance, {mode} mode")
        self.wait_ready(mode)  # the mode really running on every node
        out = Path(tempfile.gettempdir()) / f"proxyplan-conformance-{mode}"
        before = self.traffic.snapshot()
        started = time.monotonic()
        result = subprocess.run(["bash", str(K8S / "e2e-services.sh"),
                                 str(self.cluster.kubeconfig), str(out)],
                                capture_output=True, text=True, timeout=1800)
        after = self.traffic.snapshot()
        summary = result.stdout.strip()
        print(summary, flush=True)
        self.conformance.append((mode, summary))
        last = summary.splitlines()[-1] if summary else "no result"
        if result.returncode != 0 or not last.endswith("15 passed, 0 failed"):
            self.failures.append(f"conformance ({mode} mode): {last}\n{result.stderr[-2000:]}")
        counts = Traffic.between(before, after)
        idle = Traffic.idle_targets(before, after)
        if idle:
            self.failures.append(f"traffic during conformance ({mode}): none to {idle}")
        self.rows.append(Row(f"conformance specs, {mode} mode (traffic throughout)", counts,
                             None, "-", "-", time.monotonic() - started))
        if counts.failed or counts.broken:
            self.failures.append(f"traffic during conformance ({mode}): {counts.failed} failed, "
                                 f"{counts.broken} broken: {counts.failures[:10]}")

    def run(self) -> None:
        c = self.cluster
        log("kube-proxy (iptables mode) installed; traffic starts")
        self.kube_proxy.install("iptables")
        self.traffic.deploy()
        for node in c.nodes:
            wait_until(f"kube-proxy programming {node.name}",
                       lambda: self.kube_proxy_programmed(node, "iptables"))
        self.operation("baseline: kube-proxy iptables mode, nothing changes",
                       lambda: time.sleep(5), ready_mode=None)
        self.operation("migration from kube-proxy (iptables mode), node by node",
                       lambda: self.migrate_from_kube_proxy("iptables"),
                       check_after=self.no_kube_proxy_left)
        self.run_conformance("nftables")
        self.operation("rolling update of the agent DaemonSet (tag 1 -> 2)", lambda: (
            self.release.upgrade({"agent": {"image": {"tag": "2"}}}),
            self.rollout("daemonset", "proxyplan-agent")))
        self.operation("rolling update of the controller Deployment (tag 1 -> 2)", lambda: (
            self.release.upgrade({"controller": {"image": {"tag": "2"}}}),
            self.rollout("deployment", "proxyplan-controller")))
        self.operation("controller failover: leader pod deleted while web rolls",
                       self.failover)
        self.operation("one agent stopped (SIGSTOP) while a Service changes: "
                       "kubectl get serviceproxyplans names it",
                       self.rollout_with_a_stopped_agent)
        self.operation("mode switch nftables -> iptables (helm upgrade agent.mode=iptables)",
                       lambda: (self.release.upgrade({"agent": {"mode": "iptables"}}),
                                self.rollout("daemonset", "proxyplan-agent")),
                       ready_mode="iptables")
        self.run_conformance("iptables")
        self.operation("mode switch iptables -> nftables (helm upgrade agent.mode=nftables)",
                       lambda: (self.release.upgrade({"agent": {"mode": "nftables"}}),
                                self.rollout("daemonset", "proxyplan-agent")),
                       ready_mode="nftables")
        self.operation("the way back to kube-proxy (nftables mode): helm uninstall",
                       lambda: self.back_to_kube_proxy("nftables"), ready_mode=None,
                       check_after=self.nothing_of_proxyplan_left)
        self.operation("migration from kube-proxy (nftables mode), node by node",
                       lambda: self.migrate_from_kube_proxy("nftables"),
                       check_after=self.no_kube_proxy_left)
        self.operation("the way back to kube-proxy (iptables mode): helm uninstall",
                       lambda: self.back_to_kube_proxy("iptables"), ready_mode=None,
                       check_after=self.nothing_of_proxyplan_left)

    def print_tables(self) -> None:
        print("\n| operation | new connections attempted | failed | UDP answered on the retry "
              "| long-lived requests | long-lived broken | every plan Ready after | took | "
              "kernel before | kernel after |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in self.rows:
            ready = "-" if r.ready_seconds is None else f"{r.ready_seconds:.1f} s"
            print(f"| {r.operation} | {r.counts.attempted} | {r.counts.failed} | "
                  f"{r.counts.retried} | {r.counts.held} | {r.counts.broken} | {ready} | "
                  f"{r.took:.0f} s | "
                  f"{r.before} | {r.after} |")
        for mode, summary in self.conformance:
            print(f"\nconformance, {mode} mode:\n{summary}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster up")
    parser.add_argument("--dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "proxyplan-cluster-test")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("cluster: needs root (it starts a cluster of real nodes)")
        print("test result: FAILED. 0 passed; 1 failed; 0 ignored")
        return 1
    for tool in ("kubectl", "ctr"):
        if not shutil.which(tool) and tool != "ctr":
            print(f"cluster: {tool} is not on PATH")
            print("test result: FAILED. 0 passed; 1 failed; 0 ignored")
            return 1
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="proxyplan-images-"))
    cluster = Cluster(args.dir, 3)
    failures: list[str] = []
    scenario = None
    try:
        log("building the images from the Dockerfiles")
        t = time.monotonic()
        images = build_images(work)
        log(f"   images built in {time.monotonic() - t:.1f} s")
        log("starting a 3-node cluster")
        cluster.down()
        log(f"   cluster up in {cluster.up():.1f} s")
        t = time.monotonic()
        for tarball in images.values():
            cluster.import_image(tarball)
        log(f"   images imported into 3 nodes in {time.monotonic() - t:.1f} s")
        scenario = Scenario(cluster, images)
        scenario.run()
        failures += scenario.failures
    except Exception as err:  # noqa: BLE001
        failures.append(f"{type(err).__name__}: {err}")
    finally:
        if scenario:
            scenario.print_tables()
        if not args.keep:
            t = time.monotonic()
            cluster.down()
            log(f"cluster down in {time.monotonic() - t:.1f} s")
        shutil.rmtree(work, ignore_errors=True)
    log(f"cluster tests took {time.monotonic() - started:.0f} s")
    operations = len(scenario.rows) if scenario else 0
    for failure in failures:
        print(f"FAILED: {failure}")
    passed = 0 if failures else max(operations, 1)
    print(f"test result: {'ok' if not failures else 'FAILED'}. {passed} passed; "
          f"{len(failures)} failed; 0 ignored")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
