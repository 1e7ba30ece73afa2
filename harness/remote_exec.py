"""`harness exec`: run one command on a host, in its workdir, with live output and its exit code.

The command runs in the stage environment, as the host's runtime says (Runtime.foreground: the
workdir, created first on a fresh host; the container when the stages run in one). How it
reaches the host is the transport's choice (Transport.exec_foreground: its fastest way, measured
in bench/exec_latency.py). On a host runtime nothing is asked of the host before the command.
"""

from __future__ import annotations

from typing import Sequence

from harness.config import HostConfig
from harness.runtime import Runtime, WrapOptions, runtime_for
from harness.transport import Transport


def exec_on_host(host: HostConfig, argv: Sequence[str], *, pty: bool, transport: Transport, runtime: Runtime | None = None) -> int:
    """Run argv on the host; return its exit code."""
    env = host.env_values()
    # Env values travel through the transport; a container gets them by name.
    full = (runtime or runtime_for(host, transport)).foreground(list(argv), WrapOptions(interactive=pty, env_names=tuple(env)))
    return transport.exec_foreground(full, env=env, pty=pty)
