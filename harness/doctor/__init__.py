"""`harness doctor`: preflight checks, each ok / warn / fail with a one-line fix.

CHECK_GROUPS is the list doctor runs, in order; add a group by appending
`("name", [check, ...])` (e.g. ML checks inside the container).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from harness.config import HostConfig
from harness.doctor.base import Check, CheckResult, CommandRunner, describe, run_checks
from harness.doctor.host_checks import HOST_CHECKS
from harness.errors import TransportError

if TYPE_CHECKING:
    from harness.runtime.base import Runtime
    from harness.transport.base import Transport

CHECK_GROUPS: list[tuple[str, list[Check]]] = [
    ("host", HOST_CHECKS),
]

# Groups whose checks need the project's configuration (pipeline settings, container/): a
# factory `(config, host, runtime) -> [check, ...]`, imported and built once per doctor run.
PROJECT_CHECK_GROUPS: list[tuple[str, str]] = [
    ("ml", "harness.doctor.ml_checks:ml_checks"),  # the factory's .catalogue(): the checks, for their names
]


@describe("connect", "the host is reached and authenticated")
def check_connect(host: HostConfig, open_transport: Callable[[], "Transport"]) -> tuple[CheckResult, "Transport | None"]:
    """Reachability and authentication: the connection itself. Returns (result, transport|None)."""
    try:
        transport = open_transport().open()
    except TransportError as e:
        return CheckResult("connect", "fail", e.message, e.hint or "check that the host is up and reachable"), None
    how = "this machine" if host.is_local else f"ssh {host.ssh}"
    return CheckResult("connect", "ok", f"reached and authenticated ({how})"), transport


def diagnose(host: HostConfig, open_transport: Callable[[], "Transport"], project=None,
             runtime: Callable[[], "Runtime"] | None = None) -> list[CheckResult]:
    """Connect, then run every group's checks on that one connection. `project` (the loaded
    Config) adds PROJECT_CHECK_GROUPS, which look into the host's stage environment: `runtime`
    (harness.host.Host.runtime, on the same connection)."""
    result, transport = check_connect(host, open_transport)
    if transport is None:
        return [result]
    results = [result]
    for _group, checks in CHECK_GROUPS:
        results += run_checks(transport, host, checks)
    if project is not None:
        import importlib

        for _group, target in PROJECT_CHECK_GROUPS:
            module, attr = target.split(":")
            factory = getattr(importlib.import_module(module), attr)
            results += run_checks(transport, host, factory(project, host, runtime()))
    return results


def check_catalogue() -> list[tuple[str, str]]:
    """(name, what it looks at) of every check doctor runs, in order (`harness doctor --help`)."""
    import importlib

    checks = [check_connect, *(c for _group, group in CHECK_GROUPS for c in group)]
    for _group, target in PROJECT_CHECK_GROUPS:
        module, attr = target.split(":")
        checks += getattr(importlib.import_module(module), attr).catalogue()
    return [(c.check_name, c.check_about) for c in checks]


__all__ = ["CHECK_GROUPS", "Check", "CheckResult", "CommandRunner", "diagnose", "run_checks"]
