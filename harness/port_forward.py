"""`harness forward`: ports of a host reached from this machine (TensorBoard, a `vllm serve`,
Jupyter), through the host's Transport (so the same host-key and ProxyJump policy).

Where a port listens is asked on the host first (harness/host_helpers/port_probe.py, one round trip):
its loopback, else a running container's address, because the stages' containers sit on docker's
bridge network and publish no port. A port where nothing listens yet is still forwarded (the
server may start later) and said in one line. (The servers harness starts listen on a unix socket,
in their own container on docker hosts, out of this reach: harness.relay_forward.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from harness import helpers
from harness.errors import UsageError
from harness.transport.base import Forwarding, PortForward, Transport, port_number



@dataclass(frozen=True)
class PortSpec:
    """REMOTE_PORT[:LOCAL_PORT] as given on the command line (LOCAL_PORT defaults to REMOTE_PORT)."""

    remote_port: int
    local_port: int

    @classmethod
    def parse(cls, text: str) -> "PortSpec":
        remote, colon, local = text.partition(":")
        return cls(_port(text, remote), _port(text, local) if colon else _port(text, remote))


def _port(text: str, part: str) -> int:
    port = port_number(part)
    if port is None:
        raise UsageError(f"invalid port {text!r} (expected REMOTE_PORT or REMOTE_PORT:LOCAL_PORT, ports 1-65535)")
    return port


@dataclass(frozen=True)
class Forwarded:
    spec: PortSpec
    url: str  # where this machine reaches it
    where: str  # "the host", "container NAME", or "" when nothing listens there yet

    @property
    def listening(self) -> bool:
        return bool(self.where)


def locate(transport: Transport, python: str, ports: Sequence[int]) -> dict[int, dict | None]:
    """{port: {"address", "where"} or None (nothing listens)}, as the host sees it."""
    result = helpers.call(transport, "port_probe.py", {"ports": list(ports)}, python=python, timeout=120)
    return {int(k): v for k, v in result.checked(f"{python} port_probe.py").json().items()}


def open_forwards(transport: Transport, python: str, specs: Sequence[PortSpec]) -> tuple[Forwarding, list[Forwarded]]:
    """Forward each port where it listens (see locate); returns the open Forwarding (close it, or use `with`)."""
    locals_ = [s.local_port for s in specs]
    if len(set(locals_)) != len(locals_):
        raise UsageError(f"local port {next(p for p in locals_ if locals_.count(p) > 1)} is given twice")
    found = locate(transport, python, [s.remote_port for s in specs])
    for spec in specs:
        check_owner(transport.name, spec.remote_port, found.get(spec.remote_port))
    forwards = [PortForward(s.local_port, s.remote_port, (found.get(s.remote_port) or {}).get("address", "127.0.0.1")) for s in specs]
    forwarding = transport.forward(forwards)
    shown = [
        Forwarded(s, f"http://{_url_host(host)}:{port}", (found.get(s.remote_port) or {}).get("where", ""))
        for s, (host, port) in zip(specs, forwarding.addresses)
    ]
    return forwarding, shown


def check_owner(host: str, port: int, where: dict | None) -> None:
    """A port of the host that another user's process listens on is not forwarded: whatever
    answers there (a look-alike of your server squatting its port) would get your requests."""
    if not where or where.get("where") != "the host":
        return
    uid, ours = where.get("uid"), where.get("our_uid")
    if isinstance(uid, int) and isinstance(ours, int) and uid != ours:
        raise UsageError(f"{host}: port {port} listens for another user (uid {uid}), not for you: not forwarded",
                         "start your server on another port (or find who holds it: ss -ltnp)")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
