"""SSHTransport: one fabric Connection (paramiko underneath) per CLI command.

What the connection is made of comes from the same reading of the user's ssh_config as every
OpenSSH command line, `ssh -G`'s (openssh.resolve_host: HostName, User, Port, IdentityFile,
IdentitiesOnly, ProxyJump, ProxyCommand, the known_hosts files, HostKeyAlias; Match, Include and
tokens as ssh itself reads them); fabric reads no ssh_config of its own. fabric opens the ProxyJump
hops as gateways (in OpenSSH's order, first hop first) and runs PTY sessions (terminal.py).
Host keys: paramiko is given none, so every key a hop or the host presents goes to the one
decision (host_keys.decide, the OpenSSH client's too): a known key is accepted, an unknown one
refused with its fingerprint and the flag that records it once, a changed one always refused.
harness adds timeouts, and errors that say which hop failed.
fabric is imported and the connection opened on the first operation that needs them, so a
command that only needs `stream` (sync, pull: bulk streams through OpenSSH) or the warm exec
path never pays for any of it (~0.3 s of imports alone).
"""

from __future__ import annotations

import logging
import os
import stat as st
import sys
from functools import cached_property
from typing import TYPE_CHECKING, Mapping, Sequence

from harness.errors import AuthError, ConnectError, HarnessError, HostKeyError, TransportError
from harness.transport import host_keys, openssh
from harness.transport.base import OWN, SHARED, Forwarding, OutputSink, PortForward, RemoteStat, RunResult, Transport
from harness.transport.remote_shell import remote_command

# paramiko logs a failed handshake's traceback from its own thread (Python's last-resort handler
# would print it to stderr); the failure reaches the user as one typed error instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    import paramiko
    from fabric import Connection

    from harness.transport import ConnectionSpec, ConnectOptions
    from harness.transport.process import RemoteProcess, StderrLine


