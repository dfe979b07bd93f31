#!/usr/bin/env python3
"""Builds proxyplan's container images as docker-archive tarballs, without docker.

The cluster tests (../shared/k8s/cluster.sh) run pods on a containerd that has no registry
and no docker engine beside it: an image reaches it as a `docker save` tarball imported
with `ctr -n k8s.io images import FILE.tar`. This tool writes such tarballs from the
binaries cargo has already built.

The one rule: the Dockerfiles stay the single definition of the images. This tool READS
the Dockerfile it is given and interprets its final stage; it has no image recipe of its
own beyond what the base images (`FROM`) stand for. Any instruction, flag or form it does
not understand is refused with the file and line, so that a change to a Dockerfile either
works here too or fails loudly, and the two never drift apart silently. To support a new
form, teach `interpret()` below, not a side list.

What it understands (final stage; every stage before the last FROM is the builder, which
is skipped because cargo builds the binaries outside):

  ARG NAME[=default]           build arguments (`--build-arg NAME=VALUE` overrides), used
                               for ${NAME} / $NAME in FROM, COPY, USER, EXPOSE, ENV, LABEL
  FROM debian:bookworm-slim    a Debian bookworm minbase root (mmdebstrap) with the slim
                               image's dpkg path-excludes; Env PATH, Cmd ["bash"]
  FROM gcr.io/distroless/cc-debian12:nonroot
                               the same files made from Debian bookworm packages (libc6,
                               libgcc-s1, libgomp1, libstdc++6, libssl3, ca-certificates,
                               tzdata, netbase, base-files) plus passwd/group with root,
                               nobody and nonroot (65532); User 65532, WorkingDir
                               /home/nonroot, no shell
  RUN apt-get update && apt-get install -y --no-install-recommends PKGS \\
      && rm -rf /var/lib/apt/lists/*
                               exactly this form, at most once, before any COPY, on the
                               Debian base: PKGS are installed into the base root
  COPY --from=STAGE /out/NAME DEST
                               STAGE an earlier (builder) stage; its /out folder stands
                               for `--binaries DIR`, so DIR/NAME is copied to DEST, mode
                               0755, root-owned, as a layer of its own
  USER, EXPOSE, ENV K=V, LABEL K=V, ENTRYPOINT [...], CMD [...] (exec form only)

Layers: the base root (with the RUN's packages) is one layer, cached under
~/.cache/proxyplan-images/ keyed by everything that defines it (base, suite, mirrors,
package list, slim filters, recipe version), so a second build only copies it; each
copied binary is a layer of its own. `--refresh` rebuilds the cached base (to pick up
Debian updates). mtimes of the binary layers and the config's dates are fixed
(SOURCE_DATE_EPOCH, default 0), so the same binary gives the same image ID.

Needs: root (mmdebstrap in root mode, apt-get install of a missing tool), Debian's apt
and dpkg, and mmdebstrap (installed with apt-get when missing). Python standard library
only.

Usage (from the repository root):

  python3 tests/cluster/images.py --dockerfile Dockerfile.agent --binaries target/debug \\
      --tag proxyplan.test/proxyplan-agent:1 --out /tmp/agent.tar
  ctr --address DIR/containerd/containerd.sock -n k8s.io images import /tmp/agent.tar

`--plan` prints what the Dockerfile was read as (JSON) and builds nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Callable, Iterator

# Bump when the way a cached base layer is made changes: it is part of every cache key.
RECIPE_VERSION = 1

ARCH = "amd64"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The official debian:*-slim images are debuerreotype's "slimify": these dpkg
# path-excludes (kept in the image, so later installs honour them too), then these
# path-includes (dpkg: the last matching rule wins).
SLIM_PATH_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
    "/usr/share/doc/kde/HTML/*/*",
    "/usr/share/gnome/help/*/*",
    "/usr/share/omf/*/*-*.emf",
)
SLIM_PATH_INCLUDES = (
    "/usr/share/doc/*/copyright",
    "/usr/share/doc/kde/HTML/C/*",
    "/usr/share/gnome/help/*/C/*",
    "/usr/share/locale/all_languages",
    "/usr/share/locale/currency/*",
    "/usr/share/locale/l10n/*",
    "/usr/share/locale/languages",
    "/usr/share/locale/locale.alias",
    "/usr/share/omf/*/*-C.emf",
)

# Every instruction a Dockerfile may hold. Unknown names are refused anywhere; in the
# final stage only those interpret() handles are accepted.
DOCKERFILE_INSTRUCTIONS = frozenset(
    "ADD ARG CMD COPY ENTRYPOINT ENV EXPOSE FROM HEALTHCHECK LABEL MAINTAINER ONBUILD RUN "
    "SHELL STOPSIGNAL USER VOLUME WORKDIR".split()
)

# The one RUN form the Debian base understands (whitespace normalised first).
APT_RUN = re.compile(
    r"apt-get update && apt-get install -y --no-install-recommends"
    r" (?P<pkgs>[^&]+?) && rm -rf /var/lib/apt/lists/\*"
)
DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")


class DockerfileError(Exception):
    """A Dockerfile this tool does not understand (message: FILE:LINE: ...)."""


class BuildError(Exception):
    """Building failed (a tool failed, a binary is missing, ...)."""


def log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Logs how long the step took."""
    start = time.monotonic()
    yield
    log(f"{what}: {time.monotonic() - start:.1f}s")


