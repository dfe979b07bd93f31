#!/usr/bin/env python3
"""Unit tests of tests/cluster/images.py's Dockerfile reader: what it reads from the real
Dockerfile.agent and Dockerfile.controller (and the test-only Dockerfiles beside this
file), and that what it does not understand is refused with the file and line. Builds
nothing; runs in well under a second:

    python3 tests/cluster/test_images.py
"""

from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import images  # noqa: E402
from images import DockerfileError, parse_dockerfile  # noqa: E402


class RealDockerfiles(unittest.TestCase):
    def test_agent(self):
        plan = parse_dockerfile(REPO / "Dockerfile.agent")
        self.assertEqual(plan.base.ref, "debian:bookworm-slim")
        self.assertEqual(plan.packages,
                         ["iptables", "ipset", "conntrack", "iproute2", "ipvsadm", "kmod"])
        self.assertEqual([(c.name, c.dest) for c in plan.copies],
                         [("proxyplan-agent", "/usr/local/bin/proxyplan-agent")])
        self.assertIsNone(plan.user)  # root, with only the capabilities the chart grants
        self.assertEqual(plan.entrypoint, ["/usr/local/bin/proxyplan-agent"])
        self.assertEqual(plan.cmd, ["run"])
        self.assertEqual(plan.config["ExposedPorts"], {"10256/tcp": {}})
        self.assertIn(f"PATH={images.DEFAULT_PATH}", plan.config["Env"])

    def test_controller(self):
        plan = parse_dockerfile(REPO / "Dockerfile.controller")
        self.assertEqual(plan.base.ref, "gcr.io/distroless/cc-debian12:nonroot")
        self.assertEqual(plan.packages, [])
        self.assertEqual([(c.name, c.dest) for c in plan.copies],
                         [("proxyplan-controller", "/usr/local/bin/proxyplan-controller")])
        self.assertEqual(plan.user, "65532:65532")
        self.assertEqual(plan.entrypoint, ["/usr/local/bin/proxyplan-controller"])
        self.assertEqual(plan.cmd, ["run"])
        self.assertEqual(plan.config["ExposedPorts"], {"9090/tcp": {}, "9091/tcp": {}})
        self.assertEqual(plan.config["WorkingDir"], "/home/nonroot")

    def test_build_args(self):
        # CARGO_PROFILE is the builder's: declared, so not reported as unused.
        plan = parse_dockerfile(REPO / "Dockerfile.agent",
                                {"CARGO_PROFILE": "dev", "NOPE": "1"})
        self.assertEqual(plan.unused_build_args, ["NOPE"])
        with self.assertRaisesRegex(DockerfileError,
                                    r"Dockerfile\.agent:\d+: FROM: base image "
                                    r"'debian:trixie-slim' is not supported"):
            parse_dockerfile(REPO / "Dockerfile.agent", {"DEBIAN_VERSION": "trixie"})

    def test_kube_proxy(self):
        plan = parse_dockerfile(HERE / "Dockerfile.kube-proxy")
        self.assertEqual(plan.base.ref, "debian:bookworm-slim")
        self.assertEqual(plan.packages,
                         ["iptables", "nftables", "conntrack", "ipset", "kmod", "iproute2"])
        self.assertEqual([(c.name, c.dest) for c in plan.copies],
                         [("kube-proxy", "/usr/local/bin/kube-proxy")])
        self.assertEqual(plan.entrypoint, ["/usr/local/bin/kube-proxy"])
        self.assertIsNone(plan.cmd)  # ENTRYPOINT drops the base's CMD, as in docker

    def test_traffic(self):
        plan = parse_dockerfile(HERE / "Dockerfile.traffic")
        self.assertEqual(plan.base.ref, "debian:bookworm-slim")
        self.assertEqual(plan.packages, [])
        self.assertEqual([c.name for c in plan.copies], ["proxyplan-traffic"])
        self.assertEqual(plan.entrypoint, ["/usr/local/bin/proxyplan-traffic"])


class Refusals(unittest.TestCase):
    """Whatever the reader does not understand fails with FILE:LINE."""

    HEAD = "ARG X=1\nFROM rust:1-bookworm AS builder\nRUN cargo build\n"

    def refused(self, final_stage: str, pattern: str, head: str | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "Dockerfile.test"
            path.write_text((self.HEAD if head is None else head) + final_stage)
            with self.assertRaises(DockerfileError) as caught:
                parse_dockerfile(path)
            self.assertRegex(str(caught.exception), f"^{path}:{pattern}")

    def test_unknown_instruction(self):
        self.refused("FROM debian:bookworm-slim\n\n# comment\nFROBNICATE now\n",
                     r"7: FROBNICATE: unknown instruction")

    def test_unknown_instruction_in_builder_stage(self):
        self.refused("FROM debian:bookworm-slim\n", r"2: FOO: unknown instruction",
                     head="FROM rust AS builder\nFOO bar\n")

    def test_instruction_not_interpreted(self):
        self.refused("FROM debian:bookworm-slim\nHEALTHCHECK CMD true\n",
                     r"5: HEALTHCHECK: this instruction is not supported")
        self.refused("FROM debian:bookworm-slim\nWORKDIR /x\n", r"5: WORKDIR: ")

    def test_other_run_forms(self):
        self.refused("FROM debian:bookworm-slim\nRUN apt-get install -y curl\n",
                     r"5: RUN: only `apt-get update")
        # A continued instruction is reported at its first line.
        self.refused("FROM debian:bookworm-slim\nRUN apt-get update \\\n"
                     "    && apt-get install -y curl && rm -rf /var/lib/apt/lists/*\n",
                     r"5: RUN: only `apt-get update")
        self.refused("FROM gcr.io/distroless/cc-debian12:nonroot\nRUN apt-get update &&"
                     " apt-get install -y --no-install-recommends curl"
                     " && rm -rf /var/lib/apt/lists/*\n", r"5: RUN: RUN on gcr.io")

    def test_other_copy_forms(self):
        self.refused("FROM debian:bookworm-slim\nCOPY a /usr/local/bin/a\n",
                     r"5: COPY: only COPY --from=")
        self.refused("FROM debian:bookworm-slim\nCOPY --from=nope /out/a /a\n",
                     r"5: COPY: --from=nope is not an earlier stage")
        self.refused("FROM debian:bookworm-slim\nCOPY --from=builder /src/a /a\n",
                     r"5: COPY: source '/src/a'")
        self.refused("FROM debian:bookworm-slim\nCOPY --chmod=755 --from=builder /out/a /a\n",
                     r"5: COPY: flag --chmod=755")

    def test_shell_form_entrypoint(self):
        self.refused("FROM debian:bookworm-slim\nENTRYPOINT /usr/local/bin/x run\n",
                     r"5: ENTRYPOINT: only the exec form")

    def test_unsupported_base_and_substitution(self):
        self.refused("FROM alpine:3\n", r"4: FROM: base image 'alpine:3'")
        self.refused("FROM debian:${Y}-slim\n", r"4: FROM: \$Y is not defined")
        self.refused("FROM debian:${X:-bookworm}-slim\n", r"4: FROM: unsupported substitution")

    def test_heredoc(self):
        self.refused("FROM debian:bookworm-slim\nRUN <<EOF\napt-get update\nEOF\n",
                     r"5: RUN: heredocs are not supported")


if __name__ == "__main__":
    unittest.main()
