"""`harness completion bash|zsh|fish`: the shell's completion script."""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL: commands, options, hosts and groups (from the
    config), stages, and run ids (those the last `harness run`, `runs` or `status` of the host saw
    here; completion never connects to a host).

    \b
    bash:  eval "$(harness completion bash)"        (in ~/.bashrc)
    zsh:   eval "$(harness completion zsh)"         (in ~/.zshrc)
    fish:  harness completion fish > ~/.config/fish/completions/harness.fish
    """
    from click.shell_completion import get_completion_class

    from harness.cli.app import cli

    click.echo(get_completion_class(shell)(cli, {}, "harness", "_HARNESS_COMPLETE").source())
