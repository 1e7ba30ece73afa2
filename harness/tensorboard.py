"""`harness tensorboard HOST [RUN]`: TensorBoard started on the host, in the runtime where the
stages run (the ML container on docker hosts), over a run's training-logger directory, and
forwarded here (harness.relay_forward).

It listens on a unix socket in a directory of its own (0700, made by the host helper
tensorboard_server.py, which fails if the name exists), never on a TCP port: TensorBoard has no
authentication, and any local user of the box reaches a TCP port, loopback included. This machine
reaches it through a relay per connection (docs/security.md). It runs in the foreground of a
connection of its own and reads that connection's stdin: when harness ends (Ctrl-C, a dropped
link, a kill), the stdin closes and the host stops TensorBoard, so nothing is left behind on the
box.
"""

from __future__ import annotations

import posixpath
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness import helpers
from harness.errors import RemoteCommandError, UsageError
from harness.host_server import HostServer
from harness.relay_forward import Relay
from harness.pipeline import store_root
from harness.run_pull import LOGGERS_DIR, read_record, run_outputs
from harness.runtime.base import WrapOptions

if TYPE_CHECKING:
    from harness.config import Config
    from harness.host import Host
    from harness.runtime.base import Runtime
    from harness.transport.base import Transport

DEFAULT_PORT = 6006
START_TIMEOUT_S = 180.0
READY = "harness-tensorboard-ready"

# The host helper that serves TensorBoard on a unix socket in a directory it makes (0700; an
# existing one is refused), says READY once it listens and removes the directory when the lifeline
# ends it.
SERVER = "tensorboard_server.py"


@dataclass(frozen=True)
class TensorBoardOptions:
    run_id: str | None = None  # None: the configured pipeline's logger directory (every run that trained there)


def logs_dir(config: "Config", transport: "Transport", workdir: str, run_id: str | None) -> str:
    """The training-logger directory of a run's draft (its train artifact, from its record), or
    every draft's of the store (each trained draft's logs below it)."""
    if not run_id:
        root = store_root(config.pipeline)
        return posixpath.join(root if root.startswith("/") else posixpath.join(workdir, root), "train")
    checkpoints = run_outputs(read_record(transport, workdir, run_id), workdir)[0]["train"]
    if checkpoints is None:
        raise UsageError(f"run {run_id} trained no draft and read none: name a run with a train stage")
    return posixpath.join(checkpoints, LOGGERS_DIR)


class RemoteTensorBoard(HostServer):
    """TensorBoard on the host for as long as this object is open, on a unix socket."""

    name = "tensorboard"

    def __init__(self, transport: "Transport", runtime: "Runtime", logdir: str):
        token = secrets.token_hex(8)
        directory = f"/tmp/harness-tensorboard-{token}"
        self.socket = f"{directory}/tensorboard.sock"
        self._runtime = runtime
        # a named container on docker hosts: the relay reaches its socket by `docker exec`
        self.container = f"harness-tensorboard-{token}" if runtime.uses_image else None
        request = {"directory": directory, "logdir": logdir, "ready": READY}
        super().__init__(transport, runtime, helpers.command(SERVER, runtime.python), stdout=True,
                         options=WrapOptions(name=self.container), payload=helpers.payload(SERVER, request))

    def relay(self) -> Relay:
        """What relays a connection to the socket (in the container: docker exec)."""
        return Relay(self._runtime, self.socket, container=self.container)

    def wait_ready(self, timeout: float) -> None:
        """Until the helper says the socket listens; `ended()` if it exits first."""
        import threading

        first: list[bytes] = []
        said = threading.Event()

        def read() -> None:  # the first line, then the rest drained (a full pipe would stall it)
            for line in self._proc.stdout_lines():
                if not said.is_set():
                    first.append(line)
                    said.set()
            said.set()

        threading.Thread(target=read, daemon=True).start()
        if not said.wait(timeout):
            raise RemoteCommandError(f"{self.name} (not listening after {timeout:.0f} s)", -1, "\n".join(self._tail))
        if first[:1] != [READY.encode() + b"\n"]:
            raise self.ended()

    def ended(self) -> Exception:
        error = super().ended()
        # TensorBoard's own last words (the remote command's stderr, not the client's)
        if isinstance(error, RemoteCommandError) and "No module named 'tensorboard'" in self.last_words():
            return UsageError("tensorboard is not installed where the stages run: install it there (docker hosts: "
                              "harness build, the ML image carries it)")
        return error


def check_logs(transport: "Transport", logdir: str) -> None:
    if transport.stat(logdir) is None:
        raise UsageError(f"no training logs at {logdir}: train with loggers = [\"tensorboard\"] in [pipeline.stages.train]")


def start(on: "Host", options: TensorBoardOptions) -> tuple[RemoteTensorBoard, str]:
    """TensorBoard listening on the host over the logs; returns it (close it) and its log directory."""
    transport, runtime = on.transport, on.runtime
    logdir = logs_dir(on.config, transport, runtime.workdir, options.run_id)
    check_logs(transport, logdir)
    board = RemoteTensorBoard(transport, runtime, logdir)
    try:
        board.wait_ready(START_TIMEOUT_S)
    except BaseException:
        board.close()
        raise
    return board, logdir
