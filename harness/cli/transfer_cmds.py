"""`harness sync` and `harness pull` (the logic lives in harness.sync and harness.pull)."""

from __future__ import annotations


import click

from harness.cli.params import host_argument, run_or_path_argument
from harness.cli.render import SyncBars, human_bytes, print_json, print_sync_outcome, transfer_bars
from harness.sync import shown_path


# Below these a sync takes a blink: no progress bar (and no rich import) for it.


class _BarInBackground:
    """transfer_bars() built in a thread started now: rich's import (~0.1 s) overlaps the pull's
    connection set-up instead of preceding it. Shown from the first get()."""

    def __init__(self):
        import threading

        self._bar = None
        self._shown = False
        self._thread = threading.Thread(target=self._build, daemon=True)
        self._thread.start()

    def _build(self) -> None:
        self._bar = transfer_bars()

    def get(self):
        self._thread.join()
        if self._bar is None:
            self._bar = transfer_bars()  # the thread failed: build it here, where an error is seen
        if not self._shown:
            self._bar.start()
            self._shown = True
        return self._bar

    def close(self) -> None:
        if self._shown:
            self._bar.stop()


# -------------------------------------------------------------------------------------------------
# sync


@click.command("sync")
@host_argument()
@click.option("--dry-run", "-n", is_flag=True, help="List what would be sent and deleted; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout: where, dry_run, ok, hosts {host: {upload, delete (paths; --dry-run: would), upload_bytes, unchanged, files_sent, bytes_sent, deleted, manifest_digest, skipped [{name, why}]} or {error}}.")
@click.pass_context
def sync(ctx: click.Context, host: str, dry_run: bool, as_json: bool) -> None:
    """Push the configured sync paths to HOST's workdir (a group: to each of its hosts).

    Only files whose content changed move (by SHA-256, against a manifest kept on the host).
    Files an earlier sync put there and that are gone here are deleted, only inside the synced
    paths; everything else on the host (runs/, outputs, data) is never touched.
    """
    place = ctx.obj.place(host)
    bars = SyncBars(always=len(place.hosts) > 1)
    try:
        outcome = place.sync(place.config.sync_paths(), dry_run=dry_run, progress=None if dry_run or ctx.obj.quiet else bars)
    finally:
        bars.close()
    if as_json:
        print_json(outcome.to_json(dry_run))
    else:
        print_sync_outcome(outcome, dry_run)
    ctx.exit(outcome.exit_code())


# -------------------------------------------------------------------------------------------------
# pull


