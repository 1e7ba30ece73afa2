"""A server on a unix socket of the host (or of a container there), or on the loopback of a
container's own network namespace, reached from this machine's loopback: each local connection is
relayed through a command of its own on the host (Transport.stream: over SSH a channel of the
master), `python3 -c RELAY SOCKET` (or `RELAY 127.0.0.1 PORT`; in a container `docker exec -i
NAME python3 -c RELAY ...`), which connects to the server and moves the bytes both ways over its
stdin/stdout.

Why (docs/security.md): a TCP port on the box, even its loopback, is open to every local user;
a socket in a 0700 directory is open to its owner only, and a container's file system and
loopback to `docker exec` only (root's peers).
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import TYPE_CHECKING, Sequence

from harness.errors import UsageError
from harness.transport.base import Forwarding

if TYPE_CHECKING:
    from harness.transport.base import Transport
    from harness.transport.process import RemoteProcess

# argv[1]: the socket, or argv[1:3]: a TCP address and port. Exit 1 when nothing listens there
# (the error names it on stderr).
RELAY = r"""
import os, socket, sys, threading
where = sys.argv[1:]
s = socket.socket(socket.AF_UNIX) if len(where) == 1 else socket.socket()
try:
    s.connect(where[0] if len(where) == 1 else (where[0], int(where[1])))
except OSError as e:
    sys.exit(f"relay: {':'.join(where)}: {e}")
def up():
    while True:
        b = os.read(0, 65536)
        if not b:
            break
        s.sendall(b)
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
out = sys.stdout.buffer
while True:
    b = s.recv(65536)
    if not b:
        break
    out.write(b)
    out.flush()
"""


def relay_argv(python: str, *where: str, container: str | None = None) -> list[str]:
    """The host command that relays its stdin/stdout to `where` (a unix socket's path, or an
    address and a port), run on the host or, with `container`, by `docker exec` in that container
    (its file system, its network namespace); `python` as named there."""
    argv = [python, "-c", RELAY, *where]
    return ["docker", "exec", "-i", container, *argv] if container else argv


class RelayForwarding(Forwarding):
    """127.0.0.1:local_port here; each connection relayed by `transport.stream(argv)`. `option`:
    the command's option that picks the local port (in the error when it is taken)."""

    def __init__(self, transport: "Transport", argv: Sequence[str], local_port: int, option: str = "--port"):
        self._transport = transport
        self._argv = list(argv)
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

    def _relay(self, conn: socket.socket) -> None:
        proc = self._transport.stream(self._argv)
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
