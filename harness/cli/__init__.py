"""The `harness` command. Click commands only: parse, call the library, render. No logic here.

main() first offers the command line to the warm exec (cli/warm.py: `harness exec HOST -- CMD`
from the recipe an earlier exec left, before click or the config is imported), then to the Click
group (cli/app.py), whose subcommands live in their own modules, imported only when invoked.
"""

from __future__ import annotations

import sys

from harness.cli.exit_code import exit_with


def main() -> None:
    """Entry point (the `harness` console script, `python -m harness`)."""
    from harness.cli.warm import run_warm_exec  # deferred: start-up (as is app: click only where no warm exec serves)

    code = run_warm_exec(sys.argv[1:])
    if code is not None:
        exit_with(code)
    from harness.cli.app import run

    run()


def __getattr__(name: str):
    # `from harness.cli import cli` (tests' CliRunner): the Click group, loaded on use
    if name == "cli":
        from harness.cli.app import cli

        return cli
    raise AttributeError(f"module 'harness.cli' has no attribute {name!r}")
