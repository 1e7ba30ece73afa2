"""Render a run's JSON-lines stream (supervisor `follow --json`) in the terminal.

Log text goes to stdout unchanged; `progress` events drive one rich progress bar per stage
(on stderr, shown only on a terminal, so piped output stays plain); `metric` events update the
bar's description. The stream's line format: {"stage", "log"} | {"stage", "event"} | {"stage", "state"}.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO


class EventRenderer:
    def __init__(self, log_stream: TextIO | None = None) -> None:
        """log_stream: where stage log text goes (stdout by default; stderr when stdout must
        carry only a machine-readable result)."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,
        )
        self.log_stream = log_stream or sys.stdout
        self._tasks: dict[str, Any] = {}
        self._pending = b""
        self.final_states: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> "EventRenderer":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()  # an incomplete last line waits for the next chunk
        for line in lines:
            if line.strip():
                try:
                    self.handle(json.loads(line))
                except ValueError:
                    self.log_stream.write(line.decode("utf-8", "replace") + "\n")

    def handle(self, item: dict[str, Any]) -> None:
        stage = item.get("stage", "?")
        if "log" in item:
            self.log_stream.write(item["log"])
            self.log_stream.flush()
        elif "event" in item:
            self._on_event(stage, item["event"])
        elif "state" in item:
            self.final_states[stage] = item["state"]
            task = self._tasks.get(stage)
            if task is not None:
                self.progress.update(task, description=_plain(f"{stage} ({item['state'].get('state')})"))

    def _on_event(self, stage: str, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "progress" and ev.get("total"):
            task = self._tasks.get(stage)
            if task is None:
                task = self._tasks[stage] = self.progress.add_task(_plain(stage), total=ev["total"], unit=_plain(ev.get("unit", "")))
            self.progress.update(task, completed=ev.get("step", 0), total=ev["total"])
        elif kind == "metric" and stage in self._tasks:
            metrics = ev.get("metrics") or {}
            text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(metrics.items())[:3])
            self.progress.update(self._tasks[stage], description=_plain(f"{stage} {text}"))


def _plain(text: Any) -> str:
    """The bar's columns render rich markup, but stage names, units and metric names come from
    the remote side: escaped, so a "[" in them shows as written instead of vanishing or raising."""
    from rich.markup import escape

    return escape(str(text))
