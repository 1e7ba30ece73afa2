"""Detached runs: a chain of stages executed one after another ON THE HOST.

The laptop makes the run's plan (run.json, and a spec.json per stage) and sends it in ONE call of
the supervisor (harness/host_helpers/supervisor.py, standard library only, through
harness.helpers.call), which writes it under <workdir>/runs/<run_id>/ and starts the run detached.
From then on the run needs neither the SSH link nor this process: closing the laptop does not
stop the chain. Every later command (logs, status, runs, cancel) is one call of the same
supervisor, reading those files, so any laptop can re-attach. Runs queue per GPU set on the host
(queue_gpus, queue_slot; `now=True` starts at once). Secret values travel to the supervisor on
stdin and are never written; the record keeps names only.

The launch, the queue and the run's files: docs/architecture/jobs-and-runs.md (jobs.py, "The supervisor").
"""

from __future__ import annotations

import dataclasses
import posixpath
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from harness import box_values, helpers
from harness.artifacts import check_fresh, recipes
from harness.box_values import RUN_ID_RE
from harness.config import Config, HostConfig, PipelineConfig
from harness.errors import EXIT_FAILED, EXIT_OK, Interrupted, RemoteCommandError, UsageError
from harness.host_helpers import wire
from harness.pipeline import launches_itself, resolve_chain, stage_argv, store_root
from harness.runs import AttachView, CancelOutcome, Launched, RunListing, logs_broke_off, names_a_run, pick_run
from harness.runtime.base import Runtime, WrapOptions
from harness.stage_options import stage_options
from harness.stages import SCRIPTS_DIR, STAGES

if TYPE_CHECKING:
    from harness.group_node import GroupNode
    from harness.transport.base import Transport

RUNS_DIR = "runs"
SUPERVISOR = "supervisor.py"  # harness/host_helpers/
HOME_TOKEN = wire.HOME_TOKEN  # ~ in a launch request (put in on the host)
DEFAULT_GRACE_S = 10.0
FINAL_RUN_STATES = {"ok", "failed", "cancelled", "lost"}

STAGE_VERSIONS = "stage_versions.py"  # host_helpers/: the library versions the stages see, for run.json


def new_run_id() -> str:
    """UTC timestamp + 24 random bits: sortable, and two runs started together never collide."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def script_argv(stage: str, config: Config, python: str, events_path: str) -> list[str]:
    """The stage script's own command line, a `false` spelled as its parser takes it (--no-KEY)."""
    return stage_argv(stage, config.pipeline, python=python, events_path=events_path, options=stage_options(config.path, STAGES[stage].script))


def stage_command(stage: str, config: Config, python: str, events_path: str, nproc: int) -> list[str]:
    """A stage's command line. Distributed stages on a host with several GPUs run under torchrun.

    This is the hook for scale: multi-node launching replaces the `--standalone` rendezvous.
    """
    argv = script_argv(stage, config, python, events_path)
    if STAGES[stage].distributed and nproc > 1 and not launches_itself(stage, config.pipeline):
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *argv[1:]]
    return argv


@dataclass(frozen=True)
class RemoteTarget:
    path: str  # on the host: absolute, or ~/... (the host expands it)
    local_name: str  # where it lands by default, relative to the current directory
    run_id: str | None = None  # set when it names a run


