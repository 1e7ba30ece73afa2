"""The manifest: what sync put on a host (<workdir>/.harness/sync-manifest.json, written there by
harness/host_helpers/sync_apply.py), one Entry per path, and its digest: equal digests, equal
synced code (a run records the digest of the code it used)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from harness.host_helpers import wire

MANIFEST_PATH = wire.MANIFEST_PATH  # relative to the host's workdir


@dataclass(frozen=True)
class Entry:
    """One synced path as recorded in the manifest."""

    kind: str  # "file" or "link"
    size: int
    mode: int  # permission bits (0 for links)
    sha256: str  # of the content; of the target text for links
    target: str = ""  # link target, as written

    def to_json(self) -> dict:
        return {"kind": self.kind, "size": self.size, "mode": self.mode, "sha256": self.sha256, "target": self.target}

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        return cls(str(d["kind"]), int(d["size"]), int(d["mode"]), str(d["sha256"]), str(d.get("target", "")))


def manifest_digest(files: dict[str, Entry]) -> str:
    """sha256 of the canonical file table: equal digests, equal synced code."""
    table = {p: e.to_json() for p, e in files.items()}
    canonical = json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_manifest(raw: bytes) -> tuple[dict[str, Entry], str | None]:
    """(files, digest) from manifest bytes. An unreadable manifest owns nothing: the sync then
    re-sends everything and deletes nothing."""
    if not raw:
        return {}, None
    try:
        doc = json.loads(raw)
        return {str(p): Entry.from_json(e) for p, e in doc.get("files", {}).items()}, doc.get("digest")
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, None


def manifest_path(workdir: str) -> str:
    """The manifest's path as configured (a leading ~ is expanded by the host's shell)."""
    return workdir.rstrip("/") + "/" + MANIFEST_PATH if workdir != "~" else "~/" + MANIFEST_PATH
