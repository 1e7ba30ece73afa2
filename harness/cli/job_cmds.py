"""`harness run | logs | status | runs | cancel` (the logic lives in harness.jobs).

Every command takes the host first (`harness run HOST STAGE...`), like build, shell, exec and
sync. A run id is what `harness run` printed, or `last` for the newest run on that host.
"""

from __future__ import annotations

import sys

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
@click.option("--now", is_flag=True, help="Start at once, even while other runs hold the same GPUs (no queue).")
@click.pass_context
def run(ctx: click.Context, host: str, stages: tuple[str, ...], detach: bool, grace: float, now: bool) -> None:
    """Start STAGES on HOST as one detached run (stage names, `all` or `demo`).

    The stages run one after another ON THE HOST: closing this terminal or the laptop does not
    stop them. Without --detach the logs stream here; Ctrl-C detaches and leaves the run going.
    While an earlier run on the same GPUs is queued or running, the run is `queued` and starts
    by itself when they are done (--now: start at once).
    """
    app = ctx.obj
    dispatch_if_group(ctx, host, "run_group", list(stages), detach, grace)  # a group: one run across its hosts (harness.multinode)
    code = 0
    try:
        jobs = _jobs(app, host)
        run_id = jobs.start(list(stages), grace_s=grace, now=now)
        started = jobs.status(run_id)
        if started.state == "queued":
            click.echo(f"run {run_id} queued on {host}{started.queue_note}: it starts by itself when the runs ahead are done", err=True)
        else:
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
    from harness.cli.render import EventRenderer, print_run_table

    renderer = EventRenderer()
    try:
        with renderer:
            jobs.follow(run_id, renderer.feed, follow=True, as_json=True)
    except KeyboardInterrupt:
        click.echo(f"\ndetached from run {run_id}; it keeps running on {host}.", err=True)
        click.echo(_reattach_hint(host, run_id), err=True)
        return 130
    status = jobs.status(run_id)
    print_run_table(status)
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

    Without RUN, the newest run. Exit code: 0 when the run is ok, running or queued.
    """
    app = ctx.obj
    dispatch_if_group(ctx, host, "status_group", run_id)  # a group: every node's stages in one table
    try:
        st = _jobs(app, host).status(run_id or "last")
    finally:
        app.close()
    from harness.cli.render import print_run_table

    print_run_table(st)
    ctx.exit(0 if st.state in ("ok", "running", "queued") else exit_code_of(st))


@click.command("runs")
@click.argument("host")
@click.pass_context
def runs(ctx: click.Context, host: str) -> None:
    """List the runs on HOST (or on every host of a group), oldest first."""
    from rich.console import Console
    from rich.table import Table

    from harness.cli.render import clock, duration, end_time, plain, styled_state

    app = ctx.obj
    dispatch_if_group(ctx, host, "runs_group")  # a group: one row per run id, one column per host
    try:
        all_runs = _jobs(app, host).list_runs()
    finally:
        app.close()
    table = Table(title=f"runs on {plain(host)}")
    for col in ("run", "state", "stages", "started", "duration", "at stage"):
        table.add_column(col, no_wrap=col != "at stage")
    for r in all_runs:
        done = sum(1 for s in r.stages if s.state == "ok")
        current = next((s.stage for s in r.stages if s.state in ("running", "failed", "cancelled")), "")
        table.add_row(plain(r.run_id), styled_state(r.state) + plain(r.queue_note), f"{done}/{len(r.stages)}", clock(r.started), duration(r.started, end_time(r)), plain(current))
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
