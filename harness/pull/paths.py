"""Names: what may land where. A remote name lands in LOCAL_DIR only as a plain relative path,
under parents that are directories inside LOCAL_DIR; a link only when its target stays inside."""

from __future__ import annotations

import os
from pathlib import Path

from harness.host_helpers import wire


def clean_rel(name: str) -> str | None:
    """name when it is a plain relative path (wire.clean_rel) and valid UTF-8, else None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return wire.clean_rel(name)


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def safe_parent(local_root: Path, rel: str) -> Path:
    """Create rel's parent directories under local_root, refusing any existing component that is
    a link leading out of local_root or is not a directory. Returns the parent."""
    root = os.path.realpath(local_root)
    current = root
    for part in rel.split("/")[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current):
            resolved = os.path.realpath(current)
            if not inside(resolved, root):
                raise Unsafe(f"local {os.path.relpath(current, root)} is a link leading out of {local_root}")
            current = resolved
        if not os.path.exists(current):
            os.mkdir(current)
        elif not os.path.isdir(current):
            raise Unsafe(f"local {os.path.relpath(current, root)} is not a directory")
    return Path(current)


class Unsafe(Exception):
    pass


def link_target_ok(rel: str, target: str) -> bool:
    """A link's target as the listing names it: relative, its `..` only at its start (a `..`
    after a name climbs from wherever that name leads on disk, which the text cannot tell),
    and staying inside when read lexically. landed_inside checks it on disk."""
    if not target or target.startswith("/"):
        return False
    parts = target.split("/")
    ups = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
    if ".." in parts[ups:]:
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    return clean_rel(resolved) is not None


def resolves_inside(local_root: Path, directory: Path, target: str) -> bool:
    """Whether a link in directory (a real directory: safe_parent's) to target leads to a place
    inside local_root on what is on disk now, every link on the way followed."""
    root = os.path.realpath(local_root)
    return inside(os.path.realpath(os.path.join(os.path.realpath(directory), target)), root)
