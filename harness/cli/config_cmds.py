"""`harness init` (a commented starter harness.toml) and `harness hosts` (what is configured)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--path", "path", type=click.Path(dir_okay=False), default=None, help="Where to write it (default: ./harness.toml, or --config).")
@click.pass_obj
def init(app, path: str | None) -> None:
    """Write a commented starter harness.toml (never overwrites an existing file)."""
    from importlib.resources import files

    from harness.config import DEFAULT_CONFIG_NAME
    from harness.errors import UsageError

    target = Path(path or app.config_path or DEFAULT_CONFIG_NAME)
    text = files("harness").joinpath("templates/harness.toml").read_text(encoding="utf-8")
    try:
        with open(target, "x", encoding="utf-8") as f:  # "x": fails if it exists, no race
            f.write(text)
    except FileExistsError:
        raise UsageError(f"{target} already exists; not overwriting it (edit it, or pass --path)") from None
    except OSError as e:
        raise UsageError(f"cannot write {target}: {e.strerror}") from None
    click.echo(f"wrote {target}: edit [hosts.gpu], then run `harness doctor gpu`")


@click.command()
@click.pass_obj
def hosts(app) -> None:
    """List configured hosts and groups."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from harness.runtime import runtime_for

    config = app.config
    table = Table(title=f"hosts in {escape(str(config.path))}")
    for column in ("name", "reach", "runtime", "workdir", "env"):
        table.add_column(column)
    for name, h in config.hosts.items():
        reach = "local" if h.is_local else f"ssh {h.ssh}"
        table.add_row(*(escape(cell) for cell in (name, reach, runtime_for(h).describe(), h.workdir, ", ".join(h.env))))
    console = Console()
    console.print(table)
    if config.groups:
        groups = Table(title="groups")
        groups.add_column("name")
        groups.add_column("hosts")
        for name, g in config.groups.items():
            groups.add_row(escape(name), escape(", ".join(g.hosts)))
        console.print(groups)