@click.command("pull")
@host_argument()
@run_or_path_argument(required=False, default="last")
@click.argument("local_dir", required=False)
@click.option("--include", multiple=True, metavar="PATTERN", help="Only paths matching (gitignore-style; repeatable).")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="Skip paths matching (gitignore-style; repeatable).")
@click.option("--latest-checkpoint", is_flag=True, help="RUN: add the newest checkpoint. PATH: only its newest checkpoint directory, plus records and logs.")
@click.option("--best-checkpoint", is_flag=True, help="Add the checkpoint best.json names (RUN: in train's output; PATH: a checkpoints directory).")
@click.option("--streams", "-j", type=click.IntRange(1, 64), default=8, show_default=True, help="Most parallel byte streams (added while they raise throughput on a long link).")
@click.option("--jobs", "jobs", type=click.IntRange(1, 64), default=None, hidden=True, help="The former name of --streams.")
@click.option("--dry-run", "-n", is_flag=True, help="List what would be fetched.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout (keys: docs/json.md); progress stays on stderr.")
@click.pass_context
def pull(ctx: click.Context, host: str, remote: str, local_dir: str | None, include, exclude, latest_checkpoint: bool, best_checkpoint: bool, streams: int, jobs: int | None, dry_run: bool, as_json: bool) -> None:
    """Fetch REMOTE (a path, relative to the workdir unless absolute, or a RUN_ID / 'last';
    without it, the newest run) from HOST into LOCAL_DIR (default: runs/RUN_ID in the project, beside
    harness.toml, from any directory; a path: ./NAME).

    A run brings its records and logs, evaluate's report and plots, the export, serve_check's
    served.json and train's metrics (under LOCAL_DIR/outputs/): the artifacts this run made or
    reused, never another run's; checkpoints only with --latest-checkpoint or --best-checkpoint.

    Every piece of every file is checked against its CRC-32 computed on the host (files already
    here by whole-file SHA-256) and a file is renamed into place only once verified; an
    interrupted pull resumes from the bytes already received; names that would land outside
    LOCAL_DIR are refused.
    """
    from harness.pull import PullProgress
    from harness.run_pull import PullRequest, pull as pull_from

    if jobs is not None:  # --jobs N: what --streams was called first, still taken
        if ctx.get_parameter_source("streams") is not click.core.ParameterSource.DEFAULT and streams != jobs:
            raise click.UsageError(f"--jobs is the former name of --streams: give --streams {streams} alone")
        streams = jobs
    h = ctx.obj.host(host)
    request = PullRequest(remote, local_dir, tuple(include), tuple(exclude), latest_checkpoint, best_checkpoint, streams, dry_run)
    watched = not dry_run and not ctx.obj.quiet and click.get_text_stream("stderr").isatty()  # else no bar (and no rich import), as sync
    shown = _BarInBackground() if watched else None

    class Bar(PullProgress):
        def __init__(self):
            self.task = None  # added once the listing is in
            self.total_files = 0
            self.files = 0

        def start(self, files: int, total_bytes: int, done_bytes: int) -> None:
            self.total_files = files
            bar = self.bar = shown.get()
            if self.task is None:
                self.task = bar.add_task(f"pull {host}", total=total_bytes, files="")
            bar.update(self.task, total=total_bytes, completed=done_bytes, files=f"{self.files}/{files} files")

        def advance(self, nbytes: int) -> None:
            self.bar.update(self.task, advance=nbytes)

        def file_done(self, rel: str) -> None:
            self.files += 1
            self.bar.update(self.task, files=f"{self.files}/{self.total_files} files")

    try:
        try:
            outcome = pull_from(h, request, progress=lambda: Bar() if watched else None,
                                on_missing=lambda name: click.echo(f"absent  {name}: the run has not made it", err=True),
                                on_note=lambda text: click.echo(f"note    {text}", err=True))
        finally:
            if shown is not None:
                shown.close()
    except KeyboardInterrupt:
        click.echo("\ninterrupted: run the same command again to resume", err=True)
        ctx.exit(130)
    ctx.exit(_report_pull(host, request, outcome, as_json))


def _report_pull(host: str, request, outcome, as_json: bool) -> int:
    from harness.cli.render import print_json, pull_report_json

    report = outcome.report
    for p in report.planned if request.dry_run and not as_json else []:
        click.echo(f"fetch   {p}")
    for name, why in report.refused:
        click.echo(f"refused {shown_path(name)}: {shown_path(why)}", err=True)
    for name, why in report.failed:
        click.echo(f"failed  {name}: {why}", err=True)
    if not request.dry_run:
        rate = report.bytes_received / report.seconds if report.seconds else 0
        click.echo(
            f"{host}:{outcome.target.path} -> {outcome.destination}: {len(report.fetched)} fetched ({human_bytes(report.bytes_received)} at {human_bytes(rate)}/s"
            + (f", {human_bytes(report.bytes_resumed)} resumed" if report.bytes_resumed else "")
            + f", {report.streams} stream{'s' if report.streams != 1 else ''}), {len(report.identical)} already identical, {len(report.links)} links",
            err=True,
        )
    if as_json:
        print_json(pull_report_json(host, outcome.target, outcome.destination, report, outcome.missing, request.dry_run, outcome.notes))
    if not report.ok:
        click.echo(f"harness: error: {len(report.refused)} refused, {len(report.failed)} failed (nothing unverified was kept)", err=True)
        return 1
    return 0
