"""`harness exec HOST [--pty] -- CMD ARGS...` (the logic lives in harness.remote_exec)."""

from __future__ import annotations

import click

from harness.cli.params import host_argument


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.option("--pty", is_flag=True, help="Allocate a terminal (interactive programs; Ctrl-C reaches them).")
@host_argument()
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_(ctx: click.Context, pty: bool, host: str, command: tuple[str, ...]) -> None:
    """Run COMMAND on HOST in its workdir (inside its container when runtime = "docker").

    Output streams live; harness exits with the command's exit code. Put `--` before the
    command so that its options are not taken for harness's own.
    """
    from harness.cli.warm import config_file, recipe_key
    from harness.remote_exec import WarmExec, exec_on_host

    app = ctx.obj
    h = app.host(host)
    path = config_file(app.config.path)
    warm = WarmExec(recipe_key(path, host), path, app.started_ns)
    ctx.exit(exec_on_host(h, list(command), pty=pty, warm=warm))
