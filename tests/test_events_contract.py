"""The events contract (docs/events.json): the GPU side's writer (remote_scripts/common/events.py)
and the laptop's reader (harness/events.py) against the one table. The product code of each side
never imports the other; this test reads both."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from harness import events as reader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "remote_scripts"))

from common import events as writer  # noqa: E402

SCHEMA = json.loads((REPO / "docs" / "events.json").read_text())
TYPES = {"string": str, "number": (int, float), "integer": int, "object": dict, "array": list, "null": type(None)}


def problems(record: dict) -> list[str]:
    """What is wrong with one events.jsonl record under docs/events.json ([] when nothing)."""
    out = []
    for name, kind in SCHEMA["common"].items():
        if not isinstance(record.get(name), TYPES[kind]):
            out.append(f"{name}: expected {kind}")
    spec = SCHEMA["events"].get(record.get("event"))
    if spec is None:
        return out + [f"unknown event {record.get('event')!r}"]
    required, optional = spec.get("required", {}), spec.get("optional", {})
    for name, kind in {**required, **optional}.items():
        if name not in record:
            if name in required:
                out.append(f"{name}: missing")
            continue
        value = record[name]
        if not isinstance(value, TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
            out.append(f"{name}: expected {kind}, got {value!r}")
    for condition, names in spec.get("required_when", {}).items():
        field, _, value = condition.partition("=")
        if record.get(field) == value:
            out += [f"{name}: required when {condition}" for name in names if name not in record]
    for name, allowed in spec.get("values", {}).items():
        if name in record and record[name] not in allowed:
            out.append(f"{name}: {record[name]!r} not in {allowed}")
    if not spec.get("extra"):
        out += [f"{name}: not in the contract" for name in record if name not in {*SCHEMA["common"], *required, *optional}]
    return out


def written_events(tmp_path) -> list[dict]:
    """Every kind of event, through the writer's own methods."""
    path = tmp_path / "events.jsonl"
    log = writer.EventLog("train", str(path), echo=False)
    log.started(lr=1e-4, steps=3)
    log.progress(1, 3, unit="steps")
    log.metric(2, loss=1.25, tau=2.5)
    log.artifact(str(tmp_path / "ckpt"), kind="checkpoint")
    log.message("a note")
    log.warning("few samples: add data")
    log.finished("ok", tau=2.5, checkpoint="3")
    log.failed(ValueError("bad batch"), traceback=False)
    log.finished("failed", error="stopped: n1 silent", cause="peer", node_rank=2)
    log.finished("failed", error="cancelled", cause="cancelled", node_rank=0)

    def boom(args, events):
        raise RuntimeError("no GPU")

    writer.run_stage("export", type("Args", (), {"events": str(path)})(), boom, self_explaining=(RuntimeError,))
    return writer.read_events(str(path))


def test_the_writer_speaks_the_contract(tmp_path):
    records = written_events(tmp_path)
    assert {r["event"] for r in records} == set(SCHEMA["events"])  # every kind was written
    for r in records:
        assert problems(r) == [], r
    failures = [r for r in records if r["event"] == "finished" and r["status"] == "failed"]
    assert [r["cause"] for r in failures] == ["own", "peer", "cancelled", "own"]
    assert failures[-1]["error"] == "RuntimeError: no GPU"
    assert tuple(writer.CAUSES) == tuple(SCHEMA["events"]["finished"]["values"]["cause"])
    with pytest.raises(ValueError):
        writer.EventLog("x", str(tmp_path / "other.jsonl"), echo=False).finished("failed", error="e", cause="mine")


def test_a_distributed_stage_writes_one_start_and_one_end_and_every_ranks_failure(tmp_path, capsys):
    """run_stage's per-rank form (extract, regenerate, train): rank 0 writes started and finished,
    the other ranks say theirs in their own log only; a failure on any rank is its failed line."""
    path = tmp_path / "events.jsonl"
    args = type("Args", (), {"events": str(path), "steps": 3})()
    for rank in (1, 0, 2):
        code = writer.run_stage("extract", args, lambda a, ev, rank=rank: {"rank": rank}, rank=rank, started={"resolved_rank": rank})
        assert code == 0
    records = writer.read_events(str(path))
    assert [(r["event"], r.get("args", r).get("resolved_rank", r.get("rank"))) for r in records] == [("started", 0), ("finished", 0)]
    log = capsys.readouterr().err
    assert log.count("[extract] started:") == 3 and log.count("[extract] finished: ok") == 3

    def boom(args, events):
        raise RuntimeError("no GPU")

    assert writer.run_stage("extract", args, boom, rank=2, self_explaining=(RuntimeError,)) == 1
    assert writer.run_stage("extract", args, boom, rank=0, self_explaining=(RuntimeError,)) == 1
    failures = [r for r in writer.read_events(str(path)) if r["event"] == "finished" and r["status"] == "failed"]
    assert [r["error"] for r in failures] == ["RuntimeError: no GPU (rank 2)", "RuntimeError: no GPU"]
    for r in writer.read_events(str(path)):
        assert problems(r) == [], r


