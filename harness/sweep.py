"""A sweep: several train recipes (trials) tried on one host, on the same prepared data and hidden
states, each measured on the selection split; the best is printed as harness.toml lines.

A trial is one run of the host's run queue (harness.jobs): train and evaluate, with the trial's
train flags over `[pipeline.stages.train]` and evaluate on the selection split; its artifacts
are keyed like every run's (harness/artifacts.py), so the trials share the prepared data and
hidden states and each trains its own draft. Trials are pinned one GPU each and all queued at once, so the box works through
them with no laptop attached. The winner is measured once more on the test split, which is
reported and never used to choose. The sweep's state is on the host (sweep.json); its id is a
digest of what the sweep is, so running the same command again picks it up.

How trials are laid out, chosen and picked up: docs/architecture/wings.md (sweep.py), docs/sweep.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import posixpath
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from harness.config import Config
from harness.errors import UsageError
from harness.events import Evaluation, evaluation, finished_failure
from harness.stage_options import parse_value

if TYPE_CHECKING:
    from harness.host import Host
    from harness.jobs import Jobs, RunStatus

SWEEP_ID_RE = re.compile(r"^sweep-[0-9a-f]{10}$")
SWEPT_STAGES = ("train",)  # evaluate is the measurement: every trial is measured the same way
# Flags the sweep sets itself (where a trial reads and writes): never an axis.
OWN_FLAGS = {"verifier", "prepared", "hidden_states", "output", "events"}
FLAG_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
TRIAL_STAGES = ["train", "evaluate"]
TEST_SPLIT = "heldout"  # the rows only reported on (evaluate's default split)
POLL_S = 3.0  # how often a follower looks at the host
RELAUNCHED = {"cancelled", "lost"}  # a re-run of the command starts these trials again; failed stays failed


# -- the grid -----------------------------------------------------------------------------------


def parse_sets(values: list[str], config: Config | None = None) -> dict[str, list[Any]]:
    """`--set train.lr=1e-3,3e-4` (repeatable) -> {"train.lr": [0.001, 0.0003]}; each value
    checked by the stage's own parser when `config` is given (the one check of every --set)."""
    axes: dict[str, list[Any]] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not raw.strip():
            raise UsageError(f"--set {item!r}: expected STAGE.FLAG=VALUE[,VALUE...], e.g. --set train.lr=1e-3,3e-4")
        axes[key.strip()] = [parse_value(v.strip()) for v in raw.split(",")]
    check_axes(axes, "--set", config)
    return axes


def check_axes(axes: dict[str, list[Any]], where: str, config: Config | None = None) -> None:
    """Every axis is a train flag with at least one value, and not one the sweep sets itself;
    with `config`, every value one its stage's parser takes."""
    from harness.pipeline import STAGES
    from harness.stage_options import check_settings

    for key, values in axes.items():
        stage, _, flag = key.partition(".")
        if stage not in SWEPT_STAGES or not FLAG_RE.match(flag):
            raise UsageError(f"{where}: {key!r}: a sweep varies train flags, e.g. train.lr (STAGE.FLAG with STAGE in {', '.join(SWEPT_STAGES)})")
        if flag.replace("-", "_") in OWN_FLAGS:
            raise UsageError(f"{where}: {key!r}: the sweep sets train.{flag} itself (each trial reads the same inputs, writes its own artifact)")
        if not values:
            raise UsageError(f"{where}: {key!r}: no values")
        if config is not None:
            for value in values:
                check_settings({stage: {flag.replace("-", "_"): value}}, config.path, {n: s.script for n, s in STAGES.items()}, where)


def config_axes(config: Config) -> dict[str, list[Any]]:
    """`[sweep.grid.train] lr = [1e-3, 3e-4]` -> {"train.lr": [...]}."""
    return {f"{stage}.{flag}": list(values) for stage, flags in config.sweep.grid.items() for flag, values in flags.items()}


@dataclass(frozen=True)
class Trial:
    name: str  # t0, t1, ... in grid order
    flags: dict[str, Any]  # this trial's train flags (the axes' values)


