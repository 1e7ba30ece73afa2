"""`harness build HOST` and `harness shell HOST` (the logic lives in harness.runtime)."""

from __future__ import annotations

import sys

import click

from harness.cli.params import host_argument

# bash when the image has it, sh otherwise (minimal base images)
LOGIN_SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"]


@click.command("build")
@host_argument()
@click.option("--force", is_flag=True, help="Rebuild from scratch (docker --no-cache), even when an image with the same content hash exists.")
@click.option("--dry-run", "-n", is_flag=True, help="Say whether the image would be built (its tag, and whether the host has it); build and tag nothing.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout: where, dry_run, ok, hosts {host: {ref, image_id, built, would_build} or {error}}; docker's output stays on stderr.")
@click.pass_context
def build(ctx: click.Context, host: str, force: bool, dry_run: bool, as_json: bool) -> None:
    """Build the ML image on HOST (a group: on each of its hosts) from container/, tagged with a
    hash of its inputs.

    An unchanged image is not rebuilt; a changed one reuses the layers of the last image built
    from the same container/ (a script edit re-runs only the steps after the scripts' COPY).
    Ctrl-C stops the build on HOST too. Prints the image ID.
    """
    from harness.cli.render import print_build_outcome, print_json

    def out(chunk: bytes) -> None:
        if not ctx.obj.quiet:
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()

    from harness.errors import EXIT_INTERRUPTED
    from harness.runtime.image import BuildStopped

    try:
        outcome = ctx.obj.place(host).build(force, out, dry_run=dry_run)
    except BuildStopped as e:
        said = "stopped: its docker build ended there" if e.stopped else "interrupted: no docker build of it was running there"
        click.echo(f"\nharness: the build on {e.host} {said}", err=True)
        ctx.exit(EXIT_INTERRUPTED)
    if as_json:
        print_json(outcome.to_json(dry_run))
    else:
        print_build_outcome(outcome, dry_run)
    ctx.exit(outcome.exit_code())


@click.command("shell")
@host_argument()
@click.pass_context
def shell(ctx: click.Context, host: str) -> None:
    """An interactive shell on HOST, in the container when runtime = "docker".

    Same mounts, working directory and environment as the stages; exits with the shell's code.
    """
    from harness.runtime.base import WrapOptions

    h = ctx.obj.host(host)
    argv = h.runtime.foreground(LOGIN_SHELL, WrapOptions(interactive=True))
    ctx.exit(h.transport.run_pty(argv, env=h.cfg.env_values()))
