"""`harness serve HOST [RUN]`: a run's exported draft served by vLLM on the host, in the runtime
where the stages run (the ML container on docker hosts), forwarded here, with vLLM's served
acceptance shown as it changes.

The host runs remote_scripts/serve_draft.py as a harness.host_server.HostServer, as
harness.tensorboard runs TensorBoard: when harness ends, the connection's stdin closes and the
script stops vLLM, so nothing is left behind on the box. vLLM listens on a unix socket in a 0700
directory, never on a TCP port of the box; this machine reaches it through a relay per connection
(harness.relay_forward). Its API key is made here per serve and never put on a command line
(ServedKey).

The socket, the shutdown and the key in detail: docs/architecture/wings.md (serve.py), docs/security.md.
"""

from __future__ import annotations

import json
import os
import posixpath
import queue
import re
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.errors import RemoteCommandError, UsageError
from harness.events import Artifact, Finished, Message, Metric, parse
from harness.host_server import HostServer
from harness.relay_forward import Relay, RelayForwarding
from harness.run_pull import read_record, run_outputs
from harness.runtime.base import WrapOptions
from harness.stages import SCRIPTS_DIR

if TYPE_CHECKING:
    from harness.host import Host
    from harness.runtime.base import Runtime
    from harness.transport.base import Forwarding, Transport

SCRIPT = f"{SCRIPTS_DIR}/serve_draft.py"
STOP_GRACE_S = 30.0  # serve_draft's --stop-grace: SIGTERM to vLLM's group, then SIGKILL
READY = "ready after"  # how serve_draft.py's message says vLLM proved itself ours and answers


@dataclass(frozen=True)
class ServeRequest:
    run_id: str
    local_port: int = 8000  # where this machine reaches it; bound before vLLM loads
    start_timeout_s: float = 1800.0  # a large verifier loads for many minutes
    vllm_args: tuple[str, ...] = field(default_factory=tuple)  # more `vllm serve` flags


SOCKET_RE = re.compile(r"^/tmp/harness-serve-[A-Za-z0-9_]+/vllm\.sock$")  # serve_draft.py's, by common/vllm_server.private_socket


def serve_dir_of(workdir: str, output_dir: str) -> str:
    """Where harness serve hands its key over and vLLM logs: <output_dir>/serve on the host."""
    out = output_dir.rstrip("/")
    return posixpath.join(out if out.startswith("/") else posixpath.join(workdir, out), "serve")


def private_dir(transport: "Transport", path: str) -> str:
    """`path` on the host, made (or made again) 0700: a secret written into it is never another uid's."""
    transport.check(["sh", "-c", 'mkdir -p -- "$1" && chmod 700 -- "$1"', "sh", path])
    return path


def export_dir(transport: "Transport", workdir: str, run_id: str) -> str:
    """The draft the run's export stage made or reused (its artifact, from the run's record),
    checked to exist."""
    export = run_outputs(read_record(transport, workdir, run_id), workdir)[0]["export"]
    if export is None:
        raise UsageError(f"run {run_id} has no export stage: run one (harness run HOST export), then serve that run")
    if transport.stat(posixpath.join(export, "config.json")) is None:
        raise UsageError(f"run {run_id} has no export at {export}: run the export stage first (harness run HOST export)")
    return export


def served_line(metric: Metric) -> str | None:
    """A metric event of serve_draft.py as one line, or None when it is not one."""
    m = metric.metrics
    if not isinstance(m.get("served_tau"), (int, float)):
        return None
    positions = [m[k] for k in sorted((k for k in m if k.startswith("served_acceptance_")), key=lambda k: int(k.rsplit("_", 1)[1]))]
    return (f"served tau {m['served_tau']:.2f} over {m.get('drafts')} drafts; acceptance per position "
            + " ".join(f"{a:.2f}" for a in positions))


