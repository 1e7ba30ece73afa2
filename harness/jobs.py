"""Detached runs: a chain of stages executed one after another ON THE HOST.

The laptop writes the run's plan into files under <workdir>/runs/<run_id>/ (run.json, and a
spec.json per stage), ships the supervisor (harness/remote/supervisor.py, standard library only)
to <workdir>/.harness/, and starts it detached (double fork + setsid). From then on the run
needs neither the SSH link nor this process: closing the laptop does not stop the chain.

Every later command (logs, status, runs, cancel) is one call of the same supervisor script on the
host, reading those files, so any laptop can re-attach and nothing is lost when a link drops.
Runs queue per GPU set (queue_gpus): a run waits, `queued`, while an earlier run on an
overlapping set is queued or running on the host, and its supervisor starts it when the GPUs are
free; `now=True` starts at once. Same semantics on both runtimes: `host` (a process group per
stage) and `docker` (a container per stage, labelled with run and stage). Secret values (the host's `env` names) travel to the
supervisor on stdin and are never written to the run's files; the record keeps names only.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable

from harness.config import Config, HostConfig
from harness.errors import RemoteCommandError, UsageError
from harness.pipeline import STAGES, resolve_chain, stage_argv
from harness.runtime import runtime_for
from harness.runtime.base import WrapOptions
from harness.runtime.host import with_visible_gpus

if TYPE_CHECKING:
    from harness.transport.base import Transport

RUNS_DIR = "runs"
SUPERVISOR_PATH = ".harness/supervisor.py"  # relative to the workdir
RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
DEFAULT_GRACE_S = 10.0
FINAL_RUN_STATES = {"ok", "failed", "cancelled", "lost"}

# Library versions as the stages see them; importlib.metadata does not import torch (fast).
VERSIONS_SNIPPET = (
    "import json, importlib.metadata as m\n"
    "def v(name):\n"
    "    try:\n"
    "        return m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({n: v(n) for n in ('torch', 'transformers', 'speculators', 'vllm')}))\n"
)


def new_run_id() -> str:
    """UTC timestamp + 24 random bits: sortable, and two runs started together never collide."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def stage_command(stage: str, config: Config, python: str, events_path: str, nproc: int) -> list[str]:
    """A stage's command line. Distributed stages on a host with several GPUs run under torchrun.

    This is the hook for scale: multi-node launching replaces the `--standalone` rendezvous.
    """
    argv = stage_argv(stage, config.pipeline, python=python, events_path=events_path)
    if STAGES[stage].distributed and nproc > 1:
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *argv[1:]]
    return argv


@dataclass(frozen=True)
class StageStatus:
    stage: str
    state: str  # pending | running | ok | failed | cancelled | skipped
    started: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    last_event: dict[str, Any] | None = None
    tau: dict[str, Any] | None = None  # {"step", "tau"}: the latest acceptance estimate while training

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.finished or time.time()) - self.started


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunStatus":
        state = data.get("state") or {}
        stages = [
            StageStatus(
                stage=s["stage"],
                state=s.get("state", "pending"),
                started=s.get("started"),
                finished=s.get("finished"),
                exit_code=s.get("exit_code"),
                last_event=s.get("last_event"),
                tau=s.get("tau") if isinstance(s.get("tau"), dict) else None,
            )
            for s in data.get("stages", [])
        ]
        place = (state.get("queue") or {}).get("place")
        return cls(data["run_id"], state.get("state", "starting"), stages, data.get("record", {}), state.get("started"), state.get("finished"), place)


