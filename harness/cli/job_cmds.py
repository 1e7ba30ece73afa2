"""`harness run | logs | status | runs | cancel` (the logic lives in harness.jobs and harness.multinode).

Every command takes the host first (`harness run HOST STAGE...`), like build, shell, exec and
sync. A run id is what `harness run` printed, or `last` for the newest run on that host. HOST may
name a `[groups.NAME]`: logs, status, runs and cancel then go through the same run interface
(harness.runs.RunPlace) that a host's Jobs implements: the context's place(HOST).runs.
"""

from __future__ import annotations

import sys

import click

from harness.cli.render import reattach_hint

RUN_ID_HELP = "a run id (as printed by `harness run`) or 'last'"
JSON_HELP = "Print the answer as JSON on stdout (keys: docs/json.md)."


def _stdout_sink(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


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
    runs = ctx.obj.place(host).runs
    started = runs.launch(list(stages), grace_s=grace, now=now)
    click.echo(started.line, err=True)
    click.echo(started.run_id)  # stdout: the id alone, for scripts
    if detach:
        click.echo(reattach_hint(host, started.run_id), err=True)
        ctx.exit(0)
    ctx.exit(_attach(runs, host, started.run_id, grace))


def _attach(runs, where: str, run_id: str, grace: float) -> int:
    """Stream logs and render progress events until the run ends; Ctrl-C only detaches."""
    from harness.cli.render import AttachRenderer, print_status

    try:
        with AttachRenderer() as view:
            status = runs.attach(run_id, view, grace_s=grace)
    except KeyboardInterrupt:
        click.echo(f"\ndetached from run {run_id}; it keeps running on {where}{runs.detach_note}.", err=True)
        click.echo(reattach_hint(where, run_id), err=True)
        return 130
    print_status(status)
    return status.exit_code()


@click.command("logs")
@click.argument("host")
@click.argument("run_id", metavar="RUN")
@click.argument("stage", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the run (or STAGE) ends.")
@click.pass_context
def logs(ctx: click.Context, host: str, run_id: str, stage: str | None, follow: bool) -> None:
    """Print the logs of RUN on HOST (all stages, or STAGE) from their first line.

    For a group, every node's log, each line prefixed [host]."""
    runs = ctx.obj.place(host).runs
    try:
        runs.stream_logs(run_id, _stdout_sink, stage=stage, follow=follow)
    except KeyboardInterrupt:
        if follow:  # the person stopped watching, not the run: say so
            click.echo(f"\ndetached from run {run_id}; it keeps running on {host}{runs.detach_note}.", err=True)
            click.echo(reattach_hint(host, run_id), err=True)
        ctx.exit(130)


@click.command("status")
@click.argument("host")
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def status(ctx: click.Context, host: str, run_id: str | None, as_json: bool) -> None:
    """The stages of RUN on HOST: state, start, duration, exit code, last event (for a group,
    every node's stages in one table, and the node where it went wrong first).

    Without RUN, the newest run. Exit code: 0 when the run is ok, running or queued.
    """
    from harness.cli.render import print_json, print_status

    view = ctx.obj.place(host).runs.status(run_id or "last")
    if as_json:
        print_json(view.to_json())
    else:
        print_status(view)
    ctx.exit(0 if view.state in ("ok", "running", "queued") else view.exit_code())


@click.command("runs")
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def runs(ctx: click.Context, host: str, as_json: bool) -> None:
    """List the runs on HOST (or on every host of a group: one column per host), oldest first."""
    from harness.cli.render import print_json, print_runs

    listing = ctx.obj.place(host).runs.listing()
    if as_json:
        print_json(listing.to_json())
    else:
        print_runs(listing)
    ctx.exit(listing.exit_code())


@click.command("cancel")
@click.argument("host")
@click.argument("run_id", metavar="RUN")
@click.option("--grace", type=float, default=None, help="Seconds between SIGTERM and SIGKILL (default: the run's own, 10).")
@click.pass_context
def cancel(ctx: click.Context, host: str, run_id: str, grace: float | None) -> None:
    """Cancel RUN on HOST (a group: on every node at once): SIGTERM, a grace period, then
    SIGKILL; recorded as `cancelled`."""
    from harness.cli.render import print_cancel

    outcome = ctx.obj.place(host).runs.cancel_run(run_id, grace)
    print_cancel(outcome)
    ctx.exit(outcome.exit_code())
