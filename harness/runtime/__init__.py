"""How a command runs on a host: `runtime_for(host, transport)` -> HostRuntime or DockerRuntime."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.config import HostConfig
from harness.runtime.base import Runtime, WrapOptions

if TYPE_CHECKING:
    from harness.transport.base import Transport


def runtime_for(host: HostConfig, transport: "Transport") -> Runtime:
    """The runtime of a configured host, with its workdir expanded as the host sees it."""
    workdir = transport.expand(host.workdir).rstrip("/") or "/"
    if host.runtime == "docker":
        from harness.runtime.docker import DockerRuntime

        return DockerRuntime(host, workdir, home=transport.home())
    from harness.runtime.host import HostRuntime

    return HostRuntime(host, workdir)


__all__ = ["Runtime", "WrapOptions", "runtime_for"]