@dataclass(frozen=True)
class StageStatus:
    stage: str
    state: str  # pending | running | ok | failed | cancelled | skipped
    started: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    last_event: dict[str, Any] | None = None
    tau: dict[str, Any] | None = None  # {"step", "tau"}: the latest acceptance estimate while training
    artifact: str | None = None  # the key of its artifact (harness.artifacts); None: a stage that keeps none, or a run before the store
    reused_from: str | None = None  # the run that made the artifact this stage reused; None: it ran

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.finished or time.time()) - self.started

    @property
    def shown_state(self) -> str:
        """The state as the status table shows it: a stage that took its artifact as it was is "reused"."""
        return "reused" if self.state == "ok" and self.reused_from else self.state

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "state": self.state, "started": self.started, "finished": self.finished,
                "exit_code": self.exit_code, "last_event": self.last_event, "tau": self.tau, "artifact": self.artifact,
                "reused_from": self.reused_from}


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    state: str  # queued | running | ok | failed | cancelled | lost (the supervisor died)
    stages: list[StageStatus]
    record: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    finished: float | None = None
    queue_place: int | None = None  # while queued: 1 + the runs queued ahead on the same GPUs

    @property
    def queue_note(self) -> str:
        """While queued, e.g. ' (place 1 for GPUs 0,1)'; else empty."""
        if self.state != "queued" or self.queue_place is None:
            return ""
        gpus = (self.record.get("queue") or {}).get("gpus", "all")
        return f" (place {self.queue_place} for {'all GPUs' if gpus == 'all' else 'GPUs ' + ','.join(map(str, gpus))})"

    @property
    def failed_stage(self) -> StageStatus | None:
        return next((s for s in self.stages if s.state == "failed"), None)

    @property
    def current_stage(self) -> str | None:
        """The stage running, or the one the run stopped at."""
        return next((s.stage for s in self.stages if s.state in ("running", "failed", "cancelled")), None)

    def exit_code(self) -> int:
        """0 when the run succeeded, else EXIT_FAILED (a stage's own code is in its status: a
        stage exiting 2 or 255 must not read as a usage or connection error)."""
        return EXIT_OK if self.state == "ok" else EXIT_FAILED

    def summary_json(self) -> dict[str, Any]:
        """One run in `harness runs --json`."""
        return {"run_id": self.run_id, "state": self.state, "started": self.started, "finished": self.finished,
                "stages": [s.stage for s in self.stages], "stages_done": sum(1 for s in self.stages if s.state == "ok"),
                "at_stage": self.current_stage, "queue_place": self.queue_place}

    def to_json(self) -> dict[str, Any]:
        """`harness status HOST --json`: the stages, and the run's record (run.json: no secret values)."""
        return {**self.summary_json(), "host": self.record.get("host"), "exit_code": None if self.state in ("queued", "running", "starting") else self.exit_code(),
                "stages": [s.to_json() for s in self.stages], "record": self.record}

    @classmethod
    def from_json(cls, data: Any, where: str = "box") -> "RunStatus":
        """A run's status as the supervisor on the box answers it: every value checked
        (harness.box_values): an id that is no run id is refused, what is only shown is dropped."""
        data = box_values.mapping(data)
        state = box_values.mapping(data.get("state"))
        stages = []
        for s in data.get("stages") or []:
            s = box_values.mapping(s)
            stages.append(StageStatus(
                stage=box_values.stage(s.get("stage"), where),
                state=box_values.text(s.get("state")) or "pending",
                started=box_values.number(s.get("started")),
                finished=box_values.number(s.get("finished")),
                exit_code=box_values.integer(s.get("exit_code")),
                last_event=s.get("last_event") if isinstance(s.get("last_event"), dict) else None,
                tau=s.get("tau") if isinstance(s.get("tau"), dict) else None,
                artifact=box_values.or_none(box_values.artifact_key, s.get("artifact")),
                reused_from=box_values.or_none(box_values.run_id, s.get("reused_from")),
            ))
        place = box_values.integer(box_values.mapping(state.get("queue")).get("place"))
        return cls(box_values.run_id(data.get("run_id"), where), box_values.text(state.get("state")) or "starting", stages,
                   box_values.mapping(data.get("record")), box_values.number(state.get("started")), box_values.number(state.get("finished")), place)


MISSING_EXIT = 3  # the supervisor's answer when a file the run needs is not on the host


