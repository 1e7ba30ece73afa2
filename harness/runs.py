"""The run interface: what `status`, `logs`, `cancel` and `runs` need from the place a run lives.

A host (harness.jobs.Jobs) and a group (harness.multinode.GroupRun) both implement `RunPlace`, so
the CLI has one code path for both and one renderer (harness/cli/render.py) that shows what they
return. Each answer also knows its JSON form (`--json`; the keys are listed in the README).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


class RunView(Protocol):
    """A run's state as `harness status` shows it: jobs.RunStatus (a host) or
    multinode.GroupStatus (a group)."""

    run_id: str

    @property
    def state(self) -> str: ...

    def exit_code(self) -> int:
        """0 when the run succeeded; otherwise the code a script should see (non-zero)."""
        ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RunListing:
    """`harness runs`: every run of a host, or of each host of a group (a group run shares its
    id across hosts). `runs[host]` is that host's list, oldest first; `errors[host]` says why a
    host gave none."""

    where: str
    hosts: list[str]
    runs: dict[str, list[Any]]  # host -> [jobs.RunStatus]
    errors: dict[str, str] = field(default_factory=dict)
    group: bool = False

    def run_ids(self) -> list[str]:
        return sorted({r.run_id for rs in self.runs.values() for r in rs})

    def states(self) -> dict[str, dict[str, str]]:
        """run id -> {host: state} (a host without that run is absent)."""
        out: dict[str, dict[str, str]] = {}
        for host, rs in self.runs.items():
            for r in rs:
                out.setdefault(r.run_id, {})[host] = r.state
        return out

    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_json(self) -> dict[str, Any]:
        if not self.group:
            return {"host": self.where, "runs": [r.summary_json() for r in self.runs.get(self.where, [])]}
        by_id = {host: {r.run_id: r for r in rs} for host, rs in self.runs.items()}
        return {
            "group": self.where,
            "hosts": list(self.hosts),
            "runs": [{"run_id": rid, "nodes": {h: (by_id[h][rid].summary_json() if rid in by_id.get(h, {}) else None) for h in self.hosts}}
                     for rid in self.run_ids()],
            "unreachable": dict(self.errors),
        }


@dataclass(frozen=True)
class CancelOutcome:
    """`harness cancel`: the final state on each host, or "error: ..." where the cancel failed."""

    run_id: str
    states: dict[str, str]
    group: bool = False

    def exit_code(self) -> int:
        return 1 if any(s.startswith("error") for s in self.states.values()) else 0


class RunPlace(Protocol):
    """Where runs live: one host, or every host of a group."""

    name: str

    def resolve_run_id(self, run_id: str) -> str:
        """A run id from the user, validated; "last" is the newest run."""
        ...

    def status(self, run_id: str) -> RunView: ...

    def listing(self) -> RunListing: ...

    def stream_logs(self, run_id: str, sink: Callable[[bytes], None], stage: str | None = None, follow: bool = False) -> int:
        """Every stage log of the run from its first byte into `sink` (a group's lines prefixed
        `[host] `); with follow, until the run ends. Blocks; returns 0."""
        ...

    def cancel_run(self, run_id: str, grace_s: float | None = None) -> CancelOutcome: ...
