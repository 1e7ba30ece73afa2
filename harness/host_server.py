"""A server harness keeps running on the host while it is attached (TensorBoard, vLLM).

It runs in the stage runtime (the ML container on docker hosts) in the foreground of a
connection of its own, wrapped by `until_stdin_closes`: when harness ends (Ctrl-C, a dropped
link, a kill) that connection's stdin closes, or its beat stops (a stalled link), and the host
stops it, so nothing is left behind on the box. Its stderr's last lines are kept for the error
that names why it ended. It says itself when it is ready (a line on its stdout). On docker hosts it runs in a named container of its own
and listens there only (a unix socket in the container's file system, or the loopback of the
container's network namespace), which `docker exec` alone reaches: harness.relay_forward relays
each connection that way. harness.tensorboard and harness.serve subclass it.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from harness.errors import HarnessError
from harness.transport.base import HEARTBEAT_S, OWN, until_stdin_closes

if TYPE_CHECKING:
    from harness.runtime.base import Runtime, WrapOptions
    from harness.transport.base import Transport


class HostServer:
    """`argv` served on the host for as long as this object is open."""

    name = "server"  # in the error when it does not start in time
    stop_timeout_s = 15.0  # for the host to stop it once stdin closes

    def __init__(self, transport: "Transport", runtime: "Runtime", argv: list[str], stdout: bool = False,
                 options: "WrapOptions | None" = None, payload: bytes = b""):
        """`payload`: argv's stdin, written ahead of the beats (a host helper's source and request:
        helpers.command, helpers.payload); without one its stdin is /dev/null."""
        self._tail: list[str] = []
        # a connection of its own: the server outlives the other commands of this CLI call
        wrapped = runtime.foreground(until_stdin_closes(argv, given=len(payload)), *([options] if options else []))
        self._proc = transport.stream(wrapped, connection=OWN, stdout=stdout, on_stderr_line=self._keep)
        if payload:
            try:
                self._proc.stdin.write(payload)
            except OSError:
                pass  # it ended before reading: ended() says why
        self._closing = threading.Event()
        self._stdin_lock = threading.Lock()  # a beat is never written into a closing pipe
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        """The lifeline's beat (until_stdin_closes): a byte every HEARTBEAT_S while open."""
        while not self._closing.wait(HEARTBEAT_S):
            with self._stdin_lock:
                if self._closing.is_set():
                    return
                try:
                    self._proc.stdin.write(b"\n")
                except OSError:  # the connection ended: its error is the caller's to read
                    return

    def _keep(self, line: str) -> None:
        self._tail = (self._tail + [line.strip()])[-20:]

    def alive(self) -> bool:
        return self._proc.poll() is None

    def last_words(self) -> str:
        """Its stderr's last non-empty line, once it ended (waits a moment for the last lines)."""
        time.sleep(0.2)
        return next((line for line in reversed(self._tail) if line), "")

    def ended(self) -> HarnessError:
        """The error for a server that ended before it listened: the connection's own failure
        (typed by the transport: host key, auth, unreachable), else its exit and last words."""
        return self._proc.error(self.name)

    def close(self) -> None:
        self._closing.set()
        with self._stdin_lock:
            self._proc.end_by_stdin(self.stop_timeout_s)

    def __enter__(self) -> "HostServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
