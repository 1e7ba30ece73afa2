"""How everything looks in the terminal: a run's live stream, the status and runs tables of a host
and of a group (harness.runs' answers), cancel's lines, doctor's checks, sync's plan and summary,
the configured hosts; and `--json`, the same answers for scripts (stdout carries the JSON alone).

One rule for text from the remote side or the config (stage names, states, events, errors, paths,
host names): it reaches rich's markup only through `plain()`, so "[rank1]" or "torch[cuda]" shows
as written instead of vanishing or raising.

The live stream (supervisor `follow --json`): log text goes to stdout unchanged (on a terminal
that also shows the bars: printed above them through rich, line by line); `progress` events drive
one rich progress bar per stage (on stderr, shown only on a terminal, so piped output stays
plain); `metric` events update the bar's description. The stream's line format:
{"stage", "log"} | {"stage", "event"} | {"stage", "state"}.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any, TextIO

import click

from harness.units import human_bytes  # noqa: F401 - the CLI modules take it from here

# Every text column folds a long word (a path, a command, a fix) onto the next line instead of
# cutting it with "…": at 80 columns (a pipe, a small terminal) nothing is lost. Run ids, stages
# and times never wrap (a user copies them).
STATE_COLORS = {"ok": "green", "reused": "green", "queued": "magenta", "running": "cyan", "failed": "red", "cancelled": "yellow", "lost": "red", "skipped": "dim"}


class ScreenFilter:
    """What a person watching a run sees of its stages' logs (`harness run` on a terminal, the
    demo): the stages' own lines (messages, warnings, artifacts, the end; a metrics line that
    carries tau, others at most one per stage every METRIC_EVERY_S), harness's lines (a reused
    artifact, a wait), not the libraries' (speculators prints a block at every step). A failed
    stage's last lines are shown after all, so its traceback is on screen. The whole logs stay in
    the run's files (`harness logs`)."""

    SHOWN = re.compile(r"^\[[\w.-]+\] (message|warning|failed|finished|artifact): |^harness: |^[a-z_]+: (reused from run|waiting for) ")
    METRIC = re.compile(r"^\[[\w.-]+\] metric: ")
    METRIC_EVERY_S = 15.0
    TAIL = 30  # lines of a failed stage's log shown after all

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._partial: dict[str, str] = {}
        self._tails: dict[str, Any] = {}
        self._last_metric: dict[str, float] = {}
        self._showing: dict[str, bool] = {}  # the stage's last line was shown
        self.hidden = 0

    def feed(self, stage: str, text: str) -> list[str]:
        """The lines of `text` to show (whole lines: a line's end may come in the next chunk)."""
        from collections import deque

        *lines, self._partial[stage] = (self._partial.get(stage, "") + text).split("\n")
        tail = self._tails.setdefault(stage, deque(maxlen=self.TAIL))
        shown = []
        for raw in lines:
            line = raw.rstrip("\r").rsplit("\r", 1)[-1]  # what a terminal shows of a tqdm line
            continued = line[:1] in (" ", "\t") and self._showing.get(stage, False)  # a shown message's next lines
            if continued or self.SHOWN.match(line) or self.METRIC.match(line) and self._metric_due(stage, line):
                shown.append(line)
                self._showing[stage] = True
            elif line.strip():
                self.hidden += 1
                tail.append(line)
                self._showing[stage] = False
        return shown

    def _metric_due(self, stage: str, line: str) -> bool:
        now = self._clock()
        if " tau=" in line or now - self._last_metric.get(stage, float("-inf")) >= self.METRIC_EVERY_S:
            self._last_metric[stage] = now
            return True
        return False

    def ended(self, stage: str, state: str) -> list[str]:
        """A stage ended: after a failure, the last lines of its log not shown yet."""
        tail = list(self._tails.pop(stage, ()))
        if state != "failed" or not tail:
            return []
        return [f"[{stage}] the last {len(tail)} lines of its log:", *tail]


