"""How a command runs on a host: HostRuntime or DockerRuntime, as its config says (runtime_for;
harness.host.Host.runtime makes the one a command uses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.config import HostConfig
from harness.runtime.base import Runtime, WrapOptions
from harness.runtime.host import HostRuntime

if TYPE_CHECKING:
    from harness.transport.base import Transport


def runtime_for(host: HostConfig, transport: "Transport | None" = None) -> Runtime:
    """The runtime of a configured host. The transport expands its workdir (and, for docker,
    finds the home its mounts use) on first use; without one, only what the configuration says
    (uses_image, describe(), the words doctor uses) can be asked."""
    if host.runtime == "docker":
        from harness.runtime.docker import DockerRuntime  # deferred: start-up (it imports the image build, docker's alone)

        return DockerRuntime(host, transport=transport)
    return HostRuntime(host, transport=transport)


__all__ = ["Runtime", "WrapOptions", "runtime_for"]
