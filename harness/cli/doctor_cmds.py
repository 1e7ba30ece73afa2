"""`harness doctor HOST [--json]`: preflight checks as a table (or JSON); exit 1 on any fail."""

from __future__ import annotations

import click

from harness.cli.params import host_argument


def _checks_help() -> str:
    from harness.doctor import check_catalogue

    return "Checks, in order:\n\n\b\n" + "\n".join(f"{name}: {about}" for name, about in check_catalogue())


@click.command(epilog=_checks_help())
@host_argument()
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout (keys: docs/json.md).")
@click.pass_context
def doctor(ctx: click.Context, host: str, as_json: bool) -> None:
    """Check HOST (a group: each host, then the rendezvous port and routes): ok / warn / fail,
    each with its fix. Exit code: 0 when nothing failed, 1 when a check failed, 255 when the host
    could not be reached."""
    from harness.cli.render import print_diagnosis, print_json

    diagnosis = ctx.obj.place(host).doctor()
    if as_json:
        print_json(diagnosis.to_json())
    else:
        print_diagnosis(diagnosis)
    ctx.exit(diagnosis.exit_code())