# ---------------------------------------------------------------------------------------
# Base images: what each supported FROM stands for.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """A supported `FROM` image: its config and how its root filesystem is made."""

    ref: str
    kind: str  # "debian-slim" or "distroless-cc"
    suite: str
    config: dict  # the image config the base brings (Env, Cmd, User, WorkingDir)
    allows_run: bool  # whether the apt RUN form may follow (needs apt and a shell)


BASES = {
    "debian:bookworm-slim": Base(
        ref="debian:bookworm-slim",
        kind="debian-slim",
        suite="bookworm",
        config={"Env": [f"PATH={DEFAULT_PATH}"], "Cmd": ["bash"]},
        allows_run=True,
    ),
    "gcr.io/distroless/cc-debian12:nonroot": Base(
        ref="gcr.io/distroless/cc-debian12:nonroot",
        kind="distroless-cc",
        suite="bookworm",
        config={
            "Env": [f"PATH={DEFAULT_PATH}", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
            "User": "65532",
            "WorkingDir": "/home/nonroot",
        },
        allows_run=False,
    ),
}

# distroless/cc-debian12: its Debian packages (gcc-12-base is libgcc-s1's and libgomp1's
# dependency; ca-certificates is taken for its certificates only, not its dependencies).
DISTROLESS_PACKAGES = (
    "base-files",
    "netbase",
    "tzdata",
    "ca-certificates",
    "gcc-12-base",
    "libc6",
    "libgcc-s1",
    "libgomp1",
    "libstdc++6",
    "libssl3",
)
DISTROLESS_PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
    "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
)
DISTROLESS_GROUP = "root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n"
DISTROLESS_NSSWITCH = "hosts: files dns\n"
# Directories whose mode and owner distroless fixes: name -> (mode, uid, gid).
DISTROLESS_DIRS = {
    "root": (0o700, 0, 0),
    "home": (0o755, 0, 0),
    "home/nonroot": (0o700, 65532, 65532),
    "tmp": (0o1777, 0, 0),
    "etc/ssl/certs": (0o755, 0, 0),
}


def debian_sources(suite: str) -> list[str]:
    """The apt sources of debian:SUITE-slim (main of the suite, its updates, security)."""
    return [
        f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_MIRROR} {suite} main",
        f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_MIRROR} {suite}-updates main",
        f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_SECURITY_MIRROR} {suite}-security main",
    ]


# ---------------------------------------------------------------------------------------
# Reading a Dockerfile.
# ---------------------------------------------------------------------------------------


@dataclass
class Instruction:
    """One logical instruction (continuation lines joined)."""

    path: Path
    line: int  # the line it starts on
    name: str  # upper case
    args: str  # the rest, continuation lines joined

    def error(self, message: str) -> DockerfileError:
        return DockerfileError(f"{self.path}:{self.line}: {self.name}: {message}")

    @property
    def text(self) -> str:
        return " ".join(f"{self.name} {self.args}".split())


