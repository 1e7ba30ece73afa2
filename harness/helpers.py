"""One way to call a host helper (harness/host_helpers/*.py, standard library only).

Shipped one way: the helper's source travels on stdin ahead of the request, read by a one-line
bootstrap (`python -c BOOT NAME SIZE`), so nothing is installed on the host and a helper runs
wherever a python does. Started one way: on the host's python, in the stage environment (`where`
is a runtime) or in a running container of it (`inside`). One wire format: the request is ONE
JSON line on stdin after the source, so secret values never reach a command line; a streaming
helper's bytes follow it on the same stdin (`start`). The reply is its stdout and its exit code
(0 done, 2 no such thing, else failed). Every call is one process the transport starts and owns.
Nothing else builds a helper's command line (tests/test_helpers.py).

The bootstrap, the pythons and the wire in detail: docs/architecture/host-helpers.md, helpers.py.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from harness import host_helpers
from harness.errors import RemoteCommandError
from harness.transport.base import SHARED, RunResult
from harness.transport.remote_shell import ENV_PREAMBLE, env_payload

if TYPE_CHECKING:
    from harness.runtime.base import Runtime, WrapOptions
    from harness.transport.base import Transport
    from harness.transport.process import RemoteProcess

# Reads the helper's source (argv: its name, its size in bytes) from stdin and runs it as
# __main__; what follows on stdin is the request (and a streaming helper's stream).
BOOT = ("import sys; n = sys.argv[1]; s = sys.stdin.buffer.read(int(sys.argv[2])); sys.argv = [n]; "
        "exec(compile(s, n, 'exec'), {'__name__': '__main__', '__file__': n})")
# `python -S -c BOOT NAME SIZE` with the host's interpreter ($1).
_ON_HOST = f'py=$1; shift; {host_helpers.SYSTEM_PYTHON_SH}; exec "$py" -S -c "$@"'


@dataclass(frozen=True)
class HelperResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def error(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()

    def json(self) -> Any:
        return json.loads(self.stdout)

    def checked(self, what: str) -> "HelperResult":
        """This result, or RemoteCommandError when the helper did not exit 0."""
        if self.exit_code != 0:
            raise RemoteCommandError(what, self.exit_code, self.error)
        return self


def argv(name: str, *, python: str = "python3", where: "Runtime | None" = None, options: "WrapOptions | None" = None,
         inside: str | None = None) -> list[str]:
    """The host argv that starts helper `name` (e.g. "supervisor.py") on the host's python, or
    in the stage environment of runtime `where` (with its WrapOptions `options`), or, with
    `inside`, in that running container of `where` (a HostServer's: Runtime.exec_in). Its stdin:
    payload(name, request)."""
    if where is not None and inside is not None:
        return where.exec_in(inside, command(name, where.python))
    if where is not None:
        return where.foreground(command(name, where.python), *([options] if options is not None else []))
    return ["sh", "-c", _ON_HOST, "sh", python, BOOT, name, str(len(_source(name)))]


def command(name: str, python: str) -> list[str]:
    """Helper `name`'s command line in an environment that `python` names, for a caller that
    wraps it itself (a HostServer: the runtime's wrap around its lifeline). Its stdin:
    payload(name, request)."""
    return [python, "-c", BOOT, name, str(len(_source(name)))]


def payload(name: str, request: dict[str, Any]) -> bytes:
    """What the helper reads on stdin: its source, then the request as one JSON line (json.dumps
    escapes every newline inside it: the line's end is the request's end)."""
    return _source(name) + json.dumps(request).encode() + b"\n"


def _source(name: str) -> bytes:
    return host_helpers.source(name).encode()


def start(transport: "Transport", name: str, request: dict[str, Any], *, python: str = "python3", where: "Runtime | None" = None,
          options: "WrapOptions | None" = None, env: dict[str, str] | None = None, connection: str = SHARED,
          before: Sequence[str] = (), inside: str | None = None) -> "RemoteProcess":
    """Start helper `name` with `request` (its payload already written) and leave its stdin open:
    what the caller writes next is the helper's stream, after the request line; closing stdin
    ends it. The caller reads stdout and takes the exit (RemoteProcess.error types a failure).
    `connection`: Transport.stream's (OWN: a connection of its own, for parallel bulk streams).
    `before`: an argv run first on the host that ends by exec'ing the arguments after its own
    (`exec "$@"`), which are the helper's command line: e.g. sync's `cat` of the manifest, so the
    laptop plans while the interpreter starts. `env`: as for `call`. `inside`: as for `argv`
    (a relay into a server's container)."""
    proc, data = _launch(transport, name, request, python, where, options, env, connection, before, inside)
    try:
        proc.stdin.write(data)
    except OSError:
        pass  # it ended before reading: the caller's next write or read finds out, its exit and stderr say why
    return proc


def _launch(transport: "Transport", name: str, request: dict[str, Any], python: str, where: "Runtime | None", options: "WrapOptions | None",
            env: dict[str, str] | None, connection: str = SHARED, before: Sequence[str] = (),
            inside: str | None = None) -> tuple["RemoteProcess", bytes]:
    """The started process and what its stdin must get first (a runtime's env values, then the payload)."""
    host_argv, prefix = [*before, *argv(name, python=python, where=where, options=options, inside=inside)], b""
    if env:
        host_argv, prefix = ["sh", "-c", ENV_PREAMBLE, "sh", *host_argv], env_payload(env)
    proc = transport.stream(host_argv, connection=connection)  # the transport owns the client process and types its failures
    return proc, prefix + payload(name, request)


def call(transport: "Transport", name: str, request: dict[str, Any], *, python: str = "python3", where: "Runtime | None" = None,
         options: "WrapOptions | None" = None, env: dict[str, str] | None = None, stdout: Callable[[bytes], None] | None = None,
         timeout: float | None = None) -> HelperResult:
    """Run helper `name` with `request` and wait for it. `stdout`: a sink that receives the
    reply as it streams (then the result's stdout is empty). `env`: values the helper's
    environment gets (a runtime's stage env; sent ahead of the request on stdin, as
    transport/remote_shell.py does, never on a command line). After `timeout` seconds the
    call ends with exit code 124. The link's own failure (unknown host key, refused login,
    unreachable; an unknown host key names its fingerprint) is raised, typed by the transport;
    the helper's exit code is returned."""
    proc, data = _launch(transport, name, request, python, where, options, env)
    timed_out = threading.Event()

    def end() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout, end) if timeout else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    out: list[bytes] = []
    try:
        try:
            proc.stdin.write(data)  # (under the timeout: a helper that never reads cannot hold the call)
            proc.stdin.close()
        except OSError:
            pass  # it ended before reading: its exit code and stderr say why
        while chunk := proc.stdout.read(65536):
            (out.append if stdout is None else stdout)(chunk)
        code = proc.wait()
    except BaseException:  # Ctrl-C while a stream is followed: end the client, leave the host alone
        proc.kill()
        proc.wait()
        raise
    finally:
        if timer is not None:
            timer.cancel()
    stderr = proc.stderr_text().encode()
    if timed_out.is_set():
        return HelperResult(124, b"".join(out), stderr + f"timed out after {timeout:g} s\n".encode())
    if code == 255:
        error = proc.error(f"{name} on {transport.name}")
        if not isinstance(error, RemoteCommandError):  # the link's own failure, typed by the transport
            raise error
    return HelperResult(code, b"".join(out), stderr)


COMMANDS = "commands.py"


class Prefetched:
    """transport.run's answers for host commands known ahead, asked in ONE helper call
    (host_helpers/commands.py, on the same client path as every other helper call): a run's
    start hands it to docker's image check and the GPU probe in place of the transport, so they
    cost one round trip and no second client. `home_token` in an argument is the home directory
    (put in on the host). The commands stop at the first that fails. An argv not asked ahead (an
    error path's follow-up, e.g. preflight's engine limit) goes to the transport itself."""

    def __init__(self, transport: "Transport", argvs: list[list[str]], *, python: str = "python3", home_token: str | None = None):
        self.transport = transport
        request = {"commands": argvs, "home_token": home_token, "stop_on_failure": True}
        reply = call(transport, COMMANDS, request, python=python).checked(f"{COMMANDS} on {transport.name}").json()
        self.home: str = reply["home"]
        self._answers = {
            tuple(argv): RunResult(r["exit_code"], r["stdout"].encode("utf-8", "surrogateescape"), r["stderr"].encode("utf-8", "surrogateescape"))
            for argv, r in zip(argvs, reply["results"])
        }

    def run(self, argv, **kwargs):
        answer = None if kwargs else self._answers.get(tuple(argv))
        return answer if answer is not None else self.transport.run(argv, **kwargs)