class EventRenderer:
    def __init__(self, log_stream: TextIO | None = None, screen: bool = False, whole_logs: str = "") -> None:
        """log_stream: where stage log text goes (stdout by default; stderr when stdout must
        carry only a machine-readable result). `screen`: what a person watches (ScreenFilter),
        with `whole_logs` (where the whole logs are) said at the end when lines were left out."""
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
        self.screen = ScreenFilter() if screen else None
        self.whole_logs = whole_logs
        self._tasks: dict[str, Any] = {}
        self._pending = b""
        self._log_pending = ""  # a log line not ended yet (shown with its end)
        self.final_states: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> "EventRenderer":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()
        if self._log_pending:
            self.log_stream.write(self._log_pending)
            self.log_stream.flush()
            self._log_pending = ""
        if self.screen is not None and self.screen.hidden and self.whole_logs:
            self.log_stream.write(f"({self.screen.hidden} library log lines not shown; the whole logs: {self.whole_logs})\n")
            self.log_stream.flush()

    def write_log(self, text: str) -> None:
        """Stage log text. Where it shares the screen with the live bars, it is printed above them
        through rich, whole lines only: written past rich, it would leave a copy of every bar
        in the scrollback."""
        if not (self.progress.live.is_started and self.log_stream.isatty()):
            self.log_stream.write(text)
            self.log_stream.flush()
            return
        *lines, self._log_pending = (self._log_pending + text).split("\n")
        for line in lines:  # a terminal shows what follows a line's last carriage return (tqdm's bars)
            self.console.print(line.rstrip("\r").rsplit("\r", 1)[-1], markup=False, highlight=False, soft_wrap=True, emoji=False)

    def _write_lines(self, lines: list[str]) -> None:
        if lines:
            self.write_log("".join(line + "\n" for line in lines))

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()  # an incomplete last line waits for the next chunk
        for line in lines:
            if line.strip():
                try:
                    self.handle(json.loads(line))
                except ValueError:
                    self.write_log(line.decode("utf-8", "replace") + "\n")

    def handle(self, item: dict[str, Any]) -> None:
        stage = str(item.get("stage", "?"))
        if "log" in item:
            if self.screen is None:
                self.write_log(str(item["log"]))
            else:
                self._write_lines(self.screen.feed(stage, str(item["log"])))
        elif "event" in item:
            self._on_event(stage, item["event"])
        elif "state" in item:
            self.final_states[stage] = item["state"]
            if self.screen is not None and isinstance(item["state"], dict):
                self._write_lines(self.screen.ended(stage, str(item["state"].get("state"))))
            task = self._tasks.get(stage)
            if task is not None:
                self.progress.update(task, description=plain(f"{stage} ({item['state'].get('state')})"))

    def _on_event(self, stage: str, raw: dict[str, Any]) -> None:
        from harness.events import Metric, Progress, format_metrics, parse

        ev = parse(raw)
        if isinstance(ev, Progress) and ev.total:
            task = self._tasks.get(stage)
            if task is None:
                task = self._tasks[stage] = self.progress.add_task(plain(stage), total=ev.total, unit=plain(ev.unit))
            self.progress.update(task, completed=ev.step, total=ev.total)
        elif isinstance(ev, Metric) and stage in self._tasks:
            text = format_metrics(ev.metrics, limit=3)
            self.progress.update(self._tasks[stage], description=plain(f"{stage} {text}"))


class AttachRenderer:
    """harness.runs.AttachView for `harness run` without --detach: a host's events drive an
    EventRenderer (made on the first chunk), a group's node lines go to stdout as `[host] line`,
    notes to stderr."""

    def __init__(self, whole_logs: str = "") -> None:
        """On a terminal, the stages' screen (ScreenFilter; `whole_logs`: the command that prints
        them whole); piped, every log line as it comes."""
        from harness.fanout import prefixed_writer

        self._events: EventRenderer | None = None
        self.node_line = prefixed_writer()
        self.whole_logs = whole_logs

    def __enter__(self) -> "AttachRenderer":
        return self

    def __exit__(self, *exc) -> None:
        if self._events is not None:
            self._events.__exit__(*exc)

    def events(self, chunk: bytes) -> None:
        if self._events is None:
            self._events = EventRenderer(screen=sys.stdout.isatty(), whole_logs=self.whole_logs).__enter__()
        self._events.feed(chunk)

    def note(self, text: str) -> None:
        click.echo(text, err=True)


