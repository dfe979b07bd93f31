#!/usr/bin/env python3
"""Checks the Helm chart charts/proxyplan with a real Helm engine (helm-python-sdk,
which embeds Helm's Go SDK: offline render and lint, no helm binary, no cluster).

Renders the chart with default values and with overrides, lints it, and checks the
rendered manifests: every kind, least-privilege RBAC, security contexts, probes, the
values reaching the containers' flags, and the optional monitoring objects (PodMonitors,
PrometheusRule, Grafana dashboard), whose queries may name only metrics README.md lists. Ends with `chart: N passed, M failed`.

Needs: python3 -m pip install helm-python-sdk pyyaml
"""

from __future__ import annotations

import json
import re
import sys
import unittest
from pathlib import Path

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "proxyplan"
RELEASE = "proxyplan"
NAMESPACE = "kube-system"


def render(values: dict | None = None) -> list[dict]:
    """Every object the chart renders (CRDs excluded: Helm installs crds/ separately)."""
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values or {})
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return objects


def notes(values: dict | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(v for k, v in manifests.items() if k.endswith("NOTES.txt"))


def find(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [
        o
        for o in objects
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def container(objects: list[dict], kind: str) -> dict:
    pod = find(objects, kind)["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1, pod["containers"]
    return pod["containers"][0]


def rules(role: dict) -> set[tuple[str, str, str]]:
    """A role's rules as a set of (apiGroup, resource, verb)."""
    out = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule or rule["resourceNames"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def expand(*specs: tuple[str, list[str], list[str]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, resources, verbs in specs for r in resources for v in verbs}


READ = ["get", "list", "watch"]


class Defaults(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.objects = render()

    def test_every_kind_present(self) -> None:
        kinds = sorted(o["kind"] for o in self.objects)
        self.assertEqual(
            kinds,
            sorted(
                [
                    "ServiceAccount",
                    "ServiceAccount",
                    "ServiceAccount",
                    "ClusterRole",
                    "ClusterRole",
                    "ClusterRoleBinding",
                    "ClusterRoleBinding",
                    "Role",
                    "Role",
                    "Role",
                    "RoleBinding",
                    "RoleBinding",
                    "RoleBinding",
                    "Job",
                    "Deployment",
                    "PodDisruptionBudget",
                    "DaemonSet",
                    "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding",
                ]
            ),
        )

    def test_crds_shipped(self) -> None:
        with helm.Chart.load(CHART) as chart:
            crds = [yaml.safe_load(c["data"]) for c in chart.crds]
        self.assertEqual(
            sorted(c["metadata"]["name"] for c in crds),
            ["nodeproxyplans.proxyplan.dev", "serviceproxyplans.proxyplan.dev"],
        )

    def test_namespaced_objects_in_release_namespace(self) -> None:
        for o in self.objects:
            if o["kind"] in {"ServiceAccount", "Role", "RoleBinding", "Deployment",
                             "PodDisruptionBudget", "DaemonSet", "Job"}:
                self.assertEqual(o["metadata"].get("namespace"), NAMESPACE, o["kind"])

    def test_controller_rbac_least_privilege(self) -> None:
        self.assertEqual(
            rules(find(self.objects, "ClusterRole", "proxyplan-controller")),
            expand(
                ("", ["services", "nodes"], READ),
                ("discovery.k8s.io", ["endpointslices"], READ),
                ("networking.k8s.io", ["servicecidrs"], READ),
                (
                    "proxyplan.dev",
                    ["nodeproxyplans", "serviceproxyplans"],
                    READ + ["create", "patch", "update", "delete"],
                ),
                # The rollout status: status only, patched.
                ("proxyplan.dev", ["serviceproxyplans/status"], ["patch"]),
                ("events.k8s.io", ["events"], ["create", "patch"]),
            ),
        )
        role = find(self.objects, "Role", "proxyplan-controller-leader-election")
        self.assertEqual(
            rules(role), expand(("coordination.k8s.io", ["leases"], ["get", "create", "update"]))
        )
        binding = find(self.objects, "RoleBinding", "proxyplan-controller-leader-election")
        self.assertEqual(binding["roleRef"]["name"], role["metadata"]["name"])
        self.assertEqual(
            binding["subjects"],
            [{"kind": "ServiceAccount", "name": "proxyplan-controller", "namespace": NAMESPACE}],
        )

    def test_agent_rbac_least_privilege(self) -> None:
        self.assertEqual(
            rules(find(self.objects, "ClusterRole", "proxyplan-agent")),
            expand(
                ("proxyplan.dev", ["nodeproxyplans", "serviceproxyplans"], READ),
                ("proxyplan.dev", ["nodeproxyplans/status"], ["patch"]),
            ),
        )

    def test_agent_may_read_only_its_own_daemonset(self) -> None:
        # At SIGTERM the agent asks whether its DaemonSet is gone (an uninstall).
        role = find(self.objects, "Role", "proxyplan-agent")
        self.assertEqual(
            role["rules"],
            [{"apiGroups": ["apps"], "resources": ["daemonsets"],
              "resourceNames": ["proxyplan-agent"], "verbs": ["get"]}],
        )
        binding = find(self.objects, "RoleBinding", "proxyplan-agent")
        self.assertEqual(binding["roleRef"]["name"], "proxyplan-agent")
        self.assertEqual(
            binding["subjects"],
            [{"kind": "ServiceAccount", "name": "proxyplan-agent", "namespace": NAMESPACE}],
        )
        args = container(self.objects, "DaemonSet")["args"]
        self.assertIn(f"--owner-daemonset={NAMESPACE}/proxyplan-agent", args)

    def test_uninstall_hook_removes_the_agents_first(self) -> None:
        hook = [o for o in self.objects
                if o["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-delete"]
        self.assertEqual(
            sorted((o["kind"], o["metadata"]["name"]) for o in hook),
            [("Job", "proxyplan-uninstall"), ("Role", "proxyplan-uninstall"),
             ("RoleBinding", "proxyplan-uninstall"), ("ServiceAccount", "proxyplan-uninstall")],
        )
        for o in hook:
            self.assertEqual(
                o["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
                "before-hook-creation,hook-succeeded",
            )
        # Its ServiceAccount and RBAC exist before the Job runs.
        weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hook}
        self.assertLess(weights["Role"], weights["Job"])
        job = find(self.objects, "Job", "proxyplan-uninstall")
        pod = job["spec"]["template"]["spec"]
        self.assertEqual(pod["serviceAccountName"], "proxyplan-uninstall")
        self.assertEqual(pod["restartPolicy"], "Never")
        self.assertEqual(
            pod["containers"][0]["args"],
            ["uninstall-agents", f"--daemonset={NAMESPACE}/proxyplan-agent", "--timeout=120s"],
        )
        self.assertIn("proxyplan-controller", pod["containers"][0]["image"])
        self.assertEqual(
            rules(find(self.objects, "Role", "proxyplan-uninstall")),
            expand(("apps", ["daemonsets"], ["get", "delete"]), ("", ["pods"], ["list"])),
        )
        self.assertEqual(
            find(self.objects, "Role", "proxyplan-uninstall")["rules"][0]["resourceNames"],
            ["proxyplan-agent"],
        )

    def test_uninstall_hook_can_be_turned_off(self) -> None:
        objects = render({"uninstall": {"removeAgentRules": False}})
        self.assertFalse([o for o in objects if o["kind"] == "Job"])
        # ... and then no agent removes its rules when its DaemonSet goes.
        args = container(objects, "DaemonSet")["args"]
        self.assertFalse([a for a in args if a.startswith("--owner-daemonset")])

    def test_bindings_point_at_their_service_accounts(self) -> None:
        for component in ("controller", "agent"):
            name = f"proxyplan-{component}"
            binding = find(self.objects, "ClusterRoleBinding", name)
            self.assertEqual(binding["roleRef"], {
                "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name})
            self.assertEqual(
                binding["subjects"],
                [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
            )
            find(self.objects, "ServiceAccount", name)

    def test_no_wildcards_anywhere_in_rbac(self) -> None:
        for o in self.objects:
            if o["kind"] in {"ClusterRole", "Role"}:
                for g, r, v in rules(o):
                    self.assertNotIn("*", (g, r, v), o["metadata"]["name"])

    def test_admission_policy(self) -> None:
        policy = find(self.objects, "ValidatingAdmissionPolicy")
        self.assertEqual(policy["apiVersion"], "admissionregistration.k8s.io/v1")
        self.assertEqual(policy["spec"]["failurePolicy"], "Fail")
        rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
        self.assertEqual(rule["apiGroups"], ["proxyplan.dev"])
        self.assertIn("nodeproxyplans/status", rule["resources"])
        self.assertIn("UPDATE", rule["operations"])
        condition = policy["spec"]["matchConditions"][0]["expression"]
        self.assertIn(f'"system:serviceaccount:{NAMESPACE}:proxyplan-agent"', condition)
        expression = policy["spec"]["validations"][0]["expression"]
        self.assertIn("object.metadata.name", expression)
        self.assertIn(
            'request.userInfo.extra["authentication.kubernetes.io/node-name"]', expression
        )
        binding = find(self.objects, "ValidatingAdmissionPolicyBinding")
        self.assertEqual(binding["apiVersion"], "admissionregistration.k8s.io/v1")
        self.assertEqual(binding["spec"]["policyName"], policy["metadata"]["name"])
        self.assertEqual(binding["spec"]["validationActions"], ["Deny"])

    def test_agent_daemonset(self) -> None:
        ds = find(self.objects, "DaemonSet")
        pod = ds["spec"]["template"]["spec"]
        self.assertIs(pod["hostNetwork"], True)
        self.assertEqual(pod["dnsPolicy"], "ClusterFirstWithHostNet")
        self.assertEqual(pod["tolerations"], [{"operator": "Exists"}])
        self.assertEqual(pod["priorityClassName"], "system-node-critical")
        self.assertEqual(pod["serviceAccountName"], "proxyplan-agent")
        strategy = ds["spec"]["updateStrategy"]
        self.assertEqual(strategy["type"], "RollingUpdate")
        self.assertEqual(strategy["rollingUpdate"]["maxUnavailable"], 1)
        self.assertNotIn("privileged", pod.get("securityContext", {}))
        c = container(self.objects, "DaemonSet")
        sc = c["securityContext"]
        self.assertIs(sc.get("privileged", False), False)
        self.assertIs(sc["allowPrivilegeEscalation"], False)
        self.assertEqual(sorted(sc["capabilities"]["add"]), ["NET_ADMIN", "NET_RAW"])
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])

    def test_ipvs_sysctls_init_container(self) -> None:
        pod = find(render(IPVS), "DaemonSet")["spec"]["template"]["spec"]
        (_, init) = pod["initContainers"]
        self.assertEqual(init["name"], "ipvs-sysctls")
        self.assertIs(init["securityContext"]["privileged"], True)
        script = init["command"][-1]
        for sysctl in (
            "net/ipv4/vs/conntrack=1",
            "net/ipv4/vs/expire_nodest_conn=1",
            "net/ipv4/vs/expire_quiescent_template=1",
            "net/ipv4/ip_forward=1",
        ):
            self.assertIn(sysctl, script)
        self.assertIn("modprobe -a ip_vs ip_vs_rr dummy", script)
        self.assertNotIn("arp_ignore", script)
        strict = render({"agent": {"mode": "ipvs",
                                   "ipvs": {"strictARP": True, "scheduler": "mh",
                                            "excludeCIDRs": ["10.0.0.0/8", "fd00::/8"]}}})
        spec = find(strict, "DaemonSet")["spec"]["template"]["spec"]
        self.assertIn("arp_ignore=1", spec["initContainers"][1]["command"][-1])
        self.assertIn("ip_vs_mh", spec["initContainers"][1]["command"][-1])
        args = container(strict, "DaemonSet")["args"]
        for flag in ("--ipvs-strict-arp", "--ipvs-scheduler=mh",
                     "--ipvs-exclude-cidrs=10.0.0.0/8,fd00::/8"):
            self.assertIn(flag, args)

    def test_ipvs_timeouts_and_conn_reuse_mode(self) -> None:
        objects = render(IPVS)
        args = container(objects, "DaemonSet")["args"]
        for flag in ("--ipvs-tcp-timeout=0s", "--ipvs-tcpfin-timeout=0s",
                     "--ipvs-udp-timeout=0s"):
            self.assertIn(flag, args)
        (init,) = [c for c in find(objects, "DaemonSet")["spec"]["template"]["spec"][
            "initContainers"] if c["name"] == "ipvs-sysctls"]
        script = init["command"][-1]
        self.assertIn("4.[1-9]*|5.[0-8].*|5.[0-8]-*)", script)
        self.assertIn("/proc/sys/net/ipv4/vs/conn_reuse_mode", script)
        custom = render({"agent": {"mode": "ipvs",
                                   "ipvs": {"tcpTimeout": "1h", "tcpFinTimeout": "30s",
                                            "udpTimeout": "5m"}}})
        args = container(custom, "DaemonSet")["args"]
        for flag in ("--ipvs-tcp-timeout=1h", "--ipvs-tcpfin-timeout=30s",
                     "--ipvs-udp-timeout=5m"):
            self.assertIn(flag, args)

    def test_node_setup_init_container_sets_conntrack_sysctls(self) -> None:
        pod = find(self.objects, "DaemonSet")["spec"]["template"]["spec"]
        setup = pod["initContainers"][0]
        self.assertEqual(setup["name"], "node-setup")
        self.assertIs(setup["securityContext"]["privileged"], True)
        self.assertEqual(setup["args"][0], "setup")
        defaults = (
            "--conntrack-max-per-core=32768",
            "--conntrack-min=131072",
            "--conntrack-tcp-timeout-established=24h",
            "--conntrack-tcp-timeout-close-wait=1h",
            "--conntrack-udp-timeout=0s",
            "--conntrack-udp-timeout-stream=0s",
        )
        for flag in defaults:
            self.assertIn(flag, setup["args"])
            self.assertIn(flag, container(self.objects, "DaemonSet")["args"])
        self.assertNotIn("--conntrack-tcp-be-liberal", setup["args"])
        objects = render({"agent": {"mode": "iptables",
                                    "iptables": {"localhostNodePorts": True},
                                    "conntrack": {"tcpBeLiberal": True, "maxPerCore": 0}}})
        setup = find(objects, "DaemonSet")["spec"]["template"]["spec"]["initContainers"][0]
        for flag in ("--conntrack-tcp-be-liberal", "--iptables-localhost-nodeports",
                     "--conntrack-max-per-core=0"):
            self.assertIn(flag, setup["args"])
            self.assertIn(flag, container(objects, "DaemonSet")["args"])

    def test_non_ipvs_modes_have_no_ipvs_parts(self) -> None:
        for mode in ("auto", "nftables", "iptables"):
            objects = render({"agent": {"mode": mode}})
            pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
            self.assertEqual([c["name"] for c in pod["initContainers"]], ["node-setup"], mode)
            args = container(objects, "DaemonSet")["args"]
            self.assertIn(f"--mode={mode}", args)
            self.assertFalse([a for a in args if a.startswith("--ipvs")], mode)

    def test_ipvs_mode_args(self) -> None:
        args = container(render(IPVS), "DaemonSet")["args"]
        for flag in (
            "--mode=ipvs",
            "--ipvs-scheduler=rr",
            "--ipvs-interface=proxyplan-ipvs0",
            "--ipvs-termination-grace=120s",
        ):
            self.assertIn(flag, args)

    def test_agent_mounts(self) -> None:
        pod = find(self.objects, "DaemonSet")["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in container(self.objects, "DaemonSet")["volumeMounts"]}
        lock = volumes[mounts["/run/xtables.lock"]["name"]]
        self.assertEqual(lock["hostPath"], {"path": "/run/xtables.lock", "type": "FileOrCreate"})
        modules = mounts["/lib/modules"]
        self.assertIs(modules["readOnly"], True)
        self.assertEqual(volumes[modules["name"]]["hostPath"]["path"], "/lib/modules")
        self.assertNotIn("readOnly", mounts["/run/xtables.lock"])
        # The health-check record outlives the pod, not the node's boot (/run is a tmpfs).
        state = volumes[mounts["/run/proxyplan"]["name"]]
        self.assertEqual(state["hostPath"], {"path": "/run/proxyplan", "type": "DirectoryOrCreate"})
        self.assertIn("--state-dir=/run/proxyplan/$(NODE_NAME)", container(self.objects, "DaemonSet")["args"])

    def test_agent_env_probes_ports(self) -> None:
        c = container(self.objects, "DaemonSet")
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports, {"healthz": 10256})
        self.assertEqual(c["livenessProbe"]["httpGet"]["path"], "/livez")
        self.assertEqual(c["livenessProbe"]["httpGet"]["port"], "healthz")
        self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/healthz")

    def test_agent_default_args(self) -> None:
        args = container(self.objects, "DaemonSet")["args"]
        self.assertEqual(args[0], "run")
        for flag in (
            "--node=$(NODE_NAME)",
            "--mode=auto",
            "--iptables-backend=auto",
            "--masquerade-bit=13",
            "--sync-period=30s",
            "--tamper-check-interval=1s",
            "--healthz-bind-address=0.0.0.0:10256",
            "--metrics-bind-address=127.0.0.1:10249",
        ):
            self.assertIn(flag, args)
        self.assertFalse([a for a in args if a.startswith("--nodeport-addresses")])
        # The agent's own default for its mode (1s in iptables mode, 0 otherwise).
        self.assertFalse([a for a in args if a.startswith("--min-sync-interval")])

    def test_controller_deployment(self) -> None:
        deploy = find(self.objects, "Deployment")
        self.assertEqual(deploy["spec"]["replicas"], 2)
        pod = deploy["spec"]["template"]["spec"]
        self.assertIs(pod["securityContext"]["runAsNonRoot"], True)
        self.assertNotIn("hostNetwork", pod)
        self.assertEqual(pod["serviceAccountName"], "proxyplan-controller")
        c = container(self.objects, "Deployment")
        sc = c["securityContext"]
        self.assertIs(sc["runAsNonRoot"], True)
        self.assertIs(sc["readOnlyRootFilesystem"], True)
        self.assertIs(sc["allowPrivilegeEscalation"], False)
        self.assertEqual(sc["capabilities"], {"drop": ["ALL"]})
        self.assertTrue(c["resources"]["requests"])

    def test_controller_probes_and_env(self) -> None:
        c = container(self.objects, "Deployment")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports, {"metrics": 9090, "health": 9091})
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = c[probe]["httpGet"]
            self.assertEqual(get["path"], path)
            self.assertIn(get["port"], ("health", 9091))
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
        self.assertEqual(env, {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"})
        self.assertIn("--health-bind-address=0.0.0.0:9091", c["args"])

    def test_controller_default_args(self) -> None:
        args = container(self.objects, "Deployment")["args"]
        self.assertEqual(args[0], "run")
        self.assertNotIn("--masquerade-all", args)
        self.assertFalse([a for a in args if a.startswith("--cluster-cidr")])
        for flag in (
            "--detect-local-mode=ClusterCIDR",
            "--min-sync-interval=0s",
            f"--leader-election-namespace={NAMESPACE}",
        ):
            self.assertIn(flag, args)

    def test_pdb(self) -> None:
        pdb = find(self.objects, "PodDisruptionBudget")
        deploy = find(self.objects, "Deployment")
        self.assertEqual(pdb["spec"]["minAvailable"], 1)
        self.assertEqual(
            pdb["spec"]["selector"]["matchLabels"], deploy["spec"]["selector"]["matchLabels"]
        )

    def test_selectors_match_pod_labels(self) -> None:
        for kind in ("Deployment", "DaemonSet"):
            o = find(self.objects, kind)
            labels = o["spec"]["template"]["metadata"]["labels"]
            for k, v in o["spec"]["selector"]["matchLabels"].items():
                self.assertEqual(labels.get(k), v, kind)

    def test_notes(self) -> None:
        text = notes()
        self.assertIn("kubectl get nodeproxyplans", text)
        self.assertIn("kubectl describe npp <node>", text)


IPVS = {"agent": {"mode": "ipvs"}}

OVERRIDES = {
    "controller": {
        "replicas": 3,
        "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"],
        "masqueradeAll": True,
        "detectLocalMode": "NodeCIDR",
        "minSyncInterval": "2s",
        "rolloutSlowAfter": "30s",
        "rolloutStatus": "all",
        "image": {"repository": "registry.example/pp-controller", "tag": "v9", "pullPolicy": "Always"},
    },
    "agent": {
        "iptablesBackend": "legacy",
        "masqueradeBit": 12,
        "nodeportAddresses": ["192.168.0.0/16", "10.0.0.0/8"],
        "syncPeriod": "1m",
        "tamperCheckInterval": "250ms",
        "rolloutReportInterval": "20s",
        "minSyncInterval": "500ms",
        "metrics": {"bindAddress": "0.0.0.0", "port": 10250},
        "healthz": {"port": 10266},
        "image": {"repository": "registry.example/pp-agent", "tag": "v9"},
    },
}


class Overrides(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.objects = render(OVERRIDES)

    def test_controller_flags(self) -> None:
        c = container(self.objects, "Deployment")
        args = c["args"]
        self.assertEqual(
            [a for a in args if a.startswith("--cluster-cidr")],
            ["--cluster-cidr=10.244.0.0/16", "--cluster-cidr=fd00:10:244::/56"],
        )
        for flag in (
            "--masquerade-all",
            "--detect-local-mode=NodeCIDR",
            "--min-sync-interval=2s",
            "--rollout-slow-after=30s",
            "--rollout-status=all",
        ):
            self.assertIn(flag, args)
        self.assertEqual(c["image"], "registry.example/pp-controller:v9")
        self.assertEqual(c["imagePullPolicy"], "Always")
        self.assertEqual(find(self.objects, "Deployment")["spec"]["replicas"], 3)

    def test_nodeport_addresses_primary(self) -> None:
        args = container(render({"agent": {"nodeportAddresses": ["primary"]}}), "DaemonSet")["args"]
        self.assertIn("--nodeport-addresses=primary", args)

    def test_interface_detection_flags(self) -> None:
        args = container(
            render({"controller": {"detectLocalMode": "InterfaceNamePrefix", "podInterfaceNamePrefix": "veth"}}),
            "Deployment",
        )["args"]
        self.assertIn("--detect-local-mode=InterfaceNamePrefix", args)
        self.assertIn("--pod-interface-name-prefix=veth", args)
        self.assertFalse([a for a in args if a.startswith("--pod-bridge-interface")])
        args = container(
            render({"controller": {"detectLocalMode": "BridgeInterface", "podBridgeInterface": "cni0"}}),
            "Deployment",
        )["args"]
        self.assertIn("--pod-bridge-interface=cni0", args)

    def test_agent_flags(self) -> None:
        c = container(self.objects, "DaemonSet")
        args = c["args"]
        for flag in (
            "--iptables-backend=legacy",
            "--masquerade-bit=12",
            "--nodeport-addresses=192.168.0.0/16,10.0.0.0/8",
            "--sync-period=1m",
            "--tamper-check-interval=250ms",
            "--rollout-report-interval=20s",
            "--min-sync-interval=500ms",
            "--metrics-bind-address=0.0.0.0:10250",
            "--healthz-bind-address=0.0.0.0:10266",
        ):
            self.assertIn(flag, args)
        # /metrics listens beyond loopback here: named, for a PodMonitor.
        self.assertEqual({p["name"]: p["containerPort"] for p in c["ports"]},
                         {"healthz": 10266, "metrics": 10250})
        self.assertEqual(c["image"], "registry.example/pp-agent:v9")

    def test_optional_objects_can_be_disabled(self) -> None:
        objects = render(
            {"controller": {"podDisruptionBudget": {"enabled": False}},
             "admissionPolicy": {"enabled": False}}
        )
        kinds = {o["kind"] for o in objects}
        self.assertNotIn("PodDisruptionBudget", kinds)
        self.assertNotIn("ValidatingAdmissionPolicy", kinds)
        self.assertNotIn("ValidatingAdmissionPolicyBinding", kinds)

    def test_api_server_override(self) -> None:
        objects = render({"apiServer": {"host": "10.0.0.1", "port": 6443}})
        for kind in ("Deployment", "DaemonSet"):
            env = {e["name"]: e.get("value") for e in container(objects, kind)["env"]}
            self.assertEqual(env["KUBERNETES_SERVICE_HOST"], "10.0.0.1", kind)
            self.assertEqual(env["KUBERNETES_SERVICE_PORT"], "6443", kind)


# Every monitoring object on; the agent's /metrics must then listen beyond loopback.
MONITORING = {
    "agent": {"metrics": {"bindAddress": "0.0.0.0"}},
    "metrics": {
        "podMonitor": {"enabled": True, "labels": {"release": "kps"},
                       "interval": "15s", "scrapeTimeout": "5s"},
        "prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
        "dashboard": {"enabled": True},
    },
}

MONITORING_KINDS = {"PodMonitor", "PrometheusRule", "ConfigMap"}

ALERTS = {
    "ProxyPlanNodeNotApplied",
    "ProxyPlanAgentSyncErrors",
    "ProxyPlanDegraded",
    "ProxyPlanProgrammingLatencyHigh",
    "ProxyPlanControllerNoLeader",
    "ProxyPlanControllerWriteErrors",
}

# PromQL's functions, aggregations and keywords: every other identifier in a query,
# once strings, label matchers, ranges and grouping clauses are gone, is a metric name.
PROMQL_WORDS = {
    "abs", "absent", "absent_over_time", "and", "avg", "avg_over_time", "bool", "ceil",
    "changes", "clamp", "clamp_max", "clamp_min", "count", "count_over_time", "delta",
    "deriv", "floor", "group", "histogram_quantile", "idelta", "increase", "irate",
    "label_replace", "max", "max_over_time", "min", "min_over_time", "offset", "or",
    "quantile", "quantile_over_time", "rate", "resets", "round", "scalar", "sort",
    "sort_desc", "sum", "sum_over_time", "time", "timestamp", "topk", "bottomk", "unless",
    "vector",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL (or Grafana-templated PromQL) expression reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^{}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\w+", "", expr)
    expr = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?\b", "", expr)
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr)) - PROMQL_WORDS


def readme_metrics() -> set[str]:
    """Every metric README.md lists: the agent's (kube-proxy's names and proxyplan_agent_*,
    with `X_pending` / `_total` meaning both) and the controller's (written without their
    `proxyplan_controller_` prefix)."""
    text = (ROOT / "README.md").read_text()
    names: set[str] = set()
    controller = re.search(r"Metrics \(`proxyplan_controller_` prefix\):(.*?)\n\n", text, re.S)
    assert controller, "README: the controller's metrics paragraph is gone"
    for token in re.findall(r"`([^`]+)`", controller.group(1)):
        names.add("proxyplan_controller_" + re.sub(r"\{.*\}$", "", token))
    agent = re.search(r"\nMetrics, with kube-proxy's names(.*?)\n\n", text, re.S)
    assert agent, "README: the agent's metrics paragraph is gone"
    previous = ""
    for token in re.findall(r"`([^`]+)`", agent.group(1)):
        token = re.sub(r"\{.*\}$", "", token)
        if token.startswith("_") and previous:
            names.add(previous.rsplit("_", 1)[0] + token)
        elif re.fullmatch(r"(kubeproxy|proxyplan)_[a-z0-9_]+", token):
            names.add(token)
            previous = token
    return names


def in_readme(name: str, known: set[str]) -> bool:
    """A listed metric, or a histogram's _bucket/_sum/_count series of one."""
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return name in known or (base != name and base in known)


class Monitoring(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.objects = render(MONITORING)
        cls.readme = readme_metrics()

    def test_readme_lists_parsed(self) -> None:
        for name in (
            "proxyplan_controller_is_leader",
            "proxyplan_controller_write_errors_total",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "proxyplan_agent_merge_duration_seconds",
        ):
            self.assertIn(name, self.readme)
        self.assertNotIn("ip_family", self.readme)

    def test_defaults_render_none(self) -> None:
        kinds = {o["kind"] for o in render()}
        self.assertFalse(kinds & MONITORING_KINDS)
        self.assertNotIn("metrics", {p["name"] for p in container(render(), "DaemonSet")["ports"]})

    def test_each_alone(self) -> None:
        base = {"agent": {"metrics": {"bindAddress": "0.0.0.0"}}}
        for key, kinds in (("podMonitor", ["PodMonitor", "PodMonitor"]),
                           ("prometheusRule", ["PrometheusRule"]),
                           ("dashboard", ["ConfigMap"])):
            objects = render({**base, "metrics": {key: {"enabled": True}}})
            self.assertEqual(sorted(o["kind"] for o in objects if o["kind"] in MONITORING_KINDS),
                             kinds, key)

    def test_pod_monitors_select_named_ports(self) -> None:
        monitors = [o for o in self.objects if o["kind"] == "PodMonitor"]
        self.assertEqual(sorted(m["metadata"]["name"] for m in monitors),
                         ["proxyplan-agent", "proxyplan-controller"])
        for kind, name in (("Deployment", "proxyplan-controller"), ("DaemonSet", "proxyplan-agent")):
            with self.subTest(kind=kind):
                monitor = find(self.objects, "PodMonitor", name)
                self.assertEqual(monitor["apiVersion"], "monitoring.coreos.com/v1")
                self.assertEqual(monitor["metadata"]["namespace"], NAMESPACE)
                self.assertEqual(monitor["metadata"]["labels"]["release"], "kps")
                workload = find(self.objects, kind)
                self.assertEqual(monitor["spec"]["selector"]["matchLabels"],
                                 workload["spec"]["selector"]["matchLabels"])
                self.assertEqual(monitor["spec"]["namespaceSelector"], {"matchNames": [NAMESPACE]})
                (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
                self.assertEqual(endpoint["port"], "metrics")
                self.assertEqual(endpoint["path"], "/metrics")
                self.assertEqual(endpoint["interval"], "15s")
                self.assertEqual(endpoint["scrapeTimeout"], "5s")
                self.assertIn({"action": "replace",
                               "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                               "targetLabel": "node"}, endpoint["relabelings"])
                ports = {p["name"]: p for p in container(self.objects, kind)["ports"]}
                self.assertIn("metrics", ports)
        agent_port = {p["name"]: p for p in container(self.objects, "DaemonSet")["ports"]}["metrics"]
        self.assertEqual(agent_port["containerPort"], 10249)
        self.assertIn("--metrics-bind-address=0.0.0.0:10249",
                      container(self.objects, "DaemonSet")["args"])

    def test_pod_monitor_extra_relabelings_and_prometheus_defaults(self) -> None:
        objects = render({"agent": {"metrics": {"bindAddress": "0.0.0.0"}},
                          "metrics": {"podMonitor": {
                              "enabled": True, "interval": "", "scrapeTimeout": "",
                              "relabelings": [{"action": "labeldrop", "regex": "container"}],
                              "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                                                     "regex": "go_.*"}]}}})
        (endpoint,) = find(objects, "PodMonitor", "proxyplan-agent")["spec"]["podMetricsEndpoints"]
        self.assertNotIn("interval", endpoint)
        self.assertNotIn("scrapeTimeout", endpoint)
        self.assertEqual(endpoint["relabelings"][0]["targetLabel"], "node")
        self.assertEqual(endpoint["relabelings"][1], {"action": "labeldrop", "regex": "container"})
        self.assertEqual(endpoint["metricRelabelings"][0]["regex"], "go_.*")

    def test_loopback_agent_metrics_fail_clearly(self) -> None:
        for address in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
            with self.subTest(address=address):
                with self.assertRaises(helm.HelmError) as caught:
                    render({"agent": {"metrics": {"bindAddress": address}},
                            "metrics": {"podMonitor": {"enabled": True}}})
                message = str(caught.exception)
                self.assertIn("metrics.podMonitor.enabled", message)
                self.assertIn("set agent.metrics.bindAddress=0.0.0.0", message)
        # Loopback is fine without the PodMonitor (the default), and the port stays unnamed.
        ports = {p["name"] for p in container(render(), "DaemonSet")["ports"]}
        self.assertEqual(ports, {"healthz"})

    def rules(self, objects: list[dict] | None = None) -> dict[str, dict]:
        rule = find(objects or self.objects, "PrometheusRule")
        out = {}
        for group in rule["spec"]["groups"]:
            self.assertTrue(group["rules"], group["name"])
            for r in group["rules"]:
                out[r["alert"]] = r
        return out

    def test_prometheus_rule_alerts(self) -> None:
        rule = find(self.objects, "PrometheusRule")
        self.assertEqual(rule["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(rule["metadata"]["namespace"], NAMESPACE)
        self.assertEqual(rule["metadata"]["labels"]["release"], "kps")
        alerts = self.rules()
        self.assertEqual(set(alerts), ALERTS)
        for name, alert in alerts.items():
            with self.subTest(alert=name):
                self.assertIn(alert["labels"]["severity"], ("warning", "critical"))
                self.assertTrue(alert["annotations"]["summary"])
                self.assertIn("kubectl", alert["annotations"]["description"])
                self.assertRegex(alert["for"], r"^[0-9]+[smh]$")
        agent = 'job="kube-system/proxyplan-agent"'
        controller = 'job="kube-system/proxyplan-controller"'
        for name in ("ProxyPlanNodeNotApplied", "ProxyPlanAgentSyncErrors", "ProxyPlanDegraded",
                     "ProxyPlanProgrammingLatencyHigh"):
            self.assertIn(agent, alerts[name]["expr"], name)
            self.assertIn("kubectl get nodeproxyplans", alerts[name]["annotations"]["description"])
        for name in ("ProxyPlanNodeNotApplied", "ProxyPlanAgentSyncErrors", "ProxyPlanDegraded"):
            description = alerts[name]["annotations"]["description"]
            self.assertIn("kubectl describe npp {{ with $labels.node }}", description)
            self.assertIn("agent's logs", description)
        for name in ("ProxyPlanControllerNoLeader", "ProxyPlanControllerWriteErrors"):
            self.assertIn(controller, alerts[name]["expr"], name)
        not_applied = alerts["ProxyPlanNodeNotApplied"]
        self.assertEqual(not_applied["for"], "5m")
        self.assertRegex(
            re.sub(r"\s+", " ", not_applied["expr"]),
            r"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds\{[^}]*\} > "
            r"kubeproxy_sync_proxy_rules_last_timestamp_seconds\{",
        )
        self.assertIn("increase(proxyplan_agent_sync_errors_total{",
                      alerts["ProxyPlanAgentSyncErrors"]["expr"])
        self.assertIn("[5m]) > 0", alerts["ProxyPlanAgentSyncErrors"]["expr"])
        degraded = alerts["ProxyPlanDegraded"]
        self.assertIn("proxyplan_agent_invalid_plans_total", degraded["expr"])
        self.assertIn("status condition, not a metric", degraded["annotations"]["description"])
        latency = re.sub(r"\s+", " ", alerts["ProxyPlanProgrammingLatencyHigh"]["expr"])
        self.assertIn("histogram_quantile(0.99, sum by (le) "
                      "(rate(kubeproxy_network_programming_duration_seconds_bucket{", latency)
        self.assertTrue(latency.endswith(") > 1"), latency)
        self.assertIn("sum(proxyplan_controller_is_leader{",
                      alerts["ProxyPlanControllerNoLeader"]["expr"])
        self.assertIn(") < 1", alerts["ProxyPlanControllerNoLeader"]["expr"])
        self.assertEqual(alerts["ProxyPlanControllerNoLeader"]["labels"]["severity"], "critical")
        self.assertIn("proxyplan_controller_write_errors_total",
                      alerts["ProxyPlanControllerWriteErrors"]["expr"])

    def test_rule_metric_names_in_readme(self) -> None:
        seen = set()
        for name, alert in self.rules().items():
            names = metric_names(alert["expr"])
            self.assertTrue(names, name)
            for metric in names:
                self.assertTrue(in_readme(metric, self.readme),
                                f"{name}: {metric} is not in README's metric lists")
            seen |= names
        self.assertIn("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", seen)
        # The parser does catch a name README does not list.
        self.assertEqual(metric_names('sum by (le) (rate(kube_proxy_typo_bucket{job="x"}[5m])) > 1'),
                         {"kube_proxy_typo_bucket"})
        self.assertFalse(in_readme("kube_proxy_typo_bucket", self.readme))

    def test_rule_values(self) -> None:
        objects = render({"metrics": {"prometheusRule": {
            "enabled": True,
            "agentSelector": 'namespace="kube-system", pod=~"proxyplan-agent-.*"',
            "controllerSelector": 'job="pp-controller"',
            "alertLabels": {"team": "network"},
            "alerts": {
                "nodeNotApplied": {"for": "15m", "severity": "critical", "lastSyncAgeSeconds": 300},
                "degraded": {"window": "1h"},
                "programmingLatencyHigh": {"thresholdSeconds": 2.5},
                "controllerWriteErrors": {"enabled": False},
            }}}})
        alerts = self.rules(objects)
        self.assertNotIn("ProxyPlanControllerWriteErrors", alerts)
        self.assertEqual(alerts["ProxyPlanNodeNotApplied"]["for"], "15m")
        self.assertEqual(alerts["ProxyPlanNodeNotApplied"]["labels"],
                         {"severity": "critical", "team": "network"})
        self.assertIn("> 300", alerts["ProxyPlanNodeNotApplied"]["expr"])
        self.assertIn('{namespace="kube-system", pod=~"proxyplan-agent-.*"}',
                      alerts["ProxyPlanNodeNotApplied"]["expr"])
        self.assertIn("[1h]) > 0", alerts["ProxyPlanDegraded"]["expr"])
        self.assertTrue(alerts["ProxyPlanProgrammingLatencyHigh"]["expr"].endswith("> 2.5"))
        self.assertIn('{job="pp-controller"}', alerts["ProxyPlanControllerNoLeader"]["expr"])
        # A group whose alerts are all off is left out.
        off = {name: {"enabled": False} for name in ("controllerNoLeader", "controllerWriteErrors")}
        rule = find(render({"metrics": {"prometheusRule": {"enabled": True, "alerts": off}}}),
                    "PrometheusRule")
        self.assertEqual([g["name"] for g in rule["spec"]["groups"]], ["proxyplan-agent"])

    def dashboard(self, objects: list[dict] | None = None) -> tuple[dict, dict]:
        cm = find(objects or self.objects, "ConfigMap", "proxyplan-dashboard")
        return cm, json.loads(cm["data"]["proxyplan.json"])

    def test_dashboard_configmap(self) -> None:
        cm, board = self.dashboard()
        self.assertEqual(cm["metadata"]["namespace"], NAMESPACE)
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        self.assertEqual(board, json.loads((CHART / "dashboards" / "proxyplan.json").read_text()))
        self.assertEqual(board["uid"], "proxyplan")
        variables = {v["name"]: v for v in board["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        self.assertIn("instance", variables)
        self.assertIn("$job", variables["instance"]["definition"])
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            self.assertEqual(panel["datasource"]["uid"], "${datasource}", panel["title"])
            for target in panel["targets"]:
                self.assertEqual(target["datasource"]["uid"], "${datasource}", panel["title"])
                # Agent series follow the job and node variables (kube-proxy, scraped
                # beside the agents during a migration, has the same kubeproxy_* names);
                # the controller's follow its job variable.
                names = metric_names(target["expr"])
                self.assertTrue(names, panel["title"])
                matchers = re.findall(r"\{([^{}]*)\}", target["expr"])
                self.assertEqual(len(matchers), len(re.findall(r"[a-z_]+\{", target["expr"])))
                if all(n.startswith("proxyplan_controller_") for n in names):
                    wanted = ['job=~"$controller_job"']
                else:
                    wanted = ['job=~"$job"', 'instance=~"$instance"']
                for matcher in matchers:
                    for w in wanted:
                        self.assertIn(w, matcher, f"{panel['title']}: {target['expr']}")
        ids = [p["id"] for p in board["panels"]]
        self.assertEqual(len(ids), len(set(ids)))

    def test_dashboard_metric_names_in_readme(self) -> None:
        _, board = self.dashboard()
        queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.*), *\w+\)", variable["definition"])
                self.assertTrue(match, variable["definition"])
                queries.append(match.group(1))
        seen = set()
        for query in queries:
            for metric in metric_names(query):
                self.assertTrue(in_readme(metric, self.readme),
                                f"{metric} (in {query}) is not in README's metric lists")
                seen.add(re.sub(r"_(bucket|sum|count)$", "", metric))
        for wanted in (
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "kubeproxy_network_programming_duration_seconds",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "proxyplan_agent_sync_errors_total",
            "proxyplan_agent_invalid_plans_total",
            "proxyplan_agent_rules",
            "proxyplan_agent_endpoints",
            "proxyplan_agent_service_ports",
            "proxyplan_controller_objects_written_total",
            "proxyplan_controller_write_errors_total",
            "proxyplan_controller_compute_duration_seconds",
            "proxyplan_controller_is_leader",
        ):
            self.assertIn(wanted, seen)
        self.assertTrue(any("kubeproxy_network_programming_duration_seconds_bucket" in q
                            and q.startswith("histogram_quantile(0.5,") for q in queries))
        self.assertTrue(any("kubeproxy_network_programming_duration_seconds_bucket" in q
                            and q.startswith("histogram_quantile(0.99,") for q in queries))

    def test_dashboard_label_and_namespace(self) -> None:
        objects = render({"metrics": {"dashboard": {
            "enabled": True, "label": "grafana.io/dashboard", "labelValue": "proxy",
            "namespace": "monitoring", "annotations": {"grafana_folder": "Networking"}}}})
        cm, _ = self.dashboard(objects)
        self.assertEqual(cm["metadata"]["labels"]["grafana.io/dashboard"], "proxy")
        self.assertNotIn("grafana_dashboard", cm["metadata"]["labels"])
        self.assertEqual(cm["metadata"]["namespace"], "monitoring")
        self.assertEqual(cm["metadata"]["annotations"], {"grafana_folder": "Networking"})


class Schema(unittest.TestCase):
    def test_rejects_bad_values(self) -> None:
        bad = [
            {"agent": {"mode": "userspace"}},
            {"agent": {"ipvs": {"interface": "a-name-far-too-long"}}},
            {"agent": {"ipvs": {"excludeCIDRs": ["10.0.0.1"]}}},
            {"agent": {"ipvs": {"tcpTimeout": "500ms"}}},
            {"agent": {"iptablesBackend": "both"}},
            {"agent": {"masqueradeBit": 32}},
            {"controller": {"detectLocalMode": "Bridge"}},
            {"controller": {"podBridgeInterface": "a/b"}},
            {"agent": {"nodeportAddresses": ["primary-ish"]}},
            {"controller": {"podInterfaceNamePrefix": "name-longer-than-15"}},
            {"controller": {"clusterShards": 64}},
            {"controller": {"clusterCIDRs": ["not-a-cidr"]}},
            {"controller": {"minSyncInterval": "soon"}},
            {"controller": {"rolloutStatus": "some"}},
            {"agent": {"rolloutReportInterval": "often"}},
            {"controller": {"replica": 2}},
            {"metrics": {"podMonitor": {"interval": "soon"}}},
            {"metrics": {"podMonitor": {"enable": True}}},
            {"metrics": {"prometheusRule": {"alerts": {"nodeNotApplied": {"for": "5 minutes"}}}}},
            {"metrics": {"prometheusRule": {"alerts": {"degraded": {"severity": ""}}}}},
            {"metrics": {"prometheusRule": {"alerts": {
                "programmingLatencyHigh": {"thresholdSeconds": 0}}}}},
            {"metrics": {"prometheusRule": {"alerts": {
                "programmingLatencyHigh": {"thresholdSeconds": "1s"}}}}},
            {"metrics": {"prometheusRule": {"alerts": {"nodeDown": {"enabled": True}}}}},
            {"metrics": {"prometheusRule": {"agentSelector": '{job="x"}'}}},
            {"metrics": {"dashboard": {"label": "not a label"}}},
            {"metrics": {"dashboard": {"labelValue": 1}}},
        ]
        with helm.Chart.load(CHART) as chart:
            for values in bad:
                with self.subTest(values=values):
                    with self.assertRaises(helm.HelmError):
                        chart.validate_schema(values)

    def test_accepts_defaults(self) -> None:
        with helm.Chart.load(CHART) as chart:
            chart.validate_schema({})
            chart.validate_schema(OVERRIDES)
            chart.validate_schema(MONITORING)


class Lint(unittest.TestCase):
    def check(self, values: dict | None) -> None:
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        self.assertEqual(report["errors"], [])
        self.assertEqual(problems, [])
        self.assertEqual(report["total_charts_linted"], 1)

    def test_lint_defaults(self) -> None:
        self.check(None)

    def test_lint_overrides(self) -> None:
        self.check(OVERRIDES)

    def test_lint_monitoring(self) -> None:
        self.check(MONITORING)


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"chart: {passed} passed, {failed} failed")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
