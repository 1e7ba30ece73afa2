"""`harness exec`: run one command on a host, in its workdir, with live output and its exit code.

The command runs in the stage environment: in the workdir for runtime "host", in the container
for runtime "docker". How it reaches the host is the transport's choice (Transport.exec_foreground:
the OpenSSH ControlMaster for a plain command on an SSH host, measured in bench/exec_latency.py).
"""

from __future__ import annotations

from typing import Sequence

from harness.config import HostConfig
from harness.transport import Transport

# Runs argv in the workdir, creating it first (a fresh host has none until the first sync).
# The directory is data ($1), never part of the script; "~" expands on the host, so the warm
# path needs no round trip to learn the home directory.
IN_WORKDIR = (
    'd=$1; shift; case $d in "~") d=$HOME;; "~/"*) d=$HOME/${d#"~/"};; esac; '
    '{ [ -d "$d" ] || mkdir -p -- "$d"; } && cd -- "$d" && exec "$@"'
)


def in_workdir(workdir: str, argv: Sequence[str]) -> list[str]:
    return ["sh", "-c", IN_WORKDIR, "sh", workdir, *argv]


def exec_on_host(host: HostConfig, argv: Sequence[str], *, pty: bool, transport: Transport) -> int:
    """Run argv on the host; return its exit code."""
    env = host.env_values()
    if host.runtime == "docker":
        from harness.runtime import WrapOptions, runtime_for

        # The container sees the stages' image, mounts and workdir; env values still travel
        # through the transport, by name.
        full = runtime_for(host, transport).foreground(list(argv), WrapOptions(interactive=pty, env_names=tuple(env)))
    else:
        full = in_workdir(host.workdir, argv)
    return transport.exec_foreground(full, env=env, pty=pty)
