"""What a sync will do: the local tree held against the host's manifest, as the paths to send,
the paths to delete (only those the manifest lists under the current sync paths) and the
manifest the host holds afterwards."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from harness.sync.manifest import Entry
from harness.sync.paths import NEVER_SYNCED, clean_rel, under
from harness.sync.scan import LocalTree


@dataclass
class SyncPlan:
    roots: list[str]
    upload: list[str]  # paths to send, sorted
    delete: list[str]  # paths to remove on the host, sorted
    manifest: dict[str, Entry]  # the host manifest after this sync
    local: LocalTree
    ignored_manifest_entries: list[str] = field(default_factory=list)

    @cached_property
    def upload_bytes(self) -> int:  # cached: progress bars ask for it per file
        return sum(self.local.entries[p].size for p in self.upload if self.local.entries[p].kind == "file")

    @property
    def is_noop(self) -> bool:
        return not self.upload and not self.delete


def plan_sync(local: LocalTree, host: dict[str, Entry], roots: Sequence[str]) -> SyncPlan:
    roots = list(roots)
    upload = sorted(p for p, e in local.entries.items() if host.get(p) != e)
    delete: list[str] = []
    manifest: dict[str, Entry] = dict(local.entries)
    ignored: list[str] = []
    for path, entry in host.items():
        if clean_rel(path) is None or path.split("/")[0] in NEVER_SYNCED:
            ignored.append(path)
            continue
        if path in local.entries:
            continue
        if under(path, roots):
            delete.append(path)
        else:
            manifest[path] = entry  # synced earlier from a path no longer configured: left alone
    return SyncPlan(roots, upload, sorted(delete), manifest, local, sorted(ignored))
