"""A server harness keeps running on the host while it is attached (TensorBoard, vLLM).

It runs in the stage runtime (the ML container on docker hosts) in the foreground of a
connection of its own, wrapped by `until_stdin_closes`: when harness ends (Ctrl-C, a dropped
link, a kill) that connection's stdin closes and the host stops it, so nothing is left behind on
the box. Its stderr's last lines are kept for the error that names why it ended; it is ready once
its port listens on the host or in a container there (harness.port_forward.locate).
harness.tensorboard and harness.serve subclass it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.errors import HarnessError, RemoteCommandError
from harness.port_forward import locate
from harness.transport.base import OWN, until_stdin_closes

if TYPE_CHECKING:
    from harness.runtime.base import Runtime, WrapOptions
    from harness.transport.base import Transport


class HostServer:
    """`argv` served on the host for as long as this object is open."""

    name = "server"  # in the error when it does not listen in time
    poll_s = 1.0  # between checks of its port while it starts
    stop_timeout_s = 15.0  # for the host to stop it once stdin closes

    def __init__(self, transport: "Transport", runtime: "Runtime", argv: list[str], port: int, stdout: bool = False,
                 options: "WrapOptions | None" = None):
        self.port = port
        # where it listens: in its container on docker hosts, never the host's loopback (anyone's)
        self.containers_only = runtime.uses_image
        self._tail: list[str] = []
        # a connection of its own: the server outlives the other commands of this CLI call
        wrapped = runtime.wrap(until_stdin_closes(argv), *([options] if options else []))
        self._proc = transport.stream(wrapped, channel=OWN, stdout=stdout, on_stderr_line=self._keep)

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

    def wait_listening(self, transport: "Transport", python: str, timeout: float, each_poll: Callable[[], None] | None = None) -> None:
        """Until the port answers on the host (or in a container there); `ended()` if it exits
        first. `each_poll` runs before every check (e.g. to hand on what the server said)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if each_poll is not None:
                each_poll()
            if not self.alive():
                raise self.ended()
            if locate(transport, python, [self.port], self.containers_only).get(self.port):
                return
            time.sleep(self.poll_s)
        raise RemoteCommandError(f"{self.name} (not listening on port {self.port} after {timeout:.0f} s)", -1, "\n".join(self._tail))

    def close(self) -> None:
        self._proc.end_by_stdin(self.stop_timeout_s)

    def __enter__(self) -> "HostServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
