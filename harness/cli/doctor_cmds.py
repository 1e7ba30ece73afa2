"""`harness doctor HOST [--json]`: preflight checks as a table (or JSON); exit 1 on any fail."""

from __future__ import annotations

import click

from harness.cli.group_cmds import dispatch_if_group


@click.command()
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def doctor(ctx: click.Context, host: str, as_json: bool) -> None:
    """Check HOST: connection, python3, free disk, Docker, GPUs."""
    from harness.doctor import diagnose

    app = ctx.obj
    dispatch_if_group(ctx, host, "doctor_group", as_json)  # a group: every host's checks, then the group's own
    config = app.host(host)
    try:
        results = diagnose(config, lambda: app.transport(host), project=app.config)
    finally:
        app.close()
    failed = any(r.status == "fail" for r in results)
    if as_json:
        import json

        click.echo(json.dumps({"host": host, "ok": not failed, "checks": [r.to_dict() for r in results]}, indent=2))
    else:
        _render(host, results)
    ctx.exit(1 if failed else 0)


def _render(host: str, results) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Findings and fixes carry remote text (paths, package specs like torch[cuda]): escape
    # them so rich shows the brackets instead of eating them as markup.
    style = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}
    table = Table(title=f"doctor {escape(host)}")
    for column in ("check", "status", "finding", "fix"):
        table.add_column(column)
    for r in results:
        table.add_row(escape(r.name), style[r.status], escape(r.message), escape(r.fix))
    Console().print(table)
