"""What `harness pull HOST RUN` brings: the files a user wants from a run, wherever it put them.

A run's own directory (`<workdir>/runs/<id>/`) holds only its records and logs; what its stages
made or reused are artifacts of the store, each named in run.json's `artifacts` by its key
(harness/artifacts.py): `pull` brings exactly those, however many runs came later. It brings the
run directory, evaluate's, export's and serve_check's outputs and train's records and logs into
LOCAL_DIR (default ./runs/<id>); a checkpoint only when asked (--latest-checkpoint,
--best-checkpoint). Outputs the run has not made are skipped and listed. A run made before the
store brings the shared output_dir as it is now, and says so. All parts are one verified,
resumable pull over one connection (harness.pull.PullConnection: one remote start). Where each
part lands: docs/transfers.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from harness.artifacts import LEGACY_NOTE, RunArtifacts
from harness.config import PipelineConfig
from harness.errors import UsageError
from harness.pull import PullConnection, PullOptions, PullProgress, PullReport, Source, clean_rel

if TYPE_CHECKING:
    from harness.host import Host
    from harness.jobs import RemoteTarget
    from harness.transport.base import Transport

BEST_FILE = "best.json"
TRAIN_FILES = ("metrics.jsonl", BEST_FILE)  # small files next to the checkpoints
LOGGERS_DIR = "logs"  # train's loggers write under <checkpoints>/logs (remote_scripts/common/loggers.py)
OPTIONAL = (BEST_FILE, LOGGERS_DIR)  # a run may not have made them, and that is no gap
LOCAL_OUTPUTS = "outputs"
SERVED_DIR = "served"  # serve_check's served.json and acceptance.png, beside eval/


@dataclass(frozen=True)
class RunPullRequest:
    latest_checkpoint: bool = False
    best_checkpoint: bool = False


@dataclass(frozen=True)
class Part:
    remote: str  # absolute on the host
    local: str  # relative to LOCAL_DIR ("." for the run directory)
    latest_checkpoint: bool = False  # select only the newest epoch directory of `remote`

    @property
    def shown(self) -> str:
        """Where it lands, for messages (a single file lands in `local` under its own name)."""
        name = posixpath.basename(self.remote)
        return f"{self.local}/{name}" if name in TRAIN_FILES else self.local


@dataclass(frozen=True)
class RunPullPlan:
    parts: list[Part]
    missing: list[str]  # outputs the run has not made (relative local names)
    notes: list[str] = dataclasses.field(default_factory=list)  # what the user should know of what comes


def legacy_output(pipeline: PipelineConfig, stage: str, workdir: str) -> str:
    """The --output a stage wrote to in a run made before the store (the shared output_dir), absolute on the host."""
    if stage == "serve_check":  # it wrote served.json beside evaluate's report
        stage = "evaluate"
    out = pipeline.output_dir.rstrip("/")
    path = str(pipeline.stages.get(stage, {}).get("output") or f"{out}/{LEGACY_OUTPUTS[stage]}")
    return path if path.startswith("/") else posixpath.join(workdir, path)


# Where each stage wrote before the store, under output_dir: a record of that time names no artifact.
LEGACY_OUTPUTS = {"train": "checkpoints", "evaluate": "eval", "export": "export", "serve_check": "eval"}


def run_outputs(record: dict[str, Any], workdir: str) -> tuple[dict[str, str | None], list[str]]:
    """Where the run's stages put (or took) their outputs, absolute on the host (None: the run
    has none of that stage), and a note when the run predates the store."""
    artifacts = RunArtifacts(record, workdir)
    if artifacts.keyed:
        return {stage: artifacts.path(stage) for stage in LEGACY_OUTPUTS}, []
    pipeline = recorded_pipeline(record)
    note = LEGACY_NOTE.format(run=record.get("run_id"), output_dir=pipeline.output_dir)
    return {stage: legacy_output(pipeline, stage, workdir) for stage in LEGACY_OUTPUTS}, [note]


def read_record(transport: "Transport", workdir: str, run_id: str) -> dict[str, Any]:
    """A run's run.json on the host."""
    path = f"{workdir}/runs/{run_id}/run.json"
    try:
        record = json.loads(transport.get_bytes(path))
    except FileNotFoundError:
        raise UsageError(f"no run record {path}") from None
    except ValueError:
        raise UsageError(f"{path} is not a run record (not JSON)") from None
    if not isinstance(record, dict):
        raise UsageError(f"{path} is not a run record")
    return record


