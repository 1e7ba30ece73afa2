"""What a command works on: one configured host (Host) or every host of a group (Group).

The CLI context (harness/cli/context.py) hands each command one of these. A Host makes its
transport, runtime, workdir and run interface once, on first use, so no command assembles them
itself; everything it opened ends with the context (one close per command). A Group holds one
Host per member. Both answer `runs`, the run interface (harness.runs.RunPlace: start, attach,
locate, status, logs, cancel), so a command that takes HOST or GROUP has one code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable

from harness.config import Config, HostConfig

if TYPE_CHECKING:
    from harness.jobs import Jobs
    from harness.multinode import GroupRun
    from harness.runtime.base import Runtime
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
        from harness.runtime import runtime_for

        return runtime_for(self.cfg, self.transport)

    @property
    def uses_image(self) -> bool:
        """Whether the stages run in an image `harness build` makes (no connection needed)."""
        from harness.runtime import runtime_for

        return runtime_for(self.cfg).uses_image

    @property
    def workdir(self) -> str:
        return self.runtime.workdir

    @cached_property
    def runs(self) -> "Jobs":
        """The run interface of this host (harness.jobs.Jobs, a RunPlace)."""
        from harness.jobs import Jobs

        return Jobs(self.config, self.cfg, self.transport, runtime=self.runtime)

    @property
    def hosts(self) -> list["Host"]:
        return [self]


@dataclass
class Group:
    """Every host of `[groups.NAME]` for one command."""

    config: Config
    name: str
    transport_for: Callable[[str], "Transport"]

    is_group = True

    @cached_property
    def hosts(self) -> list[Host]:
        return [Host(self.config, self.config.host(h), self.transport_for) for h in self.config.groups[self.name].hosts]

    @cached_property
    def runs(self) -> "GroupRun":
        """The run interface of the group (harness.multinode.GroupRun, a RunPlace)."""
        from harness.multinode import GroupRun

        return GroupRun(self.config, self.name, self.transport_for)


Place = Host | Group
