"""`harness rm HOST RUN...` and `harness gc HOST`: removing runs, and the artifacts no kept run needs.

The work is the supervisor's on the host (its `gc` request, host_helpers/cleanup.py): it removes the runs
named (never one that is queued or running), then every artifact of the store that no kept run
made, reused or read, record first (a removal cut short leaves nothing that claims to be
complete), never through a link, never outside the store and runs/; an artifact being made, and
every artifact of a stage a queued or running run names (its keys are known only when its stage
starts), stay. `--dry-run` says what would go and the bytes it would free. Its answer is the
box's: every value is checked here (harness.box_values). On a host whose stages run in the image,
`gc` also removes the containers a crash left and the image tags harness built there that nothing
uses any more (harness.runtime.prune).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness import box_values

if TYPE_CHECKING:
    from harness.host import Host
    from harness.jobs import Jobs
    from harness.runtime.prune import LeftContainer, OldTag


@dataclass(frozen=True)
class Removed:
    stage: str
    key: str
    bytes: int
    complete: bool | None  # with --dry-run: whether it is a complete artifact (else one a failed or cut run left)


@dataclass
class Cleanup:
    host: str
    dry_run: bool
    runs: list[str] = field(default_factory=list)
    artifacts: list[Removed] = field(default_factory=list)
    bytes: int = 0
    kept: int = 0  # artifacts a kept run names
    kept_for_live_runs: int = 0  # of stages a queued or running run may read
    kept_busy: int = 0  # being made
    images: list["OldTag"] = field(default_factory=list)  # old image tags (gc on a docker host)
    containers: list["LeftContainer"] = field(default_factory=list)  # containers a crash left (gc on a docker host)

    @classmethod
    def from_json(cls, host: str, data: Any) -> "Cleanup":
        data = box_values.mapping(data)
        artifacts = []
        for a in data.get("artifacts") or []:
            a = box_values.mapping(a)
            artifacts.append(Removed(box_values.stage(a.get("stage"), host), box_values.artifact_key(a.get("key"), host),
                                     box_values.integer(a.get("bytes")) or 0, a.get("complete") if isinstance(a.get("complete"), bool) else None))
        return cls(host, bool(data.get("dry_run")), [box_values.run_id(r, host) for r in data.get("runs") or []], artifacts,
                   box_values.integer(data.get("bytes")) or 0, box_values.integer(data.get("kept")) or 0,
                   box_values.integer(data.get("kept_for_live_runs")) or 0, box_values.integer(data.get("kept_busy")) or 0)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "dry_run": self.dry_run, "runs": self.runs, "bytes": self.bytes,
                "artifacts": [{"stage": a.stage, "key": a.key, "bytes": a.bytes, "complete": a.complete} for a in self.artifacts],
                "kept": self.kept, "kept_for_live_runs": self.kept_for_live_runs, "kept_busy": self.kept_busy,
                "images": [{"ref": t.ref, "image_id": t.image_id, "bytes": t.bytes} for t in self.images], "image_bytes": self.image_bytes,
                "containers": [{"id": c.container_id, "name": c.name, "why": c.why} for c in self.containers]}

    @property
    def image_bytes(self) -> int:
        return sum(t.bytes for t in self.images)


def collect(jobs: "Jobs", remove: list[str], dry_run: bool) -> Cleanup:
    """Remove `remove` (run names as the user gives them: harness.runs.pick_run) and every
    artifact no kept run needs; `dry_run`: only say what would go."""
    return Cleanup.from_json(jobs.name, jobs.collect(remove, dry_run))


def collect_all(host: "Host", dry_run: bool) -> Cleanup:
    """`harness gc`: the artifacts no run needs, and on a docker host the containers a crash left
    and the old image tags."""
    outcome = collect(host.jobs, [], dry_run)
    if host.uses_image:
        from harness.runtime import prune

        live = {r.run_id for rs in host.jobs.listing().runs.values() for r in rs if r.state in ("queued", "running")}
        left = prune.left_containers(host.transport, host.runtime.workdir, live)
        outcome.containers = left if dry_run else prune.remove_containers(host.transport, left)
        tags = prune.old_tags(host.transport, host.config, host.cfg)  # after the containers: an image one held is free now
        outcome.images = tags if dry_run else prune.remove_tags(host.transport, tags)
    return outcome