def grid(axes: dict[str, list[Any]]) -> list[Trial]:
    """Every combination of the axes' values, the first axis slowest; no axes: none."""
    if not axes:
        return []
    keys = list(axes)
    trials = []
    for i, values in enumerate(itertools.product(*(axes[k] for k in keys))):
        trials.append(Trial(f"t{i}", {k.partition(".")[2].replace("-", "_"): v for k, v in zip(keys, values)}))
    return trials


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def winner_lines(base_train: dict[str, Any], flags: dict[str, Any]) -> str:
    """The harness.toml table the next `harness run` trains with: [pipeline.stages.train] as
    configured, with the winner's flags over it."""
    merged = {**base_train, **flags}
    return "\n".join(["[pipeline.stages.train]", *(f"{k} = {toml_value(v)}" for k, v in merged.items())])


# -- the plan and its state on the host ---------------------------------------------------------


def sweep_id(host: str, axes: dict[str, list[Any]], split: str, config: Config) -> str:
    """What the sweep is, as a digest: the same command on the same config is the same sweep."""
    what = {"host": host, "axes": axes, "split": split, "pipeline": dataclasses.asdict(config.pipeline)}
    return "sweep-" + hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:10]


def sweeps_dir(config: Config, workdir: str) -> str:
    return posixpath.join(workdir, config.pipeline.output_dir, "sweeps")


@dataclass
class TrialState:
    name: str
    flags: dict[str, Any]
    gpu: int | None  # the GPU it is pinned to; None: not pinned (a host without GPUs listed)
    runs: list[str] = field(default_factory=list)  # run ids, the current one last
    slot: int | None = None  # its queue slot on that GPU (trials at once per GPU: [sweep] per_gpu)

    @property
    def run_id(self) -> str | None:
        return self.runs[-1] if self.runs else None


