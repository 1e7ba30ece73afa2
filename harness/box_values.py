"""Every value the box sends back, checked where it enters the laptop: one function per kind.

A box may be compromised or shared (another account writes its runs/): a run id, a stage name, an
artifact key, a state, a number or a name it sends is input like the command line, never a path
to trust. A value that is not of its kind is refused where it enters (BoxValueError, one line
naming the host and what came), or dropped where it is only shown (`or_none`), so nothing it says
can reach a path on the laptop, a shell, or markup (the render's plain() is the last wall).
"""

from __future__ import annotations

import re
from typing import Any

from harness.errors import HarnessError

RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
ARTIFACT_KEY_RE = re.compile(r"^[0-9a-f]{20}$")  # artifact_store.KEY_CHARS of a SHA-256
STAGE_RE = re.compile(r"^[a-z][a-z_]{0,31}$")
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # a trial's, a package's: one path component, never . or ..
SHOWN = 240  # characters of a refused value repeated in the error


class BoxValueError(HarnessError):
    """The box sent a value that is not of its kind."""


def _refused(kind: str, value: Any, where: str) -> BoxValueError:
    shown = repr(value)
    shown = shown if len(shown) <= SHOWN else shown[:SHOWN] + "..."
    return BoxValueError(f"{where}: the box sent {shown} as a {kind}; refused (is the box's runs/ written by someone else?)")


def _matching(pattern: re.Pattern[str], kind: str, value: Any, where: str) -> str:
    if isinstance(value, str) and pattern.match(value):
        return value
    raise _refused(kind, value, where)


def run_id(value: Any, where: str = "box") -> str:
    return _matching(RUN_ID_RE, "run id", value, where)


def artifact_key(value: Any, where: str = "box") -> str:
    return _matching(ARTIFACT_KEY_RE, "artifact key", value, where)


def stage(value: Any, where: str = "box") -> str:
    return _matching(STAGE_RE, "stage name", value, where)


def name(value: Any, where: str = "box") -> str:
    """A name that may become one component of a local path (a trial, a package)."""
    if isinstance(value, str) and NAME_RE.match(value) and value not in (".", ".."):
        return value
    raise _refused("name", value, where)


def or_none(check, value: Any) -> Any:
    """`check(value)`, or None where the box sent something else (a value only shown)."""
    try:
        return check(value)
    except BoxValueError:
        return None


def number(value: Any) -> float | None:
    """A time or a measure: a finite number, else None (shown as unknown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
        return None
    return value


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
