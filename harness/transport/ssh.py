"""SSHTransport: one persistent paramiko connection per CLI command.

~/.ssh/config is honoured (HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump,
UserKnownHostsFile, HashKnownHosts), as are the agent and key files. Host keys are strict: an
unknown host is refused with its fingerprint and the flag that accepts it once; a changed key is
always refused. paramiko is imported, ~/.ssh/config parsed and the connection opened on the
first operation that needs them, so a command that only needs `local_argv` (sync, pull, exec:
bulk streams through OpenSSH) never pays for any of it (~0.1 s of imports alone).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import stat as st
import sys
import threading
import uuid
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Mapping, Sequence

from harness.errors import AuthError, ConnectError, HostKeyError, TransportError
from harness.transport import openssh
from harness.transport.base import Forwarding, OutputSink, PortForward, RemoteStat, RunResult, Transport
from harness.transport.remote_shell import remote_command

if TYPE_CHECKING:
    import paramiko

    from harness.transport import ConnectionSpec, ConnectOptions

KEEPALIVE_S = openssh.DEFAULT_KEEPALIVE_S
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


@dataclass(frozen=True)
class ResolvedHost:
    """A target after ~/.ssh/config: what paramiko actually connects to."""

    alias: str  # as written by the user (for messages)
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    proxy_jump: tuple[str, ...]  # hops, outermost first
    hash_known_hosts: bool

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH names this host in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def resolve(spec: str, ssh_config: paramiko.SSHConfig | None, extra_identity: str = "") -> ResolvedHost:
    target = openssh.SSHTarget.parse(spec)
    cfg = ssh_config.lookup(target.host) if ssh_config else {}
    identity = [os.path.expanduser(p) for p in cfg.get("identityfile", [])]
    if extra_identity:
        identity.insert(0, os.path.expanduser(extra_identity))
    jump = cfg.get("proxyjump", "")
    return ResolvedHost(
        alias=target.host,
        hostname=cfg.get("hostname", target.host),
        port=target.port or int(cfg.get("port", 22)),
        user=target.user or cfg.get("user") or _local_user(),
        identity_files=tuple(identity),
        identities_only=cfg.get("identitiesonly", "no").lower() == "yes",
        proxy_jump=tuple(h.strip() for h in jump.split(",") if h.strip()) if jump and jump.lower() != "none" else (),
        hash_known_hosts=cfg.get("hashknownhosts", "no").lower() == "yes",
    )


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def strict_host_key_policy(host_name: str, known_hosts: str, accept_new: bool, hash_names: bool) -> paramiko.MissingHostKeyPolicy:
    """Unknown key: refuse with the fingerprint, or record it once when the user said so.

    The class is defined here, at connect time, because it subclasses paramiko's policy and this
    module imports paramiko only when a connection is really opened."""
    import paramiko

    class StrictHostKeyPolicy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            if not accept_new:
                raise HostKeyError(
                    f"{host_name}: unknown host key for {hostname}: {key.get_name()} {key.fingerprint}; refusing to connect",
                    f"if that fingerprint is right, re-run with {openssh.ACCEPT_FLAG} to record it in {known_hosts}",
                )
            record_host_key(known_hosts, hostname, key, hashed=hash_names)
            sys.stderr.write(f"harness: recorded {key.get_name()} {key.fingerprint} for {hostname} in {known_hosts}\n")

    return StrictHostKeyPolicy()


def record_host_key(known_hosts: str, name: str, key: paramiko.PKey, *, hashed: bool) -> None:
    """Append one line like OpenSSH does (hashed when HashKnownHosts is on)."""
    import paramiko

    entry = paramiko.HostKeys.hash_host(name) if hashed else name
    directory = os.path.dirname(known_hosts) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        if f.tell() > 0:
            with open(known_hosts, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write("\n")
        f.write(f"{entry} {key.get_name()} {key.get_base64()}\n")


class SSHTransport(Transport):
    def __init__(self, spec: "ConnectionSpec", options: "ConnectOptions"):
        self.name = spec.name
        self.spec = spec
        self.options = options
        self.ssh_config_path = openssh.ssh_config_path(options.ssh_config)
        self._client: paramiko.SSHClient | None = None
        self._jumps: list[paramiko.SSHClient] = []
        self._sftp: paramiko.SFTPClient | None = None
        self._home: str | None = None

    # -- connection -----------------------------------------------------------------------------

    @cached_property
    def _ssh_config(self) -> paramiko.SSHConfig | None:
        """~/.ssh/config as paramiko reads it (OpenSSH reads it itself for local_argv)."""
        import paramiko

        return paramiko.SSHConfig.from_path(self.ssh_config_path) if self.ssh_config_path else None

    @cached_property
    def target(self) -> ResolvedHost:
        """What paramiko connects to, after ~/.ssh/config."""
        return resolve(self.spec.ssh, self._ssh_config, self.spec.identity_file)

    def _known_hosts_for(self, target: ResolvedHost) -> str:
        explicit = openssh.known_hosts_override(self.options.known_hosts)
        if explicit:
            return explicit
        cfg = self._ssh_config.lookup(target.alias) if self._ssh_config else {}
        files = cfg.get("userknownhostsfile", "")
        first = files.split()[0] if files else "~/.ssh/known_hosts"
        return os.path.expanduser(first)

    def open(self) -> "SSHTransport":
        """Connect now (idempotent). Every other method calls this."""
        if self._client is None:
            import paramiko

            sock = None
            hops = [resolve(h, self._ssh_config) for h in self.target.proxy_jump]
            for hop, nxt in zip(hops, [*hops[1:], self.target]):
                client = self._connect_one(hop, sock)
                self._jumps.append(client)
                try:
                    sock = client.get_transport().open_channel(
                        "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0), timeout=self.spec.connect_timeout
                    )
                except (paramiko.ChannelException, paramiko.SSHException, OSError) as e:
                    raise ConnectError(f"{self.name}: jump host {hop.alias} cannot reach {nxt.hostname}:{nxt.port}: {e}") from None
            self._client = self._connect_one(self.target, sock)
        return self

    def _connect_one(self, target: ResolvedHost, sock) -> paramiko.SSHClient:
        where = f"{self.name} ({target.describe()}{', via ' + ','.join(self.target.proxy_jump) if sock else ''})"
        import paramiko

        known_hosts = self._known_hosts_for(target)
        client = paramiko.SSHClient()
        for path in (SYSTEM_KNOWN_HOSTS, known_hosts):
            if os.path.isfile(path):
                try:
                    client.load_system_host_keys(path)  # "system": read, never rewritten by paramiko
                except (OSError, paramiko.SSHException) as e:
                    raise HostKeyError(f"{where}: cannot read known_hosts file {path}: {e}") from None
        client.set_missing_host_key_policy(
            strict_host_key_policy(self.name, known_hosts, self.options.accept_new_host_key, target.hash_known_hosts)
        )
        key_files = [p for p in target.identity_files if os.path.isfile(p)]
        timeout = self.spec.connect_timeout
        try:
            client.connect(
                target.hostname,
                port=target.port,
                username=target.user,
                key_filename=key_files or None,
                allow_agent=not target.identities_only,
                look_for_keys=not target.identities_only,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                sock=sock,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostKeyError(
                f"{where}: the host key has CHANGED: expected {e.expected_key.get_name()} {e.expected_key.fingerprint}, "
                f"got {e.key.get_name()} {e.key.fingerprint}; refusing to connect (possible man-in-the-middle)",
                f"if the host was really reinstalled, remove its old line from {known_hosts}",
            ) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise AuthError(f"{where}: a key file is encrypted and no agent holds it", "load it with ssh-add") from None
        except paramiko.AuthenticationException as e:
            client.close()
            offered = ", ".join(key_files) or "agent / default keys"
            raise AuthError(f"{where}: authentication failed: the server refused every key offered ({offered}): {e}",
                            "check identity_file in harness.toml / IdentityFile in ssh_config, or ssh-add the right key") from None
        except (socket.timeout, TimeoutError):
            client.close()
            raise ConnectError(f"{where}: connection timed out after {timeout:g} s") from None
        except socket.gaierror as e:
            client.close()
            raise ConnectError(f"{where}: cannot resolve host name {target.hostname!r}: {e.strerror}") from None
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            client.close()
            reasons = sorted({os.strerror(err.errno) if err.errno else str(err) for err in e.errors.values()})
            raise ConnectError(f"{where}: cannot connect: {'; '.join(reasons)}") from None
        except paramiko.SSHException as e:
            client.close()
            raise ConnectError(f"{where}: SSH handshake failed: {e}") from None
        except OSError as e:
            client.close()
            raise ConnectError(f"{where}: cannot connect: {e.strerror or e}") from None
        client.get_transport().set_keepalive(KEEPALIVE_S)
        return client

    @property
    def client(self) -> paramiko.SSHClient:
        return self.open()._client  # type: ignore[return-value]

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    def close(self) -> None:
        for c in [self._sftp, self._client, *reversed(self._jumps)]:
            if c is not None:
                c.close()
        self._sftp, self._client, self._jumps = None, None, []

    def _session(self) -> paramiko.Channel:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise TransportError(f"{self.name}: the SSH connection was lost")
        return transport.open_session(timeout=self.spec.connect_timeout)

    # -- commands -------------------------------------------------------------------------------

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
        command, prefix = remote_command(argv, cwd=cwd, env=env)
        chan = self._session()
        chan.exec_command(command)
        captured: dict[str, list[bytes]] = {"out": [], "err": []}

        def pump(recv, sink: OutputSink | None, key: str) -> None:
            while chunk := recv(65536):
                (captured[key].append if sink is None else sink)(chunk)

        threads = [
            threading.Thread(target=pump, args=(chan.recv, stdout, "out"), daemon=True),
            threading.Thread(target=pump, args=(chan.recv_stderr, stderr, "err"), daemon=True),
        ]
        for t in threads:
            t.start()
        payload = prefix + (stdin or b"")
        if payload:
            chan.sendall(payload)
        chan.shutdown_write()  # EOF: a command reading stdin never waits for the laptop
        try:
            finished = chan.status_event.wait(timeout)
        except KeyboardInterrupt:
            # Ctrl-C: ask sshd to deliver SIGINT to the remote program (RFC 4254 "signal"; OpenSSH
            # honours it for privilege-separated, i.e. non-root, sessions), give it a few seconds
            # to finish, then hang up. A second Ctrl-C hangs up at once.
            send_signal(chan, "INT")
            try:
                finished = chan.status_event.wait(5)
            except KeyboardInterrupt:
                finished = False
            if not finished:
                chan.close()
            raise
        if not finished:
            send_signal(chan, "KILL")
            chan.close()
            for t in threads:
                t.join(1)
            return RunResult(124, b"".join(captured["out"]), b"".join(captured["err"]) + f"timed out after {timeout:g} s\n".encode())
        for t in threads:
            t.join()
        code = chan.recv_exit_status()
        chan.close()
        return RunResult(_exit_code(code), b"".join(captured["out"]), b"".join(captured["err"]))

    def run_pty(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> int:
        command, prefix = remote_command(argv, cwd=cwd, env=env, pty=True)
        chan = self._session()
        interactive = sys.stdin.isatty()
        cols, rows = _terminal_size()
        # A PTY echoes its input: with env values to deliver, start with ECHO off and let the
        # preamble turn it back on after reading them, so secrets never reach the screen.
        _request_pty(chan, os.environ.get("TERM", "xterm-256color"), cols, rows, echo=not prefix)
        chan.exec_command(command)
        if prefix:
            chan.sendall(prefix)
        old_winch = None
        if interactive:
            import termios
            import tty

            fd = sys.stdin.fileno()
            saved = termios.tcgetattr(fd)
            old_winch = signal.signal(signal.SIGWINCH, lambda *_: chan.resize_pty(*_terminal_size()))
            tty.setraw(fd)
        try:
            _pump_pty(chan)
        finally:
            if interactive:
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)
                signal.signal(signal.SIGWINCH, old_winch)
        code = chan.recv_exit_status()
        chan.close()
        return _exit_code(code)

    def address(self) -> str:
        return self.target.hostname

    def exec_foreground(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, pty: bool = False) -> int:
        if pty or not openssh.ssh_available():
            return super().exec_foreground(argv, env=env, pty=pty)
        from harness.transport import openssh_exec

        # the warm path: the OpenSSH master; paramiko only to name a refused host key precisely
        return openssh_exec.run(self._openssh_options(), self.name, argv, env, report_host_key=self.open)

    def local_argv(self, argv: Sequence[str]) -> list[str]:
        return openssh.argv_for(openssh.with_control_path(self._openssh_options()), argv)

    def own_connection_argv(self, argv: Sequence[str]) -> list[str]:
        options = self._openssh_options()
        return openssh.argv_for(replace(options, control_path=None, extra=(*options.extra, "ControlMaster=no", "ControlPath=none")), argv)

    def forward(self, forwards: Sequence[PortForward]) -> Forwarding:
        from harness.transport.openssh_forward import OpenSSHForwarding

        return OpenSSHForwarding(self._openssh_options(), self.name, forwards)

    def _openssh_options(self) -> openssh.OpenSSHOptions:
        return openssh.options_for(self.spec, self.options)

    # -- files ------------------------------------------------------------------------------------

    def home(self) -> str:
        if self._home is None:
            self._home = self.sftp.normalize(".")
        return self._home

    def put_bytes(self, data: bytes, path: str, mode: int | None = None) -> None:
        path = self.expand(path)
        directory = os.path.dirname(path) or "."
        self._makedirs(directory)
        tmp = f"{directory}/.harness-tmp-{uuid.uuid4().hex[:12]}-{os.path.basename(path)}"
        try:
            with self.sftp.open(tmp, "wb") as f:
                f.write(data)
            if mode is not None:
                self.sftp.chmod(tmp, mode)
            self.sftp.posix_rename(tmp, path)
        except BaseException:
            try:
                self.sftp.remove(tmp)
            except OSError:
                pass
            raise

    def _makedirs(self, directory: str) -> None:
        missing = []
        d = directory
        while d not in ("", "/", "."):
            try:
                if st.S_ISDIR(self.sftp.stat(d).st_mode):
                    break
                raise NotADirectoryError(d)
            except FileNotFoundError:
                missing.append(d)
                d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                self.sftp.mkdir(d)
            except OSError:
                if self.stat(d) is None:
                    raise

    def get_bytes(self, path: str) -> bytes:
        path = self.expand(path)
        try:
            with self.sftp.open(path, "rb") as f:
                f.prefetch()
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.name}:{path}") from None

    def stat(self, path: str) -> RemoteStat | None:
        try:
            s = self.sftp.lstat(self.expand(path))
        except FileNotFoundError:
            return None
        return RemoteStat(s.st_size or 0, s.st_mode or 0, float(s.st_mtime or 0), st.S_ISDIR(s.st_mode or 0), st.S_ISLNK(s.st_mode or 0))


def _channel_request(chan: paramiko.Channel, request: str, *, want_reply: bool) -> paramiko.Message:
    """An RFC 4254 5.4 channel request for `chan`, ready for its request-specific fields (for the
    requests paramiko has no public call for, or none with the options needed here)."""
    from paramiko.common import cMSG_CHANNEL_REQUEST
    from paramiko.message import Message

    m = Message()
    m.add_byte(cMSG_CHANNEL_REQUEST)
    m.add_int(chan.remote_chanid)
    m.add_string(request)
    m.add_boolean(want_reply)
    return m


def _request_pty(chan: paramiko.Channel, term: str, cols: int, rows: int, *, echo: bool) -> None:
    """Channel.get_pty with terminal modes (RFC 4254 8: opcode 53 = ECHO, 0 = TTY_OP_END)."""
    import struct

    modes = b"" if echo else struct.pack(">BI", 53, 0)
    m = _channel_request(chan, "pty-req", want_reply=True)
    m.add_string(term)
    m.add_int(cols)
    m.add_int(rows)
    m.add_int(0)
    m.add_int(0)
    m.add_string(modes + b"\x00")
    chan._event_pending()
    chan.transport._send_user_message(m)
    chan._wait_for_event()


def send_signal(chan: paramiko.Channel, name: str) -> None:
    """RFC 4254 6.9 "signal" request (paramiko has no public call for it)."""
    from paramiko.ssh_exception import SSHException

    m = _channel_request(chan, "signal", want_reply=False)
    m.add_string(name)
    try:
        chan.transport._send_user_message(m)
    except (EOFError, OSError, SSHException):
        pass


def _exit_code(code: int) -> int:
    # paramiko reports -1 when the server sent no exit status (killed by a signal it did not name)
    return 255 if code < 0 else code


def _terminal_size() -> tuple[int, int]:
    import shutil

    size = shutil.get_terminal_size((80, 24))
    return size.columns, size.lines


def _pump_pty(chan: paramiko.Channel) -> None:
    """Copy terminal input to the channel and channel output to the terminal until it closes."""
    stdin_fd = sys.stdin.fileno()
    out = sys.stdout.buffer
    stdin_open = True
    while True:
        watch = [chan] + ([stdin_fd] if stdin_open else [])
        try:
            ready, _, _ = select.select(watch, [], [], 0.5)
        except InterruptedError:  # SIGWINCH
            continue
        if chan in ready or chan.recv_ready():
            data = chan.recv(65536)
            if not data:
                break
            out.write(data)
            out.flush()
        if stdin_open and stdin_fd in ready:
            data = os.read(stdin_fd, 4096)
            if data:
                chan.sendall(data)
            else:
                stdin_open = False
                chan.shutdown_write()
        if chan.exit_status_ready() and not chan.recv_ready():
            break
