"""A server on a unix socket of the host (or of a container there), reached from this machine's
loopback: each local connection is relayed through a command of its own on the host
(Transport.stream: over SSH a channel of the master), the host helper relay.py (started by
helpers.start: on the host's python, or in the container by `docker exec -i NAME`), which
connects to the server and moves the bytes both ways over its stdin/stdout, after its request
line.

The helper's source travels with each connection, as every helper's does: the container needs a
python and nothing of harness's (no synced tree, no mount), and a relay in the host runtime needs
neither the stage environment nor the workdir.

Why (docs/security.md): a TCP port on the box, even its loopback, is open to every local user;
a socket in a 0700 directory is open to its owner only, and a container's file system to `docker
exec` only (root's peers). So a relay goes to a unix socket only, never to a port.
"""

from __future__ import annotations

import socket
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness import helpers
from harness.errors import UsageError
from harness.transport.base import Forwarding

if TYPE_CHECKING:
    from harness.runtime.base import Runtime
    from harness.transport.base import Transport
    from harness.transport.process import RemoteProcess

RELAY = "relay.py"


@dataclass(frozen=True)
class Relay:
    """Where a connection is relayed to: `to`, a unix socket's path, on the host (the host's
    python) or, with `container`, in that running container of `runtime` (its file system)."""

    runtime: "Runtime"
    to: str
    container: str | None = None

    def start(self, transport: "Transport") -> "RemoteProcess":
        """One connection's relay, its request written: what follows on its stdin goes to the
        server, its stdout is the server's answer; exit 1 when nothing listens there."""
        request = {"socket": self.to}
        if self.container:
            return helpers.start(transport, RELAY, request, where=self.runtime, inside=self.container)
        return helpers.start(transport, RELAY, request, python=self.runtime.python)


class RelayForwarding(Forwarding):
    """127.0.0.1:local_port here; each connection relayed by `relay`. `option`: the command's
    option that picks the local port (in the error when it is taken)."""

    def __init__(self, transport: "Transport", relay: Relay, local_port: int, option: str = "--port"):
        self._transport = transport
        self._relay_to = relay
        self._listener = socket.socket()
        try:
            self._listener.bind(("127.0.0.1", local_port))
        except OSError:
            self._listener.close()
            raise UsageError(f"local port {local_port} is already in use on this machine (pick another: {option})") from None
        self._listener.listen(64)
        self.addresses = [("127.0.0.1", self._listener.getsockname()[1])]
        self._closed = threading.Event()
        self._relays: set["RemoteProcess"] = set()
        self._lock = threading.Lock()
        self._last_warning = ""
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def retarget(self, relay: Relay) -> None:
        """Connections from now on go to `relay` (a server that says where it listens once it has
        made its socket)."""
        self._relay_to = relay

    def _relay(self, conn: socket.socket) -> None:
        proc = self._relay_to.start(self._transport)
        with self._lock:
            self._relays.add(proc)

        def down() -> None:  # the host's answer to this connection
            try:
                while chunk := proc.stdout.read(65536):  # a raw pipe: what has come, at most this
                    conn.sendall(chunk)
            except OSError:
                pass
            finally:
                try:
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        reader = threading.Thread(target=down, daemon=True)
        reader.start()
        try:
            while chunk := conn.recv(65536):
                proc.stdin.write(chunk)
        except OSError:
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
            reader.join()
            conn.close()
            code = proc.wait()
            with self._lock:
                self._relays.discard(proc)
        if code != 0 and not self._closed.is_set():
            self._warn(str(proc.error("the relay")))

    def _warn(self, error: str) -> None:
        """One line per new failure, not one per browser retry."""
        if error != self._last_warning:
            self._last_warning = error
            sys.stderr.write(f"harness: warning: {self._transport.name}: a forwarded connection failed: {error}\n")
            sys.stderr.flush()

    def wait(self, timeout: float | None = None) -> bool:
        """Until closed (True), or `timeout` seconds (False)."""
        return self._closed.wait(timeout)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            relays = list(self._relays)
        for proc in relays:
            proc.stop()
