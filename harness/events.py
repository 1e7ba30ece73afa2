"""The stage events as the laptop reads them: the one place that knows their fields.

The GPU side writes them (remote_scripts/common/events.py) as JSON lines; the supervisor hands
them on unchanged (a stage's last event and latest tau in `status`, every event in `follow
--json`). The contract both sides keep is docs/events.json; tests/test_events_contract.py holds
this reader and that writer to it (neither side imports the other). `parse` turns one decoded
line into a typed event (the common "t" and "stage" are not kept: the laptop knows the stage
from where it read the line); anything else (an unknown kind, a missing or mistyped field, a record
from an older writer) is None, and callers show nothing rather than fail.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

CAUSES = ("own", "peer", "cancelled")
# docs/events.json acceptance_lengths: the writer never writes one below 1 (no round measured is a
# failed stage); one read from an older writer is not shown as if it had been measured.
ACCEPTANCE_LENGTHS = ("tau", "tau_per_position", "tau_without_loops", "served_tau", "delivered_tau", "evaluate_tau", "best_tau")
MIN_ACCEPTANCE_LENGTH = 1.0


def acceptance_length(value: Any) -> float | None:
    """`value` when it is an acceptance length as measured (a number, at least 1), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= MIN_ACCEPTANCE_LENGTH:
        return float(value)
    return None


@dataclass(frozen=True)
class Started:
    args: dict[str, Any]


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    unit: str


@dataclass(frozen=True)
class Metric:
    step: int
    metrics: dict[str, Any]


@dataclass(frozen=True)
class Artifact:
    path: str
    kind: str


@dataclass(frozen=True)
class Message:
    text: str


@dataclass(frozen=True)
class Warning_:
    text: str


@dataclass(frozen=True)
class Finished:
    status: str  # ok | failed
    error: str | None = None  # a failure, in one line
    cause: str | None = None  # a failure's: own | peer | cancelled (CAUSES)
    node_rank: int | None = None  # the node of a group run that wrote it
    summary: dict[str, Any] = field(default_factory=dict)  # what a stage that ended ok reported

    @property
    def failed(self) -> bool:
        return self.status == "failed"


Event = Union[Started, Progress, Metric, Artifact, Message, Warning_, Finished]
KINDS: dict[str, type] = {"started": Started, "progress": Progress, "metric": Metric, "artifact": Artifact,
                          "message": Message, "warning": Warning_, "finished": Finished}
_TYPES = {"str": str, "int": int, "float": (int, float), "dict[str, Any]": dict}


def parse(raw: Any) -> Event | None:
    """One decoded events.jsonl line -> its typed event, or None when it is not one."""
    if not isinstance(raw, dict):
        return None
    cls = KINDS.get(raw.get("event"))  # type: ignore[arg-type]
    if cls is None:
        return None
    values: dict[str, Any] = {}
    known = set()
    for f in dataclasses.fields(cls):
        known.add(f.name)
        if f.name == "summary":
            continue
        value = raw.get(f.name)
        if value is None:
            if f.default is dataclasses.MISSING:
                return None
            continue
        expected = _TYPES.get(str(f.type).replace(" | None", ""))
        if expected is None or not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            return None
        values[f.name] = value
    if cls is Finished:
        values["summary"] = {k: v for k, v in raw.items() if k not in known and k not in ("event", "stage", "t")}
        if values.get("cause") not in (None, *CAUSES):
            values.pop("cause")
    return cls(**values)


def finished_failure(raw: Any) -> Finished | None:
    """A stage's last event when it is a failed `finished` (its error and cause), else None."""
    event = parse(raw)
    return event if isinstance(event, Finished) and event.failed else None


@dataclass(frozen=True)
class Evaluation:
    """evaluate's finished summary as the laptop reads it (docs/events.json, "summaries"): tau
    over the split's prompts and per category of prompt ({category: {"tau", "prompts"}})."""

    tau: float
    split: str | None = None
    by_category: dict[str, dict[str, Any]] = field(default_factory=dict)


def evaluation(raw: Any) -> Evaluation | None:
    """An ok evaluate `finished` -> its Evaluation; anything else (another stage's, an older
    writer's without a measured tau) -> None. A category whose entry is not {"tau": number >= 1, ...}
    (None: no round measured there) is left out."""
    event = parse(raw)
    if not isinstance(event, Finished) or event.failed or acceptance_length(event.summary.get("tau")) is None:
        return None
    split = event.summary.get("split")
    categories = event.summary.get("tau_by_category")
    by_category = {str(k): v for k, v in categories.items() if isinstance(v, dict) and acceptance_length(v.get("tau")) is not None} if isinstance(categories, dict) else {}
    return Evaluation(float(event.summary["tau"]), split if isinstance(split, str) else None, by_category)


def describe(raw: Any) -> str:
    """One short line for a status table's "last event" cell."""
    event = parse(raw)
    if event is None:
        return str(raw.get("event") or "") if isinstance(raw, dict) else ""
    if isinstance(event, Progress):
        return f"{event.step}/{event.total} {event.unit}".strip()
    if isinstance(event, Metric):
        return f"step {event.step}: " + format_metrics(event.metrics)
    if isinstance(event, Artifact):
        return f"{event.kind}: {event.path}"
    if isinstance(event, Message):
        return event.text[:80]
    if isinstance(event, Warning_):
        return "warning: " + event.text[:120]
    if isinstance(event, Finished):
        return f"finished: {event.status}" + _headline(event.summary)
    return "started"


def _headline(summary: dict[str, Any]) -> str:
    """A finished stage's figure worth a status cell: a skip's reason, the served acceptance
    (serve_check: beside evaluate's and tokens/s), or a measured tau (evaluate)."""
    number = lambda key: isinstance(summary.get(key), (int, float)) and not isinstance(summary.get(key), bool)  # noqa: E731
    if isinstance(summary.get("skipped"), str):
        return f" (skipped: {summary['skipped'][:100]})"
    if acceptance_length(summary.get("served_tau")):
        parts = [f"served tau {summary['served_tau']:.2f}"]
        if acceptance_length(summary.get("evaluate_tau")):
            parts.append(f"evaluate {summary['evaluate_tau']:.2f}")
        if number("tokens_per_s"):
            parts.append(f"{summary['tokens_per_s']:.1f} tok/s" + (f" vs {summary['tokens_per_s_without_draft']:.1f} without the draft" if number("tokens_per_s_without_draft") else ""))
        if number("recommended_k") and number("target_concurrency"):
            k, at = summary["recommended_k"], summary["target_concurrency"]
            speedup = f" {summary['recommended_speedup']:.2f}x" if number("recommended_speedup") else ""
            parts.append(f"recommended k={k} at concurrency {at}:{speedup}" if k else f"recommended: no draft at concurrency {at} (best{speedup})")
        return " (" + ", ".join(parts) + ")"
    if acceptance_length(summary.get("tau")):
        return f" (tau {summary['tau']:.2f})"
    return ""


def format_metrics(metrics: dict[str, Any], limit: int | None = None) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(metrics.items())[:limit])