def plain(text: Any) -> str:
    """Remote text for anything rich reads as markup (table cells, titles, progress columns)."""
    from rich.markup import escape

    return escape("" if text is None else str(text))


def styled_state(state: str) -> str:
    """A run or stage state, coloured; an unknown one (read from a remote record) as written."""
    color = STATE_COLORS.get(state)
    return f"[{color}]{state}[/{color}]" if color else plain(state)


def describe_event(ev: dict | None) -> str:
    """A stage's last event in one short line (harness.events reads it)."""
    from harness.events import describe

    return describe(ev) if ev else ""


def describe_tau(tau: dict | None, last_event: dict | None) -> str:
    """The draft's latest estimated tau, unless the last event already shows it."""
    from harness.events import Finished, Metric, acceptance_length, parse

    if not tau or acceptance_length(tau.get("tau")) is None:
        return ""
    shown = parse(last_event)
    if isinstance(shown, Metric) and "tau" in shown.metrics:
        return ""
    if isinstance(shown, Finished) and isinstance(shown.summary.get("tau"), (int, float)):  # evaluate's measured tau, shown by describe
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


def status_renderable(view):
    """What print_status prints, for a live display (`status --watch`)."""
    return group_table(view) if hasattr(view, "nodes") else run_table(view)


def print_run_table(st) -> None:
    """A host's run (jobs.RunStatus): one row per stage."""
    from rich.console import Console

    Console(stderr=False).print(run_table(st))


def run_table(st):
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
        table.add_column(col, overflow="fold", no_wrap=col != "last event")
    for s in st.stages:
        table.add_row(plain(s.stage), styled_state(s.shown_state), clock(s.started), duration(s.started, end_time(s)),
                      "" if s.exit_code is None else str(s.exit_code), plain(last_event_cell(s)))
    return table


def last_event_cell(s) -> str:
    """A stage's (jobs.StageStatus) "last event" cell: the event, a failure's error, the latest tau."""
    from harness.events import finished_failure

    failure = finished_failure(s.last_event)
    reused = f"from run {s.reused_from}: " if s.reused_from else ""
    return reused + describe_event(s.last_event) + (f" ({failure.error[:240]})" if failure and failure.error else "") + describe_tau(s.tau, s.last_event)


def print_group_table(status) -> None:
    """A group's run (multinode.GroupStatus): one row per stage of each node."""
    from rich.console import Console

    Console().print(group_table(status))


def group_table(status):
    from rich.table import Table

    table = Table(title=plain(f"run {status.run_id} on group {status.group}: {status.state}"),
                  caption=plain(f"first failure: {status.first_failure}") if status.first_failure else None)
    for col in ("node", "host", "stage", "state", "started", "duration", "exit", "last event"):
        table.add_column(col, overflow="fold")
    for node in status.nodes:
        if node.status is None:
            state = "[red]unreachable[/red]" if not node.missing else plain(node.state)
            table.add_row(str(node.rank), plain(node.host), "", state, "", "", "", plain(node.error))
            continue
        for s in node.status.stages:
            table.add_row(str(node.rank), plain(node.host), plain(s.stage), styled_state(s.shown_state), clock(s.started),
                          duration(s.started, end_time(s)), "" if s.exit_code is None else str(s.exit_code), plain(last_event_cell(s)))
    return table