def read_instructions(path: Path) -> list[Instruction]:
    """Splits a Dockerfile into instructions: parser directives, comments and blank lines
    dropped, `\\`-continued lines joined (comment lines inside them dropped, as docker
    does). Refuses unknown instruction names and heredocs."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DockerfileError(f"{path}: cannot read: {e}") from e
    # Parser directives: only the leading `# key=value` lines.
    first = 0
    for number, line in enumerate(lines, 1):
        m = re.fullmatch(r"\s*#\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(.*?)\s*", line)
        if not m:
            break
        first = number
        if m.group(1).lower() == "escape" and m.group(2) != "\\":
            raise DockerfileError(f"{path}:{number}: parser directive escape={m.group(2)}"
                                  " is not supported (only the default \\)")
    instructions = []
    current: list[str] | None = None
    start = 0
    for number, line in enumerate(lines[first:], first + 1):
        stripped = line.strip()
        if current is None:
            if not stripped or stripped.startswith("#"):
                continue
            current, start = [], number
        elif not stripped or stripped.startswith("#"):
            continue  # inside a continued instruction
        body = line.rstrip()
        if body.endswith("\\"):
            current.append(body[:-1])
            continue
        current.append(line)
        instructions.append(_instruction(path, start, "".join(current)))
        current = None
    if current is not None:
        raise DockerfileError(f"{path}:{start}: the file ends inside a continued line")
    return instructions


def _instruction(path: Path, line: int, logical: str) -> Instruction:
    m = re.match(r"(\S+)\s*(.*)", logical.strip(), re.S)
    ins = Instruction(path, line, m.group(1).upper(), m.group(2).strip())
    name, args = ins.name, ins.args
    if name not in DOCKERFILE_INSTRUCTIONS:
        raise ins.error("unknown instruction")
    if name in ("RUN", "COPY", "ADD") and re.search(r"(?<!<)<<(?!<)-?\s*[\"']?[A-Za-z_]", args):
        raise ins.error("heredocs are not supported by tests/cluster/images.py")
    return ins


def split_flags(ins: Instruction, allowed: set[str]) -> tuple[dict[str, str], str]:
    """Leading `--name=value` flags of an instruction, refusing any not in `allowed`."""
    flags, rest = {}, ins.args
    while rest.startswith("--"):
        token, rest = (rest.split(None, 1) + [""])[:2]
        name, eq, value = token[2:].partition("=")
        if name not in allowed or not eq:
            raise ins.error(f"flag {token} is not supported by tests/cluster/images.py")
        flags[name] = value
    return flags, rest


def substitute(ins: Instruction, text: str, variables: dict[str, str]) -> str:
    """Docker's ${NAME} / $NAME substitution; other forms (${NAME:-x}) are refused, and
    so is a variable that is not defined (docker would substitute an empty string)."""

    def one(m: re.Match) -> str:
        if m.group(0) == "\\$":
            return "$"
        name = m.group(1) or m.group(2)
        if name is None:
            raise ins.error(f"unsupported substitution {m.group(0)!r}")
        if name not in variables:
            raise ins.error(f"${name} is not defined (no ARG or ENV declares it here)")
        return variables[name]

    return re.sub(r"\\\$|\$\{(\w+)\}|\$(\w+)|\$\{[^}]*\}?", one, text)


def parse_assignments(ins: Instruction, text: str) -> list[tuple[str, str | None]]:
    """`K=V K2="v 2"` (ARG also allows a bare `K`)."""
    try:
        tokens = shlex.split(text, posix=True)
    except ValueError as e:
        raise ins.error(f"cannot split {text!r}: {e}") from e
    if not tokens:
        raise ins.error("needs at least one NAME=VALUE")
    out = []
    for token in tokens:
        name, eq, value = token.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
            raise ins.error(f"{token!r} is not NAME=VALUE")
        out.append((name, value if eq else None))
    return out


def exec_form(ins: Instruction) -> list[str]:
    try:
        value = json.loads(ins.args)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ins.error("only the exec form [\"...\", ...] is supported (the shell form"
                        " needs a shell the image may not have)")
    return value


# ---------------------------------------------------------------------------------------
# Interpreting the final stage.
# ---------------------------------------------------------------------------------------


@dataclass
class Copy:
    """A COPY of a built binary: `--binaries`/name to dest."""

    name: str
    dest: str
    instruction: Instruction


@dataclass
class Plan:
    """What a Dockerfile's final stage says to build."""

    dockerfile: Path
    base: Base
    base_from: Instruction
    packages: list[str]  # the apt RUN's packages, in the Dockerfile's order ([] if none)
    run: Instruction | None
    copies: list[Copy]
    config: dict  # the image config: Env, Cmd, Entrypoint, User, ExposedPorts, ...
    unused_build_args: list[str] = field(default_factory=list)

    @property
    def user(self) -> str | None:
        return self.config.get("User")

    @property
    def entrypoint(self) -> list[str] | None:
        return self.config.get("Entrypoint")

    @property
    def cmd(self) -> list[str] | None:
        return self.config.get("Cmd")

    def summary(self) -> dict:
        return {
            "dockerfile": str(self.dockerfile),
            "base": self.base.ref,
            "packages": self.packages,
            "copies": [{"binary": c.name, "dest": c.dest} for c in self.copies],
            "config": self.config,
            "unused_build_args": self.unused_build_args,
        }


