"""A foreground command (`harness exec`) over OpenSSH's ControlMaster: the warm path.

Chosen by measurement (bench/exec_latency.py): a plain (non-PTY) command on an SSH host goes
through a master connection that outlives this process (started on first use, kept
ControlPersist seconds). A second `harness exec` then costs one session opened on the master's
socket, which we ask for directly (mux.py) instead of spawning an `ssh` mux client; a master that
refuses the session falls back to the `ssh` binary. Nothing here imports paramiko or rich.

The remote command line comes from remote_shell.remote_command, as for every transport, so env
values travel on stdin and never on a command line.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

from harness.transport import mux, openssh
from harness.transport.remote_shell import remote_command


def run(options: openssh.OpenSSHOptions, host_name: str, argv: Sequence[str], env: Mapping[str, str] | None,
        report_host_key: Callable[[], object]) -> int:
    """Run argv on the host with this process's stdin/stdout/stderr; return its exit code.

    report_host_key(): connects the way that names an unknown or changed host key precisely (with
    its fingerprint), or records it when the user said so; called once when OpenSSH refuses the
    key, before one retry."""
    opts = openssh.with_control_path(options)
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
                opts = _ensure_master(opts, host_name, report_host_key)
            except mux.MuxError:
                break
    finally:
        if stdin_fd != 0:
            os.close(stdin_fd)
    return _run_ssh_binary(openssh.command_argv(opts, command, control_master="no"), prefix)


def _ensure_master(opts: openssh.OpenSSHOptions, host_name: str, report_host_key: Callable[[], object]) -> openssh.OpenSSHOptions:
    """Start the master for opts; return the options it listens under."""
    from harness.errors import ConnectError, HostKeyError

    if opts.control_path and os.path.exists(opts.control_path):
        os.unlink(opts.control_path)  # stale: its master is gone (we could not connect to it)
    try:
        openssh.start_master(opts, host_name)
    except (HostKeyError, ConnectError):
        # OpenSSH's message has no fingerprint, and a master drops what the ssh of a ProxyJump
        # hop printed (an unknown jump host reads "Connection closed"): report (or, with
        # --accept-new-host-key, record) the key precisely, then retry once, under the control
        # path of the known_hosts content as it is now.
        report_host_key()
        opts = openssh.with_control_path(opts)
        openssh.start_master(opts, host_name)
    return opts


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
