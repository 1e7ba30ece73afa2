"""The shape of a preflight check (model: SkyPilot's doctor).

A check is a plain function `check(runner, host) -> CheckResult`. It reaches the host only through
`runner.run(argv)`, a Transport in real use and a small fake in unit tests, so every check is
testable without SSH. Checks never raise for a finding: they return fail with a one-line fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Literal, Protocol, Sequence

from harness.config import HostConfig
from harness.errors import EXIT_CONNECTION, EXIT_FAILED, EXIT_OK, HarnessError
from harness.transport.base import RunResult

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    message: str  # one line: what was found
    fix: str = ""  # one line: what to do about it (empty when ok)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class HostDiagnosis:
    """`harness doctor HOST`: its checks (harness.host.Host.doctor). A group's answer is
    harness.group_checks.GroupDiagnosis; both render as `sections()`."""

    host: str
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        return not any(r.status == "fail" for r in self.results)

    def exit_code(self) -> int:
        """EXIT_CONNECTION when the host could not be reached (as every other command), else
        EXIT_FAILED on any fail."""
        if any(r.name == "connect" and r.status == "fail" for r in self.results):
            return EXIT_CONNECTION
        return EXIT_OK if self.ok else EXIT_FAILED

    def sections(self) -> list[tuple[str, list[CheckResult], str | None]]:
        """(title, checks, why doctor could not run there) per table the command prints."""
        return [(self.host, self.results, None)]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "checks": [r.to_dict() for r in self.results]}


class CommandRunner(Protocol):
    """What a check needs from a host. A Transport satisfies it."""

    def run(self, argv: Sequence[str], **kwargs) -> RunResult: ...


Check = Callable[[CommandRunner, HostConfig], CheckResult]


def run_checks(runner: CommandRunner, host: HostConfig, checks: Sequence[Check]) -> list[CheckResult]:
    """Run every check; one that crashes becomes a fail naming the error, never a traceback."""
    results = []
    for check in checks:
        try:
            results.append(check(runner, host))
        except HarnessError as e:
            results.append(CheckResult(_name(check), "fail", str(e), "fix the connection problem above, then re-run doctor"))
    return results


def _name(check: Check) -> str:
    return getattr(check, "check_name", None) or check.__name__.removeprefix("check_")


def describe(name: str, about: str):
    """Names a check and says in a few words what it looks at (`harness doctor --help` lists
    the checks from these, in the order doctor runs them)."""
    def mark(check):
        check.check_name, check.check_about = name, about
        return check

    return mark
