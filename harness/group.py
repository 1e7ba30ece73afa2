"""Every host of a group for one command (Group): the HOST|GROUP commands' other place
(harness.host says what both answer). Its run interface is harness.multinode.GroupRun; each
host's part in a group run is harness.group_node.GroupNode; its doctor adds
harness.group_checks to every host's checks.

Each method imports the subsystem it uses when it is called (`# deferred: start-up`; harness.host
says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Sequence

from harness.config import Config
from harness.errors import UsageError
from harness.fanout import LinePrefixer, open_all, parallel, prefixed_sink
from harness.host import Host, SyncProgress

if TYPE_CHECKING:
    from harness.group_checks import GroupDiagnosis
    from harness.multinode import GroupRun
    from harness.runtime.image import BuildOutcome
    from harness.sync import ProgressCallback, SyncOutcome, SyncPlan
    from harness.transport.base import Transport


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
    def jobs(self) -> "GroupRun":
        """The run interface of the group (harness.multinode.GroupRun, a RunInterface)."""
        from harness.multinode import GroupRun  # deferred: start-up

        return GroupRun(self.config, self.name, self.hosts)

    def sync(self, paths: Sequence[str], dry_run: bool = False, progress: "SyncProgress | None" = None) -> "SyncOutcome":
        """Every host at once (harness.sync.sync_hosts: planned in turn, applied together)."""
        from harness.sync import SyncOutcome, sync_hosts  # deferred: start-up

        names = [h.name for h in self.hosts]
        transports = open_all(self.transport_for, names)
        if dry_run:
            results = {h.name: h.sync(paths, dry_run=True).results[h.name] for h in self.hosts}
            return SyncOutcome(self.name, names, results)
        callbacks: dict[str, "ProgressCallback | None"] = {}

        def on_plan(h: str, plan: "SyncPlan") -> None:
            callbacks[h] = progress(h, plan) if progress else None

        outcome = sync_hosts(self.config, transports, paths, on_plan=on_plan, progress_for=lambda h: callbacks.get(h))
        return SyncOutcome(self.name, names, {h: r for h, r, e in outcome if e is None}, {h: str(e) for h, _, e in outcome if e is not None})

    def build(self, force: bool, output: Callable[[bytes], None], dry_run: bool = False) -> "BuildOutcome":
        """Build on every host at once; docker's lines into `output`, each prefixed `[host] `."""
        from harness.runtime.image import BuildOutcome, BuildStopped, build as build_image, stop_build  # deferred: start-up

        no_image = [h.name for h in self.hosts if not h.uses_image]
        if no_image:
            raise UsageError(f"group {self.name}: host(s) {', '.join(no_image)} have runtime = \"host\"; nothing to build there")
        names = [h.name for h in self.hosts]
        transports = open_all(self.transport_for, names)
        write = prefixed_sink(output)
        running: dict[str, str] = {}  # host -> its build's docker client pid there

        def one(h: str):
            out = LinePrefixer(h, write)
            try:
                return build_image(transports[h], self.config, self.config.host(h), output=out.feed, force=force, dry_run=dry_run, running=running)
            finally:
                out.flush()

        try:
            outcome = parallel(names, one)
        except KeyboardInterrupt:  # Ctrl-C: each host's build ends there too
            stopped = [h for h, pid in list(running.items()) if stop_build(transports[h], pid)]
            raise BuildStopped(self.name, bool(stopped)) from None
        return BuildOutcome(self.name, names, {h: r for h, r, e in outcome if e is None}, {h: str(e) for h, _, e in outcome if e is not None}, group=True)

    def doctor(self) -> "GroupDiagnosis":
        """Every host's checks (in parallel), then, where each host's doctor ran, the group's own
        (harness.group_checks)."""
        from harness.group_checks import GroupDiagnosis, group_checks  # deferred: start-up

        outcome = parallel(self.hosts, lambda h: h.doctor().results)
        errors = {h.name: str(e) for h, _, e in outcome if e is not None}
        results = {h.name: (r if e is None else []) for h, r, e in outcome}
        return GroupDiagnosis(self.name, [h.name for h in self.hosts], results, errors, group_checks(self.jobs) if not errors else [])


Place = Host | Group