def requirements(config: Config, runtime: "Runtime", stages: list[str]) -> list[dict[str, str]]:
    """What must be on the host before a run starts, each with the one line that says what to do
    when it is not: every stage's script (not synced yet), and the verifier where it is plainly a
    path on the host that no stage of this run makes (a hub id, "org/name", is the stage's to load)."""
    host, workdir = runtime.host, runtime.workdir

    def script_missing(stage: str) -> str:
        script = f"{SCRIPTS_DIR}/{STAGES[stage].script}"
        if (config.root / script).is_file():
            return f"{host.name}: {script} (stage {stage}) is not on the host: run `harness sync {host.name}`"
        return (f"{host.name}: {script} (stage {stage}) is not on the host, and not beside {config.path} to be synced: "
                f"keep harness.toml in the harness checkout (where {SCRIPTS_DIR}/ is) and run from there")

    needs = [{"path": f"{workdir}/{SCRIPTS_DIR}/{STAGES[s].script}", "message": script_missing(s)} for s in dict.fromkeys(stages)]
    verifier, data = config.pipeline.verifier, config.pipeline.data
    visible = runtime.sees_host_paths  # a container sees absolute paths through its mounts only: not checked from the host
    if "verifier" not in stages and not wire.is_hub_id(verifier) and (visible or not verifier.startswith("/")):
        path = verifier if verifier.startswith(("/", "~")) else f"{workdir}/{verifier}"
        needs.append({"path": path, "message": f"{host.name}: the verifier {verifier} ([pipeline] verifier) does not exist on the host "
                      f"(relative paths are under the workdir {host.workdir}): put it there, or name a Hugging Face model id"})
    reads_data = any(s in ("regenerate", "prepare", "evaluate", "serve_check") for s in stages)
    configured = data != PipelineConfig().data  # the default is the demo's, which its verifier stage makes
    if configured and "verifier" not in stages and reads_data and data_is_host_path(data) and (visible or not data.startswith("/")):
        path = data if data.startswith(("/", "~")) else f"{workdir}/{data}"
        needs.append({"path": path, "message": f"{host.name}: the chat data {data} ([pipeline] data) does not exist on the host "
                      f"(relative paths are under the workdir {host.workdir}): list it in [sync] paths, or give its path on the box"})
    return needs


DATA_FILES = (".jsonl", ".json", ".parquet", ".csv", ".txt")


def data_is_host_path(data: str) -> bool:
    """The chat data names a file on the host (a data file's suffix, or not a hub id: wire.is_hub_id)."""
    return bool(data) and (data.endswith(DATA_FILES) or not wire.is_hub_id(data))


@dataclass(frozen=True)
class RunPlan:
    """A run as it would start (Jobs.plan): its stages' specs (each spec's `command` is the
    stage's exact command line, run in `workdir`), the record and what must be on the host."""

    run_id: str
    host: str
    stages: list[str]
    specs: dict[str, dict[str, Any]]
    record: dict[str, Any]
    workdir: str
    requires: list[dict[str, str]]

    def commands(self) -> dict[str, list[str]]:
        return {stage: self.specs[stage]["command"] for stage in self.stages}