class Jobs:
    """Runs on one host, through one transport."""

    def __init__(self, config: Config, host: HostConfig, transport: "Transport"):
        self.config = config
        self.host = host
        self.transport = transport
        self.runtime = runtime_for(host, transport)
        self.workdir = self.runtime.workdir
        self.runs_dir = f"{self.workdir}/{RUNS_DIR}"
        self._supervisor_installed = False

    # -- the supervisor on the host ---------------------------------------------------------------

    @property
    def supervisor(self) -> str:
        return f"{self.workdir}/{SUPERVISOR_PATH}"

    def _install_supervisor(self) -> None:
        if self._supervisor_installed:
            return
        source = resources.files("harness.remote").joinpath("supervisor.py").read_bytes()
        try:
            current = self.transport.get_bytes(self.supervisor)
        except FileNotFoundError:
            current = None
        if current != source:
            self.transport.put_bytes(source, self.supervisor, mode=0o755)
        self._supervisor_installed = True

    def _supervise(self, *args: str, stdin: bytes | None = None, stdout: Callable[[bytes], None] | None = None):
        self._install_supervisor()
        return self.transport.run([self.host.python, self.supervisor, *args], stdin=stdin, stdout=stdout)

    def run_dir(self, run_id: str) -> str:
        return f"{self.runs_dir}/{run_id}"

    # -- start ------------------------------------------------------------------------------------

    # A run waits in the host's queue for its GPUs unless started with now=True. Group nodes
    # (harness.multinode) never wait: a waiting node would stall the others' rendezvous.
    waits_in_queue = True

    def start(self, requested: list[str], grace_s: float = DEFAULT_GRACE_S, run_id: str | None = None, now: bool = False) -> str:
        """Write the run's plan and start its supervisor; return the run id (`run_id`: given by
        harness.multinode, which starts the same run on every host of a group). The run is
        `queued` while earlier runs hold its GPUs, unless `now`."""
        stages = resolve_chain(list(requested))
        run_id = run_id or new_run_id()
        run_dir = self.run_dir(run_id)
        image = self._image()
        nproc = self._gpu_count() if any(STAGES[s].distributed for s in stages) else 0
        for stage in stages:
            sd = f"{run_dir}/{stage}"
            argv = self.stage_command(stage, f"{sd}/events.jsonl", nproc)
            self.transport.put_bytes(_to_json(self._stage_spec(run_id, stage, sd, argv)), f"{sd}/spec.json")
        record = self._record(run_id, stages, grace_s, image)
        record["queue"] = {"gpus": queue_gpus(self.host), "wait": self.waits_in_queue and not now}
        self.transport.put_bytes(_to_json(record), f"{run_dir}/run.json")
        # Secret values go on stdin: the supervisor keeps them in memory and passes them on.
        payload = json.dumps({"env": self.stage_env()}).encode()
        result = self._supervise("start", run_dir, stdin=payload)
        if result.exit_code != 0:
            raise RemoteCommandError("supervisor start " + run_id, result.exit_code, result.stderr.decode("utf-8", "replace"))
        return run_id

    # Hooks that harness.multinode.NodeJobs overrides to launch a stage across several hosts.

    def stage_command(self, stage: str, events_path: str, nproc: int) -> list[str]:
        return stage_command(stage, self.config, self.runtime.python, events_path, nproc)

    def stage_env(self) -> dict[str, str]:
        """Environment values the stages get (through the supervisor's stdin, never a file)."""
        return self.host.env_values()

    def _stage_spec(self, run_id: str, stage: str, stage_dir: str, argv: list[str]) -> dict[str, Any]:
        if self.runtime.kind == "docker":
            name = f"harness-{run_id}-{stage}"
            # The container appends its own output to the stage log (on the mounted workdir), so
            # the log is complete even if the supervisor dies while the container runs.
            inner = ["sh", "-c", 'exec "$@" >>"$0" 2>&1', f"{stage_dir}/log", *argv]
            options = WrapOptions(labels=(("run", run_id), ("stage", stage)), name=name, env_names=tuple(self.stage_env()))
            return {"kind": "docker", "stage": stage, "container": name, "argv": self.runtime.create_argv(inner, options), "command": argv}
        return {"kind": "host", "stage": stage, "argv": self.runtime.wrap(argv), "command": argv}

    def _record(self, run_id: str, stages: list[str], grace_s: float, image: dict[str, str | None]) -> dict[str, Any]:
        if self.runtime.kind == "docker":
            probe = self.runtime.wrap([self.runtime.python, "-c", VERSIONS_SNIPPET])
        else:
            probe = [self.runtime.python, "-c", VERSIONS_SNIPPET]
        return {
            "run_id": run_id,
            "host": self.host.name,
            "runtime": self.runtime.kind,
            "workdir": self.workdir,
            "stages": stages,
            "created": round(time.time(), 3),
            "grace_s": grace_s,
            "git": local_git_state(str(self.config.root)),
            "manifest_hash": self._manifest_hash(),
            "image": image,
            "env_names": list(self.host.env),  # names only; values never leave memory
            "config": {
                "path": str(self.config.path),
                "host": _host_record(self.host),
                "pipeline": dataclasses.asdict(self.config.pipeline),
            },
            "versions": None,  # filled in by the supervisor before the first stage
            "probe_argv": probe,
        }

    def _image(self) -> dict[str, Any]:
        """The image the stages run and the versions it recorded at build time, after one
        throwaway container proved it starts with the configured options (one line otherwise:
        not built, or ulimits the engine refuses). Also creates the host directories it mounts."""
        if self.runtime.kind != "docker":
            return {"ref": None, "id": None, "versions": None}
        from harness.runtime.preflight import check_container

        return check_container(self.transport, self.runtime).to_record()  # type: ignore[arg-type]

    def _manifest_hash(self) -> str | None:
        try:
            from harness.sync import host_manifest_digest
        except ImportError:
            return None
        return host_manifest_digest(self.transport, self.workdir)

    def _gpu_count(self) -> int:
        """GPUs a distributed stage spreads over (torchrun's --nproc-per-node)."""
        if self.runtime.kind == "docker":
            from harness.runtime.docker import gpu_count

            configured = gpu_count(self.host.container.gpus)
            if configured is not None:
                return configured
        # Host runtime: the stages see the CUDA_VISIBLE_DEVICES the host's `gpus` sets, else the
        # one their environment inherits; torchrun must start no more ranks than that. The probe
        # runs under the same setting as the stages.
        probe = 'printf "%s\\n" "${CUDA_VISIBLE_DEVICES-all}"; exec nvidia-smi -L'
        result = self.transport.run(with_visible_gpus(self.host, ["sh", "-c", probe]))
        return visible_gpu_count(result.text) if result.ok else 0

    # -- read back --------------------------------------------------------------------------------

    def resolve_run_id(self, run_id: str) -> str:
        """Validate a run id from the user; "last" means the newest run on the host."""
        if run_id == "last":
            runs = self.list_runs()
            if not runs:
                raise UsageError(f"{self.host.name}: no runs yet")
            return runs[-1].run_id
        if not RUN_ID_RE.match(run_id):
            raise UsageError(f"invalid run id {run_id!r} (expected YYYYMMDD-HHMMSS-xxxxxx or 'last')")
        return run_id

    def _status_json(self, run_id: str | None) -> list[dict[str, Any]]:
        args = ["status", self.runs_dir] + ([run_id] if run_id else [])
        result = self._supervise(*args)
        if result.exit_code == 2 and run_id:
            raise UsageError(f"{self.host.name}: no run {run_id}")
        if result.exit_code != 0:
            raise RemoteCommandError("supervisor status", result.exit_code, result.stderr.decode("utf-8", "replace"))
        return json.loads(result.text)

    def status(self, run_id: str) -> RunStatus:
        return RunStatus.from_json(self._status_json(self.resolve_run_id(run_id))[0])

    def list_runs(self) -> list[RunStatus]:
        return [RunStatus.from_json(d) for d in self._status_json(None)]

    def follow(self, run_id: str, sink: Callable[[bytes], None], stage: str | None = None, follow: bool = False, as_json: bool = False) -> int:
        """Stream stage logs from their first byte (JSON lines with events when as_json)."""
        args = ["follow", self.run_dir(self.resolve_run_id(run_id))]
        if stage:
            args += ["--stage", stage]
        if follow:
            args.append("--follow")
        if as_json:
            args.append("--json")
        result = self._supervise(*args, stdout=sink)
        if result.exit_code == 2:
            raise UsageError(result.stderr.decode("utf-8", "replace").strip() or f"no run {run_id}")
        return result.exit_code

    def cancel(self, run_id: str, grace_s: float | None = None) -> str:
        """SIGTERM, grace period, SIGKILL; returns the run's final state."""
        args = ["cancel", self.run_dir(self.resolve_run_id(run_id))]
        if grace_s is not None:
            args += ["--grace", str(grace_s)]
        result = self._supervise(*args)
        if result.exit_code == 2:
            raise UsageError(f"{self.host.name}: no run {run_id}")
        if result.exit_code != 0:
            raise RemoteCommandError("supervisor cancel", result.exit_code, result.stderr.decode("utf-8", "replace"))
        return result.text.strip()

    def wait(self, run_id: str, timeout: float, poll_s: float = 0.5) -> RunStatus:
        """Poll until the run reaches a final state (tests, scripts)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(run_id)
            if status.state in FINAL_RUN_STATES or time.monotonic() > deadline:
                return status
            time.sleep(poll_s)


def _host_record(host: HostConfig) -> dict[str, Any]:
    """The host's resolved config for the run record. Build-argument values may carry tokens
    (a private index URL), so only their names are kept; `env` already holds names only."""
    record = dataclasses.asdict(host)
    record["container"]["build_args"] = sorted(host.container.build_args)
    return record


def queue_gpus(host: HostConfig) -> list[int] | str:
    """The GPU set a run of this host queues on: the indices it is pinned to (`gpus` on runtime
    host, a list in container.gpus), else "all": the whole host is one set (no GPUs, every GPU,
    a count docker picks itself, or none at all, since such a run still shares the box)."""
    chosen = host.container.gpus if host.runtime == "docker" else host.gpus
    if isinstance(chosen, list) and chosen:
        return sorted(chosen)
    return "all"


def visible_gpu_count(probe_output: str) -> int:
    """GPUs the stages can use, from the probe's output: a CUDA_VISIBLE_DEVICES line ("all" when
    unset), then `nvidia-smi -L`."""
    first, _, rest = probe_output.partition("\n")
    listed = sum(1 for line in rest.splitlines() if line.startswith("GPU "))
    if first.strip() == "all":
        return listed
    visible = [d for d in first.split(",") if d.strip() and d.strip() != "-1"]
    return min(listed, len(visible))


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


def _to_json(data: Any) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
