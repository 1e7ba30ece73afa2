"""`harness sources HOST PACKAGE...` (the logic lives in harness.sources)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli.params import host_argument


@click.command("sources")
@host_argument()
@click.argument("packages", nargs=-1, required=True, metavar="PACKAGE...")
@click.option("--dest", type=click.Path(file_okay=False), default=None, help="Local folder of the mirror (default: .harness/sources/HOST under the project).")
@click.option("--json", "as_json", is_flag=True,
              help="JSON on stdout: host, dest, ok, packages [{package, version, local, fetched, identical, removed, failed [{name, why}], bytes_received}], editor {tool: setting}.")
@click.pass_context
def sources(ctx: click.Context, host: str, packages: tuple[str, ...], dest: str | None, as_json: bool) -> None:
    """Mirror the Python sources (.py, .pyi, py.typed) of PACKAGEs as installed where HOST's
    stages run (in the container when runtime = "docker") into a local folder, for an editor.

    Incremental: only files that changed move; files the package no longer has are removed from
    the mirror. Prints the `extraPaths` setting for pyright, pylance and jedi.

    \b
    harness sources gpu torch transformers speculators
    """
    from harness.sources import DEFAULT_DEST, editor_settings, mirror

    h = ctx.obj.host(host)
    target = Path(dest) if dest else h.config.root / DEFAULT_DEST / host
    results = mirror(h.transport, h.runtime, list(packages), target, host_python=h.cfg.python)
    failed = False
    for r in results:
        p = r.package
        version = f" {p.version}" if p.version else ""
        click.echo(f"{p.name}{version}: {len(r.fetched)} fetched, {len(r.identical)} unchanged, {len(r.removed)} removed -> {r.local_path}", err=True)
        for rel, why in r.failed:
            failed = True
            click.echo(f"failed  {p.name}/{rel}: {why}", err=True)
    settings = editor_settings(target, h.config.root)
    if as_json:
        from harness.cli.render import print_json

        print_json({"host": host, "dest": str(target), "ok": not failed, "packages": [r.to_json() for r in results], "editor": settings})
    else:
        click.echo("point your editor at the mirror:", err=True)
        for tool, setting in settings.items():
            click.echo(f"  {tool}: {setting}")
    ctx.exit(1 if failed else 0)