@dataclass
class SweepState:
    """sweep.json on the host."""

    sweep_id: str
    host: str
    axes: dict[str, list[Any]]
    split: str
    created: float
    trials: list[TrialState]
    test_run: str | None = None  # the winner measured on the test split
    test_trial: str | None = None
    cancelled: bool = False  # `harness cancel HOST SWEEP`: nothing more starts until the command is run again

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "box") -> "SweepState":
        """sweep.json as the box keeps it: trial names and run ids checked (harness.box_values)."""
        from harness import box_values

        try:
            trials = [TrialState(box_values.name(t["name"], where), dict(t["flags"]), box_values.integer(t.get("gpu")),
                                 [box_values.run_id(r, where) for r in t.get("runs") or []], box_values.integer(t.get("slot")))
                      for t in data["trials"]]
            test_run = data.get("test_run")
            return cls(str(data["sweep_id"]), str(data["host"]), dict(data["axes"]), str(data["split"]), float(data["created"]), trials,
                       box_values.run_id(test_run, where) if test_run is not None else None,
                       box_values.name(data["test_trial"], where) if data.get("test_trial") is not None else None, bool(data.get("cancelled")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise box_values.BoxValueError(f"{where}: sweep.json is not a sweep's record ({type(e).__name__}: {e}); refused") from None

    def trial(self, name: str) -> TrialState:
        return next(t for t in self.trials if t.name == name)


# -- what a sweep looks like now ----------------------------------------------------------------


@dataclass(frozen=True)
class TrialView:
    name: str
    flags: dict[str, Any]
    gpu: int | None
    run_id: str | None
    state: str  # the run's (queued, running, ok, failed, cancelled, lost), or "not started"
    stage: str | None  # the stage running, or where the run stopped
    measured: Evaluation | None  # evaluate's result on the selection split
    training_tau: float | None  # train's latest estimate while it runs
    error: str | None = None  # a failed stage's one line

    @property
    def tau(self) -> float | None:
        return self.measured.tau if self.measured else None

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.name, "flags": self.flags, "gpu": self.gpu, "run_id": self.run_id, "state": self.state, "stage": self.stage,
                "tau": self.tau, "tau_by_category": self.measured.by_category if self.measured else None, "training_tau": self.training_tau, "error": self.error}


def choose_winner(trials: list[TrialView]) -> TrialView | None:
    """The trial with the highest selection tau among those that ended ok; the first on a tie."""
    best = None
    for t in trials:
        if t.state == "ok" and t.tau is not None and (best is None or t.tau > best.tau):
            best = t
    return best


@dataclass(frozen=True)
class SweepView:
    """`harness sweep HOST --status` (and the live table): every trial, the winner, its test tau."""

    state: SweepState
    trials: list[TrialView]
    base_train: dict[str, Any]
    k: int  # tokens the draft proposes per round: tau is between 1 and k + 1
    test: TrialView | None = None  # the winner's test-split run

    @property
    def done(self) -> bool:
        """Every trial ended, and the winner's test run too (when there is one and the sweep was not cancelled)."""
        from harness.jobs import FINAL_RUN_STATES

        ended = all(t.state in FINAL_RUN_STATES for t in self.trials)
        return ended and (self.winner is None or self.state.cancelled or (self.test is not None and self.test.state in FINAL_RUN_STATES))

    @property
    def winner(self) -> TrialView | None:
        from harness.jobs import FINAL_RUN_STATES

        if not all(t.state in FINAL_RUN_STATES for t in self.trials):
            return None  # only once every trial is measured
        return choose_winner(self.trials)

    def winner_lines(self) -> str | None:
        return winner_lines(self.base_train, self.winner.flags) if self.winner else None

    def exit_code(self) -> int:
        return 0 if self.winner is not None or not self.done else 1

    def to_json(self) -> dict[str, Any]:
        w = self.winner
        return {"sweep_id": self.state.sweep_id, "host": self.state.host, "split": self.state.split, "axes": self.state.axes, "done": self.done,
                "trials": [t.to_json() for t in self.trials],
                "winner": None if w is None else {"trial": w.name, "flags": w.flags, "tau": w.tau, "harness_toml": self.winner_lines(),
                                                  "test": self.test.to_json() if self.test else None}}


# -- the sweep on one host ------------------------------------------------------------------------


class Sweep:
    """One host's sweeps: plan, start or resume, read back, cancel, on the host a command was
    given (harness.host.Host); each trial's runs go through a Jobs pinned to its GPU."""

    def __init__(self, place: "Host"):
        self.place = place
        self.config, self.host, self.transport, self.runtime = place.config, place.cfg, place.transport, place.runtime

    # paths on the host

    @property
    def root(self) -> str:
        return sweeps_dir(self.config, self.runtime.workdir)

    def _record_path(self, sid: str) -> str:
        return posixpath.join(self.root, sid, "sweep.json")

    # state

    def load(self, sid: str | None) -> SweepState:
        """A sweep's state; None: the newest on the host."""
        if sid is None:
            try:
                sid = self.transport.get_bytes(posixpath.join(self.root, "latest")).decode().strip()
            except FileNotFoundError:
                raise UsageError(f"{self.host.name}: no sweep yet (start one: harness sweep {self.host.name} --set train.lr=1e-3,3e-4)") from None
        if not SWEEP_ID_RE.match(sid):
            raise UsageError(f"invalid sweep id {sid!r} (expected sweep-xxxxxxxxxx, as `harness sweep` printed)")
        try:
            return SweepState.from_json(json.loads(self.transport.get_bytes(self._record_path(sid))), self.host.name)
        except FileNotFoundError:
            raise UsageError(f"{self.host.name}: no sweep {sid}") from None

    def _save(self, state: SweepState) -> None:
        self.transport.put_bytes(json.dumps(state.to_json(), indent=1).encode(), self._record_path(state.sweep_id))

    def plan(self, axes: dict[str, list[Any]], split: str, gpus: list[int], per_gpu: int = 1) -> SweepState:
        """The sweep these axes make on this host: the one on the host already, or a new one
        (its run ids chosen now, written before any starts). Trial i goes to GPU i mod len(gpus),
        in one of `per_gpu` queue slots there: that many trials run at once on a GPU."""
        from harness.jobs import new_run_id

        trials = grid(axes)
        if not trials:
            raise UsageError(f"nothing to sweep: give axes with --set train.FLAG=V1,V2 or [sweep.grid.train] in {self.config.path.name}")
        sid = sweep_id(self.host.name, axes, split, self.config)
        try:
            return self.load(sid)
        except UsageError:
            pass
        places = placement(len(trials), gpus, per_gpu)
        state = SweepState(sid, self.host.name, axes, split, round(time.time(), 3),
                           [TrialState(t.name, t.flags, gpu, [new_run_id()], slot) for t, (gpu, slot) in zip(trials, places)])
        self._save(state)
        self.transport.put_bytes(sid.encode(), posixpath.join(self.root, "latest"))
        return state

    def gpus(self, configured: list[int]) -> list[int]:
        """The GPUs trials are spread over: the sweep's list, else the host's pinned ones, else
        every GPU the stages see; [] on a box without GPUs (trials run one after another)."""
        if configured:
            return list(configured)
        pinned = self.host.pinned_gpus()
        if pinned:
            return pinned
        return list(range(self.runtime.gpu_count(self.transport)))

    # runs

    def trial_config(self, trial: TrialState, split: str) -> Config:
        """The pipeline a trial runs: its train flags over [pipeline.stages.train], evaluate on
        `split`. Its artifacts are keyed by them: trials share the prepared data and hidden
        states (same key), each trains its own draft (its flags are in its key)."""
        p = self.config.pipeline
        stages = {**p.stages, "train": {**p.stages.get("train", {}), **trial.flags}, "evaluate": {**p.stages.get("evaluate", {}), "split": split}}
        return dataclasses.replace(self.config, pipeline=dataclasses.replace(p, stages=stages))

    def trial_jobs(self, state: SweepState, trial: TrialState) -> "Jobs":
        """The Jobs that runs this trial, on the host pinned to its GPU, in its queue slot."""
        return self.place.pinned(trial.gpu).jobs_with(self.trial_config(trial, state.split), queue_slot=trial.slot)

    def test_jobs(self, state: SweepState, winner: TrialState) -> "Jobs":
        """The winner's draft measured on the test split (evaluate alone: the draft is the
        winner's train artifact, found by the same key)."""
        return self.place.pinned(winner.gpu).jobs_with(self.trial_config(winner, TEST_SPLIT))

    def advance(self, state: SweepState, statuses: dict[str, "RunStatus"], relaunch: bool = False) -> list[str]:
        """Start what the sweep still needs: trials with no run on the host (a lost link before
        their launch), with `relaunch` (the command run again) those whose run was cancelled or
        lost too; once every trial ended, the winner's test run. Nothing on a cancelled sweep
        unless `relaunch`. Returns the lines that say what started."""
        from harness.jobs import new_run_id

        if state.cancelled and not relaunch:
            return []
        if state.cancelled:
            state.cancelled = False
            self._save(state)
        lines = []
        for trial in state.trials:
            status = statuses.get(trial.run_id) if trial.run_id else None
            if status is not None and (status.state not in RELAUNCHED or not relaunch):
                continue
            if status is not None:  # a new attempt: recorded before it starts
                trial.runs.append(new_run_id())
                state.test_run = state.test_trial = None  # the winner may change: measured again once all ended
                self._save(state)
            started = self.trial_jobs(state, trial).launch(TRIAL_STAGES, run_id=trial.run_id)
            where = ", ".join(([f"GPU {trial.gpu}"] if trial.gpu is not None else []) + ([f"slot {trial.slot}"] if trial.slot is not None else []))
            lines.append(f"trial {trial.name} {_flags_text(trial.flags)}" + (f" ({where})" if where else "") + f": {started.line}")
        view = self.view(state, statuses)
        test = statuses.get(state.test_run or "")
        if view.winner is not None and (state.test_run is None or (relaunch and (test is None or test.state in RELAUNCHED))):
            state.test_run, state.test_trial = new_run_id(), view.winner.name
            self._save(state)
            winner = state.trial(view.winner.name)
            started = self.test_jobs(state, winner).launch(["evaluate"], run_id=state.test_run)
            lines.append(f"winner {winner.name} {_flags_text(winner.flags)}, measured on the test split: {started.line}")
        return lines

    def statuses(self) -> dict[str, "RunStatus"]:
        """Every run on the host by id (one supervisor call)."""
        return {r.run_id: r for rs in self.place.jobs.listing().runs.values() for r in rs}

    def view(self, state: SweepState, statuses: dict[str, "RunStatus"] | None = None) -> SweepView:
        statuses = self.statuses() if statuses is None else statuses
        trials = [trial_view(t.name, t.flags, t.gpu, t.run_id, statuses.get(t.run_id or "")) for t in state.trials]
        test = None
        if state.test_run is not None:
            t = state.trial(state.test_trial)
            test = trial_view(t.name, t.flags, t.gpu, state.test_run, statuses.get(state.test_run))
        return SweepView(state, trials, dict(self.config.pipeline.stages.get("train", {})), self.config.pipeline.speculative_tokens, test)

    def axes(self, sets: list[str]) -> dict[str, list[Any]]:
        """The grid a sweep command asks for: [sweep.grid] of the config, each `--set` over it."""
        axes = config_axes(self.config)
        check_axes(axes, f"{self.config.path.name} [sweep.grid]")
        axes.update(parse_sets(sets, self.config))
        return axes

    def start(self, axes: dict[str, list[Any]], split: str | None = None, gpus: list[int] | None = None, per_gpu: int | None = None) -> tuple[SweepState, list[str]]:
        """Find (or plan) the sweep and start what it still needs (split, gpus, per_gpu: the
        config's [sweep] where not given). A sweep found keeps its placement (no GPU probe)."""
        configured = self.config.sweep
        split, gpus, per_gpu = split or configured.split, gpus or configured.gpus, per_gpu or configured.per_gpu
        try:
            state = self.load(sweep_id(self.host.name, axes, split, self.config))
        except UsageError:
            state = self.plan(axes, split, self.gpus(gpus), per_gpu)
        return state, self.advance(state, self.statuses(), relaunch=True)

    def step(self, sid: str, advance: bool = True) -> tuple[SweepView, list[str]]:
        """One look at a sweep being followed: its state read again (a cancel elsewhere is seen),
        with `advance` what is due started (the winner's test run once every trial ended), and
        its view then. Returns the view and the lines that say what started."""
        state = self.load(sid)
        statuses = self.statuses()
        lines = self.advance(state, statuses) if advance else []
        if lines:
            statuses = self.statuses()
        return self.view(state, statuses), lines

    def follow(self, sid: str, on_line: Callable[[str], None], poll_s: float = POLL_S) -> Iterator[SweepView]:
        """Step the sweep every `poll_s` until every trial and the winner's test run ended: each
        view as it is seen, the last one done; `on_line` hears what started."""
        while True:
            view, lines = self.step(sid)
            for line in lines:
                on_line(line)
            yield view
            if view.done:
                return
            time.sleep(poll_s)

    def cancel(self, sid: str, grace_s: float | None = None, dry_run: bool = False) -> dict[str, str]:
        """Cancel every trial run (and the test run) not ended yet: trial -> its final state
        (`dry_run`: its state now; nothing is stopped)."""
        from harness.jobs import FINAL_RUN_STATES

        state = self.load(sid)
        if not dry_run:
            state.cancelled = True  # first: a follower starts nothing more (the test run)
            self._save(state)
        statuses = self.statuses()
        outcome = {}
        runs = [(t.name, t.run_id) for t in state.trials] + ([("test", state.test_run)] if state.test_run else [])
        jobs = self.place.jobs
        for name, run_id in runs:
            status = statuses.get(run_id or "")
            if status is None:
                outcome[name] = "not started"
            elif status.state in FINAL_RUN_STATES or dry_run:
                outcome[name] = status.state
            else:
                outcome[name] = jobs.cancel_run(run_id, grace_s).states[jobs.name]
        return outcome


def trial_view(name: str, flags: dict[str, Any], gpu: int | None, run_id: str | None, status: "RunStatus | None") -> TrialView:
    if status is None:
        return TrialView(name, flags, gpu, run_id, "not started", None, None, None)
    by_stage = {s.stage: s for s in status.stages}
    evaluate = by_stage.get("evaluate")
    train = by_stage.get("train")
    measured = evaluation(evaluate.last_event) if evaluate is not None and evaluate.state == "ok" else None
    training_tau = (train.tau or {}).get("tau") if train is not None else None
    failed = status.failed_stage
    failure = finished_failure(failed.last_event) if failed is not None else None
    return TrialView(name, flags, gpu, run_id, status.state, status.current_stage, measured, training_tau, failure.error if failure else None)


def placement(trials: int, gpus: list[int], per_gpu: int) -> list[tuple[int | None, int | None]]:
    """(GPU, queue slot) of each trial: round-robin over the GPUs (None: not pinned), then over
    `per_gpu` slots on each (None when one trial at a time per GPU)."""
    if per_gpu < 1:
        raise UsageError(f"per_gpu {per_gpu}: expected at least 1 trial at a time per GPU")
    places = len(gpus) or 1
    return [(gpus[i % places] if gpus else None, (i // places) % per_gpu if per_gpu > 1 else None) for i in range(trials)]


def _flags_text(flags: dict[str, Any]) -> str:
    return " ".join(f"{k}={toml_value(v)}" for k, v in flags.items())


def is_sweep_id(text: str) -> bool:
    return bool(SWEEP_ID_RE.match(text))