class Jobs:
    """Runs on one host, through its transport and runtime (made by harness.host.Host.jobs_with, so
    the workdir is expanded once per command)."""

    detach_note = ""

    def __init__(self, config: Config, host: HostConfig, transport: "Transport", runtime: "Runtime", queue_slot: int | None = None,
                 node: "GroupNode | None" = None):
        self.config = config
        # harness.sweep's trials that share a GPU: runs in different slots of the same GPUs run at
        # once (one per slot); None competes with every run on its GPUs.
        self.queue_slot = queue_slot
        # This host as one node of a group run (harness.group_node): its distributed stages start
        # under node_launcher.py, and its runs never wait in the queue.
        self.node = node
        self.host = host
        self.name = host.name
        self.transport = transport
        self.runtime = runtime

    @property
    def workdir(self) -> str:
        """Expanded on the host (asked once, where a caller needs it absolute)."""
        return self.runtime.workdir

    @property
    def runs_dir(self) -> str:
        """Where the runs are, as the host helpers take it (a leading ~ expands there)."""
        return f"{self.runtime.workdir_as_given}/{RUNS_DIR}"

    # -- the supervisor on the host ---------------------------------------------------------------

    def _supervise(self, request: dict[str, Any], stdout: Callable[[bytes], None] | None = None) -> helpers.HelperResult:
        return helpers.call(self.transport, SUPERVISOR, request, python=self.host.python, stdout=stdout)

    def run_dir(self, run_id: str) -> str:
        return f"{self.runs_dir}/{run_id}"

    def locate(self, what: str, newest_run: Callable[[str], str | None] | None = None) -> RemoteTarget:
        """A run id (or 'last') or a path, relative to the workdir unless absolute -> where it
        is on the host, and the local directory it lands in by default (`harness pull`).
        newest_run(runs_dir): the run 'last' names, asked another way than the supervisor's status."""
        if what == "last" and newest_run is not None:
            run_id = newest_run(self.runs_dir)
            if run_id is None:
                raise self.no_runs_yet()
            run_id = box_values.run_id(run_id, self.name)  # it becomes a local directory's name
            return RemoteTarget(self.run_dir(run_id), posixpath.join("runs", run_id), run_id)
        if names_a_run(what):  # a mistyped id is no path
            run_id = self.resolve_run_id(what)
            return RemoteTarget(self.run_dir(run_id), posixpath.join("runs", run_id), run_id)
        path = what if what.startswith(("/", "~")) else f"{self.runtime.workdir_as_given}/{what}"
        return RemoteTarget(path, posixpath.basename(path.rstrip("/")) or "pulled")

    # -- start ------------------------------------------------------------------------------------

    @property
    def waits_in_queue(self) -> bool:
        """A run waits in the host's queue for its GPUs unless started with now=True. A group's
        node never waits: a waiting node would stall the others' rendezvous."""
        return self.node is None

    def plan(self, requested: list[str], grace_s: float = DEFAULT_GRACE_S, run_id: str | None = None, now: bool = False,
             fresh: Sequence[str] = ()) -> "RunPlan":
        """Everything a run's start decides on the laptop, the preflight included (the image, the
        GPU count: at most one helper call), and nothing written on the host: `harness run
        --dry-run` shows it, launch sends it. `fresh`: stages whose artifact is made anew
        (harness.artifacts.check_fresh). A group's node runs its distributed stages whatever the
        store holds, resuming into their artifacts: every node must take part (none may reuse
        while another runs)."""
        stages = resolve_chain(list(requested), self.config.pipeline)
        fresh = check_fresh(fresh, stages, self.name)
        always_run = [s for s in stages if STAGES[s].distributed] if self.node is not None else []
        run_id = run_id or new_run_id()
        self.runtime.home_on_host(HOME_TOKEN)  # a configured ~ is expanded by the launch itself
        image, nproc = self._preflight(self.wants_gpu_count(stages))
        run_dir = self.run_dir(run_id)
        specs = {}
        for stage in stages:
            sd = f"{run_dir}/{stage}"
            specs[stage] = self._stage_spec(run_id, stage, sd, self.stage_command(stage, f"{sd}/events.jsonl", nproc))
        record = self._record(run_id, stages, grace_s, image)
        record["queue"] = {"gpus": queue_gpus(self.host), "wait": self.waits_in_queue and not now, "slot": self.queue_slot}
        record["store"] = store_root(self.config.pipeline)
        record["recipes"] = recipes(self.config, stages, max(nproc, 1), fresh, run_id, always_run)
        record["fresh"] = list(fresh)
        return RunPlan(run_id, self.name, stages, specs, record, self.runtime.workdir, requirements(self.config, self.runtime, stages))

    def launch(self, stages: list[str], grace_s: float = DEFAULT_GRACE_S, now: bool = False, run_id: str | None = None,
               fresh: Sequence[str] = ()) -> Launched:
        """Write the run's plan and start its supervisor, in one supervisor call (which first
        checks that the files the stages need are on the host: RunPlan.requires). The run is
        `queued` while earlier runs hold its GPUs, unless `now`. `run_id`: chosen by the caller
        beforehand (harness.sweep records it before the start; harness.multinode starts the same
        run on every host of a group)."""
        plan = self.plan(stages, grace_s, run_id, now, fresh)
        # Secret values travel in the request (stdin): the supervisor keeps them in memory.
        versions_probe = {"argv": helpers.argv(STAGE_VERSIONS, where=self.runtime), "stdin": helpers.payload(STAGE_VERSIONS, {}).decode()}
        try:
            result = self._supervise({"cmd": "launch", "run_dir": self.run_dir(plan.run_id), "specs": plan.specs, "record": plan.record,
                                      "manifest": f"{self.runtime.workdir}/{wire.MANIFEST_PATH}", "env": self.stage_env(), "requires": plan.requires,
                                      "versions_probe": versions_probe})
        except KeyboardInterrupt:  # the supervisor may have started it already: name it
            raise Interrupted(f"interrupted while starting run {plan.run_id} on {self.name}; it may be running there",
                              f"`harness status {self.name} {plan.run_id}` says; `harness cancel {self.name} {plan.run_id}` stops it") from None
        if result.exit_code == MISSING_EXIT:
            raise UsageError(result.error.strip().splitlines()[-1])
        if result.exit_code != 0:
            raise RemoteCommandError("supervisor launch " + plan.run_id, result.exit_code, result.error)
        reply = result.json()
        self.runtime.home_is(reply["home"], HOME_TOKEN)
        started = RunStatus.from_json(reply["status"], self.name)
        run_id = started.run_id
        if started.state == "queued":
            return Launched(run_id, f"run {run_id} queued on {self.name}{started.queue_note}: it starts by itself when the runs ahead are done")
        return Launched(run_id, f"run {run_id} started on {self.name}")

    def attach(self, run_id: str, view: AttachView, grace_s: float | None = None) -> "RunStatus":
        self.stream_logs(run_id, view.events, follow=True, as_json=True)
        return self.status(run_id)

    # How a stage starts: on this host alone, or as one node of a group run (self.node).

    def stage_command(self, stage: str, events_path: str, nproc: int) -> list[str]:
        if self.node is not None:
            return self.node.stage_command(stage, script_argv(stage, self.config, self.runtime.python, events_path), events_path, nproc)
        return stage_command(stage, self.config, self.runtime.python, events_path, nproc)

    def stage_env(self) -> dict[str, str]:
        """Environment values the stages get (through the supervisor's stdin, never a file)."""
        return {**self.host.env_values(), **(self.node.env() if self.node is not None else {})}

    def stage_network(self, stage: str) -> bool:
        """Whether the stage listens on the host's own addresses: a group's rendezvous, the
        watchdog's store and NCCL/Gloo, which the other hosts reach (a container shares the
        host network)."""
        return self.node is not None and STAGES[stage].distributed

    def _stage_spec(self, run_id: str, stage: str, stage_dir: str, argv: list[str]) -> dict[str, Any]:
        options = WrapOptions(env_names=tuple(self.stage_env()), host_network=self.stage_network(stage))
        process = self.runtime.stage_process(argv, run_id=run_id, stage=stage, log_path=f"{stage_dir}/log", options=options)
        return {**process, "stage": stage, "command": argv}

    def _record(self, run_id: str, stages: list[str], grace_s: float, image: dict[str, str | None]) -> dict[str, Any]:
        record = {
            "run_id": run_id,
            "host": self.host.name,
            "runtime": self.runtime.kind,
            "workdir": self.workdir,
            "stages": stages,
            "created": round(time.time(), 3),
            "grace_s": grace_s,
            "git": local_git_state(str(self.config.root)),
            "manifest_hash": None,  # the supervisor's launch reads it on the host
            "image": image,
            "env_names": list(self.host.env),  # names only; values never leave memory
            "set": dict(self.config.overrides),  # `harness run --set STAGE.FLAG=VALUE`: this run's alone
            "config": {
                "path": str(self.config.path),
                "host": self.host.to_record(),
                "pipeline": dataclasses.asdict(self.config.pipeline),
            },
            "versions": None,  # filled in by the supervisor before the first stage (STAGE_VERSIONS)
        }
        if self.node is not None:
            record["group"] = self.node.record()
        return record

    def wants_gpu_count(self, stages: list[str]) -> bool:
        """Whether the stage commands need the GPU count (torchrun's --nproc-per-node). A group's
        nproc_per_node, when configured, is every node's count: no probe."""
        if self.node is not None and self.node.launch.nproc_per_node:
            return False
        return any(STAGES[s].distributed for s in stages)

    def _preflight(self, gpu_count: bool) -> tuple[dict[str, Any], int]:
        """The image the stages run, checked before anything is written (Runtime.image_record),
        and, when asked, the GPUs a distributed stage spreads over (Runtime.gpu_count; else 0).
        Their host commands (docker's image check, the GPU probe) go in ONE helper call on the
        launch's client path (helpers.Prefetched); a host runtime with a configured count asks none."""
        probes = list(self.runtime.image_probes())
        gpu_probe = self.runtime.gpu_probe() if gpu_count else None
        if gpu_probe is not None:
            probes.append(gpu_probe)
        runner = helpers.Prefetched(self.transport, probes, python=self.host.python, home_token=HOME_TOKEN) if probes else self.transport
        return self.runtime.image_record(runner), (self.runtime.gpu_count(runner) if gpu_count else 0)

    # -- read back --------------------------------------------------------------------------------

    def resolve_run_id(self, run_id: str) -> str:
        """A run as the user names it (runs.pick_run: its id, `last`, `last~N`, or a unique start
        or end of its id); the host's runs are listed only when the name needs them."""
        if RUN_ID_RE.match(run_id):
            return run_id
        return pick_run(run_id, lambda: [r.run_id for r in self.listing().runs[self.name]], self.name)

    def no_runs_yet(self) -> UsageError:
        return UsageError(f"{self.name}: no runs yet", f"start one: harness run {self.name} all")

    def no_run(self, run_id: str) -> UsageError:
        return UsageError(f"{self.name}: no run {run_id}", f"`harness runs {self.name}` lists the runs")

    def _status_json(self, run_id: str | None) -> list[dict[str, Any]]:
        result = self._supervise({"cmd": "status", "runs_dir": self.runs_dir, "run_id": run_id})
        if result.exit_code == 2 and run_id:
            raise self.no_run(run_id)
        return result.checked("supervisor status").json()

    def status(self, run_id: str) -> RunStatus:
        run_id = self.resolve_run_id(run_id)
        status = RunStatus.from_json(self._status_json(run_id)[0], self.name)
        if status.run_id != run_id:
            raise box_values.BoxValueError(f"{self.name}: asked for run {run_id}, the box answered for {status.run_id}; refused")
        return status

    def listing(self) -> RunListing:
        """Every run on the host, oldest first (a record whose id is no run id is left out: no
        command could name it)."""
        runs = [box_values.or_none(lambda d: RunStatus.from_json(d, self.name), d) for d in self._status_json(None)]
        return RunListing(self.name, [self.name], {self.name: [r for r in runs if r is not None]})

    def stream_logs(self, run_id: str, sink: Callable[[bytes], None], stage: str | None = None, follow: bool = False,
                    as_json: bool = False, tail: int | None = None) -> int:
        """Stream stage logs from their first byte, or from the start of their last `tail` lines
        (JSON lines with events when as_json)."""
        request = {"cmd": "follow", "run_dir": self.run_dir(self.resolve_run_id(run_id)), "stage": stage, "follow": follow, "json": as_json, "tail": tail}
        result = self._supervise(request, stdout=sink)
        if result.exit_code == 2:
            if stage is not None and "has no stage" in result.error:
                raise UsageError(result.error.strip(), f"`harness status {self.name} {run_id}` lists its stages")
            raise self.no_run(run_id)
        if result.exit_code != 0:  # the supervisor ends every stream it finishes with 0: this one broke off
            raise logs_broke_off(self.name, run_id, f"on {self.name} broke off (the supervisor's stream ended with exit {result.exit_code}"
                                 + (f": {result.error.strip().splitlines()[-1]}" if result.error.strip() else "") + ")")
        return 0

    def cancel_run(self, run_id: str, grace_s: float | None = None) -> CancelOutcome:
        """SIGTERM, grace period, SIGKILL; the run's final state."""
        run_id = self.resolve_run_id(run_id)
        result = self._supervise({"cmd": "cancel", "run_dir": self.run_dir(run_id), "grace": grace_s})
        if result.exit_code == 2:
            raise self.no_run(run_id)
        said = result.checked("supervisor cancel").text.strip()
        ended = said.startswith("already ")
        state = said.removeprefix("already ")
        return CancelOutcome(run_id, {self.name: state}, where=self.name, ended_before={self.name} if ended else set())

    def preflight(self, plan: "RunPlan", synced: set[str] = frozenset()) -> dict[str, Any]:
        """`run --dry-run`'s look at the host (supervisor `preflight`, nothing written): which of
        the plan's requirements are missing (those the sync would send count as there), the free
        space where the artifacts go, the data's rows and the verifier's width (what sizes the
        hidden states). Its answer is the box's: numbers are checked by whoever uses them."""
        def relative(path: str) -> str:
            return path.removeprefix(plan.workdir + "/")

        requires = [r for r in plan.requires if relative(r["path"]) not in synced]
        p = self.config.pipeline
        root = plan.record["store"]
        data = p.data if p.data.startswith(("/", "~")) else f"{plan.workdir}/{p.data}"
        verifier = p.verifier if p.verifier.startswith(("/", "~")) else f"{plan.workdir}/{p.verifier}"
        result = self._supervise({"cmd": "preflight", "requires": requires, "space": root if root.startswith("/") else f"{plan.workdir}/{root}",
                                  "data": data, "verifier": verifier})
        facts = box_values.mapping(result.checked("supervisor preflight").json())
        facts["missing"] = [str(m) for m in facts.get("missing") or []]
        facts["space_at"] = box_values.text(facts.get("space_at"))
        facts["free_bytes"] = box_values.integer(facts.get("free_bytes"))
        return facts

    def collect(self, remove: list[str], dry_run: bool) -> dict[str, Any]:
        """`harness rm` / `harness gc` on the host (supervisor `gc`): the runs removed and the
        artifacts no kept run names, removed (or, dry_run, what would be); its answer, checked
        by harness.cleanup."""
        run_ids = [self.resolve_run_id(r) for r in remove]
        result = self._supervise({"cmd": "gc", "runs_dir": self.runs_dir, "stores": [store_root(self.config.pipeline)], "remove": run_ids,
                                  "dry_run": dry_run})
        if result.exit_code in (2, 3):
            raise UsageError(result.error.strip().splitlines()[-1], f"`harness runs {self.name}` lists the runs and their states")
        return result.checked("supervisor gc").json()

    def mark_cancelling(self, run_id: str) -> None:
        """The first round of a group's cancel: from now on a stage of this run that fails (its
        peers were cancelled first) is recorded cancelled. Stops nothing."""
        result = self._supervise({"cmd": "cancelling", "run_dir": self.run_dir(self.resolve_run_id(run_id))})
        if result.exit_code == 2:
            raise self.no_run(run_id)
        result.checked("supervisor cancelling")

    def wait(self, run_id: str, timeout: float, poll_s: float = 0.5) -> RunStatus:
        """Poll until the run reaches a final state (tests, scripts)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(run_id)
            if status.state in FINAL_RUN_STATES or time.monotonic() > deadline:
                return status
            time.sleep(poll_s)


def queue_gpus(host: HostConfig) -> list[int] | str:
    """The GPU set a run of this host queues on: the indices it is pinned to (the runtime's
    HostConfig.pinned_gpus), else "all": the whole host is one set (no GPUs, every GPU, a count docker picks
    itself, or none at all, since such a run still shares the box)."""
    chosen = host.pinned_gpus()
    return sorted(chosen) if chosen else "all"


def local_git_state(path: str) -> dict[str, Any]:
    """The laptop's commit and whether its tree is dirty ({commit: None} outside git)."""
    try:
        commit = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain"], capture_output=True, text=True, timeout=30)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}

