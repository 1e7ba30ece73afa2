"""`harness tensorboard HOST [RUN]`: TensorBoard started on the host, in the runtime where the
stages run (the ML container on docker hosts), over a run's training-logger directory, and
forwarded here (harness.port_forward).

It runs in the foreground of a connection of its own and reads that connection's stdin: when
harness ends (Ctrl-C, a dropped link, a kill), the stdin closes and the host stops TensorBoard,
so nothing is left behind on the box.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import RemoteCommandError, UsageError
from harness.host_server import HostServer
from harness.port_forward import locate
from harness.run_pull import LOGGERS_DIR, recorded_pipeline, stage_output

if TYPE_CHECKING:
    from harness.config import Config, HostConfig
    from harness.runtime.base import Runtime
    from harness.transport.base import Transport

DEFAULT_PORT = 6006
START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class TensorBoardOptions:
    port: int = DEFAULT_PORT  # on the host (inside the container on docker hosts)
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
    """TensorBoard on the host for as long as this object is open."""

    name = "tensorboard"

    def __init__(self, transport: "Transport", runtime: "Runtime", logdir: str, port: int):
        argv = [runtime.python, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port), "--host", runtime.server_bind_address]
        super().__init__(transport, runtime, argv, port)

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


def start(config: "Config", host: "HostConfig", transport: "Transport", options: TensorBoardOptions) -> tuple[RemoteTensorBoard, str]:
    """TensorBoard listening on the host over the logs; returns it (close it) and its log directory."""
    from harness.runtime import runtime_for

    runtime = runtime_for(host, transport)
    logdir = logs_dir(config, transport, runtime.workdir, options.run_id)
    check_logs(transport, logdir)
    taken = locate(transport, host.python, [options.port]).get(options.port)
    if taken:
        raise UsageError(f"{host.name}: port {options.port} is taken already ({taken['where']}: another TensorBoard?): pass --port")
    board = RemoteTensorBoard(transport, runtime, logdir, options.port)
    try:
        board.wait_listening(transport, host.python, START_TIMEOUT_S)
    except BaseException:
        board.close()
        raise
    return board, logdir
