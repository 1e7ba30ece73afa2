"""The source of a Python object as the remote stage interpreter sees it (library API of
`harness inspect`).

One round trip per question: the stdlib-only script harness/host_helpers/inspect_object.py is
called through harness.helpers (the request on stdin) in the host's runtime (so it runs with the
stages' interpreter, image, mounts and working directory), and prints one JSON answer that becomes an
`ObjectInfo` or a `GrepResult` here. Failures come back as typed errors: an unknown name is a
UsageError naming the nearest existing names, a module that fails to import is a
RemoteImportError with the exception and its last frames.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from harness import helpers
from harness.errors import HarnessError, UsageError
from harness.runtime.base import Runtime
from harness.stages import SCRIPTS_DIR
from harness.transport.base import Transport

MARKER = "@@harness-inspect@@ "
DOTTED_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# Importing torch + transformers + speculators takes seconds on a fast box and a minute on a
# loaded one; a hung import (a lock, a stuck CUDA init) must not hang the CLI forever.
DEFAULT_TIMEOUT_S = 300.0

Mode = Literal["auto", "static", "import"]


class UnknownNameError(UsageError):
    """The dotted path names nothing; `suggestions` are the nearest existing names."""

    def __init__(self, message: str, suggestions: list[str]):
        hint = ("did you mean: " + ", ".join(suggestions)) if suggestions else None
        super().__init__(message, hint)
        self.suggestions = suggestions


class RemoteImportError(HarnessError):
    """A module on the path exists but raised while importing on the remote."""

    def __init__(self, module: str, exc_type: str, exc_message: str, frames: list[str]):
        last = f" (at {frames[-1]})" if frames else ""
        super().__init__(f"importing {module} on the remote failed: {exc_type}: {exc_message}{last}")
        self.module, self.exc_type, self.exc_message, self.frames = module, exc_type, exc_message, frames


class InspectProtocolError(HarnessError):
    """The remote interpreter did not answer (not installed, crashed, killed, timed out)."""


@dataclass(frozen=True)
class Unwrapped:
    """One wrapper that was peeled off on the way to the code that runs."""

    how: str  # "functools.wraps (__wrapped__)", "torch.compile / torch._dynamo wrapper", ...
    wrapper: str  # the wrapper's qualified name
    where: str | None  # file:line of the wrapper's own code, when it has any


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class ObjectInfo:
    path: str  # as asked
    kind: str  # module, class, function, method, property, builtin, callable object, data
    resolution: Literal["static", "import"]  # parsed the file without importing, or imported
    qualname: str | None
    module: str | None
    file: str | None
    first_line: int | None
    last_line: int | None
    source: str | None
    signature: str | None
    doc: str | None
    class_mro: list[str] | None  # (not "mro": dataclass would take type.mro for its default)
    decorators: list[str]  # as written in the source (static resolution)
    unwrapped: list[Unwrapped]  # wrappers peeled off the live object (import resolution)
    builtin: bool  # compiled code: no Python source
    dist: Distribution | None
    value_repr: str | None  # for data
    type: str | None  # for data and callable objects
    python: str  # interpreter version that answered
    executable: str
    elapsed_s: float  # time the remote script took (imports included; for all paths of a batch)

    @property
    def where(self) -> str:
        """file:line or file:first-last (or the bare file / "<builtin>")."""
        if not self.file:
            return "<builtin>" if self.builtin else "<unknown file>"
        if self.first_line is None:
            return self.file
        if self.last_line is None or self.last_line == self.first_line:
            return f"{self.file}:{self.first_line}"
        return f"{self.file}:{self.first_line}-{self.last_line}"


@dataclass(frozen=True)
class GrepHit:
    file: str
    line: int
    text: str
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GrepResult:
    package: str
    pattern: str
    roots: list[str]  # the package's directories on the remote
    files_searched: int
    hits: list[GrepHit]
    truncated: bool  # more hits than max_hits
    dist: Distribution | None
    elapsed_s: float


@lru_cache(maxsize=1)


def inspect_object(transport: Transport, runtime: Runtime, path: str, *, mode: Mode = "auto", mro: bool = False, timeout: float = DEFAULT_TIMEOUT_S) -> ObjectInfo:
    """Resolve a dotted path in the remote stage environment and describe what it names."""
    return inspect_objects(transport, runtime, [path], mode=mode, mro=mro, timeout=timeout)[0]


def inspect_objects(transport: Transport, runtime: Runtime, paths: list[str], *, mode: Mode = "auto", mro: bool = False, timeout: float = DEFAULT_TIMEOUT_S) -> list[ObjectInfo]:
    """Several paths in ONE round trip (one interpreter: torch is imported once). Raises the
    first path's error, in order."""
    for path in paths:
        if not DOTTED_PATH.match(path):
            raise UsageError(f"expected a dotted Python path like package.module.Class.method, got {path!r}")
    answer = run_request(transport, runtime, {"op": "objects", "paths": list(paths), "mode": mode, "mro": mro}, timeout)
    infos = []
    for one in answer["results"]:
        if not one.get("ok"):
            raise _error(one["error"])
        infos.append(_object_info(one, answer))
    return infos


