"""`harness run | logs | status | runs | cancel` (the logic lives in harness.jobs and harness.multinode).

Every command takes the host first (`harness run HOST STAGE...`), like build, shell, exec and
sync. RUN is what `harness run` printed, or `last`; left out, it is the newest run on that host.
HOST may name a `[groups.NAME]`: logs, status, runs and cancel then go through the same run
interface (harness.runs.RunInterface) that a host's Jobs implements: the context's place(HOST).jobs.
"""

from __future__ import annotations

import sys

import click

from harness.cli.params import complete_runs, complete_stages, host_argument, remember_runs, run_argument
from harness.cli.render import reattach_hint

JSON_HELP = "Print the answer as JSON on stdout (keys: docs/json.md)."


def _stdout_sink(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


def _run_help() -> str:
    from harness.stages import stages_help

    return "Stages (and chains):\n\n\b\n" + stages_help()


@click.command("run", epilog=_run_help())
@host_argument()
@click.argument("stages", nargs=-1, shell_complete=complete_stages)
@click.option("--detach", "-d", is_flag=True, help="Start the run and return at once.")
@click.option("--grace", type=float, default=10.0, show_default=True, help="Seconds between SIGTERM and SIGKILL when the run is cancelled.")
@click.option("--now", is_flag=True, help="Start at once, even while other runs hold the same GPUs (no queue).")
@click.option("--set", "settings", multiple=True, metavar="STAGE.FLAG=VALUE",
              help="A stage flag for this run only, over [pipeline.stages.STAGE] (repeatable; VALUE as TOML reads it: 3e-4, [1, 3, 6]); recorded in run.json.")
@click.option("--fresh", multiple=True, is_flag=False, flag_value="all", metavar="[STAGE]",
              help="Make STAGE's artifact anew even if the box has one from the same inputs (repeatable; alone: every stage of the run).")
@click.option("--dry-run", "-n", is_flag=True, help="Show what would be synced, the preflight's verdict and each stage's command line; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the same as JSON on stdout.")
@click.pass_context
def run(ctx: click.Context, host: str, stages: tuple[str, ...], detach: bool, grace: float, now: bool, settings: tuple[str, ...],
        fresh: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Start STAGES on HOST as one detached run (stage names, `all` or `demo`).

    What changed in the sync paths is synced first (as `harness sync`; nothing changed: about
    two round trips on the connection the start uses), so the box runs the code you have. Without STAGES: one line naming them.
    The stages run one after another ON THE HOST: closing this terminal or the laptop does not
    stop them. Without --detach the logs stream here; Ctrl-C detaches and leaves the run going.
    While an earlier run on the same GPUs is queued or running, the run is `queued` and starts
    by itself when they are done (--now: start at once). Each stage's output is kept on the box
    under a key of everything that made it: a stage whose inputs, flags, code and environment
    are all unchanged is reused, and says so (--fresh STAGE: made anew). Exit code: 0 when the
    run ends ok, 1 when it failed or was cancelled (the stage's own code: `harness status`).
    """
    from harness.run_start import dry_run as plan_run, start_run

    if as_json and not dry_run:
        from harness.errors import UsageError

        raise UsageError("--json goes with --dry-run (a started run's JSON: `harness status HOST RUN --json`)")
    ctx.obj.override(list(settings))
    place = ctx.obj.place(host)
    if dry_run:
        from harness.cli.render import print_json

        result = plan_run(place, list(stages), fresh=list(fresh))
        if as_json:
            print_json(result.to_json())
        else:
            for line in result.lines():
                click.echo(line)
        ctx.exit(result.exit_code())
    from harness.cli.render import SyncBars

    bars = SyncBars(always=False)  # what the sync sends before the run, shown as `harness sync` shows it
    try:
        synced, started = start_run(place, list(stages), grace_s=grace, now=now, fresh=list(fresh), progress=None if ctx.obj.quiet else bars)
    finally:
        bars.close()
    for h, result in synced.results.items():
        if (result.files_sent or result.deleted) and not ctx.obj.quiet:
            click.echo(f"synced to {h}: {result.files_sent} file(s), {result.bytes_sent} bytes, {result.deleted} deleted", err=True)
    remember_runs(ctx.obj, host, [started.run_id])
    jobs = place.jobs
    click.echo(started.line, err=True)
    click.echo(started.run_id)  # stdout: the id alone, for scripts
    if detach:
        if not ctx.obj.quiet:
            click.echo(reattach_hint(host, started.run_id), err=True)
        ctx.exit(0)
    ctx.exit(_attach(jobs, host, started.run_id, grace))


def _attach(jobs, where: str, run_id: str, grace: float) -> int:
    """Stream logs and render progress events until the run ends; Ctrl-C only detaches."""
    from harness.cli.render import AttachRenderer, print_status
    from harness.errors import EXIT_INTERRUPTED

    try:
        with AttachRenderer(whole_logs=f"harness logs {where} {run_id}") as view:
            status = jobs.attach(run_id, view, grace_s=grace)
    except KeyboardInterrupt:
        click.echo(f"\ndetached from run {run_id}; it keeps running on {where}{jobs.detach_note}.", err=True)
        click.echo(reattach_hint(where, run_id), err=True)
        return EXIT_INTERRUPTED
    print_status(status)
    return status.exit_code()


def _run_and_stage(run_id: str | None, stage: str | None) -> tuple[str, str | None]:
    """`logs HOST train`: a stage name where RUN goes means the newest run's stage; a near miss of
    one (`trian`) is said as one."""
    from harness.errors import UsageError, did_you_mean
    from harness.pipeline import STAGES
    from harness.runs import names_a_run

    if stage is None and run_id in STAGES:
        return "last", run_id
    if stage is None and run_id and not names_a_run(run_id) and did_you_mean(run_id, list(STAGES)):
        raise UsageError(f"no stage or run {run_id!r}", did_you_mean(run_id, list(STAGES)))
    return run_id or "last", stage


@click.command("logs")
@host_argument()
@click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete_runs)
@click.argument("stage", required=False, shell_complete=complete_stages)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the run (or STAGE) ends.")
@click.option("--tail", type=click.IntRange(min=1), default=None, metavar="N", help="Start at the last N lines (of the stages' logs, in order).")
@click.option("--failed", is_flag=True, help="Only the failed stage: the last lines of its log (--tail, default 40), then its error line.")
@click.option("--json", "as_json", is_flag=True,
              help='JSON lines on stdout: {"stage", "log": text} | {"stage", "event": {...}} (docs/events.json) | {"stage", "state": {...}}; a group\'s with "host".')
@click.pass_context
def logs(ctx: click.Context, host: str, run_id: str | None, stage: str | None, follow: bool, tail: int | None, failed: bool, as_json: bool) -> None:
    """Print the logs of RUN on HOST (all stages, or STAGE) from their first line.

    RUN: a run id (as `harness run` printed it), a unique start or end of one, 'last' or 'last~N';
    without it, the newest run; `harness logs HOST STAGE` is the newest run's STAGE. For a group,
    every node's log, each line prefixed [host]."""
    from harness.errors import EXIT_INTERRUPTED

    run_id, stage = _run_and_stage(run_id, stage)
    jobs = ctx.obj.place(host).jobs
    if failed:
        ctx.exit(_failed_stage(jobs, host, run_id, tail or FAILED_TAIL))
    try:
        jobs.stream_logs(run_id, _stdout_sink, stage=stage, follow=follow, as_json=as_json, tail=tail)
    except KeyboardInterrupt:
        if follow:  # the person stopped watching, not the run: say so
            click.echo(f"\ndetached from run {run_id}; it keeps running on {host}{jobs.detach_note}.", err=True)
            click.echo(reattach_hint(host, run_id), err=True)
        ctx.exit(EXIT_INTERRUPTED)
    if follow and (status := jobs.status(run_id)).state == "lost":  # the follow ended, and nobody will finish the run
        from harness.errors import HarnessError

        raise HarnessError(f"run {status.run_id} on {host} is lost: its supervisor ended without recording an outcome "
                           f"(the box rebooted or the process was killed), and its stage may still be running: "
                           f"harness cancel {host} {status.run_id} stops what is provably the run's, then run it again")


FAILED_TAIL = 40  # lines of `logs --failed`


def _failed_stage(jobs, host: str, run_id: str, tail: int) -> int:
    """`logs --failed`: the failed stage's last lines and its error line (a host's run)."""
    from harness.errors import UsageError
    from harness.events import finished_failure

    view = jobs.status(run_id)
    if hasattr(view, "nodes"):
        raise UsageError(f"--failed takes one host's run; {host} is a group", f"harness status {host} {view.run_id} names the node that failed")
    failed = view.failed_stage
    if failed is None:
        click.echo(f"run {view.run_id} on {host} is {view.state}: no stage failed", err=True)
        return 0
    jobs.stream_logs(view.run_id, _stdout_sink, stage=failed.stage, tail=tail)
    failure = finished_failure(failed.last_event)
    click.echo(f"run {view.run_id}: {failed.stage} failed (exit {failed.exit_code})" + (f": {failure.error}" if failure and failure.error else ""), err=True)
    return 1


@click.command("status")
@host_argument(required=False)
@run_argument()
@click.option("--watch", "-w", is_flag=True, help="Show it again every few seconds until the run ends (Ctrl-C stops watching).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def status(ctx: click.Context, host: str | None, run_id: str | None, watch: bool, as_json: bool) -> None:
    """The stages of RUN on HOST: state, start, duration, exit code, last event (for a group,
    every node's stages in one table, and the node where it went wrong first). Without HOST: the
    newest run of every configured host, asked in parallel (an unreachable host is one line).

    RUN: a run id (as `harness run` printed it), a unique start or end of one, 'last' or 'last~N';
    without it, the newest run. Exit code: 0 when the run is ok, running or queued; 1 when it
    failed, was cancelled or lost.
    """
    from harness.cli.render import print_json, print_status
    from harness.errors import EXIT_OK

    if host is None:
        ctx.exit(_every_host(ctx, "status", as_json))
    jobs = ctx.obj.place(host).jobs
    view = jobs.status(run_id or "last")
    remember_runs(ctx.obj, host, [view.run_id])
    if watch and not as_json:
        view = _watch(jobs, view)
    elif as_json:
        print_json(view.to_json())
    else:
        print_status(view)
    ctx.exit(EXIT_OK if view.state in ("ok", "running", "queued") else view.exit_code())


WATCH_S = 3.0  # between two looks of `status --watch`


def _watch(jobs, view):
    """`status --watch`: the table, redrawn in place until the run ends; Ctrl-C stops watching."""
    import time

    from rich.console import Console
    from rich.live import Live

    from harness.cli.render import status_renderable
    from harness.runs import LIVE_STATES

    with Live(status_renderable(view), console=Console(), auto_refresh=False) as live:
        try:
            while view.state in LIVE_STATES:
                time.sleep(WATCH_S)
                view = jobs.status(view.run_id)
                live.update(status_renderable(view), refresh=True)
        except KeyboardInterrupt:
            pass
    return view


def _every_host(ctx: click.Context, what: str, as_json: bool) -> int:
    """`harness status` / `harness runs` without HOST: every configured host, asked in parallel,
    each within its connect and answer bounds (an unreachable one is one line)."""
    from harness.cli.render import print_every_host, print_json
    from harness.fanout import parallel

    config = ctx.obj.config
    names = list(config.hosts)
    bound = max((h.connect_timeout for h in config.hosts.values()), default=10.0) + EVERY_HOST_ANSWER_S

    def ask(name: str):
        listing = ctx.obj.host(name).jobs.listing()
        remember_runs(ctx.obj, name, listing.run_ids(), replace=True)
        return listing

    answers = {name: (result, error) for name, result, error in parallel(names, ask, timeout=bound)}
    if as_json:
        print_json({"hosts": {n: (r.to_json() if e is None else {"host": n, "error": str(e)}) for n, (r, e) in answers.items()}})
    else:
        print_every_host(what, answers)
    return 1 if any(e is not None for _, e in answers.values()) else 0


EVERY_HOST_ANSWER_S = 30.0  # past its connect timeout, what a host may take to list its runs


@click.command("runs")
@host_argument(required=False)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def runs(ctx: click.Context, host: str | None, as_json: bool) -> None:
    """List the runs on HOST (or on every host of a group: one column per host), oldest first.
    Without HOST: every configured host's, asked in parallel (an unreachable host is one line)."""
    from harness.cli.render import print_json, print_runs

    if host is None:
        ctx.exit(_every_host(ctx, "runs", as_json))
    listing = ctx.obj.place(host).jobs.listing()
    remember_runs(ctx.obj, host, listing.run_ids(), replace=True)
    if as_json:
        print_json(listing.to_json())
    else:
        print_runs(listing)
    ctx.exit(listing.exit_code())


@click.command("cancel")
@host_argument()
@run_argument()
@click.option("--grace", type=float, default=None, help="Seconds between SIGTERM and SIGKILL (default: the run's own, 10).")
@click.option("--dry-run", "-n", is_flag=True, help="Say which run would be cancelled and its state now; stop nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON on stdout: host (or group), run_id, dry_run, ok, states {host: state after the cancel, or now with --dry-run, or \"error: ...\"}, ended_before [hosts where it had ended], would_stop [hosts] (--dry-run).")
@click.pass_context
def cancel(ctx: click.Context, host: str, run_id: str | None, grace: float | None, dry_run: bool, as_json: bool) -> None:
    """Cancel RUN on HOST (a group: on every node at once): SIGTERM, a grace period, then
    SIGKILL; recorded as `cancelled`.

    RUN: a run id (as `harness run` printed it) or 'last'; without it, the newest run (--dry-run says which one that is).
    A sweep id (as `harness sweep` printed it): every trial of the sweep not ended yet."""
    from harness.cli.render import print_cancel, print_json
    from harness.runs import cancel_preview
    from harness.sweep import is_sweep_id

    if run_id and is_sweep_id(run_id):
        ctx.exit(_cancel_sweep(ctx, host, run_id, grace, dry_run, as_json))
    jobs = ctx.obj.place(host).jobs
    outcome = cancel_preview(jobs, run_id or "last") if dry_run else jobs.cancel_run(run_id or "last", grace)
    if as_json:
        print_json(outcome.to_json())
    else:
        print_cancel(outcome)
    ctx.exit(outcome.exit_code())


def _cancel_sweep(ctx: click.Context, host: str, sweep_id: str, grace: float | None, dry_run: bool, as_json: bool) -> int:
    """`harness cancel HOST SWEEP` (harness.sweep): each trial's state after the cancel (now, with --dry-run)."""
    from harness.cli.render import print_json, print_sweep_cancel
    from harness.sweep import Sweep

    h = ctx.obj.host(host)
    states = Sweep(h).cancel(sweep_id, grace, dry_run=dry_run)
    if as_json:
        print_json({"host": host, "sweep_id": sweep_id, "dry_run": dry_run, "states": states})
    else:
        print_sweep_cancel(sweep_id, states)
    return 0


@click.command("diff")
@host_argument()
@click.argument("run_a", metavar="RUN_A", shell_complete=complete_runs)
@click.argument("run_b", metavar="RUN_B", shell_complete=complete_runs)
@click.option("--json", "as_json", is_flag=True, help="Every row as JSON on stdout: {section, name, a, b, same} (docs/json.md).")
@click.pass_context
def diff(ctx: click.Context, host: str, run_a: str, run_b: str, as_json: bool) -> None:
    """Two runs of HOST side by side: what differs in their settings, the artifacts of each stage
    (the same key: the same artifact, made once), their flags, code, inputs and environment
    (digests), library versions, and tau overall and per category.

    RUN_A, RUN_B: run ids (as `harness run` printed them) or 'last'."""
    from harness.cli.render import print_diff, print_json
    from harness.run_diff import diff as diff_runs

    h = ctx.obj.host(host)
    result = diff_runs(h.jobs, run_a, run_b)
    remember_runs(ctx.obj, host, [result.a, result.b])
    if as_json:
        print_json(result.to_json())
    else:
        print_diff(result)
