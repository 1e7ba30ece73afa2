"""`harness doctor GROUP`: every host's checks (harness.doctor, in parallel; harness.group.Group.doctor),
then the group's own: is the rendezvous port (and the watchdog's, +1) free on host 0, and can every
node route to the rendezvous host (a UDP connect only routes: no packet is sent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness import helpers
from harness.doctor.base import CheckResult
from harness.fanout import parallel

if TYPE_CHECKING:
    from harness.multinode import GroupRun

ROUTE_PROBE = "route_probe.py"  # host_helpers/: the local address a host reaches another one by


@dataclass(frozen=True)
class GroupDiagnosis:
    group: str
    hosts: list[str]
    results: dict[str, list[CheckResult]]  # host -> its checks ([] when doctor itself failed there)
    errors: dict[str, str]  # host -> why doctor could not run there
    group_checks: list[CheckResult]  # none while a host's doctor failed

    @property
    def ok(self) -> bool:
        return not self.errors and not any(r.status == "fail" for rs in [*self.results.values(), self.group_checks] for r in rs)

    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def sections(self) -> list[tuple[str, list[CheckResult], str | None]]:
        """Each host's table (or why doctor could not run there), then the group's own."""
        return [(h, self.results[h], self.errors.get(h)) for h in self.hosts] + [(f"group {self.group}", self.group_checks, None)]

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group, "ok": self.ok,
            "hosts": {h: {"checks": [r.to_dict() for r in self.results[h]], **({"error": self.errors[h]} if h in self.errors else {})} for h in self.hosts},
            "group_checks": [c.to_dict() for c in self.group_checks],
        }


def group_checks(runner: "GroupRun") -> list[CheckResult]:
    """CheckResults of the group as a whole (asked through its run interface, which writes nothing)."""
    config, group = runner.config, runner.name
    cfg = runner.group
    host = runner.rendezvous_host()
    checks = []
    try:
        port = runner.free_port()
        if port == cfg.rdzv_port:
            checks.append(CheckResult("rendezvous port", "ok", f"{host}:{port} and {port + 1} are free on {runner.hosts[0]}"))
        else:
            checks.append(CheckResult("rendezvous port", "warn", f"{cfg.rdzv_port} or {cfg.rdzv_port + 1} is taken on {runner.hosts[0]}; a run would use {port}",
                                      f"free the port, or set rdzv_port in [groups.{group}]"))
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        checks.append(CheckResult("rendezvous port", "fail", f"cannot probe ports on {runner.hosts[0]}: {e}", "check python3 on that host"))

    def route(h: str):
        return helpers.call(runner.transports[h], ROUTE_PROBE, {"address": host, "port": cfg.rdzv_port}, python=config.host(h).python)

    for h, result, error in parallel(runner.hosts, route):
        if error is None and result.exit_code == 0:
            checks.append(CheckResult(f"route {h} -> {host}", "ok", f"via local address {result.json()['via']}"))
        else:
            why = str(error) if error else result.error
            checks.append(CheckResult(f"route {h} -> {host}", "fail", why, f"set rdzv_host in [groups.{group}] to an address every node can reach"))
    return checks