def print_diff(result) -> None:
    """`harness diff` (harness.run_diff.RunDiff): the rows that differ, every artifact and tau."""
    from rich.console import Console
    from rich.table import Table

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4g}"
        return plain(value if isinstance(value, str) else json.dumps(value))

    table = Table(title=plain(f"{result.a} vs {result.b} on {result.host}"),
                  caption=f"{result.agreeing} other settings, flags and digests the same")
    for col in ("", "", result.a, result.b):
        table.add_column(plain(col), overflow="fold")
    for row in result.shown:
        mark = "" if row.same else "[bold]"
        table.add_row(row.section, plain(row.name), mark + cell(row.a), mark + cell(row.b))
    Console().print(table)


def print_cleanup(outcome) -> None:
    """`harness rm` / `harness gc` (harness.cleanup.Cleanup): what went (or would go) and what stayed."""
    verb = "would remove" if outcome.dry_run else "removed"
    for run_id in outcome.runs:
        click.echo(f"{verb} run {run_id}")
    for a in outcome.artifacts:
        what = "" if a.complete in (None, True) else ", incomplete"
        click.echo(f"{verb} {a.stage}/{a.key} ({human_bytes(a.bytes)}{what}): no run made, reused or read it")
    kept = [f"{outcome.kept} a run names"]
    if outcome.kept_for_live_runs:
        kept.append(f"{outcome.kept_for_live_runs} of stages a queued or running run may read")
    if outcome.kept_busy:
        kept.append(f"{outcome.kept_busy} being made")
    for c in outcome.containers:
        click.echo(f"{verb} container {c.name}: {c.why}")
    for t in outcome.images:
        click.echo(f"{verb} image {t.ref} ({human_bytes(t.bytes)}): harness built it and nothing uses it")
    click.echo(f"kept {', '.join(kept)}")
    click.echo(f"{'would free' if outcome.dry_run else 'freed'} {human_bytes(outcome.bytes + outcome.image_bytes)} on {outcome.host}")


def reattach_hint(where: str, run_id: str) -> str:
    return f"re-attach: harness logs {where} {run_id} -f    status: harness status {where} {run_id}    stop: harness cancel {where} {run_id}"


def print_status(view) -> None:
    """`harness status`: a host's run (jobs.RunStatus) or a group's (multinode.GroupStatus)."""
    if hasattr(view, "nodes"):
        print_group_table(view)
    else:
        print_run_table(view)


def print_runs(listing) -> None:
    """`harness runs` (harness.runs.RunListing): a host's runs, or a group's, one column per host."""
    from rich.console import Console
    from rich.table import Table

    if not listing.group:
        table = Table(title=f"runs on {plain(listing.where)}")
        for col in ("run", "state", "stages", "started", "duration", "at stage"):
            table.add_column(col, overflow="fold", no_wrap=col != "at stage")
        for r in listing.runs.get(listing.where, []):
            done = sum(1 for s in r.stages if s.state == "ok")
            table.add_row(plain(r.run_id), styled_state(r.state) + plain(r.queue_note), f"{done}/{len(r.stages)}", clock(r.started), duration(r.started, end_time(r)), plain(r.current_stage or ""))
        Console().print(table)
        return
    states = listing.states()
    table = Table(title=f"runs on group {plain(listing.where)}")
    table.add_column("run", no_wrap=True)
    for host in listing.hosts:
        table.add_column(plain(host) + (" (unreachable)" if host in listing.errors else ""), overflow="fold")
    for run_id in listing.run_ids():
        table.add_row(plain(run_id), *(styled_state(states[run_id][h]) if h in states[run_id] else ("?" if h in listing.errors else "-") for h in listing.hosts))
    Console().print(table)
    for host, error in listing.errors.items():
        click.echo(f"{host}: {error}", err=True)


