"""How `harness run` and `harness check-extract` start on a host: the code synced first.

A run never starts stages the host does not have: `start_run` syncs the configured paths (the
stage scripts, container/, the config, data listed in [sync] paths) before the launch, exactly
what `harness sync` does. An unchanged tree costs one exec over the SSH master that the launch
uses next (the helper sends its manifest, the laptop's hash cache says nothing changed, the helper
exits: no new connection; docs/configuration.md). The launch then checks on the host that every stage's
script, and a verifier given as a host path, are there (jobs.requirements), in the same call.

`dry_run` is the same start short of writing anything: the sync's plan, the preflight's verdict
(the image, the GPU count) and each stage's exact command line.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from harness.artifacts import check_fresh
from harness.box_values import integer
from harness.data_cost import DataCost, data_cost
from harness.errors import HarnessError, UsageError
from harness.host_helpers.wire import HOME_TOKEN
from harness.pipeline import resolve_chain
from harness.stages import DEFAULT_CHAIN, STAGES
from harness.units import human_bytes

if TYPE_CHECKING:
    from harness.data_cost import DataCost
    from harness.group import Group
    from harness.host import Host, SyncProgress
    from harness.runs import Launched
    from harness.sync import SyncOutcome


def no_stages_message(where: str) -> str:
    """`harness run HOST` without stages: what to name (a run of the whole chain takes hours on a
    real verifier, so it is never started by leaving the stages out)."""
    return (f"name the stages to run on {where}: `harness run {where} all` ({' -> '.join(DEFAULT_CHAIN)}), "
            f"or some of: {', '.join(STAGES)}; `--dry-run` shows their command lines first")


def sync_code(place: "Host | Group", progress: "SyncProgress | None" = None) -> "SyncOutcome":
    """The configured sync paths to every host of `place`; a host that failed is an error."""
    outcome = place.sync(place.config.sync_paths(), progress=progress)
    if outcome.errors:
        host, why = next(iter(outcome.errors.items()))
        raise HarnessError(f"{host}: sync before the run failed: {why}")
    return outcome


def start_run(place: "Host | Group", stages: list[str], *, grace_s: float, now: bool, progress: "SyncProgress | None" = None,
              fresh: Sequence[str] = ()) -> tuple["SyncOutcome", "Launched"]:
    """Sync what changed, then launch `stages` on `place` (a host or a group)."""
    if not stages:
        raise UsageError(no_stages_message(place.name))
    chain = resolve_chain(stages, place.config.pipeline)  # a misspelt stage is a line here, before any connection
    check_fresh(fresh, chain, place.name)
    outcome = sync_code(place, progress)
    return outcome, place.jobs.launch(stages, grace_s=grace_s, now=now, fresh=fresh)


@dataclass
class DryRun:
    """`harness run HOST STAGES --dry-run`: what would be synced, the preflight's verdict and each
    stage's command line (run in `workdir`); nothing is written on the host."""

    host: str
    stages: list[str]
    workdir: str = ""
    to_send: list[str] = field(default_factory=list)
    send_bytes: int = 0
    to_delete: list[str] = field(default_factory=list)
    commands: dict[str, list[str]] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)
    preflight_error: str | None = None
    store: str = ""  # the artifact store, as the workdir holds it
    free_bytes: int | None = None  # on the host, where the artifacts go
    space_at: str = ""
    cost: "DataCost | None" = None  # the replies, tokens and hidden-state bytes of the chain, at most

    @property
    def ok(self) -> bool:
        return self.preflight_error is None

    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def lines(self) -> list[str]:
        out = [f"sync: {len(self.to_send)} file(s), {self.send_bytes} bytes to send, {len(self.to_delete)} to delete" if self.to_send or self.to_delete
               else "sync: nothing to send (the host has this code)"]
        out.append(f"preflight on {self.host}: ok ({', '.join(self.requires)}: there, or sent by the sync)" if self.ok
                   else f"preflight on {self.host}: FAILED: {self.preflight_error}")
        if self.free_bytes is not None:
            disk = f"disk: {human_bytes(self.free_bytes)} free at {self.space_at}"
            if self.cost:
                need = self.cost.hidden_state_bytes(True)
                disk += f"; extract writes up to {human_bytes(need)} of hidden states ({self.cost.how()})"
                disk += "" if need < self.free_bytes else ": NOT ENOUGH (`harness gc` frees what no run needs; data_dir, output_dir)"
            out.append(disk)
        if self.cost and "regenerate" in self.stages:
            cpu, gpu = self.cost.per_prompt
            out.append(f"regenerate: up to {self.cost.replies(True):,} replies ({self.cost.rows} rows x {gpu}" + (f" on a GPU, x {cpu} on a CPU" if cpu != gpu else "")
                       + f"), up to {self.cost.replies(True) * self.cost.seq_len:,} tokens for extract")
        out.append(f"not checked here: the image, the stages' libraries and the GPUs (`harness doctor {self.host}` checks them)")
        out.append(f"in {self.workdir} on {self.host}:" if self.workdir else f"on {self.host}:")
        out += [f"  {stage}: {shlex.join(argv)}" for stage, argv in self.commands.items()]
        if any("@artifact:" in a for argv in self.commands.values() for a in argv):
            out.append(f"  (@artifact:STAGE@: that stage's artifact under {self.store}/STAGE/, keyed on {self.host} by what makes it when the stage starts)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "stages": self.stages, "workdir": self.workdir,
                "sync": {"send": self.to_send, "send_bytes": self.send_bytes, "delete": self.to_delete},
                "preflight": {"ok": self.ok, "error": self.preflight_error, "requires": self.requires, "free_bytes": self.free_bytes,
                              "space_at": self.space_at, "hidden_states_bytes": self.cost.hidden_state_bytes(True) if self.cost else None},
                "cost": self.cost.to_json() if self.cost else None,
                "commands": [{"stage": s, "argv": argv, "line": shlex.join(argv)} for s, argv in self.commands.items()]}


