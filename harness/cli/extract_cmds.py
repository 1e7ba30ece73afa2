"""`harness check-extract HOST|GROUP [RUN]`: after a sharded extract, every sample must have exactly
one valid hidden-state file across the hosts (logic: harness.extraction_check)."""

from __future__ import annotations

import click

from harness.cli.params import complete_hosts, complete_runs


@click.command("check-extract")
@click.argument("target", metavar="HOST|GROUP", shell_complete=complete_hosts)
@click.argument("run_id", metavar="[RUN]", required=False, default="last", shell_complete=complete_runs)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def check_extract(ctx: click.Context, target: str, run_id: str, as_json: bool) -> None:
    """Check the hidden states of RUN's (sharded) extract on HOST or every host of GROUP (RUN:
    its id or 'last'; without it, the newest run).

    Reports gaps (samples with no valid file anywhere), invalid files, hosts that disagree on
    the extraction's layers, and samples stored on more than one host. Exit 1 unless every
    sample has exactly one valid file. What changed in the sync paths is synced first.
    """
    from harness.extraction_check import check_extraction
    from harness.run_start import sync_code

    place = ctx.obj.place(target)
    sync_code(place)  # its script runs from the synced code: never a missing or stale one
    report = check_extraction(place.hosts, run_id)
    if as_json:
        import json

        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
    ctx.exit(0 if report.ok else 1)
