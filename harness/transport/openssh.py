"""The OpenSSH client as a command line built from typed options, with its stderr mapped to the
same typed errors as the paramiko transport.

harness drives two SSH clients: paramiko for the many small operations of a command, the `ssh`
binary for bulk bytes and for a ControlMaster that keeps a connection alive BETWEEN CLI processes
(the warm `harness exec`). Both take one reading of the user's ssh_config (`ssh -G`: `resolve_host`)
and one host-key decision (transport/host_keys.py; `safety_config`). Why two: docs/architecture/measurements.md.
This module imports neither paramiko nor rich: it is on the warm exec path.

Test/CI overrides (so nothing depends on the user's real ~/.ssh):
  HARNESS_SSH_CONFIG   ssh_config file used instead of ~/.ssh/config (both clients)
  HARNESS_KNOWN_HOSTS  known_hosts file used instead of ~/.ssh/known_hosts (both clients)
  HARNESS_CONTROL_DIR  directory for ControlMaster sockets (default /tmp/harness-ssh-<uid>)
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from dataclasses import dataclass, field, replace
from typing import Sequence

from harness.errors import AuthError, ConnectError, ForwardRefusedError, HarnessError, HostKeyError, LinkLostError, RemoteCommandError, TransportError, UsageError
from harness.transport import control_dir, host_keys
from harness.transport.base import PortForward, port_number, quote_argv

DEFAULT_CONTROL_PERSIST_S = 600  # how long an idle master connection outlives the last command
DEFAULT_KEEPALIVE = 15
ACCEPT_FLAG = host_keys.ACCEPT_FLAG
SYSTEM_SSH_CONFIG = "/etc/ssh/ssh_config"
# AES-GCM ahead of OpenSSH's default first choice (chacha20-poly1305): with AES instructions (any
# x86 since ~2010, Apple silicon) it costs the client less CPU per byte (docs/architecture/measurements.md,
# "Choices made by measurement").
# '^' puts them at the head of the default set: the same ciphers, all AEAD.
CIPHERS_PREFERRED = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


# ---------------------------------------------------------------------------------------------
# Where the ssh_config and known_hosts files are (one rule for both clients)


def ssh_config_path(explicit: str | None = None) -> str | None:
    """The ssh_config to use: explicit > $HARNESS_SSH_CONFIG > ~/.ssh/config (if it exists)."""
    path = explicit or os.environ.get("HARNESS_SSH_CONFIG")
    if path:
        return os.path.expanduser(path)
    default = os.path.expanduser("~/.ssh/config")
    return default if os.path.isfile(default) else None


def known_hosts_override(explicit: str | None = None) -> str | None:
    """An explicitly chosen known_hosts file, or None for the ssh_config/OpenSSH default."""
    path = explicit or os.environ.get("HARNESS_KNOWN_HOSTS")
    return os.path.expanduser(path) if path else None


# ---------------------------------------------------------------------------------------------
# Target: what `ssh = "..."` in harness.toml names


@dataclass(frozen=True)
class SSHTarget:
    """`user@host:port`, `host`, or an ~/.ssh/config alias. Empty user / port 0: from ssh_config."""

    host: str
    user: str = ""
    port: int = 0

    @classmethod
    def parse(cls, spec: str) -> "SSHTarget":
        user, _, hostport = spec.rpartition("@")
        port = 0
        if hostport.startswith("["):  # [v6addr]:port
            host, _, rest = hostport[1:].partition("]")
            if rest.startswith(":"):
                port = _port(spec, rest[1:])
        elif hostport.count(":") == 1:
            host, _, p = hostport.partition(":")
            port = _port(spec, p)
        else:
            host = hostport
        if not host or any(c.isspace() for c in spec) or host.startswith("-") or user.startswith("-"):
            raise UsageError(f"invalid ssh target {spec!r} (expected user@host[:port] or an ssh_config alias)")
        return cls(host=host, user=user, port=port)


def _port(spec: str, text: str) -> int:
    port = port_number(text)
    if port is None:
        raise UsageError(f"invalid port in ssh target {spec!r}")
    return port


# ---------------------------------------------------------------------------------------------
# The command line


@dataclass(frozen=True)
class OpenSSHOptions:
    """Everything that shapes an `ssh` command line. Unset fields defer to ssh_config."""

    target: SSHTarget
    ssh_config: str | None = None  # -F
    known_hosts: str | None = None  # UserKnownHostsFile (None: ssh_config / ~/.ssh/known_hosts)
    identity_files: tuple[str, ...] = ()
    proxy_jump: str = ""  # "" defers to ssh_config
    accept_new_host_key: bool = False
    connect_timeout: float = 10.0
    keepalive: int = DEFAULT_KEEPALIVE
    batch_mode: bool = True  # never prompt: a prompt would hang a detached helper
    control_path: str | None = None  # ControlMaster socket; None: no multiplexing
    control_persist_s: int = DEFAULT_CONTROL_PERSIST_S
    extra: tuple[str, ...] = field(default=())  # further -o KEY=VALUE, already split


def base_argv(o: OpenSSHOptions, *, control_master: str = "auto", ssh_binary: str = "ssh", reading: bool = False) -> list[str]:
    """`ssh <options>` (without destination or command). reading: for `ssh -G` only (the user's
    known_hosts settings as they are: what resolve_host reads)."""
    settings = _safety_settings(o, None if reading else _host_key_plan_or_none(o))
    argv = [ssh_binary, "-F", safety_config(o, settings)]
    for key, value in settings:
        argv += ["-o", f"{key}={value}"]
    argv += [
        "-o", f"ConnectTimeout={max(1, int(round(o.connect_timeout)))}",
        "-o", f"ServerAliveInterval={o.keepalive}",
        "-o", "ServerAliveCountMax=3",
    ]
    for key in o.identity_files:
        argv += ["-i", key]
    if o.proxy_jump:
        argv += ["-J", o.proxy_jump]
    if o.control_path:
        argv += [
            "-o", f"ControlMaster={control_master}",
            "-o", f"ControlPath={_ssh_quote_path(o.control_path)}",
            "-o", f"ControlPersist={o.control_persist_s}",
        ]
    if o.target.user:
        argv += ["-l", o.target.user]
    if o.target.port:
        argv += ["-p", str(o.target.port)]
    for item in o.extra:
        argv += ["-o", item]
    return argv


def command_argv(o: OpenSSHOptions, remote_command_line: str | None, *, control_master: str = "auto") -> list[str]:
    """`ssh <options> -- host '<command line>'`: the command line is already quoted for the remote
    shell (see quote_argv / remote_shell.remote_command)."""
    argv = base_argv(o, control_master=control_master) + ["--", o.target.host]
    if remote_command_line is not None:
        argv.append(remote_command_line)
    return argv


def argv_for(o: OpenSSHOptions, argv: Sequence[str]) -> list[str]:
    """A local command line that runs argv on the host (stdin/stdout piped through)."""
    return command_argv(o, quote_argv(argv))


def stdio_forward_argv(o: OpenSSHOptions, host: str, port: int) -> list[str]:
    """`ssh -W host:port`: stdin/stdout are a TCP connection to host:port made by the host's sshd
    (a direct-tcpip channel; over the master where o has a ControlPath). It fails at once where
    the sshd forbids forwarding (AllowTcpForwarding no, DisableForwarding)."""
    where = f"[{host}]" if ":" in host else host
    return base_argv(o) + ["-W", f"{where}:{int(port)}", "--", o.target.host]


def client_log() -> str:
    """A new, empty file in control_dir for one client's own diagnostics (`ssh -E`): apart from
    the remote command's stderr, so an exit 255 that ssh did not log is the command's own."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="log-", dir=control_dir.ensure())
    os.close(fd)
    return path