def dry_run(place: "Host | Group", stages: list[str], fresh: Sequence[str] = ()) -> DryRun:
    """The start of a run on one host, short of writing anything there."""
    if place.is_group:
        raise UsageError(f"--dry-run takes one host; {place.name} is a group: run it on each of its hosts")
    if not stages:
        raise UsageError(no_stages_message(place.name))
    result = DryRun(place.name, resolve_chain(stages, place.config.pipeline))
    planned = place.sync(place.config.sync_paths(), dry_run=True).results[place.name]
    result.to_send, result.to_delete, result.send_bytes = planned.plan.upload, planned.plan.delete, planned.plan.upload_bytes
    try:
        plan = place.jobs.plan(stages, fresh=fresh)
    except UsageError:
        raise
    except HarnessError as e:  # the image is not built, the container does not start, ...
        result.preflight_error = str(e)
        return result
    def shown(text: str) -> str:  # a configured ~ stays a token until the launch puts the home in
        return text.replace(HOME_TOKEN, "~")

    result.workdir = shown(plan.workdir)
    result.commands = {stage: [shown(a) for a in argv] for stage, argv in plan.commands().items()}
    result.requires = [shown(r["path"].removeprefix(plan.workdir + "/")) for r in plan.requires]
    result.store = plan.record["store"]
    facts = place.jobs.preflight(plan, synced=set(planned.plan.upload))  # what the sync sends counts as there
    if facts["missing"]:
        result.preflight_error = "; ".join(facts["missing"])
    result.free_bytes, result.space_at = facts["free_bytes"], shown(facts["space_at"] or "")
    result.cost = chain_cost(place.config, result.stages, facts)
    return result


def chain_cost(config, stages: list[str], facts: dict[str, Any]) -> "DataCost | None":
    """What the chain writes at most, from the box's facts (the data's rows, the verifier's width):
    rows x replies per prompt x the row's token bound x (target layers + 1) x hidden x 2 bytes
    (harness/data_cost.py); None where it is not known."""
    from harness.doctor.ml_checks import DEFAULT_TARGET_LAYERS  # deferred: start-up (doctor's ML checks: only for --dry-run's cost)

    p = config.pipeline
    layers = (len(p.target_layer_ids) or DEFAULT_TARGET_LAYERS) + 1
    return data_cost(p, stages, integer(facts.get("data_rows")), integer(facts.get("hidden_size")), layers)