def recorded_pipeline(record: dict[str, Any]) -> PipelineConfig:
    """The pipeline as the run recorded it (fields this harness does not know are ignored)."""
    known = {f.name for f in dataclasses.fields(PipelineConfig)}
    data = (record.get("config") or {}).get("pipeline") or {}
    return PipelineConfig(**{k: v for k, v in data.items() if k in known})


def plan(host_files: PullConnection, host: str, run_dir: str, request: RunPullRequest) -> RunPullPlan:
    """The parts of a run worth pulling, from its record and what exists on the host."""
    try:
        record = json.loads(host_files.read(f"{run_dir}/run.json"))
    except FileNotFoundError:
        raise UsageError(f"{host}: no run {posixpath.basename(run_dir)} (no {run_dir}/run.json)", f"`harness runs {host}` lists the runs") from None
    workdir = str(record.get("workdir") or posixpath.dirname(posixpath.dirname(run_dir)))
    outputs, notes = run_outputs(record, workdir)
    checkpoints = outputs["train"]
    absent: list[str] = []  # stages this run neither made, reused nor read
    wanted: list[Part] = []
    for stage, local in (("evaluate", "eval"), ("export", "export")):
        if outputs[stage] is None:
            absent.append(f"{LOCAL_OUTPUTS}/{local}")
        else:
            wanted.append(Part(outputs[stage], f"{LOCAL_OUTPUTS}/{local}"))
    if outputs["serve_check"] not in (None, outputs["evaluate"]):  # not in the training chain; before the store, in eval/
        wanted.append(Part(outputs["serve_check"], f"{LOCAL_OUTPUTS}/{SERVED_DIR}"))
    if checkpoints is None:
        absent.append(f"{LOCAL_OUTPUTS}/checkpoints")
        if request.latest_checkpoint or request.best_checkpoint:
            raise UsageError(f"{host}: run {posixpath.basename(run_dir)} has no train stage and read no draft: no checkpoint to pull")
    else:
        wanted += [*(Part(f"{checkpoints}/{name}", f"{LOCAL_OUTPUTS}/checkpoints") for name in TRAIN_FILES),
                   Part(f"{checkpoints}/{LOGGERS_DIR}", f"{LOCAL_OUTPUTS}/checkpoints/{LOGGERS_DIR}")]
        if request.latest_checkpoint:
            wanted.append(Part(checkpoints, f"{LOCAL_OUTPUTS}/checkpoints", latest_checkpoint=True))
    found = host_files.existing([p.remote for p in wanted])
    parts = [Part(run_dir, ".")] + [p for p in wanted if p.remote in found]
    # best.json (train writes it when it measured one; --best-checkpoint needs it) and logs/ (only
    # with loggers) are optional
    missing = absent + [p.shown for p in wanted if p.remote not in found and posixpath.basename(p.remote) not in OPTIONAL]
    if request.best_checkpoint and checkpoints is not None:
        name = best_checkpoint_name(host_files, host, checkpoints)
        parts.append(Part(f"{checkpoints}/{name}", f"{LOCAL_OUTPUTS}/checkpoints/{name}"))
    return RunPullPlan(parts, missing, notes)


