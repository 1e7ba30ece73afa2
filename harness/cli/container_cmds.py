"""`harness build HOST` and `harness shell HOST` (the logic lives in harness.runtime)."""

from __future__ import annotations

import sys

import click

from harness.cli.group_cmds import build_group

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
    from harness.runtime.image import build as build_image

    place = ctx.obj.place(host)
    if place.is_group:  # build on every host at once
        ctx.exit(build_group(place, force))
    if not place.uses_image:
        raise UsageError(f"host {host} has runtime = \"{place.cfg.runtime}\"; set runtime = \"docker\" in [hosts.{host}] to build an image")

    def out(chunk: bytes) -> None:
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()

    result = build_image(place.transport, place.config, place.cfg, output=out, force=force)
    click.echo(f"{'built' if result.built else 'unchanged, not rebuilt'}: {result.ref}", err=True)
    click.echo(result.image_id)


@click.command("shell")
@click.argument("host")
@click.pass_context
def shell(ctx: click.Context, host: str) -> None:
    """An interactive shell on HOST, in the container when runtime = "docker".

    Same mounts, working directory and environment as the stages; exits with the shell's code.
    """
    from harness.runtime.base import WrapOptions

    h = ctx.obj.host(host)
    argv = h.runtime.foreground(LOGIN_SHELL, WrapOptions(interactive=True))
    ctx.exit(h.transport.run_pty(argv, env=h.cfg.env_values()))
