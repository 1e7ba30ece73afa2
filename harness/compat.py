"""Which library versions work together in the ML image: the compatibility matrix as data.

`harness doctor` reads the versions installed in the image (importlib.metadata, no import) and
checks them against these rows. Add a row when a release is vetted or a breakage is found;
cite where the constraint comes from, so the next engineer can re-check it.

Versions are compared by their release numbers (PEP 440 without the parts we never meet in
this stack: epochs); a local label (`2.14.0+cu129`) is ignored, a pre-release or dev build
sorts before its release. No `packaging` dependency on the laptop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The stack the stages need; vllm only for the vllm hidden-state extraction backend.
REQUIRED = ("torch", "transformers", "speculators")
OPTIONAL = ("vllm",)


@dataclass(frozen=True)
class Constraint:
    """`package` at a version matching `when` needs `requires` to match `spec`."""

    package: str
    when: str  # specifier on the package's own version, e.g. "==0.9.*"
    requires: str  # the other package
    spec: str  # e.g. ">=2.9,<=2.14.1"
    source: str  # where this comes from


MATRIX: tuple[Constraint, ...] = (
    # speculators 0.9.0 METADATA Requires-Dist (read from the installed wheel)
    Constraint("speculators", "==0.9.0", "torch", ">=2.9.0,<=2.14.1", "speculators 0.9.0 Requires-Dist"),
    Constraint("speculators", "==0.9.0", "transformers", ">=5.0.0,<=5.19.0", "speculators 0.9.0 Requires-Dist"),
    # vllm 0.33.0 pins its torch build; its transformers range (container/constraints.txt notes)
    Constraint("vllm", "==0.33.0", "torch", "==2.14.0", "vllm 0.33.0 Requires-Dist"),
    Constraint("vllm", "==0.33.0", "transformers", ">=5.16.1,<5.21", "vllm 0.33.0 Requires-Dist"),
)


@dataclass(frozen=True)
class KnownBad:
    """A setting that breaks on some versions (checked by doctor's train-settings check)."""

    package: str
    spec: str
    setting: str  # human name of the setting combination
    problem: str
    fix: str


KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(
        "torch", "==2.11.*", "fused loss under torch.compile",
        "the fused Triton loss fails to compile under torch.compile on torch 2.11",
        'use the eager loss: pipeline.stages.train.loss_implementation = "eager"',
    ),
)


# ---------------------------------------------------------------------------------------------
# Versions and specifiers

_VERSION = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc|alpha|beta|c|pre|preview|dev)[-_.]?(\d*))?(?:\.?post\d*)?(?:\.?dev\d*)?(?:\+[A-Za-z0-9.]+)?\s*$", re.IGNORECASE)


def parse_version(text: str) -> tuple[tuple[int, ...], bool]:
    """'2.14.0+cu129' -> ((2, 14, 0), False); '2.15.0.dev20260101' -> ((2, 15, 0), True).
    The flag says pre-release/dev (sorts before the release). Raises ValueError."""
    m = _VERSION.match(text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    release = tuple(int(p) for p in m.group(1).split("."))
    pre = bool(m.group(2)) or ".dev" in text.lower() or re.search(r"\ddev", text.lower()) is not None
    return release, pre


def _key(release: tuple[int, ...], pre: bool, width: int) -> tuple:
    padded = release + (0,) * (width - len(release))
    return (*padded, 0 if pre else 1)


def matches(version: str, spec: str) -> bool:
    """Whether `version` satisfies a comma-separated specifier (==, !=, >=, <=, >, <, ~=,
    and == / != with a trailing .*). Raises ValueError on an unparseable spec or version."""
    release, pre = parse_version(version)
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        m = re.match(r"^(~=|==|!=|>=|<=|>|<)\s*(\S+)$", clause)
        if not m:
            raise ValueError(f"not a version specifier: {clause!r}")
        op, target = m.groups()
        if target.endswith(".*"):
            prefix = tuple(int(p) for p in target[:-2].split("."))
            same = release[: len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            if op not in ("==", "!="):
                raise ValueError(f"wildcard only with == or !=: {clause!r}")
            continue
        t_release, t_pre = parse_version(target)
        width = max(len(release), len(t_release))
        a, b = _key(release, pre, width), _key(t_release, t_pre, width)
        if op == "~=":
            upper = t_release[:-1]
            ok = a >= b and release[: len(upper)] == upper
        else:
            ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Violation:
    package: str
    version: str
    requires: str
    spec: str
    found: str | None  # None: not installed
    source: str

    def __str__(self) -> str:
        found = self.found or "not installed"
        return f"{self.package} {self.version} needs {self.requires}{self.spec}, found {found}"


def violations(installed: dict[str, str | None]) -> list[Violation]:
    """Every matrix row that applies to the installed versions and is not met."""
    out = []
    for row in MATRIX:
        own = installed.get(row.package)
        if not own or not matches(own, row.when):
            continue
        other = installed.get(row.requires)
        if other is None or not matches(other, row.spec):
            out.append(Violation(row.package, own, row.requires, row.spec, other, row.source))
    return out


def vetted(package: str) -> list[str]:
    """The versions of `package` the matrix has rows for (to warn about unvetted releases)."""
    return sorted({row.when.lstrip("=") for row in MATRIX if row.package == package})