def test_an_acceptance_length_below_one_is_never_written_nor_shown(tmp_path):
    """A round yields at least one token: a stage with no round measured fails saying why, and a
    tau below 1 (or NaN) reaching the writer is a bug that fails the stage, before `finished`."""
    assert tuple(writer.ACCEPTANCE_LENGTHS) == tuple(reader.ACCEPTANCE_LENGTHS) == tuple(SCHEMA["acceptance_lengths"]["names"])
    assert writer.MIN_ACCEPTANCE_LENGTH == reader.MIN_ACCEPTANCE_LENGTH == SCHEMA["acceptance_lengths"]["minimum"]
    path = tmp_path / "events.jsonl"
    log = writer.EventLog("evaluate", str(path), echo=False)
    for bad in (0.0, 0.5, float("nan")):
        with pytest.raises(ValueError, match="bug: tau .* below 1"):
            log.metric(0, tau=bad)
    log.metric(0, tau=1.0, loss=0.0)  # other numbers may be anything
    assert writer.run_stage("evaluate", type("Args", (), {"events": str(path)})(), lambda a, ev: {"tau": 0.0, "tau_without_loops": None}) == 1
    finished = writer.read_events(str(path))[-1]
    assert finished["status"] == "failed" and "bug: tau 0.0 is below 1" in finished["error"]
    assert [r for r in writer.read_events(str(path)) if r["event"] == "metric"] == [writer.read_events(str(path))[0]]
    assert [reader.acceptance_length(v) for v in (0.0, 0.99, 1, 2.5, None, True, "3")] == [None, None, 1.0, 2.5, None, None, None]


def test_the_checker_itself_rejects_a_broken_record():
    assert problems({"t": 1.0, "stage": "s", "event": "finished", "status": "failed", "error": "x"}) == ["cause: required when status=failed"]
    assert problems({"t": 1.0, "stage": "s", "event": "progress", "step": "1", "total": 3, "unit": "x"}) == ["step: expected integer, got '1'"]
    assert problems({"t": 1.0, "stage": "s", "event": "message", "text": "x", "colour": "red"}) == ["colour: not in the contract"]


def fields_of(kind: str) -> tuple[list[str], list[str]]:
    """(required, optional) field names the reader takes for an event kind, beside the common ones."""
    required, optional = [], []
    for f in dataclasses.fields(reader.KINDS[kind]):
        if f.name == "summary":
            continue
        (required if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING else optional).append(f.name)
    return required, optional


def test_the_reader_takes_exactly_the_contracts_fields():
    assert set(reader.KINDS) == set(SCHEMA["events"])
    for kind, spec in SCHEMA["events"].items():
        required, optional = fields_of(kind)
        assert sorted(required) == sorted(spec.get("required", {})), kind
        assert sorted(optional) == sorted(spec.get("optional", {})), kind
    assert tuple(reader.CAUSES) == tuple(SCHEMA["events"]["finished"]["values"]["cause"])


def test_the_reader_reads_what_the_writer_wrote(tmp_path):
    for raw in written_events(tmp_path):
        event = reader.parse(raw)
        assert event is not None, raw
        spec = SCHEMA["events"][raw["event"]]
        for name in [*spec.get("required", {}), *spec.get("optional", {})]:
            assert getattr(event, name) == raw.get(name), (name, raw)
        if raw["event"] == "finished" and raw["status"] == "ok":
            assert event.summary == {"tau": 2.5, "checkpoint": "3"}
    # what is not an event under the contract is None, never an exception
    assert reader.parse({"t": 1.0, "stage": "s", "event": "progress", "step": 1}) is None
    assert reader.parse({"event": "nonesuch"}) is None and reader.parse("text") is None


def test_the_supervisor_reads_the_latest_tau_the_writer_wrote(tmp_path):
    """The supervisor (shipped to the host, standard library only) picks status's tau out of the
    events itself: a metric event's metrics.tau, at its step."""
    from harness.host_helpers.stage_events import latest_tau

    path = tmp_path / "events.jsonl"
    log = writer.EventLog("train", str(path), echo=False)
    assert latest_tau(str(path)) is None
    log.metric(4, tau=2.25, loss=0.5)
    log.metric(5, loss=0.4)
    log.progress(5, 10)
    assert latest_tau(str(path)) == {"step": 4, "tau": 2.25}


def test_evaluates_summary_is_what_the_sweep_reads(tmp_path):
    """evaluate's finished summary (evaluate.stage_summary) holds the fields docs/events.json lists
    under summaries.evaluate, typed; harness.events.evaluation reads them back, per category too."""
    import evaluate

    spec = SCHEMA["summaries"]["evaluate"]["required"]
    results = [evaluate.PromptResult(4, [1, 2, 3, 4, 5], 2, [2, 1], [3, 3]), evaluate.PromptResult(4, [1, 2, 3], 2, [0, 1], [3, 3]),
               evaluate.PromptResult(4, [1, 2, 3, 4], 3, [1, 0, 0], [3, 3, 3])]
    report = evaluate.summarize(results, 3)
    report.by_category = evaluate.tau_by_category(results, ["coding", "math", None], 3)
    summary = evaluate.stage_summary(report, "selection")
    for name, kind in spec.items():
        assert isinstance(summary[name], TYPES[kind]), (name, summary[name])
    assert set(summary["tau_by_category"]) == {"coding", "math", "other"}
    assert summary["tau_by_category"]["coding"] == {"tau": 2.0, "prompts": 1}  # 4 tokens after the prefill in 2 rounds
    path = tmp_path / "events.jsonl"
    writer.EventLog("evaluate", str(path), echo=False).finished("ok", **summary)
    raw = writer.read_events(str(path))[-1]
    assert problems(raw) == []
    read = reader.evaluation(raw)
    assert (read.tau, read.split, read.by_category) == (summary["tau"], "selection", summary["tau_by_category"])
    assert [f.name for f in dataclasses.fields(reader.Evaluation)] == ["tau", "split", "by_category"]  # one field per documented one
    # what is not an ok evaluate summary reads as None, never an exception
    assert reader.evaluation({**raw, "tau": None}) is None and reader.evaluation({**raw, "status": "failed", "error": "x", "cause": "own"}) is None
    assert reader.evaluation({**raw, "tau_by_category": {"coding": {"tau": "high"}}}).by_category == {}
