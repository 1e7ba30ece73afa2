"""HostRuntime: stages run as plain processes on the host, with the host's interpreter."""

from __future__ import annotations

from typing import Sequence

from harness.runtime.base import Runtime, WrapOptions

# `cd` then exec: the workdir travels as an argument, never spliced into the script.
_CD_AND_EXEC = 'cd -- "$0" && exec "$@"'


class HostRuntime(Runtime):
    kind = "host"

    @property
    def python(self) -> str:
        return self.host.python

    def wrap(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        # Environment values come from the transport's env (inherited), so env_names need no
        # flags here; labels and names only mean something to Docker. The host's `gpus` is
        # configuration, not a secret: it may stand on the command line.
        if self.host.gpus:
            argv = ["env", "CUDA_VISIBLE_DEVICES=" + ",".join(map(str, self.host.gpus)), *argv]
        return ["sh", "-c", _CD_AND_EXEC, self.workdir, *argv]
