"""Reach a host: `connect(host_config)` -> a Transport (LocalTransport or SSHTransport)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.config import HostConfig
from harness.transport.base import OutputSink, RemoteStat, RunResult, Transport, quote_argv


@dataclass(frozen=True)
class ConnectOptions:
    """Per-invocation choices that are not host configuration."""

    accept_new_host_key: bool = False  # like OpenSSH's StrictHostKeyChecking=accept-new, once
    known_hosts: str | None = None  # extra known_hosts file (tests); default ~/.ssh/known_hosts
    ssh_config: str | None = None  # default ~/.ssh/config


def connect(host: HostConfig, options: ConnectOptions | None = None) -> Transport:
    if host.is_local:
        from harness.transport.local import LocalTransport

        return LocalTransport(host.name)
    from harness.transport.ssh import SSHTransport  # paramiko is imported only when needed

    return SSHTransport(host, options or ConnectOptions())


__all__ = ["ConnectOptions", "OutputSink", "RemoteStat", "RunResult", "Transport", "connect", "quote_argv"]
