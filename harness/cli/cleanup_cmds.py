"""`harness rm HOST RUN...` and `harness gc HOST` (the logic: harness.cleanup)."""

from __future__ import annotations

import click

from harness.cli.params import complete_runs, host_argument

DRY_RUN_HELP = "Say what would go and the bytes it would free; remove nothing."
JSON_HELP = "JSON on stdout: host, dry_run, runs, artifacts [{stage, key, bytes, complete}], bytes, kept, kept_for_live_runs, kept_busy, images [{ref, image_id, bytes}], image_bytes, containers [{id, name, why}] (docs/json.md)."


def _report(ctx: click.Context, outcome, as_json: bool) -> None:
    from harness.cli.render import print_cleanup, print_json

    if as_json:
        print_json(outcome.to_json())
    else:
        print_cleanup(outcome)


@click.command("rm")
@host_argument()
@click.argument("runs", nargs=-1, required=True, metavar="RUN...", shell_complete=complete_runs)
@click.option("--dry-run", "-n", is_flag=True, help=DRY_RUN_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def rm(ctx: click.Context, host: str, runs: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Remove RUNs from HOST (their records and logs), and then every artifact no kept run made,
    reused or read (as `harness gc`).

    RUN: a run id, a unique start or end of one (bf858a), 'last' or 'last~N'. A queued or running
    run is refused: cancel it first."""
    from harness.cleanup import collect

    _report(ctx, collect(ctx.obj.host(host).jobs, list(runs), dry_run), as_json)


@click.command("gc")
@host_argument()
@click.option("--dry-run", "-n", is_flag=True, help=DRY_RUN_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def gc(ctx: click.Context, host: str, dry_run: bool, as_json: bool) -> None:
    """Remove from HOST's artifact store every artifact that no run there made, reused or read
    (what `harness rm` of its runs left, what a cut or failed run left), never anything outside
    the store, never through a link, never an artifact being made, and none of a stage that a
    queued or running run may read.

    On a host with runtime = "docker", also the containers a crash left there (labelled with its
    workdir, their command gone: an exec's or shell's whose client no longer runs, a stage's whose
    run is neither queued nor running), then the image tags harness built there that nothing uses
    any more: never the tag the config builds now, the one :latest names, one a container was
    made from, or an image harness did not build."""
    from harness.cleanup import collect_all

    _report(ctx, collect_all(ctx.obj.host(host), dry_run), as_json)