def logging_to(argv: list[str], log: str) -> list[str]:
    """argv (an `ssh ...` command line) with its diagnostics appended to log."""
    return [argv[0], "-E", log, *argv[1:]]


def own_connection(o: OpenSSHOptions) -> OpenSSHOptions:
    """Options for a connection of its own: no master, whatever the user's ssh_config says."""
    return replace(o, control_path=None, extra=(*o.extra, "ControlMaster=no", "ControlPath=none"))


# What the remote side of a forwarding connection prints once ssh has bound every local port (ssh
# binds them before it opens the session), then it waits for our stdin to close: the remote end
# ends with the local one, even when harness is killed.
FORWARD_READY = "harness-forward-ready"


def forward_argv(o: OpenSSHOptions, forwards: Sequence[PortForward]) -> list[str]:
    """`ssh -L 127.0.0.1:LOCAL:HOST:PORT ...` over a connection of its own; a local port it cannot
    bind fails the whole command (ExitOnForwardFailure) instead of a warning and a dead port."""
    own = own_connection(o)
    argv = base_argv(replace(own, extra=(*own.extra, "ExitOnForwardFailure=yes")))
    for f in forwards:
        host = f"[{f.remote_host}]" if ":" in f.remote_host else f.remote_host
        argv += ["-L", f"127.0.0.1:{int(f.local_port)}:{host}:{int(f.remote_port)}"]
    return argv + ["-T", "--", o.target.host, quote_argv(["sh", "-c", f"echo {FORWARD_READY}; exec cat >/dev/null"])]


