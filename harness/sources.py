"""`harness sources HOST PACKAGE...`: the Python sources of packages as the stages see them,
mirrored into a local folder an editor's language server reads (pyright/pylance/jedi `extraPaths`).

Four steps: locate each package in the stage environment without importing it
(host_helpers/locate_sources.py, one round trip); on docker hosts, copy its files out of the image
onto the mounted workdir; pull them (harness.pull, .py/.pyi/py.typed only: unchanged files move
nothing); prune mirrored files the package no longer has. Layout: DEST/<name>/... for a package,
DEST/<name>.py for a single-module one; DEST itself is the `extraPaths` entry.

Each step in detail: docs/architecture/wings.md, sources.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import box_values, helpers
from harness.errors import HarnessError, UsageError
from harness.pull import PullConnection, PullOptions, Source
from harness.runtime.base import Runtime, WrapOptions
from harness.transport.base import Transport

MARKER = "@@harness-sources@@ "
SOURCE_PATTERNS = ("*.py", "*.pyi", "py.typed")
CACHE_DIR = ".harness/sources"  # on docker hosts, relative to the workdir
DEFAULT_DEST = ".harness/sources"  # locally: DEFAULT_DEST/HOST under the project root
LOCATE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Located:
    name: str
    kind: str  # package | module
    roots: tuple[str, ...]  # where the pull reads them on the host
    version: str | None
    files: int
    bytes: int


@dataclass
class Mirrored:
    """One package's mirror after a call: what moved and what was already there."""

    package: Located
    local_path: Path
    fetched: list[str] = field(default_factory=list)
    identical: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    bytes_received: int = 0  # the fetched files' bytes

    def to_json(self) -> dict[str, Any]:
        """One package in `harness sources --json`."""
        p = self.package
        return {"package": p.name, "version": p.version, "local": str(self.local_path), "fetched": self.fetched, "identical": self.identical,
                "removed": self.removed, "failed": [{"name": n, "why": w} for n, w in self.failed], "bytes_received": self.bytes_received}


def locate(transport: Transport, runtime: Runtime, packages: list[str], timeout: float = LOCATE_TIMEOUT_S) -> list[Located]:
    """Find the packages where the stages run (copied to the workdir's cache on docker hosts).
    An unknown name is one UsageError naming every missing package, before anything moves."""
    bad = [p for p in packages if not p.isidentifier()]
    if bad:
        raise UsageError(f"expected top-level package names like torch or transformers, got {', '.join(map(repr, bad))}")
    cache = f"{runtime.workdir}/{CACHE_DIR}" if runtime.uses_image else None  # files in an image: copied out first
    request = {"packages": list(dict.fromkeys(packages)), "cache": cache}
    # Reading files needs no GPU: the container asks for none (it starts on a busy or GPU-less box).
    result = helpers.call(transport, "locate_sources.py", request, where=runtime, options=WrapOptions(gpus=False), env=runtime.host.env_values(), timeout=timeout)
    answer = _parse(result.stdout)
    if answer is None:
        stderr = result.error
        raise HarnessError(f"{transport.name}: locating packages failed (exit code {result.exit_code}): {stderr.splitlines()[-1] if stderr else 'no output'}")
    if not answer["ok"]:
        parts = []
        for m in answer["missing"]:
            hint = f" (did you mean {', '.join(m['suggestions'])}?)" if m["suggestions"] else ""
            parts.append(f"{m['name']!r}{hint}")
        raise UsageError(f"{transport.name}: no Python package named {', '.join(parts)} where the stages run ({runtime.python}, runtime {runtime.kind})")
    return [_located(p, request["packages"], transport.name) for p in answer["packages"]]


def _located(p: Any, asked: list[str], where: str) -> Located:
    """One package as the box answered: its name becomes a local path under the mirror (and what
    the prune may delete there), so it must be one that was asked for."""
    try:
        name, kind = p["name"], p["kind"]
        if name not in asked or kind not in ("package", "module"):
            raise box_values.BoxValueError(f"{where}: the box answered for package {name!r} ({kind!r}), which was not asked for; refused")
        return Located(name, kind, tuple(str(r) for r in p["roots"]), box_values.text(p.get("version")), int(p["files"]), int(p["bytes"]))
    except (KeyError, TypeError, ValueError) as e:
        raise box_values.BoxValueError(f"{where}: the box's answer for a package is not one ({type(e).__name__}: {e}); refused") from None


def _parse(stdout: bytes) -> dict | None:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    return None


def mirror(transport: Transport, runtime: Runtime, packages: list[str], dest: str | os.PathLike[str], *, host_python: str = "python3") -> list[Mirrored]:
    """Mirror the packages' Python sources into dest (see the module docstring): every package's
    roots in one pull (one remote start)."""
    dest = Path(dest)
    found = locate(transport, runtime, packages)
    out = [Mirrored(p, dest / p.name if p.kind == "package" else dest / f"{p.name}.py") for p in found]
    sources = [Source(root, p.name if p.kind == "package" else ".") for p in found for root in p.roots]
    with PullConnection(transport, PullOptions(include=SOURCE_PATTERNS, python=host_python)) as connection:
        report = connection.pull(sources, dest)
    for result in out:
        # report names are relative to dest: <package>/<rel>, or <module>.py
        prefix = f"{result.package.name}/" if result.package.kind == "package" else ""

        def mine(name: str, _prefix=prefix, _result=result) -> str | None:
            if _prefix:
                return name[len(_prefix):] if name.startswith(_prefix) else None
            return name if name == _result.local_path.name else None

        result.fetched = [r for n in report.fetched if (r := mine(n)) is not None]
        result.identical = [r for n in report.identical if (r := mine(n)) is not None]
        result.failed = [(r, why) for n, why in report.failed + report.refused if (r := mine(n)) is not None]
        result.bytes_received = sum((result.local_path / r if prefix else result.local_path).stat().st_size for r in result.fetched)
        kept = set(result.fetched + result.identical + [r for n in report.links if (r := mine(n)) is not None] + [r for r, _ in result.failed])
        if result.package.kind == "package" and not result.failed:
            result.removed = _prune(result.local_path, kept)
    return out


def _prune(root: Path, kept: set[str]) -> list[str]:
    """Delete mirrored source files under root that the package no longer has."""
    from pathspec import GitIgnoreSpec

    spec = GitIgnoreSpec.from_lines(list(SOURCE_PATTERNS))
    removed = []
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if rel not in kept and spec.match_file(rel):
                os.unlink(os.path.join(dirpath, name))
                removed.append(rel)
        if dirpath != str(root) and not os.listdir(dirpath):
            os.rmdir(dirpath)
    return sorted(removed)


def editor_settings(dest: Path, project_root: Path) -> dict[str, str]:
    """The setting that points each language server at the mirror, by tool."""
    try:
        path = dest.resolve().relative_to(project_root.resolve()).as_posix()  # portable inside the project
    except ValueError:
        path = str(dest.resolve())
    paths = json.dumps([path])
    return {
        "pyright (pyrightconfig.json)": f'{{"extraPaths": {paths}}}',
        "pylance (VS Code settings.json)": f'"python.analysis.extraPaths": {paths}',
        "jedi-language-server (initializationOptions)": f'{{"workspace": {{"extraPaths": {paths}}}}}',
    }
