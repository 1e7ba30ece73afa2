"""`harness run | logs | status | runs | cancel` (the logic lives in harness.jobs).

Every command takes the host first (`harness run HOST STAGE...`), like build, shell, exec and
sync. A run id is what `harness run` printed, or `last` for the newest run on that host.
"""

from __future__ import annotations

import sys
import time

import click

from harness.cli.group_cmds import dispatch_if_group

RUN_ID_HELP = "a run id (as printed by `harness run`) or 'last'"


def _jobs(app, host: str):
    from harness.jobs import Jobs

    return Jobs(app.config, app.host(host), app.transport(host))


def _stdout_sink(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


def _reattach_hint(host: str, run_id: str) -> str:
    return f"re-attach: harness logs {host} {run_id} -f    status: harness status {host} {run_id}    stop: harness cancel {host} {run_id}"


@click.command("run")
@click.argument("host")
@click.argument("stages", nargs=-1, required=True)
@click.option("--detach", "-d", is_flag=True, help="Start the run and return at once.")
@click.option("--grace", type=float, default=10.0, show_default=True, help="Seconds between SIGTERM and SIGKILL when the run is cancelled.")
@click.pass_context
def run(ctx: click.Context, host: str, stages: tuple[str, ...], detach: bool, grace: float) -> None:
    """Start STAGES on HOST as one detached run (stage names, `all` or `demo`).

    The stages run one after another ON THE HOST: closing this terminal or the laptop does not
    stop them. Without --detach the logs stream here; Ctrl-C detaches and leaves the run going.
    """
    app = ctx.obj
    dispatch_if_group(ctx, host, "run_group", list(stages), detach, grace)  # a group: one run across its hosts (harness.multinode)
    code = 0
    try:
        jobs = _jobs(app, host)
        run_id = jobs.start(list(stages), grace_s=grace)
        click.echo(f"run {run_id} started on {host}", err=True)
        click.echo(run_id)  # stdout: the id alone, for scripts
        if detach:
            click.echo(_reattach_hint(host, run_id), err=True)
        else:
            code = _attach(jobs, host, run_id)
    finally:
        app.close()
    ctx.exit(code)


def _attach(jobs, host: str, run_id: str) -> int:
    """Stream logs and render progress events until the run ends; Ctrl-C only detaches."""
    from harness.cli.render import EventRenderer

    renderer = EventRenderer()
    try:
        with renderer:
            jobs.follow(run_id, renderer.feed, follow=True, as_json=True)
    except KeyboardInterrupt:
        click.echo(f"\ndetached from run {run_id}; it keeps running on {host}.", err=True)
        click.echo(_reattach_hint(host, run_id), err=True)
        return 130
    status = jobs.status(run_id)
    _print_run_table(status)
    return exit_code_of(status)


def exit_code_of(status) -> int:
    """0 when the run succeeded; the failed stage's exit code (1 if none fits) otherwise."""
    if status.state == "ok":
        return 0
    failed = status.failed_stage
    if failed is not None and failed.exit_code and 0 < failed.exit_code < 256:
        return failed.exit_code
    return 1


@click.command("logs")
@click.argument("host")
@click.argument("run_id", metavar="RUN")
@click.argument("stage", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the run (or STAGE) ends.")
@click.pass_context
def logs(ctx: click.Context, host: str, run_id: str, stage: str | None, follow: bool) -> None:
    """Print the logs of RUN on HOST (all stages, or STAGE) from their first line."""
    app = ctx.obj
    dispatch_if_group(ctx, host, "logs_group", run_id, stage, follow)  # a group: every node's log, lines prefixed [host]
    try:
        _jobs(app, host).follow(run_id, _stdout_sink, stage=stage, follow=follow)
    except KeyboardInterrupt:
        ctx.exit(130)
    finally:
        app.close()


@click.command("status")
@click.argument("host")
@click.argument("run_id", metavar="[RUN]", required=False)
@click.pass_context
def status(ctx: click.Context, host: str, run_id: str | None) -> None:
    """The stages of RUN on HOST: state, start, duration, exit code, last event.

    Without RUN, the newest run. Exit code: 0 when the run is ok or still running.
    """
    app = ctx.obj
    dispatch_if_group(ctx, host, "status_group", run_id)  # a group: every node's stages in one table
    try:
        st = _jobs(app, host).status(run_id or "last")
    finally:
        app.close()
    _print_run_table(st)
    ctx.exit(0 if st.state in ("ok", "running") else exit_code_of(st))


@click.command("runs")
@click.argument("host")
@click.pass_context
def runs(ctx: click.Context, host: str) -> None:
    """List the runs on HOST (or on every host of a group), oldest first."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    app = ctx.obj
    dispatch_if_group(ctx, host, "runs_group")  # a group: one row per run id, one column per host
    try:
        all_runs = _jobs(app, host).list_runs()
    finally:
        app.close()
    table = Table(title=f"runs on {escape(host)}")
    for col in ("run", "state", "stages", "started", "duration", "at stage"):
        table.add_column(col, no_wrap=col != "at stage")
    for r in all_runs:
        done = sum(1 for s in r.stages if s.state == "ok")
        current = next((s.stage for s in r.stages if s.state in ("running", "failed", "cancelled")), "")
        end = r.finished if r.finished else (time.time() if r.state == "running" else None)
        table.add_row(escape(r.run_id), _styled(r.state), f"{done}/{len(r.stages)}", _clock(r.started), _duration(r.started, end), escape(current))
    Console().print(table)


@click.command("cancel")
@click.argument("host")
@click.argument("run_id", metavar="RUN")
@click.option("--grace", type=float, default=None, help="Seconds between SIGTERM and SIGKILL (default: the run's own, 10).")
@click.pass_context
def cancel(ctx: click.Context, host: str, run_id: str, grace: float | None) -> None:
    """Cancel RUN on HOST: SIGTERM, a grace period, then SIGKILL; recorded as `cancelled`."""
    app = ctx.obj
    dispatch_if_group(ctx, host, "cancel_group", run_id, grace)  # a group: cancel on every node at once
    try:
        jobs = _jobs(app, host)
        state = jobs.cancel(run_id, grace)
        rid = jobs.resolve_run_id(run_id)
    finally:
        app.close()
    click.echo(f"run {rid}: {state}")


# ---------------------------------------------------------------------------------------------
# Rendering


def _print_run_table(st) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Everything below comes from the remote run record and events (stage messages, paths,
    # errors): escaped, so text in [brackets] shows as written instead of being read as markup.
    rec = st.record
    git = rec.get("git") or {}
    commit = (git.get("commit") or "?")[:10] + (" (dirty)" if git.get("dirty") else "")
    image = (rec.get("image") or {}).get("id") or "-"
    table = Table(
        title=escape(f"run {st.run_id} on {rec.get('host', '?')}: {st.state}"),
        caption=escape(f"runtime {rec.get('runtime')}  commit {commit}  image {image[:19]}"),
    )
    for col in ("stage", "state", "started", "duration", "exit", "last event"):
        table.add_column(col, no_wrap=col != "last event")
    for s in st.stages:
        table.add_row(
            escape(s.stage),
            _styled(s.state),
            _clock(s.started),
            _duration(s.started, s.finished if s.finished else (time.time() if s.state == "running" else None)),
            "" if s.exit_code is None else str(s.exit_code),
            escape(describe_event(s.last_event) + describe_tau(s.tau, s.last_event)),
        )
    Console(stderr=False).print(table)


def describe_event(ev: dict | None) -> str:
    if not ev:
        return ""
    kind = ev.get("event")
    if kind == "progress":
        return f"{ev.get('step')}/{ev.get('total')} {ev.get('unit', '')}".strip()
    if kind == "metric":
        metrics = ev.get("metrics") or {}
        return f"step {ev.get('step')}: " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
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


def _styled(state: str) -> str:
    color = {"ok": "green", "running": "cyan", "failed": "red", "cancelled": "yellow", "lost": "red", "skipped": "dim"}.get(state, "")
    if not color:
        from rich.markup import escape

        return escape(state)  # an unknown state read from the remote record: shown as written
    return f"[{color}]{state}[/{color}]"


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def _duration(start: float | None, end: float | None) -> str:
    if not start or not end:
        return ""
    s = int(end - start)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
