"""Scripts the harness ships to a host and runs there with the host's python3 (standard library
only). The laptop side never imports them: it reads their source and sends it."""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The file of one helper, e.g. path("supervisor.py")."""
    return DIR / name


def source(name: str) -> str:
    """The text of one helper, as it travels to the host."""
    return path(name).read_text(encoding="utf-8")
