"""`harness build HOST` and `harness shell HOST` (the logic lives in harness.runtime)."""

from __future__ import annotations

import sys

import click

from harness.cli.group_cmds import build_group, dispatch_if_group

# bash when the image has it, sh otherwise (minimal base images)
LOGIN_SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"]


@click.command("build")
@click.argument("host")
@click.option("--force", is_flag=True, help="Rebuild from scratch (docker --no-cache), even when an image with the same content hash exists.")
@click.pass_context
def build(ctx: click.Context, host: str, force: bool) -> None:
    """Build the ML image on HOST from container/ (tagged with a hash of its inputs).

    An unchanged image is not rebuilt. Prints the image ID.
    """
    from harness.errors import UsageError
    from harness.runtime import runtime_for
    from harness.runtime.image import build as build_image

    app = ctx.obj
    dispatch_if_group(ctx, host, build_group, force)  # a group: build on every host at once
    host_cfg = app.host(host)
    if not runtime_for(host_cfg).uses_image:
        raise UsageError(f"host {host} has runtime = \"{host_cfg.runtime}\"; set runtime = \"docker\" in [hosts.{host}] to build an image")

    def out(chunk: bytes) -> None:
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()

    try:
        result = build_image(app.transport(host), app.config, host_cfg, output=out, force=force)
    finally:
        app.close()
    click.echo(f"{'built' if result.built else 'unchanged, not rebuilt'}: {result.ref}", err=True)
    click.echo(result.image_id)


@click.command("shell")
@click.argument("host")
@click.pass_context
def shell(ctx: click.Context, host: str) -> None:
    """An interactive shell on HOST, in the container when runtime = "docker".

    Same mounts, working directory and environment as the stages; exits with the shell's code.
    """
    from harness.runtime import runtime_for
    from harness.runtime.base import WrapOptions

    app = ctx.obj
    host_cfg = app.host(host)
    try:
        transport = app.transport(host)
        runtime = runtime_for(host_cfg, transport)
        argv = runtime.foreground(LOGIN_SHELL, WrapOptions(interactive=True))
        code = transport.run_pty(argv, env=host_cfg.env_values())
    finally:
        app.close()
    ctx.exit(code)
