"""What a sync tells as it goes (ProgressCallback), what it did (SyncResult; SyncOutcome for a
host or a group) and why a host refused part of it (SyncError)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from harness.errors import HarnessError
from harness.sync.plan import SyncPlan

ProgressCallback = Callable[[int, int], None]  # (files sent so far, bytes sent so far)


class SyncError(HarnessError):
    """The host refused part of a sync (the message lists what and why)."""


@dataclass
class SyncResult:
    plan: SyncPlan
    dry_run: bool
    files_sent: int = 0
    bytes_sent: int = 0
    deleted: int = 0
    manifest_digest: str = ""
    refused: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class SyncOutcome:
    """`harness sync` on a host or a group (harness.host: Host.sync, Group.sync): each host's
    SyncResult, in the place's host order; `errors[host]` says why a host of a group failed (a
    host alone raises instead)."""

    where: str
    hosts: list[str]
    results: dict[str, SyncResult]
    errors: dict[str, str] = field(default_factory=dict)

    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_json(self, dry_run: bool) -> dict[str, Any]:
        """`harness sync --json`: per host, what moved (dry_run: what would), or its error."""
        def one(h: str) -> dict[str, Any]:
            if h in self.errors:
                return {"error": self.errors[h]}
            r = self.results[h]
            plan = r.plan
            return {"upload": list(plan.upload), "delete": list(plan.delete), "upload_bytes": plan.upload_bytes,
                    "unchanged": len(plan.local.entries) - len(plan.upload), "files_sent": r.files_sent, "bytes_sent": r.bytes_sent,
                    "deleted": r.deleted, "manifest_digest": r.manifest_digest or None,
                    "skipped": [{"name": n, "why": w} for n, w in plan.local.skipped]}
        return {"where": self.where, "dry_run": dry_run, "ok": not self.errors, "hosts": {h: one(h) for h in self.hosts}}