class ServedKey:
    """A served vLLM's API key: on this machine in a 0600 file (`path`) until close()."""

    def __init__(self) -> None:
        self.value = secrets.token_urlsafe(32)
        fd, self.path = tempfile.mkstemp(prefix="harness-serve-key-")  # 0600
        with os.fdopen(fd, "w") as f:
            f.write(self.value + "\n")

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class RemoteServer(HostServer):
    """serve_draft.py on the host for as long as this object is open; its events in a queue."""

    name = "vllm serve"
    poll_s = 2.0
    stop_timeout_s = STOP_GRACE_S + 30  # the host stops the script, which stops vLLM

    def __init__(self, transport: "Transport", runtime: "Runtime", export: str, request: ServeRequest, key: ServedKey, output_dir: str):
        token = secrets.token_hex(8)
        serve_dir = private_dir(transport, serve_dir_of(runtime.workdir, output_dir))
        handed = posixpath.join(serve_dir, f".api-key-{token}")
        transport.put_bytes(key.value.encode(), handed, mode=0o600)  # in a 0700 directory; serve_draft.py reads and removes it
        self.key = key
        self.socket = ""  # serve_draft.py makes its directory (a random name, 0700) and says where: _read_events
        self._socket_known = threading.Event()
        self._transport = transport
        self._runtime = runtime
        # a named container on docker hosts: the relay reaches its socket by `docker exec`
        self.container = f"harness-serve-{token}" if runtime.uses_image else None
        argv = [runtime.python, SCRIPT, "--export", export, "--api-key-file", handed, "--private-socket",
                "--log", posixpath.join(serve_dir, f"vllm-harness-serve-{token}.log"),
                "--health-timeout", str(request.start_timeout_s), "--stop-grace", str(STOP_GRACE_S),
                *(f"--vllm-arg={a}" for a in request.vllm_args)]
        self.events: "queue.Queue[object]" = queue.Queue()
        self.forwarding: "Forwarding | None" = None
        super().__init__(transport, runtime, argv, stdout=True, options=WrapOptions(name=self.container))
        threading.Thread(target=self._read_events, daemon=True).start()

    def reach_from(self, local_port: int) -> None:
        """vLLM reached from this machine's loopback (local_port) until close(): `url`. The port
        is bound now (a taken one is a UsageError before vLLM loads); its connections go to the
        socket once serve_draft.py has said where it is (`where`: its socket, in which container)."""
        self.forwarding = RelayForwarding(self._transport, Relay(self._runtime, self.socket, container=self.container), local_port)
        host, port = self.forwarding.addresses[0]
        self.url = f"http://{host}:{port}"

    @property
    def where(self) -> str:
        return f"unix socket {self.socket}" + (f" in container {self.container}" if self.container else "")

    def _on_socket(self, path: str) -> None:
        """serve_draft.py's socket: a path of the form private_socket makes, else refused."""
        if not SOCKET_RE.match(path):
            self._tail.append(f"harness: serve_draft.py named {path!r} as its socket, not a directory of its own; refused")
            return
        self.socket = path
        if self.forwarding is not None:
            self.forwarding.retarget(Relay(self._runtime, path, container=self.container))
        self._socket_known.set()

    def _read_events(self) -> None:
        for raw in self._proc.stdout_lines():
            try:
                event = parse(json.loads(raw))
            except ValueError:
                continue
            if isinstance(event, Artifact) and event.kind == "socket":
                self._on_socket(event.path)
            elif event is not None:
                self.events.put(event)

    def failure(self) -> str:
        """Why it ended: the script's failed event, else its stderr's last line."""
        said = self.last_words()
        while not self.events.empty():
            event = self.events.get()
            if isinstance(event, Finished) and event.failed:
                return event.error or "failed"
        return said or f"exit status {self._proc.returncode}"

    def ended(self) -> Exception:
        error = super().ended()
        if not isinstance(error, RemoteCommandError):
            return error  # the connection's own failure, typed by the transport
        return RemoteCommandError("serve_draft.py", self._proc.returncode, self.failure())

    def close(self) -> None:
        if self.forwarding is not None:
            self.forwarding.close()
        super().close()
        self.key.close()

    def wait_ready(self, timeout: float, on_event=None) -> None:
        """Until serve_draft.py says vLLM is ready: it proved the server is the one it started
        (common/vllm_server.py), which a port that merely answers does not; `ended()` if it exits
        first. The other events go to on_event."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=self.poll_s)
            except queue.Empty:
                if not self.alive() and self.events.empty():
                    raise self.ended() from None
                continue
            if on_event is not None:
                on_event(event)
            if isinstance(event, Message) and event.text.startswith(READY):
                if not self._socket_known.wait(self.poll_s * 5):
                    raise RemoteCommandError(f"{self.name} (ready, but it never said where its socket is)", -1, "\n".join(self._tail))
                return
        raise RemoteCommandError(f"{self.name} (not ready after {timeout:.0f} s)", -1, "\n".join(self._tail))


def start(on: "Host", request: ServeRequest, on_event=None) -> tuple[RemoteServer, str]:
    """The draft of request.run_id served on the host and reached from request.local_port here;
    returns it (close it) and the export. The local port is bound first: a taken one fails before
    vLLM loads."""
    transport, runtime = on.transport, on.runtime
    export = export_dir(transport, runtime.workdir, request.run_id)
    key = ServedKey()
    try:
        server = RemoteServer(transport, runtime, export, request, key, on.config.pipeline.output_dir)
    except BaseException:
        key.close()
        raise
    try:
        server.reach_from(request.local_port)
        server.wait_ready(request.start_timeout_s, on_event)
    except BaseException:
        server.close()
        raise
    return server, export