def _safety_settings(o: OpenSSHOptions, plan: str | None) -> list[tuple[str, str]]:
    """Given both as -o and in safety_config (which ProxyJump hops read). With a host-key plan
    (host_key_plan): ssh knows no host key but what host_keys.py, its KnownHostsCommand, prints
    (the one decision). Without: the user's known_hosts settings as they are (reading the
    configuration, `ssh -G`), or an ssh older than 8.5 (no KnownHostsCommand), which then checks
    the same files strictly itself."""
    batch = ("BatchMode", "yes" if o.batch_mode else "no")
    if plan is None:
        settings = [("StrictHostKeyChecking", "accept-new" if o.accept_new_host_key else "yes"), batch]
        return settings + ([("UserKnownHostsFile", _ssh_quote_path(o.known_hosts))] if o.known_hosts else [])
    decider = f"{_ssh_quote_path(sys.executable)} -S -I {_ssh_quote_path(os.path.abspath(host_keys.__file__))} {_ssh_quote_path(plan)} %I %H %t %K"
    return [("StrictHostKeyChecking", "yes"), batch, ("UserKnownHostsFile", "none"), ("GlobalKnownHostsFile", "none"),
            ("KnownHostsCommand", decider), ("CheckHostIP", "no"), ("VerifyHostKeyDNS", "no"), ("UpdateHostKeys", "no")]


def safety_config(o: OpenSSHOptions, settings: list[tuple[str, str]]) -> str:
    """The ssh_config file for `ssh -F`: harness's host-key and batch settings first, then the
    user's config (OpenSSH keeps the first value it reads for an option, so a user's
    `StrictHostKeyChecking no` or `UserKnownHostsFile` cannot change them), then harness's cipher
    preference (where that config names no Ciphers). Why a file and not only -o: for each
    ProxyJump hop, ssh starts another ssh that gets -F but none of the -o options."""
    lines = ["# written by harness: its safety settings first, then the user's ssh_config"]
    lines += [f"{key} {value}" for key, value in settings]
    includes = [o.ssh_config] if o.ssh_config else []
    if o.ssh_config in (None, os.path.expanduser("~/.ssh/config")) and os.path.isfile(SYSTEM_SSH_CONFIG):
        includes.append(SYSTEM_SSH_CONFIG)  # what ssh reads after the user's file when no -F names one
    lines += [f"Include {_ssh_quote_path(os.path.abspath(p))}" for p in includes]
    if _reads_prepend_syntax():
        # Last, so a Ciphers line of the user's (or the system's) config, read first, still wins.
        lines += ["Match all", f"Ciphers {CIPHERS_PREFERRED}"]
    text = "\n".join(lines) + "\n"
    path = os.path.join(control_dir.ensure(), "config-" + hashlib.sha256(text.encode()).hexdigest()[:16])
    if not os.path.exists(path):
        _write_whole(path, text)
    return path


