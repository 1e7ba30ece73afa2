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
@click.option("--json", "as_json", is_flag=True, help="Print the hosts and groups as JSON on stdout (keys: docs/json.md).")
@click.pass_obj
def hosts(app, as_json: bool) -> None:
    """List configured hosts and groups."""
    from harness.cli.render import print_hosts, print_json

    if as_json:
        print_json(app.config.hosts_json())
    else:
        print_hosts(app.config)