def parse_dockerfile(path: str | Path, build_args: dict[str, str] | None = None) -> Plan:
    """Reads a Dockerfile and interprets its final stage (see the module docstring)."""
    path = Path(path)
    build_args = dict(build_args or {})
    instructions = read_instructions(path)
    declared: set[str] = set()  # every ARG name, in any stage (for unused build args)

    # Global ARGs (before the first FROM), then the stages.
    global_args: dict[str, str] = {}
    stages: list[list[Instruction]] = []
    for ins in instructions:
        if ins.name == "FROM":
            stages.append([ins])
        elif not stages:
            if ins.name != "ARG":
                raise ins.error("only ARG may come before the first FROM")
            for name, default in parse_assignments(ins, ins.args):
                declared.add(name)
                if name in build_args:
                    global_args[name] = build_args[name]
                elif default is not None:
                    global_args[name] = substitute(ins, default, global_args)
        else:
            stages[-1].append(ins)
    if not stages:
        raise DockerfileError(f"{path}: no FROM")

    # Builder stages: skipped (cargo builds the binaries), only their names are needed.
    stage_names: set[str] = set()
    for stage in stages[:-1]:
        _, name = _from(stage[0], global_args, skipped=True)
        if name:
            stage_names.add(name)
        for ins in stage[1:]:
            if ins.name == "ARG":
                declared.update(n for n, _ in parse_assignments(ins, ins.args))

    final = stages[-1]
    ref, _ = _from(final[0], global_args)
    base = BASES.get(ref)
    if base is None:
        raise final[0].error(
            f"base image {ref!r} is not supported by tests/cluster/images.py"
            f" (supported: {', '.join(sorted(BASES))})")
    config = json.loads(json.dumps(base.config))
    env = dict(e.split("=", 1) for e in config.get("Env", []))
    args: dict[str, str] = {}
    packages: list[str] = []
    run: Instruction | None = None
    copies: list[Copy] = []
    cmd_set = False
    for ins in final[1:]:
        variables = {**args, **env}
        if ins.name == "ARG":
            for name, default in parse_assignments(ins, ins.args):
                declared.add(name)
                if name in build_args:
                    args[name] = build_args[name]
                elif default is not None:
                    args[name] = substitute(ins, default, variables)
                elif name in global_args:
                    args[name] = global_args[name]
        elif ins.name == "RUN":
            if not base.allows_run:
                raise ins.error(f"RUN on {base.ref} (it has no shell)")
            if run is not None:
                raise ins.error(f"a second RUN (only one apt RUN is supported; the first"
                                f" is line {run.line})")
            if copies:
                raise ins.error("RUN after COPY is not supported (the packages go into"
                                " the base layer, below the binaries)")
            m = APT_RUN.fullmatch(" ".join(ins.args.split()))
            if not m:
                raise ins.error(
                    "only `apt-get update && apt-get install -y --no-install-recommends"
                    " PKGS && rm -rf /var/lib/apt/lists/*` is supported")
            packages = m.group("pkgs").split()
            for pkg in packages:
                if not DEBIAN_PACKAGE.fullmatch(pkg):
                    raise ins.error(f"{pkg!r} is not a Debian package name")
            run = ins
        elif ins.name == "COPY":
            flags, rest = split_flags(ins, {"from"})
            if "from" not in flags:
                raise ins.error("only COPY --from=<builder stage> is supported (files from"
                                " the build context are not)")
            if flags["from"].lower() not in stage_names:
                raise ins.error(f"--from={flags['from']} is not an earlier stage")
            if rest.startswith("["):
                raise ins.error("the JSON form of COPY is not supported")
            parts = substitute(ins, rest, variables).split()
            if len(parts) != 2:
                raise ins.error("needs exactly one source and one destination")
            src, dest = parts
            m = re.fullmatch(r"/out/([A-Za-z0-9][A-Za-z0-9._-]*)", src)
            if not m:
                raise ins.error(f"source {src!r}: only /out/NAME (the builder's output"
                                " folder, which stands for --binaries) is supported")
            if not dest.startswith("/") or "*" in dest or "?" in dest:
                raise ins.error(f"destination {dest!r} must be an absolute path")
            if dest.endswith("/"):
                dest += m.group(1)
            dest = posixpath.normpath(dest)
            copies.append(Copy(m.group(1), dest, ins))
        elif ins.name == "USER":
            user = substitute(ins, ins.args, variables)
            if not re.fullmatch(r"[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?", user):
                raise ins.error(f"{user!r} is not USER name-or-uid[:group-or-gid]")
            config["User"] = user
        elif ins.name == "EXPOSE":
            ports = config.setdefault("ExposedPorts", {})
            for port in substitute(ins, ins.args, variables).split():
                m = re.fullmatch(r"(\d+)(?:/(tcp|udp|sctp))?", port, re.I)
                if not m:
                    raise ins.error(f"{port!r} is not PORT[/tcp|udp|sctp]")
                ports[f"{m.group(1)}/{(m.group(2) or 'tcp').lower()}"] = {}
        elif ins.name in ("ENV", "LABEL"):
            for name, value in parse_assignments(ins, substitute(ins, ins.args, variables)):
                if value is None:
                    raise ins.error(f"{name}: only the NAME=VALUE form is supported")
                if ins.name == "ENV":
                    env[name] = value
                    config["Env"] = [f"{k}={v}" for k, v in env.items()]
                else:
                    config.setdefault("Labels", {})[name] = value
        elif ins.name == "ENTRYPOINT":
            config["Entrypoint"] = exec_form(ins)
            if not cmd_set:  # as docker: ENTRYPOINT drops the base image's CMD
                config.pop("Cmd", None)
        elif ins.name == "CMD":
            config["Cmd"] = exec_form(ins)
            cmd_set = True
        else:
            raise ins.error("this instruction is not supported by tests/cluster/images.py"
                            " (teach it there before using it in a Dockerfile)")
    seen_dests: set[str] = set()
    for c in copies:
        if c.dest in seen_dests:
            raise c.instruction.error(f"{c.dest} is copied twice")
        seen_dests.add(c.dest)
    return Plan(
        dockerfile=path,
        base=base,
        base_from=final[0],
        packages=packages,
        run=run,
        copies=copies,
        config=config,
        unused_build_args=sorted(set(build_args) - declared),
    )


def _from(ins: Instruction, global_args: dict[str, str],
          skipped: bool = False) -> tuple[str, str | None]:
    """`FROM image [AS name]` -> (image with ARGs substituted, name). A skipped (builder)
    stage may carry --platform, and its image is left as written."""
    _, rest = split_flags(ins, {"platform"} if skipped else set())
    parts = rest.split()
    if len(parts) not in (1, 3) or (len(parts) == 3 and parts[1].lower() != "as"):
        raise ins.error("expected FROM IMAGE [AS NAME]")
    image = parts[0] if skipped else substitute(ins, parts[0], global_args)
    return image, parts[2].lower() if len(parts) == 3 else None


# ---------------------------------------------------------------------------------------
# Layer tars.
# ---------------------------------------------------------------------------------------


