"""`harness doctor HOST [--json]`: preflight checks as a table (or JSON); exit 1 on any fail."""

from __future__ import annotations

import click


@click.command()
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout (keys: docs/json.md).")
@click.pass_context
def doctor(ctx: click.Context, host: str, as_json: bool) -> None:
    """Check HOST: connection, python3, free disk, Docker, GPUs."""
    from harness.cli.render import print_diagnosis, print_json

    diagnosis = ctx.obj.place(host).doctor()
    if as_json:
        print_json(diagnosis.to_json())
    else:
        print_diagnosis(diagnosis)
    ctx.exit(diagnosis.exit_code())
