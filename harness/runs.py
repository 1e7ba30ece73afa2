"""The run interface: what `run`, `status`, `logs`, `cancel`, `runs` and `pull` need from the place
a run lives.

A host (harness.jobs.Jobs) and a group (harness.multinode.GroupRun) both implement `RunInterface`, so
the CLI has one code path for both and one renderer (harness/cli/render.py) that shows what they
return. Each answer also knows its JSON form (`--json`; the keys are listed in docs/json.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from harness.box_values import RUN_ID_RE
from harness.errors import HarnessError, UsageError


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


LIVE_STATES = ("queued", "starting", "running")
LAST_RE = re.compile(r"^last(?:~(\d+))?$")
FRAGMENT_RE = re.compile(r"^(?=.*\d)[0-9a-f-]{4,21}$")  # a start (20261205-2301) or an end (bf858a) of a run id


def names_a_run(text: str) -> bool:
    """Whether `text` is a way of naming a run (pick_run), not a path (`harness pull`'s REMOTE)."""
    return bool(LAST_RE.match(text) or RUN_ID_RE.match(text) or FRAGMENT_RE.match(text))


def logs_broke_off(where: str, run_id: str, what: str) -> HarnessError:
    """A log stream that ended before the run's end (`what`: how): the run may still be running."""
    return HarnessError(f"the logs of run {run_id} {what}; the run itself may still be running",
                        f"`harness status {where} {run_id}`, or `harness logs {where} {run_id} --follow` to follow it again")


def pick_run(ref: str, run_ids: Callable[[], list[str]], where: str) -> str:
    """The run `ref` names among a host's runs (oldest first; asked only when needed): a run id;
    `last`, the newest, or `last~N`, the Nth before it; else a unique start or end of an id
    (`20261205-2301`, `bf858a`). Each other case is one UsageError with the next step."""
    hint = f"`harness runs {where}` lists the runs"
    if RUN_ID_RE.match(ref):
        return ref
    last = LAST_RE.match(ref)
    if not last and not FRAGMENT_RE.match(ref):
        raise UsageError(f"invalid run id {ref!r}: expected a run id (YYYYMMDD-HHMMSS-xxxxxx), a unique part of one, 'last' or 'last~N'", hint)
    ids = run_ids()
    if not ids:
        raise UsageError(f"{where}: no runs yet", f"start one: harness run {where} all")
    if last:
        back = int(last.group(1) or 0)
        if back >= len(ids):
            raise UsageError(f"{where}: {ref}: only {len(ids)} run(s) there", hint)
        return ids[-1 - back]
    matches = [i for i in ids if i.startswith(ref) or i.endswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"{where}: no run {ref}", hint)
    shown = ", ".join(matches[-4:]) + (", ..." if len(matches) > 4 else "")
    raise UsageError(f"{where}: {ref} names {len(matches)} runs ({shown})", "give more of the id")


@dataclass(frozen=True)
class CancelOutcome:
    """`harness cancel`: the final state on each host, or "error: ..." where the cancel failed;
    with dry_run, the state each host has now (nothing was stopped)."""

    run_id: str
    states: dict[str, str]
    group: bool = False
    where: str = ""
    dry_run: bool = False
    ended_before: set[str] = field(default_factory=set)  # hosts where the run had ended already: nothing was stopped

    def exit_code(self) -> int:
        return 1 if any(s.startswith("error") for s in self.states.values()) else 0

    def would_stop(self) -> list[str]:
        """dry_run: the hosts where the run is live (a cancel would stop it there)."""
        return [h for h, state in self.states.items() if state in LIVE_STATES]

    def to_json(self) -> dict[str, Any]:
        """`harness cancel --json`."""
        out: dict[str, Any] = {("group" if self.group else "host"): self.where, "run_id": self.run_id, "dry_run": self.dry_run,
                               "states": dict(self.states), "ok": self.exit_code() == 0, "ended_before": sorted(self.ended_before)}
        if self.dry_run:
            out["would_stop"] = self.would_stop()
        return out


def cancel_preview(jobs: "RunInterface", run_id: str) -> CancelOutcome:
    """What `harness cancel --dry-run` says: the run a cancel would stop and its state on each
    host now; nothing is stopped."""
    view = jobs.status(run_id)
    nodes = getattr(view, "nodes", None)
    states = {n.host: n.state for n in nodes} if nodes is not None else {jobs.name: view.state}
    return CancelOutcome(view.run_id, states, group=nodes is not None, where=jobs.name, dry_run=True)


@dataclass(frozen=True)
class Launched:
    """A run just started (`launch`): its id and the line that says where and how it started."""

    run_id: str
    line: str  # e.g. "run 20260101-120000-abcdef started on gpu1"


class AttachView(Protocol):
    """What `attach` feeds while a run goes on (harness/cli/render.py's AttachRenderer)."""

    def events(self, chunk: bytes) -> None:
        """A host's run: the supervisor's `follow --json` lines (logs, events, stage states)."""
        ...

    def node_line(self, host: str, line: bytes) -> None:
        """A group's run: one line of one node's log. Called from several threads."""
        ...

    def note(self, text: str) -> None:
        """One line for the user (a group: the first node that failed)."""
        ...


class RunInterface(Protocol):
    """Where runs live: one host, or every host of a group."""

    name: str
    #: said after "it keeps running on NAME" when the user detaches (Ctrl-C)
    detach_note: str

    def launch(self, stages: list[str], grace_s: float, now: bool = False, fresh: Sequence[str] = ()) -> Launched:
        """Start a run of these stages (names, `all` or `demo`); `now`: skip the host's queue;
        `fresh`: stages whose artifacts are made anew whatever the store holds ("all": every one)."""
        ...

    def attach(self, run_id: str, view: AttachView, grace_s: float | None = None) -> RunView:
        """Follow the run until it ends, feeding `view`; its final state. A group's failed node
        makes the others stop (bound: poll + grace_s)."""
        ...

    def locate(self, what: str, newest_run: Callable[[str], str | None] | None = None) -> Any:
        """A run id ('last') or a workdir-relative path -> where it is on the host
        (harness.jobs.RemoteTarget; `harness pull`)."""
        ...

    def resolve_run_id(self, run_id: str) -> str:
        """A run id from the user, validated; "last" is the newest run."""
        ...

    def status(self, run_id: str) -> RunView: ...

    def listing(self) -> RunListing: ...

    def stream_logs(self, run_id: str, sink: Callable[[bytes], None], stage: str | None = None, follow: bool = False,
                    as_json: bool = False, tail: int | None = None) -> int:
        """Every stage log of the run from its first byte (tail: its last `tail` lines) into
        `sink` (a group's lines prefixed `[host] `); with follow, until the run ends. as_json: the
        supervisor's JSON lines ({"stage", "log"|"event"|"state"}; a group's with "host").
        Blocks; returns 0."""
        ...

    def cancel_run(self, run_id: str, grace_s: float | None = None) -> CancelOutcome: ...
