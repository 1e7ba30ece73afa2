"""HostRuntime: stages run as plain processes on the host, with the host's interpreter."""

from __future__ import annotations

from typing import Any, Sequence

from harness.transport.remote_shell import sh_expand_home
from harness.config import HostConfig
from harness.runtime.base import Runtime, WrapOptions

# `cd` then exec: the workdir travels as an argument, never spliced into the script.
_CD_AND_EXEC = 'cd -- "$0" && exec "$@"'

# The foreground commands: the workdir ($1, data) created if missing, then cd and exec. "~"
# expands on the host, so `harness exec` needs no round trip to learn the home directory.
_IN_WORKDIR = f'd=$1; shift; {sh_expand_home("d")}; {{ [ -d "$d" ] || mkdir -p -m 700 -- "$d"; }} && cd -- "$d" && exec "$@"'


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
        # flags here; labels, names and the network only mean something to Docker (a host
        # process listens on the host's addresses anyway).
        return ["sh", "-c", _CD_AND_EXEC, self.workdir, *with_visible_gpus(self.host, argv)]

    def foreground(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        # The configured workdir, expanded by the host's shell unless already known.
        workdir = self.workdir_as_given
        return ["sh", "-c", _IN_WORKDIR, "sh", workdir, *with_visible_gpus(self.host, argv)]

    def stage_process(self, argv: Sequence[str], *, run_id: str, stage: str, log_path: str, options: WrapOptions = WrapOptions()) -> dict[str, Any]:
        # A process group of its own; the supervisor sends its output to the log.
        return {"kind": self.kind, "argv": self.wrap(argv), "env_defaults": self.cache_env()}

    def visible_gpus_probe(self, argv: Sequence[str]) -> list[str]:
        return with_visible_gpus(self.host, argv)
