"""A stage's events (events.jsonl, held to docs/events.json) read from their tail: the last event,
the latest tau estimate. A companion of supervisor.py (harness/host_helpers/__init__.py,
COMPANIONS); standard library only.
"""

from __future__ import annotations

import json
import os


TAU_WINDOW = 1 << 20  # a long run's per-step metrics between two tau estimates fit in 1 MiB


def latest_tau(path: str) -> dict | None:
    """{"step", "tau"} of the newest metric event carrying a tau (docs/events.json), or None."""
    ev = latest_tau_event(path)
    return {"step": ev.get("step"), "tau": ev["metrics"]["tau"]} if ev is not None else None


def latest_tau_event(path: str) -> dict | None:
    return last_event(path, TAU_WINDOW, lambda ev: ev.get("event") == "metric" and "tau" in (ev.get("metrics") or {}))


def last_event(path: str, window: int = 65536, match=None) -> dict | None:
    """The last complete event line of an events.jsonl (reads only its tail), or the last that
    `match(event)` accepts."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - window))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if match is None or (isinstance(ev, dict) and match(ev)):
            return ev
    return None
