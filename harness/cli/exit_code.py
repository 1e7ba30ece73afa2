"""How the `harness` process ends: with the exit code it says (harness.errors: EXIT_*)."""

from __future__ import annotations

import sys
from typing import NoReturn


def exit_with(code: int) -> NoReturn:
    """sys.exit(code), and the process really ends with `code`. CPython records a
    KeyboardInterrupt that left an exec() of source text as unhandled even when it was caught
    later (Ctrl-C landing in a dataclass's generated method while a lazy import makes it), and
    at exit kills itself with SIGINT instead (a caller sees -2, not 130). An exec() that ends
    normally clears that record."""
    exec("")
    sys.exit(code)