def print_every_host(what: str, answers: dict) -> None:
    """`harness status` / `harness runs` without HOST: {host: (RunListing, error)}. status: each
    host's newest run in one table; runs: each host's table. An unreachable host: one line."""
    from rich.console import Console
    from rich.table import Table

    if what == "runs":
        for listing, error in answers.values():
            if error is None:
                print_runs(listing)
    else:
        table = Table(title="the newest run of every host")
        for col in ("host", "run", "state", "stages", "started", "at stage"):
            table.add_column(col, overflow="fold", no_wrap=col in ("host", "run"))
        for host, (listing, error) in answers.items():
            runs = listing.runs.get(host, []) if error is None else []
            if error is None and not runs:
                table.add_row(plain(host), "", "no runs yet", "", "", "")
            for r in runs[-1:]:
                done = sum(1 for s in r.stages if s.state == "ok")
                table.add_row(plain(host), plain(r.run_id), styled_state(r.state) + plain(r.queue_note), f"{done}/{len(r.stages)}", clock(r.started),
                              plain(r.current_stage or ""))
        Console().print(table)
    for host, (_, error) in answers.items():
        if error is not None:
            click.echo(f"{host}: unreachable: {error}", err=True)


def print_cancel(outcome) -> None:
    """`harness cancel` (harness.runs.CancelOutcome): the final state, per host for a group; with
    --dry-run, what a cancel would stop."""
    if outcome.dry_run:
        live = outcome.would_stop()
        for host, state in outcome.states.items():
            verdict = "would cancel it (SIGTERM, grace period, SIGKILL)" if host in live else "nothing to cancel"
            click.echo(f"run {outcome.run_id} on {host} is {state}: {verdict}")
        return
    for host, state in outcome.states.items():
        where = f"run {outcome.run_id} on {host}" if outcome.group else f"run {outcome.run_id}"
        click.echo(f"{where} had already ended: {state} (nothing to cancel)" if host in outcome.ended_before else f"{where}: {state}")


