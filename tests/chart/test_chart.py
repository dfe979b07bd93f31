#!/usr/bin/env python3
"""Checks the Helm chart charts/proxyplan with a real Helm engine (helm-python-sdk,
which embeds Helm's Go SDK: offline render and lint, no helm binary, no cluster).

Renders the chart with default values and with overrides, lints it, and checks the
rendered manifests: every kind, least-privilege RBAC, security contexts, probes, and the
values reaching the containers' flags. Ends with `chart: N passed, M failed`.

Needs: python3 -m pip install helm-python-sdk pyyaml
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "proxyplan"
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
                    "ClusterRole",
                    "ClusterRole",
                    "ClusterRoleBinding",
                    "ClusterRoleBinding",
                    "Role",
                    "RoleBinding",
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
                             "PodDisruptionBudget", "DaemonSet"}:
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
                ("events.k8s.io", ["events"], ["create", "patch"]),
            ),
        )
        role = find(self.objects, "Role")
        self.assertEqual(
            rules(role), expand(("coordination.k8s.io", ["leases"], ["get", "create", "update"]))
        )
        binding = find(self.objects, "RoleBinding")
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
        pod = find(self.objects, "DaemonSet")["spec"]["template"]["spec"]
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
        strict = render({"agent": {"ipvs": {"strictARP": True, "scheduler": "mh",
                                            "excludeCIDRs": ["10.0.0.0/8", "fd00::/8"]}}})
        spec = find(strict, "DaemonSet")["spec"]["template"]["spec"]
        self.assertIn("arp_ignore=1", spec["initContainers"][1]["command"][-1])
        self.assertIn("ip_vs_mh", spec["initContainers"][1]["command"][-1])
        args = container(strict, "DaemonSet")["args"]
        for flag in ("--ipvs-strict-arp", "--ipvs-scheduler=mh",
                     "--ipvs-exclude-cidrs=10.0.0.0/8,fd00::/8"):
            self.assertIn(flag, args)

    def test_ipvs_timeouts_and_conn_reuse_mode(self) -> None:
        args = container(self.objects, "DaemonSet")["args"]
        for flag in ("--ipvs-tcp-timeout=0s", "--ipvs-tcpfin-timeout=0s",
                     "--ipvs-udp-timeout=0s"):
            self.assertIn(flag, args)
        (init,) = [c for c in find(self.objects, "DaemonSet")["spec"]["template"]["spec"][
            "initContainers"] if c["name"] == "ipvs-sysctls"]
        script = init["command"][-1]
        self.assertIn("4.[1-9]*|5.[0-8].*|5.[0-8]-*)", script)
        self.assertIn("/proc/sys/net/ipv4/vs/conn_reuse_mode", script)
        custom = render({"agent": {"ipvs": {"tcpTimeout": "1h", "tcpFinTimeout": "30s",
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

    def test_iptables_mode_has_no_ipvs_parts(self) -> None:
        objects = render({"agent": {"mode": "iptables"}})
        pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
        self.assertEqual([c["name"] for c in pod["initContainers"]], ["node-setup"])
        args = container(objects, "DaemonSet")["args"]
        self.assertIn("--mode=iptables", args)
        self.assertFalse([a for a in args if a.startswith("--ipvs")])

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
        self.assertIn("--state-dir=/run/proxyplan", container(self.objects, "DaemonSet")["args"])

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
            "--mode=ipvs",
            "--ipvs-scheduler=rr",
            "--ipvs-interface=proxyplan-ipvs0",
            "--ipvs-termination-grace=120s",
            "--iptables-backend=auto",
            "--masquerade-bit=13",
            "--sync-period=30s",
            "--min-sync-interval=1s",
            "--healthz-bind-address=0.0.0.0:10256",
            "--metrics-bind-address=127.0.0.1:10249",
        ):
            self.assertIn(flag, args)
        self.assertFalse([a for a in args if a.startswith("--nodeport-addresses")])

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
            "--min-sync-interval=1s",
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


OVERRIDES = {
    "controller": {
        "replicas": 3,
        "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"],
        "masqueradeAll": True,
        "detectLocalMode": "NodeCIDR",
        "minSyncInterval": "2s",
        "image": {"repository": "registry.example/pp-controller", "tag": "v9", "pullPolicy": "Always"},
    },
    "agent": {
        "iptablesBackend": "legacy",
        "masqueradeBit": 12,
        "nodeportAddresses": ["192.168.0.0/16", "10.0.0.0/8"],
        "syncPeriod": "1m",
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
            "--min-sync-interval=500ms",
            "--metrics-bind-address=0.0.0.0:10250",
            "--healthz-bind-address=0.0.0.0:10266",
        ):
            self.assertIn(flag, args)
        self.assertEqual({p["name"]: p["containerPort"] for p in c["ports"]}, {"healthz": 10266})
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
            {"controller": {"replica": 2}},
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


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"chart: {passed} passed, {failed} failed")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