def host_key_policy(host_name: str, resolved: openssh.ResolvedHost, accept_new: bool) -> paramiko.MissingHostKeyPolicy:
    """paramiko's hook for a key it does not know (it knows none): host_keys.decide says.

    The class is defined here, at connect time, because it subclasses paramiko's policy and this
    module imports paramiko only when a connection is really opened."""
    import paramiko

    class OneDecision(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            decision = host_keys.decide(resolved.known_hosts, resolved.known_hosts_name, key.get_name(), key.get_base64(), accept_new=accept_new)
            if not decision.accepted:
                raise decision.error(host_name)
            if decision.kind == host_keys.RECORDED:
                sys.stderr.write(f"harness: {decision.message}\n")

    return OneDecision()


def _preferring(types: list[str]):
    """paramiko's transport_factory: the host key types recorded for the host asked for first (as
    OpenSSH orders its HostKeyAlgorithms), so a host presents the key known for it."""
    import paramiko

    def factory(sock, **kwargs):
        transport = paramiko.Transport(sock, **kwargs)
        if types:
            wanted = {a for t in types for a in (("rsa-sha2-512", "rsa-sha2-256", t) if t == "ssh-rsa" else (t,))}
            options = transport.get_security_options()
            offered = list(options.key_types)
            options.key_types = [k for k in offered if k in wanted] + [k for k in offered if k not in wanted]
        return transport

    return factory


class SSHTransport(Transport):
    forwards_tcp = True

    def __init__(self, spec: "ConnectionSpec", options: "ConnectOptions"):
        self.name = spec.name
        self.spec = spec
        self.options = options
        self._opened = False
        self._home: str | None = None

    # -- connection -----------------------------------------------------------------------------

    @cached_property
    def connection(self) -> Connection:
        """The fabric Connection to the host (not opened yet), as `ssh -G` resolves it, its
        gateways set up as strictly as itself."""
        from fabric import Config, Connection

        # lazy: no fabric/invoke config files (/etc/fabric.yaml ...) shape what harness does, and
        # fabric reads no ssh_config: openssh.resolve_host's values are the one reading
        config = Config(lazy=True)
        options = self._openssh_options()
        resolved = openssh.resolve_host(options)
        conn = Connection(resolved.hostname, user=resolved.user, port=resolved.port, config=config, gateway=self._gateway(config, options, resolved))
        return self._harden(conn, resolved)

    def _gateway(self, config, options: openssh.OpenSSHOptions, resolved: openssh.ResolvedHost):
        """What the host is reached through: its ProxyJump hops in OpenSSH's order, first hop
        first (fabric would chain a list of hops the other way round), each hop as its own
        ssh_config entry says, like ssh -J; else its ProxyCommand; else False (nothing)."""
        from fabric import Connection

        if not resolved.proxy_jump:
            return resolved.proxy_command or False
        gateway = False
        for hop in resolved.proxy_jump:
            hop_resolved = openssh.resolve_host(openssh.hop_options(options, hop))
            gateway = self._harden(Connection(hop_resolved.hostname, user=hop_resolved.user, port=hop_resolved.port,
                                              config=config.clone(), gateway=gateway), hop_resolved)
        return gateway

    def _harden(self, conn: Connection, resolved: openssh.ResolvedHost) -> Connection:
        """No host key known to paramiko, so the one decision sees every key (fabric's default
        would accept any); keys, agent and timeouts as `ssh -G` and harness.toml say."""
        conn.original_host = resolved.alias  # (for messages: the name the user wrote)
        conn.client.set_missing_host_key_policy(host_key_policy(self.name, resolved, self.options.accept_new_host_key))
        timeout = self.spec.connect_timeout
        conn.connect_kwargs = {
            "key_filename": list(resolved.identity_files) or None,  # ssh -G lists ssh's default keys where none is configured
            "allow_agent": not resolved.identities_only,
            "look_for_keys": False,
            "banner_timeout": timeout,
            "auth_timeout": timeout,
            "channel_timeout": timeout,
            "transport_factory": _preferring(host_keys.preferred_types(resolved.known_hosts, resolved.known_hosts_name)),
        }
        conn.connect_timeout = timeout  # (fabric's constructor rounds it down to whole seconds)
        return conn

    def _hops(self) -> list[Connection]:
        """The jump hosts, first hop first, then the host."""
        chain = [self.connection]
        while not isinstance(chain[0].gateway, (str, bool, type(None))):
            chain.insert(0, chain[0].gateway)
        return chain

    def _where(self, conn: Connection) -> str:
        via = [c.original_host for c in self._hops()[:-1]]
        return f"{self.name} ({conn.user}@{conn.host}:{conn.port}{', via ' + ','.join(via) if via else ''})"

    @property
    def is_connected(self) -> bool:
        return self._opened and self.connection.is_connected

    def open(self) -> "SSHTransport":
        """Connect now (idempotent), hop by hop so that an error names the hop. Every other method
        calls this."""
        if not self._opened:
            chain = self._hops()
            for previous, conn in zip([None, *chain], chain):
                self._open_one(conn, previous)
            self._opened = True
        return self

    def _open_one(self, conn: Connection, previous: Connection | None) -> None:
        import logging
        import socket

        import paramiko

        # paramiko's transport thread logs a failed handshake with its traceback; with no handler,
        # Python's last resort prints it on stderr. The typed error below is the one line.
        quiet = logging.getLogger("paramiko")
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
        where, timeout = self._where(conn), self.spec.connect_timeout
        try:
            conn.open()
        except HostKeyError:  # host_keys.decide refused the key (the policy set in _harden)
            conn.close()
            raise
        except paramiko.PasswordRequiredException:
            conn.close()
            raise AuthError(f"{where}: a key file is encrypted and no agent holds it", "load it with ssh-add") from None
        except paramiko.AuthenticationException as e:
            conn.close()
            offered = ", ".join(conn.connect_kwargs.get("key_filename") or []) or "agent / default keys"
            raise AuthError(f"{where}: authentication failed: the server refused every key offered ({offered}): {e}",
                            "check identity_file in harness.toml / IdentityFile in ssh_config, or ssh-add the right key") from None
        except paramiko.ChannelException as e:
            conn.close()
            hop = previous.original_host if previous else "the proxy"
            raise ConnectError(f"{self.name}: jump host {hop} cannot reach {conn.host}:{conn.port}: {e}") from None
        except (socket.timeout, TimeoutError):
            conn.close()
            raise ConnectError(f"{where}: connection timed out after {timeout:g} s",
                               "is the host up and reachable from here (VPN, firewall)? connect_timeout in harness.toml sets the wait") from None
        except socket.gaierror as e:
            conn.close()
            raise ConnectError(f"{where}: cannot resolve host name {conn.host!r}: {e.strerror}",
                               f"check the spelling, or the HostName of {conn.original_host!r} in ~/.ssh/config; `ssh -G {conn.original_host}` shows what ssh makes of it") from None
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            conn.close()
            reasons = sorted({os.strerror(err.errno) if err.errno else str(err) for err in e.errors.values()})
            raise ConnectError(f"{where}: cannot connect: {'; '.join(reasons)}",
                               f"is sshd running there, on port {conn.port}? check Port in ~/.ssh/config or ssh = in harness.toml") from None
        except paramiko.SSHException as e:
            conn.close()
            raise ConnectError(f"{where}: no SSH server answered on port {conn.port}: {e}",
                               "the port is open but speaks no SSH: check Port/HostName in ~/.ssh/config or ssh = in harness.toml; "
                               "or the link stalled, taking the connection and sending nothing: try again once it is back") from None
        except OSError as e:
            conn.close()
            raise ConnectError(f"{where}: cannot connect: {e.strerror or e}", "check that the host is up and reachable from here") from None
        conn.transport.set_keepalive(self.spec.keepalive)

    @property
    def sftp(self) -> paramiko.SFTPClient:
        return self.open().connection.sftp()

    def close(self) -> None:
        if "connection" in self.__dict__:
            for conn in reversed(self._hops()):
                conn.close()
            del self.__dict__["connection"]
        self._opened = False

    def _session(self) -> paramiko.Channel:
        if not self.open().connection.is_connected:
            raise TransportError(f"{self.name}: the SSH connection was lost")
        return self.connection.create_session()

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
        import threading

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
            # Ctrl-C: hang up this session (the connection stays), as ssh(1) without -t does.
            # The remote program is not signalled: paramiko has no public call for RFC 4254's
            # "signal" request; it sees its output pipe closed.
            chan.close()
            raise
        if not finished:
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
        from harness.transport import terminal

        # TERM as the pty request's terminal type would carry it (fabric asks for a vt100)
        env = {"TERM": os.environ.get("TERM", "xterm-256color"), **(env or {})}
        command, prefix = remote_command(argv, cwd=cwd, env=env, pty=True)
        self.open()
        return _exit_code(terminal.run(self.connection, command, prefix))

    def address(self) -> str:
        return self.connection.host  # after ssh_config HostName

    def exec_foreground(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, pty: bool = False) -> int:
        if pty or not openssh.ssh_available():
            return super().exec_foreground(argv, env=env, pty=pty)
        from harness.transport import openssh_exec

        return openssh_exec.run(self._openssh_options(), self.name, argv, env)  # the warm path: the OpenSSH master

    def remember_exec(self, key: str, wrapped_mark: Sequence[str], *, env_names_known: Sequence[str], env_names: Sequence[str],
                      also_watch: Sequence[str], started_ns: int) -> bool:
        from harness.transport import warm_exec

        try:
            route = warm_exec.route(self._openssh_options()) if openssh.ssh_available() else None
            if route is None:
                return False
            command, _ = remote_command(wrapped_mark, env=dict.fromkeys(env_names, ""))
            return warm_exec.save(key, route, also_watch=list(also_watch), wrapped_mark=command, env_names_known=list(env_names_known),
                                  env_names=list(env_names), started_ns=started_ns)
        except (OSError, HarnessError):  # a recipe only saves time: the exec that ran stands (the next one is slow)
            return False

    def local_argv(self, argv: Sequence[str]) -> list[str]:
        return openssh.argv_for(openssh.with_control_path(self._openssh_options()), argv)

    def argv_failure(self, what: str, code: int, stderr: str) -> HarnessError:
        return openssh.bulk_failure(self.name, what, code, stderr, self._openssh_options())

    def stream(self, argv: Sequence[str], *, connection: str = SHARED, stdin: bool = True, stdout: bool = True,
               on_stderr_line: StderrLine | None = None) -> RemoteProcess:
        from harness.transport.process import RemoteProcess

        if connection not in (SHARED, OWN):
            raise ValueError(f"unknown connection {connection!r}")
        local = self.own_connection_argv(argv) if connection == OWN else self.local_argv(argv)
        log = openssh.client_log()  # ssh's own words apart from the command's stderr
        shared = connection == SHARED and openssh.with_control_path(self._openssh_options()).control_path is not None
        return RemoteProcess(openssh.logging_to(local, log), self.argv_failure, self.name, stdin=stdin, stdout=stdout,
                             on_stderr_line=on_stderr_line, client_log=log, link_up=self._master_answers if shared else None)

    def _master_answers(self) -> bool:
        from harness.transport.warm_exec import master_answers

        return master_answers(openssh.with_control_path(self._openssh_options()).control_path)

    def stream_to(self, host: str, port: int) -> RemoteProcess:
        from harness.transport.process import RemoteProcess

        log = openssh.client_log()
        return RemoteProcess(openssh.logging_to(self.stdio_forward_argv(host, port), log), self.argv_failure, self.name, client_log=log)

    def own_connection_argv(self, argv: Sequence[str]) -> list[str]:
        return openssh.argv_for(openssh.own_connection(self._openssh_options()), argv)

    def stdio_forward_argv(self, host: str, port: int) -> list[str]:
        return openssh.stdio_forward_argv(openssh.with_control_path(self._openssh_options()), host, port)

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
        import uuid

        path = self.expand(path)
        directory = os.path.dirname(path) or "."
        self._makedirs(directory)
        tmp = f"{directory}/.harness-tmp-{uuid.uuid4().hex[:12]}-{os.path.basename(path)}"
        try:
            with self.sftp.open(tmp, "wb") as f:
                if mode is not None:  # before the bytes: a 0600 file's secret is never readable by others
                    f.chmod(mode)
                f.write(data)
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


def _exit_code(code: int) -> int:
    # paramiko reports -1 when the server sent no exit status (killed by a signal it did not name)
    return 255 if code < 0 else code