class _HashingFile:
    """A write-only file that hashes and counts what goes through it."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.size


class _HashingReader:
    """A read-only file that hashes what is read through it."""

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        return data


@dataclass
class Layer:
    path: Path
    diff_id: str  # sha256:<hex> of the uncompressed tar
    size: int
    created_by: str


def clean_name(name: str) -> str:
    """A tar member name as docker writes them: relative, no ./, no trailing /."""
    name = posixpath.normpath("/" + name).lstrip("/")
    return "" if name == "." else name


class LayerWriter:
    """Writes one layer tar (uncompressed, PAX) and computes its diff_id as it goes.

    Names are normalised (no leading ./), a directory seen twice is written once, and a
    non-directory seen twice is an error (two packages or copies claiming one path)."""

    def __init__(self, path: Path, epoch: int):
        self.path = path
        self.epoch = epoch  # mtime of the members made here (add_dir/add_bytes/add_file)
        self._file = open(path, "wb")
        self._out = _HashingFile(self._file)
        self._tar = tarfile.open(fileobj=self._out, mode="w", format=tarfile.PAX_FORMAT)
        self._tar.copybufsize = 1 << 20
        self.seen: dict[str, bool] = {}  # name -> is a directory

    def add(self, info: tarfile.TarInfo, fileobj=None) -> bool:
        """Adds a member (from another tar or made here). False if skipped (a repeated
        directory or the root itself)."""
        info.name = clean_name(info.name)
        if not info.name:
            return False
        if info.islnk():
            info.linkname = clean_name(info.linkname)
            if info.linkname not in self.seen:
                raise BuildError(f"{self.path.name}: hard link {info.name} to"
                                 f" {info.linkname}, which this layer does not hold")
        # Keep only extended attributes from the source's PAX headers; a stale `path`
        # there would override the normalised name.
        info.pax_headers = {k: v for k, v in info.pax_headers.items()
                            if k.startswith("SCHILY.xattr.")}
        info.mtime = int(info.mtime)
        if info.name in self.seen:
            if info.isdir() and self.seen[info.name]:
                return False
            raise BuildError(f"{self.path.name}: {info.name} is written twice")
        self.seen[info.name] = info.isdir()
        self._tar.addfile(info, fileobj)
        return True

    def _info(self, name: str, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.mode, info.uid, info.gid = mode, uid, gid
        info.uname = info.gname = "root" if uid == 0 else ""
        info.mtime = self.epoch
        return info

    def add_dir(self, name: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        info = self._info(name, mode, uid, gid)
        info.type = tarfile.DIRTYPE
        self.add(info)

    def add_parents(self, name: str) -> None:
        """Adds the directories above `name` that this layer has not written yet."""
        parts = clean_name(name).split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            if parent not in self.seen:
                self.add_dir(parent)

    def add_bytes(self, name: str, data: bytes, mode: int = 0o644, uid: int = 0,
                  gid: int = 0) -> None:
        info = self._info(name, mode, uid, gid)
        info.size = len(data)
        self.add(info, io.BytesIO(data))

    def add_file(self, name: str, source: Path, mode: int, uid: int = 0, gid: int = 0) -> None:
        with open(source, "rb") as f:
            info = self._info(name, mode, uid, gid)
            info.size = os.fstat(f.fileno()).st_size
            self.add(info, f)

    def close(self) -> tuple[str, int]:
        """Finishes the tar: (diff_id, size)."""
        self._tar.close()
        self._file.close()
        return "sha256:" + self._out.sha.hexdigest(), self._out.size


# ---------------------------------------------------------------------------------------
# The cache of base layers.
# ---------------------------------------------------------------------------------------


def source_date_epoch() -> int:
    """The mtime of the files this tool makes, and the images' creation date."""
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "proxyplan-images"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock, so concurrent builds make a cached layer once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_layer(cache: Path, kind: str, definition: dict, created_by: str,
                 build: Callable[[LayerWriter], None], refresh: bool) -> tuple[Layer, bool]:
    """The layer `definition` describes, from the cache or built by `build` and cached.
    Returns (layer, was cached)."""
    key = hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:20]
    folder = cache / "layers" / f"{kind}-{key}"
    with locked(cache / "locks" / f"{kind}-{key}.lock"):
        meta_path, tar_path = folder / "layer.json", folder / "layer.tar"
        if not refresh and meta_path.exists() and tar_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta.get("size") == tar_path.stat().st_size:
                return Layer(tar_path, meta["diff_id"], meta["size"], created_by), True
        tmp = cache / "layers" / f".{kind}-{key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        writer = LayerWriter(tmp / "layer.tar", epoch=source_date_epoch())
        try:
            build(writer)
        finally:
            diff_id, size = writer.close()
        meta = {"diff_id": diff_id, "size": size, "definition": definition,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "layer.json").write_text(json.dumps(meta, indent=2) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(tmp, folder)
        return Layer(tar_path, diff_id, size, created_by), False


# ---------------------------------------------------------------------------------------
# Tools from Debian.
# ---------------------------------------------------------------------------------------


def ensure_debian_tools(tools: dict[str, str]) -> None:
    """Installs the Debian package of each missing command ({command: package})."""
    missing = sorted({pkg for cmd, pkg in tools.items() if shutil.which(cmd) is None})
    if not Path(DEBIAN_KEYRING).exists():
        missing.append("debian-archive-keyring")
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BuildError(f"missing Debian packages {' '.join(missing)}: install them"
                         " (apt-get install) or run this as root on Debian")
    with step(f"apt-get install {' '.join(missing)}"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                        "-o", "DPkg::Lock::Timeout=300", *missing], env=env, check=True)


def run_logged(cmd: list[str], log_path: Path, **kwargs) -> None:
    """Runs a command with its output in a log file, whose tail is shown on failure."""
    with open(log_path, "wb") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs).returncode
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-25:]
        raise BuildError(f"{cmd[0]} failed (exit {rc}); log {log_path}:\n" + "\n".join(tail))