def print_checks(title: str, results) -> None:
    """doctor's checks (doctor.base.CheckResult): findings and fixes carry remote text."""
    from rich.console import Console
    from rich.table import Table

    style = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}
    table = Table(title=f"doctor {plain(title)}")
    for column in ("check", "status", "finding", "fix"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(plain(r.name), style[r.status], plain(r.message), plain(r.fix))
    Console().print(table)


def print_hosts(config) -> None:
    """`harness hosts`: the configured hosts and groups."""
    from rich.console import Console
    from rich.table import Table


    table = Table(title=f"hosts in {plain(config.path)}")
    for column in ("name", "reach", "runtime", "workdir", "env"):
        table.add_column(column, overflow="fold")
    for name, h in config.hosts.items():
        reach = "local" if h.is_local else f"ssh {h.ssh}"
        table.add_row(*(plain(cell) for cell in (name, reach, h.runtime_label(), h.workdir, ", ".join(h.env))))
    console = Console()
    console.print(table)
    if config.groups:
        groups = Table(title="groups")
        groups.add_column("name", overflow="fold")
        groups.add_column("hosts", overflow="fold")
        for name, g in config.groups.items():
            groups.add_row(plain(name), plain(", ".join(g.hosts)))
        console.print(groups)




QUIET_SYNC_BYTES = 4 << 20  # a sync smaller than these gets no bar (a blink)
QUIET_SYNC_FILES = 200


def transfer_bars():
    """The bars of a transfer (sync, pull): bytes, speed, time left, files."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[files]}"),
        console=Console(stderr=True),
        transient=False,
    )


class SyncBars:
    """sync's progress bars (a harness.host.SyncProgress): one per host, added when its plan is
    known. A host's sync that is a blink, or that no one watches, gets none (and no rich import);
    several hosts at once always do (their lines come only at the end)."""

    def __init__(self, always: bool):
        self.always = always
        self.bar = None
        self.tasks: list[tuple[object, int]] = []

    def __call__(self, host: str, plan):
        quiet = plan.upload_bytes < QUIET_SYNC_BYTES and len(plan.upload) < QUIET_SYNC_FILES
        if not self.always and (quiet or not click.get_text_stream("stderr").isatty()):
            return None
        if self.bar is None:
            self.bar = transfer_bars()
            self.bar.start()
        total, n, bar = max(1, plan.upload_bytes), len(plan.upload), self.bar  # a sum over the plan: once, not per file sent
        task = bar.add_task(f"sync {host}", total=total, files=f"0/{n} files")
        self.tasks.append((task, total))

        def on_progress(files: int, sent: int) -> None:
            # files may have grown since the plan: cap at its total
            bar.update(task, completed=min(sent, total), files=f"{files}/{n} files")

        return on_progress

    def close(self) -> None:
        if self.bar is not None:
            for task, total in self.tasks:
                self.bar.update(task, completed=total)
            self.bar.stop()


def print_sync_plan(host: str, result) -> None:
    """`harness sync --dry-run`: what would move (sync.SyncResult)."""
    from harness.sync import shown_path

    plan = result.plan
    for p in plan.upload:
        click.echo(f"send    {shown_path(p)}")
    for p in plan.delete:
        click.echo(f"delete  {shown_path(p)}")
    for p, why in plan.local.skipped:
        click.echo(f"skip    {shown_path(p)}: {shown_path(why)}", err=True)
    for p in plan.ignored_manifest_entries:
        click.echo(f"ignore  host manifest entry {p!r} (not a clean path in the synced tree)", err=True)
    click.echo(f"{host}: would send {len(plan.upload)} files ({human_bytes(plan.upload_bytes)}), delete {len(plan.delete)}; {len(plan.local.entries) - len(plan.upload)} unchanged", err=True)


def print_sync_summary(host: str, result) -> None:
    from harness.sync import shown_path

    plan = result.plan
    for p, why in plan.local.skipped:
        click.echo(f"skipped {shown_path(p)}: {shown_path(why)}", err=True)
    unchanged = len(plan.local.entries) - len(plan.upload)
    click.echo(
        f"{host}: sent {result.files_sent} files ({human_bytes(result.bytes_sent)}), deleted {result.deleted}, "
        f"{unchanged} unchanged; code digest {result.manifest_digest[:12]}",
        err=True,
    )


def print_sync_outcome(outcome, dry_run: bool) -> None:
    """`harness sync` on a host or a group (sync.SyncOutcome): each host's plan or summary, or
    why it failed."""
    for h in outcome.hosts:
        if h in outcome.errors:
            click.echo(f"{h}: sync failed: {outcome.errors[h]}", err=True)
        elif dry_run:
            print_sync_plan(h, outcome.results[h])
        else:
            print_sync_summary(h, outcome.results[h])


def print_build_outcome(outcome, dry_run: bool = False) -> None:
    """`harness build` (runtime.image.BuildOutcome): a host's image id alone on stdout (its
    verdict on stderr); a group's one line per host. A dry run: what would be built."""
    for h in outcome.hosts:
        if h in outcome.errors:
            click.echo(f"{h}: build failed: {outcome.errors[h]}", err=True)
            continue
        r = outcome.results[h]
        if dry_run:
            click.echo(f"{h}: would build {r.ref}" if r.would_build else f"{h}: {r.ref} is on the host ({r.image_id}): would not rebuild")
            continue
        verdict = "built" if r.built else "unchanged, not rebuilt"
        if outcome.group:
            click.echo(f"{h}: {verdict}: {r.ref} {r.image_id}")
        else:
            click.echo(f"{verdict}: {r.ref}", err=True)
            click.echo(r.image_id)


def print_diagnosis(diagnosis) -> None:
    """`harness doctor` (doctor.base.HostDiagnosis or harness.group_checks.GroupDiagnosis): one
    table per section, or why doctor could not run on that host."""
    for title, results, error in diagnosis.sections():
        if error is not None:
            click.echo(f"{title}: doctor failed: {error}", err=True)
        else:
            print_checks(title, results)


def print_json(data: Any) -> None:
    """`--json`: the answer alone on stdout (progress and warnings go to stderr)."""
    click.echo(json.dumps(data, indent=2, default=str))