# ---------------------------------------------------------------------------------------------
# One reading of the host's settings, for both clients


@dataclass(frozen=True)
class ResolvedHost:
    """One host (the target or a ProxyJump hop) as `ssh -G` resolves it: what the paramiko client
    connects to, with, and through (transport/ssh.py), and where host_keys.decide looks up and
    records its key (for both clients)."""

    alias: str  # as named: the ssh target, or the hop as ProxyJump writes it
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]  # -i first, then IdentityFile (or ssh's defaults): those that exist
    identities_only: bool
    proxy_jump: tuple[str, ...]  # hops, first hop first
    proxy_command: str  # "" where none
    known_hosts: host_keys.KnownHosts
    known_hosts_name: str  # what its key is recorded under (HostKeyAlias, or [host]:port)


def resolve_host(o: OpenSSHOptions) -> ResolvedHost:
    """o's target as `ssh -G` resolves it (resolve_config: Match, Include and tokens included)."""
    v = resolve_config(o)

    def one(key: str, default: str = "") -> str:
        return (v.get(key) or (default,))[0]

    hostname, port, user = one("hostname", o.target.host), int(one("port", "22")), one("user")
    tokens = {"%": "%", "d": os.path.expanduser("~"), "h": hostname, "p": str(port), "r": user, "n": o.target.host,
              "u": _local_user()}
    identity = [os.path.expanduser(_percent_expand(p, tokens)) for p in v.get("identityfile", ())]
    user_files = [os.path.expanduser(p) for p in v.get("userknownhostsfile", ()) if p != "none"] or [os.path.expanduser("~/.ssh/known_hosts")]
    global_files = [os.path.expanduser(p) for p in v.get("globalknownhostsfile", ()) if p != "none"]
    jump = one("proxyjump", "none")
    command = one("proxycommand", "none")
    return ResolvedHost(
        alias=o.target.host, hostname=hostname, port=port, user=user,
        identity_files=tuple(p for p in dict.fromkeys(identity) if os.path.isfile(p)),
        identities_only=one("identitiesonly", "no") == "yes",
        proxy_jump=() if jump == "none" else tuple(h.strip() for h in jump.split(",") if h.strip()),
        proxy_command="" if command == "none" else command,
        known_hosts=host_keys.KnownHosts([*user_files, *global_files], user_files[0], one("hashknownhosts", "no") == "yes"),
        known_hosts_name=host_keys.known_hosts_name(hostname, port, one("hostkeyalias")),
    )


def hop_options(o: OpenSSHOptions, hop: str) -> OpenSSHOptions:
    """Options for a ProxyJump hop of o's target, as ssh -J reaches it: the same files and host-key
    policy, its own ssh_config entry, none of the target's -i keys."""
    return OpenSSHOptions(target=SSHTarget.parse(hop), ssh_config=o.ssh_config, known_hosts=o.known_hosts,
                          accept_new_host_key=o.accept_new_host_key, connect_timeout=o.connect_timeout, keepalive=o.keepalive,
                          batch_mode=o.batch_mode)


