"""`harness exec`: run one command on a host, in its workdir, with live output and its exit code.

Two paths, chosen by measurement (bench/exec_latency.py):
- warm path: a plain (non-PTY) command on an SSH host whose runtime is "host" goes through an
  OpenSSH ControlMaster that outlives this process (started on first use, kept ControlPersist
  seconds). A second `harness exec` then costs one session opened on the master's socket, which
  we ask for directly (transport/mux.py) instead of spawning an `ssh` mux client. This path
  imports neither paramiko nor rich.
- transport path: everything else (PTY, docker runtime, the local host, no `ssh` binary) goes
  through the Transport (paramiko for SSH hosts).
Both deliver the same remote command line (remote_shell.remote_command), so env values travel
on stdin and never on a command line.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

from harness.config import HostConfig
from harness.transport import ConnectOptions

# Runs argv in the workdir, creating it first (a fresh host has none until the first sync).
# The directory is data ($1), never part of the script; "~" expands on the host.
IN_WORKDIR = (
    'd=$1; shift; case $d in "~") d=$HOME;; "~/"*) d=$HOME/${d#"~/"};; esac; '
    '{ [ -d "$d" ] || mkdir -p -- "$d"; } && cd -- "$d" && exec "$@"'
)


def in_workdir(workdir: str, argv: Sequence[str]) -> list[str]:
    return ["sh", "-c", IN_WORKDIR, "sh", workdir, *argv]


def exec_on_host(host: HostConfig, argv: Sequence[str], *, pty: bool, options: ConnectOptions, transport_factory) -> int:
    """Run argv on the host; return its exit code. transport_factory() opens the Transport."""
    env = host.env_values()
    if host.runtime == "docker":
        from harness.runtime import WrapOptions, runtime_for

        transport = transport_factory()
        # The one call site of the runtime factory: the container sees the stages' image,
        # mounts and workdir; env values still travel through the transport, by name.
        runtime = runtime_for(host, transport)
        wrapped = runtime.foreground(list(argv), WrapOptions(interactive=pty, env_names=tuple(env)))
        return _run_transport(transport, wrapped, env, pty)
    full = in_workdir(host.workdir, argv)
    if not host.is_local and not pty:
        from harness.transport import openssh

        if openssh.ssh_available():
            return _run_openssh(host, full, env, options, transport_factory)
    return _run_transport(transport_factory(), full, env, pty)


def _run_transport(transport, argv: Sequence[str], env: Mapping[str, str], pty: bool) -> int:
    from harness.transport.local import LocalTransport

    if pty or isinstance(transport, LocalTransport):
        # locally, run_pty just inherits this process's stdin/stdout/stderr: exactly what exec wants
        return transport.run_pty(argv, env=env)
    out, err = sys.stdout.buffer, sys.stderr.buffer

    def sink(stream):
        def write(chunk: bytes) -> None:
            stream.write(chunk)
            stream.flush()

        return write

    return transport.run(argv, env=env, stdout=sink(out), stderr=sink(err)).exit_code


# ---------------------------------------------------------------------------------------------
# The warm path


def _ensure_master(host: HostConfig, opts, transport_factory):
    """Start the master for opts; return the options it listens under."""
    from harness.errors import HostKeyError
    from harness.transport import openssh

    if opts.control_path and os.path.exists(opts.control_path):
        os.unlink(opts.control_path)  # stale: its master is gone (we could not connect to it)
    try:
        openssh.start_master(opts, host.name)
    except HostKeyError:
        # OpenSSH's message has no fingerprint: let the paramiko transport report (or, with
        # --accept-new-host-key, record) the key precisely, then retry once, under the control
        # path of the known_hosts content as it is now.
        transport_factory().open()
        opts = openssh.with_control_path(opts)
        openssh.start_master(opts, host.name)
    return opts


def _run_openssh(host: HostConfig, argv: Sequence[str], env: Mapping[str, str], options: ConnectOptions, transport_factory) -> int:
    from harness.transport import mux, openssh
    from harness.transport.remote_shell import remote_command

    opts = openssh.with_control_path(openssh.options_for(host, options))
    command, prefix = remote_command(argv, env=env)
    # Speak to the master directly (no `ssh` process). No master yet (or a stale socket): start
    # one, then retry; a master that refuses the session: fall back to the `ssh` binary.
    stdin_fd = _stdin_fd(prefix)
    try:
        for attempt in range(2):
            try:
                return mux.run_session(opts.control_path, command, stdin_fd, 1, 2)
            except mux.NoMaster:
                if attempt:
                    break
                opts = _ensure_master(host, opts, transport_factory)
            except mux.MuxError:
                break
    finally:
        if stdin_fd != 0:
            os.close(stdin_fd)
    return _run_ssh_binary(openssh.command_argv(opts, command, control_master="no"), prefix)


def _stdin_fd(prefix: bytes) -> int:
    """The fd the remote command reads: ours, or a pipe carrying the env lines then ours."""
    if not prefix:
        try:
            os.fstat(0)
            return 0
        except OSError:
            return os.open(os.devnull, os.O_RDONLY)
    import threading

    read_end, write_end = os.pipe()
    threading.Thread(target=_feed, args=(write_end, prefix), daemon=True).start()
    return read_end


def _feed(write_end: int, prefix: bytes) -> None:
    with open(write_end, "wb", buffering=0) as w:
        try:
            w.write(prefix)
            while chunk := os.read(0, 65536):
                w.write(chunk)
        except OSError:
            pass


def _run_ssh_binary(ssh_argv: list[str], prefix: bytes) -> int:
    import signal
    import subprocess
    # Ctrl-C: the terminal signals our whole process group, ssh included; OpenSSH then closes
    # the session. We only wait for ssh's exit code.
    proc = subprocess.Popen(ssh_argv, stdin=subprocess.PIPE if prefix else None)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if prefix:
            _feed_stdin(proc, prefix)
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    return 128 - code if code < 0 else code  # killed by signal N: 128+N, like a shell


def _feed_stdin(proc, prefix: bytes) -> None:
    """Env lines first, then our own stdin as it comes (like `ssh host cmd`), then EOF."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(prefix)
        proc.stdin.flush()
    except BrokenPipeError:
        return
    import threading

    threading.Thread(target=_copy, args=(0, proc), daemon=True).start()


def _copy(fd: int, proc) -> None:
    try:
        while chunk := os.read(fd, 65536):
            proc.stdin.write(chunk)
            proc.stdin.flush()
        proc.stdin.close()
    except (OSError, ValueError):
        pass
