"""What reaching one configured host takes (ConnectionSpec, ConnectOptions) and `connect`, which
makes its Transport (LocalTransport or SSHTransport). Takes a HostConfig's fields, never imports
harness.config."""

from __future__ import annotations

from dataclasses import dataclass

from harness.transport.base import Transport


@dataclass(frozen=True)
class ConnectionSpec:
    """How to reach one configured host."""

    name: str  # the configured host name, for messages
    ssh: str = ""  # "user@host:port", "host", or an ~/.ssh/config alias; "" with local
    local: bool = False  # this machine: no SSH at all
    identity_file: str = ""  # extra key file (in addition to ~/.ssh/config and the agent)
    connect_timeout: float = 10.0
    keepalive: int = 15  # ServerAliveInterval; 3 unanswered end the connection

    @classmethod
    def of(cls, host) -> "ConnectionSpec":
        """From a harness.config.HostConfig (or another ConnectionSpec)."""
        return cls(name=host.name, ssh=host.ssh, local=host.is_local, identity_file=host.identity_file, connect_timeout=host.connect_timeout,
                   keepalive=host.keepalive)

    @property
    def is_local(self) -> bool:
        return self.local


@dataclass(frozen=True)
class ConnectOptions:
    """Per-invocation choices that are not host configuration."""

    accept_new_host_key: bool = False  # like OpenSSH's StrictHostKeyChecking=accept-new, once
    known_hosts: str | None = None  # extra known_hosts file (tests); default ~/.ssh/known_hosts
    ssh_config: str | None = None  # default ~/.ssh/config


def connect(host, options: ConnectOptions | None = None) -> Transport:
    """host: a harness.config.HostConfig (or a ConnectionSpec)."""
    spec = ConnectionSpec.of(host)
    if spec.is_local:
        from harness.transport.local import LocalTransport

        return LocalTransport(spec.name)
    from harness.transport.ssh import SSHTransport  # paramiko is imported only when needed

    return SSHTransport(spec, options or ConnectOptions())