# ---------------------------------------------------------------------------------------
# Building the base layers.
# ---------------------------------------------------------------------------------------


def base_layer(plan: Plan, cache: Path, refresh: bool) -> tuple[Layer, bool]:
    base = plan.base
    created_by = f"FROM {base.ref}" + (f" + {plan.run.text}" if plan.run else "")
    if base.kind == "debian-slim":
        packages = sorted(set(plan.packages))
        definition = {
            "recipe": RECIPE_VERSION, "kind": base.kind, "suite": base.suite,
            "variant": "minbase", "merged_usr": MERGED_USR_HOOKS,
            "sources": debian_sources(base.suite),
            "path_excludes": SLIM_PATH_EXCLUDES, "path_includes": SLIM_PATH_INCLUDES,
            "packages": packages, "arch": ARCH,
        }
        return cached_layer(cache, base.kind, definition, created_by,
                            lambda w: build_debian_slim(w, cache, base.suite, packages),
                            refresh)
    if base.kind == "distroless-cc":
        definition = {
            "recipe": RECIPE_VERSION, "kind": base.kind, "suite": base.suite,
            "sources": debian_sources(base.suite), "packages": DISTROLESS_PACKAGES,
            "passwd": DISTROLESS_PASSWD, "group": DISTROLESS_GROUP,
            "nsswitch": DISTROLESS_NSSWITCH, "dirs": sorted(DISTROLESS_DIRS.items()),
            "path_excludes": SLIM_PATH_EXCLUDES, "path_includes": SLIM_PATH_INCLUDES,
            "arch": ARCH,
        }
        return cached_layer(cache, base.kind, definition, created_by,
                            lambda w: build_distroless_cc(w, cache, base.suite), refresh)
    raise AssertionError(base.kind)


def build_debian_slim(writer: LayerWriter, cache: Path, suite: str,
                      packages: list[str]) -> None:
    """debian:SUITE-slim (+ packages): mmdebstrap's minbase root with the slim dpkg
    filters, the packages installed by apt (no Recommends, lists removed), as a tar."""
    ensure_debian_tools({"mmdebstrap": "mmdebstrap"})
    debs = cache / "debs"  # downloaded .debs, kept across builds (sync-in / sync-out)
    debs.mkdir(parents=True, exist_ok=True)
    cmd = [
        "mmdebstrap", "--variant=minbase", "--format=tar", f"--architectures={ARCH}",
        "--skip=essential/unlink",
        # merged /usr by symlinks, as debootstrap (so the official images) makes it; without
        # it bookworm pulls in the usrmerge package, and perl with it.
        f"--hook-dir={MERGED_USR_HOOKS}",
        "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
        f"--setup-hook=sync-in {shlex.quote(str(debs))} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {shlex.quote(str(debs))}",
        *[f"--dpkgopt=path-exclude={p}" for p in SLIM_PATH_EXCLUDES],
        *[f"--dpkgopt=path-include={p}" for p in SLIM_PATH_INCLUDES],
    ]
    if packages:
        cmd.append("--include=" + ",".join(packages))
    cmd += [suite, "-", *debian_sources(suite)]
    log_path = writer.path.parent / "mmdebstrap.log"  # kept beside the cached layer
    what = f"mmdebstrap {suite} minbase" + (f" + {' '.join(packages)}" if packages else "")
    with step(what), open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log_file)
        bad_output = None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|", bufsize=1 << 20) as src:
                for info in src:
                    # The runtime provides /dev's contents, /etc/hostname and
                    # /etc/resolv.conf (mmdebstrap's copies are the build host's).
                    name = clean_name(info.name)
                    if name.startswith("dev/") or name in ("etc/hostname", "etc/resolv.conf"):
                        continue
                    if not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
                        raise BuildError(f"mmdebstrap's output holds {name}, of tar type"
                                         f" {info.type!r}, outside /dev")
                    writer.add(info, src.extractfile(info) if info.isreg() else None)
        except tarfile.TarError as e:  # mmdebstrap failed, most likely: see below
            bad_output = e
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.stdout.close()
            proc.wait()
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace").splitlines()[-25:]
            raise BuildError(f"mmdebstrap failed (exit {proc.returncode}); log {log_path}:\n"
                             + "\n".join(tail))
        if bad_output is not None:
            raise BuildError(f"reading mmdebstrap's output: {bad_output} (log {log_path})")


def slim_excluded(name: str) -> bool:
    """Whether the slim dpkg filters drop /name (dpkg semantics: fnmatch, last rule
    wins, includes after excludes)."""
    path = "/" + name
    excluded = False
    for pattern in SLIM_PATH_EXCLUDES:
        if fnmatchcase(path, pattern):
            excluded = True
    for pattern in SLIM_PATH_INCLUDES:
        if fnmatchcase(path, pattern):
            excluded = False
    return excluded


