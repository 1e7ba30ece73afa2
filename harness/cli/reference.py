"""docs/cli.md, the command reference, written from the Click commands themselves:

    python -m harness.cli.reference > docs/cli.md

Every command of the lazy group (cli/app.py's COMMANDS, in its order): usage, help text, options
as Click itself describes them. Nothing depends on the terminal, so the output is the same on
every machine; tests/test_docs.py fails when docs/cli.md differs from it."""

from __future__ import annotations

import inspect

import click

HEADER = """# Command reference

Generated from the commands themselves; do not edit by hand. After changing a command:

    python -m harness.cli.reference > docs/cli.md

(tests/test_docs.py fails while this file differs from what the commands say.) Every command
takes `-h` / `--help`. HOST is a `[hosts.NAME]` of harness.toml (several commands also take a
`[groups.NAME]`); RUN is a run id as `harness run` printed it, or `last`.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help_text(command: click.Command) -> str:
    text = inspect.cleandoc((command.help or "").split("\f", 1)[0])
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b").strip()


def _section(command: click.Command, ctx: click.Context, title: str) -> list[str]:
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    out = [f"## {title}", "", f"    {usage}", ""]
    helptext = _help_text(command)
    if helptext:
        out += [helptext, ""]
    rows = [record for param in command.get_params(ctx) if isinstance(param, click.Option) and "--help" not in param.opts
            for record in [param.get_help_record(ctx)] if record is not None]
    if rows:
        out += ["| option | meaning |", "|---|---|"]
        out += [f"| `{_cell(names)}` | {_cell(meaning)} |" for names, meaning in rows]
        out.append("")
    return out


def render() -> str:
    """The whole of docs/cli.md."""
    from harness.cli.app import COMMANDS, cli

    root = click.Context(cli, info_name="harness")
    lines = [HEADER, *_section(cli, root, "harness"), "Commands:", ""]
    lines += [f"- [`{name}`](#harness-{name}): {_cell(cli.get_command(root, name).get_short_help_str(limit=200))}" for name in COMMANDS]
    lines.append("")
    for name in COMMANDS:
        command = cli.get_command(root, name)
        lines += _section(command, click.Context(command, info_name=name, parent=root), f"harness {name}")
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    click.echo(render(), nl=False)
