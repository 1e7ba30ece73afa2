"""A foreground command (`harness exec`) over OpenSSH's ControlMaster: the warm path.

Chosen by measurement (docs/architecture/measurements.md, "Choices made by measurement"): a plain (non-PTY) command on an SSH host goes
through a master connection that outlives this process (started on first use, kept
ControlPersist seconds); a second `harness exec` then costs one `ssh -S` mux client process on the
master's socket. (A client of our own for the socket's protocol did not earn its code.) Nothing here imports paramiko or rich.

The remote command line comes from remote_shell.remote_command, as for every transport, so env
values travel on stdin and never on a command line.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from harness.transport import openssh
from harness.transport.warm_exec import connection_ended, master_answers, run_ssh
from harness.transport.remote_shell import remote_command


def run(options: openssh.OpenSSHOptions, host_name: str, argv: Sequence[str], env: Mapping[str, str] | None) -> int:
    """Run argv on the host with this process's stdin/stdout/stderr; return its exit code. A host
    key the one decision refuses (transport/host_keys.py, ssh's KnownHostsCommand) is a
    HostKeyError naming its fingerprint, from start_master itself."""
    opts = openssh.with_control_path(options)
    command, prefix = remote_command(argv, env=env)
    if not master_answers(opts.control_path):
        if opts.control_path and os.path.exists(opts.control_path):
            os.unlink(opts.control_path)  # stale: its master is gone (we could not connect to it)
        openssh.start_master(opts, host_name)
    code = run_ssh(openssh.command_argv(opts, command, control_master="no"), prefix)
    if code == 255 and not master_answers(opts.control_path):
        connection_ended(host_name)
    return code
