"""The ML image: its content-hash tag, and `build` on the host's Docker engine.

Tag: `<image>:<hash>`, the hash over every input of the build (container/ and remote_scripts/,
the Dockerfile path, the build arguments, the extra CA bundle). Same inputs, same tag: an
unchanged image is found by `docker image inspect` and not rebuilt. `<image>:latest` names the
last build on that host; jobs, shells and exec use it, and each run records its image ID.

The cache: the classic builder (DOCKER_BUILDKIT=0, the one whose cache rules harness relies on)
takes, for each step, the newest image on the engine with an identical step, so after another
build of the same Dockerfile (other build args, a --no-cache build) a script edit would re-run
the pip layer. Each build names its cache: `--cache-from` the newest image harness built from the
same container/ (label harness.container-hash), else the image :latest names; the builder then
reuses only that image's own layers, whatever else was built on the engine.

The engine is reached by the docker CLI ON THE HOST, through harness's one transport (`docker
build -`, the build context as a tar stream on stdin), not by the docker SDK over ssh://: one
connection, one host-key policy, the build output streamed unchanged. Why: docs/architecture/runtime.md,
"Choices made by measurement".
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from harness.config import Config, ContainerConfig, HostConfig
from harness.errors import RemoteCommandError, UsageError

if TYPE_CHECKING:
    from harness.transport.base import Transport

CONTEXT_DIRS = ("container", "remote_scripts")
EXTRA_CA_NAME = "container/extra-ca.crt"  # the Dockerfile installs this file when present
TAG_LENGTH = 16
CONTAINER_HASH_LABEL = "harness.container-hash"  # BuildInputs.container_hash of the build
_SKIP_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".git"}
# One round trip before a build: the image's ID when it exists (and :latest pointed at it), else
# `cache ID`: the newest image of the repository built from the same container/ ($4: its label),
# else the one :latest names, else none (a first build: the engine's own cache)
_FIND_OR_CACHE = (
    'if id=$(docker image inspect --format "{{.Id}}" "$1" 2>/dev/null) && docker tag "$1" "$2"; then echo "found $id"; exit 0; fi; '
    'src=$(docker images --filter "label=$4" --format "{{.CreatedAt}}\t{{.ID}}" "$3" 2>/dev/null | sort -r | head -n 1 | cut -f 2); '
    '[ -n "$src" ] || src=$(docker image inspect --format "{{.Id}}" "$2" 2>/dev/null); echo "cache $src"'
)
# The build's docker client says its pid first: Ctrl-C on the laptop ends it on the host
# (a docker client that goes away cancels its build on the engine, its step's container too)
BUILD_PID = "harness-build-pid "
_SAY_PID_AND_EXEC = f'echo "{BUILD_PID}$$"; exec "$@"'
# ...and only that client: the pid is still a docker process (never another one that reused it)
_STOP_BUILD = '[ "$(ps -o comm= -p "$1" 2>/dev/null)" = docker ] && kill -TERM "$1"'


@dataclass(frozen=True)
class BuildInputs:
    """Everything that goes into the image, gathered on the laptop."""

    files: dict[str, bytes]  # context path -> content (container/..., remote_scripts/...)
    dockerfile: str  # path inside the context
    build_args: dict[str, str]

    @property
    def content_hash(self) -> str:
        return self._digest(self.files)

    @property
    def container_hash(self) -> str:
        """The same over what the stages' environment is made of, remote_scripts/ left out: runs
        use the scripts synced to the workdir, so a script edit alone leaves the image fit to run."""
        return self._digest([p for p in self.files if not p.startswith("remote_scripts/")])

    def _digest(self, paths) -> str:
        h = hashlib.sha256()
        h.update(b"dockerfile\0" + self.dockerfile.encode() + b"\0")
        for key in sorted(self.build_args):
            h.update(b"arg\0" + key.encode() + b"\0" + self.build_args[key].encode() + b"\0")
        for path in sorted(paths):
            h.update(b"file\0" + path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return h.hexdigest()[:TAG_LENGTH]

    def context_tar(self) -> bytes:
        """A deterministic tar of the build context (fixed mtimes and owners)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path in sorted(self.files):
                data = self.files[path]
                info = tarfile.TarInfo(path)
                info.size = len(data)
                info.mode = 0o755 if data.startswith(b"#!") else 0o644
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()


@dataclass(frozen=True)
class BuildResult:
    ref: str  # image:hash
    image_id: str  # "" when a dry run found none
    built: bool  # False when the image already existed (or on a dry run)
    would_build: bool = False  # a dry run: no image with this content hash on the host