def apt_download(cache: Path, suite: str, packages: tuple[str, ...], into: Path) -> None:
    """Downloads the .debs of `packages` (no dependencies) into `into`, with an apt
    configuration of our own (the build host's sources and settings play no part)."""
    root = cache / "apt" / suite
    for sub in ("etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d",
                "state/lists/partial", "cache/archives/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "etc/sources.list").write_text("\n".join(debian_sources(suite)) + "\n")
    (root / "state/status").touch()
    (root / "etc/apt.conf").write_text("")
    conf = root / "apt-config"
    conf.write_text("\n".join([
        f'Dir::Etc::main "{root}/etc/apt.conf";',
        f'Dir::Etc::Parts "{root}/etc/apt.conf.d";',
        f'Dir::Etc::SourceList "{root}/etc/sources.list";',
        f'Dir::Etc::SourceParts "{root}/etc/sources.list.d";',
        f'Dir::Etc::Preferences "{root}/etc/preferences";',
        f'Dir::Etc::PreferencesParts "{root}/etc/preferences.d";',
        f'Dir::State "{root}/state";',
        f'Dir::State::status "{root}/state/status";',
        f'Dir::Cache "{root}/cache";',
        'Dir::Cache::pkgcache "";',
        'Dir::Cache::srcpkgcache "";',
        f'APT::Architecture "{ARCH}";',
        f'APT::Architectures {{ "{ARCH}"; }};',
        'Acquire::Languages "none";',
        'APT::Sandbox::User "root";',
        'Debug::NoLocking "true";',
    ]) + "\n")
    env = {**os.environ, "APT_CONFIG": str(conf), "DEBIAN_FRONTEND": "noninteractive"}
    with locked(cache / "locks" / f"apt-{suite}.lock"):
        run_logged(["apt-get", "update"], root / "update.log", env=env)
        try:
            run_logged(["apt-get", "download", *packages], root / "download.log", env=env,
                       cwd=into)
        finally:
            # Only a cold build needs the lists (about 100 MB), and it fetches them anew.
            shutil.rmtree(root / "state/lists", ignore_errors=True)


def build_distroless_cc(writer: LayerWriter, cache: Path, suite: str) -> None:
    """gcr.io/distroless/cc-debian12:nonroot from Debian packages: their files (dpkg-deb
    --fsys-tarfile, slim-filtered, no maintainer scripts), the CA bundle the
    ca-certificates postinst would make, passwd/group/nsswitch.conf, and the
    directories distroless fixes (/tmp 1777, /home/nonroot 0700 65532)."""
    ensure_debian_tools({"apt-get": "apt", "dpkg-deb": "dpkg"})
    with tempfile.TemporaryDirectory(prefix="distroless-", dir=cache) as tmp:
        with step(f"apt-get download {len(DISTROLESS_PACKAGES)} packages"):
            apt_download(cache, suite, DISTROLESS_PACKAGES, Path(tmp))
        certs: dict[str, bytes] = {}
        with step("extract packages"):
            for pkg in DISTROLESS_PACKAGES:
                found = list(Path(tmp).glob(f"{pkg}_*.deb"))
                if len(found) != 1:
                    raise BuildError(f"apt-get download gave {found} for {pkg}")
                proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(found[0])],
                                        stdout=subprocess.PIPE)
                with tarfile.open(fileobj=proc.stdout, mode="r|", bufsize=1 << 20) as src:
                    for info in src:
                        name = clean_name(info.name)
                        if not info.isdir() and slim_excluded(name):
                            continue
                        if name in DISTROLESS_DIRS and info.isdir():
                            info.mode, info.uid, info.gid = DISTROLESS_DIRS[name]
                        data = src.extractfile(info) if info.isreg() else None
                        if (pkg == "ca-certificates" and info.isreg()
                                and name.startswith("usr/share/ca-certificates/")
                                and name.endswith(".crt")):
                            certs[name] = data.read()
                            data = io.BytesIO(certs[name])
                        writer.add(info, data)
                proc.stdout.close()
                if proc.wait() != 0:
                    raise BuildError(f"dpkg-deb --fsys-tarfile {found[0]} failed")
    if not certs:
        raise BuildError("ca-certificates had no certificates")
    for name, (mode, uid, gid) in DISTROLESS_DIRS.items():
        writer.add_parents(name)
        writer.add_dir(name, mode, uid, gid)  # skipped if a package made it (fixed above)
    # What update-ca-certificates writes: every certificate, in name order, each ending
    # with a newline.
    bundle = b"".join(c if c.endswith(b"\n") else c + b"\n" for _, c in sorted(certs.items()))
    writer.add_bytes("etc/ssl/certs/ca-certificates.crt", bundle)
    writer.add_bytes("etc/passwd", DISTROLESS_PASSWD.encode())
    writer.add_bytes("etc/group", DISTROLESS_GROUP.encode())
    writer.add_bytes("etc/nsswitch.conf", DISTROLESS_NSSWITCH.encode())


# ---------------------------------------------------------------------------------------
# The image.
# ---------------------------------------------------------------------------------------


def binary_layer(copy: Copy, binaries: Path, tmp: Path, epoch: int) -> Layer:
    """A layer holding one copied binary (mode 0755, root) and its parent directories."""
    source = binaries / copy.name
    writer = LayerWriter(tmp / f"{copy.name}.layer.tar", epoch=epoch)
    writer.add_parents(copy.dest)
    writer.add_file(copy.dest, source, 0o755)
    diff_id, size = writer.close()
    return Layer(writer.path, diff_id, size, copy.instruction.text)


def normalize_tag(tag: str) -> str:
    """repo[:tag] -> repo:tag (docker's RepoTags always carry the tag)."""
    if not re.fullmatch(r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?"
                        r"(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
                        tag):
        raise BuildError(f"--tag {tag!r} is not a valid image reference (name[:tag])")
    last = tag.rsplit("/", 1)[-1]
    return tag if ":" in last else tag + ":latest"


