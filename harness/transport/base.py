"""The transport interface: how the laptop reaches one host.

Everything above this layer (sync, pull, runtimes, jobs, inspect, doctor) talks to a host only
through a `Transport`, so the embedded default (LocalTransport) and a GPU box (SSHTransport) run
the same code path.

Commands are argument vectors, never shell strings: the transport quotes them for the remote
shell in one place (`quote_argv`). Where a pipeline or redirection is really needed, callers pass
`["sh", "-c", script, "sh", *args]` and keep user data in the positional args.
"""

from __future__ import annotations

import abc
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from harness.errors import HarnessError, RemoteCommandError
from harness.transport.remote_shell import quote_argv  # noqa: F401 (re-exported: the one place argv becomes a shell line)

if TYPE_CHECKING:
    from harness.transport.process import RemoteProcess, StderrLine

# A sink for streamed output: called with each chunk as it arrives.
OutputSink = Callable[[bytes], None]

# Transport.stream's connection=: the host's shared connection, or one of its own.
SHARED = "shared"
OWN = "own"


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: bytes = b""  # empty when stdout was streamed to a sink
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class PortForward:
    """A port of this machine's loopback that reaches remote_host:remote_port as the host sees it."""

    local_port: int
    remote_port: int
    remote_host: str = "127.0.0.1"


class Forwarding(abc.ABC):
    """Open port forwards: `addresses` says where each PortForward is reached from here (in
    order); wait() blocks until they end (Ctrl-C, or the connection drops), close() ends them."""

    addresses: list[tuple[str, int]]

    @abc.abstractmethod
    def wait(self) -> None: ...

    def close(self) -> None:  # noqa: B027 - nothing to end where nothing was opened
        pass

    def __enter__(self) -> "Forwarding":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class RemoteStat:
    size: int
    mode: int  # st_mode, with the file type bits
    mtime: float
    is_dir: bool
    is_link: bool


def _live(stream) -> OutputSink:
    def write(chunk: bytes) -> None:
        stream.write(chunk)
        stream.flush()

    return write


