"""The SHA-256 of a local file, and the laptop's cache of them (<project>/.harness/sync-cache.json:
(size, mtime_ns, inode) -> sha256), so that a re-scan reads no file that did not change."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

LOCAL_CACHE_PATH = ".harness/sync-cache.json"  # relative to the project root (laptop)
HASH_BLOCK = 1 << 20


class HashCache:
    """(size, mtime_ns, inode) -> sha256, persisted next to the project so re-scans read nothing."""

    def __init__(self, path: Path | None, root: Path):
        self.path, self.root = path, root
        self.old: dict[str, list] = {}
        self.new: dict[str, list] = {}
        if path is not None:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(data, dict) and data.get("version") == 1:
                    self.old = data.get("files", {})
            except (OSError, ValueError):
                pass

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        hit = self.old.get(rel)
        if hit and hit[:3] == [st.st_size, st.st_mtime_ns, st.st_ino]:
            return hit[3]
        return None

    def store(self, rel: str, st: os.stat_result, digest: str) -> None:
        self.new[rel] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]

    def save(self) -> None:
        if self.path is None or self.new == self.old:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}-{threading.get_ident()}")  # group syncs save from threads
        tmp.write_text(json.dumps({"version": 1, "files": self.new}, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, self.path)
        self.old = dict(self.new)


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a local file, read in blocks (sync's scan and pull's verification)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_BLOCK):
            h.update(chunk)
    return h.hexdigest()