def image_config(plan: Plan, layers: list[Layer], epoch: int) -> dict:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    return {
        "architecture": ARCH,
        "os": "linux",
        "created": created,
        "config": plan.config,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": created,
                     "created_by": f"{layer.created_by} (tests/cluster/images.py)"}
                    for layer in layers],
    }


def write_docker_archive(out: Path, tags: list[str], layers: list[Layer], config: dict) -> str:
    """Writes the `docker save` tarball; returns the image ID (sha256 of the config).
    Each layer's hash is checked as it is copied (a damaged cache fails here)."""
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    names = [f"{layer.diff_id.split(':', 1)[1]}/layer.tar" for layer in layers]
    manifest = [{"Config": f"{config_id}.json", "RepoTags": tags, "Layers": names}]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")

    def member(name: str, size: int, mode: int = 0o644, kind=tarfile.REGTYPE) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.type, info.mtime = size, mode, kind, 0
        return info

    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.copybufsize = 4 << 20
            written: set[str] = set()
            for layer, name in zip(layers, names):
                if name in written:
                    continue
                written.add(name)
                tar.addfile(member(name.split("/")[0], 0, 0o755, tarfile.DIRTYPE))
                with open(layer.path, "rb") as f:
                    reader = _HashingReader(f)
                    tar.addfile(member(name, layer.size), reader)
                if "sha256:" + reader.sha.hexdigest() != layer.diff_id:
                    raise BuildError(f"{layer.path} does not match its recorded hash"
                                     f" {layer.diff_id}: remove it and build again")
            tar.addfile(member(f"{config_id}.json", len(config_bytes)), io.BytesIO(config_bytes))
            manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
            tar.addfile(member("manifest.json", len(manifest_bytes)), io.BytesIO(manifest_bytes))
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return "sha256:" + config_id


def build(plan: Plan, binaries: Path | None, tags: list[str], out: Path, cache: Path,
          refresh: bool = False) -> str:
    """Builds the image `plan` describes into `out`; returns its image ID."""
    epoch = source_date_epoch()
    if plan.copies and binaries is None:
        raise BuildError(f"{plan.dockerfile} copies binaries: --binaries DIR is needed")
    # Check the binaries before the (possibly long) base build.
    for c in plan.copies:
        if not (binaries / c.name).is_file():
            raise BuildError(f"{c.instruction.path}:{c.instruction.line}: {binaries / c.name}"
                             " does not exist (build it first)")
    what = plan.base.ref + (f" + {len(plan.packages)} packages" if plan.packages else "")
    start = time.monotonic()
    layer, was_cached = base_layer(plan, cache, refresh)
    log(f"base layer {what}: {'cached' if was_cached else 'built'}"
        f" ({layer.size / 1e6:.1f} MB, {layer.path}): {time.monotonic() - start:.1f}s")
    layers = [layer]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".images-", dir=out.parent) as tmp:
        for c in plan.copies:
            with step(f"binary layer {c.dest} ({(binaries / c.name).stat().st_size / 1e6:.1f} MB)"):
                layers.append(binary_layer(c, binaries, Path(tmp), epoch))
        config = image_config(plan, layers, epoch)
        with step(f"write {out}"):
            image_id = write_docker_archive(out, tags, layers, config)
    log(f"{out}: {out.stat().st_size / 1e6:.1f} MB, {', '.join(tags)}, image ID {image_id}")
    return image_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build a docker-archive image tarball from a Dockerfile's final stage,"
                    " without docker (see the module docstring).")
    parser.add_argument("--dockerfile", required=True, type=Path)
    parser.add_argument("--binaries", type=Path,
                        help="folder of the built binaries, which the builder stage's /out"
                             " stands for (target/debug for CARGO_PROFILE=dev)")
    parser.add_argument("--tag", action="append", default=[],
                        help="image name[:tag] (repeatable)")
    parser.add_argument("--out", type=Path, help="the tarball to write")
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--refresh", action="store_true",
                        help="rebuild the cached base layer (picks up Debian updates)")
    parser.add_argument("--plan", action="store_true",
                        help="print what the Dockerfile was read as (JSON) and stop")
    a = parser.parse_args(argv)
    total = time.monotonic()
    try:
        build_args = {}
        for item in a.build_arg:
            name, eq, value = item.partition("=")
            if not eq:
                raise BuildError(f"--build-arg {item!r} is not NAME=VALUE")
            build_args[name] = value
        with step(f"read {a.dockerfile}"):
            plan = parse_dockerfile(a.dockerfile, build_args)
        for name in plan.unused_build_args:
            log(f"warning: --build-arg {name} is not declared by {a.dockerfile}")
        if a.plan:
            print(json.dumps(plan.summary(), indent=2))
            return 0
        if not a.tag or a.out is None:
            parser.error("--tag and --out are required (or --plan)")
        tags = list(dict.fromkeys(normalize_tag(t) for t in a.tag))
        build(plan, a.binaries, tags, a.out, a.cache_dir, a.refresh)
    except (DockerfileError, BuildError, subprocess.CalledProcessError) as e:
        print(f"images.py: error: {e}", file=sys.stderr)
        return 1
    log(f"total: {time.monotonic() - total:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