def host_key_plan(o: OpenSSHOptions) -> str:
    """The file host_keys.py reads as ssh's KnownHostsCommand: for o's target and each of its
    ProxyJump hops (by known_hosts name), where its keys are recorded; the target's for any other
    name; and whether an unknown key is recorded (--accept-new-host-key). Named by its content."""
    o = _plain(o)
    target = resolve_host(o)
    hosts = {target.known_hosts_name: target.known_hosts}
    for hop in target.proxy_jump:
        try:
            resolved = resolve_host(hop_options(o, hop))
        except UsageError:  # (a hop written as an ssh:// URI: the target's files apply)
            continue
        hosts.setdefault(resolved.known_hosts_name, resolved.known_hosts)
    text = host_keys.plan_text(o.accept_new_host_key, target.known_hosts, hosts)
    path = os.path.join(control_dir.ensure(), "hostkeys-" + hashlib.sha256(text.encode()).hexdigest()[:16])
    if not os.path.exists(path):
        _write_whole(path, text)
    return path


def _host_key_plan_or_none(o: OpenSSHOptions) -> str | None:
    return host_key_plan(o) if _ssh_accepts(_KNOWN_HOSTS_COMMAND_PROBE) else None


def _plain(o: OpenSSHOptions) -> OpenSSHOptions:
    """o without what only shapes one process (its master socket, our own -o extras)."""
    return o if o.control_path is None and not o.extra else replace(o, control_path=None, extra=())


def _percent_expand(text: str, tokens: dict[str, str]) -> str:
    """ssh_config's %-tokens (those that `ssh -G` leaves in IdentityFile); an unknown one is kept."""
    import re

    return re.sub(r"%(.)", lambda m: tokens.get(m.group(1), m.group(0)), text)


def _local_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER", "")


_KNOWN_HOSTS_COMMAND_PROBE = "KnownHostsCommand /bin/true"  # OpenSSH 8.5 and later


@functools.lru_cache(maxsize=1)
def _reads_prepend_syntax() -> bool:
    """Whether this ssh reads `Ciphers ^...` (older clients refuse the whole config)."""
    return _ssh_accepts(f"Ciphers {CIPHERS_PREFERRED}")


