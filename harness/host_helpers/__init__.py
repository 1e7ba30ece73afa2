"""Scripts the harness ships to a host and runs there with the host's python3 (standard library
only). The laptop side never imports them: it reads their source and sends it."""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent

# sh: the default `python3` (in $py) becomes /usr/bin/python3 where there is one: a `python3`
# found first on PATH may be a version manager's shim (pyenv's starts ~40 processes, 0.1-0.3 s,
# before Python does), and the helpers need only the standard library.
SYSTEM_PYTHON_SH = 'if [ "$py" = python3 ] && [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; fi'


def path(name: str) -> Path:
    """The file of one helper, e.g. path("supervisor.py")."""
    return DIR / name


def source(name: str) -> str:
    """The text of one helper, as it travels to the host."""
    return path(name).read_text(encoding="utf-8")
