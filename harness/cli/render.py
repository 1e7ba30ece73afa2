"""How runs look in the terminal: a run's live stream, and the status tables of a host's run and
a group's run.

One rule for text from the remote side (stage names, states, events, errors, paths): it reaches
rich's markup only through `plain()`, so "[rank1]" or "torch[cuda]" shows as written instead of
vanishing or raising.

The live stream (supervisor `follow --json`): log text goes to stdout unchanged; `progress`
events drive one rich progress bar per stage (on stderr, shown only on a terminal, so piped
output stays plain); `metric` events update the bar's description. The stream's line format:
{"stage", "log"} | {"stage", "event"} | {"stage", "state"}.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

STATE_COLORS = {"ok": "green", "queued": "magenta", "running": "cyan", "failed": "red", "cancelled": "yellow", "lost": "red", "skipped": "dim"}


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
                self.progress.update(task, description=plain(f"{stage} ({item['state'].get('state')})"))

    def _on_event(self, stage: str, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "progress" and ev.get("total"):
            task = self._tasks.get(stage)
            if task is None:
                task = self._tasks[stage] = self.progress.add_task(plain(stage), total=ev["total"], unit=plain(ev.get("unit", "")))
            self.progress.update(task, completed=ev.get("step", 0), total=ev["total"])
        elif kind == "metric" and stage in self._tasks:
            text = format_metrics(ev.get("metrics") or {}, limit=3)
            self.progress.update(self._tasks[stage], description=plain(f"{stage} {text}"))


def plain(text: Any) -> str:
    """Remote text for anything rich reads as markup (table cells, titles, progress columns)."""
    from rich.markup import escape

    return escape("" if text is None else str(text))


def styled_state(state: str) -> str:
    """A run or stage state, coloured; an unknown one (read from a remote record) as written."""
    color = STATE_COLORS.get(state)
    return f"[{color}]{state}[/{color}]" if color else plain(state)


def format_metrics(metrics: dict[str, Any], limit: int | None = None) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(metrics.items())[:limit])


def describe_event(ev: dict | None) -> str:
    if not ev:
        return ""
    kind = ev.get("event")
    if kind == "progress":
        return f"{ev.get('step')}/{ev.get('total')} {ev.get('unit', '')}".strip()
    if kind == "metric":
        return f"step {ev.get('step')}: " + format_metrics(ev.get("metrics") or {})
    if kind == "artifact":
        return f"{ev.get('kind', 'artifact')}: {ev.get('path')}"
    if kind == "message":
        return str(ev.get("text", ""))[:80]
    if kind == "warning":
        return "warning: " + str(ev.get("text", ""))[:120]
    if kind == "finished":
        return f"finished: {ev.get('status')}"
    return str(kind)


def describe_tau(tau: dict | None, last_event: dict | None) -> str:
    """The draft's latest estimated tau, unless the last event already shows it."""
    if not tau or not isinstance(tau.get("tau"), (int, float)):
        return ""
    if last_event and "tau" in (last_event.get("metrics") or {}):
        return ""
    return f"  (tau {tau['tau']:.2f} at step {tau.get('step')})"


def clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def duration(start: float | None, end: float | None) -> str:
    if not start or not end:
        return ""
    s = int(end - start)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def end_time(item) -> float | None:
    """When a run or stage ended; now while it runs (for its duration so far)."""
    return item.finished if item.finished else (time.time() if item.state == "running" else None)


# ---------------------------------------------------------------------------------------------
# Status tables


def print_run_table(st) -> None:
    """A host's run (jobs.RunStatus): one row per stage."""
    from rich.console import Console
    from rich.table import Table

    rec = st.record
    git = rec.get("git") or {}
    commit = (git.get("commit") or "?")[:10] + (" (dirty)" if git.get("dirty") else "")
    image = (rec.get("image") or {}).get("id") or "-"
    table = Table(
        title=plain(f"run {st.run_id} on {rec.get('host', '?')}: {st.state}{st.queue_note}"),
        caption=plain(f"runtime {rec.get('runtime')}  commit {commit}  image {image[:19]}"),
    )
    for col in ("stage", "state", "started", "duration", "exit", "last event"):
        table.add_column(col, no_wrap=col != "last event")
    for s in st.stages:
        table.add_row(plain(s.stage), styled_state(s.state), clock(s.started), duration(s.started, end_time(s)),
                      "" if s.exit_code is None else str(s.exit_code), plain(describe_event(s.last_event) + describe_tau(s.tau, s.last_event)))
    Console(stderr=False).print(table)


def print_group_table(status) -> None:
    """A group's run (multinode.GroupStatus): one row per stage of each node."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=plain(f"run {status.run_id} on group {status.group}: {status.state}"),
                  caption=plain(f"first failure: {status.first_failure}") if status.first_failure else None)
    for col in ("node", "host", "stage", "state", "started", "duration", "exit", "last event"):
        table.add_column(col)
    for node in status.nodes:
        if node.status is None:
            state = "[red]unreachable[/red]" if not node.missing else plain(node.state)
            table.add_row(str(node.rank), plain(node.host), "", state, "", "", "", plain(node.error))
            continue
        for s in node.status.stages:
            ev = s.last_event or {}
            last = describe_event(ev) + (f" ({ev['error'][:80]})" if ev.get("event") == "finished" and ev.get("error") else "") + describe_tau(s.tau, ev)
            table.add_row(str(node.rank), plain(node.host), plain(s.stage), styled_state(s.state), clock(s.started),
                          duration(s.started, end_time(s)), "" if s.exit_code is None else str(s.exit_code), plain(last))
    Console().print(table)
