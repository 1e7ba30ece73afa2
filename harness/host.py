"""What a command works on: one configured host (Host); every host of a group is a Group
(harness.group), made of these.

The CLI context (harness/cli/context.py) hands each command one of these. A Host makes its
transport, runtime, workdir and run interface once, on first use, so no command assembles them
itself: Host.runtime and Host.jobs_with are the one place a runtime and a Jobs are made, and whoever
needs one takes the Host it was given. Everything it opened ends with the context (one close per
command). A Group holds one Host per member. Both answer `jobs`, the run interface
(harness.runs.RunInterface: launch, attach, locate, status, listing, stream_logs, cancel_run), and
`sync`, `build` and `doctor`, each returning one result type for both (harness.sync.SyncOutcome,
harness.runtime.image.BuildOutcome, a doctor diagnosis with `sections()`), so a command that
takes HOST or GROUP has one code path. A host's failure raises; a group goes on with its other
hosts and names the failed ones in the result.

Each method imports the subsystem it uses when it is called (`# deferred: start-up`): a command
pays only for what it asks (jobs, sync, the image build and doctor cost 14 to 28 ms each to
import; `python -X importtime -c "import harness.jobs"`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from harness.config import Config, HostConfig
from harness.errors import UsageError
from harness.runtime import runtime_for

if TYPE_CHECKING:
    from harness.doctor.base import HostDiagnosis
    from harness.group_node import GroupNode
    from harness.jobs import Jobs
    from harness.runtime.base import Runtime
    from harness.runtime.image import BuildOutcome
    from harness.sync import ProgressCallback, SyncOutcome, SyncPlan
    from harness.transport.base import Transport


@dataclass
class Host:
    """One host for one command. `transport_for(name)` opens (once) the transport of a host by
    name: the context's, so a group's hosts and a host share one connection each."""

    config: Config
    cfg: HostConfig
    transport_for: Callable[[str], "Transport"]

    is_group = False

    @property
    def name(self) -> str:
        return self.cfg.name

    @cached_property
    def transport(self) -> "Transport":
        return self.transport_for(self.cfg.name)

    @cached_property
    def runtime(self) -> "Runtime":
        """The stage environment; its workdir is expanded on the host once, on first use."""
        return runtime_for(self.cfg, self.transport)

    @property
    def uses_image(self) -> bool:
        """Whether the stages run in an image `harness build` makes (no connection needed)."""
        return self.cfg.uses_image

    @property
    def workdir(self) -> str:
        return self.runtime.workdir

    @cached_property
    def jobs(self) -> "Jobs":
        """The run interface of this host as configured (harness.jobs.Jobs, a RunInterface)."""
        return self.jobs_with()

    def jobs_with(self, config: Config | None = None, queue_slot: int | None = None, node: "GroupNode | None" = None) -> "Jobs":
        """A run interface on this host (the one place a Jobs is made); `jobs` is the one as
        configured. A sweep's trial gives its own `config` (its pipeline) and `queue_slot`, on
        the host `pinned` to its GPU; a group run's node gives its `node`
        (harness.group_node.GroupNode)."""
        from harness.jobs import Jobs  # deferred: start-up

        return Jobs(config or self.config, self.cfg, self.transport, self.runtime, queue_slot=queue_slot, node=node)

    def pinned(self, gpu: int | None) -> "Host":
        """This host with its stages pinned to one GPU (None: as configured), on the same
        connection; its runtime is its own (the GPU is part of how a stage starts)."""
        return self if gpu is None else dataclasses.replace(self, cfg=self.cfg.pinned_to(gpu))

    @property
    def hosts(self) -> list["Host"]:
        return [self]

    def sync(self, paths: Sequence[str], dry_run: bool = False, progress: "SyncProgress | None" = None) -> "SyncOutcome":
        """Push `paths` to the workdir (harness.sync.PreparedSync: one helper exec)."""
        from harness.sync import PreparedSync, SyncOutcome  # deferred: start-up

        config, cfg = self.config, self.cfg
        with PreparedSync(self.transport, config.root, paths, cfg.workdir, exclude=config.sync.exclude, python=cfg.python) as prepared:
            if dry_run:
                result = prepared.dry_run()
            else:
                result = prepared.apply(progress(self.name, prepared.plan) if progress else None)
        return SyncOutcome(self.name, [self.name], {self.name: result})

    def build(self, force: bool, output: Callable[[bytes], None], dry_run: bool = False) -> "BuildOutcome":
        """Build the ML image here (harness.runtime.image.build); docker's output into `output`."""
        from harness.runtime.image import BuildOutcome, build as build_image  # deferred: start-up

        if not self.uses_image:
            raise UsageError(f"host {self.name} has runtime = \"{self.cfg.runtime}\"; set runtime = \"docker\" in [hosts.{self.name}] to build an image")
        result = build_image(self.transport, self.config, self.cfg, output=output, force=force, dry_run=dry_run)
        return BuildOutcome(self.name, [self.name], {self.name: result})

    def doctor(self) -> "HostDiagnosis":
        """Every preflight check on this host's one connection."""
        from harness.doctor import diagnose  # deferred: start-up
        from harness.doctor.base import HostDiagnosis  # deferred: start-up

        return HostDiagnosis(self.name, diagnose(self.cfg, lambda: self.transport, project=self.config, runtime=lambda: self.runtime))


class SyncProgress(Protocol):
    """What shows a sync going on: called once a host's plan is known, it returns that host's
    progress callback (files sent, bytes sent), or None for no display."""

    def __call__(self, host: str, plan: "SyncPlan") -> "ProgressCallback | None": ...