@dataclass(frozen=True)
class BuildOutcome:
    """`harness build` on a host or a group (harness.host: Host.build, Group.build): each host's
    BuildResult; `errors[host]` says why a host of a group failed (a host alone raises). A host
    alone prints its image id on stdout, a group one line per host (`group`)."""

    where: str
    hosts: list[str]
    results: dict[str, BuildResult]
    errors: dict[str, str] = field(default_factory=dict)
    group: bool = False

    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_json(self, dry_run: bool = False) -> dict[str, Any]:
        """`harness build --json`: per host, the image (ref, image_id, built, would_build) or its error."""
        def one(h: str) -> dict[str, Any]:
            if h in self.errors:
                return {"error": self.errors[h]}
            r = self.results[h]
            return {"ref": r.ref, "image_id": r.image_id or None, "built": r.built, "would_build": r.would_build}
        return {"where": self.where, "dry_run": dry_run, "ok": not self.errors, "hosts": {h: one(h) for h in self.hosts}}


def image_ref(container: ContainerConfig, content_hash: str) -> str:
    return f"{container.image}:{content_hash}"


def current_ref(container: ContainerConfig) -> str:
    return f"{container.image}:latest"


def gather_inputs(config: Config, host: HostConfig, extra_ca: bytes | None = None) -> BuildInputs:
    """Read the build context from the project (next to harness.toml)."""
    root = config.root
    c = host.container
    dockerfile = Path(c.dockerfile)
    if dockerfile.is_absolute() or ".." in dockerfile.parts:
        raise UsageError(f"{config.path}: hosts.{host.name}.container.dockerfile: expected a path inside the project, got {c.dockerfile!r}")
    if not (root / dockerfile).is_file():
        raise UsageError(f"{root / dockerfile}: Dockerfile not found")
    missing = sorted(top for top in CONTEXT_DIRS if not (root / top).exists())
    if missing:  # the Dockerfile COPYs them: say so here, not in the middle of docker's output
        raise UsageError(f"{root}: {', '.join(m + '/' for m in missing)} not found next to {config.path.name} (the image is built from them)")
    files: dict[str, bytes] = {}
    for top in {*CONTEXT_DIRS, dockerfile.parts[0]}:
        base = root / top
        if base.is_file():
            files[top] = base.read_bytes()
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_NAMES)
            for name in sorted(filenames):
                if name.endswith((".pyc", ".pyo")) or name == Path(EXTRA_CA_NAME).name:
                    continue
                full = Path(dirpath) / name
                files[full.relative_to(root).as_posix()] = full.read_bytes()
    if extra_ca:
        files[EXTRA_CA_NAME] = extra_ca
    build_args = {"BASE_IMAGE": c.base_image, **c.build_args}
    return BuildInputs(files=files, dockerfile=dockerfile.as_posix(), build_args=build_args)


_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY", re.IGNORECASE)
# a URL's credentials: `user:password@`, a bare token `TOKEN@` (git+https), or a token in its query
_URL_CREDENTIALS = re.compile(r"://(?!git@)[^/@\s]+@|[?&](?:[a-z_]*token|key|api_key|password|secret|sig|signature|auth)=", re.IGNORECASE)


def refuse_secret_build_args(config: Config, host: HostConfig) -> None:
    """A build-arg value stays in the image's history (`docker history` shows each RUN step's
    build args) for anyone who has the image: one that looks like a secret is refused."""
    for name, value in sorted(host.container.build_args.items()):
        if value and (_SECRET_NAME.search(name) or _URL_CREDENTIALS.search(value)):
            raise UsageError(
                f"{config.path}: hosts.{host.name}.container.build_args.{name}: looks like a secret, and docker keeps build-arg "
                "values in the image's history; give the build no secret (e.g. a package index the host reaches without "
                "credentials, or pip's own config on the host) and keep secrets in `env` for the runs"
            )


def inspect_argv(ref: str) -> list[str]:
    """The command that prints the ID of `ref` on the host's engine."""
    return ["docker", "image", "inspect", "--format", "{{.Id}}", ref]


def built_container_hash(transport: "Transport", ref: str) -> str | None:
    """The container/ hash `ref` was built from (its label), or None (no such image, or built
    before the label)."""
    result = transport.run(["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{CONTAINER_HASH_LABEL}"}}}}', ref])
    return (result.text.strip() or None) if result.exit_code == 0 else None


def image_id(transport: "Transport", ref: str, *, strict: bool = True) -> str | None:
    """The ID of `ref` on the host's engine, or None when there is no such image (strict=False:
    None for any failure, e.g. no engine, where another check says why)."""
    result = transport.run(inspect_argv(ref))
    if result.exit_code != 0:
        err = result.stderr.decode("utf-8", "replace")
        if not strict or "No such image" in err or "not found" in err.lower():
            return None
        raise RemoteCommandError("docker image inspect " + ref, result.exit_code, err)
    return result.text.strip() or None


