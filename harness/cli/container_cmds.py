"""`harness build HOST` and `harness shell HOST` (the logic lives in harness.runtime)."""

from __future__ import annotations

import sys

import click

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
    from harness.cli.render import print_build_outcome

    def out(chunk: bytes) -> None:
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()

    outcome = ctx.obj.place(host).build(force, out)
    print_build_outcome(outcome)
    ctx.exit(outcome.exit_code())


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
