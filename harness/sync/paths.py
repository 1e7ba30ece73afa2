"""The paths a sync takes: the configured sync paths made roots, a relative name checked, and a
name as a line shows it."""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Iterable, Sequence

from harness.errors import UsageError
from harness.host_helpers import wire

NEVER_SYNCED = {".git", ".harness"}
PULLED_RUNS = "runs"  # where `harness pull` lands runs, at the project's root: what came from the box never goes back


def shown_path(path: str) -> str:
    """A file name as a line shows it: as it is when printable, else quoted with its escapes (a
    newline in a name must not start a line of its own that reads as harness's)."""
    return path if path.isprintable() else repr(path)


def clean_rel(path: str) -> str | None:
    """A normalized relative POSIX path without `..` (wire.clean_rel), and no `\\` (a Windows
    separator, never a name of ours: the host's apply refuses it too), or None."""
    return None if "\\" in path else wire.clean_rel(path)


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def normalize_roots(paths: Sequence[str]) -> list[str]:
    roots = []
    for p in paths:
        norm = PurePosixPath(p.replace(os.sep, "/")).as_posix().strip("/")
        if norm in ("", ".") or clean_rel(norm) is None or norm.split("/")[0] in NEVER_SYNCED:
            raise UsageError(f"sync path {p!r} must be a path inside the project (not '.', '..' or .git)")
        roots.append(norm)
    # a root inside another root is already covered
    return sorted({r for r in roots if not any(r != o and r.startswith(o + "/") for o in roots)})