@functools.lru_cache(maxsize=4)
def _ssh_accepts(line: str) -> bool:
    """Whether this ssh reads an ssh_config line (older clients refuse the whole config): probed
    once per ssh binary and line with `ssh -G`, the answer kept in control_dir."""
    import shutil
    import subprocess

    ssh = shutil.which("ssh")
    if ssh is None:
        return False
    st = os.stat(ssh)
    marker = os.path.join(control_dir.ensure(), "accepts-" + hashlib.sha256(f"{ssh}:{st.st_size}:{st.st_mtime_ns}:{line}".encode()).hexdigest()[:16])
    try:
        with open(marker) as f:
            return f.read() == "yes"
    except OSError:
        pass
    probe = f"{marker}.{_writer_id()}.conf"
    with open(probe, "w") as f:
        f.write(f"{line}\n")
    try:
        ok = subprocess.run([ssh, "-G", "-F", probe, "probe"], stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    finally:
        os.unlink(probe)
    _write_whole(marker, "yes" if ok else "no")
    return ok


def _writer_id() -> str:
    """Unique to this process and thread: the name of a file only this writer touches."""
    import threading

    return f"{os.getpid()}-{threading.get_ident()}"


def _write_whole(path: str, text: str) -> None:
    """Readers of path (other commands, other threads) see no file or the whole of it."""
    tmp = f"{path}.{_writer_id()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _ssh_quote_path(path: str) -> str:
    # ssh_config values with spaces must be double-quoted; paths with '"' are not supported.
    if '"' in path:
        raise UsageError(f"path {path!r} contains a double quote, which ssh options cannot carry")
    return f'"{path}"' if any(c.isspace() for c in path) else path


# ---------------------------------------------------------------------------------------------
# ControlMaster: a connection that outlives one CLI process


def with_control_path(o: OpenSSHOptions) -> OpenSSHOptions:
    """Options with a ControlPath specific to EVERYTHING that shapes the connection: our options
    (files, keys, jump host), what the user's ssh_config makes of the target now (`ssh -G`), and
    the content of the known_hosts files that apply. A master is reused only while all of that
    is unchanged: after an edit of HostName/Port/User/ProxyJump or of known_hosts the next
    command opens a new, checked connection instead of talking to the old one."""
    resolved = resolve_config(o)
    connection = tuple((k, tuple(resolved.get(k, ()))) for k in RESOLVED_KEYS)
    known_hosts = tuple((p, _content_digest(p)) for k in KNOWN_HOSTS_KEYS for p in resolved.get(k, ()))
    key = repr((o.target, o.ssh_config, o.known_hosts, o.identity_files, o.proxy_jump, o.batch_mode, o.keepalive, o.extra,
                connection, known_hosts, o.accept_new_host_key))  # (a master that recorded a key is not one opened with it known)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return replace(o, control_path=os.path.join(control_dir.ensure(), digest))


# What a connection resolves to, as `ssh -G` prints it (lower-case keys).
RESOLVED_KEYS = ("hostname", "port", "user", "hostkeyalias", "proxyjump", "proxycommand")
KNOWN_HOSTS_KEYS = ("userknownhostsfile", "globalknownhostsfile")
_ALSO_READ = ("identityfile", "identitiesonly", "hashknownhosts")  # (resolve_host)


def resolve_config(o: OpenSSHOptions) -> dict[str, tuple[str, ...]]:
    """`ssh -G`: the client's own reading of ssh_config for these options (Match, Include and
    tokens included), as {key: values}. One `ssh` process per distinct options and CLI call."""
    return read_config(o).values


@dataclass(frozen=True)
class ConfigReading:
    values: dict[str, tuple[str, ...]]
    files: tuple[str, ...]  # every ssh_config file read, Include'd ones too, in order
    unmatched_includes: tuple[str, ...]  # Include patterns that matched no file (one may appear later)


def read_config(o: OpenSSHOptions) -> ConfigReading:
    """The `ssh -v -G` run behind resolve_config, with its account of the ssh_config files it read
    (warm_exec.route watches them)."""
    o = _plain(o)  # (a master's socket or our -o extras change nothing read here)
    return _ssh_dash_g(tuple(base_argv(o, control_master="no", reading=True) + ["-v", "-G", "--", o.target.host]), o.target.host, _stamp(o.ssh_config))


def _stamp(path: str | None) -> tuple:
    """What changes when a file is edited (the cache below must not outlive an edit: a repointed
    alias would ride the old host's master)."""
    try:
        st = os.stat(os.path.expanduser(path)) if path else None
    except OSError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns) if st else ()


# `ssh -v -G`'s words for the files it reads (debug1; stable since OpenSSH 7.3's Include).
_READING = "debug1: Reading configuration data "
_UNMATCHED = " matched no files"


@functools.lru_cache(maxsize=16)
def _ssh_dash_g(argv: tuple[str, ...], host: str, config_stamp: tuple) -> ConfigReading:
    import subprocess

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TransportError(f"{host}: cannot run ssh -G to read the ssh configuration: {e}") from None
    text = proc.stdout.decode("utf-8", "replace")
    diagnostics = proc.stderr.decode("utf-8", "replace").splitlines()
    if proc.returncode != 0:
        lines = [line for line in diagnostics if not line.startswith("debug")]
        raise TransportError(f"{host}: ssh cannot read its configuration: {lines[-1] if lines else f'exit code {proc.returncode}'}")
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in RESOLVED_KEYS or key in KNOWN_HOSTS_KEYS or key in _ALSO_READ:
            values.setdefault(key, []).extend(value.split() if key in KNOWN_HOSTS_KEYS else [value])
    files = tuple(line[len(_READING):] for line in diagnostics if line.startswith(_READING))
    # "debug1: FILE line N: include PATTERN matched no files"
    unmatched = tuple(line[:-len(_UNMATCHED)].rpartition(" include ")[2] for line in diagnostics
                      if line.startswith("debug1: ") and line.endswith(_UNMATCHED) and " include " in line)
    return ConfigReading({k: tuple(v) for k, v in values.items()}, files, unmatched)


