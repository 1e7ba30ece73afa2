"""What `harness pull HOST RUN` brings: the files a user wants from a run, wherever it put them.

A run's own directory (`<workdir>/runs/<id>/`) holds only its records and logs; what its stages
made lives under the pipeline's output_dir, at each stage's --output as the run recorded it
(run.json `config.pipeline`, through harness.pipeline: the same computation that built the
stages' command lines). `pull` brings the run directory, evaluate's and export's outputs and
train's records and logs into LOCAL_DIR (default ./runs/<id>); a checkpoint only when asked
(--latest-checkpoint, --best-checkpoint). Outputs the run has not made are skipped and listed.
All parts are one verified, resumable pull over one connection (harness.pull.PullConnection: one
remote start). Where each part lands: docs/transfers.md.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from harness.config import PipelineConfig
from harness.errors import UsageError
from harness.pipeline import default_args
from harness.pull import PullConnection, PullOptions, PullProgress, PullReport, Source, clean_rel

if TYPE_CHECKING:
    from harness.host import Host
    from harness.jobs import RemoteTarget

BEST_FILE = "best.json"
TRAIN_FILES = ("metrics.jsonl", BEST_FILE)  # small files next to the checkpoints
LOGGERS_DIR = "logs"  # train's loggers write under <checkpoints>/logs (remote_scripts/common/loggers.py)
OPTIONAL = (BEST_FILE, LOGGERS_DIR)  # a run may not have made them, and that is no gap
LOCAL_OUTPUTS = "outputs"


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


def stage_output(pipeline: PipelineConfig, stage: str, workdir: str) -> str:
    """The --output a stage of this pipeline writes to, absolute on the host."""
    path = str({**default_args(stage, pipeline), **pipeline.stages.get(stage, {})}["output"])
    return path if path.startswith("/") else posixpath.join(workdir, path)


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
    pipeline = recorded_pipeline(record)
    checkpoints = stage_output(pipeline, "train", workdir)
    wanted = [
        Part(stage_output(pipeline, "evaluate", workdir), f"{LOCAL_OUTPUTS}/eval"),
        Part(stage_output(pipeline, "export", workdir), f"{LOCAL_OUTPUTS}/export"),
        *(Part(f"{checkpoints}/{name}", f"{LOCAL_OUTPUTS}/checkpoints") for name in TRAIN_FILES),
        Part(f"{checkpoints}/{LOGGERS_DIR}", f"{LOCAL_OUTPUTS}/checkpoints/{LOGGERS_DIR}"),
    ]
    if request.latest_checkpoint:
        wanted.append(Part(checkpoints, f"{LOCAL_OUTPUTS}/checkpoints", latest_checkpoint=True))
    found = host_files.existing([p.remote for p in wanted])
    parts = [Part(run_dir, ".")] + [p for p in wanted if p.remote in found]
    # best.json (train writes it when it measured one; --best-checkpoint needs it) and logs/ (only
    # with loggers) are optional
    missing = [p.shown for p in wanted if p.remote not in found and posixpath.basename(p.remote) not in OPTIONAL]
    if request.best_checkpoint:
        name = best_checkpoint_name(host_files, host, checkpoints)
        parts.append(Part(f"{checkpoints}/{name}", f"{LOCAL_OUTPUTS}/checkpoints/{name}"))
    return RunPullPlan(parts, missing)


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
    jobs: int = 8
    dry_run: bool = False


@dataclass(frozen=True)
class PullOutcome:
    target: "RemoteTarget"
    destination: str
    report: PullReport
    missing: list[str]  # outputs the run has not made


def pull(host: "Host", request: PullRequest, progress: Callable[[], PullProgress | None] = lambda: None,
         on_missing: Callable[[str], None] = lambda name: None) -> PullOutcome:
    """Pull a run (its records and outputs), a checkpoints directory's best checkpoint, or a path
    from the host, over one PullConnection. `progress()` is asked once the plan stands (the CLI
    builds its bar then); `on_missing(name)` hears of each output the run has not made."""
    options = PullOptions(include=request.include, exclude=request.exclude, jobs=request.jobs, python=host.cfg.python, dry_run=request.dry_run)
    # one connection answers every question (the newest run, its record, what exists) and then
    # carries the bytes: one remote start in all. It starts first; the rest runs while it connects.
    with PullConnection(host.transport, options) as connection:
        target = host.runs.locate(request.remote, newest_run=connection.newest_run)
        if target.run_id:
            what = plan(connection, host.name, target.path, RunPullRequest(request.latest_checkpoint, request.best_checkpoint))
            for name in what.missing:
                on_missing(name)
        elif request.best_checkpoint:  # REMOTE is a checkpoints directory
            name = best_checkpoint_name(connection, host.name, target.path)
            what = RunPullPlan([Part(f"{target.path}/{BEST_FILE}", "."), Part(f"{target.path}/{name}", name)], [])
        else:
            what = RunPullPlan([Part(target.path, ".", latest_checkpoint=request.latest_checkpoint)], [])
        destination = request.local_dir or target.local_name
        report = pull_run(connection, what, destination, progress())
    return PullOutcome(target, destination, report, what.missing)
