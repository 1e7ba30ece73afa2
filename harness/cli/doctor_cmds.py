"""`harness doctor HOST [--json]`: preflight checks as a table (or JSON); exit 1 on any fail."""

from __future__ import annotations

import click

from harness.cli.group_cmds import doctor_group


@click.command()
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout (keys: README, \"Scripting: --json\").")
@click.pass_context
def doctor(ctx: click.Context, host: str, as_json: bool) -> None:
    """Check HOST: connection, python3, free disk, Docker, GPUs."""
    from harness.cli.render import print_checks, print_json
    from harness.doctor import diagnose

    place = ctx.obj.place(host)
    if place.is_group:  # every host's checks, then the group's own
        ctx.exit(doctor_group(place, as_json))
    results = diagnose(place.cfg, lambda: place.transport, project=place.config)
    failed = any(r.status == "fail" for r in results)
    if as_json:
        print_json({"host": host, "ok": not failed, "checks": [r.to_dict() for r in results]})
    else:
        print_checks(host, results)
    ctx.exit(1 if failed else 0)