def current_inputs(transport: "Transport", config: Config, host: HostConfig) -> BuildInputs:
    """The inputs `harness build` sends right now, the host's CA bundle included: the one source
    of the image tag (build and doctor both call it, so they always name the same image)."""
    c = host.container
    extra_ca = None
    if c.ca_bundle:
        try:
            extra_ca = transport.get_bytes(transport.expand(c.ca_bundle))
        except FileNotFoundError:
            raise UsageError(f"{config.path}: hosts.{host.name}.container.ca_bundle: {c.ca_bundle} not found on {host.name}") from None
    return gather_inputs(config, host, extra_ca)


def build(
    transport: "Transport",
    config: Config,
    host: HostConfig,
    output: Callable[[bytes], None],
    force: bool = False,
    dry_run: bool = False,
    running: dict[str, str] | None = None,
) -> BuildResult:
    """Build the image on the host unless an image with the same content hash exists (dry_run:
    only say whether it would be built; nothing is tagged or built). `running`: the build's
    docker client pid on the host goes in under the host's name while it runs (a group's build
    stops each by it: stop_build)."""
    c = host.container
    refuse_secret_build_args(config, host)
    inputs = current_inputs(transport, config, host)
    tag = inputs.content_hash
    ref = image_ref(c, tag)
    latest = current_ref(c)
    if dry_run:
        found_id = image_id(transport, ref)
        return BuildResult(ref, found_id or "", built=False, would_build=force or not found_id)
    cache_from = None
    if not force:
        found = transport.run(["sh", "-c", _FIND_OR_CACHE, "sh", ref, latest, c.image, f"{CONTAINER_HASH_LABEL}={inputs.container_hash}"])
        word, _, value = found.text.strip().partition(" ")
        if found.exit_code == 0 and word == "found" and value:
            return BuildResult(ref, value, built=False)
        cache_from = value if word == "cache" and value else None
    # --force-rm: no intermediate containers are left behind, even by a failed step
    # the engine's own build network unless configured: a step reaches no service on the box's loopback
    argv = ["docker", "build", f"--network={c.build_network}", "--force-rm", "-f", inputs.dockerfile, "-t", ref, "-t", latest, "--label", f"harness.content-hash={tag}",
            "--label", f"{CONTAINER_HASH_LABEL}={inputs.container_hash}"]
    if force:
        argv.append("--no-cache")  # forced: every layer again (e.g. to pick up new packages)
    elif cache_from:
        argv += ["--cache-from", cache_from]
    for key in sorted(inputs.build_args):
        argv += ["--build-arg", key]  # by name: docker reads the value from its environment
    argv.append("-")  # the context is the tar on stdin
    # the values travel over stdin ahead of the context (transport/remote_shell.py), never on a
    # command line (`ps` on either side)
    env = {**inputs.build_args, "DOCKER_BUILDKIT": "0"}
    pid = _PidLine(output, lambda p: running.__setitem__(host.name, p) if running is not None else None)
    try:
        result = transport.run(["sh", "-c", _SAY_PID_AND_EXEC, "sh", *argv], env=env, stdin=inputs.context_tar(), stdout=pid.feed, stderr=output)
    except KeyboardInterrupt:
        raise BuildStopped(host.name, bool(pid.pid) and stop_build(transport, pid.pid)) from None
    finally:
        if running is not None:
            running.pop(host.name, None)
    pid.flush()
    if result.exit_code != 0:
        raise RemoteCommandError("docker build", result.exit_code, "see the build output above")
    built_id = image_id(transport, ref)
    if not built_id:
        raise RemoteCommandError("docker build", 1, f"{ref} missing after a successful build")
    return BuildResult(ref, built_id, built=True)


def stop_build(transport: "Transport", pid: str) -> bool:
    """End the build whose docker client has `pid` on the host (Ctrl-C): the engine cancels it.
    Whether it was signalled (not when that client had already ended)."""
    return transport.run(["sh", "-c", _STOP_BUILD, "sh", pid]).exit_code == 0


class BuildStopped(KeyboardInterrupt):
    """Ctrl-C during a build: `stopped` when its docker client on the host was ended (which
    cancels the build on the engine)."""

    def __init__(self, host: str, stopped: bool):
        super().__init__(host)
        self.host = host
        self.stopped = stopped


class _PidLine:
    """The build's stdout, its first line (the docker client's pid on the host) taken off."""

    def __init__(self, output: Callable[[bytes], None], said: Callable[[str], None] = lambda _pid: None):
        self.output = output
        self.said = said
        self.pid = ""
        self._head: bytes | None = b""  # None once the first line is read

    def feed(self, chunk: bytes) -> None:
        if self._head is None:
            self.output(chunk)
            return
        self._head += chunk
        line, nl, rest = self._head.partition(b"\n")
        if not nl:
            return
        self._head = None
        text = line.decode("ascii", "replace")
        if text.startswith(BUILD_PID) and text[len(BUILD_PID):].isdigit():
            self.pid = text[len(BUILD_PID):]
            self.said(self.pid)
        else:
            rest = line + nl + rest
        if rest:
            self.output(rest)

    def flush(self) -> None:
        if self._head:
            self.output(self._head)
        self._head = None