def best_checkpoint_name(host_files: PullConnection, host: str, checkpoints: str) -> str:
    """The checkpoint directory <checkpoints>/best.json names (a name directly under it)."""
    path = f"{checkpoints}/{BEST_FILE}"
    try:
        raw = host_files.read(path)
    except FileNotFoundError:
        raise UsageError(f"{host}: the run recorded no best checkpoint ({path} not found)") from None
    try:
        name = json.loads(raw)["checkpoint"]
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{host}: {path} is not a best-checkpoint record (expected {{\"checkpoint\": \"<dir>\", ...}})") from None
    if not isinstance(name, str) or clean_rel(name) != name or "/" in name:
        raise UsageError(f"{host}: {path} names {name!r}, not a directory directly under {checkpoints}")
    if not host_files.existing([f"{checkpoints}/{name}"]):
        raise UsageError(f"{host}: {path} names checkpoint {name!r}, which is not in {checkpoints}")
    return name


def pull_run(connection: PullConnection, run_plan: RunPullPlan, local_dir: str, progress: PullProgress | None = None) -> PullReport:
    """Pull every part of the plan into local_dir over the plan's connection; one report, names
    relative to local_dir."""
    return connection.pull([Source(p.remote, p.local, p.latest_checkpoint) for p in run_plan.parts], local_dir, progress)


@dataclass(frozen=True)
class PullRequest:
    """`harness pull HOST REMOTE [LOCAL_DIR]`: what to bring, and how."""

    remote: str  # a run id, 'last', or a path (relative to the workdir unless absolute)
    local_dir: str | None = None  # default: ./runs/RUN_ID or ./NAME
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    latest_checkpoint: bool = False
    best_checkpoint: bool = False
    streams: int = 8  # most parallel byte streams (`--streams`)
    dry_run: bool = False


@dataclass(frozen=True)
class PullOutcome:
    target: "RemoteTarget"
    destination: str
    report: PullReport
    missing: list[str]  # outputs the run has not made
    notes: list[str] = dataclasses.field(default_factory=list)


def pull(host: "Host", request: PullRequest, progress: Callable[[], PullProgress | None] = lambda: None,
         on_missing: Callable[[str], None] = lambda name: None, on_note: Callable[[str], None] = lambda text: None) -> PullOutcome:
    """Pull a run (its records and outputs), a checkpoints directory's best checkpoint, or a path
    from the host, over one PullConnection. `progress()` is asked once the plan stands (the CLI
    builds its bar then); `on_missing(name)` hears of each output the run has not made,
    `on_note(text)` of what the user should know of the rest (a run made before the store)."""
    options = PullOptions(include=request.include, exclude=request.exclude, streams=request.streams, python=host.cfg.python, dry_run=request.dry_run)
    # one connection answers every question (the newest run, its record, what exists) and then
    # carries the bytes: one remote start in all. It starts first; the rest runs while it connects.
    with PullConnection(host.transport, options) as connection:
        target = host.jobs.locate(request.remote, newest_run=connection.newest_run)
        if target.run_id:
            what = plan(connection, host.name, target.path, RunPullRequest(request.latest_checkpoint, request.best_checkpoint))
            for name in what.missing:
                on_missing(name)
            for text in what.notes:
                on_note(text)
        elif request.best_checkpoint:  # REMOTE is a checkpoints directory
            name = best_checkpoint_name(connection, host.name, target.path)
            what = RunPullPlan([Part(f"{target.path}/{BEST_FILE}", "."), Part(f"{target.path}/{name}", name)], [])
        else:
            what = RunPullPlan([Part(target.path, ".", latest_checkpoint=request.latest_checkpoint)], [])
        # a run lands by default in the project's runs/ (the config's directory), wherever the
        # command runs: never inside a synced path, where the next sync would send it to the box
        default = os.path.relpath(host.config.root / target.local_name) if target.run_id else target.local_name
        destination = request.local_dir or default
        report = pull_run(connection, what, destination, progress())
    return PullOutcome(target, destination, report, what.missing, what.notes)