def pull_report_json(host: str, target, destination: str, report, missing: list[str], dry_run: bool, notes: list[str] = ()) -> dict[str, Any]:
    """`harness pull --json`: what was fetched where (transfer.PullReport; names relative to
    `local`)."""
    return {
        "host": host, "remote": target.path, "local": destination, "run_id": target.run_id, "dry_run": dry_run, "ok": report.ok,
        "fetched": report.fetched, "identical": report.identical, "links": report.links, "planned": report.planned,
        "missing": list(missing), "notes": list(notes),
        "refused": [{"name": n, "why": w} for n, w in report.refused], "failed": [{"name": n, "why": w} for n, w in report.failed],
        "bytes_received": report.bytes_received, "bytes_resumed": report.bytes_resumed, "streams": report.streams, "seconds": round(report.seconds, 3),
    }


def sweep_table(view, width: int = 24):
    """`harness sweep` (harness.sweep.SweepView): a row per trial (its axes' values, GPU, run,
    state, tau on the selection split as a number and a bar from 1 to k + 1, tau per category),
    the winner marked; the winner's test-split tau in the caption."""
    from rich.table import Table

    axes = [key.partition(".")[2].replace("-", "_") for key in view.state.axes]
    table = Table(title=f"sweep {plain(view.state.sweep_id)} on {plain(view.state.host)}: tau on the {plain(view.state.split)} split (k = {view.k})")
    for col in ("trial", *axes, "gpu", "run", "state", "tau", "", "by category (or the error)"):
        table.add_column(plain(col), no_wrap=not col.startswith("by category"), justify="right" if col == "tau" else "left")
    winner = view.winner
    for t in view.trials:
        if t.tau is not None:
            tau, bar = f"{t.tau:.3f}", "█" * max(0, round(width * (t.tau - 1) / max(view.k, 1)))
        elif t.training_tau is not None:
            tau, bar = f"[dim]~{t.training_tau:.2f}[/dim]", ""  # train's estimate while it runs
        else:
            tau, bar = "", ""
        state = styled_state(t.state) + (f" ({plain(t.stage)})" if t.stage and t.state not in ("ok", "queued") else "")
        categories = " ".join(f"{plain(c)} {v['tau']:.2f}" for c, v in sorted(t.measured.by_category.items())) if t.measured else (f"[red]{plain(t.error[:160])}[/red]" if t.error else "")
        name = f"[bold]{plain(t.name)} *[/bold]" if winner is not None and t.name == winner.name else plain(t.name)
        table.add_row(name, *(plain(json.dumps(t.flags.get(a))) for a in axes), "" if t.gpu is None else str(t.gpu), plain(t.run_id or ""), state, tau,
                      f"[green]{bar}[/green]" if winner is not None and t.name == winner.name else bar, categories)
    if winner is not None:
        test = view.test
        if test is not None and test.tau is not None:
            cats = ", ".join(f"{c} {v['tau']:.2f}" for c, v in sorted(test.measured.by_category.items()))
            table.caption = plain(f"* winner {winner.name}: tau {winner.tau:.3f} on {view.state.split}; {test.tau:.3f} on the test split" + (f" ({cats})" if cats else ""))
        else:
            table.caption = plain(f"* winner {winner.name}: tau {winner.tau:.3f} on {view.state.split}; test split: " + (test.state if test else "not measured yet"))
    return table


def print_sweep(view) -> None:
    """The sweep's table, then the winner as the harness.toml lines to train with."""
    from rich.console import Console

    Console().print(sweep_table(view))
    lines = view.winner_lines()
    if lines:
        click.echo(f"\nthe winner, for harness.toml (replaces [pipeline.stages.train]):\n\n{lines}")
    elif view.done:
        click.echo("no trial ended with a measured tau: see `harness logs HOST RUN` of the failed ones", err=True)


def print_sweep_cancel(sweep_id: str, outcome: dict[str, str]) -> None:
    """`harness cancel HOST SWEEP`: each trial's final state."""
    for trial, state in outcome.items():
        click.echo(f"sweep {sweep_id} {trial}: {state}")
