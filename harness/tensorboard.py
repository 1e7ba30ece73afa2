"""`harness tensorboard HOST [RUN]`: TensorBoard started on the host, in the runtime where the
stages run (the ML container on docker hosts), over a run's training-logger directory, and
forwarded here (harness.relay_forward).

It listens on a unix socket in a directory of its own (0700, made by the launcher, which fails if
the name exists), never on a TCP port: TensorBoard has no authentication, and any local user of
the box reaches a TCP port, loopback included. This machine reaches it through a relay per
connection (docs/security.md). It runs in the foreground of a connection of its own and reads that connection's stdin: when
harness ends (Ctrl-C, a dropped link, a kill), the stdin closes and the host stops TensorBoard,
so nothing is left behind on the box.
"""

from __future__ import annotations

import posixpath
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import RemoteCommandError, UsageError
from harness.host_server import HostServer
from harness.relay_forward import relay_argv
from harness.run_pull import LOGGERS_DIR, recorded_pipeline, stage_output

if TYPE_CHECKING:
    from harness.config import Config
    from harness.host import Host
    from harness.runtime.base import Runtime
    from harness.transport.base import Transport

DEFAULT_PORT = 6006
START_TIMEOUT_S = 180.0
READY = "harness-tensorboard-ready"

# TensorBoard served on a unix socket: argv[1] the directory to make (0700; an existing one is
# refused), argv[2] the log directory. Prints READY once the socket listens; a SIGTERM (the end of
# until_stdin_closes) removes the directory. --load_fast=false: the fast loader is a second server,
# on a loopback TCP port.
LAUNCHER = r"""
import os, shutil, signal, sys
directory, logdir = sys.argv[1], sys.argv[2]
from tensorboard import program
from werkzeug import serving
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
os.mkdir(directory, 0o700)
try:
    path = os.path.join(directory, "tensorboard.sock")
    class Server(serving.ThreadedWSGIServer, program.TensorBoardServer):
        def __init__(self, app, flags):
            serving.ThreadedWSGIServer.__init__(self, "unix://" + path, 0, app)
        def get_url(self):
            return "unix:" + path
        def print_serving_message(self):
            print(READY, flush=True)
    class Board(program.TensorBoard):
        def _register_info(self, server):
            pass  # no info file in /tmp for `tensorboard --list`: nothing to connect to
    board = Board(server_class=Server)
    board.configure(argv=[None, "--logdir", logdir, "--load_fast", "false"])
    sys.exit(board.main())
finally:
    shutil.rmtree(directory, ignore_errors=True)
""".replace("READY", repr(READY))


@dataclass(frozen=True)
class TensorBoardOptions:
    run_id: str | None = None  # None: the configured pipeline's logger directory (every run that trained there)


def logs_dir(config: "Config", transport: "Transport", workdir: str, run_id: str | None) -> str:
    """The training-logger directory of a run (from its record), or of the configured pipeline."""
    import json

    pipeline = config.pipeline
    if run_id:
        path = f"{workdir}/runs/{run_id}/run.json"
        try:
            pipeline = recorded_pipeline(json.loads(transport.get_bytes(path)))
        except FileNotFoundError:
            raise UsageError(f"no run record {path}") from None
    return posixpath.join(stage_output(pipeline, "train", workdir), LOGGERS_DIR)


class RemoteTensorBoard(HostServer):
    """TensorBoard on the host for as long as this object is open, on a unix socket."""

    name = "tensorboard"

    def __init__(self, transport: "Transport", runtime: "Runtime", logdir: str):
        from harness.runtime.base import WrapOptions

        token = secrets.token_hex(8)
        directory = f"/tmp/harness-tensorboard-{token}"
        self.socket = f"{directory}/tensorboard.sock"
        self._python = runtime.python
        # a named container on docker hosts: the relay reaches its socket by `docker exec`
        self.container = f"harness-tensorboard-{token}" if runtime.uses_image else None
        argv = [runtime.python, "-c", LAUNCHER, directory, logdir]
        super().__init__(transport, runtime, argv, stdout=True, options=WrapOptions(name=self.container))

    def relay_argv(self) -> list[str]:
        """The host command that relays a connection to the socket (in the container: docker exec)."""
        return relay_argv(self._python, self.socket, container=self.container)

    def wait_ready(self, timeout: float) -> None:
        """Until the launcher says the socket listens; `ended()` if it exits first."""
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