def _content_digest(path: str) -> str:
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "absent"


def start_master(o: OpenSSHOptions, host_name: str) -> None:
    """Open the master connection in the background (ControlPersist) and wait until it is ready.
    Its diagnostics go to a log file, so a failure maps to a typed error."""
    import subprocess

    assert o.control_path
    log = o.control_path + ".log"
    with open(log, "w"):
        pass
    argv = base_argv(o, control_master="yes") + ["-E", log, "-f", "-N", "--", o.target.host]
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=o.connect_timeout + 30)
    with open(log, errors="replace") as f:
        text = f.read()
    os.unlink(log)
    stderr = proc.stderr.decode("utf-8", "replace")  # (what host_keys.py, ssh's KnownHostsCommand, printed)
    if proc.returncode != 0:
        raise _client_failure(text + stderr, host_name, o)
    for line in stderr.splitlines():
        if line.startswith("harness: recorded "):  # --accept-new-host-key: say what was recorded
            sys.stderr.write(line + "\n")


def ssh_available() -> bool:
    import shutil

    return shutil.which("ssh") is not None


# ---------------------------------------------------------------------------------------------
# stderr -> typed errors

def map_stderr(text: str, host_name: str, o: OpenSSHOptions | None = None) -> TransportError:
    """OpenSSH's stderr (exit 255) -> the typed error the paramiko transport would raise."""
    import re  # not on the warm path: only when something failed

    changed = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed")
    unknown = re.compile(r"No (\S+) host key is known for (\S+)|Host key verification failed")
    auth = re.compile(r"Permission denied \(|Too many authentication failures|no mutual signature")
    connect = re.compile(
        r"Connection refused|Connection timed out|timed out|No route to host|Could not resolve hostname|"
        r"Network is unreachable|Connection closed by .* port|kex_exchange_identification|Connection reset"
    )
    lost = re.compile(r"Timeout, server \S+ not responding")  # ServerAliveCountMax keepalives unanswered
    # (a channel of the master says less: "Stdio forwarding request failed: Session open refused by peer")
    forward = re.compile(r"open failed: ((?:connect failed|administratively prohibited).*)|[Ss]tdio forwarding (?:request )?failed:? ?(.*)")
    lines = [ln.strip() for ln in text.replace("\r", "").splitlines() if ln.strip() and not ln.lstrip().startswith(("debug", host_keys.MARK))]
    last = lines[-1] if lines else "ssh exited with status 255"
    where = host_name if o is None else f"{host_name} ({o.target.host})"
    refused = host_keys.refusal_in(text)  # the one decision's own words (the key's fingerprint, the next step)
    if refused:
        return HostKeyError(f"{host_name}: {refused[0]}", refused[1] or None)  # (as the paramiko client says it)
    if changed.search(text):
        return HostKeyError(f"{where}: the host key has CHANGED since it was recorded; refusing to connect (possible man-in-the-middle)",
                            "if the host was really reinstalled, remove its old line from your known_hosts file")
    m = unknown.search(text)
    if m:
        of = f" for {m.group(2)}" if m.group(2) else ""  # the jump host's name, where a hop refused
        return HostKeyError(f"{where}: unknown host key{of}; refusing to connect",
                            f"check its fingerprint, then pass {ACCEPT_FLAG} once to record it")
    m = forward.search(text)
    if m:
        why = (m.group(1) or m.group(2) or "").strip() or "open failed"
        return ForwardRefusedError(f"{where}: the host's sshd refused a forwarded connection ({why})",
                                   "AllowTcpForwarding / DisableForwarding in its sshd_config, or nothing listens there")
    if auth.search(text):
        return AuthError(f"{where}: authentication failed: the server refused every key offered ({last})",
                         "check identity_file / IdentityFile, or load the key with ssh-add")
    if lost.search(text):
        return LinkLostError(f"{where}: the link stopped answering (ssh's keepalives went unanswered); the connection ended",
                             "what ran over it on the host ends once the host notices; check the network, then run the command again")
    if connect.search(text):
        what, hint = connect_failure(text, o.target.host if o is not None else None)
        return ConnectError(f"{where}: {what}: {last}", hint)
    return TransportError(f"{where}: ssh failed: {last}", "`ssh -v` to the host says more")


