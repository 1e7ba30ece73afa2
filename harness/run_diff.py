"""`harness diff HOST RUN_A RUN_B`: two runs side by side, what made them and what they measured.

Each run's record (run.json) says what made its artifacts: for every stage the key, and the
parts the host hashed into it (harness/host_helpers/artifact_store.py: flags, inputs, code,
environment). The diff lines them up: the settings (`--set` and the pipeline as configured),
each stage's artifact (the same key: the same artifact, made once), its flags, its code and
environment digests, the library versions, and tau overall and per category (evaluate's summary).
Rows that agree are counted, not shown, but for the artifacts and the taus.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.events import evaluation
from harness.stages import STAGES

if TYPE_CHECKING:
    from harness.jobs import RunStatus
    from harness.runs import RunInterface

ALWAYS_SHOWN = ("artifact", "tau")  # sections shown whether the runs agree or not


@dataclass(frozen=True)
class Row:
    section: str  # setting | artifact | flag | code | environment | version | tau
    name: str
    a: Any
    b: Any

    @property
    def same(self) -> bool:
        return self.a == self.b

    def to_json(self) -> dict[str, Any]:
        return {"section": self.section, "name": self.name, "a": self.a, "b": self.b, "same": self.same}


@dataclass
class RunDiff:
    host: str
    a: str
    b: str
    rows: list[Row] = field(default_factory=list)

    @property
    def shown(self) -> list[Row]:
        return [r for r in self.rows if not r.same or r.section in ALWAYS_SHOWN]

    @property
    def agreeing(self) -> int:
        return sum(1 for r in self.rows if r.same and r.section not in ALWAYS_SHOWN)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "a": self.a, "b": self.b, "rows": [r.to_json() for r in self.rows]}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"stages": {"train": {"lr": 1}}} -> {"stages.train.lr": 1}."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def short_digest(value: Any) -> str | None:
    if value is None:
        return None
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def _pairs(section: str, a: dict[str, Any], b: dict[str, Any]) -> list[Row]:
    return [Row(section, name, a.get(name), b.get(name)) for name in sorted(set(a) | set(b))]


def artifact_rows(a: dict[str, Any], b: dict[str, Any]) -> list[Row]:
    """Per stage of either run: the artifact (key and how the run came by it), its flags, and
    digests of its code and environment (from the parts of its key)."""
    rows: list[Row] = []
    order = list(STAGES)
    stages = sorted(set(a) | set(b), key=lambda s: order.index(s) if s in order else len(order))
    for stage in stages:
        ea, eb = a.get(stage) or {}, b.get(stage) or {}
        shown = [f"{e['key']} ({e.get('role')})" if e.get("key") else None for e in (ea, eb)]
        rows.append(Row("artifact", stage, *shown))
        pa, pb = ea.get("parts") or {}, eb.get("parts") or {}
        rows += _pairs("flag", {f"{stage}.{k}": v for k, v in (pa.get("flags") or {}).items()},
                       {f"{stage}.{k}": v for k, v in (pb.get("flags") or {}).items()})
        rows.append(Row("code", stage, short_digest(pa.get("code")), short_digest(pb.get("code"))))
        rows.append(Row("input", stage, short_digest(pa.get("inputs")), short_digest(pb.get("inputs"))))
        rows.append(Row("environment", stage, short_digest(pa.get("environment")), short_digest(pb.get("environment"))))
    return rows


def tau_rows(a: "RunStatus", b: "RunStatus") -> list[Row]:
    """evaluate's tau of each run, overall and per category (None where a run measured none)."""
    ea, eb = (_evaluation(s) for s in (a, b))
    rows = [Row("tau", "overall", ea.tau if ea else None, eb.tau if eb else None)]
    categories = sorted(set(ea.by_category if ea else {}) | set(eb.by_category if eb else {}))
    for c in categories:
        rows.append(Row("tau", c, ((ea.by_category if ea else {}).get(c) or {}).get("tau"), ((eb.by_category if eb else {}).get(c) or {}).get("tau")))
    return rows


def served_rows(a: "RunStatus", b: "RunStatus") -> list[Row]:
    """serve_check's figures of each run: served tau, the speedup at each k and concurrency, and
    the recommended k."""
    sa, sb = (_finished_summary(s, "serve_check") for s in (a, b))
    pick = lambda summary, key: summary.get(key) if isinstance(summary.get(key), (int, float)) else None  # noqa: E731
    rows = [Row("served", name, pick(sa, name), pick(sb, name)) for name in ("served_tau", "recommended_k", "recommended_speedup", "target_concurrency")
            if pick(sa, name) is not None or pick(sb, name) is not None]
    speedups = lambda summary: {f"k={k} at {c}": v for k, row in (summary.get("speedup") or {}).items() if isinstance(row, dict)  # noqa: E731
                                for c, v in row.items() if isinstance(v, (int, float))}
    return rows + _pairs("speedup", speedups(sa), speedups(sb))


def _finished_summary(status: "RunStatus", stage_name: str) -> dict[str, Any]:
    """The finished event of the run's stage, where it ended ok ({} otherwise)."""
    stage = next((s for s in status.stages if s.stage == stage_name and s.state == "ok"), None)
    return stage.last_event if stage is not None and isinstance(stage.last_event, dict) else {}


def _evaluation(status: "RunStatus"):
    summary = _finished_summary(status, "evaluate")
    return evaluation(summary) if summary else None


def diff(jobs: "RunInterface", run_a: str, run_b: str) -> RunDiff:
    """The two runs of one host, side by side."""
    a, b = jobs.status(run_a), jobs.status(run_b)
    ra, rb = a.record, b.record
    out = RunDiff(jobs.name, a.run_id, b.run_id)
    out.rows += _pairs("setting", {f"--set {k}": v for k, v in (ra.get("set") or {}).items()}, {f"--set {k}": v for k, v in (rb.get("set") or {}).items()})
    out.rows += _pairs("setting", flatten((ra.get("config") or {}).get("pipeline") or {}), flatten((rb.get("config") or {}).get("pipeline") or {}))
    out.rows += artifact_rows(ra.get("artifacts") or {}, rb.get("artifacts") or {})
    out.rows += _pairs("version", {**(ra.get("versions") or {}), "image": (ra.get("image") or {}).get("id")},
                       {**(rb.get("versions") or {}), "image": (rb.get("image") or {}).get("id")})
    out.rows += tau_rows(a, b)
    out.rows += served_rows(a, b)
    return out
