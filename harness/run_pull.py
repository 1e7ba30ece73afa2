"""What `harness pull HOST RUN` brings: the files a user wants from a run, wherever it put them.

A run's own directory (`<workdir>/runs/<id>/`) holds only its records and logs; what its stages
made lives under the pipeline's output_dir, at each stage's --output as the run recorded it
(run.json `config.pipeline`, through harness.pipeline: the same computation that built the
stages' command lines). Into LOCAL_DIR (default ./runs/<id>):

    .                      the run directory: run.json, and per stage spec.json, state.json, log,
                           events.jsonl
    outputs/eval/          evaluate's output: report.json and the plots (acceptance.png, training.png)
    outputs/export/        export's output: the checkpoint vLLM serves, and its serve command
    outputs/checkpoints/   train's metrics.jsonl, best.json and logs/ (the training loggers' directory:
                           TensorBoard events, W&B offline runs); no checkpoint unless asked:
      --latest-checkpoint    + the newest epoch directory (`<N>/`, highest N)
      --best-checkpoint      + the directory best.json names (train writes
                             `{"checkpoint": "<dir>", "step": N, "tau": X}`); a run without
                             best.json is one error line

Outputs the run has not made (a failed or partial run) are skipped and listed. Checkpoints
belong to the output directory, not to one run: a later run with the same output_dir replaces
them. Each part is one verified, resumable harness.pull pull.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.config import PipelineConfig
from harness.errors import UsageError
from harness.pipeline import default_args
from harness.pull import PullOptions, PullProgress, PullReport, clean_rel, pull

if TYPE_CHECKING:
    from harness.transport.base import Transport

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


def plan(transport: "Transport", host: str, run_dir: str, request: RunPullRequest) -> RunPullPlan:
    """The parts of a run worth pulling, from its record and what exists on the host."""
    try:
        record = json.loads(transport.get_bytes(f"{run_dir}/run.json"))
    except FileNotFoundError:
        raise UsageError(f"{host}: no run record {run_dir}/run.json") from None
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
    found = existing(transport, [p.remote for p in wanted])
    parts = [Part(run_dir, ".")] + [p for p in wanted if p.remote in found]
    # best.json (train writes it when it measured one; --best-checkpoint needs it) and logs/ (only
    # with loggers) are optional
    missing = [p.shown for p in wanted if p.remote not in found and posixpath.basename(p.remote) not in OPTIONAL]
    if request.best_checkpoint:
        name = best_checkpoint_name(transport, host, checkpoints)
        parts.append(Part(f"{checkpoints}/{name}", f"{LOCAL_OUTPUTS}/checkpoints/{name}"))
    return RunPullPlan(parts, missing)


def existing(transport: "Transport", paths: list[str]) -> set[str]:
    """Which of `paths` exist on the host (one round trip)."""
    script = 'for p; do [ -e "$p" ] && printf "%s\\n" "$p"; done; true'
    result = transport.run(["sh", "-c", script, "sh", *paths])
    return set(result.text.splitlines()) & set(paths)


def best_checkpoint_name(transport: "Transport", host: str, checkpoints: str) -> str:
    """The checkpoint directory <checkpoints>/best.json names (a name directly under it)."""
    path = f"{checkpoints}/{BEST_FILE}"
    try:
        raw = transport.get_bytes(path)
    except FileNotFoundError:
        raise UsageError(f"{host}: the run recorded no best checkpoint ({path} not found)") from None
    try:
        name = json.loads(raw)["checkpoint"]
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{host}: {path} is not a best-checkpoint record (expected {{\"checkpoint\": \"<dir>\", ...}})") from None
    if not isinstance(name, str) or clean_rel(name) != name or "/" in name:
        raise UsageError(f"{host}: {path} names {name!r}, not a directory directly under {checkpoints}")
    if not existing(transport, [f"{checkpoints}/{name}"]):
        raise UsageError(f"{host}: {path} names checkpoint {name!r}, which is not in {checkpoints}")
    return name


def pull_run(transport: "Transport", run_plan: RunPullPlan, local_dir: str, options: PullOptions, progress: PullProgress | None = None) -> PullReport:
    """Pull every part of the plan into local_dir; one report, names relative to local_dir."""
    total = PullReport(local_dir=local_dir, remote_root=run_plan.parts[0].remote)
    for part in run_plan.parts:
        target = local_dir if part.local == "." else posixpath.join(local_dir, part.local)
        report = pull(transport, part.remote, target, dataclasses.replace(options, latest_checkpoint=part.latest_checkpoint), progress)

        def named(rel: str, _part=part) -> str:
            return rel if _part.local == "." else f"{_part.local}/{rel}"

        total.fetched += [named(r) for r in report.fetched]
        total.identical += [named(r) for r in report.identical]
        total.links += [named(r) for r in report.links]
        total.planned += [named(r) for r in report.planned]
        total.refused += [(named(r), why) for r, why in report.refused]
        total.failed += [(named(r), why) for r, why in report.failed]
        total.bytes_received += report.bytes_received
        total.bytes_resumed += report.bytes_resumed
        total.streams = max(total.streams, report.streams)
        total.seconds += report.seconds
    return total