def connect_failure(text: str, host: str | None) -> tuple[str, str]:
    """What failed and the next step, by what ssh said, in the paramiko client's words."""
    if "Could not resolve hostname" in text:
        return ("cannot resolve host name" + (f" {host!r}" if host else ""),
                "check the spelling, or the HostName of the alias in ~/.ssh/config; `ssh -G ALIAS` shows what ssh makes of it")
    if "Connection refused" in text:
        return "cannot connect", "is sshd running there, on that port? check Port in ~/.ssh/config or ssh = in harness.toml"
    if "kex_exchange_identification" in text or "Connection reset" in text or "Connection closed by" in text:
        return "no SSH server answered", "the port is open but speaks no SSH: check Port/HostName in ~/.ssh/config or ssh = in harness.toml"
    return "cannot connect", "is the host up and reachable from here (VPN, firewall)? connect_timeout in harness.toml sets the wait"


# What ssh prints when the connection it made through a ProxyJump/ProxyCommand pipe closed. A
# master (ControlPersist) sends what the hop's ssh printed to /dev/null, so an unknown or changed
# jump host key reads only this: `diagnose` asks a connection of its own, whose hop keeps stderr.
PROXY_CLOSED = "UNKNOWN port 65535"


def bulk_failure(host_name: str, what: str, code: int, stderr: str, o: OpenSSHOptions | None = None) -> HarnessError:
    """A command run through `ssh` (sync, pull, a server) that failed: ssh's own failure (exit
    255 with a diagnostic recognised above: unknown or changed key, auth, unreachable, a refused
    forward) is that typed error, anything else is the remote command's failure. With o, a
    connection closed by a jump hop is diagnosed (`diagnose`) to say why."""
    if code == 255:
        error = map_stderr(stderr, host_name, o) if o is None else _client_failure(stderr, host_name, o)
        if type(error) is not TransportError:
            return error
    return RemoteCommandError(what, code, stderr)


def _client_failure(text: str, host_name: str, o: OpenSSHOptions) -> TransportError:
    """map_stderr, and where a jump hop closed the connection, why (`diagnose`)."""
    error = map_stderr(text, host_name, o)
    if PROXY_CLOSED in text and isinstance(error, ConnectError):
        error = diagnose(o, host_name) or error
    return error


def diagnose(o: OpenSSHOptions, host_name: str) -> TransportError | None:
    """Why o's host cannot be reached, as a connection of its own (no master: every hop's
    stderr is kept) says it: its typed error, or None where it connects (or fails unrecognised)."""
    import subprocess

    argv = base_argv(own_connection(o)) + ["-T", "--", o.target.host, "exit 0"]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=o.connect_timeout * 3 + 30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 255:
        return None
    error = map_stderr(proc.stderr.decode("utf-8", "replace"), host_name, o)
    return None if type(error) is TransportError else error


# ---------------------------------------------------------------------------------------------
# From harness.toml


def options_for(spec, connect_options) -> OpenSSHOptions:
    """OpenSSHOptions for a host's ConnectionSpec and this invocation's ConnectOptions."""
    return OpenSSHOptions(
        target=SSHTarget.parse(spec.ssh),
        ssh_config=ssh_config_path(connect_options.ssh_config),
        known_hosts=known_hosts_override(connect_options.known_hosts),
        identity_files=(os.path.expanduser(spec.identity_file),) if spec.identity_file else (),
        accept_new_host_key=connect_options.accept_new_host_key,
        connect_timeout=spec.connect_timeout,
        keepalive=spec.keepalive,
    )
