"""HostRuntime: stages run as plain processes on the host, with the host's interpreter."""

from __future__ import annotations

from typing import Sequence

from harness.config import HostConfig
from harness.runtime.base import Runtime, WrapOptions

# `cd` then exec: the workdir travels as an argument, never spliced into the script.
_CD_AND_EXEC = 'cd -- "$0" && exec "$@"'


def with_visible_gpus(host: HostConfig, argv: Sequence[str]) -> list[str]:
    """argv under the host's `gpus` as its CUDA_VISIBLE_DEVICES (unchanged when `gpus` is empty).
    It is configuration, not a secret: it may stand on the command line."""
    if not host.gpus:
        return list(argv)
    return ["env", "CUDA_VISIBLE_DEVICES=" + ",".join(map(str, host.gpus)), *argv]


class HostRuntime(Runtime):
    kind = "host"

    @property
    def python(self) -> str:
        return self.host.python

    def wrap(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        # Environment values come from the transport's env (inherited), so env_names need no
        # flags here; labels and names only mean something to Docker.
        return ["sh", "-c", _CD_AND_EXEC, self.workdir, *with_visible_gpus(self.host, argv)]
