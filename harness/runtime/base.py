"""How a command runs on a host: directly (HostRuntime) or inside the ML container (DockerRuntime).

A runtime turns "run this argv in the stage environment" into a host-level argv that a Transport
executes. Jobs, `harness exec`, `harness shell`, `harness inspect` and doctor all go through
`wrap`, so they see exactly the interpreter, image, mounts and environment the stages see; the
foreground commands through `foreground`, which also works on a host that was never synced.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence

from harness.config import HostConfig


@dataclass(frozen=True)
class WrapOptions:
    interactive: bool = False  # keep stdin open and allocate a TTY inside (shell, exec --pty)
    env_names: tuple[str, ...] = ()  # variables passed through BY NAME (values come from the
    # transport's env, never from the command line)
    labels: tuple[tuple[str, str], ...] = ()  # docker labels (run id, stage)
    name: str | None = None  # container name (detached jobs)
    gpus: bool = True  # False: ask for no GPUs (the container start check: it needs none)


# Create directories, then run the command: one round trip. The directories are data ($2..),
# never part of the script.
_MKDIRS_THEN_EXEC = 'n=$1; shift; while [ "$n" -gt 0 ]; do mkdir -p -- "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'


class Runtime(abc.ABC):
    def __init__(self, host: HostConfig, workdir: str):
        self.host = host
        self.workdir = workdir  # absolute, already expanded on the host

    @property
    @abc.abstractmethod
    def python(self) -> str:
        """The interpreter the stages use, as named inside the runtime."""

    @abc.abstractmethod
    def wrap(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        """Host-level argv that runs `argv` in the stage environment with cwd = workdir."""

    #: where a server started in this runtime (`harness tensorboard`) listens so that the host, and
    #: nothing beyond it, reaches it: the host's loopback here
    server_bind_address = "127.0.0.1"

    def host_dirs(self) -> list[str]:
        """Host directories that must exist before a command runs in this runtime."""
        return [self.workdir]

    def foreground(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        """wrap(argv), creating host_dirs() first: a fresh host has no workdir until the first
        sync, yet exec, shell, inspect and doctor are the first things run on a new box (and
        docker would create a missing mount source itself, owned by root)."""
        dirs = self.host_dirs()
        return ["sh", "-c", _MKDIRS_THEN_EXEC, "sh", str(len(dirs)), *dirs, *self.wrap(argv, options)]
