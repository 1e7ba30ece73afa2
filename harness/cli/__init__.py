"""The `harness` command. Click commands only: parse, call the library, render. No logic here.

main() first offers the command line to the warm exec (cli/warm.py: `harness exec HOST -- CMD`
from the recipe an earlier exec left, before click or the config is imported), then to the Click
group (cli/app.py), whose subcommands live in their own modules, imported only when invoked.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> None:
    """Entry point (the `harness` console script, `python -m harness`)."""
    from harness.cli.warm import run_warm_exec

    code = run_warm_exec(sys.argv[1:])
    if code is not None:
        exit_with(code)
    from harness.cli.app import run

    run()


def exit_with(code: int) -> NoReturn:
    """sys.exit(code), and the process really ends with `code`. CPython records a
    KeyboardInterrupt that left an exec() of source text as unhandled even when it was caught
    later (Ctrl-C landing in a dataclass's generated method while a lazy import makes it), and
    at exit kills itself with SIGINT instead (a caller sees -2, not 130). An exec() that ends
    normally clears that record."""
    exec("")
    sys.exit(code)


def __getattr__(name: str):
    # `from harness.cli import cli` (tests' CliRunner): the Click group, loaded on use
    if name == "cli":
        from harness.cli.app import cli

        return cli
    raise AttributeError(f"module 'harness.cli' has no attribute {name!r}")