def _object_info(one: dict[str, Any], answer: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(
        path=one["path"],
        kind=one["kind"],
        resolution=one["resolution"],
        qualname=one.get("qualname"),
        module=one.get("module"),
        file=one.get("file"),
        first_line=one.get("first_line"),
        last_line=one.get("last_line"),
        source=one.get("source"),
        signature=one.get("signature"),
        doc=one.get("doc"),
        class_mro=one.get("mro"),
        decorators=list(one.get("decorators") or []),
        unwrapped=[Unwrapped(u["how"], u["wrapper"], u.get("where")) for u in one.get("unwrapped") or []],
        builtin=bool(one.get("builtin")),
        dist=_dist(one.get("dist")),
        value_repr=one.get("value_repr"),
        type=one.get("type"),
        python=answer["python"]["version"],
        executable=answer["python"]["executable"],
        elapsed_s=answer["elapsed_s"],
    )


def grep_package(transport: Transport, runtime: Runtime, pattern: str, package: str, *, ignore_case: bool = False, context: int = 1, max_hits: int = 2000, timeout: float = DEFAULT_TIMEOUT_S) -> GrepResult:
    """Search the installed .py files of a package on the remote (the package is located, not
    imported: a package that fails to import can still be searched)."""
    try:
        re.compile(pattern)  # Python's re on both sides: fail fast, before the round trip
    except re.error as e:
        raise UsageError(f"invalid regular expression {pattern!r}: {e}") from None
    if not DOTTED_PATH.match(package):
        raise UsageError(f"expected a package name like speculators, got {package!r}")
    request = {"op": "grep", "pattern": pattern, "package": package, "ignore_case": ignore_case, "context": context, "max_hits": max_hits}
    answer = run_request(transport, runtime, request, timeout)
    return GrepResult(
        package=answer["package"],
        pattern=answer["pattern"],
        roots=answer["roots"],
        files_searched=answer["files_searched"],
        hits=[GrepHit(h["file"], h["line"], h["text"], h.get("before", []), h.get("after", [])) for h in answer["hits"]],
        truncated=answer["truncated"],
        dist=_dist(answer.get("dist")),
        elapsed_s=answer["elapsed_s"],
    )


def run_request(transport: Transport, runtime: Runtime, request: dict[str, Any], timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """One round trip: run the script with the request in the stage environment; return the
    answer's fields or raise its typed error."""
    # The stages run as `python remote_scripts/<stage>.py`: their directory leads sys.path.
    request = {**request, "sys_path": [SCRIPTS_DIR]}
    result = helpers.call(transport, "inspect_object.py", request, where=runtime, env=stage_env(runtime), timeout=timeout)
    answer = parse_answer(result.stdout)
    if answer is None:
        stderr = result.error
        tail = stderr.splitlines()[-1] if stderr else "no output"
        raise InspectProtocolError(
            f"the inspect script on {transport.name} gave no answer (exit code {result.exit_code}): {tail}",
            hint=f"check that {runtime.python!r} runs in the stage environment: harness exec {transport.name} {runtime.python} --version",
        )
    if not answer.get("ok"):
        raise _error(answer["error"])
    return answer


def stage_env(runtime: Runtime) -> dict[str, str]:
    """The host's `env = [names]` with values from this process, as the stages get them (a
    library may import differently with HF_HOME, TRANSFORMERS_OFFLINE, ... set)."""
    return runtime.host.env_values()


def parse_answer(stdout: bytes) -> dict[str, Any] | None:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    return None


def _error(error: dict[str, Any]) -> HarnessError:
    kind = error.get("kind")
    if kind == "not_found":
        return UnknownNameError(error["message"], list(error.get("suggestions") or []))
    if kind == "import_error":
        return RemoteImportError(error["module"], error["exc_type"], error["exc_message"], list(error.get("frames") or []))
    if kind in ("usage", "static_unresolved"):
        return UsageError(error["message"])
    return HarnessError(f"inspect failed on the remote: {error.get('message')}")


def _dist(raw: dict[str, str] | None) -> Distribution | None:
    return Distribution(raw["name"], raw["version"]) if raw else None