class Transport(abc.ABC):
    """One host. Open once per CLI command and reuse for every operation (`with connect(...)`)."""

    #: the configured host name, for messages
    name: str
    #: stdio_forward_argv gives a command line (the host's ports are reachable from here)
    forwards_tcp: bool = False

    # -- commands -------------------------------------------------------------------------------

    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        timeout: float | None = None,
    ) -> RunResult:
        """Run argv on the host and wait for it.

        stdout/stderr: None captures into the result; a sink receives chunks live, in order.
        env: extra variables for this command. Their values never appear on a command line
        (remote `ps`, sshd logs) nor in any file: secrets travel this way.
        """

    def check(self, argv: Sequence[str], **kwargs) -> RunResult:
        """run() that raises RemoteCommandError on a non-zero exit (for our own helper commands)."""
        result = self.run(argv, **kwargs)
        if result.exit_code != 0:
            raise RemoteCommandError(quote_argv(argv), result.exit_code, result.stderr.decode("utf-8", "replace"))
        return result

    @abc.abstractmethod
    def run_pty(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> int:
        """Run argv interactively on a real PTY wired to this terminal (window size, Ctrl-C);
        return its exit code."""

    def exec_foreground(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, pty: bool = False) -> int:
        """Run argv as `harness exec` does: output live on this process's stdout/stderr (on a
        PTY wired to this terminal when pty); return its exit code. Each transport picks its
        fastest way (SSH hosts: the OpenSSH ControlMaster)."""
        if pty:
            return self.run_pty(argv, env=env)
        import sys

        return self.run(argv, env=env, stdout=_live(sys.stdout.buffer), stderr=_live(sys.stderr.buffer)).exit_code

    def remember_exec(self, key: str, wrapped_mark: Sequence[str], *, env_names_known: Sequence[str], env_names: Sequence[str],
                      also_watch: Sequence[str], started_ns: int) -> bool:
        """After exec_foreground: leave the recipe of a warm exec under `key` (transport/warm_exec.py),
        where this transport has one. wrapped_mark: the argv exec_foreground ran, with
        warm_exec.MARK for the user's argv; env_names: those whose values it passed, of
        env_names_known. Returns whether a recipe was written."""
        return False

    @abc.abstractmethod
    def local_argv(self, argv: Sequence[str]) -> list[str]:
        """A command line for THIS machine that runs argv on the host, with stdin/stdout piped
        straight through (OpenSSH for SSH hosts, argv itself for the local host). Used for bulk
        byte streams, which OpenSSH moves about twice as fast as paramiko."""

    def own_connection_argv(self, argv: Sequence[str]) -> list[str] | None:
        """local_argv over a connection of its own, not shared with other commands, or None
        where that means nothing (the local host). Streams multiplexed over one connection share
        one TCP flow and one ssh process (one core of crypto): on a long link, parallel bulk
        streams add up only over connections of their own."""
        return None

    def stdio_forward_argv(self, host: str, port: int) -> list[str] | None:
        """A command line for THIS machine whose stdin/stdout are a TCP connection to host:port
        as the host sees it (for SSH hosts: a direct-tcpip channel of the master connection,
        `ssh -W`), or None where there is none (the local host)."""
        return None

    def argv_failure(self, what: str, code: int, stderr: str) -> HarnessError:
        """The error for a local_argv / own_connection_argv process that exited `code`: the
        client's own failure, typed, where this transport can tell it (an unknown host key, a
        refused login, an unreachable host, a refused forward), else the remote command's.
        RemoteProcess.error calls it: callers outside transport/ never see ssh's stderr."""
        return RemoteCommandError(what, code, stderr)

    # -- processes this transport starts and owns -----------------------------------------------

    def stream(self, argv: Sequence[str], *, connection: str = SHARED, stdin: bool = True, stdout: bool = True,
               on_stderr_line: "StderrLine | None" = None) -> "RemoteProcess":
        """Start argv on the host with its stdin/stdout as pipes here (bulk bytes, long-lived
        helpers, servers); the handle's error(what) is the typed failure (ssh's own, else the
        command's exit). connection: SHARED (for SSH hosts a channel of the persistent master: no
        handshake) or OWN (a connection of its own: its own TCP flow and ssh process, for parallel
        bulk streams and servers that outlive other commands; SHARED where that means nothing).
        on_stderr_line: called with each line the command prints on stderr (SSH hosts: ssh's
        own words go apart, to the handle's client log)."""
        from harness.transport.process import RemoteProcess

        if connection not in (SHARED, OWN):
            raise ValueError(f"unknown connection {connection!r}")
        local = (self.own_connection_argv(argv) if connection == OWN else None) or self.local_argv(argv)
        return RemoteProcess(local, self.argv_failure, self.name, stdin=stdin, stdout=stdout, on_stderr_line=on_stderr_line)

    def stream_to(self, host: str, port: int) -> "RemoteProcess | None":
        """A stream whose stdin/stdout are a TCP connection to host:port as the host sees it (SSH
        hosts: a direct-tcpip channel of the master; a forward the sshd refuses is a
        ForwardRefusedError from error()), or None where there is none (forwards_tcp false)."""
        from harness.transport.process import RemoteProcess

        local = self.stdio_forward_argv(host, port)
        if local is None:
            return None
        return RemoteProcess(local, self.argv_failure, self.name)

    @abc.abstractmethod
    def forward(self, forwards: Sequence[PortForward]) -> Forwarding:
        """Make each remote address reachable from this machine (`harness forward`): bound on
        loopback only, through the same host-key and ProxyJump policy as every command; a local
        port that is taken is a UsageError. Returns once every forward is listening."""

    # -- files ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def put_bytes(self, data: bytes, path: str, mode: int | None = None) -> None:
        """Write a small file atomically (temporary name, then rename); parents are created."""

    @abc.abstractmethod
    def get_bytes(self, path: str) -> bytes:
        """Read a small file. Raises FileNotFoundError."""

    @abc.abstractmethod
    def stat(self, path: str) -> RemoteStat | None:
        """lstat() of path on the host, or None if it does not exist."""

    @abc.abstractmethod
    def home(self) -> str:
        """The user's home directory on the host (to expand `~` in configured paths)."""

    def address(self) -> str:
        """Where other machines reach this host: its HostName after the user's ssh_config for
        SSH hosts (a group's rendezvous address), loopback for this machine."""
        return "127.0.0.1"

    def expand(self, path: str) -> str:
        """Expand a leading `~` the way the host sees it."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    # -- lifecycle --------------------------------------------------------------------------------

    def open(self) -> "Transport":
        """Connect now, so a failure is this call's (idempotent; a no-op where there is nothing
        to open). Every other method connects on first use anyway."""
        return self

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Run "$@" until it exits, or its stdin closes, or nothing arrives on it for $1 seconds: a watcher
# reads stdin (fd 3: a background job's own stdin would be /dev/null) a byte at a time and stops it
# at the end. The silence bound needs `timeout` (coreutils, busybox); without it only a close ends
# it. SIGINT is ignored: Ctrl-C on this terminal must not end the shell before it stopped its child.
# The first $2 bytes of stdin (a host helper's payload: its source and request) are "$@"'s stdin,
# read whole before the watcher starts, so no beat is taken for them nor they for a beat (the
# `.` keeps the payload's last newline through $(...); printf is the shell's own: no command line).
_UNTIL_STDIN_CLOSES = ('trap "" INT; silence=$1; given=$2; shift 2; exec 3<&0; '
                       'if [ "$given" -gt 0 ]; then first=$(head -c "$given" <&3; echo .); printf %s "${first%.}" | "$@" & pid=$!; '
                       'else "$@" </dev/null & pid=$!; fi; '
                       '{ if command -v timeout >/dev/null; then while [ "$(timeout "$silence" head -c 1 <&3 | wc -c)" -eq 1 ]; do :; done; '
                       'else cat <&3 >/dev/null; fi; kill "$pid"; } >/dev/null 2>&1 & exec 3<&-; wait "$pid"')

# The lifeline's beat: the side that holds a server writes a byte this often, and the host stops
# the server after SILENCE_S without one. A link that stalls without closing (sshd on the box keeps
# the session: few boxes set ClientAliveInterval) then ends the server too; the laptop's ssh has
# given up by then (ServerAliveInterval, 3 unanswered).
HEARTBEAT_S = 5.0
SILENCE_S = 60


def until_stdin_closes(argv: list[str], silence_s: float = SILENCE_S, given: int = 0) -> list[str]:
    """`argv` wrapped to live only while its connection's stdin is open and beating (a served
    TensorBoard or vLLM: a dropped or stalled link or a killed harness stops it on the host; its
    holder writes a byte every HEARTBEAT_S); `end_by_stdin` ends it. `given`: the first bytes of
    stdin are argv's own (its stdin, then closed; the beats follow them), else its stdin is
    /dev/null."""
    return ["sh", "-c", _UNTIL_STDIN_CLOSES, "sh", f"{silence_s:g}", str(given), *argv]


def end_by_stdin(proc: "subprocess.Popen", timeout_s: float) -> None:
    """End a process whose remote side lives while its stdin is open (a forward, a served
    TensorBoard): close stdin, wait, terminate if it lingers."""
    if proc.poll() is not None:
        return
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()


def port_number(text: str) -> int | None:
    """A TCP port written in decimal (1-65535), or None."""
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None
